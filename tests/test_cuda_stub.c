/* test_cuda_stub.c — the host side of the CUDA path, on a machine without a GPU: the driver
 * is tests/stub/cuda_stub.c (loaded through MOEJIT_LIBCUDA), which checks what the real
 * driver would refuse and logs every launch. Covered: the device's target, module loads,
 * the dynamic shared memory opt-in above 48 KiB (once per size), the target's shared
 * memory limit, memory calls needing a current context; streams, events (the stub's clock:
 * 10 us a kernel, a device-to-device copy at 1000 GB/s counting bytes read and written) and
 * CUDA graphs (captured launches replayed; calls a capture forbids refused and the capture
 * invalidated). */
#include "mj_test_registry.h"
#include "test.h"

static char g_log[4096];

/* Streams, events, copies and graphs through runtime/cuda/driver.c, against the stub. */
static void test_streams_events_graphs(const mj_function *f) {
    int ver = 0;
    CHECK_OK(mj_cuda_driver_version(&ver));
    CHECK(ver > 0, "driver version %d", ver);
    void *s = NULL, *e0 = NULL, *e1 = NULL;
    CHECK_OK(mj_cuda_stream_create(&s));
    CHECK_OK(mj_cuda_event_create(&e0));
    CHECK_OK(mj_cuda_event_create(&e1));
    if (!s || !e0 || !e1) return;
    /* A copy of 1 MB: 2 MB moved at 1000 GB/s = 2 us. */
    uint64_t a = 0, b = 0;
    CHECK_OK(mj_cuda_malloc(1000000, &a));
    CHECK_OK(mj_cuda_malloc(1000000, &b));
    uint8_t host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (uint8_t)(i * 7 + 1);
    CHECK_OK(mj_cuda_memcpy_htod(a, host, 64));
    CHECK_OK(mj_cuda_event_record(e0, s));
    CHECK_OK(mj_cuda_memcpy_dtod_async(b, a, 1000000, s));
    CHECK_OK(mj_cuda_event_record(e1, s));
    CHECK_OK(mj_cuda_event_synchronize(e1));
    float ms = -1;
    CHECK_OK(mj_cuda_event_elapsed(e0, e1, &ms));
    CHECK(fabsf(ms - 0.002f) < 1e-6f, "1 MB copy: %g ms, want 0.002", ms);
    CHECK_OK(mj_cuda_memcpy_dtoh(back, b, 64));
    CHECK(!memcmp(host, back, 64), "the device-to-device copy moved the bytes");
    CHECK_OK(mj_cuda_memcpy_dtod(a, b, 64));
    /* Two launches timed: 20 us. */
    mj_launch_dims d = {{4, 1, 1}, {128, 1, 1}, 0, s};
    CHECK_OK(mj_cuda_event_record(e0, s));
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    CHECK_OK(mj_cuda_event_record(e1, s));
    CHECK_OK(mj_cuda_stream_synchronize(s));
    CHECK_OK(mj_cuda_event_elapsed(e0, e1, &ms));
    CHECK(fabsf(ms - 0.020f) < 1e-6f, "two kernels: %g ms, want 0.020", ms);
    free(test_take_log(g_log));
    /* A graph of three launches: nothing runs while capturing; each replay runs all three. */
    void *g = NULL, *x = NULL;
    CHECK_OK(mj_cuda_graph_capture_begin(s));
    for (int i = 0; i < 3; i++) CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    CHECK_OK(mj_cuda_graph_capture_end(s, &g));
    CHECK_OK(mj_cuda_graph_instantiate(g, &x));
    char *log = test_take_log(g_log);
    CHECK(strstr(log, "cuStreamEndCapture: 3 nodes") && !strstr(log, "\ncuLaunchKernel"), "capture: %s", log);
    free(log);
    CHECK_OK(mj_cuda_event_record(e0, s));
    CHECK_OK(mj_cuda_graph_launch(x, s));
    CHECK_OK(mj_cuda_graph_launch(x, s));
    CHECK_OK(mj_cuda_event_record(e1, s));
    CHECK_OK(mj_cuda_event_elapsed(e0, e1, &ms));
    CHECK(fabsf(ms - 0.060f) < 1e-6f, "two replays of 3 kernels: %g ms, want 0.060", ms);
    log = test_take_log(g_log);
    int n = 0, starts = 0; /* one line a call: each launch starts a line, and the log ends one */
    for (char *q = log; (q = strstr(q, "cuLaunchKernel fixture_saxpy")); q++) n++, starts += q == log || q[-1] == '\n';
    CHECK(n == 6 && starts == 6 && *log && log[strlen(log) - 1] == '\n', "two replays ran %d launches (%d at a line's start), want 6: %s", n, starts, log);
    free(log);
    CHECK_OK(mj_cuda_graph_exec_destroy(x));
    CHECK_OK(mj_cuda_graph_destroy(g));
    /* An allocation during the capture is refused and breaks it; the stream is usable after. */
    CHECK_OK(mj_cuda_graph_capture_begin(s));
    uint64_t p = 0;
    CHECK_STATUS(mj_cuda_malloc(64, &p), MJ_ERR_CUDA);
    CHECK(strstr(mj_last_error(), "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED") != NULL, "%s", mj_last_error());
    g = (void *)1;
    CHECK_STATUS(mj_cuda_graph_capture_end(s, &g), MJ_ERR_CUDA);
    CHECK(g == NULL && strstr(mj_last_error(), "INVALIDATED"), "invalidated capture: %p %s", g, mj_last_error());
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    /* Bad arguments are named. */
    CHECK_STATUS(mj_cuda_graph_capture_begin(NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "mj_cuda_stream_create") != NULL, "%s", mj_last_error());
    CHECK_STATUS(mj_cuda_event_elapsed(e0, NULL, &ms), MJ_ERR_INVALID_ARG);
    CHECK_OK(mj_cuda_free(a));
    CHECK_OK(mj_cuda_free(b));
    CHECK_OK(mj_cuda_event_destroy(e0));
    CHECK_OK(mj_cuda_event_destroy(e1));
    CHECK_OK(mj_cuda_stream_destroy(s));
    free(test_take_log(g_log));
}

