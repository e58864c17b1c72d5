/* layer.h — an MoE layer's weights on the host (the handle mj_layer_t of moejit.h): what one
 * rank holds of it, how linears and handles are allocated and freed. Built here
 * (weights/layer.c: random layers and splits; weights/checkpoint.c: from a checkpoint), read
 * by the CPU references (ref/) and by the expert kernels' packing (weights/pack.c). Not
 * installed, not public. */
#ifndef MJ_WEIGHTS_LAYER_H
#define MJ_WEIGHTS_LAYER_H

#include "base.h"

struct mj_layer {
    mj_moe_config cfg;       /* the model's (unsplit) config                               */
    mj_parallel par;         /* how this handle was sliced (MJ_PAR_NONE: the whole layer)  */
    int32_t rank, n_ranks;
    int32_t i_local;         /* intermediate rows of one routed expert held here           */
    int32_t expert_begin;    /* first routed expert held here                              */
    int32_t n_local;         /* routed experts held here                                   */
    uint16_t *gate;          /* [E, H] bf16 router weight (every rank holds all of it)     */
    float *bias;             /* [E] e_score_correction_bias, or NULL                       */
    mj_nvfp4_linear *w13;    /* [n_local]: each [2*i_local, H], rows [gate ; up]           */
    mj_nvfp4_linear *w2;     /* [n_local]: each [H, i_local]                               */
    int32_t has_shared;      /* 1 if this handle holds (its slice of) the shared experts   */
    int32_t is_local;        /* shared intermediate rows held here                         */
    mj_nvfp4_linear shared_w13; /* [2*is_local, H]                                         */
    mj_nvfp4_linear shared_w2;  /* [H, is_local]                                           */
    uint16_t *shared_gate;   /* [H] bf16 shared_expert_gate (cfg.shared_gate): whole wherever
                                has_shared (it scales the whole shared expert, whose slices the
                                ranks sum); NULL otherwise                                 */
};

/* A linear [n_out, k_in] with its weight and block scales allocated (contents undefined)
 * and weight_scale_2 = input_scale = 1. MJ_ERR_NOMEM with the shape; what was allocated is
 * left in l for mj_linear_free. */
mj_status mj_linear_alloc(mj_nvfp4_linear *l, int32_t n_out, int32_t k_in);
void mj_linear_free(mj_nvfp4_linear *l);

/* L->shared_gate allocated ([H] bf16, contents undefined). */
mj_status mj_layer_shared_gate_alloc(mj_layer_t L);

/* A handle for cfg holding n_local routed experts: the router (and bias when the config has
 * one) and the per-expert arrays allocated, every linear empty, one rank of one. */
mj_status mj_layer_new(const mj_moe_config *cfg, int32_t n_local, mj_layer_t *out);

#endif /* MJ_WEIGHTS_LAYER_H */
