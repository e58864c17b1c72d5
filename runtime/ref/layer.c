/* layer.c — an MoE layer's weights on the host, how they split across ranks, and the CPU
 * reference forward that every kernel is tested against.
 *
 * The forward is the layer's data flow written as plainly as possible:
 *
 *   hidden [B,H] bf16 -> router GEMM -> route (OEA, k0) -> for each expert held here:
 *   gather its tokens, y = w2 . (silu(gate . x) * (up . x)) -> combine in slot order
 *   (fp32) -> + shared expert (weight 1).
 *
 * The GEMMs accumulate in fp64 over exact products. An NVFP4 weight is e2m1 * e4m3 (at most
 * 5 significant bits, exact in any float), so I dequantize it "unit" (without
 * weight_scale_2), sum the dot product in double, and apply the per-tensor scale to the sum:
 * weight_scale_2 for W4A16, input_scale * weight_scale_2 (alpha) for W4A4, where the
 * activations are also NVFP4 (e2m1 * e4m3 unit values). This is what the kernels will do:
 * the MMA multiplies unit values, the epilogue applies the scale.
 *
 * Splits: TP = n gives rank r the intermediate rows [r*I/n, (r+1)*I/n) of every expert's
 * gate and up and the same columns of down; SwiGLU is per intermediate row, so each rank's
 * partial output is exact on its slice and the partials sum to the whole. EP = n gives rank r
 * experts [r*E/n, (r+1)*E/n) and rank 0 the shared expert. Every rank routes all tokens
 * (the router is replicated), so all ranks agree on the routing.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>

/* ---- allocation of linears ------------------------------------------------------------ */

