/* checkpoint.h — what the checkpoint loader (checkpoint.c) and writer (checkpoint_make.c)
 * share, and the loader's test hooks. Not public. */
#ifndef MJ_CHECKPOINT_H
#define MJ_CHECKPOINT_H

#include "base.h"
#include "file.h"
#include "weights/safetensors.h"
#include "weights/family.h"

/* File names of a Hugging Face checkpoint directory. */
#define MJ_CK_CONFIG "config.json"
#define MJ_CK_QUANT "hf_quant_config.json"
#define MJ_CK_INDEX "model.safetensors.index.json"
#define MJ_CK_SINGLE "model.safetensors"

/* Caps on the JSON files read whole: a config is kilobytes, an index of a 700B-parameter
 * model tens of megabytes. */
#define MJ_CK_CONFIG_MAX (64u << 20)
#define MJ_CK_INDEX_MAX (512u << 20)

/* Read a JSON file `name` in dirfd (AT_FDCWD: a path) whole by base/file.c's rule (a regular
 * file only, never blocking on a FIFO; a symbolic link refused unless flags has
 * MJ_FILE_FOLLOW, for a path the caller named; at most cap bytes), and refuse a NUL byte
 * inside. `label` names it in errors. MJ_FILE_OPTIONAL: a missing file gives MJ_OK and
 * *text = NULL. *text is malloc'd and NUL-terminated. */
mj_status mj_ck_read_text(int dirfd, const char *name, const char *label, size_t cap, unsigned flags,
                          char **text, size_t *len);

/* The layer structure of a config.json (its "text_config" when the model's keys are nested
 * there, as config.c does): which decoder layers are MoE, the multi-token-prediction layers
 * (DeepSeek-V3's layer 61, GLM's) included. */
typedef struct mj_ck_layout {
    int32_t num_hidden_layers;     /* -1 when absent                                           */
    int32_t first_k_dense_replace; /* layers below it are dense (0 when absent)                 */
    int32_t moe_layer_freq;        /* MoE every Nth layer from there (1 when absent)            */
    int32_t decoder_sparse_step;   /* Qwen-MoE: layer L is MoE when (L + 1) % step == 0 (1)     */
    int32_t n_mtp;                 /* num_nextn_predict_layers (num_mtp_layers): the multi-token
                                      prediction layers after the last decoder layer, numbered
                                      num_hidden_layers.., MoE like it (0 when absent)          */
    int32_t n_dense_only;          /* mlp_only_layers: layers Qwen-MoE keeps dense             */
    int32_t dense_only[64];
} mj_ck_layout;
mj_status mj_ck_layout_parse(const char *config_text, const char *label, mj_ck_layout *out);
int mj_ck_layout_is_moe(const mj_ck_layout *lo, int32_t layer);

/* The name of one tensor of MoE layer `layer`, as the family names them (weights/family.h;
 * NULL: DeepSeek's and GLM's, the ModelOpt export's names):
 *   expert >= 0: model.layers.L.BLOCK.experts.E.PROJ.FIELD  (proj 0 gate, 1 up, 2 down)
 *   expert == MJ_CK_SHARED: model.layers.L.BLOCK.SHARED.PROJ.FIELD (names->shared:
 *                           shared_experts, or Qwen's shared_expert)
 *   expert == MJ_CK_ROUTER: model.layers.L.BLOCK.gate.weight (field "weight"), or the selection
 *                           bias (field "e_score_correction_bias": names->bias); proj ignored
 *   expert == MJ_CK_SHARED_GATE: model.layers.L.BLOCK.SHARED_GATE.FIELD (names->shared_gate,
 *                           Qwen's shared_expert_gate; only for names that have one); proj ignored
 * Returns buf. */
#define MJ_CK_SHARED (-1)
#define MJ_CK_ROUTER (-2)
#define MJ_CK_SHARED_GATE (-3)
#define MJ_CK_NAME_MAX 192
const char *mj_ck_tensor_name(char *buf, size_t n, const mj_ck_names *names, int32_t layer, int32_t expert, int proj,
                              const char *field);

/* ---- test hooks (the loader copies tensor bytes through one function) ----
 * Called for every byte range copied out of a shard: the tensor, the offset of the range
 * within the tensor's data, its length. */
typedef void (*mj_ck_read_hook)(void *user, const char *tensor, uint64_t offset, uint64_t len);
void mj_checkpoint_set_read_hook(mj_checkpoint_t ck, mj_ck_read_hook fn, void *user);
/* Bytes copied out of shards by mj_layer_load since the checkpoint was opened. */
int64_t mj_checkpoint_bytes_read(mj_checkpoint_t ck);

#endif /* MJ_CHECKPOINT_H */
