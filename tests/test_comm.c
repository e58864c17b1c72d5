/* test_comm.c — the communicators (runtime/comm/).
 *
 * Loopback, ranks as threads: the all-reduce equals the sequential rank-order f32 sum bit
 * for bit on every rank (1, 2, 4, 8 and 64 ranks), in place too, the same bits run after
 * run, many calls in a row (the barrier reused, the scratch grown), count 0; ranks that
 * disagree (count, a NULL buffer, a negative count) all fail with the counts named and the
 * group goes on working; a rank that never arrives times out, an abort and a freed handle
 * end the others' waits: nothing hangs (an alarm fails the test if anything does).
 *
 * NCCL, through tests/stub/nccl_stub.c (MOEJIT_NCCL) and the CUDA stub: the id, init_rank,
 * init_all, the all-reduce's arguments as ncclAllReduce receives them, NCCL's error text
 * coming back, wrap not destroying the engine's comm; and in fresh processes (the library is
 * loaded once per process): a missing library, one that is not NCCL, a version that is not
 * NCCL 2, and the default search on this machine. */
#include "comm/comm.h"
#include "test.h"

#include <dlfcn.h>
#include <pthread.h>

/* ---- ranks as threads ----------------------------------------------------------------------- */
typedef struct job {
    mj_comm_t comm;
    const float *send;
    float *recv;
    int64_t count;
    mj_status s;
    char err[2048];
    double ms;                   /* how long the call took                                */
} job;

static job mkjob(mj_comm_t c, const float *send, float *recv, int64_t count) {
    job j;
    memset(&j, 0, sizeof j);
    j.comm = c, j.send = send, j.recv = recv, j.count = count;
    return j;
}

static void *job_run(void *arg) {
    job *j = arg;
    double t0 = test_now_ms();
    j->s = mj_comm_all_reduce_f32(j->comm, j->send, j->recv, j->count, NULL);
    j->ms = test_now_ms() - t0;
    snprintf(j->err, sizeof j->err, "%s", j->s == MJ_OK ? "" : mj_last_error());
    return NULL;
}

/* One all-reduce on every rank, each on its own thread; the statuses are in jobs[r].s. */
static void run_ranks(int n, job *jobs) {
    pthread_t th[MJ_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, job_run, &jobs[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

/* Random floats over six decades, so that the order of a sum shows in its bits. */
static void fill(float *x, int64_t n, uint64_t *rng) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(mj_rng_normal(rng) * pow(10.0, 6.0 * mj_rng_uniform(rng) - 3.0));
}

/* What every rank must get: ((s_0 + s_1) + s_2) + ... in f32. */
static void rank_order_sum(float *const *send, int n, int64_t count, float *out) {
    for (int64_t i = 0; i < count; i++) {
        float acc = send[0][i];
        for (int q = 1; q < n; q++) acc += send[q][i];
        out[i] = acc;
    }
}

static void test_loopback_sum(int n, uint64_t seed) {
    /* An odd count, so the ranks' chunks (cut at 16 floats) end unevenly. */
    const int64_t count = 4099;
    const size_t bytes = (size_t)count * sizeof(float);
    uint64_t rng = seed + (uint64_t)n;
    mj_comm_t comms[MJ_COMM_MAX_RANKS];
    CHECK_OK(mj_comm_loopback_create(n, comms));
    float *send[MJ_COMM_MAX_RANKS], *keep[MJ_COMM_MAX_RANKS];
    tbuf recv[MJ_COMM_MAX_RANKS];
    float *want = malloc(bytes), *got = malloc(bytes), *first = malloc(bytes);
    for (int r = 0; r < n; r++) {
        send[r] = malloc(bytes);
        keep[r] = malloc(bytes);
        fill(send[r], count, &rng);
        memcpy(keep[r], send[r], bytes);
        recv[r] = tbuf_new(bytes, 0);
        tbuf_poison(&recv[r], 0xFF);
        int32_t rank = -1, size = -1;
        CHECK_OK(mj_comm_info(comms[r], &rank, &size));
        CHECK(rank == r && size == n, "mj_comm_info of rank %d of %d: %d of %d", r, n, rank, size);
        CHECK(mj_comm_kind(comms[r]) == MJ_COMM_LOOPBACK, "kind %d", (int)mj_comm_kind(comms[r]));
    }
    rank_order_sum(send, n, count, want);
    if (n >= 4) {
        /* The data can tell orders apart: the reverse order differs somewhere. */
        int differs = 0;
        for (int64_t i = 0; i < count && !differs; i++) {
            float acc = send[n - 1][i];
            for (int q = n - 2; q >= 0; q--) acc += send[q][i];
            differs = memcmp(&acc, &want[i], sizeof acc) != 0;
        }
        CHECK(differs, "%d ranks: the test data cannot tell the sum's order", n);
    }

    job jobs[MJ_COMM_MAX_RANKS];
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], send[r], recv[r].p, count);
        run_ranks(n, jobs);
        for (int r = 0; r < n; r++) {
            CHECK(jobs[r].s == MJ_OK, "%d ranks, pass %d, rank %d: %s", n, pass, r, jobs[r].err);
            tbuf_get(&recv[r], got, "recv");
            CHECK(memcmp(got, want, bytes) == 0, "%d ranks, pass %d: rank %d's sum is not the rank-order sum",
                  n, pass, r);
            CHECK(memcmp(send[r], keep[r], bytes) == 0, "%d ranks: rank %d's send was written", n, r);
            if (pass == 0 && r == 0) memcpy(first, got, bytes);
            /* run after run: the same bits */
            CHECK(memcmp(got, first, bytes) == 0, "%d ranks, pass %d, rank %d: other bits than before", n,
                  pass, r);
            tbuf_poison(&recv[r], 0xFF);
        }
    }

    /* In place: each rank's send is its recv. */
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], send[r], send[r], count);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].s == MJ_OK, "%d ranks, in place, rank %d: %s", n, r, jobs[r].err);
        CHECK(memcmp(send[r], want, bytes) == 0, "%d ranks, in place: rank %d's sum differs", n, r);
    }

    for (int r = 0; r < n; r++) {
        CHECK_OK(mj_comm_free(comms[r]));
        free(send[r]);
        free(keep[r]);
        tbuf_free(&recv[r]);
    }
    free(want);
    free(got);
    free(first);
}

