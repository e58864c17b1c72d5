/* test_jit_faults.c — the JIT when its cache directory is damaged or fails under it.
 *
 * No GPU: a compile-only context (NVRTC) builds the fixture_saxpy template. Every case runs
 * in a forked child under alarm(), so a call that blocks (open() of a FIFO) fails the test
 * instead of hanging it; the child's CHECK counts come back through a pipe.
 *
 *   stats file   a FIFO at v1/stats.json does not block mj_context_destroy (which adds the
 *                context's counters to it); the totals land in a regular file.
 *   lock file    a symlink at v1/locks/<key>.lock: the kernel is still compiled (without
 *                the lock), usable and stored; the link's target is never created.
 *   store fails  a file-size limit makes writing entries fail (EFBIG, as a full disk):
 *                the kernels are usable, store_failures counts them (in mj_context_stats
 *                and in the totals), one warning.
 */
#include "cache.h"
#include "jit.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANG_LIMIT_S 30
#define PATH_BUF 4096

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_rf(const char *dir) { nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static void fmt_into(char *out, size_t n, const char *fmt, ...) MJ_PRINTF(3, 4);
static void fmt_into(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

static void make_temp_dir(char out[PATH_BUF], const char *tag) {
    const char *base = getenv("TMPDIR");
    fmt_into(out, PATH_BUF, "%s/mj_jit_faults_%s.XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* root/v1[/sub[/name]] */
static void v1_path(char out[PATH_BUF], const char *root, const char *sub, const char *name) {
    if (name) fmt_into(out, PATH_BUF, "%s/v%d/%s/%s", root, MJ_CACHE_FORMAT, sub, name);
    else if (sub) fmt_into(out, PATH_BUF, "%s/v%d/%s", root, MJ_CACHE_FORMAT, sub);
    else fmt_into(out, PATH_BUF, "%s/v%d", root, MJ_CACHE_FORMAT);
}

/* fixture_saxpy BLOCK=block VEC=1 for sm_120a. */
static mj_spec saxpy(int block) {
    mj_spec s;
    memset(&s, 0, sizeof s);
    int32_t tpl = -1;
    CHECK(mj_template_find("fixture_saxpy", &tpl) != NULL, "fixture_saxpy not in the registry");
    s.tpl = tpl < 0 ? 0 : tpl;
    s.target = MJ_TARGET_SM120A;
    s.backend = MJ_BACKEND_CUDA;
    s.knobs[0] = block;
    s.knobs[1] = 1;
    return s;
}

/* Run fn(arg) in a child under alarm(HANG_LIMIT_S); its CHECK counts are added to ours. */
static void in_child(void (*fn)(const char *), const char *arg, const char *what) {
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        g_pass = g_fail = 0;
        alarm(HANG_LIMIT_S);
        fn(arg);
        int counts[2] = {g_pass, g_fail};
        ssize_t w = write(p[1], counts, sizeof counts);
        _exit(w == (ssize_t)sizeof counts && g_fail == 0 ? 0 : 1);
    }
    close(p[1]);
    int counts[2] = {0, 0}, status = 0;
    ssize_t r = read(p[0], counts, sizeof counts);
    close(p[0]);
    waitpid(pid, &status, 0);
    if (r == (ssize_t)sizeof counts) g_pass += counts[0], g_fail += counts[1];
    CHECK(r == (ssize_t)sizeof counts && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "%s: child status 0x%x (SIGALRM = 14: it hung)", what, status);
}

/* ---- a FIFO at stats.json ------------------------------------------------------------ */

static void stats_fifo_child(const char *dir) {
    mj_context_t ctx = test_new_context(dir, MJ_BACKEND_CUDA, NULL, 0);
    if (!ctx) return;
    mj_spec s = saxpy(64);
    const mj_function *f = NULL;
    CHECK_OK(mj_jit_get(ctx, &s, &f));
    char path[PATH_BUF];
    v1_path(path, dir, "stats.json", NULL);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
    CHECK_OK(mj_context_destroy(ctx)); /* adds the counters: must not wait on the FIFO */
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "stats.json mode %o after destroy",
          (unsigned)st.st_mode);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    double v[MJ_CACHE_N_TOTALS];
    int64_t procs = 0;
    int present = 0;
    CHECK_OK(mj_cache_totals(c, v, &procs, &present));
    CHECK(present && procs == 1 && v[4] == 1, "totals: present %d, %lld processes, %g compiles",
          present, (long long)procs, v[4]);
    mj_cache_close(c);
}

static void test_stats_fifo(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "stats");
    in_child(stats_fifo_child, dir, "context destroy with a FIFO at stats.json");
    rm_rf(dir);
}

/* ---- a symlink at the key's lock file -------------------------------------------------- */

static void lock_symlink_child(const char *scratch) {
    char a[PATH_BUF], b[PATH_BUF], lock[PATH_BUF], entry[PATH_BUF], outside[PATH_BUF];
    fmt_into(a, sizeof a, "%s/a", scratch);
    fmt_into(b, sizeof b, "%s/b", scratch);
    fmt_into(outside, sizeof outside, "%s/outside", scratch);
    /* The key (it does not depend on the directory): from a compile in a scratch cache. */
    mj_spec s = saxpy(128);
    mj_context_t ctx = test_new_context(a, MJ_BACKEND_CUDA, NULL, 0);
    const mj_function *f = NULL;
    CHECK_OK(mj_jit_get(ctx, &s, &f));
    char hex[MJ_KEY_HEX_LEN + 1] = "";
    if (f) fmt_into(hex, sizeof hex, "%s", mj_function_key(f));
    mj_context_destroy(ctx);

    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(b, 0, &c)); /* the directories, so the link can be planted */
    mj_cache_close(c);
    char name[MJ_KEY_HEX_LEN + 8];
    fmt_into(name, sizeof name, "%s.lock", hex);
    v1_path(lock, b, "locks", name);
    CHECK(symlink(outside, lock) == 0, "symlink %s: %s", lock, strerror(errno));

    ctx = test_new_context(b, MJ_BACKEND_CUDA, NULL, 0);
    f = NULL;
    CHECK_OK(mj_jit_get(ctx, &s, &f));
    CHECK(f && mj_function_report(f)->registers > 0 && !strcmp(mj_function_key(f), hex),
          "the kernel compiled without the lock is usable");
    mj_jit_stats st;
    CHECK_OK(mj_context_stats(ctx, &st));
    CHECK(st.compiles == 1 && st.compile_failures == 0, "compiles %lld, failures %lld",
          (long long)st.compiles, (long long)st.compile_failures);
    mj_context_destroy(ctx);
    struct stat sb;
    CHECK(lstat(outside, &sb) != 0, "the lock symlink's target was created");
    CHECK(lstat(lock, &sb) == 0 && S_ISLNK(sb.st_mode), "the planted link changed");
    fmt_into(name, sizeof name, "%s.mjc", hex);
    v1_path(entry, b, "entries", name);
    CHECK(stat(entry, &sb) == 0 && S_ISREG(sb.st_mode), "the entry was not stored");
}

