/* plan.h — the planner: every kernel specialization a MoE layer's forwards will launch, for
 * a model config, a split (TP/EP over n ranks), a set of batch sizes, a k0 policy and a mode
 * policy. mj_moe_prepare compiles this set and `moejit prewarm --config` fills the cache
 * with it: one function serves both, so a prewarmed cache is exactly what prepare asks for.
 * Not public. */
#ifndef MJ_PLAN_H
#define MJ_PLAN_H

#include "experts.h"

typedef struct mj_plan_request {
    const mj_moe_config *cfg;
    mj_parallel par;              /* MJ_PAR_NONE (n_ranks 1), MJ_PAR_TP or MJ_PAR_EP        */
    int32_t n_ranks;
    int32_t rank;                 /* this rank's kernels; -1: every rank's (prewarm)        */
    const int32_t *batches;       /* the batch sizes forwards will take, each >= 1          */
    int32_t n_batches;
    const mj_k0_policy *k0;       /* NULL: k0 = top-k (plain top-k)                         */
    mj_weight_mode mode;          /* MJ_MODE_W4A16, MJ_MODE_W4A4 or MJ_MODE_AUTO (modes)    */
    const mj_mode_policy *modes;  /* for MJ_MODE_AUTO                                       */
    int32_t shared;               /* 1: the shared expert runs in the experts' kernels      */
} mj_plan_request;

typedef struct mj_plan_entry {
    mj_spec spec;
    const char *what;             /* "router GEMM", "routing", "experts"                     */
    int32_t b_lo, b_hi;           /* the smallest and largest batch size that launches it   */
} mj_plan_entry;

typedef struct mj_plan {
    int32_t n;
    mj_plan_entry *e;             /* distinct specializations, in first-use order            */
} mj_plan;

/* Whether a layer of cfg (its shared expert `shared_rows` wide, 0 without one) splits over
 * n_ranks ranks of kind: TP slices every expert's intermediate rows, which the expert kernels
 * take in multiples of MJ_DIM_ALIGN (their K-step); EP deals whole experts. The refusal names
 * the rank counts that do work for this model, TP and EP. (MJ_ERR_CONFIG; the one rule of
 * mj_layer_shard, mj_layer_load and the planner.) */
mj_status mj_split_check(const mj_moe_config *cfg, int64_t shared_rows, mj_parallel kind, int32_t n_ranks);

/* The shapes rank `rank` of a split holds: its slice of one expert's intermediate rows and
 * the shared sub-experts it runs (0 without a shared expert, or on EP ranks but 0). Checks
 * that the split is possible, with mj_layer_shard's rules. */
mj_status mj_plan_rank_shape(const mj_moe_config *cfg, mj_parallel par, int32_t rank, int32_t n_ranks,
                             int32_t shared, int32_t *i_local, int32_t *nsub);

/* The specialization set for ctx's target and backend. Errors name the batch size and the
 * rule at fault (a k0 < top-k above the one-block routing limit, a mode the target lacks). */
mj_status mj_plan_build(mj_context_t ctx, const mj_plan_request *r, mj_plan *out);
void mj_plan_free(mj_plan *p);
/* Every specialization of p built or loaded in ctx, side by side (mj_jit_get_many's pool of
 * compile threads): what mj_moe_prepare does, and bench times cold. `who` prefixes an error. */
mj_status mj_plan_get_all(mj_context_t ctx, const mj_plan *p, const char *who);

/* The knob choices of the launchers (runtime/route.c), as functions of the shapes. */
mj_status mj_route_knobs(const mj_route_params *p, int32_t B, mj_knobs_oea_route *kn);
/* The dispatch alone (the route kernel with logits NULL, one block): the dispatch metadata
 * of ids [B, k] already in memory (-1: none), over E experts (8..1024, k <= E); its knobs
 * depend on E and k only. Writes expert_counts, expert_offsets, active_experts, n_active,
 * permutation and row_index of out (all needed). */
mj_status mj_route_dispatch_knobs(int32_t E, int32_t k, mj_knobs_oea_route *kn);
mj_status mj_route_dispatch(mj_context_t ctx, const int32_t *ids, int32_t B, int32_t k, int32_t E,
                            const mj_route_outputs *out, void *stream);
/* The warps of a route launch of kn that take part in its dispatch (templates/oea_route.cu's
 * DWARPS): at most MJ_ROUTE_DISPATCH_WARPS up to 256 experts, else every warp. */
#define MJ_ROUTE_DISPATCH_WARPS 8
int32_t mj_route_dispatch_warps(const mj_knobs_oea_route *kn);
/* The dynamic shared memory of a route launch of kn: the warps' score rows, and with B > 0
 * (the one-block launch) the B x K ids, bytes. */
int64_t mj_route_dyn_smem(const mj_knobs_oea_route *kn, int32_t B);
void mj_router_knobs(int32_t H, int32_t E, int32_t B, mj_knobs_router_gemm *kn);
/* A router GEMM launch of B rows with kn: 16-expert tiles (gridDim.x), parts of H (KS,
 * gridDim.y) of rpz runs of MJ_ROUTER_RUN k each (the last part may be shorter), row tiles
 * (gridDim.z), and the workspace it uses (0 bytes at KS 1). */
#define MJ_ROUTER_RUN 128 /* k a warp's run covers: templates/router_gemm.cu's KCH chunks of 32 */
typedef struct mj_router_dims {
    int32_t et, ks, rpz, rt;
    size_t part_bytes, count_bytes;
} mj_router_dims;
void mj_router_grid(const mj_knobs_router_gemm *kn, int32_t B, mj_router_dims *d);

/* Batch sizes from text: "1-256", "1,2,4,8" or a mix ("1-8,16,32"), ascending and
 * distinct, into a malloc'd array. */
mj_status mj_batches_parse(const char *text, int32_t **out, int32_t *n);

#endif /* MJ_PLAN_H */
