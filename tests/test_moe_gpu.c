/* test_moe_gpu.c — the expert GEMMs and the whole layer on a real GPU against the CPU
 * reference, and a CUDA graph of mj_moe_forward replayed for several token counts. Exit 77
 * (ctest: skipped) without a GPU.
 *
 *   test_moe_gpu [experts|layer|graph|silu|dequant|all] [--stub | --sim]   (cases: test.h)
 *
 * experts  mj_experts_forward on the reference's routing (W4A16 everywhere, W4A4 where the
 *          target has it: sm_120a/sm_121a; elsewhere its refusal is checked), against
 *          mj_experts_ref: relative L2 within 2e-3 (W4A16) / 5e-2 (W4A4), the interpreter
 *          tests' tolerances; padding rows exactly 0; two runs the same bits.
 * layer    mj_moe_forward (router GEMM, routing, experts) against mj_moe_forward_ref. The
 *          GPU's expf may differ from the host's by an ulp, so a token whose selection scores
 *          tie to within that may route differently (test_route_gpu's rule): where the ids
 *          differ, a near-tie (gap < 1e-5) must be there, and the output is checked against
 *          the experts' reference on the GPU's own routing instead.
 * graph    one forward captured per batch size, replayed with new hidden states and token
 *          counts written into the same buffers, each replay checked as above.
 * silu     the SwiGLU's division (done without a division instruction) against the GPU's own
 *          x / (1.0f + expf(-x)), bit for bit, for every float at a stride and the edges of
 *          its branches (experts_silu, compiled with PART 0).
 * dequant  W4A16's dequantization (experts_dequant, the same build): every E2M1 code in
 *          every nibble with every scale byte, each bf16 value x scale x 2^-7 bit for bit
 *          (the exponent-0 codes pass through bf16 subnormals the multiply must keep).
 * --sim    the same checks on the interpreter (what is checked here, without a GPU).
 * --stub   the host path only, on tests/stub/cuda_stub.c (kernels do not run): every call
 *          succeeds, captures are legal, nothing is written out of bounds; values unchecked.
 * Shapes: a small layer (H 256, I 128, E 16, top-4) at many batch sizes, and GLM-5's TP-8
 * expert shapes (H 6144, I 256 a rank, top-8, a shared expert) with 32 experts. */
#include "experts.h"
#include "sim/sim.h"
#include "test.h"
#include "test_routing.h"

static int g_values = 1; /* 0 with --stub: kernels do not run, results are not checked */
static int g_dev = 1;    /* 0 with --sim: the same checks on the interpreter (host memory)  */

static void get(void *dst, const void *src, size_t n) {
    if (g_dev) CHECK_OK(mj_cuda_memcpy_dtoh(dst, (uint64_t)(uintptr_t)src, n));
    else memcpy(dst, src, n);
}
static void sync_dev(void) {
    if (g_dev) CHECK_OK(mj_cuda_synchronize());
}

typedef struct shape {
    int H, I, E, k;
    int Bs[8], nB;
} shape;

static const shape k_shapes[] = {
    {256, 128, 16, 4, {1, 5, 16, 64, 200}, 5},
    {6144, 256, 32, 8, {1, 4, 16}, 3},
};

static double tol_of(mj_weight_mode m) { return m == MJ_MODE_W4A4 ? 5e-2 : 2e-3; }

/* Padding rows exactly 0, every value finite. */
static void check_rows(const float *got, int B, int nv, int H, const char *what) {
    if (!g_values) return;
    int64_t bad_pad = 0, nonfinite = 0;
    for (int64_t i = 0; i < (int64_t)B * H; i++) {
        if (!isfinite(got[i])) nonfinite++;
        if (i >= (int64_t)nv * H && got[i] != 0.0f) bad_pad++;
    }
    CHECK(nonfinite == 0, "%s: %lld values not finite (or never written)", what, (long long)nonfinite);
    CHECK(bad_pad == 0, "%s: %lld values of padding rows not 0", what, (long long)bad_pad);
}

/* Which valid tokens have two selection scores within 1e-5 of each other at the border of
 * their first k0 or their top-k? An ulp of expf may route such a token differently. */
