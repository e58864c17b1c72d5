/* moejit.h — the one public header of moejit.
 *
 * moejit generates, compiles and caches CUDA kernels for the Mixture-of-Experts layer of
 * NVFP4-quantized models (GLM-5 and its kin) at decode time. This header is the whole
 * public surface: every function returns an mj_status; mj_last_error() gives the detail
 * (thread-local) of the last failure on the calling thread. The library never exits and
 * never prints to stdout.
 *
 * Shapes are written beside each pointer: `float *logits; // [B, E]`. All matrices are
 * row-major (C order). bf16 values are passed as uint16_t bit patterns.
 */
#ifndef MOEJIT_H
#define MOEJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MJ_BUILDING_LIBRARY)
#define MJ_API __attribute__((visibility("default")))
#else
#define MJ_API
#endif

/* The version: these three lines are its one source. CMakeLists.txt reads them for
 * project(VERSION) (the library's file name and soname); python/moejit/_version.py repeats
 * them for the package (installed apart from this header), and tests/python/test_lib.py
 * fails when it disagrees. */
#define MJ_VERSION_MAJOR 0
#define MJ_VERSION_MINOR 1
#define MJ_VERSION_PATCH 0
#define MJ_VERSION_STR_(x) #x
#define MJ_VERSION_XSTR_(x) MJ_VERSION_STR_(x)
/* "MAJOR.MINOR.PATCH", a string literal made of the three. */
#define MJ_VERSION_STRING \
    MJ_VERSION_XSTR_(MJ_VERSION_MAJOR) "." MJ_VERSION_XSTR_(MJ_VERSION_MINOR) "." \
    MJ_VERSION_XSTR_(MJ_VERSION_PATCH)

/* ---------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------- */
typedef enum mj_status {
    MJ_OK = 0,
    MJ_ERR_INVALID_ARG,   /* a NULL pointer, a negative size, an argument out of range   */
    MJ_ERR_CONFIG,        /* a model config that is missing fields or is impossible       */
    MJ_ERR_UNSUPPORTED,   /* valid, but not something moejit does (e.g. a quantization)   */
    MJ_ERR_PARSE,         /* a malformed file (JSON, .npy)                                */
    MJ_ERR_IO,            /* a file could not be opened, read or written                  */
    MJ_ERR_NONFINITE,     /* NaN or Inf where a finite number is required                 */
    MJ_ERR_NOMEM,         /* an allocation failed                                         */
    MJ_ERR_NO_DEVICE,     /* no GPU, or no driver                                         */
    MJ_ERR_LIBRARY,       /* a shared library (libcuda, libnvrtc, libnccl) is missing     */
    MJ_ERR_COMPILE,       /* NVRTC or the host compiler rejected generated source         */
    MJ_ERR_CACHE_MISS,    /* strict mode: a kernel is not in the cache                    */
    MJ_ERR_CUDA,          /* a CUDA driver call failed                                    */
    MJ_ERR_INTERNAL,      /* a bug in moejit: please report it with mj_last_error()       */
    MJ_ERR_KERNEL,        /* a kernel failed as it ran: on the sim a barrier or warp
                             collective that cannot complete (deadlock), or __trap()     */
    MJ_ERR_COMM,          /* a collective failed: an NCCL error, or a loopback group that
                             was aborted (a rank timed out, or its handle was freed)     */
    MJ_STATUS_COUNT
} mj_status;

/* A short, constant description of a status ("invalid argument", ...). Never NULL. */
MJ_API const char *mj_status_string(mj_status s);

/* Detail of the last failure on this thread: what went wrong and what to do next.
 * Empty string (never NULL) when nothing has failed. Valid until the next mj_ call
 * on this thread fails. */
MJ_API const char *mj_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH"; *major etc. may be NULL. */
MJ_API mj_status mj_version(int *major, int *minor, int *patch, const char **text);

/* ---------------------------------------------------------------------------------------
 * Model configuration
 * ------------------------------------------------------------------------------------- */
typedef enum mj_scoring { MJ_SCORING_SIGMOID = 0, MJ_SCORING_SOFTMAX = 1 } mj_scoring;
/* How group-limited routing (n_group > 1) scores a group of experts, from the model's
 * topk_method: noaux_tc (DeepSeek-V3, GLM-5) sums the group's two best selection scores;
 * DeepSeek-V2's group_limited_greedy takes the group's best one. */
typedef enum mj_group_score {
    MJ_GROUP_SCORE_TOP2_SUM = 0, /* sum of the group's top-2 (s + bias): noaux_tc            */
    MJ_GROUP_SCORE_MAX = 1       /* the group's maximum score: group_limited_greedy          */
} mj_group_score;
typedef enum mj_activation { MJ_ACT_SILU = 0 } mj_activation;
typedef enum mj_quant { MJ_QUANT_NONE = 0, MJ_QUANT_NVFP4 = 1 } mj_quant;

/* Alignment the kernels need: hidden and (per rank) expert intermediate sizes must be
 * multiples of this (one K-step of the FP4 MMA, m16n8k64, and four NVFP4 blocks). */
#define MJ_DIM_ALIGN 64
/* Elements per NVFP4 block scale. */
#define MJ_NVFP4_GROUP 16

typedef struct mj_moe_config {
    int32_t hidden;            /* H: hidden size (6144 for GLM-5)                         */
    int32_t intermediate;      /* I: one routed expert's intermediate size (2048)         */
    int32_t n_experts;         /* E: routed experts (256)                                  */
    int32_t topk;              /* k: experts per token (8)                                 */
    int32_t n_shared;          /* shared experts, each of size I, always active (1)       */
    int32_t n_group;           /* expert groups for group-limited routing (1 = off)       */
    int32_t topk_group;        /* groups kept per token (1)                                */
    mj_scoring scoring;        /* sigmoid (noaux_tc) or softmax                            */
    float routed_scaling_factor; /* rsf: routed weights are multiplied by it (2.5)       */
    int32_t norm_topk_prob;    /* 1: renormalize the chosen scores to sum 1 (then x rsf)  */
    int32_t has_correction_bias; /* 1: e_score_correction_bias [E] is used for selection */
    mj_activation activation;  /* silu (SwiGLU experts)                                    */
    mj_quant quant;            /* NVFP4 for ModelOpt checkpoints                           */
    int32_t quant_group_size;  /* 16 for NVFP4                                             */
    mj_group_score group_score;/* group score of group-limited routing (from topk_method)  */
    int32_t shared_gate;       /* 1: the shared expert's output is scaled by
                                  sigmoid(x . shared_expert_gate), a bf16 [H] gate (Qwen2-MoE,
                                  Qwen3-Next); 0: weight 1. Needs n_shared > 0              */
} mj_moe_config;

/* Fill *cfg with GLM-5's MoE layer (the values of its config.json, NVFP4 quantized). */
MJ_API mj_status mj_moe_config_glm5(mj_moe_config *cfg);

/* Read a Hugging Face config.json and, optionally, hf_quant_config.json (NULL: look for
 * `quantization_config` inside config.json; none at all means MJ_QUANT_NONE). On any
 * error *cfg is left untouched. A path may be a symbolic link (a Hugging Face cache
 * snapshot's files are); it must lead to a regular file of at most 64 MiB (a FIFO is
 * refused at once, MJ_ERR_IO). */
MJ_API mj_status mj_moe_config_read(const char *config_json_path, const char *quant_json_path,
                                    mj_moe_config *cfg);

