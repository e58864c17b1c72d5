/* layer.c — the CPU reference forward of an MoE layer, the oracle every kernel is tested
 * against (the layer's weights, their allocation and their split across ranks live in
 * runtime/weights/layer.c).
 *
 * The forward is the layer's data flow written as plainly as possible:
 *
 *   hidden [B,H] bf16 -> router GEMM -> route (OEA, k0) -> for each expert held here:
 *   gather its tokens, y = w2 . (silu(gate . x) * (up . x)) -> combine in slot order
 *   (fp32) -> + shared expert (weight 1, or with a gated one (Qwen2-MoE, Qwen3-Next) the
 *   token's sigmoid(x . shared_expert_gate): the dot product of the bf16 values summed in
 *   float in index order, then 1 / (1 + expf(-dot))).
 *
 * The GEMMs accumulate in fp64 over exact products. An NVFP4 weight is e2m1 * e4m3 (at most
 * 5 significant bits, exact in any float), so I dequantize it "unit" (without
 * weight_scale_2), sum the dot product in double, and apply the per-tensor scale to the sum:
 * weight_scale_2 for W4A16, input_scale * weight_scale_2 (alpha) for W4A4, where the
 * activations are also NVFP4 (e2m1 * e4m3 unit values). This is what the kernels will do:
 * the MMA multiplies unit values, the epilogue applies the scale.
 *
 * A rank's handle holds a slice (weights/layer.c): its partial output is exact on the slice
 * and the ranks' partials sum to the whole.
 */
#include "ref/ref.h"
#include "weights/layer.h"

#include <math.h>
#include <stdlib.h>

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

/* A token's shared-expert weight under a sigmoid gate [H] bf16: the sum in float, in index order. */
static float shared_gate_weight(const uint16_t *gate, const uint16_t *x, int64_t H) {
    float dot = 0.0f;
    for (int64_t h = 0; h < H; h++) dot += mj_bf16_to_f32(x[h]) * mj_bf16_to_f32(gate[h]);
    return 1.0f / (1.0f + expf(-dot));
}

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
     * the shared expert, times its gate's weight where it has one. Padding rows stay 0. */
    for (int64_t b = 0; b < B; b++) {
        const float sw = L->has_shared && L->shared_gate && b < num_valid
                             ? shared_gate_weight(L->shared_gate, hidden + b * H, H)
                             : 1.0f;
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            if (b < num_valid) {
                for (int64_t j = 0; j < nsel[b]; j++) acc += wts[b * K + j] * slot_out[(b * K + j) * H + h];
                acc += sw * shared_out[b * H + h];
            }
            out[b * H + h] = acc;
        }
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


/* ---- calibration ------------------------------------------------------------------------ */

/* input_scale = amax(input) / (6*448) for every linear of L, over n_tok calibration tokens
 * calib [n_tok, H] whose amax is x_amax, as ModelOpt calibrates on data. w2's input is the
 * expert's SwiGLU activation of those tokens (with weight_scale_2, as W4A16 computes it). */
mj_status mj_layer_calibrate_ref(mj_layer_t L, const float *calib, int32_t n_tok, float x_amax) {
    const int64_t H = L->cfg.hidden;
    int64_t i_max = L->i_local > L->is_local ? L->i_local : L->is_local;
    mlp_scratch s = {0};
    MJ_CHECK(scratch_alloc(&s, H, i_max));
    for (int32_t e = 0; e <= L->n_local; e++) {
        mj_nvfp4_linear *w13 = e < L->n_local ? &L->w13[e] : &L->shared_w13;
        mj_nvfp4_linear *w2 = e < L->n_local ? &L->w2[e] : &L->shared_w2;
        if (e == L->n_local && !L->has_shared) break;
        const int64_t I = w2->k_in;
        w13->input_scale = x_amax / (6.0f * 448.0f);
        load_expert(&s, w13, w2);
        float amax = 0.0f;
        for (int32_t t = 0; t < n_tok; t++) {
            gemv(s.u13, calib + t * H, 2 * I, H, w13->weight_scale_2, s.h13);
            for (int64_t i = 0; i < I; i++) {
                float a = fabsf(silu(s.h13[i]) * s.h13[I + i]);
                if (a > amax) amax = a;
            }
        }
        w2->input_scale = (amax > 0.0f ? amax : 1.0f) / (6.0f * 448.0f);
    }
    scratch_free(&s);
    return MJ_OK;
}