static void test_lock_symlink(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "lock");
    in_child(lock_symlink_child, dir, "a symlink at the lock file");
    rm_rf(dir);
}

/* ---- a store that fails ---------------------------------------------------------------- */

/* A 1 KiB file-size limit (SIGXFSZ ignored): writing the entry fails with EFBIG, as on a
 * full disk. The kernel stays usable; the failure is counted and warned about once. */
static void store_fails_child(const char *dir) {
    mj_context_t ctx = test_new_context(dir, MJ_BACKEND_CUDA, NULL, 0); /* creates the directories before the limit */
    if (!ctx) return;
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 1024;
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit: %s", strerror(errno));
    int pfd[2]; /* stderr into a pipe, which the limit does not cut */
    CHECK(pipe(pfd) == 0, "pipe");
    fflush(stderr);
    int saved = dup(2);
    dup2(pfd[1], 2);
    close(pfd[1]);
    mj_spec s1 = saxpy(256), s2 = saxpy(512);
    const mj_function *f1 = NULL, *f2 = NULL;
    mj_status st1 = mj_jit_get(ctx, &s1, &f1);
    mj_status st2 = mj_jit_get(ctx, &s2, &f2);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char err[8192] = "";
    ssize_t got = read(pfd[0], err, sizeof err - 1);
    (void)got;
    close(pfd[0]);
    CHECK(st1 == MJ_OK && st2 == MJ_OK && f1 && f2 && mj_function_report(f1)->registers > 0,
          "the kernels are usable: %s %s", mj_status_string(st1), mj_status_string(st2));
    mj_jit_stats js;
    CHECK_OK(mj_context_stats(ctx, &js));
    CHECK(js.compiles == 2 && js.store_failures == 2, "compiles %lld, store_failures %lld",
          (long long)js.compiles, (long long)js.store_failures);
    int n_warn = 0;
    for (const char *p = err; (p = strstr(p, "moejit: warning: ")); p++) n_warn++;
    CHECK(n_warn == 1 && strstr(err, "could not store") && strstr(err, "File too large"),
          "stderr was \"%s\"", err);
    char entries[PATH_BUF];
    v1_path(entries, dir, "entries", NULL);
    DIR *d = opendir(entries);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(n == 0, "entries/ holds %d files", n);
    CHECK_OK(mj_context_destroy(ctx)); /* its totals (small) carry store_failures */
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    double v[MJ_CACHE_N_TOTALS];
    int64_t procs = 0;
    int present = 0, idx = -1;
    CHECK_OK(mj_cache_totals(c, v, &procs, &present));
    for (int i = 0; i < MJ_CACHE_N_TOTALS; i++)
        if (!strcmp(mj_cache_total_names[i], "store_failures")) idx = i;
    CHECK(present && idx >= 0 && v[idx] == 2, "totals: store_failures at %d = %g", idx,
          idx >= 0 ? v[idx] : -1.0);
    mj_cache_close(c);
}

