/* test.h — what every test shares: the assertions, the seed, temporary directories, timing,
 * the case table and its runner (cases run by name), contexts on no device, small MoE configs
 * and random inputs, running this program again as a child, guarded buffers (poisoned, with
 * sentinels) and the stub driver's log.
 * A failed CHECK prints where and what, the run goes on, and test_finish() prints
 * "N passed, N failed" and returns the exit code. */
#ifndef MJ_TEST_H
#define MJ_TEST_H

#include "jit.h"
#include "weights/pack.h"

#include <float.h>
#include <fnmatch.h>
#include <ftw.h>
#include <signal.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (cond) {                                                                      \
            g_pass++;                                                                    \
        } else {                                                                         \
            g_fail++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
        }                                                                                \
    } while (0)

/* A call that must succeed: on failure print the status and mj_last_error(). */
#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        mj_status check_ok_s_ = (call);                                                  \
        CHECK(check_ok_s_ == MJ_OK, "%s -> %s: %s", #call, mj_status_string(check_ok_s_), \
              mj_last_error());                                                          \
    } while (0)

/* A call that must fail with status `want`. */
#define CHECK_STATUS(call, want)                                                         \
    do {                                                                                 \
        mj_status check_st_s_ = (call);                                                  \
        CHECK(check_st_s_ == (want), "%s -> %s (want %s): %s", #call,                    \
              mj_status_string(check_st_s_), mj_status_string(want), mj_last_error());   \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                            \
    do {                                                                                 \
        double cn_a_ = (double)(a), cn_b_ = (double)(b);                                 \
        CHECK(fabs(cn_a_ - cn_b_) <= (tol), "%s = %.9g, %s = %.9g, |diff| %.3g > %.3g",   \
              #a, cn_a_, #b, cn_b_, fabs(cn_a_ - cn_b_), (double)(tol));                 \
    } while (0)

/* Seed for randomized tests: $MJ_TEST_SEED or the default; printed so a failure can be
 * replayed. */
static inline uint64_t test_seed(uint64_t dflt) {
    const char *s = getenv("MJ_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 0) : dflt;
    printf("seed %" PRIu64 " (set MJ_TEST_SEED to replay)\n", seed);
    return seed;
}

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* A GPU test's start: 0 with device 0 bound; with no driver or no device, a SKIP line (what:
 * what the test runs on a GPU) and 77, which ctest reports as skipped; a driver that loads
 * but fails is a failed check, and test_finish()'s code. */
static inline int test_gpu_or_skip(const char *what) {
    int n = 0;
    mj_status st = mj_cuda_load();
    if (st == MJ_OK) st = mj_cuda_device_count(&n);
    if (st == MJ_ERR_NO_DEVICE || (st == MJ_OK && n < 1)) {
        printf("SKIP: no CUDA device (%s); this test %s\n", st == MJ_OK ? "0 devices" : mj_last_error(), what);
        return 77;
    }
    CHECK_OK(st);
    if (st == MJ_OK) CHECK_OK(st = mj_cuda_bind(0));
    return st == MJ_OK ? 0 : test_finish();
}

/* ---- files and time ---------------------------------------------------------------------- */
static inline double test_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static inline int test_rm_cb_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
/* rm -rf, without following links. */
static inline void test_rm_rf(const char *path) { nftw(path, test_rm_cb_, 16, FTW_DEPTH | FTW_PHYS); }

/* A new empty directory under $TMPDIR (malloc'd), or NULL. */
static inline char *test_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    char *dir = NULL;
    if (asprintf(&dir, "%s/mj-%s-XXXXXX", base && *base ? base : "/tmp", tag) < 0) return NULL;
    if (!mkdtemp(dir)) {
        free(dir);
        return NULL;
    }
    return dir;
}

/* dir/name (malloc'd; aborts when out of memory). Out of line: inlined, gcc 12 takes the
 * asprintf result for a pointer to the local (a false -Wdangling-pointer in the callers). */
__attribute__((noinline, unused)) static char *test_path(const char *dir, const char *name) {
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) < 0) abort();
    return p;
}

