/* test_npy.c — the command's .npy reader and writer (tools/npy.c): what it refuses, and that
 * it never asks for more memory than the file can hold.
 *
 * Linked with -Wl,--wrap=malloc: every malloc the reader makes passes through wrap_malloc
 * below, which records the largest request while g_watch is set. */
#include "npy.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

static int g_watch;
static size_t g_max_request;

void *__wrap_malloc(size_t n) {
    if (g_watch && n > g_max_request) g_max_request = n;
    return __real_malloc(n);
}

static char g_dir[] = "/tmp/mj-test-npy-XXXXXX";

static const char *in_dir(const char *name) {
    static char buf[4][256];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

/* A version-1 .npy: header dict for `shape` (text like "(4294967296,)"), then `data_len`
 * bytes of data. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t data_len) {
    char dict[256], hdr[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    int pad = (64 - (10 + n + 1) % 64) % 64;
    int hl = n + pad + 1;
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = (char)(hl & 0xFF), hdr[9] = (char)(hl >> 8);
    memcpy(hdr + 10, dict, (size_t)n);
    memset(hdr + 10 + n, ' ', (size_t)pad);
    hdr[10 + n + pad] = '\n';
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL, "cannot create %s: %s", path, strerror(errno));
    if (!fp) return;
    fwrite(hdr, 1, (size_t)(10 + hl), fp);
    if (data_len) fwrite(data, 1, data_len, fp);
    fclose(fp);
}

/* Load with the allocation watch on; returns npy_load's result. */
static int watched_load(const char *path, const char *want, npy_array *a, char *err, size_t errlen) {
    g_max_request = 0;
    g_watch = 1;
    int rc = npy_load(path, want, a, err, errlen);
    g_watch = 0;
    return rc;
}

/* What the cases write: v in (2, 3) files, w in (3,) ones. */
static const float v[6] = {1, 2, 3, 4, 5, 6}, w[3] = {7, 8, 9};
static const int64_t shape[1] = {3};
static char link_name[512]; /* the old predictable temporary name of out.npy */

static int setup(void) {
    CHECK(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(link_name, sizeof link_name, "%s.tmp.%ld", in_dir("out.npy"), (long)getpid());
    return 0;
}

/* Everything the cases left in the directory, then it: nothing else may be there. */
static void teardown(void) {
    const char *names[] = {"huge.npy", "huge2.npy", "hdr.npy", "ok.npy", "short.npy", "over.npy", "empty.npy",
                           "fifo.npy", "target", "out.npy", "null.npy", "chr.npy", "tlink.npy", "stdout.npy"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(in_dir(names[i]));
    unlink(link_name);
    rmdir(in_dir("dir.npy"));
    CHECK(rmdir(g_dir) == 0, "%s not empty after the test (a temporary left?): %s", g_dir, strerror(errno));
}

/* A file the case uses that an earlier case makes, when that one did not run: the directory
 * dir.npy, the FIFO fifo.npy, target (v in a (2, 3) file). */
static void need_dir(void) {
    if (access(in_dir("dir.npy"), F_OK) != 0) CHECK(mkdir(in_dir("dir.npy"), 0700) == 0, "mkdir: %s", strerror(errno));
}
static void need_fifo(void) {
    if (access(in_dir("fifo.npy"), F_OK) != 0) CHECK(mkfifo(in_dir("fifo.npy"), 0600) == 0, "mkfifo: %s", strerror(errno));
}
static void need_target(void) {
    if (access(in_dir("target"), F_OK) != 0) write_npy(in_dir("target"), "<f4", "(2, 3)", v, sizeof v);
}

/* The reader never asks for more than the file holds, and refuses a file shorter or longer
 * than its header says. */
static void test_truncated(void) {
    char err[512];
    npy_array a;

    /* A header that promises 16 GiB of float32 with no data behind it: refused as truncated
     * after comparing with the file's size, without asking for the 16 GiB first. */
    write_npy(in_dir("huge.npy"), "<f4", "(4294967296,)", NULL, 0);
    CHECK(watched_load(in_dir("huge.npy"), "<f4", &a, err, sizeof err) == -1, "a 16 GiB promise loaded");
    CHECK(strstr(err, "truncated") && strstr(err, "17179869184"), "err: %s", err);
    CHECK(g_max_request < (1u << 20), "npy_load asked for %zu bytes for a file of %d bytes", g_max_request, 128);
    CHECK(a.data == NULL, "a failed load left data");
    /* The same with some data: still far short of the promise. */
    float some[64] = {0};
    write_npy(in_dir("huge2.npy"), "<f4", "(4096, 1048576)", some, sizeof some);
    CHECK(watched_load(in_dir("huge2.npy"), "<f4", &a, err, sizeof err) == -1, "a 16 GiB promise loaded");
    CHECK(strstr(err, "truncated") && strstr(err, "holds 256"), "err: %s", err);
    CHECK(g_max_request < (1u << 20), "npy_load asked for %zu bytes for a file of %zu bytes", g_max_request,
          128 + sizeof some);

    /* A version-2 prefix whose header length says 1 MiB, with nothing after it. */
    FILE *fp = fopen(in_dir("hdr.npy"), "wb");
    CHECK(fp != NULL, "cannot create hdr.npy");
    if (fp) fwrite("\x93NUMPY\x02\x00\x00\x00\x10\x00", 1, 12, fp), fclose(fp);
    CHECK(watched_load(in_dir("hdr.npy"), "<f4", &a, err, sizeof err) == -1, "hdr.npy loaded");
    CHECK(strstr(err, "truncated .npy header") != NULL, "err: %s", err);
    CHECK(g_max_request < 4096, "npy_load asked for %zu bytes for a 12-byte file", g_max_request);

    /* A file that holds what it promises loads, and asks for about that much. */
    write_npy(in_dir("ok.npy"), "<f4", "(2, 3)", v, sizeof v);
    CHECK(watched_load(in_dir("ok.npy"), "<f4", &a, err, sizeof err) == 0, "err: %s", err);
    CHECK(a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.count == 6, "shape");
    CHECK(a.data && !memcmp(a.data, v, sizeof v), "data");
    /* The watch sees the reader's allocations (else the budget checks above prove nothing). */
    CHECK(g_max_request >= sizeof v && g_max_request < (1u << 20), "asked for %zu bytes", g_max_request);
    npy_free(&a);
    /* One byte short, one byte over. */
    write_npy(in_dir("short.npy"), "<f4", "(2, 3)", v, sizeof v - 1);
    CHECK(npy_load(in_dir("short.npy"), "<f4", &a, err, sizeof err) == -1 && strstr(err, "truncated"), "err: %s", err);
    char over[sizeof v + 1] = {0};
    memcpy(over, v, sizeof v);
    write_npy(in_dir("over.npy"), "<f4", "(2, 3)", over, sizeof over);
    CHECK(npy_load(in_dir("over.npy"), "<f4", &a, err, sizeof err) == -1 && strstr(err, "trailing"), "err: %s", err);
    /* A header-only file of zero elements loads. */
    write_npy(in_dir("empty.npy"), "<f4", "(0, 4294967304)", NULL, 0);
    CHECK(npy_load(in_dir("empty.npy"), "<f4", &a, err, sizeof err) == 0, "err: %s", err);
    CHECK(a.count == 0 && a.shape[1] == INT64_C(4294967304), "shape");
    npy_free(&a);
}

static void test_not_numeric(void) {
    char err[512];
    npy_array a;

    /* An object array (np.save of a list of mixed things) is named as one, not as a byte
     * order problem; a string array too. */
    write_npy(in_dir("obj.npy"), "|O", "(2,)", "\x80\x02N.\x80\x02N.", 8);
    CHECK(npy_load(in_dir("obj.npy"), "<f4", &a, err, sizeof err) == -1, "an object array loaded");
    CHECK(strstr(err, "not a numeric array") && !strstr(err, "little-endian"), "err: %s", err);
    write_npy(in_dir("str.npy"), "<U3", "(1,)", "a\0\0\0b\0\0\0c\0\0\0", 12);
    CHECK(npy_load(in_dir("str.npy"), NULL, &a, err, sizeof err) == -1 && strstr(err, "not a numeric array"),
          "err: %s", err);
    unlink(in_dir("obj.npy")), unlink(in_dir("str.npy"));
}

static void test_not_regular(void) {
    char err[512];
    npy_array a;

    /* A directory is named as one, not 'bad magic'. */
    CHECK(mkdir(in_dir("dir.npy"), 0700) == 0, "mkdir: %s", strerror(errno));
    CHECK(npy_load(in_dir("dir.npy"), "<f4", &a, err, sizeof err) == -1, "a directory loaded");
    CHECK(strstr(err, "is a directory") != NULL, "err: %s", err);

    /* A FIFO with no writer: refused at once instead of blocking in open. */
    CHECK(mkfifo(in_dir("fifo.npy"), 0600) == 0, "mkfifo: %s", strerror(errno));
    test_watchdog(10, "test_npy: npy_load on a FIFO (no writer)");
    CHECK(npy_load(in_dir("fifo.npy"), "<f4", &a, err, sizeof err) == -1, "a FIFO loaded");
    test_watchdog(0, NULL);
    CHECK(strstr(err, "not a regular file") != NULL, "err: %s", err);
    /* A character device too. */
    CHECK(npy_load("/dev/zero", "<f4", &a, err, sizeof err) == -1 && strstr(err, "not a regular file"),
          "err: %s", err);
}

static void test_temp_link(void) {
    char err[512];
    npy_array a;
    struct stat st;
    need_dir();

    /* npy_save: a link planted at the old predictable temporary name is left alone. */
    write_npy(in_dir("target"), "<f4", "(2, 3)", v, sizeof v);
    CHECK(symlink(in_dir("target"), link_name) == 0, "symlink: %s", strerror(errno));
    CHECK(npy_save(in_dir("out.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == 0, "err: %s", err);
    CHECK(npy_load(in_dir("target"), "<f4", &a, err, sizeof err) == 0 && a.count == 6 && !memcmp(a.data, v, sizeof v),
          "the link's target changed");
    npy_free(&a);
    CHECK(npy_load(in_dir("out.npy"), "<f4", &a, err, sizeof err) == 0 && a.count == 3 && !memcmp(a.data, w, sizeof w),
          "out.npy does not hold what was saved");
    npy_free(&a);
    CHECK(lstat(in_dir("out.npy"), &st) == 0 && S_ISREG(st.st_mode), "out.npy is not a regular file");
    CHECK(lstat(link_name, &st) == 0 && S_ISLNK(st.st_mode), "the planted link was moved");
    /* Saving over a directory fails and leaves no temporary. */
    CHECK(npy_save(in_dir("dir.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1 && strstr(err, "directory"),
          "err: %s", err);
}

static void test_special_outputs(void) {
    char err[512];
    struct stat st;
    npy_array a;
    need_fifo();
    need_target();

    /* A special file at the output path is refused, and stays what it was: rename would
     * replace a FIFO, a device node or a link to one (as root, /dev/null) with a regular
     * file. The FIFO made above; a link to /dev/null; a device node of our own when this
     * machine lets us make one. */
    CHECK(npy_save(in_dir("fifo.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1, "saved over a FIFO");
    CHECK(strstr(err, "FIFO") && strstr(err, "regular file"), "err: %s", err);
    CHECK(lstat(in_dir("fifo.npy"), &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    CHECK(symlink("/dev/null", in_dir("null.npy")) == 0, "symlink: %s", strerror(errno));
    CHECK(npy_save(in_dir("null.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1, "saved over a link to /dev/null");
    CHECK(strstr(err, "character device"), "err: %s", err);
    CHECK(lstat(in_dir("null.npy"), &st) == 0 && S_ISLNK(st.st_mode), "the link to /dev/null was replaced");
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode), "/dev/null is no longer a device");
    if (mknod(in_dir("chr.npy"), S_IFCHR | 0600, makedev(1, 3)) == 0) {
        CHECK(npy_save(in_dir("chr.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1, "saved over a device");
        CHECK(strstr(err, "character device"), "err: %s", err);
        CHECK(lstat(in_dir("chr.npy"), &st) == 0 && S_ISCHR(st.st_mode), "the device node was replaced");
    } else {
        printf("SKIP: a device node (mknod: %s)\n", strerror(errno));
    }
    /* A link is refused whatever it points to, and neither it nor its target changes: to a
     * regular file, and to /proc/self/fd/1 (what /dev/stdout is; with stdout a file it points
     * at a regular file, and replacing the link would replace the system's /dev/stdout). */
    CHECK(symlink(in_dir("target"), in_dir("tlink.npy")) == 0, "symlink: %s", strerror(errno));
    CHECK(npy_save(in_dir("tlink.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1, "saved over a link");
    CHECK(strstr(err, "symbolic link to a regular file"), "err: %s", err);
    CHECK(lstat(in_dir("tlink.npy"), &st) == 0 && S_ISLNK(st.st_mode), "the link to a regular file was replaced");
    CHECK(npy_load(in_dir("target"), "<f4", &a, err, sizeof err) == 0 && a.count == 6, "the link's target changed");
    npy_free(&a);
    CHECK(symlink("/proc/self/fd/1", in_dir("stdout.npy")) == 0, "symlink: %s", strerror(errno));
    CHECK(npy_save(in_dir("stdout.npy"), "<f4", 4, 1, shape, w, err, sizeof err) == -1, "saved over /proc/self/fd/1");
    CHECK(strstr(err, "symbolic link"), "err: %s", err);
    CHECK(lstat(in_dir("stdout.npy"), &st) == 0 && S_ISLNK(st.st_mode), "the link to /proc/self/fd/1 was replaced");
}

static void test_signals(void) {
    /* A signal while an output is being written (SIGINT, SIGTERM, SIGHUP) removes the
     * temporary and still ends the process by that signal. The child is killed between
     * writing its temporary and renaming it. */
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            npy_out o;
            char e2[512];
            if (npy_write_temp(&o, in_dir("sig.npy"), "<f4", 4, 1, shape, w, e2, sizeof e2) != 0) _exit(3);
            if (access(o.tmp, F_OK) != 0) _exit(4);
            kill(getpid(), sigs[i]);
            _exit(5);
        }
        int ws = 0;
        CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid, "fork/waitpid: %s", strerror(errno));
        CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == sigs[i], "signal %d: the child %s %d", sigs[i],
              WIFSIGNALED(ws) ? "died by signal" : "exited", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
        DIR *d = opendir(g_dir);
        int left = 0;
        for (struct dirent *de; d && (de = readdir(d));) left += strncmp(de->d_name, "sig.npy", 7) == 0;
        if (d) closedir(d);
        CHECK(left == 0, "signal %d: %d file(s) sig.npy* left behind", sigs[i], left);
    }
}

static const test_case cases[] = {
    TEST_CASE("truncated", test_truncated),
    TEST_CASE("not_numeric", test_not_numeric),
    TEST_CASE("not_regular", test_not_regular),
    TEST_CASE("temp_link", test_temp_link),
    TEST_CASE("special_outputs", test_special_outputs),
    TEST_CASE("signals", test_signals),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
