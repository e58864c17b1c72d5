/* test_cuda.c — targets (names, parsing, compute capabilities) and the dlopen'd driver.
 * Without a driver or a GPU every driver call must fail cleanly with MJ_ERR_NO_DEVICE;
 * with one, a kernel compiled by NVRTC for the device is loaded, launched and checked.
 * Driver-loading failures are tested in child processes (the load is once per process),
 * through $MOEJIT_LIBCUDA, on any machine. */
#include "jit.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- targets ----------------------------------------------------------------------- */
static void test_targets(void) {
    static const struct {
        mj_target t;
        const char *name;
        int sm;
    } k[] = {
        {MJ_TARGET_SM80, "sm_80", 80},     {MJ_TARGET_SM86, "sm_86", 86},
        {MJ_TARGET_SM89, "sm_89", 89},     {MJ_TARGET_SM90A, "sm_90a", 90},
        {MJ_TARGET_SM100A, "sm_100a", 100}, {MJ_TARGET_SM120A, "sm_120a", 120},
        {MJ_TARGET_SM121A, "sm_121a", 121},
    };
    CHECK(sizeof k / sizeof k[0] == MJ_TARGET_COUNT, "every target listed");
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        CHECK(strcmp(mj_target_name(k[i].t), k[i].name) == 0, "name %s: %s", k[i].name,
              mj_target_name(k[i].t));
        CHECK(mj_target_sm(k[i].t) == k[i].sm, "%s: sm %d", k[i].name, mj_target_sm(k[i].t));
        mj_target t = MJ_TARGET_COUNT;
        CHECK_OK(mj_target_parse(k[i].name, &t));
        CHECK(t == k[i].t, "parse %s -> %d", k[i].name, (int)t);
        t = MJ_TARGET_COUNT;
        CHECK_OK(mj_target_parse(k[i].name + 3, &t)); /* "120a" */
        CHECK(t == k[i].t, "parse %s -> %d", k[i].name + 3, (int)t);
        /* Names round-trip. */
        t = MJ_TARGET_COUNT;
        CHECK_OK(mj_target_parse(mj_target_name(k[i].t), &t));
        CHECK(t == k[i].t, "round trip %s", k[i].name);
    }
    CHECK(mj_target_name(MJ_TARGET_COUNT) != NULL && mj_target_sm(MJ_TARGET_COUNT) == 0,
          "an invalid target has a printable name and sm 0");
    CHECK(mj_target_sm((mj_target)-1) == 0, "negative target");

    /* Compute capabilities. */
    static const struct {
        int major, minor;
        mj_target t;
    } cc[] = {
        {8, 0, MJ_TARGET_SM80},    {8, 6, MJ_TARGET_SM86},    {8, 7, MJ_TARGET_SM86},
        {8, 9, MJ_TARGET_SM89},    {9, 0, MJ_TARGET_SM90A},   {10, 0, MJ_TARGET_SM100A},
        {10, 3, MJ_TARGET_SM100A}, {12, 0, MJ_TARGET_SM120A}, {12, 1, MJ_TARGET_SM121A},
    };
    for (size_t i = 0; i < sizeof cc / sizeof cc[0]; i++) {
        mj_target t = MJ_TARGET_COUNT;
        CHECK_OK(mj_target_from_cc(cc[i].major, cc[i].minor, &t));
        CHECK(t == cc[i].t, "cc %d.%d -> %s", cc[i].major, cc[i].minor, mj_target_name(t));
        char s[16];
        snprintf(s, sizeof s, "%d.%d", cc[i].major, cc[i].minor);
        t = MJ_TARGET_COUNT;
        CHECK_OK(mj_target_parse(s, &t));
        CHECK(t == cc[i].t, "parse %s -> %s", s, mj_target_name(t));
    }
    static const int refused[][2] = {{7, 5}, {11, 0}, {13, 0}, {8, 8}, {9, 1}, {12, 2}, {0, 0},
                                     {-1, 0}, {8, -1}, {8, 10}, {10, 1}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        mj_target t = MJ_TARGET_SM121A;
        CHECK_STATUS(mj_target_from_cc(refused[i][0], refused[i][1], &t), MJ_ERR_UNSUPPORTED);
        char want[32];
        snprintf(want, sizeof want, "%d.%d", refused[i][0], refused[i][1]);
        CHECK(strstr(mj_last_error(), want) != NULL, "message names %s: %s", want, mj_last_error());
        CHECK(t == MJ_TARGET_SM121A, "out untouched on refusal");
    }
    mj_target t;
    CHECK_STATUS(mj_target_parse("7.5", &t), MJ_ERR_UNSUPPORTED);
    CHECK(strstr(mj_last_error(), "7.5") != NULL, "message: %s", mj_last_error());
    CHECK_STATUS(mj_target_parse("13.0", &t), MJ_ERR_UNSUPPORTED);
    CHECK_STATUS(mj_target_from_cc(8, 0, NULL), MJ_ERR_INVALID_ARG);

    /* Spellings that are not targets. */
    CHECK_STATUS(mj_target_parse("sm_120", &t), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "did you mean sm_120a") != NULL, "hint: %s", mj_last_error());
    CHECK_STATUS(mj_target_parse("90", &t), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "sm_90a") != NULL, "hint: %s", mj_last_error());
    static const char *const bad[] = {"", "sm_", "sm_75", "compute_80", "12.", ".0", "12.0a",
                                      "sm_120b", "sm_80 ", " sm_80", "abc", "sm_1200a",
                                      "99999999999.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mj_status s = mj_target_parse(bad[i], &t);
        CHECK(s == MJ_ERR_INVALID_ARG || s == MJ_ERR_UNSUPPORTED, "parse '%s' -> %s", bad[i],
              mj_status_string(s));
        CHECK(strstr(mj_last_error(), "sm_80") != NULL || strstr(mj_last_error(), "8.0") != NULL,
              "'%s': the message lists what is accepted: %s", bad[i], mj_last_error());
    }
    CHECK_STATUS(mj_target_parse(NULL, &t), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_target_parse("sm_80", NULL), MJ_ERR_INVALID_ARG);
    t = MJ_TARGET_COUNT;
    CHECK_OK(mj_target_parse("SM_120A", &t));
    CHECK(t == MJ_TARGET_SM120A, "case does not matter");
}