/* A watchdog for calls that must never block (an open() of a FIFO waits for a writer
 * forever): test_watchdog(s, what) fails the program (exit 1, what named on stderr) if it is
 * still running s seconds later; test_watchdog(0, NULL) disarms it. */
static const char *test_watchdog_what_;
static inline void test_watchdog_fire_(int sig) {
    (void)sig;
    static const char m[] = "test: blocked past the watchdog: ";
    ssize_t r = write(2, m, sizeof m - 1);
    if (test_watchdog_what_) r = write(2, test_watchdog_what_, strlen(test_watchdog_what_));
    r = write(2, "\n", 1);
    (void)r;
    _exit(1);
}
static inline void test_watchdog(unsigned seconds, const char *what) {
    test_watchdog_what_ = what;
    signal(SIGALRM, seconds ? test_watchdog_fire_ : SIG_DFL);
    alarm(seconds);
}

/* Values through the FP8 / FP4 encoders and what the GPU's cvt.rn.satfinite gives for them
 * (templates/prelude_fp.h): a code's sign bit is x's (+0.0 gives +0, -0.0 or a negative that
 * rounds to zero -0: E4M3 0x80, E2M1 8); past the largest finite value, Inf included, comes
 * that value with x's sign. The reference's encoders (test_nvfp4) and the interpreter's
 * conversion hooks (test_sim) check the same table. */
typedef struct test_cvt_case { float x; uint8_t e4m3, e2m1; } test_cvt_case;
static const test_cvt_case test_cvt_cases[] = {
    {0.0f, 0x00, 0},      {-0.0f, 0x80, 8},     {FLT_TRUE_MIN, 0x00, 0}, {-FLT_TRUE_MIN, 0x80, 8},
    {-1e-30f, 0x80, 8},   {-0x1p-11f, 0x80, 8}, {-0x1p-10f, 0x80, 8},    {-0.2f, 0xA5, 8},
    {0.2f, 0x25, 0},      {-0.25f, 0xA8, 8},    {6.0f, 0x4C, 7},         {-6.0f, 0xCC, 15},
    {7.0f, 0x4E, 7},      {-7.0f, 0xCE, 15},    {448.0f, 0x7E, 7},       {-448.0f, 0xFE, 15},
    {464.0f, 0x7E, 7},    {-464.0f, 0xFE, 15},  {1e30f, 0x7E, 7},        {-1e30f, 0xFE, 15},
    {FLT_MAX, 0x7E, 7},   {-FLT_MAX, 0xFE, 15}, {INFINITY, 0x7E, 7},     {-INFINITY, 0xFE, 15},
};
#define TEST_CVT_N ((int)(sizeof test_cvt_cases / sizeof test_cvt_cases[0]))

/* The kernel cache the interpreter-heavy tests share within one build: compiled kernel
 * objects are reused across tests and runs instead of rebuilt in a fresh directory each
 * time. ctest sets MJ_TEST_CACHE (CMakeLists.txt); run by hand, a private one is made. */
static char *test_private_cache_;
static inline void test_private_cache_rm_(void) {
    if (test_private_cache_) test_rm_rf(test_private_cache_);
}
static inline const char *test_shared_cache(void) {
    const char *env = getenv("MJ_TEST_CACHE");
    if (env && *env) return env;
    if (!test_private_cache_ && (test_private_cache_ = test_tmpdir("cache"))) atexit(test_private_cache_rm_);
    return test_private_cache_;
}

