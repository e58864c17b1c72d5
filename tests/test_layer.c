/* test_layer.c — the CPU reference MoE layer: against an independent naive forward, gate/up
 * order, modes, OEA, padding, determinism, and the TP / EP splits summing to the whole. */
#include "base.h"
#include "test.h"
#include "weights/layer.h"

#include <stdlib.h>
#include <string.h>

/* A small layer with GLM-5's routing rules: TP 8 needs I/8 % 64 == 0, EP 8 needs E % 8. */
static mj_moe_config small_config(void) {
    mj_moe_config c;
    mj_moe_config_glm5(&c);
    c.hidden = 128;
    c.intermediate = 512;
    c.n_experts = 16;
    c.topk = 4;
    return c;
}

static float silu_d(double x) { return (float)(x / (1.0 + exp(-x))); }

/* Naive forward with the public dequantizer, written independently of layer.c: float
 * weights, double dot products. swap_gate_up evaluates the layer as if w13 were [up; gate]. */
static void naive_forward(mj_layer_t L, const uint16_t *hidden, int B, int k0, float *out,
                          int swap_gate_up) {
    const mj_moe_config *c = &L->cfg;
    int H = c->hidden, E = c->n_experts, K = c->topk;
    float *logits = malloc(sizeof(float) * (size_t)(B * E));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * K)), *ns = malloc(sizeof(int32_t) * (size_t)B);
    float *w = malloc(sizeof(float) * (size_t)(B * K));
    for (int b = 0; b < B; b++)
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int h = 0; h < H; h++)
                a += (double)mj_bf16_to_f32(hidden[b * H + h]) * mj_bf16_to_f32(L->gate[e * H + h]);
            logits[b * E + e] = (float)a;
        }
    mj_route_params p;
    mj_route_params_from_config(c, &p);
    p.k0 = k0;
    CHECK_OK(mj_route_ref(&p, logits, L->bias, B, B, ids, w, ns, NULL));
    memset(out, 0, sizeof(float) * (size_t)(B * H));
    for (int b = 0; b < B; b++) {
        for (int j = 0; j <= ns[b]; j++) {
            const mj_nvfp4_linear *w13, *w2;
            double scale;
            if (j < ns[b]) {
                int e = ids[b * K + j];
                w13 = &L->w13[e], w2 = &L->w2[e], scale = w[b * K + j];
            } else {
                w13 = &L->shared_w13, w2 = &L->shared_w2, scale = 1.0;
            }
            int I = w2->k_in;
            float *W13 = malloc(sizeof(float) * (size_t)(2 * I * H)), *W2 = malloc(sizeof(float) * (size_t)(H * I));
            float *act = malloc(sizeof(float) * (size_t)I);
            CHECK_OK(mj_nvfp4_dequantize(w13->weight, w13->weight_scale, w13->weight_scale_2, 2 * I, H, W13));
            CHECK_OK(mj_nvfp4_dequantize(w2->weight, w2->weight_scale, w2->weight_scale_2, H, I, W2));
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                int gr = swap_gate_up ? I + i : i, ur = swap_gate_up ? i : I + i;
                for (int h = 0; h < H; h++) {
                    double x = mj_bf16_to_f32(hidden[b * H + h]);
                    g += x * W13[gr * H + h];
                    u += x * W13[ur * H + h];
                }
                act[i] = mj_bf16_to_f32(mj_f32_to_bf16(silu_d(g) * (float)u)); /* bf16 between GEMMs */
            }
            for (int h = 0; h < H; h++) {
                double y = 0;
                for (int i = 0; i < I; i++) y += (double)act[i] * W2[h * I + i];
                out[b * H + h] += (float)(scale * y);
            }
            free(W13), free(W2), free(act);
        }
    }
    free(logits), free(ids), free(ns), free(w);
}

/* max |a-b| / max |b| */
static double rel_err(const float *a, const float *b, size_t n) {
    double m = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > r) r = fabs(b[i]);
    }
    return r > 0 ? m / r : m;
}

/* The layer the cases share (setup): small_config's, random; a batch of B random tokens; the
 * outputs y, y2, ref and sum, n = B * H floats each. */
enum { B = 12 };
static mj_moe_config cfg;
static mj_layer_t L;
static int H;
static size_t n;
static uint16_t *hidden;
static float *y, *y2, *ref, *sum;

static int setup(void) {
    uint64_t seed = test_seed(20261202);
    cfg = small_config();
    CHECK_OK(mj_layer_create_random(&cfg, seed, &L));
    if (g_fail) return test_finish();
    H = cfg.hidden;
    uint64_t rng = seed + 1;
    hidden = malloc(sizeof(uint16_t) * (size_t)(B * H));
    test_random_hidden(hidden, (size_t)(B * H), &rng);
    n = (size_t)(B * H);
    y = malloc(sizeof(float) * n), y2 = malloc(sizeof(float) * n), ref = malloc(sizeof(float) * n);
    sum = malloc(sizeof(float) * n);
    return 0;
}