static mj_status linear_alloc(mj_nvfp4_linear *l, int32_t n_out, int32_t k_in) {
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

static void linear_free(mj_nvfp4_linear *l) {
    free(l->weight);
    free(l->weight_scale);
    l->weight = l->weight_scale = NULL;
}

mj_status mj_layer_free(mj_layer_t L) {
    if (!L) return MJ_OK;
    for (int32_t e = 0; L->w13 && e < L->n_local; e++) linear_free(&L->w13[e]);
    for (int32_t e = 0; L->w2 && e < L->n_local; e++) linear_free(&L->w2[e]);
    free(L->w13);
    free(L->w2);
    linear_free(&L->shared_w13);
    linear_free(&L->shared_w2);
    free(L->gate);
    free(L->bias);
    free(L);
    return MJ_OK;
}

/* A layer handle with its router and per-expert arrays allocated (linears not yet). */
static mj_status layer_new(const mj_moe_config *cfg, int32_t n_local, mj_layer_t *out) {
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

/* ---- dense math helpers ---------------------------------------------------------------- */

/* Unit dequantization: u[n,k] = e2m1(code) * e4m3(scale), without weight_scale_2. */
static void dequant_unit(const uint8_t *q, const uint8_t *sf, int64_t n, int64_t k, float *u) {
    float e2m1[16];
    for (int i = 0; i < 16; i++) e2m1[i] = mj_e2m1_decode((uint8_t)i);
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < k / 16; b++) {
            const float scale = mj_e4m3_decode(sf[r * (k / 16) + b]);
            const uint8_t *bytes = q + r * (k / 2) + b * 8;
            float *out = u + r * k + b * 16;
            for (int j = 0; j < 8; j++) {
                out[2 * j] = e2m1[bytes[j] & 0xF] * scale;
                out[2 * j + 1] = e2m1[bytes[j] >> 4] * scale;
            }
        }
}

/* y[r] = scale * sum_c a[c] * W[r, c], the sum in double. */
static void gemv(const float *W, const float *a, int64_t n, int64_t k, float scale, float *y) {
    for (int64_t r = 0; r < n; r++) {
        double acc = 0.0;
        const float *w = W + r * k;
        for (int64_t c = 0; c < k; c++) acc += (double)a[c] * (double)w[c];
        y[r] = (float)acc * scale;
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* The activations a linear sees: W4A16 keeps them; W4A4 replaces them by their NVFP4 unit
 * values (e2m1 * e4m3 under gs = 1/input_scale) and returns the scale to apply. */
static mj_status prepare_input(mj_weight_mode mode, const mj_nvfp4_linear *l, const float *x,
                               int64_t k, const char *name, float *xin, uint8_t *qbuf,
                               uint8_t *sfbuf, float *scale) {
    if (mode == MJ_MODE_W4A16) {
        memcpy(xin, x, (size_t)k * sizeof *xin);
        *scale = l->weight_scale_2;
        return MJ_OK;
    }
    MJ_CHECK(mj_nvfp4_quantize_act(x, 1, k, l->input_scale, name, qbuf, sfbuf));
    dequant_unit(qbuf, sfbuf, 1, k, xin);
    *scale = l->input_scale * l->weight_scale_2;
    return MJ_OK;
}

/* Scratch for one expert MLP evaluation. */
typedef struct mlp_scratch {
    float *u13, *u2;   /* unit-dequantized w13 [2I, H], w2 [H, I] of the current expert   */
    float *xin;        /* [max(H, I)] the input as the GEMM sees it                       */
    float *h13;        /* [2I] gate ; up                                                  */
    float *act;        /* [I]                                                             */
    uint8_t *q, *sf;   /* [max(H,I)/2], [max(H,I)/16] activation quantization             */
} mlp_scratch;

static void scratch_free(mlp_scratch *s) {
    free(s->u13), free(s->u2), free(s->xin), free(s->h13), free(s->act), free(s->q), free(s->sf);
}

static mj_status scratch_alloc(mlp_scratch *s, int64_t H, int64_t I) {
    int64_t m = H > I ? H : I;
    s->u13 = malloc((size_t)(2 * I * H) * sizeof(float));
    s->u2 = malloc((size_t)(H * I) * sizeof(float));
    s->xin = malloc((size_t)m * sizeof(float));
    s->h13 = malloc((size_t)(2 * I) * sizeof(float));
    s->act = malloc((size_t)(I ? I : 1) * sizeof(float));
    s->q = malloc((size_t)(m / 2));
    s->sf = malloc((size_t)(m / 16));
    if (!s->u13 || !s->u2 || !s->xin || !s->h13 || !s->act || !s->q || !s->sf) {
        scratch_free(s);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory for expert scratch (H=%lld, I=%lld)",
                            (long long)H, (long long)I);
    }
    return MJ_OK;
}

/* y [H] = down(silu(gate . x) * (up . x)) for one token, with s->u13 / s->u2 loaded. */
static mj_status mlp_token(mj_weight_mode mode, const mj_nvfp4_linear *w13,
                           const mj_nvfp4_linear *w2, mlp_scratch *s, const float *x, float *y) {
    int64_t H = w13->k_in, I = w2->k_in;
    float scale;
    MJ_CHECK(prepare_input(mode, w13, x, H, "hidden", s->xin, s->q, s->sf, &scale));
    gemv(s->u13, s->xin, 2 * I, H, scale, s->h13);
    for (int64_t i = 0; i < I; i++) s->act[i] = silu(s->h13[i]) * s->h13[I + i];
    /* W4A16 hands the down projection bf16 activations, as the kernels (and every bf16
     * serving stack) keep them between the two GEMMs. */
    if (mode == MJ_MODE_W4A16)
        for (int64_t i = 0; i < I; i++) s->act[i] = mj_bf16_to_f32(mj_f32_to_bf16(s->act[i]));
    MJ_CHECK(prepare_input(mode, w2, s->act, I, "expert activation", s->xin, s->q, s->sf, &scale));
    gemv(s->u2, s->xin, H, I, scale, y);
    return MJ_OK;
}

static void load_expert(mlp_scratch *s, const mj_nvfp4_linear *w13, const mj_nvfp4_linear *w2) {
    dequant_unit(w13->weight, w13->weight_scale, w13->n_out, w13->k_in, s->u13);
    dequant_unit(w2->weight, w2->weight_scale, w2->n_out, w2->k_in, s->u2);
}

/* ---- the forward ------------------------------------------------------------------------ */

mj_status mj_router_ref(mj_layer_t L, const uint16_t *hidden, int32_t B, float *logits) {
    if (!L || (B > 0 && (!hidden || !logits)) || B < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_router_ref: NULL layer/hidden/logits or B < 0");
    const int64_t H = L->cfg.hidden, E = L->cfg.n_experts;
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0.0;
            for (int64_t h = 0; h < H; h++)
                acc += (double)mj_bf16_to_f32(hidden[b * H + h]) *
                       (double)mj_bf16_to_f32(L->gate[e * H + h]);
            logits[b * E + e] = (float)acc;
        }
    return MJ_OK;
}

/* The experts' part of the forward: what one rank's expert kernels compute from a routing. */
mj_status mj_experts_ref(mj_layer_t L, mj_weight_mode mode, const uint16_t *hidden, int32_t B, int32_t num_valid,
                         const int32_t *ids, const float *wts, const int32_t *nsel, float *out) {
    if (!L || B < 0 || (B > 0 && (!hidden || !out || !ids || !wts || !nsel)) || num_valid < 0 || num_valid > B)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_ref: bad arguments (B=%d, num_valid=%d)", B, num_valid);
    if (mode != MJ_MODE_W4A16 && mode != MJ_MODE_W4A4)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_ref: unknown weight mode %d", (int)mode);
    const mj_moe_config *cfg = &L->cfg;
    const int64_t H = cfg->hidden, K = cfg->topk;
    mj_status st = MJ_OK;
    float *x = malloc((size_t)H * sizeof(float));
    float *slot_out = malloc((size_t)((B ? B : 1) * K * H) * sizeof(float)); /* [B, k, H] */
    float *shared_out = malloc((size_t)((B ? B : 1) * H) * sizeof(float));    /* [B, H]    */
    mlp_scratch s = {0};
    int64_t i_max = L->i_local > L->is_local ? L->i_local : L->is_local;
    if (!x || !slot_out || !shared_out) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory in mj_experts_ref (B=%d)", B);
        goto exit;
    }
    MJ_CHECK_GOTO(scratch_alloc(&s, H, i_max), st, exit);
    memset(slot_out, 0, (size_t)(B * K * H) * sizeof(float));
    memset(shared_out, 0, (size_t)(B * H) * sizeof(float));

    /* Experts held here, one at a time: dequantize once, run every token routed to it. */
    for (int32_t le = 0; le < L->n_local; le++) {
        int32_t e = L->expert_begin + le;
        int loaded = 0;
        for (int64_t b = 0; b < num_valid; b++)
            for (int64_t j = 0; j < nsel[b]; j++) {
                if (ids[b * K + j] != e) continue;
                if (!loaded) load_expert(&s, &L->w13[le], &L->w2[le]), loaded = 1;
                for (int64_t h = 0; h < H; h++) x[h] = mj_bf16_to_f32(hidden[b * H + h]);
                MJ_CHECK_GOTO(mlp_token(mode, &L->w13[le], &L->w2[le], &s, x, slot_out + (b * K + j) * H), st, exit);
            }
    }
    if (L->has_shared) {
        load_expert(&s, &L->shared_w13, &L->shared_w2);
        for (int64_t b = 0; b < num_valid; b++) {
            for (int64_t h = 0; h < H; h++) x[h] = mj_bf16_to_f32(hidden[b * H + h]);
            MJ_CHECK_GOTO(mlp_token(mode, &L->shared_w13, &L->shared_w2, &s, x, shared_out + b * H), st, exit);
        }
    }
    /* Combine in a fixed order: slot 0..n_sel-1 (experts not held here contributed 0), then
     * the shared expert. Padding rows stay 0. */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            if (b < num_valid) {
                for (int64_t j = 0; j < nsel[b]; j++) acc += wts[b * K + j] * slot_out[(b * K + j) * H + h];
                acc += shared_out[b * H + h];
            }
            out[b * H + h] = acc;
        }
exit:
    scratch_free(&s);
    free(x), free(slot_out), free(shared_out);
    return st;
}

