/* test_nccl_gpu.c — the NCCL communicator on a real GPU: one rank made by
 * mj_comm_nccl_init_all(1) and by unique_id + init_rank, its all-reduce (out of place, in
 * place, and captured in a CUDA graph and replayed) checked bit for bit; then two ranks on
 * the one GPU, which NCCL normally refuses ("duplicate GPU"): the test says which it did, and
 * when it allows them checks their sum. Exit 77 without a GPU, or without libnccl.so.2 (the
 * message says what to install or set: MOEJIT_NCCL).
 *
 *   test_nccl_gpu [CASE...] [--stub]   --stub: the host path on the stub driver and stub NCCL
 *                                      (values unchecked where the stubs do not compute them);
 *                                      CASE: init_all, init_rank, two_ranks (test.h) */
#include "test.h"

#include <errno.h>
#include <pthread.h>

static int g_values = 1;
enum { N = 4099 }; /* floats: not a multiple of anything NCCL likes */
enum { TWO_RANKS_GUARD_S = 45 }; /* scripts/gpu/run.sh gives the whole test 90 s */

static void fill(float *x, int n, int rank) {
    for (int i = 0; i < n; i++) x[i] = (float)((i % 97) - 48) * 0.125f + (float)rank * 1000.0f;
}

/* One rank's all-reduce of N floats, out of place then in place; sum of ranks 0..n_ranks-1. */
static void check_all_reduce(mj_comm_t c, int rank, int n_ranks, void *stream, const char *what) {
    float *h = malloc(4 * N), *want = malloc(4 * N), *got = malloc(4 * N);
    for (int i = 0; i < N; i++) want[i] = 0;
    for (int r = 0; r < n_ranks; r++) {
        fill(h, N, r);
        for (int i = 0; i < N; i++) want[i] += h[i];
    }
    fill(h, N, rank);
    uint64_t s = 0, d = 0;
    CHECK_OK(mj_cuda_malloc(4 * N, &s));
    CHECK_OK(mj_cuda_malloc(4 * N, &d));
    CHECK_OK(mj_cuda_memcpy_htod(s, h, 4 * N));
    CHECK_OK(mj_cuda_synchronize()); /* a pageable copy may still be in flight; stream is unordered with it */
    CHECK_OK(mj_comm_all_reduce_f32(c, (const float *)(uintptr_t)s, (float *)(uintptr_t)d, N, stream));
    CHECK_OK(stream ? mj_cuda_stream_synchronize(stream) : mj_cuda_synchronize());
    CHECK_OK(mj_cuda_memcpy_dtoh(got, d, 4 * N));
    if (g_values) CHECK(!memcmp(got, want, 4 * N), "%s: the all-reduce's sum differs (out of place)", what);
    CHECK_OK(mj_comm_all_reduce_f32(c, (const float *)(uintptr_t)s, (float *)(uintptr_t)s, N, stream));
    CHECK_OK(stream ? mj_cuda_stream_synchronize(stream) : mj_cuda_synchronize());
    CHECK_OK(mj_cuda_memcpy_dtoh(got, s, 4 * N));
    if (g_values) CHECK(!memcmp(got, want, 4 * N), "%s: the all-reduce's sum differs (in place)", what);
    CHECK_OK(mj_cuda_free(s));
    CHECK_OK(mj_cuda_free(d));
    free(h), free(want), free(got);
}

/* The all-reduce captured in a CUDA graph, replayed twice on new data. */
static void check_graph(mj_comm_t c) {
    void *stream = NULL, *g = NULL, *x = NULL;
    CHECK_OK(mj_cuda_stream_create(&stream));
    uint64_t s = 0, d = 0;
    float *h = malloc(4 * N), *got = malloc(4 * N);
    CHECK_OK(mj_cuda_malloc(4 * N, &s));
    CHECK_OK(mj_cuda_malloc(4 * N, &d));
    CHECK_OK(mj_cuda_graph_capture_begin(stream));
    CHECK_OK(mj_comm_all_reduce_f32(c, (const float *)(uintptr_t)s, (float *)(uintptr_t)d, N, stream));
    CHECK_OK(mj_cuda_graph_capture_end(stream, &g));
    if (g) CHECK_OK(mj_cuda_graph_instantiate(g, &x));
    for (int rep = 0; rep < 2 && x; rep++) {
        fill(h, N, 7 + rep);
        CHECK_OK(mj_cuda_memcpy_htod(s, h, 4 * N));
        CHECK_OK(mj_cuda_synchronize()); /* the copy landed before the non-blocking stream reads it */
        CHECK_OK(mj_cuda_graph_launch(x, stream));
        CHECK_OK(mj_cuda_stream_synchronize(stream));
        CHECK_OK(mj_cuda_memcpy_dtoh(got, d, 4 * N));
        if (g_values) CHECK(!memcmp(got, h, 4 * N), "graph replay %d: one rank's all-reduce is not the identity", rep);
    }
    CHECK_OK(mj_cuda_graph_exec_destroy(x));
    CHECK_OK(mj_cuda_graph_destroy(g));
    CHECK_OK(mj_cuda_free(s));
    CHECK_OK(mj_cuda_free(d));
    CHECK_OK(mj_cuda_stream_destroy(stream));
    free(h), free(got);
}

typedef struct two {
    mj_comm_id id;
    int rank;
    mj_status st;
    char err[1024];
    mj_comm_t c;
} two;

/* One of two ranks on one GPU, on a stream of its own (on the one context's NULL stream the
 * two ranks' all-reduces would serialize: each waits for the other, a deadlock). */
