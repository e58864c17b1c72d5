/* test_route_kernels.c — the router GEMM and the OEA route kernels, run on the CPU
 * interpreter, against the CPU reference: ids, counts and the dispatch metadata bit for
 * bit, weights within 1e-6 relative, over a table of cases that forces every branch. Also:
 * GLM-5-shaped specializations compile for sm_120a, sm_90a and sm_80 with 0 spills, and the
 * k0 policy. With MJ_ROUTE_BACKEND=cuda (tests/test_route_gpu.c) the same table runs on a GPU. */
#include "jit.h"
#include "test.h"

#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef ROUTE_TEST_GPU
#define ROUTE_TEST_GPU 0
#endif

/* Buffers the kernels see: host memory on the sim, device memory on a GPU. */
static void *dev_alloc(size_t bytes) {
    if (!ROUTE_TEST_GPU) return calloc(1, bytes ? bytes : 1);
    uint64_t d = 0;
    CHECK_OK(mj_cuda_malloc(bytes ? bytes : 4, &d));
    return (void *)(uintptr_t)d;
}
static void dev_free(void *p) {
    if (!ROUTE_TEST_GPU) free(p);
    else if (p) mj_cuda_free((uint64_t)(uintptr_t)p);
}
static void to_dev(void *d, const void *h, size_t bytes) {
    if (!ROUTE_TEST_GPU) memcpy(d, h, bytes);
    else CHECK_OK(mj_cuda_memcpy_htod((uint64_t)(uintptr_t)d, h, bytes));
}
static void from_dev(void *h, const void *d, size_t bytes) {
    if (!ROUTE_TEST_GPU) memcpy(h, d, bytes);
    else {
        CHECK_OK(mj_cuda_synchronize());
        CHECK_OK(mj_cuda_memcpy_dtoh(h, (uint64_t)(uintptr_t)d, bytes));
    }
}

typedef struct rcase {
    int B, V, E, k, k0, ng, tg, softmax, renorm, bias;
    int special; /* 0 random, 1 ties, 2 NaN logits, 3 one expert takes every token */
} rcase;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static void fill_logits(const rcase *c, uint64_t *rng, float *x, float *bias) {
    for (int64_t i = 0; i < (int64_t)c->B * c->E; i++) x[i] = (float)(mj_rng_normal(rng) * 2.0);
    for (int e = 0; e < c->E; e++) bias[e] = (float)(mj_rng_normal(rng) * 0.1);
    if (c->special == 1) /* ties: logits on a coarse grid, a zero bias on half the experts */
        for (int64_t i = 0; i < (int64_t)c->B * c->E; i++) x[i] = (float)((int)(x[i] * 2.0f)) * 0.5f;
    if (c->special == 1)
        for (int e = 0; e < c->E; e += 2) bias[e] = 0.0f;
    if (c->special == 2) /* NaN logits, a whole NaN row too */
        for (int64_t i = 0; i < (int64_t)c->B * c->E; i++)
            if (mj_rng_uniform(rng) < 0.1 || i / c->E == 0) x[i] = NAN;
    if (c->special == 3)
        for (int b = 0; b < c->B; b++) x[(int64_t)b * c->E + 5] = 30.0f;
}