mj_status mj_moe_forward_ref(mj_layer_t L, mj_weight_mode mode, const uint16_t *hidden,
                             int32_t B, int32_t num_valid, int32_t k0, float *out,
                             mj_route_stats *stats) {
    if (!L || B < 0 || (B > 0 && (!hidden || !out)))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_forward_ref: NULL layer/hidden/out or B < 0 (B=%d)", B);
    if (mode != MJ_MODE_W4A16 && mode != MJ_MODE_W4A4)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_forward_ref: unknown weight mode %d",
                            (int)mode);
    if (num_valid < 0 || num_valid > B)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_forward_ref: num_valid %d must be in 0..B (B=%d)", num_valid, B);
    const mj_moe_config *cfg = &L->cfg;
    const int64_t E = cfg->n_experts, K = cfg->topk;
    mj_route_params rp;
    MJ_CHECK(mj_route_params_from_config(cfg, &rp));
    rp.k0 = k0 == 0 ? cfg->topk : k0;
    if (rp.k0 < 1 || rp.k0 > cfg->topk)
        return mj_set_error(MJ_ERR_INVALID_ARG, "k0 %d must be in 1..top-k (%d), or 0 for top-k",
                            k0, cfg->topk);
    mj_status st = MJ_OK;
    float *logits = malloc((size_t)((B ? B : 1) * E) * sizeof(float));
    int32_t *ids = malloc((size_t)((B ? B : 1) * K) * sizeof(int32_t));
    float *wts = malloc((size_t)((B ? B : 1) * K) * sizeof(float));
    int32_t *nsel = malloc((size_t)(B ? B : 1) * sizeof(int32_t));
    if (!logits || !ids || !wts || !nsel) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory in mj_moe_forward_ref (B=%d)", B);
        goto exit;
    }
    MJ_CHECK_GOTO(mj_router_ref(L, hidden, B, logits), st, exit);
    MJ_CHECK_GOTO(mj_route_ref(&rp, logits, L->bias, B, num_valid, ids, wts, nsel, stats), st, exit);
    st = mj_experts_ref(L, mode, hidden, B, num_valid, ids, wts, nsel, out);
