/* moe_run.c — one MoE layer forward on N ranks, for `moejit run` and `moejit demo`: each
 * rank a thread with its own context and mj_moe handle, its slice of the layer loaded from a
 * checkpoint by the rank itself, the partial outputs summed by a loopback communicator on
 * the interpreter or by NCCL on GPUs. */
#include "tools.h"

#include "moejit_private.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* The ranks meet once before the forward: a rank whose setup failed (its slice refused at
 * load: a NaN block scale, a missing tensor; a compile error) must not leave the others
 * waiting for it in the all-reduce (a loopback group waits 300 s, NCCL forever). After the
 * meeting each rank knows whether every rank is ready, and only then runs the forward. */
typedef struct rank_meet {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int expected;                /* ranks that will come (fewer if some thread did not start) */
    int arrived;
    int failed;                  /* ranks whose setup failed, or that never started          */
} rank_meet;

/* Arrive (failed: this rank's setup failed) and wait for every rank; 1 when every rank
 * arrived ready. */
static int meet_all(rank_meet *m, int failed) {
    pthread_mutex_lock(&m->mu);
    m->arrived++, m->failed += failed;
    pthread_cond_broadcast(&m->cv);
    while (m->arrived < m->expected) pthread_cond_wait(&m->cv, &m->mu);
    int all_ready = m->failed == 0;
    pthread_mutex_unlock(&m->mu);
    return all_ready;
}

typedef struct rank_state {
    tool_moe_job *job;
    rank_meet *meet;
    int skipped;                 /* ready, but another rank was not: no forward ran          */
    int rank;
    int64_t H;                   /* the model's hidden size                                  */
    mj_comm_t comm;
    mj_status st;
    char err[1024];
    mj_jit_stats stats;
    unsigned long long bytes;
    int32_t n_active;
    mj_weight_mode mode;
    int32_t k0;
    double prepare_ms, forward_ms;
} rank_state;

static void *rank_main(void *arg) {
    rank_state *rs = arg;
    tool_moe_job *j = rs->job;
    const int sim = j->backend == MJ_BACKEND_SIM, dev = sim ? MJ_DEVICE_NONE : rs->rank;
    mj_context_t ctx = NULL;
    mj_layer_t slice = NULL;
    mj_moe_t moe = NULL;
    uint16_t *hidden = NULL;
    float *out = NULL;
    int32_t *nv = NULL;
    const char *step = "";
    int met = 0;                 /* past the meeting of the ranks */
#define STEP(name, call)                                                                   \
    do {                                                                                   \
        step = name;                                                                       \
        if ((rs->st = (call)) != MJ_OK) goto done;                                         \
    } while (0)
    mj_context_options co = MJ_CONTEXT_OPTIONS_INIT;
    co.cache_dir = j->cache_dir, co.backend = j->backend, co.device = sim ? MJ_DEVICE_NONE : dev;
    co.target = sim ? j->sim_target : NULL;
    STEP("creating the context", mj_context_create(&co, &ctx));
    STEP("loading the layer", mj_layer_load(j->ck, j->layer, j->par, j->par == MJ_PAR_NONE ? 0 : rs->rank,
                                            j->n_ranks, &slice));
    const int64_t H = rs->H, B = j->B;
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    o.parallel = j->par, o.rank = rs->rank, o.n_ranks = j->n_ranks, o.comm = j->n_ranks > 1 ? rs->comm : NULL;
    o.mode_policy = j->mode_policy;
    STEP("creating the layer", mj_moe_create(ctx, slice, &o, &moe));
    mj_layer_free(slice), slice = NULL;
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.batches = &j->B, po.n_batches = 1, po.k0_policy = j->k0_policy, po.mode = j->mode;
    double t = now_ms();
    STEP("preparing", mj_moe_prepare(moe, &po));
    rs->prepare_ms = now_ms() - t;
    STEP("the batch plan", mj_moe_batch_plan(moe, j->B, &rs->k0, &rs->mode));
    STEP("allocating", mj_mem_alloc(dev, (size_t)(B * H * 2), "moejit", (void **)&hidden));
    STEP("allocating", mj_mem_alloc(dev, (size_t)(B * H * 4), "moejit", (void **)&out));
    STEP("allocating", mj_mem_alloc(dev, 4, "moejit", (void **)&nv));
    STEP("copying in", mj_mem_put(dev, hidden, j->hidden, (size_t)(B * H * 2)));
    STEP("copying in", mj_mem_put(dev, nv, &j->num_valid, 4));
    /* Every rank ready, or none runs the forward. */
    met = 1;
    if (!meet_all(rs->meet, 0)) {
        rs->skipped = 1;
        goto done;
    }
    if (sim) mj_sim_stream_bytes_take();
    t = now_ms();
    STEP("the forward", mj_moe_forward(moe, hidden, j->B, nv, out, NULL));
    if (!sim) STEP("the forward", mj_cuda_synchronize());
    rs->forward_ms = now_ms() - t;
    if (sim) rs->bytes = mj_sim_stream_bytes_take();
    mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
    STEP("reading the routing", mj_moe_route_outputs(moe, &r));
    STEP("reading the routing", mj_mem_get(dev, &rs->n_active, r.n_active, 4));
    if (rs->rank == 0) STEP("copying out", mj_mem_get(dev, j->out, out, (size_t)(B * H * 4)));
    STEP("statistics", mj_context_stats(ctx, &rs->stats));
done:
    if (rs->st != MJ_OK) {
        snprintf(rs->err, sizeof rs->err, "rank %d: %s: %s", rs->rank, step, mj_last_error());
        if (!met) {
            /* Failed before the meeting: say so there (the others wait for it). */
            meet_all(rs->meet, 1);
        } else if (rs->comm && sim) { /* a loopback group (NCCL's cannot be aborted here) */
            /* Failed in the forward: release the ranks waiting for this one in the
             * all-reduce at once, with this rank's reason. */
            mj_comm_abort(rs->comm, rs->err);
        }
    }
    mj_mem_free(dev, hidden), mj_mem_free(dev, out), mj_mem_free(dev, nv);
    mj_moe_free(moe);
    mj_layer_free(slice);
    mj_context_destroy(ctx);
    return NULL;
#undef STEP
}