/* One case on the backend of ctx (host pointers: the sim). Returns 1 if it matched. */
static int run_case(mj_context_t ctx, const rcase *c, uint64_t seed) {
    const int B = c->B, E = c->E, k = c->k, BK = (B ? B : 1) * k;
    uint64_t rng = seed;
    float *x = malloc(sizeof(float) * (size_t)((B ? B : 1) * E)), *bias = malloc(sizeof(float) * (size_t)E);
    fill_logits(c, &rng, x, bias);
    mj_route_params p = {E, k, c->k0, c->ng, c->tg, c->softmax ? MJ_SCORING_SOFTMAX : MJ_SCORING_SIGMOID,
                         2.5f, c->renorm};
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)BK), *rn = malloc(sizeof(int32_t) * (size_t)(B ? B : 1));
    float *rw = malloc(sizeof(float) * (size_t)BK);
    int32_t *rcnt = malloc(sizeof(int32_t) * (size_t)E), *roff = malloc(sizeof(int32_t) * (size_t)(E + 1));
    int32_t *ract = malloc(sizeof(int32_t) * (size_t)E), *rperm = malloc(sizeof(int32_t) * (size_t)BK), rna = 0;
    int32_t *id = malloc(sizeof(int32_t) * (size_t)BK), *n = malloc(sizeof(int32_t) * (size_t)(B ? B : 1));
    float *w = malloc(sizeof(float) * (size_t)BK);
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)E), *off = malloc(sizeof(int32_t) * (size_t)(E + 1));
    int32_t *act = malloc(sizeof(int32_t) * (size_t)E), *perm = malloc(sizeof(int32_t) * (size_t)BK), na = -7;
    int before = g_fail;
    CHECK_OK(mj_route_ref(&p, x, c->bias ? bias : NULL, B, c->V, rid, rw, rn, NULL));
    CHECK_OK(mj_route_dispatch_ref(rid, rn, B, k, E, rcnt, roff, ract, &rna, rperm));
    memset(id, 0x55, sizeof(int32_t) * (size_t)BK);
    memset(perm, 0x55, sizeof(int32_t) * (size_t)BK);
    /* The kernel's buffers, poisoned so unwritten outputs show. */
    size_t sx = sizeof(float) * (size_t)((B ? B : 1) * E), sk = sizeof(int32_t) * (size_t)BK;
    float *dx = dev_alloc(sx), *dbias = dev_alloc(sizeof(float) * (size_t)E), *dw = dev_alloc(sk);
    int32_t *did = dev_alloc(sk), *dn = dev_alloc(sizeof(int32_t) * (size_t)(B ? B : 1));
    int32_t *dcnt = dev_alloc(sizeof(int32_t) * (size_t)E), *doff = dev_alloc(sizeof(int32_t) * (size_t)(E + 1));
    int32_t *dact = dev_alloc(sizeof(int32_t) * (size_t)E), *dperm = dev_alloc(sk), *dna = dev_alloc(4);
    to_dev(dx, x, sx);
    to_dev(dbias, bias, sizeof(float) * (size_t)E);
    to_dev(did, id, sk);
    to_dev(dperm, perm, sk);
    mj_route_outputs o = {did, dw, dn, dcnt, doff, dact, dna, dperm};
    CHECK_OK(mj_route(ctx, &p, dx, c->bias ? dbias : NULL, B, c->V, &o, NULL));
    from_dev(id, did, sk);
    from_dev(w, dw, sk);
    from_dev(n, dn, sizeof(int32_t) * (size_t)(B ? B : 1));
    from_dev(cnt, dcnt, sizeof(int32_t) * (size_t)E);
    from_dev(off, doff, sizeof(int32_t) * (size_t)(E + 1));
    from_dev(act, dact, sizeof(int32_t) * (size_t)E);
    from_dev(perm, dperm, sk);
    from_dev(&na, dna, 4);
    dev_free(dx), dev_free(dbias), dev_free(dw), dev_free(did), dev_free(dn), dev_free(dcnt), dev_free(doff);
    dev_free(dact), dev_free(dperm), dev_free(dna);
    if (g_fail == before) {
        CHECK(!memcmp(n, rn, sizeof(int32_t) * (size_t)B), "n_sel differs");
        CHECK(!memcmp(id, rid, sizeof(int32_t) * (size_t)B * k), "ids differ");
        CHECK(!memcmp(cnt, rcnt, sizeof(int32_t) * (size_t)E), "counts differ");
        CHECK(!memcmp(off, roff, sizeof(int32_t) * (size_t)(E + 1)), "offsets differ");
        CHECK(!memcmp(act, ract, sizeof(int32_t) * (size_t)E) && na == rna, "active experts differ (%d vs %d)", na, rna);
        CHECK(!memcmp(perm, rperm, sizeof(int32_t) * (size_t)B * k), "permutation differs");
        int bad_w = 0;
        for (int i = 0; i < B * k; i++) {
            double d = fabs((double)w[i] - rw[i]), m = fabs((double)rw[i]);
            if (d > 1e-6 * m + 1e-30 || isnan(w[i])) bad_w++;
        }
        CHECK(bad_w == 0, "%d weights off by more than 1e-6 relative", bad_w);
    }
    int ok = g_fail == before;
    if (!ok)
        fprintf(stderr, "  case B=%d valid=%d E=%d k=%d k0=%d groups=%d/%d %s renorm=%d bias=%d special=%d seed=%llu\n",
                c->B, c->V, c->E, c->k, c->k0, c->ng, c->tg, c->softmax ? "softmax" : "sigmoid", c->renorm,
                c->bias, c->special, (unsigned long long)seed);
    free(x), free(bias), free(rid), free(rn), free(rw), free(rcnt), free(roff), free(ract), free(rperm);
    free(id), free(n), free(w), free(cnt), free(off), free(act), free(perm);
    return ok;
}