static void near_ties(mj_layer_t L, const routing *r, int k0, char *tie) {
    const int E = L->cfg.n_experts, k = L->cfg.topk, B = r->B, nv = r->nv;
    double *c = malloc(sizeof(double) * (size_t)E);
    for (int t = 0; t < B; t++) {
        tie[t] = 0;
        if (t >= nv) continue;
        for (int e = 0; e < E; e++)
            c[e] = 1.0 / (1.0 + exp(-(double)r->logits[(size_t)t * E + e])) + (L->bias ? L->bias[e] : 0.0);
        for (int i = 1; i < E; i++) /* descending */
            for (int j = i; j > 0 && c[j] > c[j - 1]; j--) {
                double x = c[j];
                c[j] = c[j - 1], c[j - 1] = x;
            }
        if (fabs(c[k0 - 1] - c[k0]) < 1e-5 || (k < E && fabs(c[k - 1] - c[k]) < 1e-5)) tie[t] = 1;
    }
    free(c);
}

/* The experts of the batch's first k0 (OEA's S_base) of a routing, as flags [E]. */
static void base_set(const int32_t *ids, const int32_t *nsel, int nv, int k, int k0, int E, char *in) {
    memset(in, 0, (size_t)E);
    for (int t = 0; t < nv; t++)
        for (int j = 0; j < k0 && j < nsel[t]; j++)
            if (ids[(size_t)t * k + j] >= 0 && ids[(size_t)t * k + j] < E) in[ids[(size_t)t * k + j]] = 1;
}

/* A routing (ids, weights, n_sel of B tokens) against the reference's, token by token.
 * Returns 0 when every token matches (ids and n_sel equal, weights within 1e-6 relative);
 * 1 when the tokens that differ are each explained: a near-tie token itself, or, with OEA
 * (k0 < top-k), a valid token whose own first k0 match but whose extra experts come from a
 * batch S_base that a near-tie token changed; -1 otherwise, with why. */
static int routing_verdict(mj_layer_t L, const routing *r, const int32_t *ids, const float *w, const int32_t *nsel,
                           int k0, char *why, size_t wl) {
    const int E = L->cfg.n_experts, k = L->cfg.topk, B = r->B, nv = r->nv;
    char *tie = malloc((size_t)B), *b_got = malloc((size_t)E), *b_ref = malloc((size_t)E);
    near_ties(L, r, k0, tie);
    base_set(ids, nsel, nv, k, k0, E, b_got);
    base_set(r->ids, r->nsel, nv, k, k0, E, b_ref);
    const int base_differs = memcmp(b_got, b_ref, (size_t)E) != 0;
    int verdict = 0;
    for (int t = 0; t < B && verdict >= 0; t++) {
        const size_t o = (size_t)t * k;
        if (nsel[t] == r->nsel[t] && !memcmp(ids + o, r->ids + o, 4 * (size_t)k)) {
            for (int j = 0; j < k; j++) {
                if (r->w[o + j] == 0 && w[o + j] == 0) continue;
                const double d = fabs((double)w[o + j] - r->w[o + j]) / fmax(1e-30, fabs((double)r->w[o + j]));
                if (d > 1e-6) {
                    snprintf(why, wl, "token %d: routing weight %d differs by %.3g relative (ids the same)", t, j, d);
                    verdict = -1;
                    break;
                }
            }
            continue;
        }
        const int own_k0_same = nsel[t] >= k0 && r->nsel[t] >= k0 && !memcmp(ids + o, r->ids + o, 4 * (size_t)k0);
        if (tie[t] || (k0 < k && t < nv && own_k0_same && base_differs)) {
            verdict = 1;
            continue;
        }
        snprintf(why, wl, "token %d%s: ids or n_sel differ from the reference's without a near-tie (%d ids, the "
                 "first %d; want %d, the first %d)", t, t >= nv ? " (padding)" : "", (int)nsel[t], (int)ids[o],
                 (int)r->nsel[t], (int)r->ids[o]);
        verdict = -1;
    }
    free(tie), free(b_got), free(b_ref);
    return verdict;
}

/* The verdict must catch a routing that differs where no tie explains it: the reference's own
 * routing with one non-tie token's expert changed, or one weight 1e-4 off, is refused. */