/* Many calls in a row on one group: counts 0..96 (the scratch grows as it goes), each
 * result checked. */
typedef struct loop_job {
    mj_comm_t comm;
    int n, calls;
    uint64_t seed;
    int bad_calls;               /* calls whose result differed                            */
    mj_status s;
    char err[2048];
} loop_job;

static void *loop_run(void *arg) {
    loop_job *j = arg;
    int32_t rank = 0;
    mj_comm_info(j->comm, &rank, NULL);
    float send[MJ_COMM_MAX_RANKS][97], recv[97], want[97];
    for (int call = 0; call < j->calls && j->s == MJ_OK; call++) {
        int64_t count = (call * 37) % 97;
        /* Every rank makes every rank's data (the same generator), so it knows the sum. */
        uint64_t rng = j->seed + (uint64_t)call;
        float *rows[MJ_COMM_MAX_RANKS];
        for (int q = 0; q < j->n; q++) {
            fill(send[q], count, &rng);
            rows[q] = send[q];
        }
        rank_order_sum(rows, j->n, count, want);
        j->s = mj_comm_all_reduce_f32(j->comm, send[rank], recv, count, NULL);
        if (j->s != MJ_OK) snprintf(j->err, sizeof j->err, "call %d: %s", call, mj_last_error());
        else if (count && memcmp(recv, want, (size_t)count * sizeof(float)) != 0) j->bad_calls++;
    }
    return NULL;
}

static void test_loopback_many_calls(int n, int calls, uint64_t seed) {
    mj_comm_t comms[MJ_COMM_MAX_RANKS];
    CHECK_OK(mj_comm_loopback_create(n, comms));
    loop_job jobs[MJ_COMM_MAX_RANKS];
    pthread_t th[MJ_COMM_MAX_RANKS];
    double t0 = test_now_ms();
    for (int r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].comm = comms[r], jobs[r].n = n, jobs[r].calls = calls, jobs[r].seed = seed;
        pthread_create(&th[r], NULL, loop_run, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    printf("loopback: %d ranks, %d calls in a row: %.1f ms\n", n, calls, test_now_ms() - t0);
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].s == MJ_OK, "%d ranks, rank %d: %s", n, r, jobs[r].err);
        CHECK(jobs[r].bad_calls == 0, "%d ranks, rank %d: %d of %d calls summed wrong", n, r,
              jobs[r].bad_calls, calls);
        CHECK_OK(mj_comm_free(comms[r]));
    }
}

