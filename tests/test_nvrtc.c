/* test_nvrtc.c — NVRTC through dlopen: loading (and its failures, in child processes),
 * version and architectures, options, compiling for every target, the ptxas report,
 * compile errors and the dumped source. The CUDA toolkit's NVRTC is required here: a
 * machine without it fails this test. */
#include "jit.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- kernels ------------------------------------------------------------------------- */
static const char k_small[] =
    "typedef unsigned int uint32_t;\n"
    "extern \"C\" __global__ void mj_saxpy(int n, float a, const float *__restrict__ x,\n"
    "                                      float *__restrict__ y) {\n"
    "    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n"
    "static __device__ __forceinline__ float twice(float v) { return v + v; }\n"
    "extern \"C\" __global__ void mj_block_sum(const float *x, int n, float *out) {\n"
    "    __shared__ float buf[256];\n"
    "    int t = (int)threadIdx.x;\n"
    "    int i = (int)blockIdx.x * 256 + t;\n"
    "    buf[t] = i < n ? twice(x[i]) : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (int s = 128; s > 0; s /= 2) {\n"
    "        if (t < s) buf[t] += buf[t + s];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (t == 0) out[blockIdx.x] = buf[0];\n"
    "}\n";

/* 64 live floats under a 32-register cap: ptxas must spill (verified on NVRTC 13, every
 * target: ~2.2 KB of spill stores). */
static const char k_spill[] =
    "extern \"C\" __global__ void __maxnreg__(32) mj_spill(const float *x, const int *idx,\n"
    "                                                     float *y, int n) {\n"
    "    float acc[64];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 64; i++) acc[i] = x[i * n + threadIdx.x];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < 8; r++) {\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 64; i++) acc[i] = acc[i] * acc[(i + r + 1) & 63] + x[(i + r) * n];\n"
    "    }\n"
    "    float s = 0.0f;\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 64; i++) s += acc[i] * (float)i;\n"
    "    y[threadIdx.x] = s + acc[idx[threadIdx.x] & 63];\n"
    "}\n";

static const char k_broken[] =
    "extern \"C\" __global__ void mj_broken(float *y) {\n"
    "    y[threadIdx.x] = mj_no_such_identifier * 2.0f;\n"
    "}\n";