/* ---- cases: a program's tests, each run by name ---------------------------------------------
 * A program lists its cases in a table, one TEST_CASE a line, and its main hands the table
 * to test_main (as ggml's test-backend-ops -o picks ops):
 *
 *     static void test_hash(void) { CHECK(...); }
 *     static const test_case cases[] = {
 *         TEST_CASE("hash", test_hash),
 *         TEST_CASE("round_trip", test_round_trip),
 *     };
 *     int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL); }
 *
 *   test_x                 every case, in table order (`test_x all` the same)
 *   test_x NAME...         the cases NAME matches, in table order: a case's name or a shell
 *   test_x -o NAME[,NAME]  glob ("store_*", "*stub*"; fnmatch), as many as wanted
 *   test_x --list          the names, one a line
 * A NAME that matches no case is an error: exit 2, the names printed. A program's own flags
 * (test_moe_gpu --stub) are taken out of argv first (test_take_flag). Each case is announced
 * as it starts ("== name") and ends ("ok name: N checks, T ms", or "FAILED name: ..."); then
 * the failed cases are named and test_finish prints "N passed, N failed".
 *
 * What the cases share, setup makes (a temporary directory, a context, the seed): it runs once
 * before the first case and returns 0, or the code to exit with at once (77: skipped, no GPU);
 * teardown runs after the last, and may check too (nothing left behind). Either may be NULL.
 * A case must pass when it runs alone: what it needs from another (a checkpoint written, a
 * kernel compiled) it makes itself when that one has not run (a getter that makes it once).
 *
 * ctest runs each case as a test of its own, PROG.NAME (`ctest -R test_cache` runs a program's
 * cases, `ctest -L test_cache` too): CMakeLists.txt reads the names from the TEST_CASE lines of
 * tests/PROG.c, so write each entry on a line of its own, the name a literal of letters, digits
 * and '_' (the test case_names checks the list against --list). */
typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;
#define TEST_CASE(name, fn) {name, fn}
#define TEST_N(table) ((int)(sizeof(table) / sizeof((table)[0])))

/* 1 when argv holds flag, then taken out of argv (and *argc), so test_main does not see it. */
static inline int test_take_flag(int *argc, char **argv, const char *flag) {
    int found = 0, j = 1;
    for (int i = 1; i < *argc; i++) {
        if (!strcmp(argv[i], flag)) found = 1;
        else argv[j++] = argv[i];
    }
    *argc = j;
    argv[j] = NULL;
    return found;
}

static inline void test_list_(FILE *f, const test_case *cases, int n) {
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", cases[i].name);
}

/* Mark the cases pattern matches; 0 when it matches none. */
static inline int test_select_(const char *pattern, const test_case *cases, int n, char *sel) {
    int hit = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(pattern, "all") || fnmatch(pattern, cases[i].name, 0) == 0) sel[i] = 1, hit = 1;
    return hit;
}

static inline int test_main(int argc, char **argv, const test_case *cases, int n, int (*setup)(void),
                            void (*teardown)(void)) {
    const char *prog = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    prog = prog ? prog + 1 : argc > 0 && argv[0] ? argv[0] : "test";
    char *sel = calloc((size_t)n + 1, 1);
    int any = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--list")) {
            test_list_(stdout, cases, n);
            free(sel);
            return 0;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: %s [NAME... | -o NAME[,NAME...] | --list]: the cases NAME (a name or a glob) "
                   "matches, or all; the cases:\n", prog);
            test_list_(stdout, cases, n);
            free(sel);
            return 0;
        }
        if (!strcmp(a, "-o") && i + 1 < argc) {
            /* -o a,b,c: each name in turn */
            char *list = strdup(argv[++i]), *save = NULL;
            for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
                if (!test_select_(p, cases, n, sel)) {
                    fprintf(stderr, "%s: no case %s; the cases:\n", prog, p);
                    test_list_(stderr, cases, n);
                    free(list), free(sel);
                    return 2;
                }
            }
            free(list);
            any = 1;
            continue;
        }
        if (a[0] == '-' || !test_select_(a, cases, n, sel)) {
            fprintf(stderr, "%s: %s %s; the cases:\n", prog, a[0] == '-' ? "unknown option" : "no case", a);
            test_list_(stderr, cases, n);
            free(sel);
            return 2;
        }
        any = 1;
    }
    if (!any) memset(sel, 1, (size_t)n);
    const int rc = setup ? setup() : 0;
    if (rc) {
        free(sel);
        return rc;
    }
    char failed[4096] = "";
    for (int i = 0; i < n; i++) {
        if (!sel[i]) continue;
        printf("== %s\n", cases[i].name);
        fflush(stdout);
        const int pass0 = g_pass, fail0 = g_fail;
        const double t0 = test_now_ms();
        cases[i].fn();
        const int p = g_pass - pass0, f = g_fail - fail0;
        if (f) {
            printf("FAILED %s: %d of %d checks failed, %.0f ms\n", cases[i].name, f, p + f, test_now_ms() - t0);
            if (strlen(failed) + strlen(cases[i].name) + 2 < sizeof failed)
                strcat(strcat(failed, " "), cases[i].name);
        } else {
            printf("ok %s: %d checks, %.0f ms\n", cases[i].name, p, test_now_ms() - t0);
        }
        fflush(stdout);
    }
    if (teardown) teardown();
    if (failed[0]) printf("failed cases:%s\n", failed);
    free(sel);
    return test_finish();
}

