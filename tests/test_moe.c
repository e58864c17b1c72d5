/* test_moe.c — the whole layer (mj_moe_create / prepare / forward) on the interpreter:
 *
 *   ranks      1, 2, 4 and 8 loopback ranks (threads, one context each), TP and EP, W4A16
 *              and W4A4, with and without OEA: every rank's output the same bits, equal to
 *              the unsplit CPU reference (mj_moe_forward_ref) within the experts' tolerance
 *              (relative L2: 2e-3 W4A16, 5e-2 W4A4, as tests/test_experts.c derives),
 *              padding rows 0, and the same bits again on a second forward;
 *   gated      the same with a shared expert scaled by sigmoid(x . shared_expert_gate)
 *              (Qwen2-MoE, Qwen3-Next): TP 2 and 4, EP 2, W4A16 and W4A4;
 *   routing    the routing a forward used (mj_moe_route_outputs) equals mj_route_ref on
 *              the reference logits, so the comparison above compares like with like;
 *   bytes      the weight bytes a forward streams (the interpreter counts them) are the
 *              router's gate plus each active expert's and the shared expert's, once;
 *   options    rsf left to the caller and the shared expert left out: the pieces add up to
 *              the whole;
 *   plan       prewarm the planner's set for every rank, then prepare in strict mode:
 *              zero compiles; a batch size outside it is a cache miss; an unprepared
 *              batch size is refused before any launch;
 *   graph      a recorded forward replayed with new tokens and a new token count computes
 *              what a direct forward does;
 *   refusals   bad options, splits that do not divide, a k0 below top-k above 256 tokens.
 */
#include "experts.h"
#include "mem.h"
#include "plan.h"
#include "sim/sim.h"
#include "test.h"
#include "test_routing.h"
#include "weights/pack.h"

#include <pthread.h>

/* ---- one layer on n loopback ranks ---------------------------------------------------------- */

typedef struct rank_job {
    /* in */
    mj_layer_t full;
    mj_parallel par;
    int rank, n;
    mj_comm_t comm;
    const char *cache, *k0_policy;
    mj_weight_mode mode;
    int max_batch, B;
    const int32_t *nv;
    const uint16_t *hidden;
    /* out (the main thread checks: CHECK is not thread-safe) */
    mj_status st;
    char err[512];
    const char *step;
    float *out, *out2;
    unsigned long long bytes;
    int32_t *ids, n_active;
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    const int H = j->full->cfg.hidden, K = j->full->cfg.topk;
    mj_context_t ctx = NULL;
    mj_moe_t moe = NULL;
    mj_context_options co = MJ_CONTEXT_OPTIONS_INIT;
    co.cache_dir = j->cache, co.device = MJ_DEVICE_NONE, co.backend = MJ_BACKEND_SIM, co.target = "sm_120a";
#define STEP(name, call)                                                                  \
    do {                                                                                  \
        j->step = name;                                                                   \
        if ((j->st = (call)) != MJ_OK) goto done;                                         \
    } while (0)
    STEP("context", mj_context_create(&co, &ctx));
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    o.parallel = j->par, o.rank = j->rank, o.n_ranks = j->n, o.comm = j->n > 1 ? j->comm : NULL;
    STEP("create", mj_moe_create(ctx, j->full, &o, &moe));
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.max_batch = j->max_batch, po.k0_policy = j->k0_policy, po.mode = j->mode;
    STEP("prepare", mj_moe_prepare(moe, &po));
    const size_t n = (size_t)j->B * H;
    j->out = malloc(sizeof(float) * n), j->out2 = malloc(sizeof(float) * n);
    memset(j->out, 0x7f, sizeof(float) * n), memset(j->out2, 0x7f, sizeof(float) * n);
    mj_sim_stream_bytes_take();
    STEP("forward", mj_moe_forward(moe, j->hidden, j->B, j->nv, j->out, NULL));
    j->bytes = mj_sim_stream_bytes_take();
    mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
    STEP("route outputs", mj_moe_route_outputs(moe, &r));
    j->ids = malloc(sizeof(int32_t) * (size_t)j->B * K);
    memcpy(j->ids, r.ids, sizeof(int32_t) * (size_t)j->B * K);
    j->n_active = *r.n_active;
    STEP("second forward", mj_moe_forward(moe, j->hidden, j->B, j->nv, j->out2, NULL));
done:
    if (j->st != MJ_OK) snprintf(j->err, sizeof j->err, "%s", mj_last_error());
    mj_moe_free(moe);
    mj_context_destroy(ctx);
    return NULL;
#undef STEP
}

