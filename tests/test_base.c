/* test_base.c — the helpers every layer shares (base/): context added to an error as it is
 * passed up (mj_error_prefix); the growable string (mj_strbuf); the loader of the libraries
 * dlopen'd at run time (mj_dl_lib, on libm: the environment variable, the search with
 * $VAR/ candidates, a missing symbol, the library's own checks, once under many threads);
 * the whole-file reader and its rule (mj_file_read: a symbolic link refused, or followed for
 * a path the caller names; a FIFO, directory or device refused without blocking, a link to
 * one too; the size cap; a missing file, optional or not; relative to a directory).
 */
#include "base.h"
#include "dl.h"
#include "file.h"
#include "strbuf.h"
#include "test.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>

/* ---- mj_error_prefix ------------------------------------------------------------------------ */

static void *other_thread_error(void *arg) {
    (void)arg;
    mj_set_error(MJ_ERR_IO, "the other thread's own");
    mj_error_prefix(MJ_ERR_IO, "there");
    return strcmp(mj_last_error(), "there: the other thread's own") == 0 ? (void *)1 : NULL;
}

static void test_error_prefix(void) {
    mj_set_error(MJ_ERR_CONFIG, "hidden_size %d is not a multiple of 64", 100);
    mj_status s = mj_error_prefix(MJ_ERR_CONFIG, "%s, layer %d", "config.json", 3);
    CHECK(s == MJ_ERR_CONFIG, "the status is kept: %s", mj_status_string(s));
    CHECK(!strcmp(mj_last_error(), "config.json, layer 3: hidden_size 100 is not a multiple of 64"),
          "prefixed: \"%s\"", mj_last_error());
    /* Twice: the context of each caller on the way up. */
    mj_error_prefix(MJ_ERR_CONFIG, "mj_moe_create");
    CHECK(!strcmp(mj_last_error(), "mj_moe_create: config.json, layer 3: hidden_size 100 is not a multiple of 64"),
          "prefixed twice: \"%s\"", mj_last_error());

    /* No detail: the prefix alone, no dangling ": ". */
    mj_clear_error();
    mj_error_prefix(MJ_ERR_INTERNAL, "where");
    CHECK(!strcmp(mj_last_error(), "where"), "no detail: \"%s\"", mj_last_error());

    /* An argument that is the detail itself is read before the buffer is rewritten. */
    mj_set_error(MJ_ERR_IO, "abc");
    mj_error_prefix(MJ_ERR_IO, "%s", mj_last_error());
    CHECK(!strcmp(mj_last_error(), "abc: abc"), "the detail as an argument: \"%s\"", mj_last_error());

    /* A detail that fills the buffer: cut at its end, the prefix whole, still terminated. */
    static char long_text[5000];
    memset(long_text, 'x', sizeof long_text - 1);
    mj_set_error(MJ_ERR_IO, "%s", long_text);
    mj_error_prefix(MJ_ERR_IO, "front");
    size_t n = strlen(mj_last_error());
    CHECK(n == 4095 && !strncmp(mj_last_error(), "front: xxx", 10), "a long detail: %zu bytes, \"%.12s\"", n,
          mj_last_error());

    /* The detail is the calling thread's: another thread's prefix does not touch it. */
    mj_set_error(MJ_ERR_CONFIG, "mine");
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, other_thread_error, NULL) == 0, "pthread_create");
    pthread_join(th, &ok);
    CHECK(ok != NULL, "the other thread saw its own detail, prefixed");
    CHECK(!strcmp(mj_last_error(), "mine"), "this thread's detail: \"%s\"", mj_last_error());
}

/* ---- mj_strbuf ------------------------------------------------------------------------------ */