static void check_verdict_catches(mj_layer_t L, const routing *r, int k0, const char *what) {
    const int E = L->cfg.n_experts, k = L->cfg.topk, B = r->B, nv = r->nv;
    char why[256] = "", *tie = malloc((size_t)B);
    near_ties(L, r, k0, tie);
    int t = 0;
    while (t < nv && (tie[t] || r->nsel[t] < 1)) t++;
    if (t < nv) {
        const size_t bk = (size_t)B * (size_t)k;
        int32_t *ids = malloc(4 * bk);
        float *w = malloc(4 * bk);
        memcpy(ids, r->ids, 4 * bk), memcpy(w, r->w, 4 * bk);
        CHECK(routing_verdict(L, r, ids, w, r->nsel, k0, why, sizeof why) == 0,
              "%s: the reference against itself: %s", what, why);
        int e = 0; /* an expert not in the token's row */
        for (int in = 1; in && e < E;) {
            in = 0;
            for (int j = 0; j < k; j++) in |= ids[(size_t)t * k + j] == e;
            if (in) e++;
        }
        ids[(size_t)t * k + r->nsel[t] - 1] = e;
        CHECK(routing_verdict(L, r, ids, w, r->nsel, k0, why, sizeof why) < 0,
              "%s: an expert changed on token %d (no near-tie) was accepted", what, t);
        memcpy(ids, r->ids, 4 * bk);
        w[(size_t)t * k] *= 1.0001f;
        CHECK(routing_verdict(L, r, ids, w, r->nsel, k0, why, sizeof why) < 0 && strstr(why, "weight"),
              "%s: a weight 1e-4 off on token %d was accepted", what, t);
        free(ids), free(w);
    }
    free(tie);
}

/* Check a layer output `got` [B, H] of moe (whose last forward it was) against the reference. */
static void check_layer(mj_layer_t L, mj_moe_t moe, const uint16_t *hidden, int B, int nv, int k0,
                        mj_weight_mode mode, const float *got, const char *what) {
    const int H = L->cfg.hidden, k = L->cfg.topk;
    check_rows(got, B, nv, H, what);
    if (!g_values) return;
    routing r;
    route_layer(L, hidden, B, nv, k0, &r);
    mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
    CHECK_OK(mj_moe_route_outputs(moe, &ro));
    const size_t bk = (size_t)B * (size_t)k;
    int32_t *ids = malloc(4 * bk), *nsel = malloc(4 * (size_t)B);
    float *w = malloc(4 * bk), *want = malloc(sizeof(float) * (size_t)B * H);
    get(ids, ro.ids, 4 * bk);
    get(w, ro.weights, 4 * bk);
    get(nsel, ro.n_sel, 4 * (size_t)B);
    if (!g_dev) check_verdict_catches(L, &r, k0, what);
    char why[256] = "";
    const int v = routing_verdict(L, &r, ids, w, nsel, k0, why, sizeof why);
    CHECK(v >= 0, "%s: the GPU's routing: %s", what, why);
    if (v == 0) {
        CHECK_OK(mj_moe_forward_ref(L, mode, hidden, B, nv, k0, want, NULL));
        double e = test_rel_l2(got, want, (size_t)B * H);
        CHECK(e <= tol_of(mode), "%s: relative L2 %.3g against mj_moe_forward_ref (tolerance %g)", what, e,
              tol_of(mode));
    } else if (v > 0) {
        printf("%s: routing differs from the reference at a near-tie (an ulp of expf): checked on the GPU's own "
               "routing\n", what);
        CHECK_OK(mj_experts_ref(L, mode, hidden, B, nv, ids, w, nsel, want));
        double e = test_rel_l2(got, want, (size_t)B * H);
        CHECK(e <= tol_of(mode), "%s: relative L2 %.3g against mj_experts_ref on the GPU's routing", what, e);
    }
    free(ids), free(nsel), free(w), free(want);
    routing_free(&r);
}

static mj_context_t gpu_context(void) {
    if (!g_dev) return test_new_context(test_shared_cache(), MJ_BACKEND_SIM, "sm_120a", 0);
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = test_shared_cache(), o.device = 0, o.backend = MJ_BACKEND_CUDA;
    mj_context_t ctx = NULL;
    CHECK_OK(mj_context_create(&o, &ctx));
    return ctx;
}