/* ---- contexts, layers and numbers ------------------------------------------------------------ */
/* A context on no device (checked): the kernel cache in cache_dir, the backend, the target
 * (NULL: the backend's default), strict or not. NULL when it cannot be made. */
static inline mj_context_t test_new_context(const char *cache_dir, mj_backend backend, const char *target, int strict) {
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = cache_dir, o.device = MJ_DEVICE_NONE, o.backend = backend, o.target = target, o.strict = strict;
    mj_context_t c = NULL;
    CHECK_OK(mj_context_create(&o, &c));
    return c;
}

/* The GLM-5 config cut down to the given sizes, with one expert group. */
static inline mj_moe_config test_moe_cfg(int H, int I, int E, int k, int n_shared) {
    mj_moe_config c;
    mj_moe_config_glm5(&c);
    c.hidden = H, c.intermediate = I, c.n_experts = E, c.topk = k, c.n_shared = n_shared;
    c.n_group = 1, c.topk_group = 1;
    return c;
}

/* ||a - b|| / ||b|| (||a - b|| when b is 0). */
static inline double test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* n bf16 values drawn from N(0, 1) with the generator *rng. */
static inline void test_random_hidden(uint16_t *h, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) h[i] = mj_f32_to_bf16((float)mj_rng_normal(rng));
}

/* ---- children: load-once paths are tested in a fresh process ------------------------------ */
/* Run this program again as `argv0 mode` with env var name=value; its stdout into out.
 * Returns the child's exit status (-1 if it did not exit). */