/* ---- no device: everything fails cleanly ------------------------------------------- */
static void test_no_device(mj_status load) {
    CHECK(load == MJ_ERR_NO_DEVICE || load == MJ_ERR_LIBRARY, "load: %s", mj_status_string(load));
    CHECK(strlen(mj_last_error()) > 10, "load failure explained: '%s'", mj_last_error());
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", mj_last_error());
    CHECK(mj_cuda_load() == load && strcmp(mj_last_error(), msg) == 0,
          "a second load fails the same way");
    int n = 7;
    CHECK_STATUS(mj_cuda_device_count(&n), load);
    CHECK(n == 0, "no devices: %d", n);
    mj_device_info info;
    CHECK_STATUS(mj_cuda_device_info(0, &info), load);
    CHECK(info.target == MJ_TARGET_COUNT && info.name[0] == '\0', "info cleared");
    mj_cuda_module *m = (mj_cuda_module *)&n;
    static const uint8_t fake_cubin[64] = {0x7f, 'E', 'L', 'F'};
    CHECK_STATUS(mj_cuda_module_load(0, fake_cubin, sizeof fake_cubin, &m), load);
    CHECK(m == NULL, "no module");
    CHECK_STATUS(mj_cuda_bind(0), load);
    mj_cuda_function f = NULL;
    void *fake = (void *)&n; /* never dereferenced: the driver is not there */
    CHECK_STATUS(mj_cuda_module_function((mj_cuda_module *)fake, "k", &f), load);
    CHECK(f == NULL, "no function");
    CHECK_STATUS(mj_cuda_set_max_dynamic_smem(fake, 65536), load);
    uint32_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
    CHECK_STATUS(mj_cuda_launch(fake, grid, block, 0, NULL, NULL), load);
    uint64_t d = 1;
    CHECK_STATUS(mj_cuda_malloc(1024, &d), load);
    CHECK(d == 0, "no allocation");
    CHECK_STATUS(mj_cuda_free(0x1000), load);
    CHECK_STATUS(mj_cuda_memcpy_htod(0x1000, msg, 4), load);
    CHECK_STATUS(mj_cuda_memcpy_dtoh(msg, 0x1000, 4), load);
    CHECK_STATUS(mj_cuda_synchronize(), load);
    mj_cuda_module_unload(NULL);
}