static int has_w4a4(mj_context_t ctx) {
    mj_target t = mj_context_target(ctx);
    return t == MJ_TARGET_SM120A || t == MJ_TARGET_SM121A;
}

/* ---- the experts on the reference's routing ---------------------------------------------- */
/* Shapes to run: on the stub and the interpreter only the small one (the stub runs no
 * kernel; the interpreter would take minutes over GLM-5's). MJ_GPU_TEST_SMALL=1: only the
 * small one anywhere (under compute-sanitizer); MJ_GPU_TEST_ALL_SHAPES=1: all, also on the
 * stub (scripts/gpu/bundle.sh compiles what the GPU run needs that way). */
static size_t n_shapes(void) {
    const size_t all = sizeof k_shapes / sizeof k_shapes[0];
    const char *small = getenv("MJ_GPU_TEST_SMALL"), *every = getenv("MJ_GPU_TEST_ALL_SHAPES");
    if (small && !strcmp(small, "1")) return 1;
    if (every && !strcmp(every, "1")) return all;
    return g_values && g_dev ? all : 1;
}

static void test_experts(mj_context_t ctx, uint64_t seed) {
    for (size_t si = 0; si < n_shapes(); si++) {
        const shape *s = &k_shapes[si];
        mj_moe_config c = test_moe_cfg(s->H, s->I, s->E, s->k, 1);
        mj_layer_t L = NULL;
        double t0 = test_now_ms();
        CHECK_OK(mj_layer_create_random(&c, seed + si, &L));
        if (!L) continue;
        const int maxB = s->Bs[s->nB - 1], H = s->H, k = s->k, E = s->E;
        mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
        eo.max_batch = maxB;
        mj_experts_t ex = NULL;
        CHECK_OK(mj_experts_create(ctx, L, &eo, &ex));
        if (!ex) {
            mj_layer_free(L);
            continue;
        }
        if (!has_w4a4(ctx)) {
            CHECK_STATUS(mj_experts_prepare(ctx, ex, MJ_MODE_W4A4, maxB), MJ_ERR_UNSUPPORTED);
            CHECK(strstr(mj_last_error(), "sm_120a") != NULL, "the W4A4 refusal names what has it: %s", mj_last_error());
        }
        const size_t bk = (size_t)maxB * (size_t)k;
        tbuf dh = tbuf_new(2 * (size_t)maxB * H, g_dev), dout = tbuf_new(4 * (size_t)maxB * H, g_dev), dnv = tbuf_new(4, g_dev);
        tbuf dids = tbuf_new(4 * bk, g_dev), dw = tbuf_new(4 * bk, g_dev), dnsel = tbuf_new(4 * (size_t)maxB, g_dev);
        tbuf dcnt = tbuf_new(4 * (size_t)E, g_dev), doff = tbuf_new(4 * (size_t)(E + 1), g_dev), dact = tbuf_new(4 * (size_t)E, g_dev);
        tbuf dna = tbuf_new(4, g_dev), dperm = tbuf_new(4 * bk, g_dev), drix = tbuf_new(4 * bk, g_dev);
        uint16_t *hidden = malloc(2 * (size_t)maxB * H);
        float *got = malloc(4 * (size_t)maxB * H), *got2 = malloc(4 * (size_t)maxB * H), *want = malloc(4 * (size_t)maxB * H);
        for (int m = 0; m < (has_w4a4(ctx) ? 2 : 1); m++) {
            const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
            CHECK_OK(mj_experts_prepare(ctx, ex, mode, maxB));
            for (int bi = 0; bi < s->nB; bi++)
                /* k0 = k, k / 2, and on the first shape at B 16 and 64 k0 = k with every valid
                 * token's first two picks made expert 0 (an engine's ids may name an expert
                 * twice): expert 0 then has 2 x 13 or 2 x 61 rows, more than TPE (16, 64), which
                 * up and down take TPE rows at a time */
                for (int var = 0; var < 3; var++) {
                    const int k0 = var == 1 ? k / 2 : k, dup = var == 2;
                    if (dup && !(si == 0 && (s->Bs[bi] == 16 || s->Bs[bi] == 64))) continue;
                    const int B = s->Bs[bi], nv = B > 4 ? B - 3 : B;
                    if (!g_dev && B > 64) continue; /* test_experts covers it on the interpreter */
                    char what[160];
                    snprintf(what, sizeof what, "experts H %d I %d E %d %s B %d (%d valid) k0 %d%s", H, s->I, E,
                             m ? "W4A4" : "W4A16", B, nv, k0, dup ? ", an expert twice a token" : "");
                    uint64_t rng = seed + 1000 * si + 10 * (uint64_t)B + (uint64_t)k0;
                    test_random_hidden(hidden, (size_t)B * H, &rng);
                    routing r;
                    route_layer(L, hidden, B, nv, k0, &r);
                    if (dup) {
                        for (int b = 0; b < nv; b++)
                            if (r.nsel[b] >= 2) r.ids[b * k] = r.ids[b * k + 1] = 0;
                        routing_dispatch(&r);
                        CHECK(r.cnt[0] > B, "%s: expert 0 has %d rows", what, r.cnt[0]);
                    }
                    tbuf_put(&dh, hidden, 2 * (size_t)B * H);
                    tbuf_put(&dids, r.ids, 4 * (size_t)B * k), tbuf_put(&dw, r.w, 4 * (size_t)B * k);
                    tbuf_put(&dnsel, r.nsel, 4 * (size_t)B), tbuf_put(&dcnt, r.cnt, 4 * (size_t)E);
                    tbuf_put(&doff, r.off, 4 * (size_t)(E + 1)), tbuf_put(&dact, r.act, 4 * (size_t)E);
                    tbuf_put(&dna, &r.na, 4), tbuf_put(&dperm, r.perm, 4 * (size_t)B * k);
                    tbuf_put(&drix, r.rix, 4 * (size_t)B * k), tbuf_put(&dnv, &nv, 4);
                    mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
                    ro.ids = dids.p, ro.weights = dw.p, ro.n_sel = dnsel.p, ro.expert_counts = dcnt.p;
                    ro.expert_offsets = doff.p, ro.active_experts = dact.p, ro.n_active = dna.p;
                    ro.permutation = dperm.p, ro.row_index = drix.p;
                    tbuf_poison(&dout, 0xFF); /* NaN: an unwritten element shows */
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, dh.p, &ro, B, dnv.p, dout.p, NULL));
                    sync_dev();
                    tbuf_get(&dout, NULL, what);
                    get(got, dout.p, 4 * (size_t)B * H);
                    tbuf_poison(&dout, 0xFF);
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, dh.p, &ro, B, dnv.p, dout.p, NULL));
                    sync_dev();
                    get(got2, dout.p, 4 * (size_t)B * H);
                    check_rows(got, B, nv, H, what);
                    if (g_values) {
                        CHECK(!memcmp(got, got2, 4 * (size_t)B * H), "%s: two runs differ in some bit", what);
                        CHECK_OK(mj_experts_ref(L, mode, hidden, B, nv, r.ids, r.w, r.nsel, want));
                        double e = test_rel_l2(got, want, (size_t)B * H);
                        CHECK(e <= tol_of(mode), "%s: relative L2 %.3g (tolerance %g)", what, e, tol_of(mode));
                    }
                    routing_free(&r);
                }
        }
        printf("experts H %d I %d E %d top-%d: %d batch sizes x 2 k0 x %d mode(s) in %.0f ms\n", H, s->I, E, k, s->nB,
               has_w4a4(ctx) ? 2 : 1, test_now_ms() - t0);
        tbuf *all[] = {&dh, &dout, &dnv, &dids, &dw, &dnsel, &dcnt, &doff, &dact, &dna, &dperm, &drix};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) tbuf_free(all[i]);
        free(hidden), free(got), free(got2), free(want);
        mj_experts_free(ex);
        mj_layer_free(L);
    }
}