static void test_strbuf(void) {
    /* Nothing added: "" (not NULL). */
    mj_strbuf b = MJ_STRBUF_INIT;
    char *s = mj_sb_take(&b);
    CHECK(s && !strcmp(s, ""), "an empty builder gives \"\"");
    free(s);
    CHECK(!b.data && !b.len && !b.cap && !b.oom, "take leaves the builder empty");

    /* Appends and formats, across many reallocations; always NUL-terminated. */
    mj_sb_puts(&b, "a");
    mj_sb_append(&b, "bcd", 2);
    mj_sb_printf(&b, "[%d]", 42);
    CHECK(b.len == 7 && !strcmp(b.data, "abc[42]"), "appended: \"%s\" (%zu)", b.data ? b.data : "(null)", b.len);
    size_t want = b.len;
    for (int i = 0; i < 1000; i++) {
        mj_sb_printf(&b, "%05d,", i);
        want += 6;
    }
    CHECK(b.len == want && strlen(b.data) == want && !strncmp(b.data + 7, "00000,00001,", 12) &&
              !strcmp(b.data + want - 6, "00999,"),
          "1000 formats: %zu bytes (want %zu)", b.len, want);
    /* One format longer than the room left (and than the first allocation). */
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mj_sb_printf(&b, "<%s>", big);
    want += sizeof big + 1;
    CHECK(b.len == want && strlen(b.data) == want && b.data[want - 1] == '>' && b.data[want - 2] == 'q',
          "a long format: %zu bytes (want %zu)", b.len, want);
    mj_sb_free(&b);
    CHECK(!b.data && !b.len, "free leaves the builder empty");

    /* After a failed allocation every call does nothing and take gives NULL. */
    mj_sb_puts(&b, "kept?");
    b.oom = 1;
    mj_sb_puts(&b, "more");
    mj_sb_printf(&b, "%d", 7);
    CHECK(b.len == 5 && !strcmp(b.data, "kept?"), "nothing added after oom: \"%s\"", b.data);
    CHECK(mj_sb_take(&b) == NULL && !b.data && !b.oom, "take after oom: NULL, and the text freed");
}

/* ---- mj_dl_lib ------------------------------------------------------------------------------ */

typedef struct m_table {
    double (*cos)(double);
    double (*sqrt)(double);
} m_table;
static m_table g_m;
static const mj_dl_sym k_m_syms[] = {{"cos", offsetof(__typeof__(g_m), cos)}, {"sqrt", offsetof(__typeof__(g_m), sqrt)}};
static const mj_dl_sym k_m_missing[] = {{"cos", offsetof(__typeof__(g_m), cos)},
                                        {"no_such_symbol_anywhere", offsetof(__typeof__(g_m), sqrt)}};

static atomic_int g_inits;
static mj_status m_init_ok(mj_dl_lib *lib, void *h, char *err, size_t len) {
    (void)lib, (void)h, (void)err, (void)len;
    atomic_fetch_add(&g_inits, 1);
    struct timespec t = {0, 20 * 1000 * 1000}; /* slow: the other threads must wait for it */
    nanosleep(&t, NULL);
    return MJ_OK;
}
static mj_status m_init_fails(mj_dl_lib *lib, void *h, char *err, size_t len) {
    (void)h;
    atomic_fetch_add(&g_inits, 1);
    snprintf(err, len, "%s at %s is version 0", lib->what, lib->path);
    return MJ_ERR_UNSUPPORTED;
}

static void *load_in_thread(void *arg) { return (void *)(intptr_t)mj_dl_load_once(arg); }

