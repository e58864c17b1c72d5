/* test_route_kernels.c — the router GEMM and the OEA route kernels, run on the CPU
 * interpreter, against the CPU reference: ids, counts and the dispatch metadata bit for
 * bit, weights within 1e-6 relative, over a table of cases that forces every branch.
 * Every output starts poisoned and sits between sentinels. Also: a recorded launch
 * sequence replayed at several token counts (what a CUDA graph does), GLM-5-shaped (and
 * DeepSeek-V2-shaped: groups scored by their max) specializations compiling for sm_120a,
 * sm_90a and sm_80 with 0 spills, the knobs' cross constraints, an old caller's smaller
 * mj_route_params, and the k0 policy. Both group-score rules (GSCORE 0 and 1) run through the
 * table with every special input. With ROUTE_TEST_GPU (tests/test_route_gpu.c) the same
 * table runs on a GPU. */
#include "mj_kernels.h"
#include "plan.h"
#include "sim/sim.h"
#include "test.h"

#include <stddef.h>

#ifndef ROUTE_TEST_GPU
#define ROUTE_TEST_GPU 0
#endif

typedef struct rcase {
    int B, V, E, k, k0, ng, tg, softmax, renorm, bias;
    int special; /* 0 random, 1 ties, 2 NaN logits, 3 one expert takes every token, 4 +-inf,
                  * 5 NaNs of both signs in the logits and the bias */
    int gmax;    /* groups scored by their max (group_limited_greedy), else their top-2 sum */
} rcase;

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
    if (c->special == 5) { /* a NaN's sign bit must not move it: NaN ranks last, whichever sign */
        for (int e = 0; e < c->E; e += 3) bias[e] = mj_f32_from_bits(e % 2 ? 0xFFC00000u : 0x7FC00001u);
        for (int64_t i = 0; i < (int64_t)c->B * c->E; i += 7) /* (a NaN logit's score is NaN by v != v) */
            x[i] = mj_f32_from_bits(i % 2 ? 0xFFC00000u : 0x7FC00000u);
        /* Every 4th token has two numbers to pick (experts 1 and 2): the rest of its picks are
         * NaN scores of both signs (the bias's +NaN and -NaN, its logits' NaN), taken by id. */
        for (int b = 1; b < c->B; b += 4)
            for (int e = 0; e < c->E; e++)
                if (e % 3 && e > 2) x[(int64_t)b * c->E + e] = NAN;
    }
    if (c->special == 3)
        for (int b = 0; b < c->B; b++) x[(int64_t)b * c->E + 5] = 30.0f;
    if (c->special == 4) /* infinities: one +inf, two +inf (they share softmax's mass), -infs */
        for (int b = 0; b < c->B; b++) {
            float *r = x + (int64_t)b * c->E;
            if (b % 3 == 0) r[(b * 7) % c->E] = INFINITY;
            if (b % 3 == 1) r[1] = INFINITY, r[c->E - 1] = INFINITY;
            for (int e = 0; e < c->E; e += 5) r[e] = -INFINITY;
            if (b % 4 == 3) /* a row of -inf and NaN only: nothing to pick but NaN and -inf */
                for (int e = 0; e < c->E; e++) r[e] = e % 2 ? -INFINITY : NAN;
        }
}

/* What one routing writes, on the host. */
typedef struct routed {
    int32_t *ids, *n, *cnt, *off, *act, *perm, na;
    float *w;
    int32_t *rix;
} routed;

static routed routed_new(int B, int E, int k) {
    size_t BK = (size_t)(B ? B : 1) * (size_t)k;
    routed r = {malloc(4 * BK), malloc(4 * (size_t)(B ? B : 1)), malloc(4 * (size_t)E), malloc(4 * (size_t)(E + 1)),
                malloc(4 * (size_t)E), malloc(4 * BK), -7, malloc(4 * BK), malloc(4 * BK)};
    return r;
}
static void routed_free(routed *r) {
    free(r->ids), free(r->n), free(r->cnt), free(r->off), free(r->act), free(r->perm), free(r->w), free(r->rix);
}

/* The reference for B rows of which the first V are tokens. */
static void reference(const mj_route_params *p, const float *x, const float *bias, int B, int V, routed *r) {
    CHECK_OK(mj_route_ref(p, x, bias, B, V, r->ids, r->w, r->n, NULL));
    CHECK_OK(mj_route_dispatch_ref(r->ids, r->n, B, p->topk, p->n_experts, r->cnt, r->off, r->act, &r->na, r->perm,
                                   r->rix));
}

/* The kernel's buffers: poisoned outputs between sentinels. */
typedef struct dbufs {
    tbuf x, bias, ids, w, n, cnt, off, act, na, perm, nv, rix;
} dbufs;

static dbufs dbufs_new(int B, int E, int k) {
    size_t BK = (size_t)(B ? B : 1) * (size_t)k;
    dbufs d = {tbuf_new(4 * (size_t)(B ? B : 1) * (size_t)E, ROUTE_TEST_GPU), tbuf_new(4 * (size_t)E, ROUTE_TEST_GPU),
               tbuf_new(4 * BK, ROUTE_TEST_GPU),  tbuf_new(4 * BK, ROUTE_TEST_GPU),
               tbuf_new(4 * (size_t)(B ? B : 1), ROUTE_TEST_GPU), tbuf_new(4 * (size_t)E, ROUTE_TEST_GPU),
               tbuf_new(4 * (size_t)(E + 1), ROUTE_TEST_GPU), tbuf_new(4 * (size_t)E, ROUTE_TEST_GPU),
               tbuf_new(4, ROUTE_TEST_GPU), tbuf_new(4 * BK, ROUTE_TEST_GPU), tbuf_new(4, ROUTE_TEST_GPU),
               tbuf_new(4 * BK, ROUTE_TEST_GPU)};
    return d;
}

static void dbufs_poison(dbufs *d) {
    tbuf *outs[] = {&d->ids, &d->w, &d->n, &d->cnt, &d->off, &d->act, &d->na, &d->perm, &d->rix};
    for (int i = 0; i < 9; i++) tbuf_poison(outs[i], 0x55); /* int 0x55555555, float 1.5e13 */
}

static void dbufs_free(dbufs *d) {
    tbuf *all[] = {&d->x, &d->bias, &d->ids, &d->w, &d->n, &d->cnt, &d->off, &d->act, &d->na, &d->perm, &d->nv, &d->rix};
    for (int i = 0; i < 12; i++) tbuf_free(all[i]);
}

static mj_route_outputs dbufs_outputs(dbufs *d) {
    mj_route_outputs o = MJ_ROUTE_OUTPUTS_INIT;
    o.ids = d->ids.p, o.weights = d->w.p, o.n_sel = d->n.p, o.expert_counts = d->cnt.p;
    o.expert_offsets = d->off.p, o.active_experts = d->act.p, o.n_active = d->na.p, o.permutation = d->perm.p;
    o.row_index = d->rix.p;
    return o;
}

/* Read the kernel's outputs (checking every sentinel) and compare them with the reference. */
static void compare(dbufs *d, const routed *want, int B, int E, int k) {
    routed got = routed_new(B, E, k);
    tbuf_get(&d->ids, got.ids, "ids");
    tbuf_get(&d->w, got.w, "weights");
    tbuf_get(&d->n, got.n, "n_sel");
    tbuf_get(&d->cnt, got.cnt, "expert_counts");
    tbuf_get(&d->off, got.off, "expert_offsets");
    tbuf_get(&d->act, got.act, "active_experts");
    tbuf_get(&d->na, &got.na, "n_active");
    tbuf_get(&d->perm, got.perm, "permutation");
    tbuf_get(&d->rix, got.rix, "row_index");
    CHECK(!memcmp(got.n, want->n, 4 * (size_t)B), "n_sel differs");
    CHECK(!memcmp(got.ids, want->ids, 4 * (size_t)B * k), "ids differ");
    CHECK(!memcmp(got.cnt, want->cnt, 4 * (size_t)E), "counts differ");
    CHECK(!memcmp(got.off, want->off, 4 * (size_t)(E + 1)), "offsets differ");
    CHECK(!memcmp(got.act, want->act, 4 * (size_t)E) && got.na == want->na, "active experts differ (%d vs %d)",
          got.na, want->na);
    CHECK(!memcmp(got.perm, want->perm, 4 * (size_t)B * k), "permutation differs");
    CHECK(!memcmp(got.rix, want->rix, 4 * (size_t)B * k), "row_index differs");
    int bad_w = 0;
    for (int i = 0; i < B * k; i++) {
        double df = fabs((double)got.w[i] - want->w[i]), m = fabs((double)want->w[i]);
        if (df > 1e-6 * m + 1e-30 || isnan(got.w[i])) bad_w++;
    }
    CHECK(bad_w == 0, "%d weights off by more than 1e-6 relative", bad_w);
    routed_free(&got);
}