/* Same from in-memory JSON text (quant_json may be NULL). `name` labels errors. */
MJ_API mj_status mj_moe_config_parse(const char *config_json, const char *quant_json,
                                     const char *name, mj_moe_config *cfg);

/* Check that a config is possible and that the kernels can run it: sizes positive,
 * top-k <= experts, experts divisible by n_group, topk_group <= n_group and leaving at
 * least top-k experts, hidden and intermediate multiples of MJ_DIM_ALIGN, and (when
 * require_nvfp4) an NVFP4 quantization with group size 16. */
MJ_API mj_status mj_moe_config_validate(const mj_moe_config *cfg, int require_nvfp4);

/* ---------------------------------------------------------------------------------------
 * NVFP4 on the host (the layout ModelOpt writes; docs/checkpoints.md)
 *   weight        uint8 [N, K/2]  two E2M1 codes a byte, element 2i in the low nibble
 *   weight_scale  uint8 [N, K/16] E4M3 block scales, one per 16 consecutive K elements
 *   weight_scale_2 float scalar   amax(W) / (6 * 448)
 * ------------------------------------------------------------------------------------- */

/* Quantize W [n, k] (k a multiple of 16). `name` labels errors (a NaN or Inf names the
 * tensor and the index). Outputs are written only on success. */
MJ_API mj_status mj_nvfp4_quantize(const float *w, int64_t n, int64_t k, const char *name,
                                   uint8_t *weight, uint8_t *weight_scale,
                                   float *weight_scale_2);

/* W[n,k] = e2m1(code) * e4m3(weight_scale[n, k/16]) * weight_scale_2. */
MJ_API mj_status mj_nvfp4_dequantize(const uint8_t *weight, const uint8_t *weight_scale,
                                     float weight_scale_2, int64_t n, int64_t k, float *w);

/* W4A4 activation quantization (as the sm_120 path does it): gs = 1/input_scale,
 * SF = e4m3(gs * blockmax / 6), q = e2m1(x * gs / SF). x [rows, k] -> q [rows, k/2],
 * sf [rows, k/16]. A code's sign bit is that of x * gs / SF, as the GPU's cvt gives it:
 * -0.0 is code 8 (-0) here, where mj_nvfp4_quantize writes ModelOpt's code 0. */
MJ_API mj_status mj_nvfp4_quantize_act(const float *x, int64_t rows, int64_t k,
                                       float input_scale, const char *name, uint8_t *q,
                                       uint8_t *sf);

/* Dequantize W4A4 activations back to floats: x = (e2m1(q) * e4m3(sf)) * input_scale. */
MJ_API mj_status mj_nvfp4_dequantize_act(const uint8_t *q, const uint8_t *sf, int64_t rows,
                                         int64_t k, float input_scale, float *x);

/* ---------------------------------------------------------------------------------------
 * Routing (noaux_tc and OEA), CPU reference
 * ------------------------------------------------------------------------------------- */
/* The route structs below, like mj_context_options, start with struct_size and have an
 * initializer macro: a caller built against an older header passes its smaller size and the
 * library fills the fields that caller does not know with their defaults. */
typedef struct mj_route_params {
    uint32_t struct_size;      /* sizeof(mj_route_params): set by MJ_ROUTE_PARAMS_INIT       */
    int32_t n_experts;         /* E                                                         */
    int32_t topk;              /* k                                                         */
    int32_t k0;                /* OEA phase-1 size, 1..k; k0 == k is plain top-k            */
    int32_t n_group;           /* 1 = no group limit                                        */
    int32_t topk_group;        /* groups kept when n_group > 1                               */
    mj_scoring scoring;
    float routed_scaling_factor;
    int32_t renormalize;       /* norm_topk_prob                                            */
    mj_group_score group_score;/* how a group is scored when n_group > 1 (a caller whose
                                  struct ends before it gets MJ_GROUP_SCORE_TOP2_SUM)       */
} mj_route_params;
/* Plain top-k over no experts yet: set n_experts, topk and k0 (or use
 * mj_route_params_from_config). */
#define MJ_ROUTE_PARAMS_INIT \
    {sizeof(mj_route_params), 0, 0, 0, 1, 1, MJ_SCORING_SIGMOID, 1.0f, 1, MJ_GROUP_SCORE_TOP2_SUM}
/* The size of mj_route_params before group_score was added (0.1.0): still accepted; such a
 * caller routes with the top-2 sum, the only rule there was. */
#define MJ_ROUTE_PARAMS_V1_SIZE offsetof(mj_route_params, group_score)

/* Routing parameters of a model, with k0 = k (plain top-k). */
MJ_API mj_status mj_route_params_from_config(const mj_moe_config *cfg, mj_route_params *p);

typedef struct mj_route_stats {
    uint32_t struct_size;      /* sizeof(mj_route_stats): set by MJ_ROUTE_STATS_INIT         */
    int32_t unique_before;     /* distinct experts of plain top-k over the valid tokens    */
    int32_t unique_after;      /* distinct experts after OEA                                */
    double mean_experts;       /* mean experts per valid token after OEA                    */
    double retained_mass;      /* sum over tokens of chosen s / sum of top-k s (1 if k0=k) */
    int64_t nan_logits;        /* NaN logits seen in the valid rows                         */
} mj_route_stats;
#define MJ_ROUTE_STATS_INIT {sizeof(mj_route_stats), 0, 0, 0.0, 0.0, 0}

/* Route B tokens. logits [B, E] f32; bias [E] f32 or NULL (used for selection only).
 * What it computes (the contract every routing kernel is tested against):
 * - s = sigmoid(logit) (MJ_SCORING_SOFTMAX: softmax over the row); selection score c = s + bias;
 * - with n_group > 1 only the topk_group best groups (scored by group_score) are eligible,
 *   ties to the lower group id;
 * - experts rank by c, descending, ties to the lower expert id, NaN below every number;
 * - OEA phase 1 keeps each valid token's first k0; S_base is their union over the first
 *   num_valid tokens; phase 2 walks each token's ranking past k0 and adds the experts that
 *   are in S_base until it has k (k0 == k is plain top-k);
 * - weights are the unbiased s of the chosen experts, divided by (their sum + 1e-20) when
 *   renormalize is set, times routed_scaling_factor.
 * Rows at and past num_valid are padding: they get no experts and do not join S_base.
 * Outputs: ids [B, k] i32 and weights [B, k] f32 in ranking order; n_sel [B] the number of
 * experts each token got (k0..k; 0 for padding); slots past n_sel hold id -1, weight 0.
 * NaN logits rank below every number (ties: the lower expert id first). stats may be NULL. */
MJ_API mj_status mj_route_ref(const mj_route_params *p, const float *logits, const float *bias,
                              int32_t B, int32_t num_valid, int32_t *ids, float *weights,
                              int32_t *n_sel, mj_route_stats *stats);

/* ---------------------------------------------------------------------------------------
 * The MoE layer on the host: weights and the CPU reference forward (the oracle)
 * ------------------------------------------------------------------------------------- */

/* One NVFP4 linear layer, weight [n_out, k_in] in the original model. */
typedef struct mj_nvfp4_linear {
    int32_t n_out, k_in;
    uint8_t *weight;           /* [n_out, k_in/2]                                           */
    uint8_t *weight_scale;     /* [n_out, k_in/16] e4m3                                     */
    float weight_scale_2;
    float input_scale;         /* amax(x) / (6*448) of this layer's input (W4A4)            */
} mj_nvfp4_linear;