/* The table: every B, E and k of the brief, every k0 for some, groups, scorings, renorm,
 * padding, ties, NaN, one hot expert. */
static int build_table(rcase *t) {
    int n = 0;
    static const int Bs[] = {1, 2, 3, 16, 64, 255, 256, 257, 1024};
    static const int Es[] = {8, 64, 256, 384};
    static const int ks[] = {1, 2, 6, 8};
    for (int bi = 0; bi < 9; bi++)
        for (int ei = 0; ei < 4; ei++)
            for (int ki = 0; ki < 4; ki++) {
                int B = Bs[bi], E = Es[ei], k = ks[ki];
                if (k > E) continue;
                /* k0 = k always; small k0 too while OEA applies (B <= 256). */
                int k0s[3] = {k, 1, (k + 1) / 2}, nk = B <= 256 ? 3 : 1;
                for (int j = 0; j < nk; j++) {
                    if (j > 0 && k0s[j] == k) continue;
                    int idx = n;
                    rcase c = {B, B, E, k, k0s[j], 1, 1, (idx % 5) == 3, (idx % 4) != 1, (idx % 3) != 2, 0};
                    if (E >= 64 && (idx % 6) == 0) c.ng = 8, c.tg = k > 2 ? 3 : 2; /* group limit */
                    if (idx % 7 == 4 && B > 1) c.V = B - B / 3 - 1;                  /* padding */
                    t[n++] = c;
                }
            }
    /* Every k0 for one shape, and the special inputs. */
    for (int k0 = 1; k0 <= 8; k0++) t[n++] = (rcase){16, 13, 256, 8, k0, 1, 1, 0, 1, 1, 0};
    for (int k0 = 1; k0 <= 8; k0 += 3) t[n++] = (rcase){16, 16, 64, 8, k0, 8, 4, 1, 1, 1, 0};
    for (int sp = 1; sp <= 3; sp++) {
        t[n++] = (rcase){32, 30, 256, 8, 3, 1, 1, 0, 1, 1, sp};
        t[n++] = (rcase){32, 32, 64, 6, 6, 4, 2, 1, 1, 0, sp};
        t[n++] = (rcase){300, 300, 256, 8, 8, 1, 1, 0, 1, 1, sp};
    }
    t[n++] = (rcase){16, 0, 64, 4, 2, 1, 1, 0, 1, 1, 0}; /* all padding */
    t[n++] = (rcase){0, 0, 64, 4, 2, 1, 1, 0, 1, 1, 0};  /* empty batch */
    return n;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* The router GEMM against an fp64 reference. */
static void test_router(mj_context_t ctx, uint64_t seed) {
    static const int shapes[][3] = {{1, 256, 64}, {3, 512, 8}, {16, 1024, 256}, {5, 6144, 256}, {33, 128, 384}};
    for (int si = 0; si < 5; si++) {
        int B = shapes[si][0], H = shapes[si][1], E = shapes[si][2];
        uint64_t rng = seed + (uint64_t)si;
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(B * H)), *g = malloc(sizeof(uint16_t) * (size_t)(E * H));
        float *y = malloc(sizeof(float) * (size_t)(B * E));
        for (int i = 0; i < B * H; i++) x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
        for (int i = 0; i < E * H; i++) g[i] = mj_f32_to_bf16((float)(mj_rng_normal(&rng) * 0.02));
        uint16_t *dxh = dev_alloc(sizeof(uint16_t) * (size_t)(B * H)), *dg = dev_alloc(sizeof(uint16_t) * (size_t)(E * H));
        float *dy = dev_alloc(sizeof(float) * (size_t)(B * E));
        to_dev(dxh, x, sizeof(uint16_t) * (size_t)(B * H));
        to_dev(dg, g, sizeof(uint16_t) * (size_t)(E * H));
        CHECK_OK(mj_router_gemm(ctx, dxh, dg, B, H, E, dy, NULL));
        from_dev(y, dy, sizeof(float) * (size_t)(B * E));
        dev_free(dxh), dev_free(dg), dev_free(dy);
        int bad = 0;
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++) {
                double acc = 0, mag = 0;
                for (int h = 0; h < H; h++) {
                    double p = (double)mj_bf16_to_f32(x[b * H + h]) * mj_bf16_to_f32(g[e * H + h]);
                    acc += p, mag += fabs(p);
                }
                if (fabs(y[b * E + e] - acc) > 1e-5 * mag + 1e-7) bad++;
            }
        CHECK(bad == 0, "router B=%d H=%d E=%d: %d logits off", B, H, E, bad);
        free(x), free(g), free(y);
    }
    uint16_t dummy = 0;
    float out = 0;
    CHECK_STATUS(mj_router_gemm(ctx, &dummy, &dummy, 1, 100, 8, &out, NULL), MJ_ERR_UNSUPPORTED);
}