static mj_route_params params_of(const rcase *c) {
    mj_route_params p = MJ_ROUTE_PARAMS_INIT;
    p.n_experts = c->E, p.topk = c->k, p.k0 = c->k0, p.n_group = c->ng, p.topk_group = c->tg;
    p.scoring = c->softmax ? MJ_SCORING_SOFTMAX : MJ_SCORING_SIGMOID;
    p.routed_scaling_factor = 2.5f, p.renormalize = c->renorm;
    p.group_score = c->gmax ? MJ_GROUP_SCORE_MAX : MJ_GROUP_SCORE_TOP2_SUM;
    return p;
}

/* One case on the backend of ctx. The count goes through device memory, or (every other
 * case with no padding) as NULL: all rows valid. Returns 1 if it matched. */
static int run_case(mj_context_t ctx, const rcase *c, uint64_t seed, int case_index) {
    const int B = c->B, E = c->E, k = c->k;
    uint64_t rng = seed;
    float *x = malloc(sizeof(float) * (size_t)((B ? B : 1) * E)), *bias = malloc(sizeof(float) * (size_t)E);
    fill_logits(c, &rng, x, bias);
    mj_route_params p = params_of(c);
    int before = g_fail;
    routed want = routed_new(B, E, k);
    reference(&p, x, c->bias ? bias : NULL, B, c->V, &want);
    dbufs d = dbufs_new(B, E, k);
    tbuf_put(&d.x, x, sizeof(float) * (size_t)B * E);
    tbuf_put(&d.bias, bias, sizeof(float) * (size_t)E);
    int32_t nv = c->V;
    tbuf_put(&d.nv, &nv, 4);
    dbufs_poison(&d);
    mj_route_outputs o = dbufs_outputs(&d);
    const int32_t *count = (c->V == B && case_index % 2) ? NULL : d.nv.p;
    CHECK_OK(mj_route(ctx, &p, d.x.p, c->bias ? d.bias.p : NULL, B, count, &o, NULL));
    if (g_fail == before) compare(&d, &want, B, E, k);
    tbuf_get(&d.x, NULL, "logits");
    dbufs_free(&d);
    int ok = g_fail == before;
    if (!ok)
        fprintf(stderr, "  case B=%d valid=%d E=%d k=%d k0=%d groups=%d/%d (%s) %s renorm=%d bias=%d special=%d "
                "seed=%llu\n",
                c->B, c->V, c->E, c->k, c->k0, c->ng, c->tg, c->gmax ? "max" : "top-2 sum",
                c->softmax ? "softmax" : "sigmoid", c->renorm, c->bias, c->special, (unsigned long long)seed);
    routed_free(&want);
    free(x), free(bias);
    return ok;
}

/* The table: every B, E and k of the brief, every k0 for some, groups, scorings, renorm,
 * padding, ties, NaN, infinities, one hot expert, one expert a group, the smallest warp
 * counts, the multi-block path with its grid both capped and not. */
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
                    rcase c = {B, B, E, k, k0s[j], 1, 1, (idx % 5) == 3, (idx % 4) != 1, (idx % 3) != 2, 0, 0};
                    if (E >= 64 && (idx % 6) == 0) /* group limit, the two rules in turn */
                        c.ng = 8, c.tg = k > 2 ? 3 : 2, c.gmax = (idx / 6) % 2;
                    if (idx % 7 == 4 && B > 1) c.V = B - B / 3 - 1;                  /* padding */
                    t[n++] = c;
                }
            }
    /* Every k0 for one shape, and the special inputs. */
    for (int k0 = 1; k0 <= 8; k0++) t[n++] = (rcase){16, 13, 256, 8, k0, 1, 1, 0, 1, 1, 0, 0};
    for (int k0 = 1; k0 <= 8; k0 += 3) t[n++] = (rcase){16, 16, 64, 8, k0, 8, 4, 1, 1, 1, 0, 0};
    for (int sp = 1; sp <= 4; sp++) {
        t[n++] = (rcase){32, 30, 256, 8, 3, 1, 1, 0, 1, 1, sp, 0};
        t[n++] = (rcase){32, 32, 64, 6, 6, 4, 2, 1, 1, 0, sp, 0};
        t[n++] = (rcase){32, 31, 64, 6, 3, 4, 2, 1, 1, 0, sp, 1};  /* max rule, softmax, OEA */
        t[n++] = (rcase){32, 32, 64, 6, 6, 8, 3, 0, 1, 1, sp, 1};  /* max rule, sigmoid + bias */
        t[n++] = (rcase){300, 300, 256, 8, 8, 1, 1, 0, 1, 1, sp, 0};
        t[n++] = (rcase){300, 290, 256, 8, 8, 8, 4, 1, 0, 0, sp, 1}; /* max rule, multi-block */
    }
    /* DeepSeek-V2's router (160 experts in 8 groups, keep 3, top-6, softmax, no renorm), OEA. */
    t[n++] = (rcase){64, 61, 160, 6, 2, 8, 3, 1, 0, 0, 0, 1};
    t[n++] = (rcase){24, 24, 64, 4, 2, 1, 1, 1, 1, 0, 4, 0};   /* infinities under softmax, OEA */
    t[n++] = (rcase){24, 20, 64, 4, 4, 1, 1, 0, 0, 1, 4, 0};   /* infinities under sigmoid */
    t[n++] = (rcase){12, 12, 8, 3, 2, 8, 4, 0, 1, 1, 0, 0};    /* one expert a group */
    t[n++] = (rcase){12, 10, 32, 4, 4, 32, 8, 1, 1, 1, 0, 0};  /* one expert a group, 32 groups */
    t[n++] = (rcase){12, 10, 32, 4, 4, 32, 8, 1, 1, 1, 0, 1};  /* the same under the max rule */
    t[n++] = (rcase){32, 30, 96, 4, 2, 6, 2, 0, 1, 1, 0, 0};   /* 6 groups: not a divisor of 32 */
    t[n++] = (rcase){32, 32, 96, 4, 4, 6, 2, 1, 1, 0, 1, 1};   /* the same, ties, the max rule */
    t[n++] = (rcase){32, 32, 384, 8, 3, 8, 4, 1, 1, 1, 1, 0};  /* 4 lanes a group of 48, ties */
    t[n++] = (rcase){32, 32, 384, 8, 3, 8, 4, 0, 1, 1, 2, 0};  /* the same, NaN logits */
    t[n++] = (rcase){32, 31, 256, 8, 4, 1, 1, 0, 1, 1, 5, 0};  /* NaNs of both signs, GLM-5's shape */
    t[n++] = (rcase){32, 32, 384, 8, 3, 8, 4, 1, 1, 1, 5, 0};  /* the same under softmax and groups */
    t[n++] = (rcase){32, 32, 64, 6, 6, 8, 3, 0, 1, 1, 5, 1};   /* and under the max rule */
    t[n++] = (rcase){64, 60, 1024, 16, 8, 1, 1, 0, 1, 1, 0, 0}; /* big E and k: 8 warps, not 32 */
    t[n++] = (rcase){256, 256, 1024, 16, 5, 32, 8, 0, 1, 1, 0, 0}; /* and B = 256: 8 warps */
    t[n++] = (rcase){256, 250, 1024, 16, 5, 32, 8, 0, 1, 1, 0, 1}; /* max rule, 8 warps */
    t[n++] = (rcase){600, 599, 1024, 16, 16, 1, 1, 1, 1, 1, 0, 0}; /* multi-block, 8 warps */
    t[n++] = (rcase){16, 0, 64, 4, 2, 1, 1, 0, 1, 1, 0, 0}; /* all padding */
    t[n++] = (rcase){0, 0, 64, 4, 2, 1, 1, 0, 1, 1, 0, 0};  /* empty batch */
    return n;
}