/* The layer on n ranks split `par`; every rank's output checked against the reference. */
static void run_split(mj_layer_t full, mj_parallel par, int n, mj_weight_mode mode, const char *k0_policy, int k0,
                      int B, int nv, uint64_t seed) {
    const mj_moe_config *c = &full->cfg;
    const int H = c->hidden, K = c->topk;
    char what[160];
    snprintf(what, sizeof what, "%s=%d %s k0=%d B=%d valid=%d", par == MJ_PAR_TP ? "TP" : par == MJ_PAR_EP ? "EP" : "one",
             n, mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", k0, B, nv);
    uint64_t rng = seed;
    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)B * H);
    test_random_hidden(hidden, (size_t)B * H, &rng);
    int32_t nv32 = nv;
    mj_comm_t comms[8] = {0};
    if (n > 1) CHECK_OK(mj_comm_loopback_create(n, comms));
    rank_job jobs[8];
    pthread_t th[8];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.full = full, .par = par, .rank = r, .n = n, .comm = comms[r], .cache = test_shared_cache(),
                             .k0_policy = k0_policy, .mode = mode, .max_batch = B, .B = B,
                             .nv = nv < B ? &nv32 : NULL, .hidden = hidden};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    int ok = 1;
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].st == MJ_OK, "%s: rank %d: %s: %s: %s", what, r, jobs[r].step, mj_status_string(jobs[r].st),
              jobs[r].err);
        ok &= jobs[r].st == MJ_OK;
    }
    if (ok) {
        const size_t nel = (size_t)B * H;
        /* The reference: its routing, and its output. */
        routing rt;
        route_layer(full, hidden, B, nv, k0, &rt);
        const int32_t *ids = rt.ids;
        const int na = rt.na;
        float *want = malloc(sizeof(float) * nel);
        CHECK_OK(mj_moe_forward_ref(full, mode, hidden, B, nv, k0, want, NULL));
        for (int r = 0; r < n; r++) {
            CHECK(!memcmp(jobs[r].ids, ids, sizeof(int32_t) * (size_t)B * K), "%s: rank %d routed differently from "
                  "mj_route_ref on the reference logits", what, r);
            CHECK(jobs[r].n_active == na, "%s: rank %d: %d active experts, the reference %d", what, r, jobs[r].n_active,
                  na);
            CHECK(!memcmp(jobs[r].out, jobs[0].out, sizeof(float) * nel), "%s: rank %d's output differs from rank 0's",
                  what, r);
            CHECK(!memcmp(jobs[r].out2, jobs[r].out, sizeof(float) * nel), "%s: rank %d: a second forward differs",
                  what, r);
        }
        double e = test_rel_l2(jobs[0].out, want, nel), tol = mode == MJ_MODE_W4A16 ? 2e-3 : 5e-2;
        CHECK(e <= tol, "%s: relative L2 %.3g vs mj_moe_forward_ref (bound %.0e)", what, e, tol);
        int pad = 0;
        for (size_t i = (size_t)nv * H; i < nel; i++) pad += jobs[0].out[i] != 0.0f;
        CHECK(pad == 0, "%s: %d padding outputs are not 0", what, pad);
        printf("  %-40s rel L2 %.2e, %2d active experts\n", what, e, na);
        routing_free(&rt);
        free(want);
    }
    for (int r = 0; r < n; r++) {
        free(jobs[r].out), free(jobs[r].out2), free(jobs[r].ids);
        mj_comm_free(comms[r]);
    }
    free(hidden);
}