static void teardown(void) {
    mj_layer_free(L);
    free(hidden), free(y), free(y2), free(ref), free(sum);
}

static void test_naive(void) {
    /* 1. W4A16 equals the naive forward; swapping gate/up is caught. */
    for (int k0 = cfg.topk; k0 >= 1; k0 -= 3) {
        mj_route_stats st = MJ_ROUTE_STATS_INIT;
        CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, k0, y, &st));
        naive_forward(L, hidden, B, k0, ref, 0);
        double e = rel_err(y, ref, n);
        /* Both round the SwiGLU output to bf16; where the two sums differ in the last float
         * bit an element can round the other way (one bf16 ulp, 2^-8): a few in 10^4. */
        CHECK(e < 2e-4, "k0=%d: forward vs naive rel err %.3g", k0, e);
        naive_forward(L, hidden, B, k0, y2, 1);
        double es = rel_err(y2, ref, n);
        CHECK(es > 0.1, "k0=%d: swapping gate/up should change the output a lot, rel %.3g", k0, es);
        CHECK(st.unique_after <= st.unique_before, "unique after %d > before %d", st.unique_after, st.unique_before);
    }
}

static void test_k0_zero(void) {
    /* 2. k0 = 0 means top-k. */
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, 0, y, NULL));
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, cfg.topk, y2, NULL));
    CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "k0=0 differs from k0=topk");
}

static void test_deterministic(void) {
    /* 3. Deterministic: same bits twice. */
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A4, hidden, B, B, 2, y, NULL));
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A4, hidden, B, B, 2, y2, NULL));
    CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "W4A4 forward not deterministic");
}

static void test_w4a4(void) {
    /* 4. W4A4 is close to W4A16 but not equal (the activations really are quantized). */
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, cfg.topk, ref, NULL));
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A4, hidden, B, B, cfg.topk, y, NULL));
    double e44 = rel_err(y, ref, n);
    CHECK(e44 > 1e-4 && e44 < 0.35, "W4A4 vs W4A16 rel err %.3g should be small but nonzero", e44);
}

static void test_oea(void) {
    /* 5. OEA with k0 < k changes the output but not wildly; unique experts fall. */
    mj_route_stats sp = MJ_ROUTE_STATS_INIT, so = MJ_ROUTE_STATS_INIT;
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, cfg.topk, ref, &sp));
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, 1, y, &so));
    CHECK(so.unique_after < sp.unique_after, "k0=1 unique %d not below top-k's %d", so.unique_after, sp.unique_after);
    CHECK(so.retained_mass < 1.0 && so.retained_mass > 0.2, "retained mass %.3f", so.retained_mass);
    CHECK(sp.retained_mass == 1.0, "plain retained mass %.17g", sp.retained_mass);
    double eo = rel_err(y, ref, n);
    CHECK(eo > 1e-3 && eo < 2.0, "OEA k0=1 vs plain rel %.3g", eo);
}

static void test_padding(void) {
    /* 6. Padding: rows past num_valid are zero and do not change the valid rows. */
    const int V = 7;
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, V, 2, y, NULL));
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, V, V, 2, y2, NULL));
    CHECK(memcmp(y, y2, (size_t)(V * H) * sizeof(float)) == 0, "valid rows depend on padding");
    int nz = 0;
    for (size_t i = (size_t)(V * H); i < n; i++) nz += y[i] != 0.0f;
    CHECK(nz == 0, "%d nonzero values in padding rows", nz);
}