static void test_dl(void) {
    /* Where libm is, for a "$VAR/name" candidate. */
    Dl_info info;
    char dir[512] = "";
    if (dladdr((void *)&cos, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        dirname(dir);
    }
    static const char *const k_none[] = {"/nonexistent/libm-a.so", "$MJ_TEST_DL_UNSET/libm.so.6", "", NULL};
    static const char *const k_var[] = {"/nonexistent/libm-a.so", "$MJ_TEST_DL_UNSET/libm.so.6",
                                        "$MJ_TEST_DL_DIR/libm.so.6", "libm.so.6", NULL};
    unsetenv("MJ_TEST_DL_UNSET");
    setenv("MJ_TEST_DL_DIR", dir, 1);
    unsetenv("MJ_TEST_DL_LIB");

    /* Nothing loads: the generic message, with what was tried; the status the lib says. */
    static mj_dl_lib none = {.env = "MJ_TEST_DL_LIB", .what = "LIBM", .hint = "set MJ_TEST_DL_LIB=/path",
                             .candidates = k_none, .missing = MJ_ERR_NO_DEVICE, .syms = k_m_syms, .n_syms = 2,
                             .table = &g_m, .table_size = sizeof g_m, .lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK_STATUS(mj_dl_load_once(&none), MJ_ERR_NO_DEVICE);
    CHECK(!strncmp(mj_last_error(), "LIBM not found (tried /nonexistent/libm-a.so; last error: ", 58) &&
              strstr(mj_last_error(), "): set MJ_TEST_DL_LIB=/path"),
          "not found, an unset $VAR and an empty candidate skipped: %s", mj_last_error());
    mj_clear_error();
    CHECK(mj_dl_status(&none) == MJ_ERR_NO_DEVICE && !mj_last_error()[0], "mj_dl_status sets no error");
    CHECK_STATUS(mj_dl_load_once(&none), MJ_ERR_NO_DEVICE);
    CHECK(strstr(mj_last_error(), "LIBM not found"), "the failure is replayed: %s", mj_last_error());

    /* "$VAR/libm.so.6" with $VAR set, the symbols resolved; the second call loads nothing. */
    static mj_dl_lib var = {.env = "MJ_TEST_DL_LIB", .what = "LIBM", .hint = "h", .candidates = k_var,
                            .syms = k_m_syms, .n_syms = 2, .table = &g_m, .table_size = sizeof g_m,
                            .init = m_init_ok, .lock = PTHREAD_MUTEX_INITIALIZER};
    atomic_store(&g_inits, 0);
    enum { N_THREADS = 8 };
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) pthread_create(&th[i], NULL, load_in_thread, &var);
    int all_ok = 1;
    for (int i = 0; i < N_THREADS; i++) {
        void *r;
        pthread_join(th[i], &r);
        all_ok &= (intptr_t)r == MJ_OK;
    }
    CHECK(all_ok && atomic_load(&g_inits) == 1, "%d threads: all loaded, init ran %d time(s)", N_THREADS,
          atomic_load(&g_inits));
    CHECK_OK(mj_dl_load_once(&var));
    CHECK(atomic_load(&g_inits) == 1, "loaded once");
    char want[600];
    snprintf(want, sizeof want, "%s/libm.so.6", dir);
    CHECK(dir[0] && !strcmp(var.path, want), "the $VAR candidate loaded: %s (want %s)", var.path, want);
    CHECK(g_m.cos && g_m.cos(0.0) == 1.0 && g_m.sqrt && g_m.sqrt(4.0) == 2.0, "the table is filled");

    /* $env names the file: it alone, no fallback to the search, even one that would load. */
    setenv("MJ_TEST_DL_LIB", "/nonexistent/libm-env.so", 1);
    static mj_dl_lib env = {.env = "MJ_TEST_DL_LIB", .what = "LIBM", .hint = "fix it", .candidates = k_var,
                            .syms = k_m_syms, .n_syms = 2, .table = &g_m, .table_size = sizeof g_m,
                            .lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK_STATUS(mj_dl_load_once(&env), MJ_ERR_LIBRARY);
    CHECK(!strncmp(mj_last_error(),
                   "LIBM not loaded: MJ_TEST_DL_LIB=/nonexistent/libm-env.so cannot be opened (tried "
                   "/nonexistent/libm-env.so; last error: ", 105) &&
              strstr(mj_last_error(), "): fix it"),
          "env: %s", mj_last_error());

    /* A symbol missing: named, the table zeroed. */
    setenv("MJ_TEST_DL_LIB", "libm.so.6", 1);
    m_table before = g_m;
    static mj_dl_lib nosym = {.env = "MJ_TEST_DL_LIB", .what = "LIBM", .hint = "h", .syms = k_m_missing,
                              .n_syms = 2, .table = &g_m, .table_size = sizeof g_m,
                              .lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK_STATUS(mj_dl_load_once(&nosym), MJ_ERR_LIBRARY);
    CHECK(!strcmp(mj_last_error(), "LIBM library libm.so.6 has no symbol no_such_symbol_anywhere (not LIBM, or too "
                                   "old): h"),
          "no symbol: %s", mj_last_error());
    CHECK(!g_m.cos && !g_m.sqrt, "the table is zeroed");
    g_m = before;

    /* The library's own check fails: its status and words, on every call, checked once. */
    atomic_store(&g_inits, 0);
    static mj_dl_lib bad = {.env = "MJ_TEST_DL_LIB", .what = "LIBM", .hint = "h", .syms = k_m_syms, .n_syms = 2,
                            .table = &g_m, .table_size = sizeof g_m, .init = m_init_fails,
                            .lock = PTHREAD_MUTEX_INITIALIZER};
    CHECK_STATUS(mj_dl_load_once(&bad), MJ_ERR_UNSUPPORTED);
    CHECK(!strcmp(mj_last_error(), "LIBM at libm.so.6 is version 0"), "init's words: %s", mj_last_error());
    mj_clear_error();
    CHECK_STATUS(mj_dl_load_once(&bad), MJ_ERR_UNSUPPORTED);
    CHECK(!strcmp(mj_last_error(), "LIBM at libm.so.6 is version 0") && atomic_load(&g_inits) == 1,
          "replayed, init ran %d time(s): %s", atomic_load(&g_inits), mj_last_error());
    unsetenv("MJ_TEST_DL_LIB");
}

/* ---- mj_file_read --------------------------------------------------------------------------- */

static void put(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "writing %s", path);
}

/* mj_file_read(AT_FDCWD, path, ...) must fail with MJ_ERR_IO, the message holding the path
 * and want. */
static void expect_refused(const char *what, const char *path, unsigned flags, size_t cap, const char *want) {
    char *text = (char *)1;
    size_t len = 1;
    mj_status s = mj_file_read(AT_FDCWD, path, NULL, cap, flags, &text, &len);
    CHECK(s == MJ_ERR_IO && text == NULL && len == 0, "%s: %s (want MJ_ERR_IO), text %p", what,
          mj_status_string(s), (void *)text);
    CHECK(strstr(mj_last_error(), path) && strstr(mj_last_error(), want), "%s: \"%s\" (want the path and \"%s\")",
          what, mj_last_error(), want);
}

static void expect_read(const char *what, int dirfd, const char *name, unsigned flags, const char *want) {
    char *text = NULL;
    size_t len = 0;
    mj_status s = mj_file_read(dirfd, name, "LABEL", 1 << 20, flags, &text, &len);
    CHECK(s == MJ_OK && text && len == strlen(want) && !strcmp(text, want), "%s: %s, \"%s\": %s", what,
          mj_status_string(s), text ? text : "(null)", s == MJ_OK ? "" : mj_last_error());
    free(text);
}

static void test_file(void) {
    char *dir = test_tmpdir("base-file");
    CHECK(dir != NULL, "a temporary directory");
    if (!dir) return;
    test_watchdog(30, "test_base: a read (a FIFO opened?)"); /* every FIFO below is refused at once: a blocked open would wait forever */

    char *plain = test_path(dir, "plain.json"), *link = test_path(dir, "link.json"), *dangling = test_path(dir, "dangling.json");
    char *fifo = test_path(dir, "fifo.json"), *fifo_link = test_path(dir, "fifo_link.json"), *sub = test_path(dir, "sub");
    char *dev_link = test_path(dir, "null_link.json"), *big = test_path(dir, "big.json"), *missing = test_path(dir, "missing.json");
    put(plain, "{\"a\": 1}", 8);
    CHECK(symlink(plain, link) == 0, "symlink: %s", strerror(errno));
    CHECK(symlink(missing, dangling) == 0, "symlink: %s", strerror(errno));
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    CHECK(symlink(fifo, fifo_link) == 0, "symlink: %s", strerror(errno));
    CHECK(mkdir(sub, 0700) == 0, "mkdir: %s", strerror(errno));
    CHECK(symlink("/dev/null", dev_link) == 0, "symlink: %s", strerror(errno));

    /* A regular file: the text, NUL-terminated; by path, and relative to a directory. */
    expect_read("a regular file", AT_FDCWD, plain, 0, "{\"a\": 1}");
    expect_read("followed or not, a regular file is read", AT_FDCWD, plain, MJ_FILE_FOLLOW, "{\"a\": 1}");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(dfd >= 0, "open %s", dir);
    expect_read("relative to a directory", dfd, "plain.json", 0, "{\"a\": 1}");

    /* A symbolic link: refused where moejit finds the name, followed where the caller names
     * it (to a regular file only). */
    expect_refused("a link, not followed", link, 0, 1 << 20, "is a symbolic link: refused");
    expect_read("a link the caller names, followed", AT_FDCWD, link, MJ_FILE_FOLLOW, "{\"a\": 1}");
    char *text = NULL;
    size_t len = 0;
    CHECK(mj_file_read(dfd, "link.json", "the label", 1 << 20, 0, &text, &len) == MJ_ERR_IO && !text &&
              !strcmp(mj_last_error(), "the label is a symbolic link: refused (a link moejit finds is never "
                                       "followed: put the file itself there)"),
          "relative to a directory, the label names it: %s", mj_last_error());
    expect_refused("a dangling link, not followed", dangling, 0, 1 << 20, "is a symbolic link: refused");
    expect_refused("a dangling link, followed", dangling, MJ_FILE_FOLLOW, 1 << 20, "No such file or directory");
    CHECK(mj_file_read(AT_FDCWD, dangling, NULL, 1 << 20, MJ_FILE_FOLLOW | MJ_FILE_OPTIONAL, &text, &len) == MJ_OK &&
              !text && !len,
          "a dangling link, followed and optional: nothing");

    /* Never a FIFO (without blocking), a directory or a device, directly or through a link. */
    expect_refused("a FIFO", fifo, 0, 1 << 20, "is not a regular file (a FIFO): refused");
    expect_refused("a FIFO, following", fifo, MJ_FILE_FOLLOW, 1 << 20, "is not a regular file (a FIFO): refused");
    expect_refused("a link to a FIFO, followed", fifo_link, MJ_FILE_FOLLOW, 1 << 20,
                   "is not a regular file (a FIFO): refused");
    expect_refused("a link to a FIFO, not followed", fifo_link, 0, 1 << 20, "is a symbolic link: refused");
    expect_refused("a directory", sub, MJ_FILE_FOLLOW, 1 << 20, "is not a regular file (a directory): refused");
    expect_refused("a device", "/dev/null", MJ_FILE_FOLLOW, 1 << 20,
                   "is not a regular file (a character device): refused");
    expect_refused("a link to a device, followed", dev_link, MJ_FILE_FOLLOW, 1 << 20,
                   "is not a regular file (a character device): refused");

    /* mj_file_open says which, and what is there. */
    struct stat st;
    int err = 0;
    CHECK(mj_file_open(AT_FDCWD, fifo, 0, &st, &err) == -1 && err == MJ_FILE_NOT_REGULAR && S_ISFIFO(st.st_mode),
          "mj_file_open of a FIFO: err %d", err);
    CHECK(mj_file_open(AT_FDCWD, link, 0, &st, &err) == -1 && err == ELOOP && S_ISLNK(st.st_mode),
          "mj_file_open of a link: err %d", err);
    CHECK(mj_file_open(AT_FDCWD, missing, 0, &st, &err) == -1 && err == ENOENT, "mj_file_open of nothing: err %d",
          err);
    int fd = mj_file_open(AT_FDCWD, link, MJ_FILE_FOLLOW, &st, &err);
    CHECK(fd >= 0 && err == 0 && S_ISREG(st.st_mode) && st.st_size == 8, "mj_file_open following: fd %d, err %d",
          fd, err);
    if (fd >= 0) close(fd);

    /* Missing: an error naming it, or nothing at all when optional. */
    expect_refused("missing", missing, 0, 1 << 20, "cannot open");
    text = (char *)1, len = 1;
    CHECK(mj_file_read(AT_FDCWD, missing, NULL, 1 << 20, MJ_FILE_OPTIONAL, &text, &len) == MJ_OK && !text && !len,
          "missing and optional: MJ_OK, no text");

    /* The cap: a file of cap bytes is read, one byte more is refused before any is read. An
     * empty file is "" (not NULL). */
    static char body[4097];
    memset(body, 'x', 4096);
    put(big, body, 4096);
    text = NULL;
    CHECK(mj_file_read(AT_FDCWD, big, NULL, 4096, 0, &text, &len) == MJ_OK && text && len == 4096 &&
              text[4096] == '\0',
          "a file of exactly the cap: %s", mj_last_error());
    free(text);
    expect_refused("over the cap", big, 0, 4095, "is 4096 bytes, more than the 4095 bytes limit for this file");
    expect_refused("over a round cap", big, 0, 2048, "more than the 2 KiB limit");
    put(big, "", 0);
    text = NULL;
    CHECK(mj_file_read(AT_FDCWD, big, NULL, 4096, 0, &text, &len) == MJ_OK && text && !text[0] && !len,
          "an empty file: \"\"");
    free(text);

    test_watchdog(0, NULL);
    if (dfd >= 0) close(dfd);
    free(plain), free(link), free(dangling), free(fifo), free(fifo_link), free(sub), free(dev_link), free(big);
    free(missing);
    test_rm_rf(dir);
    free(dir);
}

static const test_case cases[] = {
    TEST_CASE("error_prefix", test_error_prefix),
    TEST_CASE("strbuf", test_strbuf),
    TEST_CASE("dl", test_dl),
    TEST_CASE("file", test_file),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL); }