/* Whether ctx has already built the oea_route specialization with these knobs (a lookup
 * that is a hit in its in-memory table). */
static int built(mj_context_t ctx, mj_knobs_oea_route kn) {
    mj_jit_stats a, b;
    mj_spec s;
    const mj_function *f;
    mj_context_stats(ctx, &a);
    mj_spec_oea_route(ctx, &kn, &s);
    if (mj_jit_get(ctx, &s, &f) != MJ_OK) return 0;
    mj_context_stats(ctx, &b);
    return b.mem_misses == a.mem_misses;
}

static void test_branches_reached(mj_context_t ctx) {
    /* The cases above reached the warp counts the shared-memory budget cuts to, 32 warps
     * (one a token) and the grid cap. */
    mj_knobs_oea_route w8 = {.E = 1024, .K = 16, .K0 = 8, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 8};
    mj_knobs_oea_route w8g = {.E = 1024, .K = 16, .K0 = 5, .NG = 32, .TG = 8, .SCORING = 0, .RENORM = 1, .NWARPS = 8};
    mj_knobs_oea_route w8max = w8g, v2 = {.E = 160, .K = 6, .K0 = 2, .NG = 8, .TG = 3, .GSCORE = 1, .SCORING = 1,
                                          .RENORM = 0, .NWARPS = 32}; /* past 16 tokens: 32 warps */
    mj_knobs_oea_route w32 = {.E = 256, .K = 8, .K0 = 3, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 32};
    w8max.GSCORE = 1;
    CHECK(built(ctx, w8), "the 8-warp route kernel of E 1024, k 16 was not reached");
    CHECK(built(ctx, w8g), "the 8-warp grouped route kernel of E 1024 was not reached");
    CHECK(built(ctx, w8max), "the 8-warp max-rule route kernel was not reached");
    CHECK(built(ctx, v2), "the DeepSeek-V2 OEA route kernel (GSCORE 1) was not reached");
    CHECK(built(ctx, w32), "the 32-warp OEA route kernel of GLM-5's shape was not reached");
    int32_t cap = mj_context_max_blocks(ctx);
    CHECK((1024 + 7) / 8 > cap && (257 + 7) / 8 <= cap,
          "B = 1024 must exceed the grid cap (%d blocks) and B = 257 stay under it", cap);
}

/* One launch sequence recorded, then replayed with new counts written to the same device
 * int: each replay routes exactly that many tokens. (The interpreter's recording is what a
 * CUDA graph is on a GPU: same kernels, same argument values, new data.) */
static void test_replay(mj_context_t ctx, uint64_t seed) {
    static const rcase shapes[] = {{16, 16, 64, 6, 2, 1, 1, 0, 1, 1, 0, 0}, {300, 300, 64, 4, 4, 1, 1, 0, 1, 1, 0, 0}};
    for (int si = 0; si < 2; si++) {
        const rcase *c = &shapes[si];
        uint64_t rng = seed + 99 + (uint64_t)si;
        float *x = malloc(sizeof(float) * (size_t)c->B * c->E), *bias = malloc(sizeof(float) * (size_t)c->E);
        fill_logits(c, &rng, x, bias);
        mj_route_params p = params_of(c);
        dbufs d = dbufs_new(c->B, c->E, c->k);
        tbuf_put(&d.x, x, sizeof(float) * (size_t)c->B * c->E);
        tbuf_put(&d.bias, bias, sizeof(float) * (size_t)c->E);
        mj_route_outputs o = dbufs_outputs(&d);
        int32_t nv = c->B;
        tbuf_put(&d.nv, &nv, 4);
        mj_sim_graph *g = NULL;
        CHECK_OK(mj_route(ctx, &p, d.x.p, d.bias.p, c->B, d.nv.p, &o, NULL)); /* compiles: not in the graph */
        CHECK_OK(mj_sim_capture_begin(ctx));
        CHECK_OK(mj_route(ctx, &p, d.x.p, d.bias.p, c->B, d.nv.p, &o, NULL));
        CHECK_OK(mj_sim_capture_end(ctx, &g));
        CHECK(mj_sim_graph_launches(g) == (si ? 2 : 1), "recorded %d launches", mj_sim_graph_launches(g));
        const int32_t counts[] = {c->B, c->B - 3, 1, 0, c->B + 5, -2, 7};
        for (int i = 0; i < 7; i++) {
            nv = counts[i];
            int V = nv < 0 ? 0 : nv > c->B ? c->B : nv;
            tbuf_put(&d.nv, &nv, 4);
            dbufs_poison(&d);
            CHECK_OK(mj_sim_graph_replay(g));
            routed want = routed_new(c->B, c->E, c->k);
            reference(&p, x, bias, c->B, V, &want);
            int before = g_fail;
            compare(&d, &want, c->B, c->E, c->k);
            if (g_fail != before) fprintf(stderr, "  replay B=%d with count %d\n", c->B, nv);
            routed_free(&want);
        }
        mj_sim_graph_free(g);
        dbufs_free(&d);
        free(x), free(bias);
    }
}

/* The dispatch of ids given (mj_route_dispatch: what mj_experts_forward_topk launches on an
 * engine's top-k) against the reference: empty slots after a token's picks, an expert twice
 * in one token (each entry gets a row of its own, in slot order), one expert in every token,
 * and batches past one chunk of the rank step (256 entries at 8 warps and more) up to many
 * chunks, so the bases carry over. */
static void test_dispatch(mj_context_t ctx, uint64_t seed) {
    /* B x k <= 32 takes the kernel's short dispatch (warp 0's sort): 1 x 8, 4 x 8 (32, its
     * edge), 2 x 16 at E 1024, 5 x 6 over 8 experts (most of them twice), 3 x 4 */
    static const int shapes[][3] = {{1, 8, 256},   {7, 8, 8},     {33, 8, 256}, {32, 8, 256},
                                    {100, 16, 64}, {700, 6, 256}, {2000, 1, 8}, {90, 16, 1024},
                                    {4, 8, 256},   {2, 16, 1024}, {5, 6, 8},    {3, 4, 64}};
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        const int B = shapes[si][0], k = shapes[si][1], E = shapes[si][2];
        uint64_t rng = seed + 31 * (uint64_t)si;
        routed want = routed_new(B, E, k);
        for (int b = 0; b < B; b++) {
            const int n = B * k == 32 ? k : (int)(mj_rng_next(&rng) % (uint64_t)(k + 1)); /* 32: all routed */
            want.n[b] = n;
            for (int j = 0; j < k; j++) {
                /* Where all 32 are routed, every expert below E - 1: expert E - 1's offset is then
                 * past all 32 rows (the short dispatch's last lower-bound step), whatever the seed. */
                int e = (int)(mj_rng_next(&rng) % (uint64_t)(B * k == 32 ? E - 1 : E));
                if (j > 0 && mj_rng_uniform(&rng) < 0.2) e = want.ids[b * k + j - 1]; /* twice in a token */
                if (b % 5 == 0 && j == 0 && B * k != 32) e = E - 1;                   /* a hot expert */
                want.ids[b * k + j] = j < n ? e : -1;
            }
        }
        CHECK_OK(mj_route_dispatch_ref(want.ids, want.n, B, k, E, want.cnt, want.off, want.act, &want.na, want.perm,
                                       want.rix));
        dbufs d = dbufs_new(B, E, k);
        dbufs_poison(&d);
        tbuf_put(&d.ids, want.ids, 4 * (size_t)B * k);
        mj_route_outputs o = dbufs_outputs(&d);
        CHECK_OK(mj_route_dispatch(ctx, d.ids.p, B, k, E, &o, NULL));
        routed got = routed_new(B, E, k);
        tbuf_get(&d.cnt, got.cnt, "expert_counts");
        tbuf_get(&d.off, got.off, "expert_offsets");
        tbuf_get(&d.act, got.act, "active_experts");
        tbuf_get(&d.na, &got.na, "n_active");
        tbuf_get(&d.perm, got.perm, "permutation");
        tbuf_get(&d.rix, got.rix, "row_index");
        const int before = g_fail;
        CHECK(!memcmp(got.cnt, want.cnt, 4 * (size_t)E), "counts differ");
        CHECK(!memcmp(got.off, want.off, 4 * (size_t)(E + 1)), "offsets differ");
        CHECK(!memcmp(got.act, want.act, 4 * (size_t)E) && got.na == want.na, "active experts differ");
        CHECK(!memcmp(got.perm, want.perm, 4 * (size_t)B * k), "permutation differs");
        CHECK(!memcmp(got.rix, want.rix, 4 * (size_t)B * k), "row_index differs");
        if (g_fail != before) fprintf(stderr, "  dispatch B=%d k=%d E=%d seed=%llu\n", B, k, E, (unsigned long long)seed);
        routed_free(&got);
        routed_free(&want);
        dbufs_free(&d);
    }
}

