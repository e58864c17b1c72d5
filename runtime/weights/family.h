/* family.h — model families as their modeling code defines them: the table k_families of
 * runtime/weights/config.c, read by the config reader, the checkpoint loader and writer, and
 * `moejit models`. Not installed, not public. */
#ifndef MJ_WEIGHTS_FAMILY_H
#define MJ_WEIGHTS_FAMILY_H

#include "base.h"

/* Where a family's checkpoint keeps one MoE layer's tensors, below model.layers.L.:
 *   BLOCK.gate.weight                      the router
 *   BLOCK.BIAS                             the selection bias (e_score_correction_bias)
 *   BLOCK.experts.E.PROJ.FIELD             PROJ: proj[0] gate, proj[1] up, proj[2] down
 *   BLOCK.SHARED.PROJ.FIELD                the shared expert
 *   BLOCK.SHARED_GATE.weight               its sigmoid gate, bf16 [1, H] (Qwen2-MoE, Qwen3-Next) */
typedef struct mj_ck_names {
    const char *block;         /* "mlp" (DeepSeek, GLM, Qwen) or "block_sparse_moe" (Mixtral) */
    const char *proj[3];       /* gate_proj up_proj down_proj, or w1 w3 w2                     */
    const char *bias;          /* below BLOCK: "gate.e_score_correction_bias" or
                                  "e_score_correction_bias" (MiniMax-M2's sits on the block)  */
    const char *shared;        /* "shared_experts" (DeepSeek, GLM), or Qwen's "shared_expert"  */
    const char *shared_gate;   /* "shared_expert_gate" (Qwen2-MoE, Qwen3-Next), or NULL: none */
} mj_ck_names;

/* The names of a checkpoint of no known family: DeepSeek-V3's, GLM's. */
extern const mj_ck_names mj_ck_names_default;

/* Renormalization of the chosen weights, as each family's router code does it. */
typedef enum mj_family_norm {
    MJ_NORM_KEY = 0,           /* norm_topk_prob (its default when absent: `norm`), any top-k  */
    MJ_NORM_KEY_TOPK_GT1,      /* norm_topk_prob, only when top_k > 1 (DeepSeek's modeling_deepseek.py:
                                  `if self.top_k > 1 and self.norm_topk_prob`)                */
    MJ_NORM_ALWAYS,            /* always, whatever the config says (Mixtral, MiniMax-M2)       */
} mj_family_norm;

typedef struct mj_family {
    const char *model_type;
    const char *models;        /* the published models, for messages and `moejit models`      */
    const char *scoring;       /* scoring_func when the config has none (NULL: "softmax")     */
    const char *method;        /* topk_method when the config has none (NULL: "greedy")       */
    int norm;                  /* norm_topk_prob when the config has none                     */
    float rsf;                 /* routed_scaling_factor when the config has none              */
    int n_group, topk_group;   /* n_group, topk_group when the config has none               */
    mj_family_norm norm_rule;
    int fixed;                 /* the router's code reads no routing key: scoring_func,
                                  topk_method, norm_topk_prob, routed_scaling_factor, n_group
                                  that say otherwise are refused, not followed                */
    const char *experts_key;   /* the expert count's key (NULL: n_routed_experts, or num_experts) */
    const char *width_key;     /* one expert's width (NULL: moe_intermediate_size)            */
    const char *bias_key;      /* a boolean key that turns the selection bias off, or NULL    */
    const char *shared_key;    /* the gated shared expert's width key (Qwen's
                                  shared_expert_intermediate_size: n_shared = it / I, and
                                  shared_gate = 1 when it is not 0), or NULL: n_shared_experts,
                                  ungated                                                     */
    int32_t shared_width;      /* shared_key's value when the config has none                 */
    int no_shared;             /* its MoE block has no shared expert: a config that sizes one
                                  (n_shared_experts, shared_expert_intermediate_size) is
                                  refused                                                     */
    const mj_ck_names *names;  /* its tensors' names (NULL: mj_ck_names_default)              */
    const char *routing;       /* how it routes, one line                                    */
    const char *source;        /* the upstream code the rules are read from                  */
    const char *verified;      /* the published config(s) the tests run it on                */
    const char *refused;       /* NULL, or why moejit cannot run the family                  */
} mj_family;

/* The table, in order: *n entries. */
const mj_family *mj_families(size_t *n);

/* The family of a config.json's text (its model_type, or the language model's in text_config):
 * *out NULL when none is known. A family moejit cannot run is refused, MJ_ERR_UNSUPPORTED
 * naming the reason. `label` names the file in errors. */
mj_status mj_family_of(const char *config_text, const char *label, const mj_family **out);

/* The tensor names of a family (the default ones for NULL). */
static inline const mj_ck_names *mj_family_names(const mj_family *f) {
    return f && f->names ? f->names : &mj_ck_names_default;
}

#endif /* MJ_WEIGHTS_FAMILY_H */