static void *two_main(void *arg) {
    two *t = arg;
    void *stream = NULL;
    t->st = mj_cuda_bind(0);
    if (t->st == MJ_OK) t->st = mj_cuda_stream_create(&stream);
    if (t->st == MJ_OK) t->st = mj_comm_nccl_init_rank(&t->id, 2, t->rank, &t->c);
    if (t->st != MJ_OK) snprintf(t->err, sizeof t->err, "%s", mj_last_error());
    else check_all_reduce(t->c, t->rank, 2, stream, "two ranks on one GPU");
    if (stream) CHECK_OK(mj_cuda_stream_destroy(stream));
    return NULL;
}

/* What the cases share (setup): a GPU (with --stub, the stub driver and stub NCCL, and the
 * stub's log, checked at the end) and NCCL; exit 77 without either. Whether NCCL is there is
 * asked by making one rank with init_all(1): g_all, the first case's communicator. */
static mj_comm_t g_all;

static int setup(void) {
    if (!g_values) {
        setenv("MOEJIT_LIBCUDA", MJ_STUB_LIBCUDA, 1);
        setenv("MOEJIT_NCCL", MJ_STUB_LIBNCCL, 1);
        test_stub_log_begin();
    }
    const int rc = test_gpu_or_skip("runs NCCL on a GPU");
    if (rc) return rc;
    mj_comm_t all[1] = {NULL};
    mj_status st = mj_comm_nccl_init_all(1, NULL, all);
    if (st == MJ_ERR_LIBRARY) {
        printf("SKIP: no NCCL: %s\n", mj_last_error());
        return 77;
    }
    CHECK_OK(st);
    g_all = all[0];
    return 0;
}

/* The probe's communicator, when the first case did not take it: freed before another is made
 * (one communicator at a time, as when every case runs) and at the end. */
static void drop_probe(void) {
    if (g_all) CHECK_OK(mj_comm_free(g_all));
    g_all = NULL;
}

static void teardown(void) {
    drop_probe();
    if (!g_values) test_stub_log_end();
}

/* One rank made by init_all(1): its all-reduce out of place, in place and from a CUDA graph. */
static void test_init_all(void) {
    if (g_all) {
        int32_t r = -1, nr = -1;
        CHECK_OK(mj_comm_info(g_all, &r, &nr));
        CHECK(r == 0 && nr == 1, "init_all(1): rank %d of %d", (int)r, (int)nr);
        check_all_reduce(g_all, 0, 1, NULL, "init_all(1)");
        check_graph(g_all);
        CHECK_OK(mj_comm_free(g_all));
        g_all = NULL;
        printf("one rank (init_all): all-reduce out of place, in place and from a CUDA graph: %s\n",
               g_values ? "checked" : "run (stub)");
    }
}

/* One rank made by unique_id + init_rank: its all-reduce on a stream. */
static void test_init_rank(void) {
    drop_probe();
    mj_comm_id id;
    mj_comm_t c = NULL;
    CHECK_OK(mj_comm_nccl_unique_id(&id));
    CHECK_OK(mj_comm_nccl_init_rank(&id, 1, 0, &c));
    if (c) {
        void *stream = NULL;
        CHECK_OK(mj_cuda_stream_create(&stream));
        check_all_reduce(c, 0, 1, stream, "unique_id + init_rank(1)");
        CHECK_OK(mj_cuda_stream_destroy(stream));
        CHECK_OK(mj_comm_free(c));
        printf("one rank (unique_id + init_rank): all-reduce on a stream: %s\n", g_values ? "checked" : "run (stub)");
    }
}

static void test_two_ranks(void) {
    drop_probe();
    /* Two ranks on the one GPU: refused (the usual answer) or, if this NCCL allows it, summed. */
    two t[2];
    memset(t, 0, sizeof t);
    CHECK_OK(mj_comm_nccl_unique_id(&t[0].id));
    t[1].id = t[0].id, t[1].rank = 1;
    pthread_t th[2];
    for (int r = 0; r < 2; r++) CHECK(pthread_create(&th[r], NULL, two_main, &t[r]) == 0, "thread %d", r);
    /* One deadline for both, well inside run.sh's 90 s for this step: a hang is reported as
     * one, not killed as a timeout. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += TWO_RANKS_GUARD_S;
    for (int r = 0; r < 2; r++) {
        int jr = pthread_timedjoin_np(th[r], NULL, &dl);
        if (jr == ETIMEDOUT) {
            CHECK(0, "two ranks on one GPU: rank %d did not return from NCCL within %d s (a hang, not a refusal)", r,
                  TWO_RANKS_GUARD_S);
            printf("two ranks on one GPU: NCCL hung\n");
            fflush(stdout);
            test_finish();
            _exit(1);
        }
    }
    if (t[0].st == MJ_OK && t[1].st == MJ_OK) {
        printf("two ranks on one GPU: this NCCL allows them; their all-reduce %s\n",
               g_values ? "summed and checked" : "run (stub: values unchecked)");
    } else {
        printf("two ranks on one GPU: refused by NCCL, as expected (rank 0: %s; rank 1: %s)\n",
               t[0].st == MJ_OK ? "ok" : t[0].err, t[1].st == MJ_OK ? "ok" : t[1].err);
        CHECK(t[0].st == MJ_ERR_COMM || t[1].st == MJ_ERR_COMM, "the refusal is MJ_ERR_COMM with NCCL's text");
    }
    for (int r = 0; r < 2; r++) mj_comm_free(t[r].c);
}

static const test_case cases[] = {
    TEST_CASE("init_all", test_init_all),
    TEST_CASE("init_rank", test_init_rank),
    TEST_CASE("two_ranks", test_two_ranks),
};

int main(int argc, char **argv) {
    if (test_take_flag(&argc, argv, "--stub")) g_values = 0;
    return test_main(argc, argv, cases, TEST_N(cases), setup, teardown);
}