/* ---- the router GEMM ---------------------------------------------------------------------
 * Against an fp64 reference: every (ROWS, NWARPS) specialization the launcher picks, each
 * reached through mj_router_gemm (and checked to have been built), tiles past 64 rows, rows
 * that do not split evenly into groups, chunks that do not split evenly over the threads.
 * On the interpreter also the gate bytes one call streams: E*H*2 per 64-row tile, so once
 * for B <= 64. */
static int router_check(const uint16_t *x, const uint16_t *g, const float *y, int B, int H, int E, const char *what) {
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int e = 0; e < E; e++) {
            double acc = 0, mag = 0;
            for (int h = 0; h < H; h++) {
                double p = (double)mj_bf16_to_f32(x[(size_t)b * H + h]) * mj_bf16_to_f32(g[(size_t)e * H + h]);
                acc += p, mag += fabs(p);
            }
            float v = y[(size_t)b * E + e];
            if (!(fabs(v - acc) <= 1e-5 * mag + 1e-7)) bad++;
        }
    CHECK(bad == 0, "router %s B=%d H=%d E=%d: %d logits off", what, B, H, E, bad);
    return bad == 0;
}

typedef struct router_data {
    int B, H, E;
    uint16_t *x, *g;
    float *y;
    size_t ws_bytes;
    tbuf dx, dg, dy, dw;
} router_data;

static router_data router_data_new(int B, int H, int E, uint64_t seed) {
    router_data r = {B, H, E, malloc(2 * (size_t)B * H), malloc(2 * (size_t)E * H), malloc(4 * (size_t)B * E), 0,
                     tbuf_new(2 * (size_t)B * H, ROUTE_TEST_GPU), tbuf_new(2 * (size_t)E * H, ROUTE_TEST_GPU),
                     tbuf_new(4 * (size_t)B * E, ROUTE_TEST_GPU), {0}};
    CHECK_OK(mj_router_gemm_workspace(B, H, E, &r.ws_bytes));
    r.dw = tbuf_new(r.ws_bytes ? r.ws_bytes : 16, ROUTE_TEST_GPU);
    tbuf_poison(&r.dw, 0); /* zeroed once, as the API asks */
    printf("router data B=%d H=%d E=%d seed %llu\n", B, H, E, (unsigned long long)seed);
    uint64_t rng = seed;
    for (size_t i = 0; i < (size_t)B * H; i++) r.x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
    for (size_t i = 0; i < (size_t)E * H; i++) r.g[i] = mj_f32_to_bf16((float)(mj_rng_normal(&rng) * 0.02));
    tbuf_put(&r.dx, r.x, 2 * (size_t)B * H);
    tbuf_put(&r.dg, r.g, 2 * (size_t)E * H);
    return r;
}

static void router_data_free(router_data *r) {
    tbuf_free(&r->dx), tbuf_free(&r->dg), tbuf_free(&r->dy), tbuf_free(&r->dw);
    free(r->x), free(r->g), free(r->y);
}

/* mj_router_gemm into poisoned logits, checked against the reference; the workspace's
 * counters back at 0 after it (the next launch's start), nothing written past its end. */
static int router_run(mj_context_t ctx, router_data *r, const char *what) {
    tbuf_poison(&r->dy, 0x55);
    CHECK_OK(mj_router_gemm(ctx, r->dx.p, r->dg.p, r->B, r->H, r->E, r->dy.p, r->ws_bytes ? r->dw.p : NULL,
                            r->ws_bytes, NULL));
    if (!tbuf_get(&r->dy, r->y, "logits")) return 0;
    mj_knobs_router_gemm kn;
    mj_router_dims d;
    mj_router_knobs(r->H, r->E, r->B, &kn);
    mj_router_grid(&kn, r->B, &d);
    uint32_t *ws = malloc(r->dw.bytes);
    int zero = tbuf_get(&r->dw, ws, "router workspace");
    for (size_t i = 0; zero && i < d.count_bytes / 4; i++) zero = ws[i] == 0;
    free(ws);
    CHECK(zero, "router %s B=%d H=%d E=%d: the workspace's counters are not back at 0", what, r->B, r->H, r->E);
    return router_check(r->x, r->g, r->y, r->B, r->H, r->E, what) && zero;
}

/* Whether ctx has built this router_gemm specialization (a hit in its in-memory table). */
static int router_built(mj_context_t ctx, int H, int E, int rows, int nwarps) {
    mj_knobs_router_gemm kn = {.H = H, .E = E, .ROWS = rows, .NWARPS = nwarps};
    mj_jit_stats a, b;
    mj_spec s;
    const mj_function *f;
    mj_context_stats(ctx, &a);
    mj_spec_router_gemm(ctx, &kn, &s);
    if (mj_jit_get(ctx, &s, &f) != MJ_OK) return 0;
    mj_context_stats(ctx, &b);
    return b.mem_misses == a.mem_misses;
}

/* The launch shape the runtime picks: H split over blocks at decode (GLM-5: 12 parts of 4
 * runs, 192 blocks), not once the row tiles alone fill the grid; the workspace sized for
 * the largest need of any B up to the one asked. */