/* The stub driver, its log in a temporary file; a context on it, and fixture_saxpy loaded in
 * it (made on first use: ctx_saxpy). */
static char *g_dir;
static mj_context_t g_ctx;
static const mj_function *g_saxpy;

static int setup(void) {
    g_dir = test_tmpdir("stub");
    snprintf(g_log, sizeof g_log, "%s.log", g_dir);
    setenv("MOEJIT_LIBCUDA", MJ_STUB_LIBCUDA, 1);
    setenv("MJ_STUB_LOG", g_log, 1);
    unlink(g_log);
    return 0;
}

static void teardown(void) {
    mj_context_destroy(g_ctx);
    test_rm_rf(g_dir);
    free(g_dir);
    unlink(g_log);
}

/* The context on the stub device (sm_120a) and fixture_saxpy in it, its module loaded. */
static const mj_function *ctx_saxpy(void) {
    if (g_ctx) return g_saxpy;
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = test_shared_cache();
    CHECK_OK(mj_context_create(&o, &g_ctx));
    if (!g_ctx) return NULL;
    mj_backend b;
    const char *target;
    CHECK_OK(mj_context_backend(g_ctx, &b, &target));
    CHECK(b == MJ_BACKEND_CUDA && !strcmp(target, "sm_120a"), "stub device: backend %d target %s", (int)b, target);

    mj_knobs_fixture_saxpy kn = {.BLOCK = 128, .VEC = 1};
    mj_spec s;
    mj_spec_fixture_saxpy(g_ctx, &kn, &s);
    CHECK_OK(mj_jit_get(g_ctx, &s, &g_saxpy));
    if (!g_saxpy) return NULL;
    char *log = test_take_log(g_log);
    CHECK(strstr(log, "cuModuleLoadData") != NULL, "module not loaded: %s", log);
    free(log);
    return g_saxpy;
}