/* Calls that every rank must refuse alike, without a hang; the group works on after. */
static void test_loopback_disagree(void) {
    const int n = 4;
    mj_comm_t comms[4];
    CHECK_OK(mj_comm_loopback_create(n, comms));
    float buf[4][16], out[4][16];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 16; i++) buf[r][i] = (float)(r * 100 + i);
    job jobs[4];

    /* count 0: a collective that moves nothing (NULL buffers are fine) */
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], NULL, NULL, 0);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++) CHECK(jobs[r].s == MJ_OK, "count 0, rank %d: %s", r, jobs[r].err);

    /* counts 10, 11, 12, 13 */
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], buf[r], out[r], 10 + r);
    memset(out, 0x55, sizeof out);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].s == MJ_ERR_INVALID_ARG, "count mismatch, rank %d: %s: %s", r,
              mj_status_string(jobs[r].s), jobs[r].err);
        CHECK(strstr(jobs[r].err, "rank 0: 10") && strstr(jobs[r].err, "rank 3: 13") &&
                  strstr(jobs[r].err, "same count"),
              "the message names the counts: %s", jobs[r].err);
        for (int i = 0; i < 16; i++)
            CHECK(out[r][i] == out[0][0] && buf[r][i] == (float)(r * 100 + i),
                  "a refused call wrote rank %d's buffers", r);
    }
    /* one rank's NULL send, then one rank's negative count */
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], r == 2 ? NULL : buf[r], out[r], 16);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++)
        CHECK(jobs[r].s == MJ_ERR_INVALID_ARG && strstr(jobs[r].err, "rank 2 passed a NULL send"),
              "NULL send on rank 2, rank %d: %s: %s", r, mj_status_string(jobs[r].s), jobs[r].err);
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], buf[r], out[r], r == 1 ? -5 : 16);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++)
        CHECK(jobs[r].s == MJ_ERR_INVALID_ARG && strstr(jobs[r].err, "rank 1 passed count -5"),
              "negative count on rank 1, rank %d: %s: %s", r, mj_status_string(jobs[r].s), jobs[r].err);

    /* and then a good call still works */
    for (int r = 0; r < n; r++) jobs[r] = mkjob(comms[r], buf[r], out[r], 16);
    run_ranks(n, jobs);
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].s == MJ_OK, "after the refusals, rank %d: %s", r, jobs[r].err);
        for (int i = 0; i < 16; i++)
            CHECK(out[r][i] == (float)(600 + 4 * i), "rank %d [%d] = %g, want %d", r, i, out[r][i], 600 + 4 * i);
    }
    for (int r = 0; r < n; r++) CHECK_OK(mj_comm_free(comms[r]));
}

static void *job_run_bg(void *arg) { return job_run(arg); }

/* A rank that never arrives; an abort; a handle freed under a waiting rank. */
static void test_loopback_no_hang(void) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    mj_comm_t c[3];

    /* Ranks 0 and 1 call, rank 2 never does: both give up after the timeout. */
    CHECK_OK(mj_comm_loopback_create(3, c));
    CHECK_OK(mj_comm_loopback_set_timeout(c[0], 0.2));
    job jobs[2] = {mkjob(c[0], x, y, 8), mkjob(c[1], x, y, 8)};
    run_ranks(2, jobs);
    for (int r = 0; r < 2; r++) {
        CHECK(jobs[r].s == MJ_ERR_COMM, "rank %d with rank 2 missing: %s: %s", r,
              mj_status_string(jobs[r].s), jobs[r].err);
        CHECK(strstr(jobs[r].err, "rank 2 of 3 did not call") != NULL, "names the missing rank: %s",
              jobs[r].err);
        CHECK(jobs[r].ms >= 150 && jobs[r].ms < 5000, "gave up after %.0f ms (timeout 200 ms)", jobs[r].ms);
    }
    /* The latecomer, and every later call, is told at once. */
    job late = mkjob(c[2], x, y, 8);
    job_run(&late);
    CHECK(late.s == MJ_ERR_COMM && strstr(late.err, "did not call") && late.ms < 100,
          "the latecomer: %s in %.0f ms: %s", mj_status_string(late.s), late.ms, late.err);
    for (int r = 0; r < 3; r++) CHECK_OK(mj_comm_free(c[r]));

    /* mj_comm_abort from another thread ends a waiting rank's call. */
    CHECK_OK(mj_comm_loopback_create(2, c));
    job waiting = mkjob(c[0], x, y, 8);
    pthread_t th;
    pthread_create(&th, NULL, job_run_bg, &waiting);
    usleep(20000);
    CHECK_OK(mj_comm_abort(c[1], "rank 1's experts failed"));
    pthread_join(th, NULL);
    CHECK(waiting.s == MJ_ERR_COMM && strstr(waiting.err, "rank 1's experts failed"),
          "aborted: %s: %s", mj_status_string(waiting.s), waiting.err);
    job again = mkjob(c[1], x, y, 8);
    job_run(&again);
    CHECK(again.s == MJ_ERR_COMM, "a call after the abort: %s", mj_status_string(again.s));
    for (int r = 0; r < 2; r++) CHECK_OK(mj_comm_free(c[r]));

    /* Freeing rank 1's handle ends rank 0's wait. */
    CHECK_OK(mj_comm_loopback_create(2, c));
    waiting = mkjob(c[0], x, y, 8);
    pthread_create(&th, NULL, job_run_bg, &waiting);
    usleep(20000);
    CHECK_OK(mj_comm_free(c[1]));
    pthread_join(th, NULL);
    CHECK(waiting.s == MJ_ERR_COMM && strstr(waiting.err, "rank 1's handle was freed"),
          "freed: %s: %s", mj_status_string(waiting.s), waiting.err);
    CHECK_OK(mj_comm_free(c[0]));
}