static void test_splits(void) {
    /* 7. Splits: for n in {1,2,4,8}, TP and EP, both modes, the ranks' partials sum to the
     *    unsplit output. */
    for (int mode = 0; mode < 2; mode++) {
        CHECK_OK(mj_moe_forward_ref(L, (mj_weight_mode)mode, hidden, B, B, 3, ref, NULL));
        for (int par = MJ_PAR_TP; par <= MJ_PAR_EP; par++)
            for (int nr = 1; nr <= 8; nr *= 2) {
                memset(sum, 0, n * sizeof(float));
                for (int r = 0; r < nr; r++) {
                    mj_layer_t S;
                    CHECK_OK(mj_layer_shard(L, (mj_parallel)par, r, nr, &S));
                    if (g_fail) return;
                    if (par == MJ_PAR_TP) {
                        CHECK(S->i_local == cfg.intermediate / nr && S->w13[0].n_out == 2 * S->i_local &&
                              S->w2[0].k_in == S->i_local && S->n_local == cfg.n_experts,
                              "TP shard shape (n=%d r=%d)", nr, r);
                    } else {
                        CHECK(S->n_local == cfg.n_experts / nr && S->expert_begin == r * S->n_local &&
                              S->has_shared == (r == 0), "EP shard shape (n=%d r=%d)", nr, r);
                    }
                    CHECK_OK(mj_moe_forward_ref(S, (mj_weight_mode)mode, hidden, B, B, 3, y, NULL));
                    for (size_t i = 0; i < n; i++) sum[i] += y[i];
                    mj_layer_free(S);
                }
                double e = rel_err(sum, ref, n);
                CHECK(e < 1e-5, "%s=%d mode %d: sum of ranks vs unsplit rel err %.3g",
                      par == MJ_PAR_TP ? "TP" : "EP", nr, mode, e);
            }
    }
    /* TP slices really are slices: rank 1 of TP 2 holds gate row I/2 and up row I + I/2. */
    {
        mj_layer_t S;
        CHECK_OK(mj_layer_shard(L, MJ_PAR_TP, 1, 2, &S));
        int I = cfg.intermediate, il = I / 2;
        size_t rb = (size_t)H / 2;
        CHECK(memcmp(S->w13[3].weight, L->w13[3].weight + (size_t)il * rb, rb) == 0, "TP gate row");
        CHECK(memcmp(S->w13[3].weight + (size_t)il * rb, L->w13[3].weight + (size_t)(I + il) * rb, rb) == 0, "TP up row");
        CHECK(memcmp(S->w2[3].weight + 5 * (il / 2), L->w2[3].weight + 5 * (I / 2) + il / 2, (size_t)il / 2) == 0,
              "TP down columns");
        CHECK(memcmp(S->w2[3].weight_scale + 5 * (il / 16), L->w2[3].weight_scale + 5 * (I / 16) + il / 16,
                     (size_t)il / 16) == 0, "TP down scale columns");
        /* A shard is not split again. */
        mj_layer_t T = NULL;
        CHECK_STATUS(mj_layer_shard(S, MJ_PAR_TP, 0, 2, &T), MJ_ERR_INVALID_ARG);
        mj_layer_free(S);
    }
}

static void test_refusals(void) {
    /* 8. Impossible splits and bad arguments. */
    mj_layer_t bad = NULL;
    CHECK_STATUS(mj_layer_shard(L, MJ_PAR_TP, 0, 3, &bad), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_layer_shard(L, MJ_PAR_TP, 0, 16, &bad), MJ_ERR_CONFIG); /* 512/16 = 32 */
    CHECK(strstr(mj_last_error(), "multiples of 64") != NULL, "TP error names the rule: %s", mj_last_error());
    CHECK(strstr(mj_last_error(), "slices of 32 rows") && strstr(mj_last_error(), "works"),
          "TP error names the slice and what works: %s", mj_last_error());
    CHECK_STATUS(mj_layer_shard(L, MJ_PAR_EP, 0, 3, &bad), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_layer_shard(L, MJ_PAR_EP, 8, 8, &bad), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_layer_shard(L, MJ_PAR_NONE, 0, 2, &bad), MJ_ERR_INVALID_ARG);
    CHECK(bad == NULL, "failed shard wrote its output");
    CHECK_STATUS(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B, cfg.topk + 1, y, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, B, B + 1, 1, y, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_forward_ref(L, (mj_weight_mode)7, hidden, B, B, 1, y, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_forward_ref(NULL, MJ_MODE_W4A16, hidden, B, B, 1, y, NULL), MJ_ERR_INVALID_ARG);
    mj_moe_config c2 = cfg;
    c2.hidden = 100;
    CHECK_STATUS(mj_layer_create_random(&c2, 1, &bad), MJ_ERR_CONFIG);
    c2 = cfg;
    c2.quant = MJ_QUANT_NONE;
    CHECK_STATUS(mj_layer_create_random(&c2, 1, &bad), MJ_ERR_UNSUPPORTED);
    /* B = 0 is a valid empty batch. */
    CHECK_OK(mj_moe_forward_ref(L, MJ_MODE_W4A16, hidden, 0, 0, 1, y, NULL));
}

static const test_case cases[] = {
    TEST_CASE("naive", test_naive),
    TEST_CASE("k0_zero", test_k0_zero),
    TEST_CASE("deterministic", test_deterministic),
    TEST_CASE("w4a4", test_w4a4),
    TEST_CASE("oea", test_oea),
    TEST_CASE("padding", test_padding),
    TEST_CASE("splits", test_splits),
    TEST_CASE("refusals", test_refusals),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