typedef enum mj_parallel { MJ_PAR_NONE = 0, MJ_PAR_TP = 1, MJ_PAR_EP = 2 } mj_parallel;

/* An MoE layer's weights in host memory (owned by the handle). Under TP = n a rank holds
 * rows [r*I/n, (r+1)*I/n) of every expert's gate and up projections and the same columns of
 * down; under EP = n it holds experts [r*E/n, (r+1)*E/n) whole, and rank 0 the shared
 * experts. Partial outputs of all ranks sum to the unsplit layer's output. */
typedef struct mj_layer *mj_layer_t;

/* A random layer of this config, reproducible from seed (weights quantized to NVFP4 and
 * input scales calibrated on random tokens). For tests, benchmarks and `moejit demo`. */
MJ_API mj_status mj_layer_create_random(const mj_moe_config *cfg, uint64_t seed,
                                        mj_layer_t *out);

/* The slice of `full` that rank `rank` of `n_ranks` holds (a new handle, own memory). */
MJ_API mj_status mj_layer_shard(mj_layer_t full, mj_parallel kind, int32_t rank,
                                int32_t n_ranks, mj_layer_t *out);

MJ_API mj_status mj_layer_free(mj_layer_t layer);

typedef enum mj_weight_mode {
    MJ_MODE_W4A16 = 0,  /* dequantized weights, float activations                         */
    MJ_MODE_W4A4 = 1    /* activations quantized to NVFP4 with input_scale (sm_120 path)  */
} mj_weight_mode;

/* The CPU reference forward of one MoE layer (or of one rank's part of it):
 * hidden [B, H] bf16 -> router GEMM -> route (k0; 0 means k, plain top-k) -> experts ->
 * combine (slot order, fp32) + shared expert (weight 1; with cfg.shared_gate, each token's
 * sigmoid(x . shared_expert_gate), the dot product of bf16 values summed in float in index
 * order, then 1 / (1 + expf(-dot))). GEMMs accumulate in fp64 over
 * exact e2m1*e4m3 products and apply weight_scale_2 (W4A16) or input_scale*weight_scale_2
 * (W4A4) to the sum. Between an expert's two GEMMs the SwiGLU output is rounded to bf16
 * (W4A16) or quantized to NVFP4 with w2's input_scale (W4A4), as the kernels do.
 * out [B, H] f32 receives this rank's partial output (the whole output when unsplit);
 * padding rows (>= num_valid) are zero. stats may be NULL. */
MJ_API mj_status mj_moe_forward_ref(mj_layer_t layer, mj_weight_mode mode,
                                    const uint16_t *hidden, int32_t B, int32_t num_valid,
                                    int32_t k0, float *out, mj_route_stats *stats);

/* The router GEMM alone: logits [B, E] = hidden [B, H] bf16 x gate [E, H] bf16 (fp64
 * accumulation, rounded to f32). */
MJ_API mj_status mj_router_ref(mj_layer_t layer, const uint16_t *hidden, int32_t B,
                               float *logits);

/* ---------------------------------------------------------------------------------------
 * Checkpoints: MoE layers from a Hugging Face ModelOpt NVFP4 checkpoint directory
 *
 * A directory holds config.json, hf_quant_config.json (or quantization_config inside
 * config.json), and either model.safetensors.index.json with the shards it names or a single
 * model.safetensors. Layer L's tensors:
 *   model.layers.L.mlp.gate.weight                     bf16 [E, H]   the router
 *   model.layers.L.mlp.gate.e_score_correction_bias    f32 [E]       when topk_method is noaux_tc
 *   model.layers.L.mlp.experts.e.P.weight              u8 [N, K/2]   P: gate_proj, up_proj [I, H];
 *   model.layers.L.mlp.experts.e.P.weight_scale        e4m3 (or u8) [N, K/16]    down_proj [H, I]
 *   model.layers.L.mlp.experts.e.P.weight_scale_2      f32 [] or [1]
 *   model.layers.L.mlp.experts.e.P.input_scale         f32 [] or [1]
 *   model.layers.L.mlp.shared_experts.P.*              the same with n_shared * I for I
 * Qwen2-MoE and Qwen3-Next (model_type qwen2_moe, qwen3_next) name their one shared expert
 * in the singular and gate it (n_shared * I = shared_expert_intermediate_size):
 *   model.layers.L.mlp.shared_expert.P.*               the shared expert, as above
 *   model.layers.L.mlp.shared_expert_gate.weight       bf16 [1, H]   its sigmoid gate (ModelOpt
 *                                                      leaves it unquantized)
 * Mixtral and MiniMax-M2 (model_type mixtral, minimax_m2) keep the layer in block_sparse_moe:
 *   model.layers.L.block_sparse_moe.gate.weight        the router
 *   model.layers.L.block_sparse_moe.e_score_correction_bias   MiniMax-M2's selection bias
 *   model.layers.L.block_sparse_moe.experts.e.P.*      P: w1 (gate), w3 (up), w2 (down), the
 *                                                      same four tensors each; no shared expert
 * A tensor of a layer's block that the config makes moejit skip (a selection bias the routing
 * does not use, a shared expert it does not declare, a shared-expert gate it does not
 * declare, a router bias) is
 * refused naming it (MJ_ERR_UNSUPPORTED); a selection bias of zeros is skipped with a warning.
 * gate_proj and up_proj become w13 = [gate rows ; up rows]. Their weight_scale_2 and
 * input_scale should be equal (ModelOpt fuses them); where they differ the larger is taken
 * and the other's block scales are re-rounded against it (lossy; a warning once per layer).
 * Shards must be regular files inside the directory (a symbolic link, FIFO, or a name with a
 * '/' is refused), and so must config.json, hf_quant_config.json and the index (a symbolic
 * link or FIFO is refused): a Hugging Face cache snapshot, whose files are links into blobs/,
 * is refused; download with --local-dir. Every error names the file and the tensor.
 * ------------------------------------------------------------------------------------- */
typedef struct mj_checkpoint *mj_checkpoint_t;

/* Open a checkpoint directory: read the configs, open the shards read-only (one file
 * descriptor each, held until close: mind the process's limit; tensor bytes are read with
 * pread, never mapped) and check their
 * headers (dtypes known, sizes matching shapes, offsets inside the file, no overlaps) and the
 * index (every tensor it names is in its shard). Tensor bytes are read by mj_layer_load. The
 * quantization must be NVFP4 (MJ_ERR_UNSUPPORTED otherwise). */
MJ_API mj_status mj_checkpoint_open(const char *dir, mj_checkpoint_t *out);
/* The model's MoE layer config (config.json with its quantization). */
MJ_API mj_status mj_checkpoint_config(mj_checkpoint_t ck, mj_moe_config *cfg);
/* The MoE layers the checkpoint holds tensors for, ascending: *n of them (all, even when
 * more than cap), the first min(*n, cap) written to layers[]. */
MJ_API mj_status mj_checkpoint_moe_layers(mj_checkpoint_t ck, int32_t *layers, int32_t cap, int32_t *n);
/* One MoE layer, whole (MJ_PAR_NONE, rank 0 of 1) or rank's slice under TP / EP: the handle
 * mj_layer_shard would make from the whole layer, byte for byte, reading only the bytes of
 * that slice from the shards. Checks every tensor's dtype and shape against the config and
 * that scales are finite (block scales: not the e4m3 NaN, not negative; weight_scale_2 and
 * input_scale: positive). On any error nothing is allocated and *out is untouched. Several
 * threads (ranks) may load from one open checkpoint at once. */