int tool_moe_run(tool_moe_job *j) {
    const int n = j->n_ranks;
    mj_comm_t comms[MJ_MAX_RANKS] = {0};
    rank_state rs[MJ_MAX_RANKS];
    pthread_t th[MJ_MAX_RANKS];
    mj_moe_config cfg;
    mj_status st = mj_checkpoint_config(j->ck, &cfg);
    if (st != MJ_OK) return tool_fail_status("the checkpoint's config", st);
    if (n > 1) {
        st = j->backend == MJ_BACKEND_SIM ? mj_comm_loopback_create(n, comms) : mj_comm_nccl_init_all(n, NULL, comms);
        if (st != MJ_OK) return tool_fail_status("making the communicator", st);
    }
    rank_meet meet = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .expected = n};
    int started = 0;
    for (int r = 0; r < n; r++) {
        memset(&rs[r], 0, sizeof rs[r]);
        rs[r].job = j, rs[r].rank = r, rs[r].H = cfg.hidden, rs[r].comm = comms[r], rs[r].meet = &meet;
        if (pthread_create(&th[r], NULL, rank_main, &rs[r]) != 0) break;
        started++;
    }
    if (started < n) { /* the ranks that started meet without the others, and stop there */
        pthread_mutex_lock(&meet.mu);
        meet.expected = started, meet.failed += n - started;
        pthread_cond_broadcast(&meet.cv);
        pthread_mutex_unlock(&meet.mu);
    }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) mj_comm_free(comms[r]);
    if (started < n) return tool_fail("could not start %d rank threads", n);
    memset(&j->stats, 0, sizeof j->stats);
    j->bytes = j->max_rank_bytes = 0, j->prepare_ms = j->forward_ms = 0;
    /* The cause first: a rank's own failure, not a communicator error another rank's abort
     * or timeout gave the ranks waiting for it. */
    int first = -1;
    for (int r = 0; r < n && first < 0; r++)
        if (rs[r].st != MJ_OK && rs[r].st != MJ_ERR_COMM) first = r;
    for (int r = 0; r < n && first < 0; r++)
        if (rs[r].st != MJ_OK) first = r;
    if (first >= 0) return tool_fail("%s: %s", mj_status_string(rs[first].st), rs[first].err);
    for (int r = 0; r < n; r++) {
        j->stats.compiles += rs[r].stats.compiles, j->stats.disk_hits += rs[r].stats.disk_hits;
        j->stats.mem_hits += rs[r].stats.mem_hits, j->stats.compile_ms += rs[r].stats.compile_ms;
        j->bytes += rs[r].bytes;
        if (rs[r].bytes > j->max_rank_bytes) j->max_rank_bytes = rs[r].bytes;
        if (rs[r].prepare_ms > j->prepare_ms) j->prepare_ms = rs[r].prepare_ms;
        if (rs[r].forward_ms > j->forward_ms) j->forward_ms = rs[r].forward_ms;
    }
    j->n_active = rs[0].n_active, j->k0 = rs[0].k0, j->mode_used = rs[0].mode;
    return 0;
}