/* GLM-5-shaped kernels compile for the three reference targets with 0 spills. */
static void test_compile(const char *dir) {
    static const char *targets[] = {"sm_120a", "sm_90a", "sm_80"};
    for (int t = 0; t < 3; t++) {
        mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
        o.cache_dir = dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_CUDA, o.target = targets[t];
        mj_context_t c = NULL;
        CHECK_OK(mj_context_create(&o, &c));
        if (!c) continue;
        const int32_t specs[][MJ_MAX_KNOBS] = {
            {256, 8, 4, 1, 1, 0, 1, 8, 256}, {256, 8, 8, 1, 1, 0, 1, 8, 1}, {384, 8, 3, 8, 4, 1, 1, 4, 64},
            {1024, 16, 8, 32, 8, 0, 1, 2, 256}};
        for (int i = 0; i < 4; i++) {
            mj_spec s;
            const mj_function *f = NULL;
            CHECK_OK(mj_context_spec(c, "oea_route", specs[i], &s));
            CHECK_OK(mj_jit_get(c, &s, &f));
            if (f) CHECK(mj_function_report(f)->spill_stores == 0 && mj_function_report(f)->spill_loads == 0,
                         "oea_route spec %d on %s spills", i, targets[t]);
        }
        const int32_t rg[MJ_MAX_KNOBS] = {6144, 256, 8, 4};
        mj_spec s;
        const mj_function *f = NULL;
        CHECK_OK(mj_context_spec(c, "router_gemm", rg, &s));
        CHECK_OK(mj_jit_get(c, &s, &f));
        if (f) CHECK(mj_function_report(f)->spill_stores == 0, "router_gemm spills on %s", targets[t]);
        mj_context_destroy(c);
    }
}