MJ_API mj_status mj_layer_load(mj_checkpoint_t ck, int32_t layer, mj_parallel kind, int32_t rank,
                               int32_t n_ranks, mj_layer_t *out);
/* Close the shards and free the handle (layers loaded from it stay valid). */
MJ_API mj_status mj_checkpoint_close(mj_checkpoint_t ck);

/* Writing a checkpoint of random layers (`moejit make-checkpoint`, tests): config.json (the
 * source's keys with the overrides applied), hf_quant_config.json, the shards and, with more
 * than one shard, model.safetensors.index.json, in the layout above. Layer L holds the
 * tensors of mj_layer_create_random(cfg, mj_checkpoint_layer_seed(seed, L)), where cfg is what
 * mj_checkpoint_config reads back. Tensors are packed into shards in order (router, then
 * experts 0..E-1 gate/up/down, then the shared expert; layers ascending) up to shard_bytes
 * of data each (a larger tensor gets a shard of its own); one shard is model.safetensors, more
 * are model-0000i-of-0000n.safetensors. Written into a new directory beside out_dir, renamed
 * to out_dir when complete: on an error nothing is left behind. */
typedef struct mj_checkpoint_make_options {
    uint32_t struct_size;      /* sizeof(mj_checkpoint_make_options): set by the initializer  */
    const char *config_json;   /* the source config.json (required; a symbolic link to it is
                                  followed, as for mj_moe_config_read and quant_json)         */
    const char *quant_json;    /* an NVFP4 hf_quant_config.json to copy, or NULL: a ModelOpt
                                  NVFP4 one (group 16) is written                             */
    const char *out_dir;       /* the directory to create: must not exist, or be empty      */
    uint64_t seed;
    int32_t layer_first;       /* MoE layers layer_first..layer_last (the dense ones between
                                  are skipped); -1: the first MoE layer (first_k_dense_replace) */
    int32_t layer_last;        /* -1: layer_first                                            */
    int32_t hidden;            /* overrides of hidden_size, moe_intermediate_size,          */
    int32_t intermediate;      /* n_routed_experts (or num_experts) and num_experts_per_tok; */
    int32_t n_experts;         /* 0: the source's value                                     */
    int32_t topk;
    int64_t shard_bytes;       /* tensor bytes per shard; 0: 5e9 (Hugging Face's "5GB")      */
} mj_checkpoint_make_options;
#define MJ_CHECKPOINT_MAKE_OPTIONS_INIT \
    {sizeof(mj_checkpoint_make_options), NULL, NULL, NULL, 0, -1, -1, 0, 0, 0, 0, 0}

/* What mj_checkpoint_make writes (mj_checkpoint_make_plan says it beforehand). */
typedef struct mj_checkpoint_make_info {
    uint32_t struct_size;      /* sizeof(mj_checkpoint_make_info): set by the initializer     */
    mj_moe_config cfg;         /* the config the checkpoint will have                        */
    int32_t layer_first, layer_last; /* the MoE layers written, and how many                 */
    int32_t n_layers;
    int32_t n_shards;
    int64_t tensor_bytes;      /* tensor data                                                */
    int64_t total_bytes;       /* every file: shards with their headers, the JSON files      */
} mj_checkpoint_make_info;
#define MJ_CHECKPOINT_MAKE_INFO_INIT {sizeof(mj_checkpoint_make_info), {0}, 0, 0, 0, 0, 0, 0}

/* The seed of layer L's tensors: one splitmix64 step (mj_rng_next) from the state
 * seed + (L + 1) * 0xD1B54A32D192ED03. */
MJ_API mj_status mj_checkpoint_layer_seed(uint64_t seed, int32_t layer, uint64_t *out);
/* Check the options and say what would be written, writing nothing. */
MJ_API mj_status mj_checkpoint_make_plan(const mj_checkpoint_make_options *opts,
                                         mj_checkpoint_make_info *info);
/* Write the checkpoint. Refuses (before writing) an out_dir that exists and is not an empty
 * directory, and a checkpoint larger than the free space of out_dir's file system. */
MJ_API mj_status mj_checkpoint_make(const mj_checkpoint_make_options *opts);

/* ---------------------------------------------------------------------------------------
 * The JIT: a context owns the kernel cache (memory and disk) and, optionally, a device
 * ------------------------------------------------------------------------------------- */
typedef struct mj_context *mj_context_t;

/* Where kernels run: the GPU (CUDA) or the CPU interpreter (sim), which compiles the same
 * generated source with the host C compiler and runs it with CUDA's execution model. */
typedef enum mj_backend { MJ_BACKEND_CUDA = 0, MJ_BACKEND_SIM = 1, MJ_BACKEND_COUNT } mj_backend;
#define MJ_BACKEND_AUTO (-1) /* cuda when a device is there, else sim                    */

#define MJ_DEVICE_NONE (-1) /* compile only: no GPU or driver needed                   */
#define MJ_DEVICE_AUTO (-2) /* GPU 0 when a driver and device are there, else none       */

typedef struct mj_context_options {
    uint32_t struct_size;      /* sizeof(mj_context_options): set by the initializer      */
    const char *cache_dir;     /* NULL: $MOEJIT_CACHE_DIR, $XDG_CACHE_HOME/moejit, ~/.cache/moejit */
    int64_t cache_max_bytes;   /* 0: $MOEJIT_CACHE_MAX_BYTES, else 1 GiB                   */
    int32_t strict;            /* -1: $MOEJIT_STRICT; 1: a kernel not in the cache is an
                                  error (MJ_ERR_CACHE_MISS) instead of a compile; 0: off  */
    int32_t device;            /* CUDA ordinal, MJ_DEVICE_NONE or MJ_DEVICE_AUTO           */
    int32_t backend;           /* MJ_BACKEND_CUDA, MJ_BACKEND_SIM or MJ_BACKEND_AUTO       */
    const char *target;        /* NULL: the device's, else "sm_120a"; e.g. "sm_90a"       */
} mj_context_options;
#define MJ_CONTEXT_OPTIONS_INIT \
    {sizeof(mj_context_options), NULL, 0, -1, MJ_DEVICE_AUTO, MJ_BACKEND_AUTO, NULL}

/* Create a context. The cache directory is created (0700) if needed; an unusable one is a
 * warning (kernels are then kept in memory only), not an error. $MOEJIT_RECORD=path makes
 * every compile append its specialization to path as a prewarm manifest line. */
MJ_API mj_status mj_context_create(const mj_context_options *opts, mj_context_t *out);
MJ_API mj_status mj_context_destroy(mj_context_t ctx);

typedef struct mj_jit_stats {
    int64_t mem_hits, mem_misses;      /* in-memory table                                  */
    int64_t disk_hits, disk_misses;    /* cache files                                      */
    int64_t compiles, compile_failures;
    double compile_ms;                 /* total time in the compiler                       */
    int64_t quarantined;               /* bad cache entries moved aside                    */
    int64_t lock_waits;                /* waits for another process compiling the same key */
    int64_t evicted;                   /* entries removed for the size cap                 */
    int64_t strict_misses;             /* requests refused by strict mode                  */
    int64_t refused_unsafe;            /* entries not loaded: unsafe cache directory       */
    int64_t store_failures;            /* compiled kernels not written to the disk cache
                                          (an I/O error such as a full disk, or a read-only
                                          or unsafe cache): kept in memory only, compiled
                                          again by the next process                        */
} mj_jit_stats;
MJ_API mj_status mj_context_stats(mj_context_t ctx, mj_jit_stats *out);