static void test_store_fails(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "store");
    in_child(store_fails_child, dir, "stores that fail");
    rm_rf(dir);
}

/* ---- a transient failure is not remembered --------------------------------------------
 * A build that fails in a way that may pass later (here the interpreter cannot create its
 * temp directory: $TMPDIR does not exist, MJ_ERR_IO) is tried again by the next request in
 * the same context, and then succeeds once the cause is gone. */
static void transient_child(const char *dir) {
    mj_context_t ctx = test_new_context(dir, MJ_BACKEND_SIM, NULL, 0);
    if (!ctx) return;
    mj_spec s = saxpy(128);
    s.backend = MJ_BACKEND_SIM;
    s.target = MJ_TARGET_SM120A;
    const mj_function *f = NULL;
    char saved[PATH_BUF] = "";
    const char *t = getenv("TMPDIR");
    if (t) fmt_into(saved, sizeof saved, "%s", t);
    setenv("TMPDIR", "/nonexistent/moejit-test-tmp", 1);
    mj_status st1 = mj_jit_get(ctx, &s, &f);
    CHECK(st1 == MJ_ERR_IO && strstr(mj_last_error(), "/nonexistent/moejit-test-tmp"),
          "first try: %s (%s)", mj_status_string(st1), mj_last_error());
    mj_status st2 = mj_jit_get(ctx, &s, &f); /* still failing: tried again, same error */
    CHECK(st2 == MJ_ERR_IO, "second try: %s", mj_status_string(st2));
    if (saved[0]) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    f = NULL;
    mj_status st3 = mj_jit_get(ctx, &s, &f);
    CHECK(st3 == MJ_OK && f, "after the cause is gone: %s (%s)", mj_status_string(st3),
          mj_last_error());
    mj_jit_stats js;
    CHECK_OK(mj_context_stats(ctx, &js));
    CHECK(js.compiles == 1 && js.mem_misses == 3, "compiles %lld, mem_misses %lld (want 1, 3)",
          (long long)js.compiles, (long long)js.mem_misses);
    CHECK_OK(mj_context_destroy(ctx));
}

static void test_transient(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "transient");
    in_child(transient_child, dir, "a transient failure");
    rm_rf(dir);
}

/* ---- a $TMPDIR with blanks --------------------------------------------------------------
 * The interpreter's compiler gets the source and object paths under $TMPDIR as one argument
 * each: a blank, a quote or a tab in the directory's name is part of the path, not a split
 * point of the command line. The kernel compiles, loads and is stored. */
static void blank_tmpdir_child(const char *dir) {
    char tmp[PATH_BUF], saved[PATH_BUF] = "";
    fmt_into(tmp, sizeof tmp, "%s/tmp dir with 'blanks'\tand a tab", dir);
    CHECK(mkdir(tmp, 0700) == 0, "mkdir %s: %s", tmp, strerror(errno));
    const char *t = getenv("TMPDIR");
    if (t) fmt_into(saved, sizeof saved, "%s", t);
    setenv("TMPDIR", tmp, 1);
    mj_context_t ctx = test_new_context(dir, MJ_BACKEND_SIM, NULL, 0);
    if (ctx) {
        mj_spec s = saxpy(128);
        s.backend = MJ_BACKEND_SIM;
        const mj_function *f = NULL;
        mj_status st = mj_jit_get(ctx, &s, &f);
        CHECK(st == MJ_OK && f, "a sim compile with $TMPDIR '%s': %s (%s)", tmp, mj_status_string(st),
              mj_last_error());
        mj_jit_stats js;
        CHECK_OK(mj_context_stats(ctx, &js));
        CHECK(js.compiles == 1, "compiles %lld (want 1)", (long long)js.compiles);
        CHECK_OK(mj_context_destroy(ctx));
    }
    if (saved[0]) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    /* Nothing left in it: the compile's directory and the loaded object are removed. */
    DIR *d = opendir(tmp);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d));) left += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    CHECK(left == 0, "%d entries left in %s", left, tmp);
}

static void test_blank_tmpdir(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "blank");
    in_child(blank_tmpdir_child, dir, "a $TMPDIR with blanks");
    rm_rf(dir);
}

/* No driver, whatever the machine: compile-only; none of the caller's switches. */
static int setup(void) {
    setenv("MOEJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    unsetenv("MOEJIT_QUIET");
    unsetenv("MOEJIT_CACHE_MAX_BYTES");
    unsetenv("MOEJIT_RECORD");
    unsetenv("MOEJIT_STRICT");
    return 0;
}

static const test_case cases[] = {
    TEST_CASE("stats_fifo", test_stats_fifo),
    TEST_CASE("lock_symlink", test_lock_symlink),
    TEST_CASE("store_fails", test_store_fails),
    TEST_CASE("transient", test_transient),
    TEST_CASE("blank_tmpdir", test_blank_tmpdir),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, NULL); }