exit:
    free(logits), free(ids), free(wts), free(nsel);
    return st;
}

/* ---- random layers ---------------------------------------------------------------------- */

/* Quantize a random normal matrix (std `std`) into l. */
static mj_status random_linear(mj_nvfp4_linear *l, int32_t n_out, int32_t k_in, double std,
                               uint64_t *rng, float *tmp, const char *name) {
    MJ_CHECK(linear_alloc(l, n_out, k_in));
    for (int64_t i = 0; i < (int64_t)n_out * k_in; i += 2) { /* k_in is even */
        double a, b;
        mj_rng_normal2(rng, &a, &b);
        tmp[i] = (float)(a * std);
        tmp[i + 1] = (float)(b * std);
    }
    return mj_nvfp4_quantize(tmp, n_out, k_in, name, l->weight, l->weight_scale, &l->weight_scale_2);
}

/* Calibration: input_scale = amax(input) / (6*448), over a few random tokens, as ModelOpt
 * calibrates on data. w2's input is the expert's SwiGLU activation of those tokens. */
#define MJ_CALIB_TOKENS 8
static mj_status calibrate(mj_nvfp4_linear *w13, mj_nvfp4_linear *w2, const float *calib,
                           float x_amax, mlp_scratch *s) {
    int64_t H = w13->k_in, I = w2->k_in;
    w13->input_scale = x_amax / (6.0f * 448.0f);
    load_expert(s, w13, w2);
    float amax = 0.0f;
    for (int t = 0; t < MJ_CALIB_TOKENS; t++) {
        gemv(s->u13, calib + t * H, 2 * I, H, w13->weight_scale_2, s->h13);
        for (int64_t i = 0; i < I; i++) {
            float a = fabsf(silu(s->h13[i]) * s->h13[I + i]);
            if (a > amax) amax = a;
        }
    }
    w2->input_scale = (amax > 0.0f ? amax : 1.0f) / (6.0f * 448.0f);
    return MJ_OK;
}