/* Compile one specialization into the cache without a device, from a manifest line:
 * {"template": "router_gemm", "knobs": {"H": 6144, "E": 256, "ROWS": 8, "NWARPS": 4}, "arch": "sm_120a"}.
 * *was_cached (may be NULL) says whether it was there already. */
MJ_API mj_status mj_prewarm_json(mj_context_t ctx, const char *manifest_line, int *was_cached);

/* The backend and target kernels of this context are built for. */
MJ_API mj_status mj_context_backend(mj_context_t ctx, mj_backend *backend, const char **target);

/* ---------------------------------------------------------------------------------------
 * Routing on the device (or the interpreter): the piece a serving engine can adopt alone
 * ------------------------------------------------------------------------------------- */

/* k0 per batch size: "4" (always 4) or "1-3:8,4-15:6,16-:4" (B in 1..3 -> 8, ...). */
#define MJ_K0_POLICY_MAX_RULES 16
typedef struct mj_k0_policy {
    int32_t n_rules;
    struct { int32_t b_lo, b_hi, k0; } rules[MJ_K0_POLICY_MAX_RULES]; /* b_hi = INT32_MAX: open */
} mj_k0_policy;
/* Parse a policy; every k0 must be in 1..topk and the ranges must not overlap. */
MJ_API mj_status mj_k0_policy_parse(const char *text, int32_t topk, mj_k0_policy *out);
/* k0 for a batch of B tokens (B >= 1); a B no rule covers is an error naming B. */
MJ_API mj_status mj_k0_policy_resolve(const mj_k0_policy *p, int32_t B, int32_t *k0);

/* What mj_route writes: the routing itself and the dispatch metadata the grouped GEMMs use.
 * All pointers are device pointers (host pointers for the sim backend). Optional ones may be
 * NULL. A "row" is one (token, slot) pair; rows are grouped by expert, experts in id order,
 * within an expert by token then slot. */
typedef struct mj_route_outputs {
    uint32_t struct_size;      /* sizeof(mj_route_outputs): set by MJ_ROUTE_OUTPUTS_INIT     */
    int32_t *ids;              /* [B, k] expert ids in ranking order, -1 past n_sel         */
    float *weights;            /* [B, k] routing weights, 0 past n_sel                      */
    int32_t *n_sel;            /* [B] experts each token got (k0..k; 0 for padding)         */
    int32_t *expert_counts;    /* [E] rows routed to each expert (optional)                 */
    int32_t *expert_offsets;   /* [E + 1] exclusive prefix sum of counts (optional)         */
    int32_t *active_experts;   /* [E] experts with rows, ascending, then -1 (optional)     */
    int32_t *n_active;         /* [1] number of active experts = unique experts (optional) */
    int32_t *permutation;      /* [B, k] row of each (token, slot), -1 past n_sel (optional) */
    int32_t *row_index;        /* [B, k] the inverse: the (token * k + slot) of each row, then
                                  -1 past the routed rows (optional; the experts need it)   */
} mj_route_outputs;
#define MJ_ROUTE_OUTPUTS_INIT \
    {sizeof(mj_route_outputs), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}
/* The size of mj_route_outputs before row_index was added (0.1): still accepted. */
#define MJ_ROUTE_OUTPUTS_V1_SIZE offsetof(mj_route_outputs, row_index)

/* Route B tokens as mj_route_ref does: one kernel, one thread block at decode sizes; with
 * k0 == k above the single-block limit a multi-block plain top-k. logits [B, E] f32, bias [E]
 * or NULL.
 *
 * num_valid is a device pointer to one int32 (a host pointer on the sim backend), read when
 * the kernel runs: rows at and past *num_valid are padding (a value outside 0..B is clamped
 * to it). NULL means all B rows are tokens. So a CUDA graph captured once for a batch bucket
 * B replays for every real token count the engine writes there before the replay.
 * Capturable once its kernel is in the cache: no allocation, no host sync, no compile.
 *
 * What agrees with mj_route_ref: on the interpreter (the same arithmetic on the same CPU)
 * ids, n_sel and the dispatch outputs bit for bit, weights within 1e-6 relative. On a GPU
 * the sigmoid's expf may differ from the host's by an ulp, so two experts whose scores tie
 * to within an ulp may rank the other way; the GPU test (test_route_gpu) checks ids and
 * counts exactly on inputs without such near-ties and weights within 1e-6 relative. */
MJ_API mj_status mj_route(mj_context_t ctx, const mj_route_params *p, const float *logits,
                          const float *bias, int32_t B, const int32_t *num_valid,
                          const mj_route_outputs *out, void *stream);

/* The router GEMM: logits [B, E] f32 = hidden [B, H] bf16 x gate [E, H] bf16 (the bf16 MMA,
 * fp32 accumulation). The same bits on every run of the same B; how H is split depends on B,
 * so a token's logits may differ in the last bits between batch sizes. At decode sizes the
 * kernel splits H over blocks and adds their sums in a fixed order in a device workspace:
 * size it with mj_router_gemm_workspace for the largest B you will pass (0 bytes: none
 * needed, NULL is fine), 16-byte aligned, and zero it once before its first use. Every call
 * leaves its counters at 0 again (the rest is scratch), so one workspace serves every B up to
 * its size, in any order, for calls that run one after another (one stream, a graph's
 * replays), not two at once. Capturable once its kernel is in the cache. */
MJ_API mj_status mj_router_gemm_workspace(int32_t max_batch, int32_t H, int32_t E, size_t *bytes);
MJ_API mj_status mj_router_gemm(mj_context_t ctx, const uint16_t *hidden, const uint16_t *gate,
                                int32_t B, int32_t H, int32_t E, float *logits, void *workspace,
                                size_t workspace_bytes, void *stream);

/* The dispatch metadata of a routing, on the host (the reference for mj_route's). */
MJ_API mj_status mj_route_dispatch_ref(const int32_t *ids, const int32_t *n_sel, int32_t B,
                                       int32_t k, int32_t E, int32_t *expert_counts,
                                       int32_t *expert_offsets, int32_t *active_experts,
                                       int32_t *n_active, int32_t *permutation,
                                       int32_t *row_index);

/* ---------------------------------------------------------------------------------------
 * The experts: one rank's routed and shared experts as NVFP4 grouped GEMMs
 * ------------------------------------------------------------------------------------- */

/* A rank's expert weights packed for the kernels (in device memory on a GPU, in host
 * memory on the interpreter), and the workspace of a forward of up to max_batch tokens. */
typedef struct mj_experts *mj_experts_t;

/* Which GEMM path a forward takes, by batch size: "w4a16" (or "w4a4") for every B, or rules
 * "1-8:w4a16,9-:w4a4". W4A4 needs sm_120a / sm_121a. */
typedef struct mj_experts_options {
    uint32_t struct_size;      /* sizeof(mj_experts_options): set by the initializer        */
    int32_t max_batch;         /* the largest B a forward takes (sizes the workspace)       */
    const char *mode_policy;   /* for MJ_MODE_AUTO; NULL: "1-8:w4a16,9-:w4a4" where W4A4
                                  exists, else "w4a16"                                      */
} mj_experts_options;
#define MJ_EXPERTS_OPTIONS_INIT {sizeof(mj_experts_options), 256, NULL}