/* ---- verbatim ptxas reports (NVRTC 13.0, --ptxas-options=-v) ------------------------ */
/* Two entry points, static shared memory, sm_80 (reports cmem[0]). */
static const char k_log_smem_sm80[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'second' for 'sm_80'\n"
    "ptxas info    : Function properties for second\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 8 registers, used 1 barriers, 364 bytes cmem[0]\n"
    "ptxas info    : Compile time = 8.244 ms\n"
    "ptxas info    : Compiling entry function 'bsum' for 'sm_80'\n"
    "ptxas info    : Function properties for bsum\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 376 bytes cmem[0]\n"
    "ptxas info    : Compile time = 3.631 ms\n";
/* The same for sm_120a: no cmem[0] in the "Used" lines (sm_90 and later). */
static const char k_log_smem_sm120a[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'second' for 'sm_120a'\n"
    "ptxas info    : Function properties for second\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 8 registers, used 1 barriers\n"
    "ptxas info    : Compile time = 4.618 ms\n"
    "ptxas info    : Compiling entry function 'bsum' for 'sm_120a'\n"
    "ptxas info    : Function properties for bsum\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem\n"
    "ptxas info    : Compile time = 3.573 ms\n";
/* Spills forced with --maxrregcount=32, sm_89. */
static const char k_log_spill_sm89[] =
    "ptxas info    : Overriding maximum register limit 256 for 'spill' with  32 of maxrregcount option\n"
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'spill' for 'sm_89'\n"
    "ptxas info    : Function properties for spill\n"
    "ptxas         .     1432 bytes stack frame, 2204 bytes spill stores, 3632 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 0 barriers, 1432 bytes cumulative stack size, 380 bytes cmem[0]\n"
    "ptxas info    : Compile time = 87.967 ms\n";
/* Spills forced with __maxnreg__(32), sm_120a. */
static const char k_log_spill_sm120a[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'spill' for 'sm_120a'\n"
    "ptxas info    : Function properties for spill\n"
    "ptxas         .     1360 bytes stack frame, 2200 bytes spill stores, 3640 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 0 barriers, 1360 bytes cumulative stack size\n"
    "ptxas info    : Compile time = 109.673 ms\n";
/* A non-inlined callee: its own "Function properties" block after each caller. */
static const char k_log_callee_sm86[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'k2' for 'sm_86'\n"
    "ptxas info    : Function properties for k2\n"
    "ptxas         .     128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 1 barriers, 128 bytes cumulative stack size, 256 bytes smem, 368 bytes cmem[0]\n"
    "ptxas info    : Compile time = 3.514 ms\n"
    "ptxas info    : Function properties for _Z6helperPKfi\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Compiling entry function 'k1' for 'sm_86'\n"
    "ptxas info    : Function properties for k1\n"
    "ptxas         .     128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 0 barriers, 128 bytes cumulative stack size, 368 bytes cmem[0]\n"
    "ptxas info    : Compile time = 2.348 ms\n"
    "ptxas info    : Function properties for _Z6helperPKfi\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
/* A warning line, no trailing newline cut: 167 registers. */
static const char k_log_warn_sm86[] =
    "ptxas warning : Value of threads per SM for entry spill is out of range. .minnctapersm will be ignored\n"
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'spill' for 'sm_86'\n"
    "ptxas info    : Function properties for spill\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 167 registers, used 0 barriers, 380 bytes cmem[0]\n"
    "ptxas info    : Compile time = 46.354 ms";
/* The older layout (no "Compiling entry function", bare stack lines, no barriers). */
static const char k_log_old[] =
    "ptxas info    : Function properties for fixture_saxpy\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 10 registers, used 0 barriers, 380 bytes cmem[0]\n"
    "ptxas info    : Function properties for fixture_block_sum\n"
    "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
    "ptxas info    : Used 8 registers, 1024 bytes smem, 380 bytes cmem[0]\n";

static void check_report(const char *what, const char *log, int32_t regs, int32_t st, int32_t ld,
                         int32_t stack, int32_t smem, int32_t cmem, int32_t nfun) {
    mj_ptxas_report r;
    memset(&r, 0x55, sizeof r);
    mj_ptxas_parse(log, &r);
    CHECK(r.registers == regs, "%s: registers %d, want %d", what, r.registers, regs);
    CHECK(r.spill_stores == st, "%s: spill stores %d, want %d", what, r.spill_stores, st);
    CHECK(r.spill_loads == ld, "%s: spill loads %d, want %d", what, r.spill_loads, ld);
    CHECK(r.stack_frame == stack, "%s: stack %d, want %d", what, r.stack_frame, stack);
    CHECK(r.smem_static == smem, "%s: smem %d, want %d", what, r.smem_static, smem);
    CHECK(r.cmem0 == cmem, "%s: cmem0 %d, want %d", what, r.cmem0, cmem);
    CHECK(r.n_functions == nfun, "%s: functions %d, want %d", what, r.n_functions, nfun);
}

static void test_parse(void) {
    check_report("smem sm_80", k_log_smem_sm80, 12, 0, 0, 0, 1024, 376, 2);
    check_report("smem sm_120a", k_log_smem_sm120a, 12, 0, 0, 0, 1024, 0, 2);
    check_report("spill sm_89", k_log_spill_sm89, 32, 2204, 3632, 1432, 0, 380, 1);
    check_report("spill sm_120a", k_log_spill_sm120a, 32, 2200, 3640, 1360, 0, 0, 1);
    check_report("callee sm_86", k_log_callee_sm86, 40, 0, 0, 128, 256, 368, 2);
    check_report("warning sm_86", k_log_warn_sm86, 167, 0, 0, 0, 0, 380, 1);
    check_report("old layout", k_log_old, 10, 8, 12, 16, 1024, 380, 2);
    check_report("empty", "", 0, 0, 0, 0, 0, 0, 0);
    check_report("NULL", NULL, 0, 0, 0, 0, 0, 0, 0);
    check_report("front-end only",
                 "mj.cu(3): warning #177-D: variable \"q\" was declared but never referenced\n"
                 "Used as a word, 12 bytes in a sentence\n",
                 0, 0, 0, 0, 0, 0, 0);
    /* A line longer than the parser's line buffer must not derail the next lines. */
    char big[2048];
    memset(big, 'x', sizeof big);
    big[0] = '\n';
    snprintf(big + 1500, sizeof big - 1500, "\n%s", k_log_spill_sm120a);
    check_report("long line", big, 32, 2200, 3640, 1360, 0, 0, 1);
    mj_ptxas_parse("x", NULL); /* no crash */
}

/* ---- child processes: the load is once per process ---------------------------------- */
static int child_mode(void) {
    mj_status s = mj_nvrtc_load();
    printf("status=%d\nmessage=%s\n", (int)s, mj_last_error());
    /* Everything else fails the same way, and never crashes. */
    int ma = -1, mi = -1, sup = -1;
    mj_compile_result r;
    int same = mj_nvrtc_version(&ma, &mi) == s && mj_nvrtc_supports(MJ_TARGET_SM80, &sup) == s &&
               mj_nvrtc_compile(k_small, "mj_small", MJ_TARGET_SM80, &r) == s && r.cubin == NULL &&
               sup == 0;
    printf("same=%d\n", same);
    mj_compile_result_free(&r);
    fflush(stdout);
    return (int)s;
}

/* Run this binary in --child-load mode with MOEJIT_NVRTC=lib; its stdout into out. */
static int run_child(const char *lib, char *out, size_t out_len) {
    return test_run_child("test_nvrtc", "--child-load", "MOEJIT_NVRTC", lib, out, out_len);
}

static void test_missing_library(void) {
    char out[4096];
    int rc = run_child("/nonexistent/libnvrtc.so.13", out, sizeof out);
    CHECK(rc == MJ_ERR_LIBRARY, "missing library: child exit %d (want %d): %s", rc,
          (int)MJ_ERR_LIBRARY, out);
    CHECK(strstr(out, "/nonexistent/libnvrtc.so.13") != NULL, "message names the path: %s", out);
    CHECK(strstr(out, "MOEJIT_NVRTC") != NULL, "message says what to do: %s", out);
    CHECK(strstr(out, "same=1") != NULL, "all calls fail the same way: %s", out);

    /* A library that is not NVRTC: libm has none of the symbols. */
    rc = run_child("libm.so.6", out, sizeof out);
    CHECK(rc == MJ_ERR_LIBRARY, "not NVRTC: child exit %d (want %d): %s", rc, (int)MJ_ERR_LIBRARY,
          out);
    CHECK(strstr(out, "libm.so.6") != NULL && strstr(out, "no symbol nvrtc") != NULL,
          "message names the library and the missing symbol: %s", out);
    CHECK(strstr(out, "same=1") != NULL, "all calls fail the same way: %s", out);
}

/* ---- compiling --------------------------------------------------------------------- */
static int has_ptxas_info(const char *log) { return log && strstr(log, "ptxas info") != NULL; }

static void check_elf(const mj_compile_result *r, const char *what) {
    CHECK(r->cubin != NULL && r->cubin_len > 64, "%s: cubin of %zu bytes", what, r->cubin_len);
    if (!r->cubin || r->cubin_len <= 64) return;
    CHECK(memcmp(r->cubin, "\x7f" "ELF", 4) == 0, "%s: cubin starts with the ELF magic", what);
    CHECK(r->cubin[4] == 2, "%s: a 64-bit ELF (class %d)", what, r->cubin[4]);
    int machine = r->cubin[18] | (r->cubin[19] << 8);
    CHECK(machine == 190, "%s: e_machine %d, want 190 (EM_CUDA)", what, machine);
}

static void test_compile_targets(void) {
    char want[64];
    for (int i = 0; i < MJ_TARGET_COUNT; i++) {
        mj_target t = (mj_target)i;
        int sup = 0;
        CHECK_OK(mj_nvrtc_supports(t, &sup));
        if (!sup) {
            printf("  %-8s not supported by this NVRTC: skipped\n", mj_target_name(t));
            continue;
        }
        mj_compile_result r;
        mj_status s = mj_nvrtc_compile(k_small, "mj_small", t, &r);
        CHECK(s == MJ_OK, "compile for %s: %s: %s", mj_target_name(t), mj_status_string(s),
              mj_last_error());
        if (s != MJ_OK) {
            mj_compile_result_free(&r);
            continue;
        }
        printf("  %-8s %6.1f ms  cubin %6zu B  ptx %5zu B  %d regs  %d B smem  %d B cmem[0]\n",
               mj_target_name(t), r.compile_ms, r.cubin_len, r.ptx_len, r.report.registers,
               r.report.smem_static, r.report.cmem0);
        check_elf(&r, mj_target_name(t));
        CHECK(r.ptx && r.ptx_len > 0 && strlen(r.ptx) == r.ptx_len, "%s: PTX of %zu bytes",
              mj_target_name(t), r.ptx_len);
        CHECK(r.ptx && strstr(r.ptx, ".entry mj_saxpy") && strstr(r.ptx, ".entry mj_block_sum"),
              "%s: PTX has both entries", mj_target_name(t));
        snprintf(want, sizeof want, ".target %s", mj_target_name(t));
        CHECK(r.ptx && strstr(r.ptx, want), "%s: PTX says %s", mj_target_name(t), want);
        CHECK(has_ptxas_info(r.log), "%s: log has the ptxas report: %s", mj_target_name(t),
              r.log ? r.log : "(null)");
        snprintf(want, sizeof want, "for '%s'", mj_target_name(t));
        CHECK(r.log && strstr(r.log, want), "%s: log names the arch: %s", mj_target_name(t),
              r.log ? r.log : "(null)");
        CHECK(r.report.n_functions == 2, "%s: %d functions", mj_target_name(t), r.report.n_functions);
        CHECK(r.report.registers > 0, "%s: %d registers", mj_target_name(t), r.report.registers);
        CHECK(r.report.spill_stores == 0 && r.report.spill_loads == 0, "%s: spills %d/%d",
              mj_target_name(t), r.report.spill_stores, r.report.spill_loads);
        CHECK(r.report.smem_static == 1024, "%s: %d B smem, want 1024", mj_target_name(t),
              r.report.smem_static);
        CHECK(r.compile_ms > 0.0 && r.compile_ms < 60000.0, "%s: compile time %.3f ms",
              mj_target_name(t), r.compile_ms);
        mj_compile_result_free(&r);
        CHECK(r.cubin == NULL && r.ptx == NULL && r.log == NULL, "free clears the result");
    }
}

static void test_spill(void) {
    const mj_target ts[] = {MJ_TARGET_SM80, MJ_TARGET_SM120A};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        mj_compile_result r;
        mj_status s = mj_nvrtc_compile(k_spill, "mj_spill", ts[i], &r);
        CHECK(s == MJ_OK, "spill kernel for %s: %s", mj_target_name(ts[i]), mj_last_error());
        if (s == MJ_OK) {
            printf("  spill %-8s %6.1f ms: %d regs, %d B spill stores, %d B spill loads, %d B stack\n",
                   mj_target_name(ts[i]), r.compile_ms, r.report.registers, r.report.spill_stores,
                   r.report.spill_loads, r.report.stack_frame);
            CHECK(r.report.registers > 0 && r.report.registers <= 32, "%s: %d registers under a cap of 32",
                  mj_target_name(ts[i]), r.report.registers);
            CHECK(r.report.spill_stores > 0 && r.report.spill_loads > 0, "%s: it spills (%d/%d): %s",
                  mj_target_name(ts[i]), r.report.spill_stores, r.report.spill_loads, r.log);
            CHECK(r.report.stack_frame >= r.report.spill_stores / 2, "%s: stack %d",
                  mj_target_name(ts[i]), r.report.stack_frame);
        }
        mj_compile_result_free(&r);
    }
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The dumped file's path, from "... source saved to PATH; log:". */
static int dumped_path(const char *msg, char *path, size_t len) {
    const char *p = strstr(msg, "source saved to ");
    if (!p) return 0;
    p += strlen("source saved to ");
    const char *e = strstr(p, "; log:");
    if (!e || (size_t)(e - p) >= len) return 0;
    memcpy(path, p, (size_t)(e - p));
    path[e - p] = '\0';
    return 1;
}

static void test_compile_error(const char *tmpdir) {
    mj_compile_result r;
    CHECK_STATUS(mj_nvrtc_compile(k_broken, "mj_broken", MJ_TARGET_SM120A, &r), MJ_ERR_COMPILE);
    const char *msg = mj_last_error();
    CHECK(strstr(msg, "NVRTC could not compile mj_broken for sm_120a") != NULL, "message: %s", msg);
    CHECK(strstr(msg, "mj_no_such_identifier") != NULL && strstr(msg, "is undefined") != NULL,
          "message has the error text: %s", msg);
    CHECK(strstr(msg, "mj_broken.cu(2)") != NULL, "message has file and line: %s", msg);
    CHECK(r.cubin == NULL && r.ptx == NULL && r.cubin_len == 0, "no cubin on failure");
    CHECK(r.log && strstr(r.log, "mj_no_such_identifier"), "full log kept: %s", r.log ? r.log : "(null)");
    char path[1024];
    int have = dumped_path(msg, path, sizeof path);
    CHECK(have, "message names the dumped source: %s", msg);
    if (have) {
        CHECK(strncmp(path, tmpdir, strlen(tmpdir)) == 0, "dumped under $TMPDIR (%s): %s", tmpdir, path);
        const char *base = strrchr(path, '/');
        CHECK(base && strncmp(base, "/moejit-failed-", 15) == 0 && strlen(base) == 15 + 16 + 3 &&
                  strcmp(base + 31, ".cu") == 0,
              "file name moejit-failed-<16 hex>.cu: %s", path);
        size_t n = 0;
        char *got = read_file(path, &n);
        CHECK(got && n == strlen(k_broken) && memcmp(got, k_broken, n) == 0,
              "the dumped file equals the source (%zu bytes)", n);
        free(got);
        /* The same source dumps to the same name; a different one to another. */
        char path2[1024];
        mj_compile_result r2;
        CHECK_STATUS(mj_nvrtc_compile(k_broken, "again", MJ_TARGET_SM80, &r2), MJ_ERR_COMPILE);
        CHECK(dumped_path(mj_last_error(), path2, sizeof path2) && strcmp(path, path2) == 0,
              "same source, same file: %s vs %s", path, path2);
        mj_compile_result_free(&r2);
        remove(path);
    }
    mj_compile_result_free(&r);

    /* A huge log is cut to fit mj_last_error, at a line, and says so; the result keeps all. */
    size_t cap = 64 * 1024, len = 0;
    char *src = malloc(cap);
    len += (size_t)snprintf(src + len, cap - len, "extern \"C\" __global__ void mj_many(float *y) {\n");
    for (int i = 0; i < 150; i++)
        len += (size_t)snprintf(src + len, cap - len, "    y[%d] = mj_undefined_number_%03d;\n", i, i);
    snprintf(src + len, cap - len, "}\n");
    CHECK_STATUS(mj_nvrtc_compile(src, "mj_many", MJ_TARGET_SM90A, &r), MJ_ERR_COMPILE);
    msg = mj_last_error();
    CHECK(strlen(msg) < 4096 && strstr(msg, "log truncated") != NULL, "truncated message (%zu): ...%s",
          strlen(msg), msg + (strlen(msg) > 200 ? strlen(msg) - 200 : 0));
    CHECK(strstr(msg, "mj_undefined_number_000") != NULL, "the first error is kept");
    CHECK(r.log && strlen(r.log) > 4096, "the result has the whole log (%zu bytes)",
          r.log ? strlen(r.log) : 0);
    if (dumped_path(msg, path, sizeof path)) remove(path);
    mj_compile_result_free(&r);
    free(src);

    /* An unwritable $TMPDIR: still MJ_ERR_COMPILE, and the message says why. */
    setenv("TMPDIR", "/nonexistent-moejit-dir", 1);
    CHECK_STATUS(mj_nvrtc_compile(k_broken, "mj_broken", MJ_TARGET_SM80, &r), MJ_ERR_COMPILE);
    CHECK(strstr(mj_last_error(), "could not be saved to /nonexistent-moejit-dir/moejit-failed-"),
          "message: %s", mj_last_error());
    mj_compile_result_free(&r);
    setenv("TMPDIR", tmpdir, 1);
}

static void test_options(void) {
    for (int i = 0; i < MJ_TARGET_COUNT; i++) {
        mj_target t = (mj_target)i;
        const char *o = mj_nvrtc_options(t);
        CHECK(o != NULL, "%s: options", mj_target_name(t));
        if (!o) continue;
        char want[64];
        snprintf(want, sizeof want, "-arch=%s ", mj_target_name(t));
        CHECK(strncmp(o, want, strlen(want)) == 0, "%s options: %s", mj_target_name(t), o);
        CHECK(strstr(o, "--ptxas-options=-v") != NULL, "%s: ptxas report asked for", o);
        CHECK(!strstr(o, "-I") && !strstr(o, "compute_"), "%s: no include path, a real arch", o);
        CHECK(mj_nvrtc_options(t) == o, "options are one stable string");
        for (int j = 0; j < i; j++)
            CHECK(strcmp(o, mj_nvrtc_options((mj_target)j)) != 0, "options differ: %s / %s", o,
                  mj_nvrtc_options((mj_target)j));
    }
    /* -minimal (a smaller built-in header, faster front end) with every NVRTC that has it. */
    int vmaj = 0, vmin = 0;
    CHECK_OK(mj_nvrtc_version(&vmaj, &vmin));
    const int want_minimal = vmaj > 12 || (vmaj == 12 && vmin >= 4);
    CHECK((strstr(mj_nvrtc_options(MJ_TARGET_SM80), " -minimal") != NULL) == want_minimal,
          "NVRTC %d.%d: -minimal %s: %s", vmaj, vmin, want_minimal ? "wanted" : "not taken",
          mj_nvrtc_options(MJ_TARGET_SM80));
    printf("options (sm_120a): %s\n", mj_nvrtc_options(MJ_TARGET_SM120A));
    CHECK(strcmp(mj_nvrtc_options(MJ_TARGET_COUNT), "") == 0, "invalid target: empty options");
}

static void test_bad_args(void) {
    mj_compile_result r;
    int sup;
    CHECK_STATUS(mj_nvrtc_compile(NULL, "x", MJ_TARGET_SM80, &r), MJ_ERR_INVALID_ARG);
    CHECK(r.cubin == NULL && r.log == NULL, "result cleared");
    CHECK_STATUS(mj_nvrtc_compile(k_small, NULL, MJ_TARGET_SM80, &r), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvrtc_compile(k_small, "x", MJ_TARGET_COUNT, &r), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvrtc_compile(k_small, "x", MJ_TARGET_SM80, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvrtc_supports(MJ_TARGET_COUNT, &sup), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvrtc_supports(MJ_TARGET_SM80, NULL), MJ_ERR_INVALID_ARG);
    mj_compile_result_free(NULL);
}

/* ---- threads: concurrent compiles of different targets -------------------------------- */
typedef struct {
    mj_target t;
    mj_status s;
    int32_t regs;
    char err[256];
} compile_job;

static void *compile_thread(void *arg) {
    compile_job *j = arg;
    mj_compile_result r;
    j->s = mj_nvrtc_compile(k_small, "mj_threaded", j->t, &r);
    snprintf(j->err, sizeof j->err, "%s", mj_last_error());
    j->regs = r.report.registers;
    mj_compile_result_free(&r);
    return NULL;
}

static void test_threads(void) {
    const mj_target ts[4] = {MJ_TARGET_SM80, MJ_TARGET_SM89, MJ_TARGET_SM90A, MJ_TARGET_SM120A};
    compile_job jobs[4];
    pthread_t th[4];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < 4; i++) {
        jobs[i].t = ts[i];
        pthread_create(&th[i], NULL, compile_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        CHECK(jobs[i].s == MJ_OK && jobs[i].regs > 0, "thread %d (%s): %s: %s", i,
              mj_target_name(jobs[i].t), mj_status_string(jobs[i].s), jobs[i].err);
}

/* Failure dumps go to a private directory, not the shared /tmp: TMPDIR for the whole run,
 * empty again at the end. */
static char g_tmpdir[512];

static int setup(void) {
    const char *base = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/moejit-test-nvrtc-XXXXXX", base && *base ? base : "/tmp");
    CHECK(mkdtemp(g_tmpdir) != NULL, "mkdtemp %s: %s", g_tmpdir, strerror(errno));
    setenv("TMPDIR", g_tmpdir, 1);
    return 0;
}

static void teardown(void) { CHECK(rmdir(g_tmpdir) == 0, "nothing left in %s (%s)", g_tmpdir, strerror(errno)); }

/* NVRTC loads here (the CUDA toolkit is required), 12 or later, and says what it supports. */
static void test_load(void) {
    mj_status s = mj_nvrtc_load();
    CHECK(s == MJ_OK, "NVRTC must load on this machine (the CUDA toolkit is required): %s",
          mj_last_error());
    if (s != MJ_OK) return;
    CHECK_OK(mj_nvrtc_load()); /* again: cached */
    int major = 0, minor = 0;
    CHECK_OK(mj_nvrtc_version(&major, &minor));
    printf("nvrtc %d.%d\n", major, minor);
    CHECK(major >= 12, "NVRTC %d.%d: moejit needs 12 or later", major, minor);
    printf("supported:");
    for (int i = 0; i < MJ_TARGET_COUNT; i++) {
        int sup = -1;
        CHECK_OK(mj_nvrtc_supports((mj_target)i, &sup));
        CHECK(sup == 0 || sup == 1, "supports gives 0 or 1");
        if (sup) printf(" %s", mj_target_name((mj_target)i));
        if (major >= 13) CHECK(sup == 1, "NVRTC %d supports %s", major, mj_target_name((mj_target)i));
    }
    printf("\n");
    int sup80 = 0, sup120 = 0;
    CHECK_OK(mj_nvrtc_supports(MJ_TARGET_SM80, &sup80));
    CHECK_OK(mj_nvrtc_supports(MJ_TARGET_SM120A, &sup120));
    CHECK(sup80 && sup120, "sm_80 and sm_120a are supported");
}

static void case_compile_error(void) { test_compile_error(g_tmpdir); }

static const test_case cases[] = {
    TEST_CASE("parse", test_parse),
    TEST_CASE("missing_library", test_missing_library),
    TEST_CASE("options", test_options),
    TEST_CASE("load", test_load),
    TEST_CASE("compile_targets", test_compile_targets),
    TEST_CASE("spill", test_spill),
    TEST_CASE("compile_error", case_compile_error),
    TEST_CASE("bad_args", test_bad_args),
    TEST_CASE("threads", test_threads),
};

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--child-load") == 0) return child_mode();
    return test_main(argc, argv, cases, TEST_N(cases), setup, teardown);
}
