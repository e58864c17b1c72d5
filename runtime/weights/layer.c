/* layer.c — an MoE layer's weights on the host: allocation, random layers (weights drawn
 * and quantized, input scales calibrated), and how a layer splits across ranks.
 *
 * Splits: TP = n gives rank r the intermediate rows [r*I/n, (r+1)*I/n) of every expert's
 * gate and up and the same columns of down; SwiGLU is per intermediate row, so each rank's
 * partial output is exact on its slice and the partials sum to the whole. EP = n gives rank r
 * experts [r*E/n, (r+1)*E/n) and rank 0 the shared expert. Every rank routes all tokens
 * (the router is replicated), so all ranks agree on the routing. A shared expert's sigmoid gate
 * (Qwen2-MoE, Qwen3-Next) goes whole with every slice of the shared expert: each rank scales its
 * partial shared output by the same sigmoid(x . gate), and the partials sum to the gated whole.
 */
#include "weights/layer.h"
#include "ref/ref.h"
#include "plan.h" /* mj_split_check */
#include "moejit_private.h" /* mj_layer_router, defined here */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocation ------------------------------------------------------------ */

mj_status mj_linear_alloc(mj_nvfp4_linear *l, int32_t n_out, int32_t k_in) {
    l->n_out = n_out;
    l->k_in = k_in;
    l->weight = malloc((size_t)n_out * (size_t)(k_in / 2));
    l->weight_scale = malloc((size_t)n_out * (size_t)(k_in / MJ_NVFP4_GROUP));
    l->weight_scale_2 = 1.0f;
    l->input_scale = 1.0f;
    if (!l->weight || !l->weight_scale)
        return mj_set_error(MJ_ERR_NOMEM, "out of memory allocating an NVFP4 linear [%d, %d]",
                            n_out, k_in);
    return MJ_OK;
}

void mj_linear_free(mj_nvfp4_linear *l) {
    free(l->weight);
    free(l->weight_scale);
    l->weight = l->weight_scale = NULL;
}

mj_status mj_layer_free(mj_layer_t L) {
    if (!L) return MJ_OK;
    for (int32_t e = 0; L->w13 && e < L->n_local; e++) mj_linear_free(&L->w13[e]);
    for (int32_t e = 0; L->w2 && e < L->n_local; e++) mj_linear_free(&L->w2[e]);
    free(L->w13);
    free(L->w2);
    mj_linear_free(&L->shared_w13);
    mj_linear_free(&L->shared_w2);
    free(L->gate);
    free(L->bias);
    free(L->shared_gate);
    free(L);
    return MJ_OK;
}

mj_status mj_layer_shared_gate_alloc(mj_layer_t L) {
    free(L->shared_gate);
    L->shared_gate = malloc((size_t)L->cfg.hidden * sizeof *L->shared_gate);
    if (!L->shared_gate)
        return mj_set_error(MJ_ERR_NOMEM, "out of memory allocating the shared expert's gate (H=%d)", L->cfg.hidden);
    return MJ_OK;
}

mj_status mj_layer_router(mj_layer_t L, const uint16_t **gate, const float **bias) {
    if (!L || !gate || !bias) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_router: a NULL argument");
    *gate = L->gate;
    *bias = L->bias;
    return MJ_OK;
}

mj_status mj_layer_new(const mj_moe_config *cfg, int32_t n_local, mj_layer_t *out) {
    mj_layer_t L = calloc(1, sizeof *L);
    if (!L) return mj_set_error(MJ_ERR_NOMEM, "out of memory allocating a layer");
    L->cfg = *cfg;
    L->n_local = n_local;
    L->n_ranks = 1;
    size_t eh = (size_t)cfg->n_experts * (size_t)cfg->hidden;
    L->gate = malloc(eh * sizeof *L->gate);
    L->bias = cfg->has_correction_bias ? malloc((size_t)cfg->n_experts * sizeof(float)) : NULL;
    L->w13 = calloc((size_t)(n_local ? n_local : 1), sizeof *L->w13);
    L->w2 = calloc((size_t)(n_local ? n_local : 1), sizeof *L->w2);
    if (!L->gate || (cfg->has_correction_bias && !L->bias) || !L->w13 || !L->w2) {
        mj_layer_free(L);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory allocating a layer (E=%d, H=%d)",
                            cfg->n_experts, cfg->hidden);
    }
    *out = L;
    return MJ_OK;
}

/* ---- random layers ---------------------------------------------------------------------- */

/* Quantize a random normal matrix (std `std`) into l. */
static mj_status random_linear(mj_nvfp4_linear *l, int32_t n_out, int32_t k_in, double std,
                               uint64_t *rng, float *tmp, const char *name) {
    MJ_CHECK(mj_linear_alloc(l, n_out, k_in));
    for (int64_t i = 0; i < (int64_t)n_out * k_in; i += 2) { /* k_in is even */
        double a, b;
        mj_rng_normal2(rng, &a, &b);
        tmp[i] = (float)(a * std);
        tmp[i + 1] = (float)(b * std);
    }
    return mj_nvfp4_quantize(tmp, n_out, k_in, name, l->weight, l->weight_scale, &l->weight_scale_2);
}