/* Dynamic shared memory: opted in past 48 KiB, once a size, up to the target's limit. */
static void test_smem(void) {
    const mj_function *f = ctx_saxpy();
    if (!f) return;
    char *log;
    /* Up to 48 KiB: no opt-in needed. */
    mj_launch_dims d = {{4, 1, 1}, {128, 1, 1}, 48 * 1024, NULL};
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = test_take_log(g_log);
    CHECK(!strstr(log, "cuFuncSetAttribute") && strstr(log, "cuLaunchKernel fixture_saxpy grid 4,1,1 block 128,1,1 smem 49152"),
          "48 KiB launch: %s", log);
    free(log);
    /* 64 KiB: the kernel opts in first, once. */
    d.smem = 64 * 1024;
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = test_take_log(g_log);
    char *set = strstr(log, "cuFuncSetAttribute fixture_saxpy max_dynamic_smem 65536");
    char *launch = strstr(log, "cuLaunchKernel fixture_saxpy grid 4,1,1 block 128,1,1 smem 65536");
    CHECK(set && launch && set < launch, "64 KiB launch must opt in first: %s", log);
    CHECK(set && !strstr(set + 1, "cuFuncSetAttribute"), "opted in twice for the same size: %s", log);
    free(log);
    /* More: opts in again, up to the target's limit. */
    d.smem = 101376;
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = test_take_log(g_log);
    CHECK(strstr(log, "max_dynamic_smem 101376") != NULL, "99 KiB launch: %s", log);
    free(log);
    /* Past what sm_120a gives a block: refused before the driver is asked. */
    d.smem = 101376 + 1024;
    CHECK_STATUS(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "sm_120a allows at most 101376") != NULL, "%s", mj_last_error());
    log = test_take_log(g_log);
    CHECK(log[0] == '\0', "a refused launch reached the driver: %s", log);
    free(log);
}

/* Device memory needs a current context: a thread that bound the device has one. */
static void test_device_memory(void) {
    if (!ctx_saxpy()) return;
    uint64_t p = 0;
    CHECK_OK(mj_cuda_bind(0));
    CHECK_OK(mj_cuda_malloc(256, &p));
    CHECK_OK(mj_cuda_free(p));
}

static void case_streams_events_graphs(void) {
    const mj_function *f = ctx_saxpy();
    if (f) test_streams_events_graphs(f);
}

/* Programmatic dependent launch: a template that declares MJ_PDL (router_gemm) launches
 * through cuLaunchKernelEx with programmatic stream serialization on this sm_120a device, a
 * template that does not (fixture_saxpy) plainly, and MOEJIT_PDL=0 turns it off. */
static void test_pdl(void) {
    const mj_function *saxpy = ctx_saxpy();
    if (!saxpy) return;
    free(test_take_log(g_log));
    mj_knobs_router_gemm kn = {.H = 256, .E = 8, .ROWS = 8, .NWARPS = 1};
    mj_launch_dims d = {{8, 1, 1}, {32, 1, 1}, 0, NULL};
    for (int off = 0; off < 2; off++) {
        if (off) setenv("MOEJIT_PDL", "0", 1);
        mj_context_t c = NULL;
        mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
        o.cache_dir = test_shared_cache();
        CHECK_OK(mj_context_create(&o, &c));
        unsetenv("MOEJIT_PDL");
        if (!c) return;
        mj_spec s;
        const mj_function *f = NULL;
        mj_spec_router_gemm(c, &kn, &s);
        CHECK_OK(mj_jit_get(c, &s, &f));
        uint64_t buf = 0;
        CHECK_OK(mj_cuda_malloc(1 << 16, &buf));
        const uint16_t *p16 = (const uint16_t *)(uintptr_t)buf;
        if (f) CHECK_OK(mj_launch_router_gemm(f, d, p16, p16, 1, 1, (float *)(uintptr_t)buf, NULL, NULL));
        CHECK_OK(mj_launch_fixture_saxpy(saxpy, d, 512, 2.0f, NULL, NULL));
        CHECK_OK(mj_cuda_free(buf));
        char *log = test_take_log(g_log);
        const int ex = strstr(log, "cuLaunchKernelEx router_gemm pdl") != NULL;
        CHECK(ex == !off, "MOEJIT_PDL %s: router_gemm %s through cuLaunchKernelEx: %s", off ? "0" : "unset",
              ex ? "launched" : "not launched", log);
        CHECK(strstr(log, "cuLaunchKernel router_gemm grid 8,1,1") != NULL, "router_gemm ran: %s", log);
        CHECK(!strstr(log, "cuLaunchKernelEx fixture_saxpy") && strstr(log, "cuLaunchKernel fixture_saxpy"),
              "fixture_saxpy (no MJ_PDL) launched plainly: %s", log);
        free(log);
        mj_context_destroy(c);
    }
}

static const test_case cases[] = {
    TEST_CASE("pdl", test_pdl),
    TEST_CASE("smem", test_smem),
    TEST_CASE("device_memory", test_device_memory),
    TEST_CASE("streams_events_graphs", case_streams_events_graphs),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