/* ---- the whole layer, eager or replayed from a CUDA graph ---------------------------- */
static void test_layer(mj_context_t ctx, uint64_t seed, int graph) {
    for (size_t si = 0; si < n_shapes(); si++) {
        const shape *s = &k_shapes[si];
        mj_moe_config c = test_moe_cfg(s->H, s->I, s->E, s->k, 1);
        mj_layer_t L = NULL;
        double t0 = test_now_ms();
        CHECK_OK(mj_layer_create_random(&c, seed + 100 + si, &L));
        if (!L) continue;
        const int maxB = s->Bs[s->nB - 1], H = s->H, k = s->k;
        char policy[64];
        snprintf(policy, sizeof policy, "1-4:%d,5-:%d", k, k / 2);
        mj_moe_options o = MJ_MOE_OPTIONS_INIT;
        mj_moe_t moe = NULL;
        CHECK_OK(mj_moe_create(ctx, L, &o, &moe));
        mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
        po.batches = s->Bs, po.n_batches = s->nB, po.k0_policy = policy;
        CHECK_OK(mj_moe_prepare(moe, &po));
        void *stream = NULL;
        if (graph && g_dev) CHECK_OK(mj_cuda_stream_create(&stream));
        tbuf dh = tbuf_new(2 * (size_t)maxB * H, g_dev), dout = tbuf_new(4 * (size_t)maxB * H, g_dev), dnv = tbuf_new(4, g_dev);
        uint16_t *hidden = malloc(2 * (size_t)maxB * H);
        float *got = malloc(4 * (size_t)maxB * H);
        for (int bi = 0; bi < s->nB && moe; bi++) {
            const int B = s->Bs[bi];
            int32_t k0 = 0;
            mj_weight_mode mode = MJ_MODE_W4A16;
            CHECK_OK(mj_moe_batch_plan(moe, B, &k0, &mode));
            void *exec = NULL;
            mj_sim_graph *sg = NULL;
            if (graph && g_dev) { /* one capture for the bucket, replayed below */
                void *g = NULL;
                CHECK_OK(mj_cuda_graph_capture_begin(stream));
                CHECK_OK(mj_moe_forward(moe, dh.p, B, dnv.p, dout.p, stream));
                CHECK_OK(mj_cuda_graph_capture_end(stream, &g));
                if (g) CHECK_OK(mj_cuda_graph_instantiate(g, &exec));
                CHECK_OK(mj_cuda_graph_destroy(g));
            } else if (graph) { /* the interpreter's recording */
                CHECK_OK(mj_sim_capture_begin(ctx));
                CHECK_OK(mj_moe_forward(moe, dh.p, B, dnv.p, dout.p, NULL));
                CHECK_OK(mj_sim_capture_end(ctx, &sg));
            }
            const int counts[] = {B, B > 3 ? B - 3 : B, 1, 0};
            for (int ci = 0; ci < (graph ? 4 : 2); ci++) {
                const int nv = counts[ci];
                char what[160];
                snprintf(what, sizeof what, "%s H %d E %d B %d (%d valid) k0 %d %s", graph ? "graph replay" : "layer",
                         H, s->E, B, nv, (int)k0, mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16");
                uint64_t rng = seed + 7000 * si + 31 * (uint64_t)B + (uint64_t)ci;
                test_random_hidden(hidden, (size_t)B * H, &rng);
                tbuf_put(&dh, hidden, 2 * (size_t)B * H);
                tbuf_put(&dnv, &nv, 4);
                tbuf_poison(&dout, 0xFF);
                if (graph && g_dev) {
                    /* the pageable copies above went on the default stream and may still be in
                     * flight; the graph runs on a non-blocking stream, unordered with them */
                    sync_dev();
                    if (exec) CHECK_OK(mj_cuda_graph_launch(exec, stream));
                    CHECK_OK(mj_cuda_stream_synchronize(stream));
                } else if (graph) {
                    if (sg) CHECK_OK(mj_sim_graph_replay(sg));
                } else {
                    CHECK_OK(mj_moe_forward(moe, dh.p, B, dnv.p, dout.p, NULL));
                    sync_dev();
                }
                tbuf_get(&dout, NULL, what);
                get(got, dout.p, 4 * (size_t)B * H);
                check_layer(L, moe, hidden, B, nv, k0, mode, got, what);
            }
            if (exec) CHECK_OK(mj_cuda_graph_exec_destroy(exec));
            mj_sim_graph_free(sg);
        }
        printf("%s H %d I %d E %d top-%d: %d batch sizes in %.0f ms\n", graph ? "graph replays" : "layer", H, s->I,
               s->E, k, s->nB, test_now_ms() - t0);
        tbuf_free(&dh), tbuf_free(&dout), tbuf_free(&dnv);
        free(hidden), free(got);
        if (stream) CHECK_OK(mj_cuda_stream_destroy(stream));
        mj_moe_free(moe);
        mj_layer_free(L);
    }
}

/* ---- silu's division on the device ------------------------------------------------------- */
static void test_silu(mj_context_t ctx) {
    enum { STRIDE = 4099 };
    const int n = (int)((1ull << 32) / STRIDE + 1) + TEST_SILU_EDGES;
    float *x = malloc(4 * (size_t)n), *y = malloc(4 * (size_t)n), *want = malloc(4 * (size_t)n);
    int m = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += STRIDE) x[m++] = mj_f32_from_bits((uint32_t)u);
    m += test_silu_edges(x + m);
    CHECK(m == n, "silu: %d inputs, %d expected", m, n);
    const mj_function *f = NULL;
    CHECK_OK(test_silu_kernel(ctx, &f));
    uint64_t dx = 0, dy = 0, dw = 0;
    float *px = x, *py = y, *pw = want;
    if (g_dev) {
        CHECK_OK(mj_cuda_malloc(4 * (size_t)n, &dx));
        CHECK_OK(mj_cuda_malloc(4 * (size_t)n, &dy));
        CHECK_OK(mj_cuda_malloc(4 * (size_t)n, &dw));
        CHECK_OK(mj_cuda_memcpy_htod(dx, x, 4 * (size_t)n));
        px = (float *)(uintptr_t)dx, py = (float *)(uintptr_t)dy, pw = (float *)(uintptr_t)dw;
    }
    if (f) {
        const mj_launch_dims d = {{256, 1, 1}, {256, 1, 1}, 0, NULL};
        CHECK_OK(mj_launch_experts_silu(f, d, px, n, py, pw));
        sync_dev();
        get(y, py, 4 * (size_t)n), get(want, pw, 4 * (size_t)n);
    }
    if (f && g_values) {
        int bad = 0;
        for (int i = 0; i < n; i++)
            if (memcmp(&y[i], &want[i], 4) && !(y[i] != y[i] && want[i] != want[i]))
                if (bad++ < 4) fprintf(stderr, "  silu(%a) = %a, the device's division %a\n", (double)x[i], (double)y[i], (double)want[i]);
        CHECK(bad == 0, "silu: %d of %d inputs differ from the device's x / (1 + expf(-x))", bad, n);
        printf("silu: %d inputs, the device's x / (1 + expf(-x)) bit for bit: %s\n", n, bad ? "no" : "yes");
    }
    if (g_dev) mj_cuda_free(dx), mj_cuda_free(dy), mj_cuda_free(dw);
    free(x), free(y), free(want);
}