static void test_router_grid(void) {
    mj_knobs_router_gemm kn;
    mj_router_dims d;
    mj_router_knobs(6144, 256, 1, &kn);
    mj_router_grid(&kn, 1, &d);
    CHECK(kn.ROWS == 8 && kn.NWARPS == 4 && d.et == 16 && d.ks == 12 && d.rt == 1,
          "GLM-5 B=1: ROWS %d NWARPS %d grid %d x %d x %d, want 8 4 16 x 12 x 1", kn.ROWS, kn.NWARPS, d.et, d.ks, d.rt);
    CHECK(d.part_bytes == 16u * 12 * 8 * 16 * 4 && d.count_bytes == 16u * 4, "GLM-5 B=1: %zu part bytes, %zu count bytes",
          d.part_bytes, d.count_bytes);
    mj_router_knobs(6144, 256, 64, &kn);
    mj_router_grid(&kn, 64, &d);
    CHECK(kn.ROWS == 64 && d.ks == 12 && d.rt == 1, "GLM-5 B=64: ROWS %d, %d parts, %d row tiles", kn.ROWS, d.ks, d.rt);
    mj_router_knobs(6144, 256, 4096, &kn);
    mj_router_grid(&kn, 4096, &d);
    CHECK(d.ks == 1 && d.rt == 64 && d.part_bytes == 0 && d.count_bytes == 0, "B=4096: %d parts, %d row tiles",
          d.ks, d.rt);
    /* a short row: one warp, one part */
    mj_router_knobs(64, 8, 3, &kn);
    mj_router_grid(&kn, 3, &d);
    CHECK(kn.NWARPS == 1 && d.ks == 1 && d.et == 1, "H=64 E=8: NWARPS %d, %d parts", kn.NWARPS, d.ks);
    /* A split launch's counters fit the workspace's fixed counter region (256 of them), for
     * every B and every tile count, so no B's counters reach another B's partial sums. */
    static const int Es[] = {8, 16, 40, 256, 1024};
    int most = 0;
    for (int ei = 0; ei < 5; ei++)
        for (int b = 1; b <= 20000; b += b < 600 ? 1 : 37) {
            mj_router_knobs(6144, Es[ei], b, &kn);
            mj_router_grid(&kn, b, &d);
            if (d.ks > 1 && (int)d.count_bytes > most) most = (int)d.count_bytes;
        }
    CHECK(most > 0 && most <= 256 * 4, "a split launch's counters take %d bytes, past the 1024 of their region", most);
    size_t w1 = 0, w64 = 0, wbig = 0;
    CHECK_OK(mj_router_gemm_workspace(1, 6144, 256, &w1));
    CHECK_OK(mj_router_gemm_workspace(64, 6144, 256, &w64));
    CHECK_OK(mj_router_gemm_workspace(100000, 6144, 256, &wbig));
    CHECK(w1 >= 16 * 4 + 16u * 12 * 8 * 16 * 4 && w64 >= w1 && wbig >= w64 && wbig < (4u << 20),
          "workspace bytes B<=1 %zu, B<=64 %zu, B<=100000 %zu", w1, w64, wbig);
    size_t w = 0;
    CHECK_OK(mj_router_gemm_workspace(1, 64, 8, &w));
    CHECK(w == 0, "H=64 E=8 B=1: %zu workspace bytes, want 0 (one part)", w);
    CHECK_STATUS(mj_router_gemm_workspace(1, 100, 8, &w), MJ_ERR_UNSUPPORTED);
    CHECK_STATUS(mj_router_gemm_workspace(1, 6144, 256, NULL), MJ_ERR_INVALID_ARG);
}

static void test_router(mj_context_t ctx, uint64_t seed) {
    /* The launcher's choices: NWARPS 1, 2, 4 for these H (runs of 128 k: 1, 2, 8, 48),
     * ROWS 8, 16, 32, 64 for these B (the fewest groups of 8 that hold B, at most 64;
     * B = 70 is two tiles, the second of 6 rows). */
    static const int Hs[4] = {64, 256, 1024, 6144}, Ws[4] = {1, 2, 4, 4};
    static const int Bs[5] = {1, 9, 20, 33, 70}, Rs[5] = {8, 16, 32, 64, 64};
    for (int hi = 0; hi < 4; hi++)
        for (int bi = 0; bi < 5; bi++) {
            router_data r = router_data_new(Bs[bi], Hs[hi], 5 + 3 * hi + bi, seed + (uint64_t)(hi * 5 + bi));
            router_run(ctx, &r, "launcher grid");
            if (!ROUTE_TEST_GPU)
                CHECK(router_built(ctx, Hs[hi], r.E, Rs[bi], Ws[hi]), "B=%d H=%d did not run ROWS=%d NWARPS=%d",
                      Bs[bi], Hs[hi], Rs[bi], Ws[hi]);
            router_data_free(&r);
        }
    /* Uneven shapes: experts that do not fill a tile of 16 (3, 21, 40); a row whose last
     * run is short (320 = 2.5 runs; 9600 = 75 runs over 12 parts: the last part shorter);
     * row tiles past the first (B 65: a second tile of 1 row; 130: 3 tiles); the widest
     * row; every expert tile's counter in use. */
    static const int odd[][3] = {{65, 320, 21}, {130, 9600, 3}, {64, 448, 40}, {9, 16384, 2}, {2, 6144, 1024}};
    for (int i = 0; i < 5; i++) {
        router_data r = router_data_new(odd[i][0], odd[i][1], odd[i][2], seed + 50 + (uint64_t)i);
        router_run(ctx, &r, "uneven");
        router_data_free(&r);
    }
    if (!ROUTE_TEST_GPU) {
        /* Gate bytes through the counted stream: exactly E*H*2 for B = 1, 8, 64 at GLM-5's
         * shape, ceil(B / 64) times that above; the logits right each time. */
        static const int glm_B[] = {1, 8, 64};
        mj_sim_stream_bytes_take();
        for (int i = 0; i < 3; i++) {
            router_data r = router_data_new(glm_B[i], 6144, 256, seed + 60 + (uint64_t)i);
            (void)mj_sim_stream_bytes_take();
            router_run(ctx, &r, "GLM-5");
            unsigned long long n = mj_sim_stream_bytes_take();
            CHECK(n == 256ull * 6144 * 2, "GLM-5 B=%d: %llu gate bytes streamed, want %llu (once)", glm_B[i], n,
                  256ull * 6144 * 2);
            printf("router GEMM GLM-5 B=%d: %llu gate bytes streamed (E*H*2 = %llu)\n", glm_B[i], n, 256ull * 6144 * 2);
            router_data_free(&r);
        }
        static const int big_B[] = {65, 128, 200};
        for (int i = 0; i < 3; i++) {
            router_data r = router_data_new(big_B[i], 512, 64, seed + 70 + (uint64_t)i);
            (void)mj_sim_stream_bytes_take();
            router_run(ctx, &r, "tiles");
            unsigned long long n = mj_sim_stream_bytes_take(), want = (unsigned long long)((big_B[i] + 63) / 64) * 64 * 512 * 2;
            CHECK(n == want, "B=%d: %llu gate bytes streamed, want %llu (once per 64-row tile)", big_B[i], n, want);
            router_data_free(&r);
        }
    }
    /* Same inputs, same bits: a second call (a fresh launch, on the counters the first left)
     * writes the same logits; H split over 12 parts. */
    {
        router_data r = router_data_new(33, 6144, 16, seed + 80);
        mj_knobs_router_gemm kn;
        mj_router_dims d;
        mj_router_knobs(r.H, r.E, r.B, &kn);
        mj_router_grid(&kn, r.B, &d);
        CHECK(d.ks == 12, "B=33 H=6144 E=16: %d parts, want 12", d.ks);
        router_run(ctx, &r, "determinism");
        float *y1 = malloc(4 * (size_t)33 * 16);
        memcpy(y1, r.y, 4 * (size_t)33 * 16);
        router_run(ctx, &r, "determinism");
        CHECK(!memcmp(y1, r.y, 4 * (size_t)33 * 16), "two calls on the same inputs differ");
        free(y1);
        /* A workspace missing, too small or misaligned is refused, naming what to do. */
        float *dy = r.dy.p;
        CHECK_STATUS(mj_router_gemm(ctx, r.dx.p, r.dg.p, r.B, r.H, r.E, dy, NULL, 0, NULL), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "mj_router_gemm_workspace") != NULL, "%s", mj_last_error());
        CHECK_STATUS(mj_router_gemm(ctx, r.dx.p, r.dg.p, r.B, r.H, r.E, dy, r.dw.p, r.ws_bytes - 4, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK_STATUS(mj_router_gemm(ctx, r.dx.p, r.dg.p, r.B, r.H, r.E, dy, (uint8_t *)r.dw.p + 4, r.ws_bytes, NULL),
                     MJ_ERR_INVALID_ARG);
        router_data_free(&r);
    }
    /* One workspace for every B up to its size, in any order (what a layer does): B 8 (one
     * row tile), then 100 (two), then 8 again. The counters of a launch with more row tiles
     * must not lie where a smaller B's partial sums were left. */
    {
        router_data big = router_data_new(100, 6144, 256, seed + 90), small = router_data_new(8, 6144, 256, seed + 91);
        tbuf_free(&small.dw), small.dw = big.dw, small.ws_bytes = big.ws_bytes; /* big's workspace for both */
        router_run(ctx, &small, "mixed B, first");
        router_run(ctx, &big, "mixed B, after a smaller B");
        router_run(ctx, &small, "mixed B, after a larger B");
        small.dw = (tbuf){0};
        router_data_free(&small), router_data_free(&big);
    }
    uint16_t dummy[16] __attribute__((aligned(16))) = {0};
    float out[16];
    CHECK_STATUS(mj_router_gemm(ctx, dummy, dummy, 1, 100, 8, out, NULL, 0, NULL), MJ_ERR_UNSUPPORTED);
    CHECK_STATUS(mj_router_gemm(ctx, dummy + 1, dummy, 1, 64, 1, out, NULL, 0, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "16-byte aligned") != NULL, "%s", mj_last_error());
}

/* Spec s rendered and compiled by NVRTC for its target, without the cache (its PTX and
 * cubin): 1 when it compiled. */
static int compile_spec(const mj_spec *s, mj_compile_result *cr) {
    char *src = NULL;
    memset(cr, 0, sizeof *cr);
    CHECK_OK(mj_render(s, &src, NULL));
    if (!src) return 0;
    CHECK_OK(mj_nvrtc_compile(src, mj_template_at(s->tpl)->name, s->target, cr));
    free(src);
    return cr->ptx != NULL;
}

/* oea_route's dynamic shared memory follows its static arrays (4 E + 256 bytes: E 9 ends them
 * 4 bytes past a 16-byte line) and its dispatch zeroes the masks in 16-byte stores: the PTX
 * declares the dynamic area 16-byte aligned (NVVM's default for an extern shared array, which
 * MJ_DYNAMIC_SHARED also asks for), so the GPU places it on a 16-byte boundary whatever E is.
 * The interpreter's allocation is aligned anyway, so only the declaration can be checked
 * here. */
static void test_route_dyn_align(mj_context_t c, const char *target) {
    mj_knobs_oea_route kn = {.E = 9, .K = 2, .K0 = 2, .NG = 1, .TG = 1, .NWARPS = 2};
    mj_spec s;
    mj_compile_result cr;
    mj_spec_oea_route(c, &kn, &s);
    const int ok = compile_spec(&s, &cr);
    CHECK(ok && strstr(cr.ptx, ".extern .shared .align 16 .b8 sm_dyn[]"),
          "oea_route E=9 on %s: the dynamic shared memory declared 16-byte aligned in the PTX", target);
    mj_compile_result_free(&cr);
}

/* The router GEMM's SASS (nvdisasm, which scripts/setup.sh installs): every global load
 * of the hot loop is 16 bytes wide (the 4-byte ones are the last block's parts), the gate's
 * are the non-coherent no-allocate stream, two a chunk of a run (8), and a chunk is 2 bf16
 * MMAs a token group (8 MMAs at ROWS 8). */
static void test_router_sass(mj_context_t c, const char *target) {
    mj_knobs_router_gemm rg = {.H = 6144, .E = 256, .ROWS = 8, .NWARPS = 4};
    mj_spec s;
    mj_compile_result cr;
    mj_spec_router_gemm(c, &rg, &s);
    compile_spec(&s, &cr);
    char *dir = test_tmpdir("sass"), path[600], cmd[800], line[512];
    if (!dir || !cr.cubin) {
        mj_compile_result_free(&cr);
        free(dir);
        return;
    }
    snprintf(path, sizeof path, "%s/router_gemm.cubin", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(cr.cubin, 1, cr.cubin_len, f) == cr.cubin_len, "writing %s", path);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd,
             "PATH=\"$PATH:/usr/local/cuda/bin\" nvdisasm -c '%s' 2>&1 || echo 'nvdisasm failed (scripts/setup.sh "
             "installs it)'",
             path);
    FILE *p = popen(cmd, "r");
    int ldg = 0, ldg128 = 0, ldg32 = 0, stream = 0, mma = 0, lines = 0;
    while (p && fgets(line, sizeof line, p)) {
        lines++;
        mma += strstr(line, "HMMA.16816.F32.BF16") != NULL;
        const char *l = strstr(line, "LDG");
        if (!l) continue;
        ldg++;
        ldg128 += strstr(l, ".128") != NULL;
        ldg32 += strstr(l, ".STRONG.GPU") != NULL; /* ld.global.cg: the parts */
        stream += strstr(l, ".128.CONSTANT") != NULL && strstr(l, ".NA") != NULL;
    }
    if (p) pclose(p);
    CHECK(ldg > 0 && ldg == ldg128 + ldg32 && ldg32 > 0,
          "router_gemm on %s: %d of %d global loads are 128-bit, %d the parts' (%d lines of SASS)", target, ldg128,
          ldg, ldg32, lines);
    CHECK(stream == 8, "router_gemm on %s: %d gate stream loads (LDG.E.NA.128.CONSTANT), want 8", target, stream);
    CHECK(mma == 8, "router_gemm on %s: %d bf16 MMAs, want 8 (4 chunks, 1 token group)", target, mma);
    printf("router_gemm H=6144 ROWS=8 NWARPS=4 SASS on %s: %d global loads, %d of them 128-bit, %d the gate "
           "stream; %d MMAs\n", target, ldg, ldg128, stream, mma);
    mj_compile_result_free(&cr);
    test_rm_rf(dir);
    free(dir);
}