static void test_loopback_args(void) {
    mj_comm_t c[MJ_COMM_MAX_RANKS + 1];
    c[0] = (mj_comm_t)&c[1];
    CHECK_STATUS(mj_comm_loopback_create(0, c), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "n_ranks 0") && strstr(mj_last_error(), "1..64"), "%s", mj_last_error());
    CHECK(c[0] == (mj_comm_t)&c[1], "a refused create wrote comms"); /* out of range: untouched */
    CHECK_STATUS(mj_comm_loopback_create(-1, c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_loopback_create(MJ_COMM_MAX_RANKS + 1, c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_loopback_create(2, NULL), MJ_ERR_INVALID_ARG);
    float x[1] = {1};
    CHECK_STATUS(mj_comm_all_reduce_f32(NULL, x, x, 1, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "communicator is NULL") != NULL, "%s", mj_last_error());
    CHECK_STATUS(mj_comm_info(NULL, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_abort(NULL, "x"), MJ_ERR_INVALID_ARG);
    CHECK_OK(mj_comm_free(NULL));
    CHECK(mj_comm_kind(NULL) == MJ_COMM_NONE, "kind of NULL");
    CHECK_STATUS(mj_comm_loopback_set_timeout(NULL, 1.0), MJ_ERR_INVALID_ARG);

    /* The cap, and one rank: info with NULLs, set_timeout's range. */
    CHECK_OK(mj_comm_loopback_create(1, c));
    CHECK_OK(mj_comm_info(c[0], NULL, NULL));
    CHECK_STATUS(mj_comm_loopback_set_timeout(c[0], 0.0), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_loopback_set_timeout(c[0], NAN), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_loopback_set_timeout(c[0], INFINITY), MJ_ERR_INVALID_ARG);
    float y[1] = {0};
    CHECK_OK(mj_comm_all_reduce_f32(c[0], x, y, 1, NULL));
    CHECK(y[0] == 1.0f, "one rank: the sum is the send: %g", y[0]);
    CHECK_OK(mj_comm_free(c[0]));
}

/* ---- NCCL through the stub -------------------------------------------------------------------- */
static char g_log[4096];

/* The comm=%p that a log line starting with `prefix` names, or NULL. */
static void *logged_comm(const char *log, const char *prefix) {
    const char *l = strstr(log, prefix);
    const char *p = l ? strstr(l, "comm=") : NULL;
    void *c = NULL;
    if (!p || sscanf(p, "comm=%p", &c) != 1) return NULL;
    return c;
}

static void test_nccl_stub(void) {
    int code = 0;
    const char *path = NULL;
    CHECK_OK(mj_nccl_version(&code, &path));
    CHECK(code == 22703 && path && !strcmp(path, MJ_STUB_LIBNCCL), "version %d from %s", code, path ? path : "?");
    free(test_take_log(g_log));

    /* The id, and a rank of two. */
    mj_comm_id id;
    memset(&id, 0, sizeof id);
    CHECK_OK(mj_comm_nccl_unique_id(&id));
    CHECK(!strcmp((const char *)id.bytes, "stub-id-1"), "id %.16s", (const char *)id.bytes);
    mj_comm_t c = NULL;
    CHECK_OK(mj_comm_nccl_init_rank(&id, 2, 1, &c));
    int32_t rank = -1, size = -1;
    CHECK_OK(mj_comm_info(c, &rank, &size));
    CHECK(rank == 1 && size == 2 && mj_comm_kind(c) == MJ_COMM_NCCL, "init_rank: rank %d of %d, kind %d",
          rank, size, (int)mj_comm_kind(c));
    char *log = test_take_log(g_log);
    CHECK(strstr(log, "nranks=2 rank=1 id=stub-id-1") != NULL, "init_rank: %s", log);
    void *raw = logged_comm(log, "ncclCommInitRank");
    free(log);
    CHECK_OK(mj_comm_free(c));
    log = test_take_log(g_log);
    char want[256];
    snprintf(want, sizeof want, "ncclCommDestroy comm=%p", raw);
    CHECK(raw && strstr(log, want), "init_rank's comm is destroyed with the handle: %s", log);
    free(log);

    /* The all-reduce hands NCCL exactly the buffers, count, float32, sum, comm and stream. */
    CHECK_OK(mj_comm_nccl_init_rank(&id, 1, 0, &c));
    log = test_take_log(g_log);
    raw = logged_comm(log, "ncclCommInitRank");
    free(log);
    float send[100], recv[100];
    for (int i = 0; i < 100; i++) send[i] = (float)i * 0.5f, recv[i] = -1;
    void *stream = (void *)(uintptr_t)0x5eed;
    CHECK_OK(mj_comm_all_reduce_f32(c, send, recv, 100, stream));
    log = test_take_log(g_log);
    snprintf(want, sizeof want, "ncclAllReduce send=%p recv=%p count=100 datatype=7 op=0 comm=%p stream=%p",
             (void *)send, (void *)recv, raw, stream);
    CHECK(strstr(log, want) != NULL, "want \"%s\" in the log: %s", want, log);
    CHECK(memcmp(send, recv, sizeof send) == 0, "one rank: recv is send");
    free(log);
    CHECK_OK(mj_comm_all_reduce_f32(c, recv, recv, 100, NULL)); /* in place */
    log = test_take_log(g_log);
    snprintf(want, sizeof want, "send=%p recv=%p count=100", (void *)recv, (void *)recv);
    CHECK(strstr(log, want) != NULL, "in place: %s", log);
    free(log);
    /* count 0 enqueues nothing; bad arguments never reach NCCL */
    CHECK_OK(mj_comm_all_reduce_f32(c, NULL, NULL, 0, stream));
    CHECK_STATUS(mj_comm_all_reduce_f32(c, send, recv, -1, stream), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_all_reduce_f32(c, NULL, recv, 4, stream), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "send buffer is NULL") != NULL, "%s", mj_last_error());
    log = test_take_log(g_log);
    CHECK(log[0] == '\0', "count 0 or a refused call reached NCCL: %s", log);
    free(log);
    CHECK_STATUS(mj_comm_abort(c, "x"), MJ_ERR_UNSUPPORTED);

    /* NCCL's error comes back with its string, its last error and the hint. */
    setenv("MJ_STUB_NCCL_FAIL", "ncclAllReduce:5", 1);
    CHECK_STATUS(mj_comm_all_reduce_f32(c, send, recv, 100, stream), MJ_ERR_COMM);
    const char *e = mj_last_error();
    CHECK(strstr(e, "ncclAllReduce of 100 floats") && strstr(e, "NCCL error 5 (invalid usage (stub))") &&
              strstr(e, "stub: ncclAllReduce failed on purpose") && strstr(e, "NCCL_DEBUG=INFO"),
          "the NCCL error: %s", e);
    setenv("MJ_STUB_NCCL_FAIL", "ncclAllReduce:7", 1);
    CHECK_STATUS(mj_comm_all_reduce_f32(c, send, recv, 100, stream), MJ_ERR_COMM);
    CHECK(strstr(mj_last_error(), "non-blocking") != NULL, "ncclInProgress: %s", mj_last_error());
    setenv("MJ_STUB_NCCL_FAIL", "ncclCommInitRank:2", 1);
    mj_comm_t failed = (mj_comm_t)&c;
    CHECK_STATUS(mj_comm_nccl_init_rank(&id, 2, 0, &failed), MJ_ERR_COMM);
    CHECK(failed == NULL && strstr(mj_last_error(), "ncclCommInitRank (rank 0 of 2)") &&
              strstr(mj_last_error(), "unhandled system error (stub)"),
          "init_rank's failure: %s", mj_last_error());
    setenv("MJ_STUB_NCCL_FAIL", "ncclGetUniqueId:3", 1);
    CHECK_STATUS(mj_comm_nccl_unique_id(&id), MJ_ERR_COMM);
    unsetenv("MJ_STUB_NCCL_FAIL");
    CHECK_OK(mj_comm_free(c));
    free(test_take_log(g_log));

    /* Wrap: the engine's comm is used, and not destroyed with the handle. */
    void *lib = dlopen(MJ_STUB_LIBNCCL, RTLD_NOW | RTLD_LOCAL); /* the instance moejit loaded */
    int (*init_rank)(void **, int, mj_comm_id, int) = lib ? (int (*)(void **, int, mj_comm_id, int))dlsym(lib, "ncclCommInitRank") : NULL;
    int (*count)(void *, int *) = lib ? (int (*)(void *, int *))dlsym(lib, "ncclCommCount") : NULL;
    int (*destroy)(void *) = lib ? (int (*)(void *))dlsym(lib, "ncclCommDestroy") : NULL;
    CHECK(init_rank && count && destroy, "the stub's own symbols: %s", dlerror());
    if (init_rank && count && destroy) {
        void *engine = NULL;
        CHECK(init_rank(&engine, 4, id, 3) == 0 && engine, "the engine's comm");
        CHECK_OK(mj_comm_nccl_wrap(engine, &c));
        CHECK_OK(mj_comm_info(c, &rank, &size));
        CHECK(rank == 3 && size == 4, "wrap: rank %d of %d (want 3 of 4)", rank, size);
        free(test_take_log(g_log));
        CHECK_OK(mj_comm_all_reduce_f32(c, send, recv, 7, stream));
        CHECK_OK(mj_comm_free(c));
        log = test_take_log(g_log);
        snprintf(want, sizeof want, "count=7 datatype=7 op=0 comm=%p", engine);
        CHECK(strstr(log, want) && !strstr(log, "ncclCommDestroy"), "wrap: %s", log);
        free(log);
        int n = 0;
        CHECK(count(engine, &n) == 0 && n == 4, "the engine's comm is alive after mj_comm_free");
        CHECK(destroy(engine) == 0, "the engine destroys its own comm");
    }
    if (lib) dlclose(lib);
    c = (mj_comm_t)&c;
    CHECK_STATUS(mj_comm_nccl_wrap(NULL, &c), MJ_ERR_INVALID_ARG);
    CHECK(c == NULL, "a refused wrap leaves *out NULL");
    CHECK_STATUS(mj_comm_nccl_wrap(&c, NULL), MJ_ERR_INVALID_ARG);

    /* init_all on the CUDA stub's one device. */
    mj_comm_t all[2] = {NULL, NULL};
    free(test_take_log(g_log));
    CHECK_OK(mj_comm_nccl_init_all(1, NULL, all));
    CHECK_OK(mj_comm_info(all[0], &rank, &size));
    CHECK(rank == 0 && size == 1, "init_all: rank %d of %d", rank, size);
    log = test_take_log(g_log);
    raw = logged_comm(log, "ncclCommInitAll");
    CHECK(raw && strstr(log, "rank=0 of 1 dev=0"), "init_all: %s", log);
    free(log);
    CHECK_OK(mj_comm_free(all[0]));
    log = test_take_log(g_log);
    snprintf(want, sizeof want, "ncclCommDestroy comm=%p", raw);
    CHECK(strstr(log, want) != NULL, "init_all's comm is destroyed with the handle: %s", log);
    free(log);
    CHECK_STATUS(mj_comm_nccl_init_all(2, NULL, all), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "device 1 does not exist") != NULL, "%s", mj_last_error());
    CHECK(all[0] == NULL && all[1] == NULL, "a refused init_all leaves comms NULL");
    const int32_t twice[2] = {0, 0};
    CHECK_STATUS(mj_comm_nccl_init_all(2, twice, all), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "both on device 0") != NULL, "%s", mj_last_error());
    /* Made, then a handle fails: nothing half-made (the comm destroyed, comms NULL). */
    setenv("MJ_STUB_NCCL_FAIL", "ncclCommCount:3", 1);
    CHECK_STATUS(mj_comm_nccl_init_all(1, NULL, all), MJ_ERR_COMM);
    unsetenv("MJ_STUB_NCCL_FAIL");
    log = test_take_log(g_log);
    raw = logged_comm(log, "ncclCommInitAll");
    snprintf(want, sizeof want, "ncclCommDestroy comm=%p", raw);
    CHECK(all[0] == NULL && raw && strstr(log, want), "init_all's cleanup: %s", log);
    free(log);

    /* Arguments. */
    CHECK_STATUS(mj_comm_nccl_init_all(0, NULL, all), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_init_all(MJ_COMM_MAX_RANKS + 1, NULL, all), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_init_all(1, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_init_rank(&id, 2, 2, &c), MJ_ERR_INVALID_ARG);
    CHECK(c == NULL && strstr(mj_last_error(), "rank 2 is not one of 0..1"), "%s", mj_last_error());
    CHECK_STATUS(mj_comm_nccl_init_rank(&id, 0, 0, &c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_init_rank(NULL, 2, 0, &c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_init_rank(&id, 2, 0, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_comm_nccl_unique_id(NULL), MJ_ERR_INVALID_ARG);
    log = test_take_log(g_log);
    CHECK(log[0] == '\0', "refused calls reached NCCL: %s", log);
    free(log);
}

/* ---- a fresh process per library ------------------------------------------------------------ */
/* Load the library the environment names and print what every call says. */
static int child_nccl(void) {
    mj_status s = mj_nccl_load();
    printf("status=%d\nmessage=%s\n", (int)s, mj_last_error());
    int code = 0;
    const char *path = NULL;
    if (s == MJ_OK) {
        mj_nccl_version(&code, &path);
        printf("version=%d\npath=%s\n", code, path);
    } else {
        mj_comm_id id;
        mj_comm_t c = (mj_comm_t)&id, all[1] = {(mj_comm_t)&id};
        int same = mj_nccl_version(&code, &path) == s && mj_comm_nccl_unique_id(&id) == s &&
                   mj_comm_nccl_init_rank(&id, 1, 0, &c) == s && c == NULL &&
                   mj_comm_nccl_init_all(1, NULL, all) == s && all[0] == NULL &&
                   mj_comm_nccl_wrap(&id, &c) == s && c == NULL;
        printf("same=%d\n", same);
    }
    fflush(stdout);
    return (int)s;
}

/* The default search with no driver: a real NCCL found or not, never a crash, and no GPU
 * means MJ_ERR_NO_DEVICE from init. */
static int child_default(void) {
    setenv("MOEJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    int rc = child_nccl();
    if (rc == MJ_OK) {
        /* An id needs no GPU (NCCL's bootstrap picks a network interface). */
        mj_comm_id id;
        memset(&id, 0, sizeof id);
        mj_status u = mj_comm_nccl_unique_id(&id);
        int nonzero = 0;
        for (size_t i = 0; i < sizeof id.bytes; i++) nonzero += id.bytes[i] != 0;
        printf("unique_id=%d nonzero=%d %s\n", (int)u, nonzero, u == MJ_OK ? "" : mj_last_error());
        mj_comm_t c = NULL, all[1] = {NULL};
        mj_status a = mj_comm_nccl_init_all(1, NULL, all);
        printf("init_all=%d %s\n", (int)a, mj_last_error());
        mj_status b = mj_comm_nccl_init_rank(&id, 1, 0, &c);
        printf("init_rank=%d %s\n", (int)b, mj_last_error());
        fflush(stdout);
        rc = a == MJ_ERR_NO_DEVICE && b == MJ_ERR_NO_DEVICE && all[0] == NULL && c == NULL ? 0 : 99;
    }
    return rc;
}

static int run_child(const char *mode, const char *lib, char *out, size_t len) {
    return test_run_child("test_comm", mode, "MOEJIT_NCCL", lib, out, len);
}

static void test_nccl_loading(void) {
    char out[8192];
    int rc = run_child("--child-nccl", "/nonexistent/libnccl.so.2", out, sizeof out);
    CHECK(rc == MJ_ERR_LIBRARY, "missing library: child exit %d (want %d): %s", rc, (int)MJ_ERR_LIBRARY, out);
    CHECK(strstr(out, "/nonexistent/libnccl.so.2") && strstr(out, "libnccl2") &&
              strstr(out, "nvidia-nccl-cu13") && strstr(out, "MOEJIT_NCCL="),
          "the message names the path and what to install: %s", out);
    CHECK(strstr(out, "same=1") != NULL, "every call fails the same way: %s", out);

    /* A library that is not NCCL (the CUDA stub). */
    rc = run_child("--child-nccl", MJ_STUB_LIBCUDA, out, sizeof out);
    CHECK(rc == MJ_ERR_LIBRARY && strstr(out, "no symbol ncclGetVersion") && strstr(out, "same=1"),
          "not NCCL: child exit %d: %s", rc, out);

    /* An NCCL that is not version 2. */
    setenv("MJ_STUB_NCCL_VERSION", "30000", 1);
    rc = run_child("--child-nccl", MJ_STUB_LIBNCCL, out, sizeof out);
    unsetenv("MJ_STUB_NCCL_VERSION");
    CHECK(rc == MJ_ERR_LIBRARY && strstr(out, "version code 30000") && strstr(out, "same=1"),
          "NCCL 3: child exit %d: %s", rc, out);

    /* The default search: on this machine either a real NCCL 2 or a clear MJ_ERR_LIBRARY. */
    rc = run_child("--child-default", "", out, sizeof out);
    printf("default search: %s", out);
    if (strstr(out, "status=0\n")) {
        int code = 0;
        const char *v = strstr(out, "version=");
        if (v) code = atoi(v + 8);
        CHECK(rc == 0 && code >= 20000 && code < 30000, "a real NCCL 2 (version %d), no GPU: child exit %d: %s",
              code, rc, out);
        char no_dev[32], comm_err[32];
        snprintf(no_dev, sizeof no_dev, "init_all=%d ", (int)MJ_ERR_NO_DEVICE);
        snprintf(comm_err, sizeof comm_err, "unique_id=%d ", (int)MJ_ERR_COMM);
        CHECK(strstr(out, no_dev) && strstr(out, "NCCL needs a CUDA device"),
              "no device: MJ_ERR_NO_DEVICE saying why: %s", out);
        /* The real ncclGetUniqueId through moejit's table: an id, or NCCL's own error. */
        const char *u = strstr(out, "unique_id=");
        CHECK(u && ((!strncmp(u, "unique_id=0 ", 12) && atoi(strstr(u, "nonzero=") + 8) > 0) ||
                    (!strncmp(u, comm_err, strlen(comm_err)) && strstr(u, "NCCL_DEBUG=INFO"))),
              "a real NCCL's unique id: %s", out);
    } else {
        CHECK(rc == MJ_ERR_LIBRARY && strstr(out, "NCCL not found") && strstr(out, "libnccl2") &&
                  strstr(out, "same=1"),
              "no NCCL: child exit %d: %s", rc, out);
    }
}

static uint64_t g_seed;

static int setup(void) {
    alarm(120); /* a hang is a failure, not a stuck CI job */
    g_seed = test_seed(20240611);
    return 0;
}

static void case_loopback_sum(void) {
    const int sizes[] = {1, 2, 4, 8, 64};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) test_loopback_sum(sizes[i], g_seed);
}
static void case_loopback_many_calls(void) {
    test_loopback_many_calls(2, 2000, g_seed);
    test_loopback_many_calls(8, 300, g_seed);
}
/* The communicator on the stub NCCL and the stub driver, logging to a temporary directory. */
static void case_nccl_stub(void) {
    char *dir = test_tmpdir("comm");
    snprintf(g_log, sizeof g_log, "%s/stub.log", dir ? dir : "/tmp");
    setenv("MJ_STUB_LOG", g_log, 1);
    setenv("MOEJIT_NCCL", MJ_STUB_LIBNCCL, 1);
    setenv("MOEJIT_LIBCUDA", MJ_STUB_LIBCUDA, 1);
    test_nccl_stub();
    unlink(g_log);
    if (dir) rmdir(dir);
    free(dir);
}

static const test_case cases[] = {
    TEST_CASE("loopback_args", test_loopback_args),
    TEST_CASE("loopback_sum", case_loopback_sum),
    TEST_CASE("loopback_many_calls", case_loopback_many_calls),
    TEST_CASE("loopback_disagree", test_loopback_disagree),
    TEST_CASE("loopback_no_hang", test_loopback_no_hang),
    TEST_CASE("nccl_loading", test_nccl_loading),
    TEST_CASE("nccl_stub", case_nccl_stub),
};

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child-nccl")) return child_nccl();
    if (argc > 1 && !strcmp(argv[1], "--child-default")) return child_default();
    return test_main(argc, argv, cases, TEST_N(cases), setup, NULL);
}