/* ---- W4A16's dequantization on the device --------------------------------------------------- */
/* experts_dequant (the helpers up and down dequantize with) on every E2M1 code in every nibble
 * with every UE4M3 scale byte but the NaNs, each bf16 against value x scale x 2^-7, bit for
 * bit: the exponent-0 codes pass through bf16 subnormals, which the device's bf16 multiply
 * must keep. */
static void test_dequant(mj_context_t ctx) {
    uint32_t *words = malloc(4 * TEST_DQ_WORDS), *scales = malloc(4 * TEST_DQ_WORDS), *out = malloc(32 * TEST_DQ_WORDS);
    CHECK(words && scales && out, "dequant: no memory");
    const mj_function *f = NULL;
    CHECK_OK(test_silu_kernel(ctx, &f));
    if (!words || !scales || !out) {
        free(words), free(scales), free(out);
        return;
    }
    test_dequant_inputs(words, scales);
    uint32_t *laid = malloc(4 * TEST_DQ_WORDS); /* the words in the target's layout */
    CHECK(laid != NULL, "dequant: no memory");
    if (!laid) {
        free(words), free(scales), free(out);
        return;
    }
    test_dequant_layout(ctx, words, laid);
    memset(out, 0xEE, 32 * TEST_DQ_WORDS);
    uint64_t dw = 0, ds = 0, dout = 0;
    uint32_t *pw = laid, *ps = scales, *po = out;
    if (g_dev) {
        CHECK_OK(mj_cuda_malloc(4 * TEST_DQ_WORDS, &dw));
        CHECK_OK(mj_cuda_malloc(4 * TEST_DQ_WORDS, &ds));
        CHECK_OK(mj_cuda_malloc(32 * TEST_DQ_WORDS, &dout));
        CHECK_OK(mj_cuda_memcpy_htod(dw, laid, 4 * TEST_DQ_WORDS));
        CHECK_OK(mj_cuda_memcpy_htod(ds, scales, 4 * TEST_DQ_WORDS));
        CHECK_OK(mj_cuda_memcpy_htod(dout, out, 32 * TEST_DQ_WORDS)); /* poisoned: every word must be written */
        pw = (uint32_t *)(uintptr_t)dw, ps = (uint32_t *)(uintptr_t)ds, po = (uint32_t *)(uintptr_t)dout;
    }
    if (f) {
        const mj_launch_dims d = {{16, 1, 1}, {128, 1, 1}, 0, NULL};
        CHECK_OK(mj_launch_experts_dequant(f, d, pw, ps, TEST_DQ_WORDS, po));
        sync_dev();
        get(out, po, 32 * TEST_DQ_WORDS);
    }
    if (f && g_values) {
        const int bad = test_dequant_bad(words, scales, out);
        CHECK(bad == 0, "dequant: %d of %d bf16 values are not code x scale x 2^-7", bad, 16 * TEST_DQ_WORDS);
        printf("dequant: %d codes x scales, value x scale x 2^-7 bit for bit: %s\n", 16 * TEST_DQ_WORDS, bad ? "no" : "yes");
    }
    if (g_dev) mj_cuda_free(dw), mj_cuda_free(ds), mj_cuda_free(dout);
    free(words), free(scales), free(out), free(laid);
}