static void test_splits(uint64_t seed) {
    /* I = 512: TP 8 leaves 64 rows a rank (one MMA K-step); E = 16: EP 8 leaves 2 experts. */
    mj_moe_config c = test_moe_cfg(256, 512, 16, 4, 1);
    mj_layer_t full = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &full));
    if (!full) return;
    static const struct { mj_parallel par; int n; int mode; const char *pol; int k0, B, nv; } cases[] = {
        {MJ_PAR_NONE, 1, 0, NULL, 4, 5, 5},     {MJ_PAR_NONE, 1, 1, "2", 2, 16, 13},
        {MJ_PAR_TP, 2, 0, "1-8:4,9-:2", 2, 12, 12}, {MJ_PAR_TP, 4, 1, NULL, 4, 9, 7},
        {MJ_PAR_TP, 8, 0, "3", 3, 3, 2},         {MJ_PAR_TP, 8, 1, "2", 2, 16, 16},
        {MJ_PAR_EP, 2, 1, "2", 2, 11, 11},       {MJ_PAR_EP, 4, 0, NULL, 4, 6, 4},
        {MJ_PAR_EP, 8, 0, "2", 2, 16, 15},       {MJ_PAR_EP, 8, 1, NULL, 4, 2, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_split(full, cases[i].par, cases[i].n, cases[i].mode ? MJ_MODE_W4A4 : MJ_MODE_W4A16, cases[i].pol,
                  cases[i].k0, cases[i].B, cases[i].nv, seed + 10 + i);
    mj_layer_free(full);
}

/* A Qwen2-MoE-shaped layer (softmax top-k, no bias, no renormalization) whose shared expert, 4
 * expert widths wide, is scaled by sigmoid(x . shared_expert_gate): every TP rank scales its
 * slice of the shared expert by the whole gate, EP rank 0 alone runs it; the ranks' sum is the
 * gated reference. At decode up runs as STREAM, its runs of pieces over the interpreter's
 * grid: a tile's pieces over several blocks, of which one (the first piece's) writes the
 * gate's weights. (tests/test_families.c checks the
 * gate itself against the family's rule.) */
static void test_gated_splits(uint64_t seed) {
    static const struct { int H; mj_parallel par; int n; int mode; const char *pol; int k0, B, nv; } cases[] = {
        {256, MJ_PAR_NONE, 1, 0, NULL, 4, 9, 7}, {256, MJ_PAR_TP, 2, 0, NULL, 4, 12, 12},
        {256, MJ_PAR_TP, 4, 1, "2", 2, 9, 7},    {256, MJ_PAR_EP, 2, 0, "2", 2, 11, 11},
        {256, MJ_PAR_EP, 2, 1, NULL, 4, 5, 4},   {1024, MJ_PAR_NONE, 1, 0, NULL, 4, 5, 4},
        {1024, MJ_PAR_TP, 2, 0, "2", 2, 3, 3},
    };
    mj_layer_t full = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!full || full->cfg.hidden != cases[i].H) {
            mj_layer_free(full), full = NULL;
            mj_moe_config c = test_moe_cfg(cases[i].H, 256, 16, 4, 4);
            c.scoring = MJ_SCORING_SOFTMAX, c.has_correction_bias = 0, c.norm_topk_prob = 0;
            c.routed_scaling_factor = 1.0f, c.shared_gate = 1;
            CHECK_OK(mj_layer_create_random(&c, seed + (uint64_t)cases[i].H, &full));
            if (!full) return;
            CHECK(full->shared_gate != NULL, "a random layer of a gated config has the gate");
            mj_knobs_moe_experts k;
            mj_experts_knobs(cases[i].H, 256, 4, 4, MJ_MODE_W4A16, 5, MJ_TARGET_SM120A, &k);
            CHECK(k.STREAM == 1, "H %d at 5 tokens: up as STREAM (%d)", cases[i].H, k.STREAM);
        }
        run_split(full, cases[i].par, cases[i].n, cases[i].mode ? MJ_MODE_W4A4 : MJ_MODE_W4A16, cases[i].pol,
                  cases[i].k0, cases[i].B, cases[i].nv, seed + 10 + i);
    }
    mj_layer_free(full);
}

/* ---- bytes, options, graphs on one rank ------------------------------------------------------ */

static mj_moe_t one_rank(mj_context_t ctx, mj_layer_t L, const mj_moe_options *o, int max_batch, const char *k0,
                         mj_weight_mode mode) {
    mj_moe_t moe = NULL;
    CHECK_OK(mj_moe_create(ctx, L, o, &moe));
    if (!moe) return NULL;
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.max_batch = max_batch, po.k0_policy = k0, po.mode = mode;
    mj_status st = mj_moe_prepare(moe, &po);
    CHECK(st == MJ_OK, "prepare: %s: %s", mj_status_string(st), mj_last_error());
    if (st != MJ_OK) mj_moe_free(moe), moe = NULL;
    return moe;
}