/* Calibration tokens (mj_layer_calibrate_ref). */
#define MJ_CALIB_TOKENS 8

mj_status mj_layer_create_random(const mj_moe_config *cfg, uint64_t seed, mj_layer_t *out) {
    if (!cfg || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_create_random: NULL argument");
    MJ_CHECK(mj_moe_config_validate(cfg, 1));
    const int64_t H = cfg->hidden, I = cfg->intermediate, E = cfg->n_experts;
    const int64_t Is = (int64_t)cfg->n_shared * I;
    mj_layer_t L = NULL;
    mj_status st = mj_layer_new(cfg, cfg->n_experts, &L);
    if (st != MJ_OK) return st;
    L->i_local = (int32_t)I;
    L->has_shared = cfg->n_shared > 0;
    L->is_local = (int32_t)Is;

    int64_t i_max = I > Is ? I : Is;
    float *tmp = malloc((size_t)(2 * i_max * H) * sizeof(float));
    float *calib = malloc((size_t)(MJ_CALIB_TOKENS * H) * sizeof(float));
    if (!tmp || !calib) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory creating a random layer");
        goto fail;
    }
    uint64_t rng = seed;
    /* Router: logits of a unit-normal token have std ~2, so the ranking is far from flat. */
    for (int64_t i = 0; i < E * H; i++)
        L->gate[i] = mj_f32_to_bf16((float)(mj_rng_normal(&rng) * 2.0 / sqrt((double)H)));
    if (L->bias)
        for (int64_t e = 0; e < E; e++) L->bias[e] = (float)(mj_rng_normal(&rng) * 0.05);
    /* Calibration tokens: unit normal, rounded to bf16 as real inputs are. */
    float x_amax = 0.0f;
    for (int64_t i = 0; i < MJ_CALIB_TOKENS * H; i++) {
        calib[i] = mj_bf16_to_f32(mj_f32_to_bf16((float)mj_rng_normal(&rng)));
        if (fabsf(calib[i]) > x_amax) x_amax = fabsf(calib[i]);
    }
    for (int64_t e = 0; e < E; e++) {
        MJ_CHECK_GOTO(random_linear(&L->w13[e], (int32_t)(2 * I), (int32_t)H, 1.0 / sqrt((double)H),
                                    &rng, tmp, "w13"), st, fail);
        MJ_CHECK_GOTO(random_linear(&L->w2[e], (int32_t)H, (int32_t)I, 1.0 / sqrt((double)I), &rng,
                                    tmp, "w2"), st, fail);
    }
    if (L->has_shared) {
        MJ_CHECK_GOTO(random_linear(&L->shared_w13, (int32_t)(2 * Is), (int32_t)H,
                                    1.0 / sqrt((double)H), &rng, tmp, "shared w13"), st, fail);
        MJ_CHECK_GOTO(random_linear(&L->shared_w2, (int32_t)H, (int32_t)Is, 1.0 / sqrt((double)Is),
                                    &rng, tmp, "shared w2"), st, fail);
    }
    if (L->has_shared && cfg->shared_gate) {
        /* x . gate of a unit-normal token has std ~1: sigmoid spread over (0.1, 0.9), so a
         * test sees the gate (an ungated shared expert is off by a factor per token). */
        MJ_CHECK_GOTO(mj_layer_shared_gate_alloc(L), st, fail);
        for (int64_t h = 0; h < H; h++)
            L->shared_gate[h] = mj_f32_to_bf16((float)(mj_rng_normal(&rng) / sqrt((double)H)));
    }
    /* ModelOpt gives fused gate/up one weight_scale_2: ours are one tensor already. */
    MJ_CHECK_GOTO(mj_layer_calibrate_ref(L, calib, MJ_CALIB_TOKENS, x_amax), st, fail);
    *out = L;
    L = NULL;
fail:
    free(tmp);
    free(calib);
    mj_layer_free(L);
    return st;
}

/* ---- sharding ----------------------------------------------------------------------------- */

/* dst = rows [r0, r0+nr) of src (all columns). */
static void copy_rows(const mj_nvfp4_linear *src, int32_t r0, int32_t nr, mj_nvfp4_linear *dst,
                      int32_t dst_r0) {
    size_t qb = (size_t)src->k_in / 2, sb = (size_t)src->k_in / MJ_NVFP4_GROUP;
    memcpy(dst->weight + (size_t)dst_r0 * qb, src->weight + (size_t)r0 * qb, (size_t)nr * qb);
    memcpy(dst->weight_scale + (size_t)dst_r0 * sb, src->weight_scale + (size_t)r0 * sb,
           (size_t)nr * sb);
}

/* w13 slice: gate rows [c0, c0+n) and up rows [I + c0, I + c0 + n) of a [2I, H] linear. */
static mj_status slice_w13(const mj_nvfp4_linear *src, int32_t c0, int32_t n, mj_nvfp4_linear *dst) {
    int32_t I = src->n_out / 2;
    MJ_CHECK(mj_linear_alloc(dst, 2 * n, src->k_in));
    copy_rows(src, c0, n, dst, 0);
    copy_rows(src, I + c0, n, dst, n);
    dst->weight_scale_2 = src->weight_scale_2;
    dst->input_scale = src->input_scale;
    return MJ_OK;
}