static void test_policy(void) {
    mj_k0_policy p;
    int32_t k0 = 0;
    CHECK_OK(mj_k0_policy_parse("1-3:8,4-15:6,16-:4", 8, &p));
    CHECK_OK(mj_k0_policy_resolve(&p, 1, &k0));
    CHECK(k0 == 8, "B=1 -> %d", k0);
    CHECK_OK(mj_k0_policy_resolve(&p, 15, &k0));
    CHECK(k0 == 6, "B=15 -> %d", k0);
    CHECK_OK(mj_k0_policy_resolve(&p, 100000, &k0));
    CHECK(k0 == 4, "B=100000 -> %d", k0);
    CHECK_OK(mj_k0_policy_parse("5", 8, &p));
    CHECK_OK(mj_k0_policy_resolve(&p, 77, &k0));
    CHECK(k0 == 5, "fixed -> %d", k0);
    CHECK_OK(mj_k0_policy_parse("2:3,4-8:2", 8, &p));
    CHECK_STATUS(mj_k0_policy_resolve(&p, 3, &k0), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "batch size 3") != NULL, "msg %s", mj_last_error());
    const char *bad[] = {"", "x", "9", "0", "1-3:9", "3-1:2", "1-4:2,3-5:2", "1-3", "1-3:2,", "1-3:2;4-:2", "-3:2"};
    for (int i = 0; i < 11; i++) CHECK_STATUS(mj_k0_policy_parse(bad[i], 8, &p), MJ_ERR_INVALID_ARG);
}

int main(void) {
    uint64_t seed = test_seed(4242);
    char dir[] = "/tmp/mj-test-route-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    if (!ROUTE_TEST_GPU) {
        test_policy();
        test_compile(dir);
    }

    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_SIM;
    if (ROUTE_TEST_GPU) {
        /* The same table on a real GPU, when there is one. */
        mj_status ds = mj_cuda_load();
        if (ds != MJ_OK) {
            printf("SKIP: no CUDA device (%s); this test runs the routing table on a GPU\n", mj_last_error());
            nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
            return 77;
        }
        o.device = 0, o.backend = MJ_BACKEND_CUDA;
        CHECK_OK(mj_cuda_bind(0));
    }
    mj_context_t ctx = NULL;
    CHECK_OK(mj_context_create(&o, &ctx));
    if (!ctx) return test_finish();
    test_router(ctx, seed);

    static rcase table[512];
    int n = build_table(table), n_ok = 0;
    double t_glm = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now_ms();
        n_ok += run_case(ctx, &table[i], seed + (uint64_t)i * 7919);
        if (table[i].B == 256 && table[i].E == 256 && table[i].k == 8 && table[i].k0 < 8 && t_glm == 0)
            t_glm = now_ms() - t0;
    }
    printf("%d of %d routing cases match the reference; B=256 E=256 k=8 OEA case: %.1f ms on the %s\n",
           n_ok, n, t_glm, ROUTE_TEST_GPU ? "GPU (with copies)" : "interpreter");

    /* Refusals (checked before any memory is touched): OEA above one block, bad k0, too many
     * experts, a missing output. */
    float x[16] = {0};
    int32_t ids[8], ns[2];
    float w[8];
    mj_route_outputs out = {ids, w, ns, NULL, NULL, NULL, NULL, NULL};
    mj_route_params p = {8, 4, 2, 1, 1, MJ_SCORING_SIGMOID, 1.0f, 1};
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 257, 257, &out, NULL), MJ_ERR_UNSUPPORTED);
    p.k0 = 5;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, 2, &out, NULL), MJ_ERR_INVALID_ARG);
    p.k0 = 2, p.n_experts = 2048;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, 2, &out, NULL), MJ_ERR_UNSUPPORTED);
    p.n_experts = 8;
    out.ids = NULL;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, 2, &out, NULL), MJ_ERR_INVALID_ARG);

    mj_context_destroy(ctx);
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return test_finish();
}