/* What the cases share (setup): the seed and a context on the GPU (or, with --sim, on the
 * interpreter; exit 77 without a GPU); with --stub, the stub driver and its log, checked at
 * the end (teardown). */
static uint64_t g_seed;
static mj_context_t g_ctx;

static int setup(void) {
    if (!g_values) { /* the host path on the stand-in driver */
        setenv("MOEJIT_LIBCUDA", MJ_STUB_LIBCUDA, 1);
        setenv("MOEJIT_QUIET", "1", 1);
        test_stub_log_begin();
    }
    g_seed = test_seed(20261203);
    if (g_dev) {
        const int rc = test_gpu_or_skip("runs the experts and the layer on a GPU");
        if (rc) return rc;
    }
    g_ctx = gpu_context();
    if (!g_ctx) return test_finish();
    mj_device_info di;
    memset(&di, 0, sizeof di);
    snprintf(di.name, sizeof di.name, "the interpreter");
    mj_context_device(g_ctx, &di);
    printf("%s (%s)%s\n", di.name, mj_target_name(mj_context_target(g_ctx)),
           g_values ? "" : ": host path only (stub driver)");
    return 0;
}

static void teardown(void) {
    mj_context_destroy(g_ctx);
    if (!g_values) test_stub_log_end();
}

static void case_experts(void) { test_experts(g_ctx, g_seed); }
static void case_layer(void) { test_layer(g_ctx, g_seed, 0); }
static void case_graph(void) { test_layer(g_ctx, g_seed, 1); }
static void case_silu(void) { test_silu(g_ctx); }
static void case_dequant(void) { test_dequant(g_ctx); }

static const test_case cases[] = {
    TEST_CASE("experts", case_experts),
    TEST_CASE("layer", case_layer),
    TEST_CASE("graph", case_graph),
    TEST_CASE("silu", case_silu),
    TEST_CASE("dequant", case_dequant),
};

int main(int argc, char **argv) {
    if (test_take_flag(&argc, argv, "--stub")) g_values = 0;
    if (test_take_flag(&argc, argv, "--sim")) g_dev = 0;
    return test_main(argc, argv, cases, TEST_N(cases), setup, teardown);
}