static inline int test_run_child(const char *argv0, const char *mode, const char *name, const char *value,
                                 char *out, size_t out_len) {
    int fd[2];
    out[0] = '\0';
    if (pipe(fd) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (name) setenv(name, value, 1);
        execl("/proc/self/exe", argv0, mode, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < out_len && (k = read(fd[0], out + n, out_len - 1 - n)) > 0) n += (size_t)k;
    out[n] = '\0';
    close(fd[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    return WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
}

/* ---- SASS ------------------------------------------------------------------------------------
 * The disassembly of a cubin (malloc'd text), through nvdisasm from PATH (scripts/setup.sh
 * installs it) or $MOEJIT_NVDISASM; NULL when it cannot be run. */
static inline char *test_sass(const void *cubin, size_t len) {
    char *dir = test_tmpdir("sass"), path[4200], cmd[8600];
    if (!dir) return NULL;
    snprintf(path, sizeof path, "%s/k.cubin", dir);
    FILE *f = fopen(path, "wb");
    char *text = NULL;
    if (f && fwrite(cubin, 1, len, f) == len && fclose(f) == 0) {
        const char *tool = getenv("MOEJIT_NVDISASM");
        snprintf(cmd, sizeof cmd, "'%s' -c '%s' 2>/dev/null", tool && *tool ? tool : "nvdisasm", path);
        FILE *p = popen(cmd, "r");
        size_t cap = 1 << 20, n = 0;
        text = p ? malloc(cap) : NULL;
        while (text) {
            size_t got = fread(text + n, 1, cap - 1 - n, p);
            n += got;
            if (got == 0) break;
            if (n + 1 == cap) {
                char *t = realloc(text, cap *= 2);
                if (!t) break;
                text = t;
            }
        }
        if (text) text[n] = '\0';
        if (p && pclose(p) != 0) free(text), text = NULL;
    }
    test_rm_rf(dir);
    free(dir);
    return text;
}

/* How many times needle occurs in text. */
static inline int test_count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* ---- guarded buffers ------------------------------------------------------------------------
 * As ggml's test-backend-ops does: an output buffer starts poisoned (so an output a kernel
 * forgets to write cannot pass for a zero), and sentinel bytes around it must come back
 * unchanged (so a write past either end shows). On a GPU (device = 1) the whole guarded
 * region lives in device memory. */
#define TEST_GUARD 256
#define TEST_SENTINEL 0xA5
typedef struct tbuf {
    unsigned char *base; /* TEST_GUARD sentinels, the payload, TEST_GUARD sentinels        */
    size_t bytes;
    int device;
    void *p;             /* the payload: what the kernel gets                                */
} tbuf;

static inline tbuf tbuf_new(size_t bytes, int device) {
    tbuf b = {NULL, bytes, device, NULL};
    size_t total = bytes + 2 * TEST_GUARD;
    unsigned char *h = malloc(total);
    if (!h) return b;
    memset(h, TEST_SENTINEL, total);
    if (device) {
        uint64_t d = 0;
        if (mj_cuda_malloc(total, &d) != MJ_OK || mj_cuda_memcpy_htod(d, h, total) != MJ_OK) {
            free(h);
            return b;
        }
        free(h);
        b.base = (unsigned char *)(uintptr_t)d;
    } else {
        b.base = h;
    }
    b.p = b.base + TEST_GUARD;
    return b;
}

/* Fill the payload with one byte value (0xFF makes int32 -1 and float NaN; 0x55 neither). */
static inline void tbuf_poison(tbuf *b, int byte) {
    if (!b->device) {
        memset(b->p, byte, b->bytes);
        return;
    }
    unsigned char *h = malloc(b->bytes ? b->bytes : 1);
    memset(h, byte, b->bytes);
    mj_cuda_memcpy_htod((uint64_t)(uintptr_t)b->p, h, b->bytes);
    free(h);
}

static inline void tbuf_put(tbuf *b, const void *src, size_t bytes) {
    if (!b->device) memcpy(b->p, src, bytes);
    else mj_cuda_memcpy_htod((uint64_t)(uintptr_t)b->p, src, bytes);
}

/* Copy the payload out and check the sentinels; returns 1 when they are intact. */
static inline int tbuf_get(const tbuf *b, void *dst, const char *name) {
    size_t total = b->bytes + 2 * TEST_GUARD;
    unsigned char *h = b->device ? malloc(total) : b->base;
    if (b->device) {
        mj_cuda_synchronize();
        mj_cuda_memcpy_dtoh(h, (uint64_t)(uintptr_t)b->base, total);
    }
    int ok = 1;
    for (size_t i = 0; i < TEST_GUARD; i++)
        ok &= h[i] == TEST_SENTINEL && h[TEST_GUARD + b->bytes + i] == TEST_SENTINEL;
    CHECK(ok, "%s: a sentinel beside the buffer was overwritten (a write out of bounds)", name);
    if (dst) memcpy(dst, h + TEST_GUARD, b->bytes);
    if (b->device) free(h);
    return ok;
}

static inline void tbuf_free(tbuf *b) {
    if (!b->base) return;
    if (b->device) mj_cuda_free((uint64_t)(uintptr_t)b->base);
    else free(b->base);
    b->base = NULL, b->p = NULL;
}

/* The text of the log file at path so far (malloc'd, up to 64 KiB), and then remove it: the
 * stub drivers' log, read by the tests that run on them. */
static inline char *test_take_log(const char *path) {
    FILE *f = fopen(path, "r");
    char *text = calloc(1, 1 << 16);
    if (f) {
        size_t n = fread(text, 1, (1 << 16) - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    unlink(path);
    return text;
}

/* The stub driver's log (tests/stub/cuda_stub.c) in a new temporary directory, for a test run
 * on the stub: test_stub_log_begin before the first driver call, test_stub_log_end at the end
 * checks that no line reports a broken ordering rule ("unordered": work on a non-blocking
 * stream while a pageable host-to-device copy may be in flight) and removes the log. */
static char *test_stub_log_dir_;
static inline void test_stub_log_begin(void) {
    test_stub_log_dir_ = test_tmpdir("stublog");
    if (!test_stub_log_dir_) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/stub.log", test_stub_log_dir_);
    setenv("MJ_STUB_LOG", path, 1);
}
static inline void test_stub_log_end(void) {
    if (!test_stub_log_dir_) return;
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/stub.log", test_stub_log_dir_);
    FILE *f = fopen(path, "r");
    long lines = 0, unordered = 0;
    char first[1024] = "";
    while (f && fgets(line, sizeof line, f)) {
        lines++;
        if (strncmp(line, "unordered", 9)) continue;
        if (!unordered++) snprintf(first, sizeof first, "%s", line);
    }
    if (f) fclose(f);
    CHECK(lines > 0, "the stub driver logged nothing to %s", path);
    CHECK(unordered == 0, "%ld driver calls broke the stream-ordering rule; the first: %s", unordered, first);
    test_rm_rf(test_stub_log_dir_);
    free(test_stub_log_dir_);
    test_stub_log_dir_ = NULL;
}

/* ---- silu (test_experts, test_moe_gpu) ---- */
/* experts_silu's kernel: moe_experts at its smallest shape with PART 0, the build where every
 * kernel has its body (a forward never builds it on a GPU). */
static inline mj_status test_silu_kernel(mj_context_t ctx, const mj_function **f) {
    /* MODE H I K TPE NW1 NW2 NSUB PART STREAM DSTEPS DEAL QG */
    const int32_t kn[MJ_MAX_KNOBS] = {0, 64, 64, 1, 8, 1, 1, 0, 0, 1, 4, 0, 2};
    mj_spec s;
    mj_status st = mj_context_spec(ctx, "moe_experts", kn, &s);
    return st != MJ_OK ? st : mj_jit_get(ctx, &s, f);
}
/* W4A16's dequantization (experts_dequant, in the same PART 0 build): TEST_DQ_WORDS words of
 * eight E2M1 codes, each code in each nibble once for every UE4M3 scale byte but the NaN
 * (0x7F; the sign bit is 0: the checkpoint loader and mj_experts_adopt refuse any other, and
 * the kernels place the byte's bits without looking at it), as byte 0 of word i's scale word
 * with another in byte 2 (the other half's) for even i, bytes 1 and 3 for odd i (the other
 * place of a lane's scale pair), the unread bytes 0xA5. test_dequant_inputs writes them; test_dequant_bad counts the bf16 halves of out (8 words a
 * word: byte 0's scale, then byte 2's) that are not the code's value x the scale x 2^-7
 * (exact: at most 6 significant bits, none subnormal), and prints the first few. */
enum { TEST_DQ_WORDS = 127 * 16 };
static inline void test_dequant_inputs(uint32_t *words, uint32_t *scales) {
    int i = 0;
    for (uint32_t sb = 0; sb < 0x7F; sb++) {
        for (uint32_t k = 0; k < 16; k++, i++) {
            uint32_t w = 0;
            for (uint32_t j = 0; j < 8; j++) w |= ((j * 2 + k) & 15u) << (4 * j); /* code (2j + k) % 16 at nibble j */
            const uint32_t sb2 = (sb * 37u + k * 101u + 11u) & 0x7Fu; /* byte 2: another scale */
            const uint32_t pair = sb | (sb2 == 0x7F ? 0x00u : sb2) << 16;
            words[i] = w, scales[i] = i & 1 ? pair << 8 | 0x00A500A5u : pair | 0xA500A500u; /* the others unread */
        }
    }
}
/* The words as the packed weights of ctx's target hold them, into dev: bit-placed below
 * sm_120 (W4A16 alone: runtime/weights/pack.c), else as they are. */
static inline void test_dequant_layout(mj_context_t ctx, const uint32_t *words, uint32_t *dev) {
    const int placed = mj_target_sm(mj_context_target(ctx)) < 120;
    for (int i = 0; i < TEST_DQ_WORDS; i++) dev[i] = placed ? mj_pack_place_word(words[i]) : words[i];
}
static inline int test_dequant_bad(const uint32_t *words, const uint32_t *scales, const uint32_t *out) {
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    int bad = 0;
    for (int i = 0; i < 2 * TEST_DQ_WORDS; i++) {
        const uint32_t sb = (scales[i / 2] >> (16 * (i & 1) + 8 * (i / 2 & 1))) & 0xFF, e = (sb >> 3) & 15, m = sb & 7;
        float sc = e ? ldexpf(1.0f + (float)m / 8.0f, (int)e - 7) : ldexpf((float)m / 8.0f, -6);
        for (int j = 0; j < 8; j++) {
            const uint32_t c = (words[i / 2] >> (4 * j)) & 15u;
            const float v = (c & 8 ? -e2m1[c & 7] : e2m1[c & 7]) * sc * 0x1p-7f;
            const uint32_t want = mj_f32_bits(v) >> 16, got = (out[4 * i + j / 2] >> (16 * (j & 1))) & 0xFFFFu;
            if (got != want && bad++ < 4)
                fprintf(stderr, "  code 0x%X x scale 0x%02X: bf16 0x%04X, want 0x%04X (%g)\n", c, sb, got, want, (double)v);
        }
    }
    return bad;
}
/* silu's hard inputs (it divides without a division instruction): TEST_SILU_PER floats on
 * each side of its branches' edges (|x| 2^-25; x where 1 + e^-x reaches 1, 2^64 and inf), of
 * the two quotients hardest to round and of 1, -1 and 2^-126, the subnormals of both signs
 * around 0, and +-inf, NaN and -0. Writes TEST_SILU_EDGES floats to x. */
enum { TEST_SILU_PER = 4096, TEST_SILU_EDGES = 10 * 2 * TEST_SILU_PER + 4 };
static inline int test_silu_edges(float *x) {
    static const float centers[] = {0.0f, 0x1p-25f, 0x1p-23f, 0x1.8f5c02p-19f, 16.6355324f, -44.3614197f,
                                    -88.7228394f, 1.0f, -1.0f, 0x1p-126f};
    int m = 0;
    for (int c = 0; c < 10; c++)
        for (int i = -TEST_SILU_PER; i < TEST_SILU_PER; i++) /* around 0: the subnormals of both signs */
            x[m++] = c == 0 ? (i < 0 ? -mj_f32_from_bits((uint32_t)-i) : mj_f32_from_bits((uint32_t)i))
                            : mj_f32_from_bits(mj_f32_bits(centers[c]) + (uint32_t)i);
    x[m++] = INFINITY, x[m++] = -INFINITY, x[m++] = NAN, x[m++] = -0.0f;
    return m;
}

#endif