/* For mj_experts_forward: the path by the options' mode policy. */
#define MJ_MODE_AUTO ((mj_weight_mode)2)

/* Pack the experts a layer handle holds (the whole layer, or one rank's TP slice or EP
 * share: see mj_layer_shard) for ctx's backend and target. The shared expert runs as
 * n_shared * I / I_local sub-experts of the routed experts' size; its gate (cfg.shared_gate)
 * goes with it, whole on every rank that holds a slice of it. */
MJ_API mj_status mj_experts_create(mj_context_t ctx, mj_layer_t layer, const mj_experts_options *opts,
                                   mj_experts_t *out);

/* Compile (or load from the cache) every kernel forwards of 1..max_batch tokens can use, in
 * mode (MJ_MODE_AUTO: what the policy picks): afterwards a forward of up to max_batch tokens
 * compiles nothing, so it can be captured in a CUDA graph. */
MJ_API mj_status mj_experts_prepare(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode,
                                    int32_t max_batch);

/* The experts' part of the layer for B tokens of which *num_valid are real (num_valid: a
 * device int32, NULL: all B):
 *   out [B, H] f32 = sum over each token's routed experts held here of weight * expert(x)
 *                    + the shared expert (if held here) for every valid token, times
 *                      sigmoid(x . shared_expert_gate) where the config gates it,
 * expert(x) = w2 . (silu(gate . x) * (up . x)); padding rows are 0. hidden [B, H] bf16 and
 * out are device pointers; route is what mj_route wrote for these B tokens (ids, weights,
 * expert_counts, expert_offsets, active_experts, n_active, permutation and row_index are
 * all needed). Only the active experts' weights are read, each byte once for B <= 64. No
 * allocation, no host sync; deterministic (no floating-point atomics): the same inputs
 * give the same bits. */
MJ_API mj_status mj_experts_forward(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode,
                                    const uint16_t *hidden, const mj_route_outputs *route, int32_t B,
                                    const int32_t *num_valid, float *out, void *stream);

/* The mode a forward of B tokens takes under mode (MJ_MODE_AUTO resolved by the policy). */
MJ_API mj_status mj_experts_mode(mj_experts_t ex, mj_weight_mode mode, int32_t B, mj_weight_mode *resolved);

MJ_API mj_status mj_experts_free(mj_experts_t ex);

/* ---------------------------------------------------------------------------------------
 * Experts adopted from a serving engine's tensors (docs/engines.md)
 *
 * An engine that loaded a ModelOpt NVFP4 checkpoint holds, per rank (E_loc experts here, H
 * hidden, I = I_loc intermediate rows of one expert here):
 *   w13_weight        u8   [E_loc, 2 I, H/2]   FP4 codes, element 2i in the low nibble;
 *                                              rows [gate; up] (or [up; gate])
 *   w13_weight_scale  e4m3 [E_loc, 2 I, H/16]  block scales, linear or swizzled (below)
 *   w2_weight         u8   [E_loc, H, I/2]
 *   w2_weight_scale   e4m3 [E_loc, H, I/16]
 *   w13_weight_scale_2 f32 [E_loc, 2] or [E_loc] (or one for all), w2_weight_scale_2 [E_loc]
 *   w13_input_scale   f32 [E_global, 2] or [E_global], w2_input_scale [E_global] (or one)
 * mj_experts_adopt makes an experts handle from them without a second copy of the weights:
 * each expert is repacked, in place, into the layout the kernels stream (pack.c), through a
 * host buffer of one expert. The codes always take the same bytes packed; the block scales
 * take the same bytes when H and I are multiples of 256 (and, swizzled, H a multiple of
 * 128); otherwise the packed scales go into a buffer of the handle's own (their packed size:
 * about 1/8 of the codes) and the engine's scale tensors are left as they were. The device
 * memory the handle allocates besides is the forward's workspace, the per-expert scalars and
 * the dispatch metadata (mj_experts_adopt_info says how many bytes). After an in-place
 * adoption the engine's weight tensors hold moejit's layout: nothing else may read them until
 * mj_experts_release gives them back. With MJ_ADOPT_COPY the engine's tensors are read, never
 * written, and the packed weights are the handle's own.
 *
 * Swizzled block scales (CUTLASS / FlashInfer 128x4): per expert, an M x K scale matrix (M
 * rows, K = columns / 16) padded to Mp = M rounded up to 128 and Kp = K rounded up to 4; the
 * byte of (m, k) at ((m / 128) * (Kp / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4
 * + k % 4; an expert's scales take Mp * Kp bytes.
 *
 * Every check is made before anything is written: a refused call (a bad shape, flag, pointer,
 * a NaN or negative block scale, a scalar scale that is not positive and finite) leaves the
 * engine's tensors untouched.
 * ------------------------------------------------------------------------------------- */

#define MJ_ADOPT_UP_FIRST         (1u << 0) /* w13 rows are [up; gate] (else [gate; up])       */
#define MJ_ADOPT_SCALES_SWIZZLED  (1u << 1) /* block scales in the 128x4 layout above          */
#define MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2 (1u << 2) /* the weight_scale_2 tensors hold
                                               1 / weight_scale_2 (CompressedTensors'
                                               weight_global_scale)                            */