static void test_bad_args(void) {
    mj_device_info info;
    mj_cuda_module *m;
    mj_cuda_function f;
    uint32_t g[3] = {1, 1, 1}, z[3] = {0, 1, 1};
    CHECK_STATUS(mj_cuda_device_count(NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_device_info(0, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_module_load(0, NULL, 10, &m), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_module_load(0, "x", 0, &m), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_module_load(0, "x", 1, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_module_function(NULL, "k", &f), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_set_max_dynamic_smem(NULL, 0), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_launch(NULL, g, g, 0, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_launch((void *)&info, z, g, 0, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_launch((void *)&info, g, z, 0, NULL, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_malloc(4, NULL), MJ_ERR_INVALID_ARG);
    CHECK_OK(mj_cuda_free(0));                      /* like free(NULL) */
    CHECK_OK(mj_cuda_memcpy_htod(0, NULL, 0));      /* nothing to copy */
    CHECK_OK(mj_cuda_memcpy_dtoh(NULL, 0, 0));
}

/* ---- driver-loading failures, in children ---------------------------------------------- */
static int child_mode(void) {
    mj_status s = mj_cuda_load();
    printf("status=%d\nmessage=%s\n", (int)s, mj_last_error());
    int n = -1;
    mj_device_info info;
    printf("same=%d\n", mj_cuda_device_count(&n) == s && n == 0 && mj_cuda_device_info(0, &info) == s);
    fflush(stdout);
    return (int)s;
}

static int run_child(const char *lib, char *out, size_t out_len) {
    return test_run_child("test_cuda", "--child-load", "MOEJIT_LIBCUDA", lib, out, out_len);
}

static void test_load_failures(void) {
    char out[4096];
    int rc = run_child("/nonexistent/libcuda.so.1", out, sizeof out);
    CHECK(rc == MJ_ERR_NO_DEVICE, "missing driver: exit %d: %s", rc, out);
    CHECK(strstr(out, "/nonexistent/libcuda.so.1") && strstr(out, "can still compile"),
          "message: %s", out);
    CHECK(strstr(out, "same=1") != NULL, "everything fails the same way: %s", out);

    rc = run_child("libm.so.6", out, sizeof out);
    CHECK(rc == MJ_ERR_LIBRARY, "not a driver: exit %d: %s", rc, out);
    CHECK(strstr(out, "libm.so.6") && strstr(out, "no symbol cuGetErrorName"), "message: %s", out);

    /* The toolkit's stub exports every symbol, and its cuInit fails. */
    const char *stubs[] = {"/usr/local/cuda/lib64/stubs/libcuda.so",
                           "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"};
    for (size_t i = 0; i < sizeof stubs / sizeof stubs[0]; i++) {
        if (access(stubs[i], R_OK) != 0) continue;
        rc = run_child(stubs[i], out, sizeof out);
        CHECK(rc == MJ_ERR_NO_DEVICE, "stub driver: exit %d: %s", rc, out);
        CHECK(strstr(out, "cuInit failed: CUDA_ERROR_STUB_LIBRARY (") != NULL,
              "cuInit's error is named and described: %s", out);
        CHECK(strstr(out, "same=1") != NULL, "everything fails the same way: %s", out);
        const char *msg = strstr(out, "message=");
        msg = msg ? msg + 8 : out;
        printf("stub driver: %.*s\n", (int)strcspn(msg, "\n"), msg);
        break;
    }
}

/* ---- with a GPU ------------------------------------------------------------------------ */
static const char k_kernels[] =
    "extern \"C\" __global__ void mj_saxpy(int n, float a, const float *__restrict__ x,\n"
    "                                      float *__restrict__ y) {\n"
    "    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n"
    /* Each block writes its sum of x through the top end of its dynamic shared memory. */
    "extern \"C\" __global__ void mj_dyn_sum(const float *x, int n, int smem_floats, float *out) {\n"
    "    extern __shared__ float dyn[];\n"
    "    float *buf = dyn + (smem_floats - (int)blockDim.x);\n"
    "    int t = (int)threadIdx.x;\n"
    "    int i = (int)(blockIdx.x * blockDim.x) + t;\n"
    "    buf[t] = i < n ? x[i] : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (int s = (int)blockDim.x / 2; s > 0; s /= 2) {\n"
    "        if (t < s) buf[t] += buf[t + s];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (t == 0) out[blockIdx.x] = buf[0];\n"
    "}\n";

static void test_device(int ordinal) {
    mj_device_info info;
    mj_status s = mj_cuda_device_info(ordinal, &info);
    printf("device %d: %s, cc %d.%d, %d SMs, %d B smem/block (opt-in), %d B L2, target %s\n",
           ordinal, info.name, info.cc_major, info.cc_minor, info.sm_count,
           info.smem_per_block_optin, info.l2_bytes, mj_target_name(info.target));
    CHECK(info.name[0] && info.cc_major > 0 && info.sm_count > 0 && info.l2_bytes > 0 &&
              info.smem_per_block_optin >= 48 * 1024,
          "device %d described", ordinal);
    CHECK(info.ordinal == ordinal, "ordinal");
    if (s == MJ_ERR_UNSUPPORTED) {
        CHECK(info.target == MJ_TARGET_COUNT, "no target for an unsupported device");
        printf("SKIP: device %d: %s\n", ordinal, mj_last_error());
        return;
    }
    CHECK_OK(s);
    if (s != MJ_OK) return;

    mj_compile_result r;
    s = mj_nvrtc_compile(k_kernels, "mj_test_cuda", info.target, &r);
    if (s == MJ_ERR_LIBRARY) {
        printf("SKIP: no NVRTC for the launch test: %s\n", mj_last_error());
        return;
    }
    CHECK(s == MJ_OK, "compile for %s: %s", mj_target_name(info.target), mj_last_error());
    if (s != MJ_OK) {
        mj_compile_result_free(&r);
        return;
    }
    mj_cuda_module *m = NULL;
    CHECK_OK(mj_cuda_module_load(ordinal, r.cubin, r.cubin_len, &m));
    mj_compile_result_free(&r);
    if (!m) return;
    mj_cuda_function saxpy = NULL, dyn = NULL, none = NULL;
    CHECK_OK(mj_cuda_module_function(m, "mj_saxpy", &saxpy));
    CHECK_OK(mj_cuda_module_function(m, "mj_dyn_sum", &dyn));
    CHECK_STATUS(mj_cuda_module_function(m, "mj_no_such_kernel", &none), MJ_ERR_CUDA);
    CHECK(strstr(mj_last_error(), "mj_no_such_kernel") && strstr(mj_last_error(), "NOT_FOUND"),
          "message: %s", mj_last_error());

    /* saxpy on 1000 elements: exact in float (small integers and halves). */
    enum { N = 1000 };
    static float x[N], y[N], got[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = (float)(2 * i);
    }
    uint64_t dx = 0, dy = 0, dout = 0;
    CHECK_OK(mj_cuda_malloc(sizeof x, &dx));
    CHECK_OK(mj_cuda_malloc(sizeof y, &dy));
    CHECK(dx && dy, "device pointers");
    CHECK_OK(mj_cuda_memcpy_htod(dx, x, sizeof x));
    CHECK_OK(mj_cuda_memcpy_htod(dy, y, sizeof y));
    int n = N;
    float a = 0.5f;
    void *args[] = {&n, &a, &dx, &dy};
    uint32_t grid[3] = {(N + 255) / 256, 1, 1}, block[3] = {256, 1, 1};
    if (saxpy) CHECK_OK(mj_cuda_launch(saxpy, grid, block, 0, NULL, args));
    CHECK_OK(mj_cuda_synchronize());
    CHECK_OK(mj_cuda_memcpy_dtoh(got, dy, sizeof got));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += got[i] != 2.5f * (float)i;
    CHECK(bad == 0, "saxpy: %d of %d wrong (y[7] = %g, want %g)", bad, N, got[7], 2.5 * 7);

    /* Dynamic shared memory beyond the default 48 KiB needs the opt-in attribute. */
    int smem_bytes = info.smem_per_block_optin < 96 * 1024 ? info.smem_per_block_optin : 96 * 1024;
    smem_bytes &= ~1023;
    int smem_floats = smem_bytes / 4;
    CHECK_OK(mj_cuda_malloc(4 * sizeof(float), &dout));
    void *args2[] = {&dx, &n, &smem_floats, &dout};
    if (dyn && smem_bytes > 48 * 1024) {
        CHECK_STATUS(mj_cuda_launch(dyn, grid, block, (uint32_t)smem_bytes, NULL, args2), MJ_ERR_CUDA);
        CHECK(strstr(mj_last_error(), "cuLaunchKernel") && strstr(mj_last_error(), "CUDA_ERROR_"),
              "launch failure named: %s", mj_last_error());
        CHECK_OK(mj_cuda_set_max_dynamic_smem(dyn, smem_bytes));
    }
    if (dyn) CHECK_OK(mj_cuda_launch(dyn, grid, block, (uint32_t)smem_bytes, NULL, args2));
    CHECK_OK(mj_cuda_synchronize());
    float sums[4] = {0};
    CHECK_OK(mj_cuda_memcpy_dtoh(sums, dout, sizeof sums));
    for (int b = 0; b < 4; b++) {
        double want = 0;
        for (int i = b * 256; i < (b + 1) * 256 && i < N; i++) want += i;
        CHECK(sums[b] == (float)want, "block %d sum %g, want %g (%d B dynamic smem)", b, sums[b], want,
              smem_bytes);
    }
    CHECK_OK(mj_cuda_free(dx));
    CHECK_OK(mj_cuda_free(dy));
    CHECK_OK(mj_cuda_free(dout));
    mj_cuda_module_unload(m);

    /* Not a cubin (NUL-terminated, so the driver may read it as PTX text). */
    static const char junk[] = "this is not a cubin";
    m = NULL;
    CHECK_STATUS(mj_cuda_module_load(ordinal, junk, sizeof junk, &m), MJ_ERR_CUDA);
    CHECK(m == NULL && strstr(mj_last_error(), "cuModuleLoadData"), "message: %s", mj_last_error());
    int count = 0;
    CHECK_OK(mj_cuda_device_count(&count));
    CHECK_STATUS(mj_cuda_bind(count), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cuda_device_info(count, &info), MJ_ERR_INVALID_ARG);
}

/* The driver on this machine: each device's tests, or, with none, what a machine without one
 * answers. */
static void test_devices(void) {
    mj_status s = mj_cuda_load();
    if (s != MJ_OK) {
        printf("SKIP: no CUDA device (%s)\n", mj_last_error());
        /* Where no driver is installed at all, that is MJ_ERR_NO_DEVICE. */
        if (!getenv("MOEJIT_LIBCUDA")) CHECK(s == MJ_ERR_NO_DEVICE, "load: %s", mj_status_string(s));
        test_no_device(s);
        return;
    }
    int n = 0;
    CHECK_OK(mj_cuda_device_count(&n));
    CHECK(n > 0, "%d devices", n);
    printf("%d CUDA device%s\n", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) test_device(i);
}

static const test_case cases[] = {
    TEST_CASE("targets", test_targets),
    TEST_CASE("bad_args", test_bad_args),
    TEST_CASE("load_failures", test_load_failures),
    TEST_CASE("devices", test_devices),
};

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--child-load") == 0) return child_mode();
    return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL);
}