/* GLM-5-shaped kernels compile for the three reference targets with 0 spills, and so do the
 * max-rule ones (GSCORE 1): DeepSeek-V2's router with OEA, and the widest groups. */
static void test_compile(const char *dir) {
    static const char *targets[] = {"sm_120a", "sm_90a", "sm_80"};
    const mj_knobs_oea_route specs[] = {
        {.E = 256, .K = 8, .K0 = 4, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 8},
        {.E = 256, .K = 8, .K0 = 8, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 8},
        {.E = 384, .K = 8, .K0 = 3, .NG = 8, .TG = 4, .SCORING = 1, .RENORM = 1, .NWARPS = 4},
        {.E = 1024, .K = 16, .K0 = 8, .NG = 32, .TG = 8, .SCORING = 0, .RENORM = 1, .NWARPS = 2},
        {.E = 160, .K = 6, .K0 = 3, .NG = 8, .TG = 3, .GSCORE = 1, .SCORING = 1, .RENORM = 0, .NWARPS = 8},
        {.E = 1024, .K = 16, .K0 = 8, .NG = 32, .TG = 8, .GSCORE = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 2}};
    enum { N_SPECS = sizeof specs / sizeof specs[0] };
    for (int t = 0; t < 3; t++) {
        mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
        o.cache_dir = dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_CUDA, o.target = targets[t];
        mj_context_t c = NULL;
        CHECK_OK(mj_context_create(&o, &c));
        if (!c) continue;
        for (int i = 0; i < N_SPECS; i++) {
            mj_spec s;
            const mj_function *f = NULL;
            mj_spec_oea_route(c, &specs[i], &s);
            CHECK_OK(mj_jit_get(c, &s, &f));
            if (!f) continue;
            const mj_ptxas_report *rep = mj_function_report(f);
            CHECK(rep->spill_stores == 0 && rep->spill_loads == 0, "oea_route spec %d on %s spills", i, targets[t]);
            if (specs[i].GSCORE)
                printf("oea_route E=%d K=%d K0=%d NG=%d TG=%d GSCORE=1 on %s: %d registers, %d spill bytes\n",
                       specs[i].E, specs[i].K, specs[i].K0, specs[i].NG, specs[i].TG, targets[t], rep->registers,
                       rep->spill_stores + rep->spill_loads);
        }
        /* The router GEMM: what the launcher picks for GLM-5 (H = 6144: 4 warps) at every
         * ROWS, and for the widest row. */
        static const int rg_spec[][3] = {{6144, 8, 4}, {6144, 16, 4}, {6144, 32, 4}, {6144, 64, 4}, {16384, 64, 4}};
        for (int i = 0; i < 5; i++) {
            mj_knobs_router_gemm rg = {.H = rg_spec[i][0], .E = 256, .ROWS = rg_spec[i][1], .NWARPS = rg_spec[i][2]};
            mj_spec s;
            const mj_function *f = NULL;
            mj_spec_router_gemm(c, &rg, &s);
            CHECK_OK(mj_jit_get(c, &s, &f));
            if (!f) continue;
            const mj_ptxas_report *rep = mj_function_report(f);
            CHECK(rep->spill_stores == 0 && rep->spill_loads == 0, "router_gemm H=%d ROWS=%d spills on %s",
                  rg.H, rg.ROWS, targets[t]);
            printf("router_gemm H=%d E=256 ROWS=%d NWARPS=%d on %s: %d registers, %d spill bytes\n", rg.H, rg.ROWS,
                   rg.NWARPS, targets[t], rep->registers, rep->spill_stores + rep->spill_loads);
        }
        test_router_sass(c, targets[t]);
        test_route_dyn_align(c, targets[t]);
        mj_context_destroy(c);
    }
}