mj_status mj_layer_create_random(const mj_moe_config *cfg, uint64_t seed, mj_layer_t *out) {
    if (!cfg || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_create_random: NULL argument");
    MJ_CHECK(mj_moe_config_validate(cfg, 1));
    const int64_t H = cfg->hidden, I = cfg->intermediate, E = cfg->n_experts;
    const int64_t Is = (int64_t)cfg->n_shared * I;
    mj_layer_t L = NULL;
    mj_status st = layer_new(cfg, cfg->n_experts, &L);
    if (st != MJ_OK) return st;
    L->i_local = (int32_t)I;
    L->has_shared = cfg->n_shared > 0;
    L->is_local = (int32_t)Is;

    int64_t i_max = I > Is ? I : Is;
    float *tmp = malloc((size_t)(2 * i_max * H) * sizeof(float));
    float *calib = malloc((size_t)(MJ_CALIB_TOKENS * H) * sizeof(float));
    mlp_scratch s = {0};
    if (!tmp || !calib) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory creating a random layer");
        goto fail;
    }
    MJ_CHECK_GOTO(scratch_alloc(&s, H, i_max), st, fail);
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
        /* ModelOpt gives fused gate/up one weight_scale_2: ours are one tensor already. */
        MJ_CHECK_GOTO(calibrate(&L->w13[e], &L->w2[e], calib, x_amax, &s), st, fail);
    }
    if (L->has_shared) {
        MJ_CHECK_GOTO(random_linear(&L->shared_w13, (int32_t)(2 * Is), (int32_t)H,
                                    1.0 / sqrt((double)H), &rng, tmp, "shared w13"), st, fail);
        MJ_CHECK_GOTO(random_linear(&L->shared_w2, (int32_t)H, (int32_t)Is, 1.0 / sqrt((double)Is),
                                    &rng, tmp, "shared w2"), st, fail);
        MJ_CHECK_GOTO(calibrate(&L->shared_w13, &L->shared_w2, calib, x_amax, &s), st, fail);
    }
    *out = L;
    L = NULL;
fail:
    scratch_free(&s);
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
    MJ_CHECK(linear_alloc(dst, 2 * n, src->k_in));
    copy_rows(src, c0, n, dst, 0);
    copy_rows(src, I + c0, n, dst, n);
    dst->weight_scale_2 = src->weight_scale_2;
    dst->input_scale = src->input_scale;
    return MJ_OK;
}

/* w2 slice: columns [c0, c0+n) of a [H, I] linear (c0, n multiples of 16: whole blocks). */
static mj_status slice_w2(const mj_nvfp4_linear *src, int32_t c0, int32_t n, mj_nvfp4_linear *dst) {
    MJ_CHECK(linear_alloc(dst, src->n_out, n));
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
    MJ_CHECK(linear_alloc(dst, src->n_out, src->k_in));
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
    if (kind == MJ_PAR_TP &&
        (I % n_ranks || (I / n_ranks) % MJ_DIM_ALIGN || Is % n_ranks || (Is / n_ranks) % MJ_DIM_ALIGN))
        return mj_set_error(MJ_ERR_CONFIG,
                            "TP=%d: moe_intermediate_size %d (shared %d) must split into slices "
                            "that are multiples of %d (the FP4 MMA K-step); use fewer ranks or EP",
                            n_ranks, I, Is, MJ_DIM_ALIGN);
    if (kind == MJ_PAR_EP && E % n_ranks)
        return mj_set_error(MJ_ERR_CONFIG,
                            "EP=%d: n_routed_experts %d is not divisible by the rank count", n_ranks, E);

    int32_t n_local = kind == MJ_PAR_EP ? E / n_ranks : E;
    mj_layer_t L = NULL;
    MJ_CHECK(layer_new(cfg, n_local, &L));
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
    *out = L;
    return MJ_OK;
fail:
    mj_layer_free(L);
    return st;
}