#define MJ_ADOPT_RECIPROCAL_INPUT_SCALE (1u << 3) /* the input_scale tensors hold 1 / input_scale
                                               (CompressedTensors' input_global_scale)           */
#define MJ_ADOPT_COPY             (1u << 4) /* pack into buffers of the handle's own; the
                                               engine's tensors are only read                    */
#define MJ_ADOPT_FLAGS_ALL        ((1u << 5) - 1)

/* A float32 tensor of per-tensor scales: rows x cols, row-major. rows 1 is one value for
 * every expert; cols 2 is w13's gate and up (the larger is used: see mj_adopt_tensors). */
typedef struct mj_adopt_scale {
    const float *data;         /* device pointer (host pointer on the interpreter)          */
    int32_t rows, cols;
} mj_adopt_scale;

/* One rank's expert tensors as an engine holds them. Pointers are device pointers on a GPU
 * context, host pointers on the interpreter; each tensor contiguous. */
typedef struct mj_adopt_tensors {
    uint32_t struct_size;      /* sizeof(mj_adopt_tensors): set by MJ_ADOPT_TENSORS_INIT       */
    int32_t n_experts;         /* E_loc: experts held here (ids 0..E_loc-1 in topk_ids)       */
    int32_t hidden;            /* H: a multiple of MJ_DIM_ALIGN                               */
    int32_t intermediate;      /* I: one expert's intermediate rows held here (I_loc)         */
    int32_t topk;              /* columns of the engine's topk_ids (its top-k, with the fused
                                  shared expert's column when it has one)                    */
    uint8_t *w13_weight;       /* [E_loc, 2 I, H/2]                                          */
    uint8_t *w13_weight_scale; /* [E_loc, 2 I, H/16]; swizzled: [E_loc, 2I^128, (H/16)^4]    */
    uint8_t *w2_weight;        /* [E_loc, H, I/2]                                            */
    uint8_t *w2_weight_scale;  /* [E_loc, H, I/16];   swizzled: [E_loc, H^128, (I/16)^4]     */
    mj_adopt_scale w13_weight_scale_2; /* rows 1 or E_loc, cols 1 or 2. Gate and up that
                                  differ: the larger is taken and the other half's block
                                  scales are re-rounded to e4m3 against it (lossy; in place,
                                  that half's scale bytes change)                            */
    mj_adopt_scale w2_weight_scale_2;  /* rows 1 or E_loc, cols 1                             */
    mj_adopt_scale w13_input_scale;    /* rows 1 or at least expert_begin + E_loc, cols 1 or 2
                                  (the larger of gate's and up's is used)                    */
    mj_adopt_scale w2_input_scale;     /* rows 1 or at least expert_begin + E_loc, cols 1     */
    int32_t expert_begin;      /* the input scales' row of local expert 0 (under EP with
                                  E_global rows: rank * E_loc; rows not in one run, as
                                  SGLang's fused shared experts': pass a copy of the rank's) */
    uint32_t flags;            /* MJ_ADOPT_*                                                  */
} mj_adopt_tensors;
#define MJ_ADOPT_TENSORS_INIT \
    {sizeof(mj_adopt_tensors), 0, 0, 0, 0, NULL, NULL, NULL, NULL, {NULL, 0, 0}, {NULL, 0, 0}, \
     {NULL, 0, 0}, {NULL, 0, 0}, 0, 0}

/* Make an experts handle of ctx's backend from an engine's tensors (see above); opts as for
 * mj_experts_create (max_batch: the most tokens of one forward). The handle's experts are
 * local: expert x is row x of the tensors, and mj_experts_forward_topk takes ids 0..E_loc-1
 * (-1: none). The tensors must stay alive, where they are, as long as the handle. */
MJ_API mj_status mj_experts_adopt(mj_context_t ctx, const mj_adopt_tensors *t, const mj_experts_options *opts,
                                  mj_experts_t *out);

/* After the engine loaded new weights into the same tensors (in place: every expert's bytes
 * rewritten in the engine's layout; the scalars may change), pack them again. t must name the
 * same tensors with the same shapes and flags as at adoption (MJ_ADOPT_COPY: the pointers may
 * differ). In place, buffers that still hold what moejit packed (no reload happened) are
 * refused, since packing them twice would scramble them, and the handle stays as it was; an
 * in-place readopt that fails later (a bad scale in the reloaded tensors) leaves the tensors
 * in the engine's layout and the handle refusing forwards until a readopt succeeds. */
MJ_API mj_status mj_experts_readopt(mj_experts_t ex, const mj_adopt_tensors *t);

/* Give an in-place adoption's tensors back in the engine's layout (codes, and block scales
 * linear or swizzled as adopted; re-rounded halves stay re-rounded), e.g. before the engine
 * reloads only some experts or hands the weights to another kernel. The handle then refuses
 * forwards until mj_experts_readopt. A copy adoption: nothing to give back (MJ_OK). */
MJ_API mj_status mj_experts_release(mj_experts_t ex);

typedef struct mj_adopt_info {
    uint32_t struct_size;      /* sizeof(mj_adopt_info): set by MJ_ADOPT_INFO_INIT            */
    int32_t adopted;           /* 1: made by mj_experts_adopt                                 */
    int32_t in_place;          /* 1: the codes live in the engine's tensors                   */
    int32_t scales_in_place;   /* 1: the block scales too                                     */
    int32_t released;          /* 1: mj_experts_release gave the tensors back                 */
    int64_t bytes_allocated;   /* memory where the kernels run this handle allocated: the
                                  workspace, scalars, dispatch metadata and its own packed
                                  weights (copy mode) or scales (when they did not fit)      */
    int64_t bytes_weights;     /* the packed weights' bytes (codes and scales, all experts)  */
} mj_adopt_info;
#define MJ_ADOPT_INFO_INIT {sizeof(mj_adopt_info), 0, 0, 0, 0, 0, 0}
MJ_API mj_status mj_experts_adopt_info(mj_experts_t ex, mj_adopt_info *info);

/* The output type of mj_experts_forward_topk. */
typedef enum mj_out_type { MJ_OUT_F32 = 0, MJ_OUT_BF16 = 1 } mj_out_type;

/* The experts of an adopted handle on an engine's top-k, for B tokens:
 *   out [B, H] = sum over j of topk_weights[b, j] * expert_{topk_ids[b, j]}(hidden[b])
 * hidden [B, H] bf16, topk_ids [B, topk] int32 (local ids 0..E_loc-1; -1: no expert, as an
 * engine marks padding rows and, under EP, experts of other ranks), topk_weights [B, topk]
 * f32 (used as they are: an engine that folds the routed scaling factor into them has it
 * applied). A row whose ids are all -1 comes out 0. num_valid as for mj_experts_forward
 * (NULL: all B; padding rows need ids -1 to come out 0). One dispatch launch (the ids grouped
 * by expert, in the handle's workspace) and the expert launches, on stream: no allocation,
 * no host sync once mj_experts_prepare has compiled the kernels, so it can be captured in a
 * CUDA graph. On the interpreter ids outside -1..E_loc-1 are refused (MJ_ERR_INVALID_ARG,
 * nothing written); on a GPU they are not checked (undefined: the engine's ids must be
 * right). out_type MJ_OUT_BF16: out is uint16_t bf16 bits, written by the down kernel from the
 * same f32 sums (rounded to nearest even, NaN kept quiet), on the interpreter and on a GPU. */
MJ_API mj_status mj_experts_forward_topk(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode,
                                         const uint16_t *hidden, int32_t B, const int32_t *topk_ids,
                                         const float *topk_weights, const int32_t *num_valid, void *out,
                                         mj_out_type out_type, void *stream);

/* ---------------------------------------------------------------------------------------
 * Communicators: the all-reduce that sums the ranks' partial outputs
 * ------------------------------------------------------------------------------------- */

/* One rank's end of a group of 1..MJ_COMM_MAX_RANKS ranks. Two kinds behind one interface:
 * loopback (ranks are threads of this process, buffers host memory: the interpreter's
 * multi-rank runs and tests) and NCCL (libnccl.so.2, dlopen'd, never linked; buffers device
 * memory). A handle is used by one thread at a time. */
typedef struct mj_comm *mj_comm_t;

#define MJ_COMM_MAX_RANKS 64

/* n_ranks loopback ranks as threads of one process: comms[r] is rank r's handle, each to be
 * driven by its own thread. Collectives are synchronous and deterministic. A rank that does
 * not arrive within 300 s aborts the group (MJ_ERR_COMM on every rank, then and after), and
 * so does freeing one rank's handle while the others still call: no hang either way. */
MJ_API mj_status mj_comm_loopback_create(int32_t n_ranks, mj_comm_t *comms /* [n_ranks] */);

/* NCCL. The library is $MOEJIT_NCCL when set (no fallback), else libnccl.so.2 from the
 * loader's search path or the CUDA toolkit; missing: MJ_ERR_LIBRARY saying what to
 * install. NCCL failures are MJ_ERR_COMM with NCCL's own text. */
typedef struct mj_comm_id { uint8_t bytes[128]; } mj_comm_id;   /* an ncclUniqueId */
/* A new id (ncclGetUniqueId) on one process, to be sent to every rank before init_rank. */
MJ_API mj_status mj_comm_nccl_unique_id(mj_comm_id *id);
/* Rank `rank` of n_ranks (ncclCommInitRank), on the calling thread's current CUDA device;
 * blocks until every rank has joined. */
MJ_API mj_status mj_comm_nccl_init_rank(const mj_comm_id *id, int32_t n_ranks, int32_t rank,
                                        mj_comm_t *out);
/* n_ranks ranks on the GPUs devices[0..n_ranks) (NULL: 0..n_ranks-1), one process
 * (ncclCommInitAll): comms[r] is rank r's. The devices must exist and be distinct (NCCL
 * refuses two ranks on one GPU); no GPU: MJ_ERR_NO_DEVICE. Drive each comm from its own
 * thread: ranks of one process that share a thread would have to group their calls. */
MJ_API mj_status mj_comm_nccl_init_all(int32_t n_ranks, const int32_t *devices, mj_comm_t *comms);
/* A handle over an engine's own ncclComm_t (a blocking one, NCCL's default): not owned, so
 * mj_comm_free leaves it alive. */
MJ_API mj_status mj_comm_nccl_wrap(void *nccl_comm, mj_comm_t *out);

/* This handle's rank and the group's size; either pointer may be NULL. */
MJ_API mj_status mj_comm_info(mj_comm_t c, int32_t *rank, int32_t *n_ranks);

/* recv[i] = sum over ranks of send[i], count floats (send == recv allowed); every rank must
 * call with the same count.
 * Loopback: host pointers, stream ignored; returns when every rank's recv is written. The
 * sum is taken in rank order, ((send_0 + send_1) + send_2) + ..., in f32, so every rank gets
 * the same bits, run after run. Ranks that disagree on count (or one that passes a NULL
 * buffer) all get MJ_ERR_INVALID_ARG naming the counts; the group stays usable.
 * NCCL: ncclAllReduce(float32, sum) enqueued on stream (a CUstream; NULL: the legacy
 * default stream), device pointers, asynchronous, capturable in a CUDA graph; count 0
 * enqueues nothing. Its bits depend on NCCL's algorithm and protocol: see docs/architecture.md, "Determinism". */
MJ_API mj_status mj_comm_all_reduce_f32(mj_comm_t c, const float *send, float *recv, int64_t count,
                                        void *stream);

/* Free this rank's handle (NULL is fine). A loopback group goes when its last handle does;
 * an NCCL comm made by init_rank/init_all is destroyed (ncclCommDestroy), a wrapped one is
 * not. */
MJ_API mj_status mj_comm_free(mj_comm_t c);


/* ---------------------------------------------------------------------------------------
 * The whole MoE layer: router GEMM -> routing -> experts -> all-reduce, on one rank of 1..8
 * ------------------------------------------------------------------------------------- */

#define MJ_MAX_RANKS MJ_COMM_MAX_RANKS /* ranks of a split (TP or EP)                       */
#define MJ_MAX_BATCH 65536  /* tokens of one forward                                      */

typedef struct mj_moe *mj_moe_t;

typedef struct mj_moe_options {
    uint32_t struct_size;      /* sizeof(mj_moe_options): set by MJ_MOE_OPTIONS_INIT         */
    mj_parallel parallel;      /* MJ_PAR_NONE (one rank holds the layer), MJ_PAR_TP, MJ_PAR_EP */
    int32_t rank, n_ranks;     /* this rank of the split (0 of 1 for MJ_PAR_NONE)           */
    mj_comm_t comm;            /* sums the ranks' partial outputs; NULL when n_ranks is 1   */
    int32_t rsf_in_weights;    /* 1: the routed weights carry routed_scaling_factor (as
                                  mj_route_ref; default); 0: they do not, for an engine that
                                  scales the routed output itself (SGLang's default): then
                                  set shared_expert 0 too and add the shared expert after
                                  scaling                                                    */
    int32_t shared_expert;     /* 1: the output includes the shared expert (default);
                                  0: routed experts only                                    */
    const char *mode_policy;   /* for MJ_MODE_AUTO (see mj_experts_options); NULL: the
                                  target's default                                           */
} mj_moe_options;
#define MJ_MOE_OPTIONS_INIT {sizeof(mj_moe_options), MJ_PAR_NONE, 0, 1, NULL, 1, 1, NULL}

/* A layer on this rank, for ctx's backend and target: its experts packed where the kernels
 * run (the device, or host memory on the interpreter), the router weight and bias beside
 * them. `layer` is the whole layer (this rank's slice is cut from it) or already this
 * rank's slice (mj_layer_shard or mj_layer_load with the same split); the handle keeps no
 * reference to it. Nothing is compiled yet. */
MJ_API mj_status mj_moe_create(mj_context_t ctx, mj_layer_t layer, const mj_moe_options *opts, mj_moe_t *out);

typedef struct mj_moe_prepare_options {
    uint32_t struct_size;      /* sizeof(mj_moe_prepare_options): MJ_MOE_PREPARE_OPTIONS_INIT */
    int32_t max_batch;         /* forwards of 1..max_batch tokens (when batches is NULL)      */
    const int32_t *batches;    /* or exactly these batch sizes (e.g. an engine's CUDA-graph
                                  buckets), n_batches of them                                */
    int32_t n_batches;
    const char *k0_policy;     /* OEA's k0 by batch size ("4", "1-3:8,4-:4"); NULL: plain
                                  top-k. Above 256 tokens k0 must be top-k                   */
    mj_weight_mode mode;       /* MJ_MODE_W4A16, MJ_MODE_W4A4 or MJ_MODE_AUTO (the policy)    */
} mj_moe_prepare_options;
#define MJ_MOE_PREPARE_OPTIONS_INIT {sizeof(mj_moe_prepare_options), 256, NULL, 0, NULL, MJ_MODE_AUTO}

/* Compile (or load from the cache) every kernel forwards of those batch sizes launch, and
 * allocate all their workspace. Kernels missing from the cache compile side by side,
 * $MOEJIT_COMPILE_THREADS at a time (1..256; else one per CPU the process may run on). Afterwards a forward of a prepared batch size allocates
 * nothing, waits for nothing and compiles nothing: it can be captured in a CUDA graph. A
 * context in strict mode turns any kernel missing from the cache into MJ_ERR_CACHE_MISS
 * here (prewarm with `moejit prewarm --config`). Preparing again replaces the set (and may
 * move the workspace: capture graphs after the last prepare). */
MJ_API mj_status mj_moe_prepare(mj_moe_t moe, const mj_moe_prepare_options *opts);

/* out [B, H] f32 = this layer applied to hidden [B, H] bf16 (device pointers; host pointers
 * on the interpreter), identical on every rank: the router GEMM, routing with the prepared
 * k0, this rank's experts, then the all-reduce over the communicator. Rows at and past
 * *num_valid (a device int32 read when the kernels run; NULL: all B) are padding and come
 * out 0. B must be a prepared batch size. Enqueued on `stream` (a CUstream); on the
 * interpreter it has run when the call returns. */
MJ_API mj_status mj_moe_forward(mj_moe_t moe, const uint16_t *hidden, int32_t B, const int32_t *num_valid,
                                float *out, void *stream);

/* What a prepared batch size B runs with: its k0 and its resolved weight mode. */
MJ_API mj_status mj_moe_batch_plan(mj_moe_t moe, int32_t B, int32_t *k0, mj_weight_mode *mode);

/* The routing of the last forward, in the handle's workspace (device pointers; valid until
 * the next forward or prepare): ids, weights, n_sel, the dispatch metadata. */
MJ_API mj_status mj_moe_route_outputs(mj_moe_t moe, mj_route_outputs *out);

MJ_API mj_status mj_moe_free(mj_moe_t moe);

#ifdef __cplusplus
}
#endif
#endif /* MOEJIT_H */