/* Impossible specializations are refused before anything is rendered, naming the rule. */
static void test_constraints(mj_context_t ctx) {
    static const struct {
        mj_knobs_oea_route k;
        const char *rule;
    } bad[] = {
        {{.E = 64, .K = 4, .K0 = 6, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 4}, "K0 <= K"},
        {{.E = 8, .K = 12, .K0 = 2, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 4}, "K <= E"},
        {{.E = 64, .K = 4, .K0 = 2, .NG = 3, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 4}, "E % NG == 0"},
        {{.E = 64, .K = 4, .K0 = 2, .NG = 4, .TG = 8, .SCORING = 0, .RENORM = 1, .NWARPS = 4}, "TG <= NG"},
        {{.E = 64, .K = 8, .K0 = 2, .NG = 16, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 4}, "TG * (E / NG) >= K"},
        {{.E = 1024, .K = 8, .K0 = 2, .NG = 1, .TG = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 16}, "96 * 1024"},
        {{.E = 64, .K = 4, .K0 = 2, .NG = 1, .TG = 1, .GSCORE = 1, .SCORING = 0, .RENORM = 1, .NWARPS = 4},
         "NG > 1 || GSCORE == 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mj_spec s;
        const mj_function *f;
        char *src = NULL;
        mj_spec_oea_route(ctx, &bad[i].k, &s);
        CHECK_STATUS(mj_spec_validate(&s), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), bad[i].rule) && strstr(mj_last_error(), "does not hold"),
              "constraint %zu: %s", i, mj_last_error());
        CHECK_STATUS(mj_jit_get(ctx, &s, &f), MJ_ERR_INVALID_ARG);
        CHECK_STATUS(mj_render(&s, &src, NULL), MJ_ERR_INVALID_ARG);
        free(src);
    }
    /* Every constraint the templates declare parses and holds at the launchers' choices. */
    mj_knobs_oea_route good = {.E = 256, .K = 8, .K0 = 4, .NG = 8, .TG = 4, .SCORING = 0, .RENORM = 1, .NWARPS = 8};
    mj_spec s;
    mj_spec_oea_route(ctx, &good, &s);
    CHECK_OK(mj_spec_validate(&s));
    const mj_template_desc *t = mj_template_at(MJ_TPL_oea_route);
    CHECK(t->n_constraints >= 7, "oea_route declares %d constraints", t->n_constraints);
    good.GSCORE = 1;
    mj_spec_oea_route(ctx, &good, &s);
    CHECK_OK(mj_spec_validate(&s));
    /* The router GEMM's: whole chunks of 32 k. */
    static const struct {
        mj_knobs_router_gemm k;
        const char *rule;
    } rbad[] = {
        {{.H = 6176, .E = 256, .ROWS = 8, .NWARPS = 4}, "H % 64 == 0"},
    };
    for (size_t i = 0; i < sizeof rbad / sizeof rbad[0]; i++) {
        mj_spec_router_gemm(ctx, &rbad[i].k, &s);
        CHECK_STATUS(mj_spec_validate(&s), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), rbad[i].rule) && strstr(mj_last_error(), "does not hold"),
              "router constraint %zu: %s", i, mj_last_error());
    }
    mj_knobs_router_gemm rgood = {.H = 512, .E = 64, .ROWS = 8, .NWARPS = 4}; /* tests/driver.sh's manifest */
    mj_spec_router_gemm(ctx, &rgood, &s);
    CHECK_OK(mj_spec_validate(&s));
}

/* Group-limited routing through mj_route on logits where the two rules keep different groups
 * (test_route_ref works them by hand: the top-2 sum routes to [2 3], the max to [0 1]), and
 * an old caller's smaller mj_route_params: accepted, routed with the top-2 sum whatever lies
 * past its struct. Outputs poisoned, every sentinel checked. */
static void test_group_rules_and_old_params(mj_context_t ctx) {
    static const float row[8] = {4, -10, 3.5f, 3.5f, -10, -10, -10, -10};
    const rcase c = {1, 1, 8, 2, 2, 4, 1, 0, 1, 0, 0, 1};
    static const struct {
        uint32_t size;
        mj_group_score gs;
        int32_t want0;
    } runs[] = {{sizeof(mj_route_params), MJ_GROUP_SCORE_MAX, 0},
                {sizeof(mj_route_params), MJ_GROUP_SCORE_TOP2_SUM, 2},
                {(uint32_t)MJ_ROUTE_PARAMS_V1_SIZE, MJ_GROUP_SCORE_MAX, 2},
                {(uint32_t)MJ_ROUTE_PARAMS_V1_SIZE, (mj_group_score)77, 2}};
    for (int r = 0; r < 4; r++) {
        mj_route_params p = params_of(&c);
        p.struct_size = runs[r].size;
        p.group_score = runs[r].gs;
        dbufs d = dbufs_new(1, 8, 2);
        tbuf_put(&d.x, row, sizeof row);
        dbufs_poison(&d);
        mj_route_outputs o = dbufs_outputs(&d);
        CHECK_OK(mj_route(ctx, &p, d.x.p, NULL, 1, NULL, &o, NULL));
        int32_t ids[2] = {-9, -9}, n = -9;
        tbuf_get(&d.ids, ids, "ids");
        tbuf_get(&d.n, &n, "n_sel");
        CHECK(n == 2 && ids[0] == runs[r].want0 && ids[1] == runs[r].want0 + 1,
              "struct_size %u group_score %d: ids [%d %d] n_sel %d, want [%d %d]", runs[r].size,
              (int)runs[r].gs, ids[0], ids[1], n, runs[r].want0, runs[r].want0 + 1);
        /* and the rest of the outputs as the reference has them */
        routed want = routed_new(1, 8, 2);
        mj_route_params rp = p;
        if (rp.struct_size < sizeof rp) rp.group_score = MJ_GROUP_SCORE_TOP2_SUM;
        rp.struct_size = sizeof rp;
        reference(&rp, row, NULL, 1, 1, &want);
        compare(&d, &want, 1, 8, 2);
        routed_free(&want);
        dbufs_free(&d);
    }
    mj_route_params bad = params_of(&c);
    bad.group_score = (mj_group_score)2;
    int32_t ids[2], ns[1];
    float w[2];
    mj_route_outputs out = MJ_ROUTE_OUTPUTS_INIT;
    out.ids = ids, out.weights = w, out.n_sel = ns;
    CHECK_STATUS(mj_route(ctx, &bad, row, NULL, 1, NULL, &out, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "group_score 2") && strstr(mj_last_error(), "MJ_GROUP_SCORE_MAX"), "%s",
          mj_last_error());
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

/* Refusals, checked before any memory is touched. */
static void test_refusals(mj_context_t ctx) {
    float x[16] = {0};
    int32_t ids[8], ns[2];
    float w[8];
    mj_route_outputs out = MJ_ROUTE_OUTPUTS_INIT;
    out.ids = ids, out.weights = w, out.n_sel = ns;
    mj_route_params p = MJ_ROUTE_PARAMS_INIT;
    p.n_experts = 8, p.topk = 4, p.k0 = 2;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 257, NULL, &out, NULL), MJ_ERR_UNSUPPORTED); /* OEA, one block */
    p.k0 = 5;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, NULL, &out, NULL), MJ_ERR_INVALID_ARG);
    p.k0 = 2, p.n_experts = 2048;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, NULL, &out, NULL), MJ_ERR_UNSUPPORTED);
    p.n_experts = 8;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, -1, NULL, &out, NULL), MJ_ERR_INVALID_ARG);
    out.ids = NULL;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, NULL, &out, NULL), MJ_ERR_INVALID_ARG);
    out.ids = ids;
    /* Versioned structs: a size the library does not know is refused, naming the macro. */
    mj_route_params bp = p;
    bp.struct_size = 12;
    CHECK_STATUS(mj_route(ctx, &bp, x, NULL, 2, NULL, &out, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "MJ_ROUTE_PARAMS_INIT") != NULL, "%s", mj_last_error());
    mj_route_outputs bo = out;
    bo.struct_size = sizeof bo + 8;
    CHECK_STATUS(mj_route(ctx, &p, x, NULL, 2, NULL, &bo, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "MJ_ROUTE_OUTPUTS_INIT") != NULL, "%s", mj_last_error());
    /* A caller built before row_index existed passes the old size: accepted, and the field
     * past its struct (garbage here) is never touched. */
    mj_route_outputs old = out;
    old.struct_size = MJ_ROUTE_OUTPUTS_V1_SIZE;
    old.row_index = (int32_t *)(uintptr_t)0x10;
    CHECK(MJ_ROUTE_OUTPUTS_V1_SIZE == offsetof(mj_route_outputs, row_index), "v1 size");
    CHECK_OK(mj_route(ctx, &p, x, NULL, 2, NULL, &old, NULL));
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    st.struct_size = 4;
    CHECK_STATUS(mj_route_ref(&p, x, NULL, 2, 2, ids, w, ns, &st), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "MJ_ROUTE_STATS_INIT") != NULL, "%s", mj_last_error());
}