static void test_bytes_and_options(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(256, 128, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    const int B = 8, H = 256;
    uint64_t rng = seed + 1;
    uint16_t *hidden = malloc(sizeof(uint16_t) * B * H);
    test_random_hidden(hidden, (size_t)B * H, &rng);
    float *full = malloc(sizeof(float) * B * H), *part = malloc(sizeof(float) * B * H);
    float *want = malloc(sizeof(float) * B * H);
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    mj_moe_t moe = one_rank(ctx, L, &o, B, "2", MJ_MODE_W4A16);
    if (moe) {
        /* Bytes: the gate (E x H bf16) once, and each active expert's and the shared one's. */
        mj_sim_stream_bytes_take();
        CHECK_OK(mj_moe_forward(moe, hidden, B, NULL, full, NULL));
        unsigned long long got = mj_sim_stream_bytes_take();
        mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
        CHECK_OK(mj_moe_route_outputs(moe, &r));
        const long long per = (long long)mj_pack_expert_bytes(H, 128);
        const unsigned long long floor = 16ull * H * 2 + (unsigned long long)(*r.n_active + 1) * (unsigned long long)per;
        CHECK(got == floor, "a forward read %llu weight bytes; the floor is %llu (gate + %d active + 1 shared expert)",
              got, floor, *r.n_active);
        printf("  bytes: B=%d k0=2: %d active experts + shared, %llu bytes = the floor\n", B, *r.n_active, got);
        mj_moe_free(moe);
    }
    /* rsf left to the caller: the routed part comes out divided by rsf. */
    const float rsf = c.routed_scaling_factor;
    o.rsf_in_weights = 0, o.shared_expert = 0;
    if ((moe = one_rank(ctx, L, &o, B, "2", MJ_MODE_W4A16))) {
        CHECK_OK(mj_moe_forward(moe, hidden, B, NULL, part, NULL));
        /* The reference without the shared expert and with rsf 1. */
        struct mj_layer routed = *L;
        routed.has_shared = 0, routed.is_local = 0, routed.cfg.routed_scaling_factor = 1.0f;
        CHECK_OK(mj_moe_forward_ref(&routed, MJ_MODE_W4A16, hidden, B, B, 2, want, NULL));
        double e = test_rel_l2(part, want, (size_t)B * H);
        CHECK(e <= 2e-3, "routed experts alone, rsf left out: relative L2 %.3g", e);
        /* and the pieces make the whole: rsf * routed + shared == full. */
        struct mj_layer shared_only = *L;
        float *sh = malloc(sizeof(float) * B * H);
        routed.cfg.routed_scaling_factor = rsf;
        CHECK_OK(mj_moe_forward_ref(&routed, MJ_MODE_W4A16, hidden, B, B, 2, sh, NULL));
        CHECK_OK(mj_moe_forward_ref(&shared_only, MJ_MODE_W4A16, hidden, B, B, 2, want, NULL));
        for (int i = 0; i < B * H; i++) sh[i] = want[i] - sh[i]; /* the shared expert's part */
        for (int i = 0; i < B * H; i++) part[i] = part[i] * rsf + sh[i];
        e = test_rel_l2(part, full, (size_t)B * H);
        CHECK(e <= 4e-3, "rsf * routed + shared vs the full forward: relative L2 %.3g", e);
        free(sh);
        mj_moe_free(moe);
    }
    free(hidden), free(full), free(part), free(want);
    mj_layer_free(L);
}

/* A forward recorded once and replayed with new tokens and a new count. */
static void test_graph(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(256, 128, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    const int B = 16, H = 256;
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    mj_moe_t moe = one_rank(ctx, L, &o, B, "1-8:4,9-:2", MJ_MODE_AUTO);
    if (!moe) {
        mj_layer_free(L);
        return;
    }
    uint16_t *hidden = malloc(sizeof(uint16_t) * B * H);
    float *out = malloc(sizeof(float) * B * H), *direct = malloc(sizeof(float) * B * H);
    int32_t nv = B;
    mj_sim_graph *g = NULL;
    CHECK_OK(mj_sim_capture_begin(ctx));
    CHECK_OK(mj_moe_forward(moe, hidden, B, &nv, out, NULL));
    CHECK_OK(mj_sim_capture_end(ctx, &g));
    CHECK(g && mj_sim_graph_launches(g) >= 4, "a forward recorded %d launches", g ? mj_sim_graph_launches(g) : 0);
    static const int counts[] = {16, 1, 9, 0, 13};
    for (int t = 0; t < 5 && g; t++) {
        uint64_t rng = seed + 50 + (uint64_t)t;
        test_random_hidden(hidden, (size_t)B * H, &rng);
        nv = counts[t];
        memset(out, 0x7f, sizeof(float) * B * H);
        CHECK_OK(mj_sim_graph_replay(g));
        CHECK_OK(mj_moe_forward(moe, hidden, B, &nv, direct, NULL));
        CHECK(!memcmp(out, direct, sizeof(float) * B * H), "replay with %d valid tokens differs from a direct forward",
              counts[t]);
    }
    mj_sim_graph_free(g);
    free(hidden), free(out), free(direct);
    mj_moe_free(moe);
    mj_layer_free(L);
}

/* ---- the plan: prewarm, then strict prepare ---------------------------------------------------- */

/* What `moejit prewarm --config` does with a plan: every specialization into ctx's cache. */
static void prewarm_plan(mj_context_t ctx, const mj_plan *plan) {
    for (int i = 0; i < plan->n; i++) {
        char *line = NULL;
        CHECK_OK(mj_spec_to_json(&plan->e[i].spec, &line));
        if (line) CHECK_OK(mj_prewarm_json(ctx, line, NULL));
        free(line);
    }
}

static void test_plan_strict(uint64_t seed) {
    char *cache = test_tmpdir("moe-plan");
    mj_moe_config c = test_moe_cfg(256, 256, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L || !cache) return;
    mj_context_t warm = test_new_context(cache, MJ_BACKEND_SIM, "sm_120a", 0);
    static const int32_t batches[] = {1, 2, 3, 4, 8, 12, 16};
    static const char k0s[] = "1-4:4,5-:2"; /* the plan's and every prepare's k0 policy */
    mj_k0_policy k0;
    CHECK_OK(mj_k0_policy_parse(k0s, 4, &k0));
    const struct { mj_parallel par; int n; } splits[] = {{MJ_PAR_TP, 2}, {MJ_PAR_EP, 2}};
    int planned = 0;
    for (int s = 0; s < 2 && warm; s++) {
        /* What `moejit prewarm --config` does: every rank's plan into the cache. */
        mj_plan plan;
        mj_plan_request req = {&c, splits[s].par, splits[s].n, -1, batches, 7, &k0, MJ_MODE_AUTO, NULL, 1};
        CHECK_OK(mj_plan_build(warm, &req, &plan));
        prewarm_plan(warm, &plan);
        planned += plan.n;
        /* TP: router GEMM ROWS 8/16, three routings (k0 4; k0 2 with 8 warps at 5-8 tokens,
         * where top-4's B x k <= 32 keeps the short dispatch, and 16 past 8), experts TPE 8 in
         * W4A16 (1-8) and TPE 16 in W4A4 (9-16) -> 2 + 3 + 2. EP: rank 0's experts with the
         * shared expert and the others' without: 2 more. */
        int want = s == 0 ? 7 : 9;
        CHECK(plan.n == want, "%s=2 plan: %d specializations, want %d", s ? "EP" : "TP", plan.n, want);
        for (int i = 0; i < plan.n; i++)
            printf("  plan %s=2: %-12s B %2d..%-2d %s\n", s ? "EP" : "TP", plan.e[i].what, plan.e[i].b_lo,
                   plan.e[i].b_hi, mj_spec_describe(&plan.e[i].spec, (char[160]){0}, 160));
        mj_plan_free(&plan);
    }
    mj_context_destroy(warm);
    /* Strict: every rank prepares from the cache alone. */
    mj_context_t strict = test_new_context(cache, MJ_BACKEND_SIM, "sm_120a", 1);
    for (int s = 0; s < 2 && strict; s++)
        for (int r = 0; r < 2; r++) {
            mj_moe_options o = MJ_MOE_OPTIONS_INIT;
            mj_comm_t comms[2] = {0};
            CHECK_OK(mj_comm_loopback_create(2, comms));
            o.parallel = splits[s].par, o.rank = r, o.n_ranks = 2, o.comm = comms[r];
            mj_moe_t moe = NULL;
            CHECK_OK(mj_moe_create(strict, L, &o, &moe));
            mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
            po.batches = batches, po.n_batches = 7, po.k0_policy = k0s;
            CHECK_OK(mj_moe_prepare(moe, &po));
            /* A batch size the plan did not hold (32: the router GEMM of 32 rows, routing in 32
             * warps, experts of TPE 32: three specializations) is a miss, not a compile. */
            po.batches = (const int32_t[]){32}, po.n_batches = 1;
            CHECK_STATUS(mj_moe_prepare(moe, &po), MJ_ERR_CACHE_MISS);
            CHECK(strstr(mj_last_error(), "mj_moe_prepare") != NULL, "the miss names the call: %s", mj_last_error());
            mj_moe_free(moe);
            mj_comm_free(comms[0]), mj_comm_free(comms[1]);
        }
    mj_jit_stats js;
    if (strict) {
        CHECK_OK(mj_context_stats(strict, &js));
        CHECK(js.compiles == 0, "strict prepares after prewarm compiled %lld kernels", (long long)js.compiles);
        CHECK(js.strict_misses == 12, "strict misses %lld, want the 12 asked for (3 a prepare)",
              (long long)js.strict_misses);
        printf("  plan: %d specializations prewarmed; 4 strict prepares compiled %lld\n", planned, (long long)js.compiles);
    }
    mj_context_destroy(strict);

    /* One rank, end to end: a prepare in a context that may compile fetches its plan (what
     * the TP and EP prewarms above did not hold is compiled: the whole plan through
     * mj_jit_get_many's pool, $MOEJIT_COMPILE_THREADS (2) at a time); then a strict context
     * prepares and runs a forward at every prepared B (and num_valid < B): no compile, no miss
     * of any kind, no allocation — what a CUDA graph capture of the forward needs. */
    setenv("MOEJIT_COMPILE_THREADS", "2", 1);
    warm = test_new_context(cache, MJ_BACKEND_SIM, "sm_120a", 0);
    unsetenv("MOEJIT_COMPILE_THREADS");
    if (warm) {
        mj_plan plan;
        mj_plan_request req = {&c, MJ_PAR_NONE, 1, -1, batches, 7, &k0, MJ_MODE_AUTO, NULL, 1};
        CHECK_OK(mj_plan_build(warm, &req, &plan));
        mj_moe_t wm = NULL;
        mj_moe_options wo = MJ_MOE_OPTIONS_INIT;
        CHECK_OK(mj_moe_create(warm, L, &wo, &wm));
        mj_moe_prepare_options wp = MJ_MOE_PREPARE_OPTIONS_INIT;
        wp.batches = batches, wp.n_batches = 7, wp.k0_policy = k0s;
        if (wm) CHECK_OK(mj_moe_prepare(wm, &wp));
        mj_jit_stats ws;
        CHECK_OK(mj_context_stats(warm, &ws));
        CHECK(ws.mem_misses == plan.n && ws.compiles + ws.disk_hits == plan.n,
              "prepare of a %d-kernel plan: %lld fetched, %lld compiled, %lld from disk", plan.n,
              (long long)ws.mem_misses, (long long)ws.compiles, (long long)ws.disk_hits);
        CHECK(mj_jit_pool_peak(warm) >= 1 && mj_jit_pool_peak(warm) <= 2,
              "prepare's compiles: %d at once with 2 compile threads", mj_jit_pool_peak(warm));
        mj_moe_free(wm);
        mj_plan_free(&plan);
        mj_context_destroy(warm);
    }
    strict = test_new_context(cache, MJ_BACKEND_SIM, "sm_120a", 1);
    mj_moe_t moe = NULL;
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    if (strict) CHECK_OK(mj_moe_create(strict, L, &o, &moe));
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.batches = batches, po.n_batches = 7, po.k0_policy = k0s;
    if (moe) CHECK_OK(mj_moe_prepare(moe, &po));
    if (moe) {
        mj_jit_stats before, after;
        CHECK_OK(mj_context_stats(strict, &before));
        long long allocs = mj_mem_allocs();
        const int64_t H = c.hidden;
        uint16_t *hidden = calloc((size_t)(16 * H), 2);
        float *out = calloc((size_t)(16 * H), 4), *ref = calloc((size_t)(16 * H), 4);
        uint64_t rng = seed ^ 0x5eed;
        test_random_hidden(hidden, (size_t)(16 * H), &rng);
        int forwards = 0;
        for (int i = 0; i < 7 && hidden && out && ref; i++) {
            int32_t B = batches[i], nv = B > 2 ? B - 2 : B;
            CHECK_OK(mj_moe_forward(moe, hidden, B, &nv, out, NULL));
            int32_t k0b = 0;
            mj_weight_mode mode = MJ_MODE_AUTO;
            CHECK_OK(mj_moe_batch_plan(moe, B, &k0b, &mode));
            CHECK_OK(mj_moe_forward_ref(L, mode, hidden, B, nv, k0b, ref, NULL));
            double rel = test_rel_l2(out, ref, (size_t)B * H);
            /* tolerance as test_splits: W4A16 2e-3, W4A4 5e-2 relative L2 */
            CHECK(rel <= (mode == MJ_MODE_W4A4 ? 5e-2 : 2e-3), "strict forward B=%d nv=%d: rel L2 %.3g",
                  B, nv, rel);
            forwards++;
        }
        CHECK_OK(mj_context_stats(strict, &after));
        CHECK(after.compiles == 0 && after.strict_misses == before.strict_misses &&
                  after.mem_misses == before.mem_misses && after.disk_misses == before.disk_misses,
              "strict forwards: %lld compiles, %lld/%lld strict misses, %lld/%lld memory misses",
              (long long)after.compiles, (long long)before.strict_misses, (long long)after.strict_misses,
              (long long)before.mem_misses, (long long)after.mem_misses);
        CHECK(mj_mem_allocs() == allocs, "%d forwards allocated %lld times", forwards,
              mj_mem_allocs() - allocs);
        CHECK(forwards == 7, "%d strict forwards ran", forwards);
        printf("  plan: one rank, %d strict forwards after prewarm: %lld compiles, %lld allocations\n",
               forwards, (long long)after.compiles, mj_mem_allocs() - allocs);
        free(hidden), free(out), free(ref);
    }
    mj_moe_free(moe);
    mj_context_destroy(strict);
    mj_layer_free(L);
    test_rm_rf(cache);
    free(cache);
}

/* ---- refusals -------------------------------------------------------------------------------- */

static void test_refusals(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(256, 128, 16, 4, 1);
    mj_layer_t L = NULL, half = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_moe_t moe = NULL;
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    /* Splits: TP 4 leaves 32 rows (not a K-step), EP 3 does not divide 16 experts, 2 ranks
     * without a communicator, a rank out of range, a slice for another rank. */
    o.parallel = MJ_PAR_TP, o.n_ranks = 4;
    mj_comm_t comms[4] = {0};
    CHECK_OK(mj_comm_loopback_create(4, comms));
    o.comm = comms[0];
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_CONFIG);
    CHECK(strstr(mj_last_error(), "TP=4") != NULL, "TP split error: %s", mj_last_error());
    o.parallel = MJ_PAR_EP, o.n_ranks = 3;
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_CONFIG);
    o.n_ranks = 2, o.comm = NULL;
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "communicator") != NULL, "no comm: %s", mj_last_error());
    o.comm = comms[1], o.rank = 0;
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_INVALID_ARG); /* comm is rank 1 of 4 */
    o.rank = 5;
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_INVALID_ARG);
    CHECK_OK(mj_layer_shard(L, MJ_PAR_EP, 1, 2, &half));
    o = (mj_moe_options)MJ_MOE_OPTIONS_INIT;
    CHECK_STATUS(mj_moe_create(ctx, half, &o, &moe), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "slice") != NULL, "wrong slice: %s", mj_last_error());
    o.struct_size = 3;
    CHECK_STATUS(mj_moe_create(ctx, L, &o, &moe), MJ_ERR_INVALID_ARG);
    /* A loopback communicator sums host buffers: a GPU context is refused with it. */
    mj_context_options gco = MJ_CONTEXT_OPTIONS_INIT;
    gco.cache_dir = test_shared_cache(), gco.device = MJ_DEVICE_NONE, gco.backend = MJ_BACKEND_CUDA;
    mj_context_t gctx = NULL;
    CHECK_OK(mj_context_create(&gco, &gctx));
    o = (mj_moe_options)MJ_MOE_OPTIONS_INIT;
    o.parallel = MJ_PAR_TP, o.rank = 0, o.n_ranks = 4, o.comm = comms[0];
    c.intermediate = 256;
    mj_layer_t L4 = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed + 1, &L4));
    if (gctx && L4) {
        CHECK_STATUS(mj_moe_create(gctx, L4, &o, &moe), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "loopback") != NULL, "loopback with a GPU context: %s", mj_last_error());
    }
    mj_layer_free(L4);
    mj_context_destroy(gctx);
    for (int i = 0; i < 4; i++) mj_comm_free(comms[i]);
    /* Batch sizes: a forward before prepare, an unprepared one, a k0 below top-k above the
     * one-block limit, a W4A4 mode on a target without it. */
    o = (mj_moe_options)MJ_MOE_OPTIONS_INIT;
    CHECK_OK(mj_moe_create(ctx, L, &o, &moe));
    if (moe) {
        uint16_t hidden[4 * 256] = {0};
        float out[4 * 256];
        CHECK_STATUS(mj_moe_forward(moe, hidden, 4, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "not prepared") != NULL, "forward before prepare: %s", mj_last_error());
        mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
        po.batches = (const int32_t[]){1, 2, 8}, po.n_batches = 3, po.mode = MJ_MODE_W4A16;
        CHECK_OK(mj_moe_prepare(moe, &po));
        CHECK_OK(mj_moe_forward(moe, hidden, 2, NULL, out, NULL));
        CHECK_STATUS(mj_moe_forward(moe, hidden, 4, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "batch size 4 was not prepared") != NULL, "unprepared B: %s", mj_last_error());
        CHECK_OK(mj_moe_forward(moe, hidden, 0, NULL, out, NULL)); /* nothing to do */
        CHECK_STATUS(mj_moe_forward(moe, hidden, -1, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        po.batches = NULL, po.max_batch = 300, po.k0_policy = "2";
        CHECK_STATUS(mj_moe_prepare(moe, &po), MJ_ERR_UNSUPPORTED);
        CHECK(strstr(mj_last_error(), "batch size 257") != NULL, "k0 < k above 256: %s", mj_last_error());
        /* The failed prepare left the earlier one in place. */
        CHECK_OK(mj_moe_forward(moe, hidden, 2, NULL, out, NULL));
        po.max_batch = 0;
        CHECK_STATUS(mj_moe_prepare(moe, &po), MJ_ERR_INVALID_ARG);
        mj_moe_free(moe);
    }
    mj_layer_free(half);
    mj_layer_free(L);
}

/* The cases' seed and their context on the interpreter (setup). */
static uint64_t g_seed;
static mj_context_t g_ctx;

static int setup(void) {
    g_seed = test_seed(2027);
    g_ctx = test_new_context(test_shared_cache(), MJ_BACKEND_SIM, "sm_120a", 0);
    return g_ctx ? 0 : test_finish();
}

static void teardown(void) { mj_context_destroy(g_ctx); }

static void case_refusals(void) { test_refusals(g_ctx, g_seed); }
static void case_bytes_and_options(void) { test_bytes_and_options(g_ctx, g_seed + 100); }
static void case_graph(void) { test_graph(g_ctx, g_seed + 200); }
static void case_plan_strict(void) { test_plan_strict(g_seed + 300); }
static void case_splits(void) { test_splits(g_seed + 400); }
static void case_gated_splits(void) { test_gated_splits(g_seed + 500); }

static const test_case cases[] = {
    TEST_CASE("refusals", case_refusals),
    TEST_CASE("bytes_and_options", case_bytes_and_options),
    TEST_CASE("graph", case_graph),
    TEST_CASE("plan_strict", case_plan_strict),
    TEST_CASE("splits", case_splits),
    TEST_CASE("gated_splits", case_gated_splits),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
