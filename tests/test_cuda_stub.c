/* test_cuda_stub.c — the host side of the CUDA path, on a machine without a GPU: the driver
 * is tests/stub/cuda_stub.c (loaded through MOEJIT_LIBCUDA), which checks what the real
 * driver would refuse and logs every launch. Covered: the device's target, module loads,
 * the dynamic shared memory opt-in above 48 KiB (once per size), the target's shared
 * memory limit, memory calls needing a current context. */
#include "mj_test_registry.h"
#include "test.h"

static char g_log[4096];

/* The stub's log so far, and then empty it. */
static char *take_log(void) {
    FILE *f = fopen(g_log, "r");
    char *text = calloc(1, 1 << 16);
    if (f) {
        size_t n = fread(text, 1, (1 << 16) - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    unlink(g_log);
    return text;
}

int main(void) {
    char *dir = test_tmpdir("stub");
    snprintf(g_log, sizeof g_log, "%s.log", dir);
    setenv("MOEJIT_LIBCUDA", MJ_STUB_LIBCUDA, 1);
    setenv("MJ_STUB_LOG", g_log, 1);
    unlink(g_log);

    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = test_shared_cache();
    mj_context_t ctx = NULL;
    CHECK_OK(mj_context_create(&o, &ctx));
    if (!ctx) return test_finish();
    mj_backend b;
    const char *target;
    CHECK_OK(mj_context_backend(ctx, &b, &target));
    CHECK(b == MJ_BACKEND_CUDA && !strcmp(target, "sm_120a"), "stub device: backend %d target %s", (int)b, target);

    mj_knobs_fixture_saxpy kn = {.BLOCK = 128, .VEC = 1};
    mj_spec s;
    const mj_function *f = NULL;
    mj_spec_fixture_saxpy(ctx, &kn, &s);
    CHECK_OK(mj_jit_get(ctx, &s, &f));
    if (!f) return test_finish();
    char *log = take_log();
    CHECK(strstr(log, "cuModuleLoadData") != NULL, "module not loaded: %s", log);
    free(log);

    /* Up to 48 KiB: no opt-in needed. */
    mj_launch_dims d = {{4, 1, 1}, {128, 1, 1}, 48 * 1024, NULL};
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = take_log();
    CHECK(!strstr(log, "cuFuncSetAttribute") && strstr(log, "cuLaunchKernel fixture_saxpy grid 4,1,1 block 128,1,1 smem 49152"),
          "48 KiB launch: %s", log);
    free(log);
    /* 64 KiB: the kernel opts in first, once. */
    d.smem = 64 * 1024;
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = take_log();
    char *set = strstr(log, "cuFuncSetAttribute fixture_saxpy max_dynamic_smem 65536");
    char *launch = strstr(log, "cuLaunchKernel fixture_saxpy grid 4,1,1 block 128,1,1 smem 65536");
    CHECK(set && launch && set < launch, "64 KiB launch must opt in first: %s", log);
    CHECK(set && !strstr(set + 1, "cuFuncSetAttribute"), "opted in twice for the same size: %s", log);
    free(log);
    /* More: opts in again, up to the target's limit. */
    d.smem = 101376;
    CHECK_OK(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL));
    log = take_log();
    CHECK(strstr(log, "max_dynamic_smem 101376") != NULL, "99 KiB launch: %s", log);
    free(log);
    /* Past what sm_120a gives a block: refused before the driver is asked. */
    d.smem = 101376 + 1024;
    CHECK_STATUS(mj_launch_fixture_saxpy(f, d, 512, 2.0f, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "sm_120a allows at most 101376") != NULL, "%s", mj_last_error());
    log = take_log();
    CHECK(log[0] == '\0', "a refused launch reached the driver: %s", log);
    free(log);

    /* Device memory needs a current context: a thread that bound the device has one. */
    uint64_t p = 0;
    CHECK_OK(mj_cuda_bind(0));
    CHECK_OK(mj_cuda_malloc(256, &p));
    CHECK_OK(mj_cuda_free(p));

    mj_context_destroy(ctx);
    test_rm_rf(dir);
    free(dir);
    unlink(g_log);
    return test_finish();
}