/* What the cases share (setup): the seed, the kernel cache, and a context on the interpreter,
 * or on device 0 for test_route_gpu (exit 77, skipped, without one). */
static uint64_t g_seed;
static const char *g_dir;
static mj_context_t g_ctx;

static int setup(void) {
    g_seed = test_seed(4242);
    g_dir = test_shared_cache();
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = g_dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_SIM;
    if (ROUTE_TEST_GPU) {
        /* The same table on a real GPU, when there is one. */
        const int rc = test_gpu_or_skip("runs the routing table on a GPU");
        if (rc) return rc;
        o.device = 0, o.backend = MJ_BACKEND_CUDA;
    }
    CHECK_OK(mj_context_create(&o, &g_ctx));
    return g_ctx ? 0 : test_finish();
}

static void teardown(void) { mj_context_destroy(g_ctx); }

/* The block's warps by batch (runtime/route.c, route_warps): a warp a token, at least 8; 16
 * from 5 tokens where B x k is past 32 (GLM-5's top-8: B 5 to 16), where the short dispatch
 * (B x k <= 32, blocks of 8 warps) could not run anyway; a top-4 model keeps 8 warps and the
 * short dispatch to B 8; 32 past 16 tokens. */
static void case_warps(void) {
    static const struct { int E, k, B, nw; } want[] = {
        {256, 8, 1, 8}, {256, 8, 4, 8}, {256, 8, 5, 16}, {256, 8, 8, 16}, {256, 8, 16, 16}, {256, 8, 17, 32},
        {64, 4, 5, 8},  {64, 4, 8, 8},  {64, 4, 9, 16},  {64, 4, 16, 16}, {64, 4, 32, 32},  {64, 2, 16, 8}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        mj_route_params p = MJ_ROUTE_PARAMS_INIT;
        p.n_experts = want[i].E, p.topk = want[i].k, p.k0 = want[i].k;
        mj_knobs_oea_route kn;
        CHECK_OK(mj_route_knobs(&p, want[i].B, &kn));
        CHECK(kn.NWARPS == want[i].nw, "E %d top-%d B %d: %d warps, want %d", want[i].E, want[i].k, want[i].B, kn.NWARPS,
              want[i].nw);
    }
    /* The dispatch's warps: the template's rule is the runtime's (the performance model's
     * count of the SM's issue): at most 8 up to 256 experts, else all of them. */
    int32_t tpl = -1;
    const mj_template_desc *t = mj_template_find("oea_route", &tpl);
    CHECK(t && strstr(t->body, "\n#define DWARPS (NWARPS > 8 && E <= 256 ? 8 : NWARPS)\n") &&
              MJ_ROUTE_DISPATCH_WARPS == 8,
          "templates/oea_route.cu's DWARPS and runtime/plan.h's MJ_ROUTE_DISPATCH_WARPS (%d) agree",
          MJ_ROUTE_DISPATCH_WARPS);
    static const struct { int E, nw, dw; } dws[] = {{256, 32, 8}, {256, 16, 8}, {256, 8, 8}, {256, 4, 4},
                                                    {257, 32, 32}, {1024, 16, 16}, {64, 32, 8}};
    for (size_t i = 0; i < sizeof dws / sizeof dws[0]; i++) {
        mj_knobs_oea_route kn = {.E = dws[i].E, .K = 8, .K0 = 8, .NG = 1, .TG = 1, .NWARPS = dws[i].nw};
        CHECK(mj_route_dispatch_warps(&kn) == dws[i].dw, "E %d on %d warps: %d dispatch warps, want %d", dws[i].E,
              dws[i].nw, mj_route_dispatch_warps(&kn), dws[i].dw);
    }
}

static void case_router(void) { test_router(g_ctx, g_seed); }
static void case_router_grid(void) { test_router_grid(); }

/* The table against the reference; on the interpreter, the kernels it must have built. */
static void case_table(void) {
    static rcase table[512];
    int n = build_table(table), n_ok = 0;
    double t_glm = 0;
    for (int i = 0; i < n; i++) {
        double t0 = test_now_ms();
        n_ok += run_case(g_ctx, &table[i], g_seed + (uint64_t)i * 7919, i);
        if (table[i].B == 256 && table[i].E == 256 && table[i].k == 8 && table[i].k0 < 8 && t_glm == 0)
            t_glm = test_now_ms() - t0;
    }
    printf("%d of %d routing cases match the reference; B=256 E=256 k=8 OEA case: %.1f ms on the %s\n",
           n_ok, n, t_glm, ROUTE_TEST_GPU ? "GPU (with copies)" : "interpreter");
    if (!ROUTE_TEST_GPU) test_branches_reached(g_ctx);
}

static void case_group_rules(void) { test_group_rules_and_old_params(g_ctx); }
static void case_refusals(void) { test_refusals(g_ctx); }
static void case_compile(void) { test_compile(g_dir); }
static void case_replay(void) { test_replay(g_ctx, g_seed); }
static void case_constraints(void) { test_constraints(g_ctx); }
static void case_dispatch(void) { test_dispatch(g_ctx, g_seed); }

/* The cases a GPU runs first (test_route_gpu: the first N_GPU_CASES), then the interpreter's
 * own. */
static const test_case cases[] = {
    TEST_CASE("router", case_router),
    TEST_CASE("table", case_table),
    TEST_CASE("group_rules", case_group_rules),
    TEST_CASE("refusals", case_refusals),
    TEST_CASE("dispatch", case_dispatch),
    TEST_CASE("policy", test_policy),
    TEST_CASE("compile", case_compile),
    TEST_CASE("replay", case_replay),
    TEST_CASE("constraints", case_constraints),
    TEST_CASE("router_grid", case_router_grid),
    TEST_CASE("warps", case_warps),
};
enum { N_GPU_CASES = 5 };

int main(int argc, char **argv) {
    return test_main(argc, argv, cases, ROUTE_TEST_GPU ? N_GPU_CASES : TEST_N(cases), setup, teardown);
}