/* w2 slice: columns [c0, c0+n) of a [H, I] linear (c0, n multiples of 16: whole blocks). */
static mj_status slice_w2(const mj_nvfp4_linear *src, int32_t c0, int32_t n, mj_nvfp4_linear *dst) {
    MJ_CHECK(mj_linear_alloc(dst, src->n_out, n));
    for (int64_t r = 0; r < src->n_out; r++) {
        memcpy(dst->weight + r * (n / 2), src->weight + r * (src->k_in / 2) + c0 / 2, (size_t)n / 2);
        memcpy(dst->weight_scale + r * (n / 16), src->weight_scale + r * (src->k_in / 16) + c0 / 16,
               (size_t)n / 16);
    }
    dst->weight_scale_2 = src->weight_scale_2;
    dst->input_scale = src->input_scale;
    return MJ_OK;
}

static mj_status copy_linear(const mj_nvfp4_linear *src, mj_nvfp4_linear *dst) {
    MJ_CHECK(mj_linear_alloc(dst, src->n_out, src->k_in));
    copy_rows(src, 0, src->n_out, dst, 0);
    dst->weight_scale_2 = src->weight_scale_2;
    dst->input_scale = src->input_scale;
    return MJ_OK;
}

mj_status mj_layer_shard(mj_layer_t full, mj_parallel kind, int32_t rank, int32_t n_ranks,
                         mj_layer_t *out) {
    if (!full || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_shard: NULL argument");
    if (full->par != MJ_PAR_NONE)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_layer_shard: this layer is already a shard; split the whole layer");
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_shard: rank %d of %d is out of range",
                            rank, n_ranks);
    if (kind != MJ_PAR_TP && kind != MJ_PAR_EP && kind != MJ_PAR_NONE)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_shard: unknown split kind %d", (int)kind);
    if (kind == MJ_PAR_NONE && n_ranks != 1)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_layer_shard: MJ_PAR_NONE is one rank holding all; use TP or EP for %d",
                            n_ranks);
    const mj_moe_config *cfg = &full->cfg;
    const int32_t I = cfg->intermediate, E = cfg->n_experts, Is = full->is_local;
    if (kind != MJ_PAR_NONE) MJ_CHECK(mj_split_check(cfg, (int64_t)Is, kind, n_ranks));

    int32_t n_local = kind == MJ_PAR_EP ? E / n_ranks : E;
    mj_layer_t L = NULL;
    MJ_CHECK(mj_layer_new(cfg, n_local, &L));
    mj_status st = MJ_OK;
    L->par = kind;
    L->rank = rank;
    L->n_ranks = n_ranks;
    memcpy(L->gate, full->gate, (size_t)E * (size_t)cfg->hidden * sizeof *L->gate);
    if (L->bias) memcpy(L->bias, full->bias, (size_t)E * sizeof(float));
    if (kind == MJ_PAR_TP) {
        int32_t il = I / n_ranks, isl = Is / n_ranks;
        L->i_local = il;
        L->expert_begin = 0;
        for (int32_t e = 0; e < n_local; e++) {
            MJ_CHECK_GOTO(slice_w13(&full->w13[e], rank * il, il, &L->w13[e]), st, fail);
            MJ_CHECK_GOTO(slice_w2(&full->w2[e], rank * il, il, &L->w2[e]), st, fail);
        }
        L->has_shared = full->has_shared;
        L->is_local = isl;
        if (L->has_shared) {
            MJ_CHECK_GOTO(slice_w13(&full->shared_w13, rank * isl, isl, &L->shared_w13), st, fail);
            MJ_CHECK_GOTO(slice_w2(&full->shared_w2, rank * isl, isl, &L->shared_w2), st, fail);
        }
    } else {
        L->i_local = I;
        L->expert_begin = kind == MJ_PAR_EP ? rank * n_local : 0;
        for (int32_t e = 0; e < n_local; e++) {
            MJ_CHECK_GOTO(copy_linear(&full->w13[L->expert_begin + e], &L->w13[e]), st, fail);
            MJ_CHECK_GOTO(copy_linear(&full->w2[L->expert_begin + e], &L->w2[e]), st, fail);
        }
        L->has_shared = full->has_shared && rank == 0;
        L->is_local = L->has_shared ? Is : 0;
        if (L->has_shared) {
            MJ_CHECK_GOTO(copy_linear(&full->shared_w13, &L->shared_w13), st, fail);
            MJ_CHECK_GOTO(copy_linear(&full->shared_w2, &L->shared_w2), st, fail);
        }
    }
    if (L->has_shared && full->shared_gate) { /* whole, with every slice of the shared expert */
        MJ_CHECK_GOTO(mj_layer_shared_gate_alloc(L), st, fail);
        memcpy(L->shared_gate, full->shared_gate, (size_t)cfg->hidden * sizeof *L->shared_gate);
    }
    *out = L;
    return MJ_OK;
fail:
    mj_layer_free(L);
    return st;
}
