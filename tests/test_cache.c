/* test_cache.c — the on-disk kernel cache: format, verification, safety, eviction, crashes
 * and concurrency.
 *
 * Every case runs in a fresh mkdtemp directory under $TMPDIR (or /tmp), removed at the end.
 * The cache must never hand out a damaged or foreign entry, and a bad directory must never
 * fail the program, so most cases damage something on purpose and then check three things:
 * the lookup misses cleanly (MJ_OK, found = 0), the bad file was moved to quarantine/ (and
 * counted), and nothing else changed.
 *
 *   format       SHA-256 test vectors; encode/decode round trips with and without the
 *                optional sections; every decoder rejection (short, magic, version, bad
 *                lengths, duplicate/unknown tags, missing sections, checksum) by its reason.
 *   damage       every truncation length of a small entry, 64 flipped bytes spread over
 *                header, key, binary and checksum, wrong magic, a version-2 entry with a
 *                valid checksum, a stored key that is not the one asked for (a simulated
 *                hash collision), a symlinked entry.
 *   safety       a world- or group-writable directory, a symlinked root, a directory owned
 *                by someone else (as root only: chown to uid 1): nothing is read or written,
 *                refused_unsafe counts, one warning. MOEJIT_QUIET=1 silences it.
 *   read-only    (a) a cache path below a regular file, so mkdir fails with ENOTDIR — this
 *                works as root too; (b) a real chmod 0500 cache: root ignores permission
 *                bits, so when we are root the case runs in a child that first drops to
 *                uid 65534 (nobody) on a directory chowned to it — it then meets exactly the
 *                EACCES a normal user would. Existing entries still hit, stores write
 *                nothing, the warning is printed once.
 *   eviction     explicit mtimes make the LRU order deterministic; a hit refreshes the
 *                stamp; ties go by name; an entry that alone exceeds the cap is kept.
 *   crash        a writer killed with SIGKILL mid-write. To kill it reliably *during* the
 *                write, the child runs with RLIMIT_FSIZE = 1 MiB and a SIGXFSZ handler that
 *                never returns: the first megabyte lands in its temp file and the next
 *                write parks the child, where the SIGKILL finds it. No entry may appear; the
 *                temp file is removed by a later open or store once it is a minute old and
 *                no writer holds its flock; a live writer's temp file stays however old.
 *   concurrency  8 processes on 20 keys with the lock + re-check protocol: each key is
 *                compiled exactly once; threads share one handle and its counters.
 *   special      a FIFO, a socket or a directory at an entry's name: the lookup misses at
 *                once (a child under alarm(), so a hang fails instead of waiting forever) and
 *                quarantines it; list shows it, read_file refuses it, verify counts it bad.
 *   stats file   a symlink at stats.json or locks/stats.lock pointing outside the cache is
 *                never read or written through; a FIFO at either never blocks (alarm()).
 *   lock files   a symlink (dangling or not), a FIFO or a directory at locks/<hex>.lock:
 *                the lock is a no-op (fd -1, one warning), the link is never followed, and
 *                the compile's store still lands.
 *   store fails  a directory at the entry's name (rename fails) and a file-size limit
 *                (write fails with EFBIG, as on a full disk): MJ_ERR_IO, store_failures
 *                counts each, one warning, no temp file left. Read-only and unsafe caches
 *                count their skipped stores too.
 *   cap          a $MOEJIT_CACHE_MAX_BYTES that is not a byte count ("0", "-5", "1e9"...)
 *                gives the default and one warning naming the value; a cap below one entry
 *                warns once.
 *   open flags   MJ_CACHE_NO_CREATE on a missing directory creates nothing and says it
 *                does not exist; MJ_CACHE_READ_ONLY changes nothing (no stamps, quarantine,
 *                temp clean-up, stores, locks or totals); neither warns.
 */
#include "cache.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PATH_BUF (2 * PATH_MAX)
#define NOBODY_UID 65534

/* ---------------------------------------------------------------------------------------
 * Helpers: directories and files
 * ------------------------------------------------------------------------------------- */

/* snprintf for paths and messages. Going through vsnprintf keeps -Wformat-truncation
 * quiet about buffers that could in theory be too short; a cut path just fails a check. */
static void fmt_into(char *out, size_t n, const char *fmt, ...) MJ_PRINTF(3, 4);
static void fmt_into(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

static void make_temp_dir(char out[PATH_BUF], const char *tag) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    fmt_into(out, PATH_BUF, "%s/mj_cache_%s.XXXXXX", base, tag);
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* rm -rf, making each directory writable first (some cases leave them 0500). */
static void rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    chmod(path, 0700);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char sub[PATH_BUF];
            fmt_into(sub, sizeof sub, "%s/%s", path, de->d_name);
            rm_rf(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

/* root/v1/<sub>[/name] */
static void sub_path(char out[PATH_BUF], const char *root, const char *sub, const char *name) {
    if (name) fmt_into(out, PATH_BUF, "%s/v%d/%s/%s", root, MJ_CACHE_FORMAT, sub, name);
    else if (sub) fmt_into(out, PATH_BUF, "%s/v%d/%s", root, MJ_CACHE_FORMAT, sub);
    else fmt_into(out, PATH_BUF, "%s/v%d", root, MJ_CACHE_FORMAT);
}

static void entry_path(char out[PATH_BUF], const char *root, const char *hex) {
    char name[MJ_KEY_HEX_LEN + 8];
    fmt_into(name, sizeof name, "%s.mjc", hex);
    sub_path(out, root, "entries", name);
}

/* Files (any kind, dot entries aside) in root/v1/<sub>; -1 if it cannot be read. */
static int count_in(const char *root, const char *sub) {
    char path[PATH_BUF];
    sub_path(path, root, sub, NULL);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int write_file(const char *path, const void *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    ssize_t w = len ? write(fd, data, len) : 0;
    close(fd);
    return w == (ssize_t)len ? 0 : -1;
}

/* The whole file as a NUL-terminated malloc'd string ("" when missing). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s = calloc(1, 1);
    if (!f) return s;
    size_t n = 0, cap = 1;
    int ch;
    while ((ch = fgetc(f)) != EOF) {
        if (n + 1 >= cap) {
            cap = cap * 2 + 64;
            s = realloc(s, cap);
        }
        s[n++] = (char)ch;
        s[n] = '\0';
    }
    fclose(f);
    return s;
}

static int count_substr(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Set a file's mtime to `sec` seconds from a clock reading taken once per run (negative:
 * in the past). One shared origin makes equal offsets give equal stamps (the LRU tie test)
 * and stamps stay in the order of their offsets whatever time the calls take. */
static int set_mtime(const char *path, double sec) {
    static int64_t origin;
    if (!origin) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        origin = (int64_t)now.tv_sec * 1000000000ll + now.tv_nsec;
    }
    int64_t ns = origin + (int64_t)(sec * 1e9);
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT},
                             {.tv_sec = (time_t)(ns / 1000000000ll),
                              .tv_nsec = (long)(ns % 1000000000ll)}};
    return utimensat(AT_FDCWD, path, ts, 0);
}

static int64_t mtime_of(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return (int64_t)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------
 * Helpers: stderr capture (the warnings) and child processes
 * ------------------------------------------------------------------------------------- */

typedef struct capture {
    int saved;
    char path[PATH_BUF];
} capture;

static void capture_begin(capture *cap, const char *dir) {
    fflush(stderr);
    snprintf(cap->path, sizeof cap->path, "%s/captured_stderr", dir);
    int fd = open(cap->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cap->saved = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Restore stderr; what was written meanwhile, malloc'd. */
static char *capture_end(capture *cap) {
    fflush(stderr);
    dup2(cap->saved, 2);
    close(cap->saved);
    char *s = slurp(cap->path);
    unlink(cap->path);
    return s;
}

typedef void (*child_fn)(void *arg);

typedef struct child {
    pid_t pid;
    int pipe_fd; /* the child's CHECK counts come back here */
} child;

/* Fork; the child (as uid `as_uid` when >= 0, dropping root first) runs fn, sends its
 * pass/fail counts back and exits. */
static child spawn(child_fn fn, void *arg, int as_uid) {
    int p[2];
    child ch = {-1, -1};
    if (pipe(p) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(stdout);
    fflush(stderr);
    ch.pid = fork();
    if (ch.pid == 0) {
        close(p[0]);
        g_pass = g_fail = 0;
        if (as_uid >= 0 && (setgroups(0, NULL) != 0 || setgid((gid_t)as_uid) != 0 ||
                            setuid((uid_t)as_uid) != 0)) {
            perror("dropping privileges");
            g_fail++;
        } else {
            fn(arg);
        }
        int counts[2] = {g_pass, g_fail};
        ssize_t w = write(p[1], counts, sizeof counts);
        _exit(w == (ssize_t)sizeof counts && g_fail == 0 ? 0 : 1);
    }
    close(p[1]);
    ch.pipe_fd = p[0];
    return ch;
}

static void reap(child ch, const char *what) {
    int counts[2] = {0, 0}, status = 0;
    ssize_t r = read(ch.pipe_fd, counts, sizeof counts);
    close(ch.pipe_fd);
    waitpid(ch.pid, &status, 0);
    if (r == (ssize_t)sizeof counts) {
        g_pass += counts[0];
        g_fail += counts[1];
    }
    CHECK(r == (ssize_t)sizeof counts && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "%s: child status 0x%x, counts %s", what, status, r == sizeof counts ? "ok" : "lost");
}

/* ---------------------------------------------------------------------------------------
 * Helpers: entries
 * ------------------------------------------------------------------------------------- */

/* A small entry whose pieces live inside the struct (do not copy it by value). */
typedef struct test_entry {
    char key[128], hex[MJ_KEY_HEX_LEN + 1], meta[128];
    uint8_t bin[512];
    char ptx[64], log[64], source[64];
    mj_cache_entry e;
} test_entry;

static void make_entry(test_entry *t, const char *key, size_t bin_len, int optional) {
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key);
    mj_key_hash(t->key, t->hex);
    snprintf(t->meta, sizeof t->meta, "{\"template\": \"saxpy\", \"n\": %zu}", bin_len);
    if (bin_len > sizeof t->bin) bin_len = sizeof t->bin;
    for (size_t i = 0; i < bin_len; i++) t->bin[i] = (uint8_t)(i * 131 + key[0]);
    t->e.key_text = t->key;
    t->e.meta_json = t->meta;
    t->e.binary = t->bin;
    t->e.binary_len = bin_len;
    if (optional) {
        snprintf(t->ptx, sizeof t->ptx, ".version 8.0\n.target sm_90\n");
        t->e.ptx = t->ptx;
        t->e.ptx_len = strlen(t->ptx);
        snprintf(t->log, sizeof t->log, "ptxas info: 32 registers");
        t->e.log = t->log;
        snprintf(t->source, sizeof t->source, "__global__ void k() {}\n");
        t->e.source = t->source;
    }
}

static int same_str(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

static int same_entry(const mj_cache_entry *a, const mj_cache_entry *b) {
    return same_str(a->key_text, b->key_text) && same_str(a->meta_json, b->meta_json) &&
           a->binary_len == b->binary_len && a->binary && b->binary &&
           memcmp(a->binary, b->binary, a->binary_len) == 0 && a->ptx_len == b->ptx_len &&
           (a->ptx == NULL) == (b->ptx == NULL) &&
           (!a->ptx || memcmp(a->ptx, b->ptx, a->ptx_len) == 0) && same_str(a->log, b->log) &&
           same_str(a->source, b->source);
}

static void sha256(const void *p, size_t n, uint8_t md[32]) {
    unsigned int len = 0;
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
}

/* Write raw bytes as the entry file of hex. */
static void plant(const char *root, const char *hex, const void *buf, size_t len) {
    char path[PATH_BUF];
    entry_path(path, root, hex);
    if (write_file(path, buf, len) != 0) {
        perror(path);
        exit(2);
    }
}

/* Lookup of t in c that must miss cleanly with the bad file moved to quarantine. */
static void expect_quarantined(mj_cache *c, const char *root, const test_entry *t,
                               const char *what) {
    mj_cache_stats before, after;
    mj_cache_get_stats(c, &before);
    int q_before = count_in(root, "quarantine");
    mj_cache_entry out;
    int found = -1;
    mj_status s = mj_cache_lookup(c, t->hex, t->key, &out, &found);
    mj_cache_get_stats(c, &after);
    char path[PATH_BUF];
    entry_path(path, root, t->hex);
    CHECK(s == MJ_OK && found == 0, "%s: lookup -> %s, found %d", what, mj_status_string(s),
          found);
    CHECK(!exists(path), "%s: the bad entry is still in entries/", what);
    CHECK(count_in(root, "quarantine") == q_before + 1, "%s: quarantine has %d files, want %d",
          what, count_in(root, "quarantine"), q_before + 1);
    CHECK(after.quarantined == before.quarantined + 1 && after.disk_misses == before.disk_misses + 1,
          "%s: quarantined %lld -> %lld, misses %lld -> %lld", what,
          (long long)before.quarantined, (long long)after.quarantined,
          (long long)before.disk_misses, (long long)after.disk_misses);
    mj_cache_entry_free(&out);
}

/* ---------------------------------------------------------------------------------------
 * Format
 * ------------------------------------------------------------------------------------- */

static void test_hash(void) {
    char hex[MJ_KEY_HEX_LEN + 1];
    mj_key_hash("abc", hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
          "sha256(abc) = %s", hex);
    mj_key_hash("", hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
          "sha256('') = %s", hex);
    mj_key_hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
          "sha256(448-bit vector) = %s", hex);
    mj_key_hash(NULL, hex);
    CHECK(hex[0] == '\0', "hash of NULL gives \"%s\", want empty", hex);
}

static void test_round_trip(void) {
    for (int optional = 0; optional < 2; optional++) {
        test_entry t;
        make_entry(&t, "round-trip-key", 100, optional);
        uint8_t *buf = NULL;
        size_t len = 0;
        mj_cache_entry out;
        CHECK_OK(mj_cache_encode(&t.e, &buf, &len));
        CHECK(len > 48 && !memcmp(buf, MJ_CACHE_MAGIC, 8), "encoded %zu bytes", len);
        CHECK(buf[8] == MJ_CACHE_FORMAT && buf[9] == 0 && buf[12] == (optional ? 6 : 3),
              "version byte %d, section count %d", buf[8], buf[12]);
        CHECK_OK(mj_cache_decode(buf, len, &out));
        CHECK(same_entry(&out, &t.e), "round trip (optional=%d) differs", optional);
        CHECK(optional || (!out.ptx && !out.log && !out.source && out.ptx_len == 0),
              "absent optional sections came back");
        CHECK(!optional || (out.ptx[out.ptx_len] == '\0' && strlen(out.log) == strlen(t.log)),
              "text sections are NUL-terminated");
        mj_cache_entry_free(&out);
        CHECK(out.key_text == NULL && out.binary == NULL, "entry_free clears the struct");
        free(buf);
    }

    /* PTX carries its length (NVRTC's size counts the NUL); an empty binary is kept. */
    test_entry t;
    make_entry(&t, "ptx-with-nul", 0, 0);
    static const char ptx[] = ".version 8.0\n\0";
    t.e.ptx = (char *)ptx;
    t.e.ptx_len = sizeof ptx - 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    mj_cache_entry out;
    CHECK_OK(mj_cache_encode(&t.e, &buf, &len));
    CHECK_OK(mj_cache_decode(buf, len, &out));
    CHECK(out.ptx_len == sizeof ptx - 1 && !memcmp(out.ptx, ptx, sizeof ptx - 1),
          "ptx_len %zu", out.ptx_len);
    CHECK(out.binary != NULL && out.binary_len == 0, "empty binary: %p, %zu", (void *)out.binary,
          out.binary_len);
    mj_cache_entry_free(&out);
    free(buf);

    /* Bad arguments. */
    mj_cache_entry bad = t.e;
    bad.meta_json = NULL;
    CHECK_STATUS(mj_cache_encode(&bad, &buf, &len), MJ_ERR_INVALID_ARG);
    bad = t.e;
    bad.ptx = NULL;
    bad.ptx_len = 5;
    CHECK_STATUS(mj_cache_encode(&bad, &buf, &len), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_encode(NULL, &buf, &len), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_decode(NULL, 10, &out), MJ_ERR_INVALID_ARG);
}

/* A hand-made entry: any header, sections with any tag/reserved/length field, and a valid
 * checksum over it all — so each check of the decoder can be reached on its own. */
typedef struct craft_section {
    uint32_t tag, reserved;
    uint64_t len_field;
    const char *data; /* strlen(data) bytes follow the header */
} craft_section;

static size_t craft(uint8_t *out, const char *magic, uint32_t version, uint32_t count,
                    const craft_section *s, int n) {
    size_t p = 0;
    memcpy(out, magic, 8);
    p = 8;
    for (int i = 0; i < 4; i++) out[p++] = (uint8_t)(version >> (8 * i));
    for (int i = 0; i < 4; i++) out[p++] = (uint8_t)(count >> (8 * i));
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < 4; i++) out[p++] = (uint8_t)(s[k].tag >> (8 * i));
        for (int i = 0; i < 4; i++) out[p++] = (uint8_t)(s[k].reserved >> (8 * i));
        for (int i = 0; i < 8; i++) out[p++] = (uint8_t)(s[k].len_field >> (8 * i));
        size_t dl = strlen(s[k].data);
        memcpy(out + p, s[k].data, dl);
        p += dl;
    }
    sha256(out, p, out + p);
    return p + 32;
}

#define SEC(tag, text) {(tag), 0, sizeof(text) - 1, (text)}

static void expect_parse(const uint8_t *buf, size_t len, const char *reason, const char *what) {
    mj_cache_entry out;
    mj_status s = mj_cache_decode(buf, len, &out);
    CHECK(s == MJ_ERR_PARSE && strstr(mj_last_error(), reason), "%s: %s: \"%s\" (want \"%s\")",
          what, mj_status_string(s), mj_last_error(), reason);
    CHECK(out.key_text == NULL && out.binary == NULL, "%s: output touched", what);
    if (s == MJ_OK) mj_cache_entry_free(&out);
}

static void test_decode_errors(void) {
    static uint8_t buf[4096];
    const char *M = MJ_CACHE_MAGIC;
    const craft_section good[3] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "BIN")};
    size_t len;

    /* The crafted good entry decodes (so each failure below is the one change). */
    mj_cache_entry out;
    len = craft(buf, M, MJ_CACHE_FORMAT, 3, good, 3);
    CHECK_OK(mj_cache_decode(buf, len, &out));
    CHECK(out.binary_len == 3 && !strcmp(out.key_text, "k"), "crafted entry");
    mj_cache_entry_free(&out);

    for (size_t n = 0; n < 48; n += 7) expect_parse(buf, n, "short file", "short");
    expect_parse(buf, 47, "short file", "47 bytes");

    len = craft(buf, "MOEJITX\n", MJ_CACHE_FORMAT, 3, good, 3);
    expect_parse(buf, len, "wrong magic", "magic");
    len = craft(buf, M, 2, 3, good, 3);
    expect_parse(buf, len, "unsupported format version 2", "version 2");
    len = craft(buf, M, 0, 3, good, 3);
    expect_parse(buf, len, "unsupported format version 0", "version 0");

    const craft_section unknown[4] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "B"), SEC(7, "x")};
    len = craft(buf, M, 1, 4, unknown, 4);
    expect_parse(buf, len, "unknown tag 7", "tag 7");
    const craft_section zero_tag[4] = {SEC(0, "x"), SEC(1, "k"), SEC(2, "{}"), SEC(3, "B")};
    len = craft(buf, M, 1, 4, zero_tag, 4);
    expect_parse(buf, len, "unknown tag 0", "tag 0");
    const craft_section dup[4] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "B"), SEC(1, "k2")};
    len = craft(buf, M, 1, 4, dup, 4);
    expect_parse(buf, len, "duplicate KEY", "duplicate");

    const craft_section no_key[2] = {SEC(2, "{}"), SEC(3, "B")};
    len = craft(buf, M, 1, 2, no_key, 2);
    expect_parse(buf, len, "missing KEY", "no KEY");
    const craft_section no_meta[2] = {SEC(1, "k"), SEC(3, "B")};
    len = craft(buf, M, 1, 2, no_meta, 2);
    expect_parse(buf, len, "missing META", "no META");
    const craft_section no_bin[3] = {SEC(1, "k"), SEC(2, "{}"), SEC(4, "ptx")};
    len = craft(buf, M, 1, 3, no_bin, 3);
    expect_parse(buf, len, "missing BINARY", "no BINARY");

    /* Lengths: one that would wrap around if added to an offset, one a byte too long, a
     * header cut short, bytes after the last section. */
    craft_section huge[3] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "B")};
    huge[1].len_field = UINT64_MAX;
    len = craft(buf, M, 1, 3, huge, 3);
    expect_parse(buf, len, "runs past the end", "length 2^64-1");
    huge[1].len_field = UINT64_MAX - 15;
    len = craft(buf, M, 1, 3, huge, 3);
    expect_parse(buf, len, "runs past the end", "length 2^64-16");
    craft_section one_more[3] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "B")};
    one_more[2].len_field = 2;
    len = craft(buf, M, 1, 3, one_more, 3);
    expect_parse(buf, len, "length 2 runs past the end", "length + 1");
    len = craft(buf, M, 1, 4, good, 3);
    expect_parse(buf, len, "header at offset", "count + 1");
    len = craft(buf, M, 1, 2, good, 3);
    expect_parse(buf, len, "unexpected bytes after the last of 2 sections", "count - 1");
    craft_section reserved[3] = {SEC(1, "k"), SEC(2, "{}"), SEC(3, "B")};
    reserved[0].reserved = 5;
    len = craft(buf, M, 1, 3, reserved, 3);
    expect_parse(buf, len, "reserved field is 5", "reserved");

    /* A NUL inside KEY: craft "aXb" (craft copies strlen bytes), then X -> NUL and fix the
     * checksum. */
    const craft_section key_axb[3] = {SEC(1, "aXb"), SEC(2, "{}"), SEC(3, "B")};
    len = craft(buf, M, 1, 3, key_axb, 3);
    buf[16 + 16 + 1] = 0;
    sha256(buf, len - 32, buf + len - 32);
    expect_parse(buf, len, "KEY section contains a NUL", "NUL in key");

    len = craft(buf, M, 1, 3, good, 3);
    buf[len - 1] ^= 1;
    expect_parse(buf, len, "checksum mismatch", "checksum byte");
    buf[len - 1] ^= 1;
    buf[len - 33] ^= 0x20; /* the last byte of BINARY */
    expect_parse(buf, len, "checksum mismatch", "content byte");
}

/* ---------------------------------------------------------------------------------------
 * Store, lookup and damaged entries
 * ------------------------------------------------------------------------------------- */

static void test_store_lookup(void) {
    char dir[PATH_BUF], path[PATH_BUF];
    make_temp_dir(dir, "basic");
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK(c && !strcmp(mj_cache_dir(c), dir) && mj_cache_readable(c) && mj_cache_writable(c),
          "fresh cache: readable %d writable %d", mj_cache_readable(c), mj_cache_writable(c));
    CHECK(!strcmp(mj_cache_problem(c), ""), "fresh cache: problem \"%s\"", mj_cache_problem(c));
    static const char *const subs[] = {NULL, "entries", "locks", "quarantine", "tmp"};
    for (int i = 0; i < 5; i++) {
        struct stat st;
        sub_path(path, dir, subs[i], NULL);
        CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700,
              "%s: mode %o", path, (unsigned)st.st_mode);
    }

    test_entry t, u;
    make_entry(&t, "store-lookup-key", 300, 1);
    make_entry(&u, "never-stored-key", 10, 0);
    mj_cache_entry out;
    int found = -1;
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 0, "lookup before store: found %d", found);
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    entry_path(path, dir, t.hex);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "entry file mode %o",
          (unsigned)st.st_mode);
    CHECK(count_in(dir, "tmp") == 0, "tmp/ has %d files after a store", count_in(dir, "tmp"));

    CHECK(set_mtime(path, -1000) == 0, "utimensat");
    int64_t before = now_ns() - 1000000000ll; /* allow for a coarse file-system clock */
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1 && same_entry(&out, &t.e), "lookup after store: found %d", found);
    CHECK(mtime_of(path) >= before, "a hit refreshes the mtime stamp");
    mj_cache_entry_free(&out);
    CHECK_OK(mj_cache_lookup(c, u.hex, u.key, &out, &found));
    CHECK(found == 0, "other key: found %d", found);

    mj_cache_stats s;
    mj_cache_get_stats(c, &s);
    CHECK(s.disk_hits == 1 && s.disk_misses == 2 && s.stores == 1 && s.quarantined == 0 &&
              s.evicted == 0 && s.refused_unsafe == 0,
          "stats: hits %lld misses %lld stores %lld", (long long)s.disk_hits,
          (long long)s.disk_misses, (long long)s.stores);

    /* Storing again replaces the entry atomically. */
    t.bin[0] ^= 0xff;
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1 && same_entry(&out, &t.e), "the second store replaced the first");
    mj_cache_entry_free(&out);

    /* list, read_file, verify. */
    mj_cache_item *items = NULL;
    int n = 0;
    CHECK_OK(mj_cache_list(c, &items, &n));
    CHECK(n == 1 && !strcmp(items[0].key_hex, t.hex) && items[0].bytes == file_size(path) &&
              items[0].last_used_ns == mtime_of(path),
          "list: %d items", n);
    free(items);
    CHECK_OK(mj_cache_read_file(path, &out));
    CHECK(same_entry(&out, &t.e), "read_file");
    mj_cache_entry_free(&out);
    int ok = -1, bad = -1;
    CHECK_OK(mj_cache_verify(c, &ok, &bad));
    CHECK(ok == 1 && bad == 0, "verify: %d ok, %d bad", ok, bad);

    /* read_file errors name the file. */
    char missing[PATH_BUF];
    fmt_into(missing, sizeof missing, "%s/nope.mjc", dir);
    CHECK_STATUS(mj_cache_read_file(missing, &out), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "nope.mjc") != NULL, "message: %s", mj_last_error());
    write_file(missing, "MOEJITC\n", 8);
    CHECK_STATUS(mj_cache_read_file(missing, &out), MJ_ERR_PARSE);
    CHECK(strstr(mj_last_error(), "nope.mjc") && strstr(mj_last_error(), "short file"),
          "message: %s", mj_last_error());

    /* Bad arguments: a key hex that is not 64 lowercase digits never becomes a path, and a
     * store under a hex that is not the hash of the entry's key is refused. */
    CHECK_STATUS(mj_cache_lookup(c, "../../etc/passwd", t.key, &out, &found), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_lookup(c, "ABC", t.key, &out, &found), MJ_ERR_INVALID_ARG);
    char upper[MJ_KEY_HEX_LEN + 1];
    fmt_into(upper, sizeof upper, "%s", t.hex);
    for (char *p = upper; *p; p++)
        if (*p >= 'a' && *p <= 'f') *p = (char)(*p - 'a' + 'A');
    CHECK_STATUS(mj_cache_lookup(c, upper, t.key, &out, &found), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_store(c, u.hex, &t.e), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_store(c, "", &t.e), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_cache_lookup(c, t.hex, NULL, &out, &found), MJ_ERR_INVALID_ARG);
    int fd = 0;
    CHECK_STATUS(mj_cache_lock(c, "x", &fd, NULL), MJ_ERR_INVALID_ARG);
    CHECK(fd == -1, "failed lock leaves fd -1");
    CHECK_STATUS(mj_cache_open(dir, 0, NULL), MJ_ERR_INVALID_ARG);
    mj_cache *c2 = (mj_cache *)1;
    CHECK_STATUS(mj_cache_open("", 0, &c2), MJ_ERR_INVALID_ARG);
    CHECK(c2 == NULL, "failed open sets *out = NULL");

    mj_cache_close(c);
    rm_rf(dir);
}

static void test_truncation(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "trunc");
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    test_entry t;
    make_entry(&t, "truncated-key", 40, 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mj_cache_encode(&t.e, &buf, &len));
    int decoded = 0, wrong = 0;
    for (size_t cut = 0; cut < len; cut++) {
        mj_cache_entry out;
        if (mj_cache_decode(buf, cut, &out) == MJ_ERR_PARSE) decoded++;
        else wrong++;
        plant(dir, t.hex, buf, cut);
        char what[64];
        fmt_into(what, sizeof what, "truncated to %zu of %zu", cut, len);
        expect_quarantined(c, dir, &t, what);
    }
    CHECK(decoded == (int)len && wrong == 0, "decode rejected %d of %zu truncations", decoded, len);
    CHECK(count_in(dir, "quarantine") == (int)len, "quarantine holds %d, want %zu",
          count_in(dir, "quarantine"), len);
    /* The whole file still works: the rejections above were the cuts. */
    plant(dir, t.hex, buf, len);
    mj_cache_entry out;
    int found = 0;
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1, "the untruncated entry hits");
    mj_cache_entry_free(&out);
    free(buf);
    mj_cache_close(c);
    rm_rf(dir);
}

static void test_flipped_bytes(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "flip");
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    test_entry t;
    make_entry(&t, "flipped-byte-key-with-some-length", 120, 1);
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mj_cache_encode(&t.e, &buf, &len));
    /* 64 positions spread evenly from the first byte (magic) to the last (checksum): with
     * a ~420-byte entry that is every ~7th byte, so header, KEY, META, BINARY, PTX, LOG,
     * SOURCE and the checksum all get several. */
    int in_header = 0, in_checksum = 0;
    for (int i = 0; i < 64; i++) {
        size_t pos = (size_t)i * (len - 1) / 63;
        in_header += pos < 16;
        in_checksum += pos >= len - 32;
        buf[pos] ^= (uint8_t)(1u << (i % 8));
        mj_cache_entry out;
        char what[64];
        fmt_into(what, sizeof what, "byte %zu of %zu flipped", pos, len);
        mj_status s = mj_cache_decode(buf, len, &out);
        CHECK(s == MJ_ERR_PARSE, "%s: decode -> %s", what, mj_status_string(s));
        if (s == MJ_OK) mj_cache_entry_free(&out);
        plant(dir, t.hex, buf, len);
        expect_quarantined(c, dir, &t, what);
        buf[pos] ^= (uint8_t)(1u << (i % 8));
    }
    CHECK(in_header >= 2 && in_checksum >= 4, "sample: %d in header, %d in checksum", in_header,
          in_checksum);
    free(buf);
    mj_cache_close(c);
    rm_rf(dir);
}

static void test_wrong_magic_version_key(void) {
    char dir[PATH_BUF], path[PATH_BUF];
    make_temp_dir(dir, "wrong");
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    test_entry t;
    make_entry(&t, "wrong-things-key", 64, 0);
    uint8_t *buf = NULL;
    size_t len = 0;
    mj_cache_entry out;
    int found;
    CHECK_OK(mj_cache_encode(&t.e, &buf, &len));

    /* Wrong magic (checksum recomputed, so only the magic is wrong). */
    memcpy(buf, "MOEJITD\n", 8);
    sha256(buf, len - 32, buf + len - 32);
    CHECK_STATUS(mj_cache_decode(buf, len, &out), MJ_ERR_PARSE);
    CHECK(strstr(mj_last_error(), "wrong magic") != NULL, "reason: %s", mj_last_error());
    plant(dir, t.hex, buf, len);
    expect_quarantined(c, dir, &t, "wrong magic");

    /* Version 2 with a valid checksum over it: a newer moejit's entry. */
    memcpy(buf, MJ_CACHE_MAGIC, 8);
    buf[8] = 2;
    sha256(buf, len - 32, buf + len - 32);
    CHECK_STATUS(mj_cache_decode(buf, len, &out), MJ_ERR_PARSE);
    CHECK(strstr(mj_last_error(), "version 2") != NULL, "reason: %s", mj_last_error());
    plant(dir, t.hex, buf, len);
    expect_quarantined(c, dir, &t, "version 2");
    free(buf);

    /* A hash collision: a valid entry for "other text" stored under t's hex. */
    test_entry other;
    make_entry(&other, "a different key text", 64, 0);
    CHECK_OK(mj_cache_encode(&other.e, &buf, &len));
    CHECK_OK(mj_cache_decode(buf, len, &out)); /* the file itself is fine */
    mj_cache_entry_free(&out);
    plant(dir, t.hex, buf, len);
    expect_quarantined(c, dir, &t, "stored key differs");

    /* verify catches the same thing by the file name. */
    plant(dir, t.hex, buf, len);
    CHECK_OK(mj_cache_store(c, other.hex, &other.e));
    int ok = -1, bad = -1;
    CHECK_OK(mj_cache_verify(c, &ok, &bad));
    entry_path(path, dir, t.hex);
    CHECK(ok == 1 && bad == 1 && !exists(path), "verify: %d ok, %d bad", ok, bad);
    free(buf);

    /* A symlink in entries/ is never followed. */
    char target[PATH_BUF];
    entry_path(target, dir, other.hex);
    entry_path(path, dir, t.hex);
    CHECK(symlink(target, path) == 0, "symlink");
    expect_quarantined(c, dir, &t, "symlinked entry");

    /* The quarantined files are named <hex>.<ns>.bad. */
    char qdir[PATH_BUF];
    sub_path(qdir, dir, "quarantine", NULL);
    DIR *d = opendir(qdir);
    int named = 0, total = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        total++;
        size_t n = strlen(de->d_name);
        named += !strncmp(de->d_name, t.hex, MJ_KEY_HEX_LEN) && de->d_name[MJ_KEY_HEX_LEN] == '.' &&
                 n > 4 && !strcmp(de->d_name + n - 4, ".bad");
    }
    if (d) closedir(d);
    CHECK(total == 5 && named == 5, "quarantine: %d files, %d named <hex>.<ns>.bad", total, named);
    (void)found;
    mj_cache_close(c);
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------
 * Unsafe directories
 * ------------------------------------------------------------------------------------- */

/* Open dir (which holds an entry for t) after it has been made unsafe, and check nothing is
 * read or written, the warning (containing `warning`) appears exactly once, and
 * refused_unsafe counts. */
static void expect_unsafe(const char *dir, const char *scratch, const test_entry *t,
                          const char *warning, const char *what) {
    test_entry fresh;
    make_entry(&fresh, "store-into-unsafe", 16, 0);
    capture cap;
    capture_begin(&cap, scratch);
    mj_cache *c = NULL;
    mj_status so = mj_cache_open(dir, 0, &c);
    mj_cache_entry out;
    int found1 = -1, found2 = -1, fd = 0, waited = -1, n = -1, ok = -1, bad = -1, n_ev = -1;
    mj_status s1 = mj_cache_lookup(c, t->hex, t->key, &out, &found1);
    mj_status s2 = mj_cache_lookup(c, t->hex, t->key, &out, &found2);
    mj_status s3 = mj_cache_store(c, fresh.hex, &fresh.e);
    mj_status s4 = mj_cache_lock(c, fresh.hex, &fd, &waited);
    mj_cache_item *items = NULL;
    mj_status s5 = mj_cache_list(c, &items, &n);
    mj_status s6 = mj_cache_verify(c, &ok, &bad);
    mj_status s7 = mj_cache_gc(c, 0, &n_ev);
    char *err = capture_end(&cap);

    CHECK(so == MJ_OK && c, "%s: open -> %s", what, mj_status_string(so));
    CHECK(!mj_cache_readable(c) && !mj_cache_writable(c), "%s: readable %d writable %d", what,
          mj_cache_readable(c), mj_cache_writable(c));
    CHECK(strstr(mj_cache_problem(c), warning) != NULL, "%s: problem \"%s\"", what,
          mj_cache_problem(c));
    CHECK(s1 == MJ_OK && s2 == MJ_OK && found1 == 0 && found2 == 0,
          "%s: lookups of an existing entry: %d %d", what, found1, found2);
    CHECK(s3 == MJ_OK && s4 == MJ_OK && fd == -1 && waited == 0, "%s: store/lock: %s %s fd %d",
          what, mj_status_string(s3), mj_status_string(s4), fd);
    CHECK(s5 == MJ_OK && n == 0 && !items && s6 == MJ_OK && ok == 0 && bad == 0 && s7 == MJ_OK &&
              n_ev == 0,
          "%s: list %d, verify %d/%d, gc %d", what, n, ok, bad, n_ev);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.refused_unsafe == 2 && st.disk_hits == 0 && st.stores == 0 && st.quarantined == 0 &&
              st.store_failures == 1,
          "%s: refused_unsafe %lld", what, (long long)st.refused_unsafe);
    CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, warning) &&
              strstr(err, "not using it"),
          "%s: stderr was \"%s\"", what, err);
    free(err);
    mj_cache_close(c);

    char path[PATH_BUF];
    entry_path(path, dir, fresh.hex);
    CHECK(!exists(path), "%s: the store wrote an entry", what);
    entry_path(path, dir, t->hex);
    CHECK(exists(path), "%s: the existing entry was touched", what);
}

static void test_unsafe(void) {
    char dir[PATH_BUF], scratch[PATH_BUF], path[PATH_BUF], want[PATH_BUF * 2];
    make_temp_dir(scratch, "unsafe");
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    test_entry t;
    make_entry(&t, "unsafe-dir-key", 32, 0);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    mj_cache_close(c);

    /* entries/ world-writable: the message names it, its mode and the fix. */
    sub_path(path, dir, "entries", NULL);
    chmod(path, 0777);
    fmt_into(want, sizeof want, "cache directory %s is writable by other users (mode 0777); "
             "not using it \u2014 run chmod 700 %s", path, path);
    expect_unsafe(dir, scratch, &t, want, "entries 0777");
    chmod(path, 0700);

    /* Quiet: the same, silently. */
    chmod(path, 0777);
    setenv("MOEJIT_QUIET", "1", 1);
    capture cap;
    capture_begin(&cap, scratch);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    mj_cache_entry out;
    int found = -1;
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    char *err = capture_end(&cap);
    CHECK(found == 0 && err[0] == '\0', "MOEJIT_QUIET=1: found %d, stderr \"%s\"", found, err);
    free(err);
    mj_cache_close(c);
    unsetenv("MOEJIT_QUIET");
    chmod(path, 0700);

    /* The root world-writable (with the sticky bit, like /tmp), v1 group-writable. */
    chmod(dir, 01777);
    expect_unsafe(dir, scratch, &t, "writable by other users (mode 1777)", "root 1777");
    chmod(dir, 0700);
    sub_path(path, dir, NULL, NULL);
    chmod(path, 0770);
    expect_unsafe(dir, scratch, &t, "writable by other users (mode 0770)", "v1 0770");
    chmod(path, 0700);

    /* A symlinked root (even to a good cache). */
    char link[PATH_BUF];
    fmt_into(link, sizeof link, "%s/link", scratch);
    CHECK(symlink(dir, link) == 0, "symlink");
    expect_unsafe(link, scratch, &t, "is a symbolic link", "symlinked root");

    /* Owned by someone else: only root can make that happen. */
    if (geteuid() == 0) {
        sub_path(path, dir, "tmp", NULL);
        CHECK(chown(path, 1, 1) == 0, "chown: %s", strerror(errno));
        fmt_into(want, sizeof want, "cache directory %s is owned by uid 1, not by you (uid 0)", path);
        expect_unsafe(dir, scratch, &t, want, "tmp owned by uid 1");
        CHECK(chown(path, 0, 0) == 0, "chown back");
        CHECK(chown(dir, 1, 1) == 0, "chown: %s", strerror(errno));
        expect_unsafe(dir, scratch, &t, "is owned by uid 1", "root owned by uid 1");
        CHECK(chown(dir, 0, 0) == 0, "chown back");
    } else {
        printf("  (not root: the foreign-owner case is skipped)\n");
    }

    /* Made safe again, it works again. */
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1 && mj_cache_writable(c), "safe again: found %d", found);
    mj_cache_entry_free(&out);
    mj_cache_close(c);
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * Read-only directories
 * ------------------------------------------------------------------------------------- */

/* Everything a read-only cache must do; `existing` (may be NULL) is an entry already there.
 * The warning must contain `reason` and appear once. */
static void expect_read_only(const char *dir, const char *scratch, const test_entry *existing,
                             const char *reason, const char *what) {
    test_entry fresh;
    make_entry(&fresh, "store-into-read-only", 16, 0);
    capture cap;
    capture_begin(&cap, scratch);
    mj_cache *c = NULL;
    mj_status so = mj_cache_open(dir, 0, &c);
    mj_cache_entry out, out2;
    int hit = -1, miss = -1, fd = 0, waited = -1, n_ev = -1;
    mj_status s1 = existing ? mj_cache_lookup(c, existing->hex, existing->key, &out, &hit) : MJ_OK;
    mj_status s2 = mj_cache_lookup(c, fresh.hex, fresh.key, &out2, &miss);
    mj_status s3 = mj_cache_store(c, fresh.hex, &fresh.e);
    mj_status s4 = mj_cache_store(c, fresh.hex, &fresh.e);
    mj_status s5 = mj_cache_lock(c, fresh.hex, &fd, &waited);
    mj_status s6 = mj_cache_gc(c, 0, &n_ev);
    mj_cache_unlock(fd);
    char *err = capture_end(&cap);

    CHECK(so == MJ_OK && c && !mj_cache_writable(c), "%s: open -> %s, writable %d", what,
          mj_status_string(so), c ? mj_cache_writable(c) : -1);
    CHECK(mj_cache_readable(c) == (existing != NULL), "%s: readable %d", what,
          mj_cache_readable(c));
    CHECK(strstr(mj_cache_problem(c), "is not writable") && strstr(mj_cache_problem(c), reason),
          "%s: problem \"%s\"", what, mj_cache_problem(c));
    CHECK(s1 == MJ_OK && (!existing || (hit == 1 && same_entry(&out, &existing->e))),
          "%s: existing entry: hit %d", what, hit);
    CHECK(s2 == MJ_OK && miss == 0, "%s: lookup of a new key: found %d", what, miss);
    CHECK(s3 == MJ_OK && s4 == MJ_OK, "%s: store -> %s", what, mj_status_string(s3));
    CHECK(s5 == MJ_OK && fd == -1 && waited == 0 && s6 == MJ_OK && n_ev == 0,
          "%s: lock fd %d, gc %d", what, fd, n_ev);
    CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, "is not writable") &&
              strstr(err, reason) && strstr(err, "kept in memory only"),
          "%s: stderr was \"%s\"", what, err);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.stores == 0 && st.store_failures == 2 && st.disk_hits == (existing ? 1 : 0) &&
              st.disk_misses == 1,
          "%s: stores %lld store_failures %lld hits %lld", what, (long long)st.stores,
          (long long)st.store_failures, (long long)st.disk_hits);
    if (existing) mj_cache_entry_free(&out);
    free(err);
    mj_cache_close(c);
}

static const char *k_ro_dirs[] = {NULL, "entries", "locks", "quarantine", "tmp"};

/* The chmod 0500 case; as root this runs as uid 65534 (see the top of the file). */
static void read_only_child(void *arg) {
    const char *scratch = arg;
    char dir[PATH_BUF], path[PATH_BUF];
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    test_entry t;
    make_entry(&t, "read-only-existing", 48, 1);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK(mj_cache_writable(c), "the cache starts writable (uid %u)", (unsigned)geteuid());
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    mj_cache_close(c);

    chmod(dir, 0500);
    for (int i = 0; i < 5; i++) {
        sub_path(path, dir, k_ro_dirs[i], NULL);
        chmod(path, 0500);
    }
    char expect_dir[PATH_BUF];
    fmt_into(expect_dir, sizeof expect_dir, "cache directory %s is not writable", dir);
    expect_read_only(dir, scratch, &t, expect_dir, "chmod 0500");
    expect_read_only(dir, scratch, &t, "Permission denied", "chmod 0500");
    CHECK(count_in(dir, "entries") == 1 && count_in(dir, "tmp") == 0 &&
              count_in(dir, "locks") == 0,
          "read-only cache changed: %d entries, %d tmp, %d locks", count_in(dir, "entries"),
          count_in(dir, "tmp"), count_in(dir, "locks"));
    for (int i = 0; i < 5; i++) {
        sub_path(path, dir, k_ro_dirs[i], NULL);
        chmod(path, 0700);
    }
    chmod(dir, 0700);
}

static void test_read_only(void) {
    char scratch[PATH_BUF], file[PATH_BUF], dir[PATH_BUF];

    /* (a) Below a regular file: mkdir fails with ENOTDIR, as root too. */
    make_temp_dir(scratch, "ro_file");
    fmt_into(file, sizeof file, "%s/a_file", scratch);
    write_file(file, "x", 1);
    fmt_into(dir, sizeof dir, "%s/a_file/cache", scratch);
    expect_read_only(dir, scratch, NULL, "Not a directory", "below a regular file");
    CHECK(file_size(file) == 1, "the file was changed");
    rm_rf(scratch);

    /* (b) chmod 0500, for real. */
    make_temp_dir(scratch, "ro_chmod");
    if (geteuid() == 0) {
        if (chown(scratch, NOBODY_UID, NOBODY_UID) != 0) perror("chown");
        reap(spawn(read_only_child, scratch, NOBODY_UID), "read-only as uid 65534");
    } else {
        reap(spawn(read_only_child, scratch, -1), "read-only");
    }
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * Eviction
 * ------------------------------------------------------------------------------------- */

static void test_eviction(void) {
    char dir[PATH_BUF], path[PATH_BUF];
    make_temp_dir(dir, "lru");
    /* Six same-size entries (same key length, same binary size). */
    enum { N = 6 };
    static test_entry t[N];
    char key[32];
    for (int i = 0; i < N; i++) {
        fmt_into(key, sizeof key, "lru-key-%c", 'A' + i);
        make_entry(&t[i], key, 400, 0);
    }
    uint8_t *buf = NULL;
    size_t S = 0;
    CHECK_OK(mj_cache_encode(&t[0].e, &buf, &S));
    free(buf);
    const int64_t cap = 3 * (int64_t)S + (int64_t)S / 2; /* room for three */
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, cap, &c));
    for (int i = 0; i < 3; i++) CHECK_OK(mj_cache_store(c, t[i].hex, &t[i].e));
    CHECK(count_in(dir, "entries") == 3, "3 stored, %d present", count_in(dir, "entries"));

    /* Stamps: A oldest, then B, then C. Hitting A makes it the newest, so storing D evicts
     * B — the least recently *used*, not the oldest written. */
    for (int i = 0; i < 3; i++) {
        entry_path(path, dir, t[i].hex);
        set_mtime(path, -300 + 100 * i);
    }
    mj_cache_entry out;
    int found = 0;
    CHECK_OK(mj_cache_lookup(c, t[0].hex, t[0].key, &out, &found));
    CHECK(found == 1, "hit A");
    mj_cache_entry_free(&out);
    CHECK_OK(mj_cache_store(c, t[3].hex, &t[3].e));
    int present[N];
    for (int i = 0; i < N; i++) {
        entry_path(path, dir, t[i].hex);
        present[i] = exists(path);
    }
    CHECK(present[0] && !present[1] && present[2] && present[3],
          "after D: A %d B %d C %d D %d (want B evicted)", present[0], present[1], present[2],
          present[3]);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.evicted == 1, "evicted %lld", (long long)st.evicted);

    /* Ties go by name: C and D share the oldest stamp, so the smaller hex goes. */
    entry_path(path, dir, t[2].hex);
    set_mtime(path, -500);
    entry_path(path, dir, t[3].hex);
    set_mtime(path, -500);
    entry_path(path, dir, t[0].hex);
    set_mtime(path, -100);
    int first = strcmp(t[2].hex, t[3].hex) < 0 ? 2 : 3, second = 5 - first;
    CHECK_OK(mj_cache_store(c, t[4].hex, &t[4].e));
    entry_path(path, dir, t[first].hex);
    CHECK(!exists(path), "tie: %c (smaller hex) should be evicted", 'A' + first);
    entry_path(path, dir, t[second].hex);
    CHECK(exists(path), "tie: %c (larger hex) should stay", 'A' + second);

    /* list comes oldest first. */
    mj_cache_item *items = NULL;
    int n = 0;
    CHECK_OK(mj_cache_list(c, &items, &n));
    CHECK(n == 3 && !strcmp(items[0].key_hex, t[second].hex) && !strcmp(items[1].key_hex, t[0].hex) &&
              !strcmp(items[2].key_hex, t[4].hex) && items[0].bytes == (int64_t)S,
          "list: %d items in LRU order", n);
    free(items);
    mj_cache_close(c);

    /* An entry bigger than the cap on its own: everything else goes, it stays. */
    CHECK_OK(mj_cache_open(dir, (int64_t)S / 2, &c));
    CHECK_OK(mj_cache_store(c, t[5].hex, &t[5].e));
    entry_path(path, dir, t[5].hex);
    mj_cache_get_stats(c, &st);
    CHECK(exists(path) && count_in(dir, "entries") == 1 && st.evicted == 3,
          "alone over the cap: present %d, %d entries, evicted %lld", exists(path),
          count_in(dir, "entries"), (long long)st.evicted);
    int n_ev = -1;
    CHECK_OK(mj_cache_gc(c, -1, &n_ev)); /* gc with the cap has no entry to spare */
    CHECK(n_ev == 1 && count_in(dir, "entries") == 0, "gc(-1): %d evicted", n_ev);
    mj_cache_close(c);

    /* gc to an explicit size keeps the newest. */
    CHECK_OK(mj_cache_open(dir, 0, &c));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mj_cache_store(c, t[i].hex, &t[i].e));
        entry_path(path, dir, t[i].hex);
        set_mtime(path, -30 + i);
    }
    CHECK_OK(mj_cache_gc(c, (int64_t)S, &n_ev));
    entry_path(path, dir, t[2].hex);
    CHECK(n_ev == 2 && exists(path) && count_in(dir, "entries") == 1, "gc(S): %d evicted", n_ev);
    CHECK_OK(mj_cache_gc(c, 0, &n_ev));
    CHECK(n_ev == 1 && count_in(dir, "entries") == 0, "gc(0): %d evicted", n_ev);
    mj_cache_close(c);

    /* max_bytes <= 0 reads $MOEJIT_CACHE_MAX_BYTES. */
    char env[32];
    fmt_into(env, sizeof env, "%zu", S + S / 2);
    setenv("MOEJIT_CACHE_MAX_BYTES", env, 1);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_store(c, t[0].hex, &t[0].e));
    entry_path(path, dir, t[0].hex);
    set_mtime(path, -10);
    CHECK_OK(mj_cache_store(c, t[1].hex, &t[1].e));
    CHECK(!exists(path) && count_in(dir, "entries") == 1, "MOEJIT_CACHE_MAX_BYTES=%s: %d entries",
          env, count_in(dir, "entries"));
    mj_cache_close(c);
    unsetenv("MOEJIT_CACHE_MAX_BYTES");
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------
 * A writer killed mid-write
 * ------------------------------------------------------------------------------------- */

#define BIG_BINARY (16u << 20)
#define FSIZE_LIMIT (1u << 20)

static void park_forever(int sig) {
    (void)sig;
    for (;;) pause();
}

static const char *g_kill_dir;

/* The child: store a 16 MB entry with a 1 MiB file-size limit. The write past the limit
 * raises SIGXFSZ, whose handler never returns, so the child stays mid-write. */
static void killed_writer(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = FSIZE_LIMIT;
    setrlimit(RLIMIT_FSIZE, &rl);
    signal(SIGXFSZ, park_forever);
    mj_cache *c = NULL;
    if (mj_cache_open(g_kill_dir, 0, &c) != MJ_OK) _exit(3);
    test_entry t;
    make_entry(&t, "killed-writer-key", 0, 0);
    uint8_t *big = malloc(BIG_BINARY);
    if (!big) _exit(4);
    memset(big, 0x5a, BIG_BINARY);
    t.e.binary = big;
    t.e.binary_len = BIG_BINARY;
    mj_cache_store(c, t.hex, &t.e);
    _exit(5); /* not reached: the store cannot finish */
}

/* The name of a non-empty file in root/v1/tmp, or 0 if there is none. */
static int find_temp(const char *root, char out[PATH_BUF], int64_t *size) {
    char tmp[PATH_BUF];
    sub_path(tmp, root, "tmp", NULL);
    DIR *d = opendir(tmp);
    int got = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        fmt_into(out, PATH_BUF, "%s/%s", tmp, de->d_name);
        *size = file_size(out);
        if (*size > 0) {
            got = 1;
            break;
        }
    }
    if (d) closedir(d);
    return got;
}

static void test_killed_writer(void) {
    char dir[PATH_BUF], temp[PATH_BUF], path[PATH_BUF];
    make_temp_dir(dir, "kill");
    g_kill_dir = dir;
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) killed_writer();
    int64_t size = 0;
    int seen = 0;
    for (int i = 0; i < 10000 && !(seen = find_temp(dir, temp, &size)); i++) usleep(1000);
    /* Give the child time to reach the write that parks it (the size stops growing). */
    for (int i = 0; i < 1000 && seen; i++) {
        usleep(1000);
        if (file_size(temp) == FSIZE_LIMIT) break;
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(seen && size > 0, "the child's temp file never appeared");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status 0x%x", status);
    CHECK(file_size(temp) == FSIZE_LIMIT, "temp file has %lld bytes, want the first %u",
          (long long)file_size(temp), FSIZE_LIMIT);

    test_entry t;
    make_entry(&t, "killed-writer-key", 0, 0);
    entry_path(path, dir, t.hex);
    CHECK(!exists(path) && count_in(dir, "entries") == 0, "a half-written entry is visible");
    mj_cache_entry out;
    int found = -1;
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(found == 0 && st.quarantined == 0 && st.disk_misses == 1, "lookup: found %d", found);
    mj_cache_close(c);

    /* A young temp file may belong to a live writer: the next open keeps it. */
    CHECK_OK(mj_cache_open(dir, 0, &c));
    mj_cache_close(c);
    CHECK(exists(temp), "a fresh temp file was deleted on open");

    /* Two hours old, it is a dead writer's: the next open deletes it, and only it. */
    char young[PATH_BUF];
    sub_path(young, dir, "tmp", "someone.else.writing.tmp");
    write_file(young, "abc", 3);
    CHECK(set_mtime(temp, -2 * 3600.0) == 0, "utimensat");
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK(!exists(temp) && exists(young), "stale temp: deleted %d, young kept %d", !exists(temp),
          exists(young));
    unlink(young);

    /* And the key can be stored normally afterwards. */
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1, "store after the crash");
    mj_cache_entry_free(&out);
    mj_cache_close(c);
    rm_rf(dir);
}

/* Temp files left in tmp/ count against nothing until removed, so they must not wait for
 * an hour: a dead writer's (no flock on it) goes at the next store once it is a minute old;
 * a live writer's (it holds an flock on its temp file) stays, however old it looks. */
static void test_temp_cleanup(void) {
    char dir[PATH_BUF], temp[PATH_BUF], young[PATH_BUF];
    make_temp_dir(dir, "temps");
    g_kill_dir = dir;
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    mj_cache_close(c);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) killed_writer(); /* parks mid-write, alive */
    int64_t size = 0;
    int seen = 0;
    for (int i = 0; i < 10000 && !(seen = find_temp(dir, temp, &size)); i++) usleep(1000);
    for (int i = 0; i < 2000 && seen && file_size(temp) != FSIZE_LIMIT; i++) usleep(1000);
    CHECK(seen && file_size(temp) == FSIZE_LIMIT, "the writer's temp file: %lld bytes",
          (long long)file_size(temp));

    /* Alive, and its temp file two hours old: neither an open nor a store removes it. */
    CHECK(set_mtime(temp, -2 * 3600.0) == 0, "utimensat");
    test_entry t, u;
    make_entry(&t, "temp-cleanup-one", 64, 0);
    make_entry(&u, "temp-cleanup-two", 64, 0);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    CHECK(exists(temp), "a live writer's temp file was deleted");

    /* Killed: its temp file, a minute and more old, goes at the next store (no reopen); a
     * young unlocked one (a writer between creating and locking it) stays. */
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(set_mtime(temp, -120) == 0, "utimensat");
    char other[PATH_BUF]; /* another dead writer's, planted */
    sub_path(other, dir, "tmp", "dead.writer.1.tmp");
    write_file(other, "partial entry", 13);
    CHECK(set_mtime(other, -90) == 0, "utimensat");
    sub_path(young, dir, "tmp", "just.created.0.tmp");
    write_file(young, "abc", 3);
    CHECK_OK(mj_cache_store(c, u.hex, &u.e));
    CHECK(!exists(temp) && !exists(other) && exists(young),
          "after a store: killed writer's temp %s, planted dead temp %s, young temp %s",
          exists(temp) ? "kept" : "removed", exists(other) ? "kept" : "removed",
          exists(young) ? "kept" : "removed");
    CHECK(count_in(dir, "entries") == 2, "%d entries", count_in(dir, "entries"));
    mj_cache_close(c);
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------
 * Concurrency: processes and threads
 * ------------------------------------------------------------------------------------- */

enum { N_PROCS = 8, N_KEYS = 20 };

typedef struct proc_arg {
    const char *dir, *log;
    int barrier, barrier_w; /* a pipe: read() returns 0 once every write end is closed */
} proc_arg;

static void key_of(int k, char key[64], char hex[MJ_KEY_HEX_LEN + 1]) {
    snprintf(key, 64, "shared-key-%02d", k);
    mj_key_hash(key, hex);
}

/* The fake cubin of key k. */
static void fake_binary(int k, uint8_t *bin, size_t n) {
    for (size_t i = 0; i < n; i++) bin[i] = (uint8_t)(k * 7 + i);
}

static void compiling_child(void *p) {
    const proc_arg *a = p;
    char go;
    close(a->barrier_w); /* ours, inherited: only the parent's may keep the others waiting */
    ssize_t r = read(a->barrier, &go, 1); /* all children start together */
    (void)r;
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(a->dir, 1ll << 30, &c));
    int log_fd = open(a->log, O_WRONLY | O_APPEND | O_CREAT, 0600);
    CHECK(log_fd >= 0, "compile log: %s", strerror(errno));
    for (int k = 0; k < N_KEYS; k++) {
        char key[64], hex[MJ_KEY_HEX_LEN + 1];
        key_of(k, key, hex);
        mj_cache_entry out;
        int found = 0, fd = -1, waited = 0;
        CHECK_OK(mj_cache_lookup(c, hex, key, &out, &found));
        if (!found) {
            CHECK_OK(mj_cache_lock(c, hex, &fd, &waited));
            CHECK(fd >= 0, "lock fd");
            CHECK_OK(mj_cache_lookup(c, hex, key, &out, &found)); /* stored while we waited? */
            if (!found) {
                char line[80];
                int len = snprintf(line, sizeof line, "%s\n", key);
                CHECK(write(log_fd, line, (size_t)len) == len, "log write");
                usleep(2000); /* "compile" */
                uint8_t bin[256];
                fake_binary(k, bin, sizeof bin);
                mj_cache_entry e = {.key_text = key, .meta_json = "{}", .binary = bin,
                                    .binary_len = sizeof bin};
                CHECK_OK(mj_cache_store(c, hex, &e));
            }
            mj_cache_unlock(fd);
        }
        mj_cache_entry_free(&out);
    }
    /* Every key is now there, valid, and the right one. */
    int good = 0;
    for (int k = 0; k < N_KEYS; k++) {
        char key[64], hex[MJ_KEY_HEX_LEN + 1];
        uint8_t bin[256];
        key_of(k, key, hex);
        fake_binary(k, bin, sizeof bin);
        mj_cache_entry out;
        int found = 0;
        mj_status s = mj_cache_lookup(c, hex, key, &out, &found);
        good += s == MJ_OK && found && out.binary_len == sizeof bin &&
                !memcmp(out.binary, bin, sizeof bin);
        mj_cache_entry_free(&out);
    }
    CHECK(good == N_KEYS, "pid %d: %d of %d keys valid", (int)getpid(), good, N_KEYS);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.quarantined == 0, "pid %d quarantined %lld", (int)getpid(), (long long)st.quarantined);
    close(log_fd);
    mj_cache_close(c);
}

static void test_processes(void) {
    char dir[PATH_BUF], log[PATH_BUF];
    make_temp_dir(dir, "procs");
    fmt_into(log, sizeof log, "%s/compile.log", dir);
    char cache_dir[PATH_BUF];
    fmt_into(cache_dir, sizeof cache_dir, "%s/cache", dir);
    int barrier[2];
    if (pipe(barrier) != 0) {
        perror("pipe");
        exit(2);
    }
    proc_arg arg = {cache_dir, log, barrier[0], barrier[1]};
    child kids[N_PROCS];
    for (int i = 0; i < N_PROCS; i++) kids[i] = spawn(compiling_child, &arg, -1);
    close(barrier[0]);
    close(barrier[1]); /* go */
    for (int i = 0; i < N_PROCS; i++) reap(kids[i], "compiling child");

    /* Each key compiled exactly once. */
    char *text = slurp(log);
    int lines = count_substr(text, "\n"), once = 0;
    for (int k = 0; k < N_KEYS; k++) {
        char key[64], hex[MJ_KEY_HEX_LEN + 1], line[80];
        key_of(k, key, hex);
        fmt_into(line, sizeof line, "%s\n", key);
        once += count_substr(text, line) == 1;
    }
    CHECK(lines == N_KEYS && once == N_KEYS, "compile log: %d lines, %d keys exactly once:\n%s",
          lines, once, text);
    free(text);
    CHECK(count_in(cache_dir, "tmp") == 0 && count_in(cache_dir, "entries") == N_KEYS &&
              count_in(cache_dir, "quarantine") == 0,
          "after: %d tmp, %d entries, %d quarantined", count_in(cache_dir, "tmp"),
          count_in(cache_dir, "entries"), count_in(cache_dir, "quarantine"));
    mj_cache *c = NULL;
    int ok = 0, bad = -1;
    CHECK_OK(mj_cache_open(cache_dir, 0, &c));
    CHECK_OK(mj_cache_verify(c, &ok, &bad));
    CHECK(ok == N_KEYS && bad == 0, "verify: %d ok, %d bad", ok, bad);
    mj_cache_close(c);
    rm_rf(dir);
}

typedef struct lock_arg {
    mj_cache *c;
    const char *hex;
    atomic_int done;
    int fd, waited;
    mj_status s;
} lock_arg;

static void *lock_thread(void *p) {
    lock_arg *a = p;
    a->s = mj_cache_lock(a->c, a->hex, &a->fd, &a->waited);
    atomic_store(&a->done, 1);
    return NULL;
}

typedef struct hammer_arg {
    mj_cache *c;
    int id;
    const test_entry *shared;
    int hits;
} hammer_arg;

enum { N_THREADS = 4, N_LOOKUPS = 100 };

static void *hammer_thread(void *p) {
    hammer_arg *a = p;
    test_entry own;
    char key[32];
    fmt_into(key, sizeof key, "thread-key-%d", a->id);
    make_entry(&own, key, 100, 0);
    if (mj_cache_store(a->c, own.hex, &own.e) != MJ_OK) return NULL;
    for (int i = 0; i < N_LOOKUPS; i++) {
        mj_cache_entry out;
        int found = 0;
        if (mj_cache_lookup(a->c, a->shared->hex, a->shared->key, &out, &found) == MJ_OK && found &&
            same_entry(&out, &a->shared->e))
            a->hits++;
        mj_cache_entry_free(&out);
    }
    return NULL;
}

static void test_threads(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "threads");
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    test_entry t;
    make_entry(&t, "lock-wait-key", 8, 0);

    /* Another holder makes us wait: waited = 1, counted. An uncontended lock does not. */
    int fd = -1, waited = -1;
    CHECK_OK(mj_cache_lock(c, t.hex, &fd, &waited));
    CHECK(fd >= 0 && waited == 0, "first lock: fd %d waited %d", fd, waited);
    lock_arg a = {.c = c, .hex = t.hex, .fd = -1, .waited = -1};
    pthread_t th;
    pthread_create(&th, NULL, lock_thread, &a);
    usleep(100 * 1000);
    CHECK(!atomic_load(&a.done), "the second locker did not wait");
    mj_cache_unlock(fd);
    pthread_join(th, NULL);
    CHECK(a.s == MJ_OK && a.fd >= 0 && a.waited == 1, "second lock: fd %d waited %d", a.fd,
          a.waited);
    mj_cache_unlock(a.fd);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.lock_waits == 1, "lock_waits %lld", (long long)st.lock_waits);
    char lock_path[PATH_BUF], name[MJ_KEY_HEX_LEN + 8];
    fmt_into(name, sizeof name, "%s.lock", t.hex);
    sub_path(lock_path, dir, "locks", name);
    CHECK(exists(lock_path), "lock file locks/<hex>.lock");

    /* One handle, many threads: the counters add up. */
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    hammer_arg h[N_THREADS];
    pthread_t ths[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        h[i] = (hammer_arg){.c = c, .id = i, .shared = &t};
        pthread_create(&ths[i], NULL, hammer_thread, &h[i]);
    }
    int hits = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(ths[i], NULL);
        hits += h[i].hits;
    }
    mj_cache_get_stats(c, &st);
    CHECK(hits == N_THREADS * N_LOOKUPS && st.disk_hits == N_THREADS * N_LOOKUPS &&
              st.stores == 1 + N_THREADS,
          "threads: %d hits, stats %lld hits %lld stores", hits, (long long)st.disk_hits,
          (long long)st.stores);
    CHECK(count_in(dir, "entries") == 1 + N_THREADS && count_in(dir, "tmp") == 0,
          "%d entries", count_in(dir, "entries"));
    mj_cache_close(c);
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------
 * Special files: a FIFO, a socket or a directory where an entry should be
 * ------------------------------------------------------------------------------------- */

/* Each case below runs in a child under alarm(): a call that blocks (open() of a FIFO waits
 * for a writer forever) is killed by SIGALRM, which reap() reports as a failure. */
#define HANG_LIMIT_S 10

typedef struct special_arg {
    const char *dir;
    const test_entry *t, *good;
} special_arg;

/* Plant a non-regular file of `kind` ('f' FIFO, 's' socket, 'd' directory) at t's path. */
static int plant_special(const char *root, const test_entry *t, char kind) {
    char path[PATH_BUF];
    entry_path(path, root, t->hex);
    if (kind == 'f') return mkfifo(path, 0600);
    if (kind == 'd') return mkdir(path, 0700);
    /* The full path is longer than sun_path: bind the name relative to entries/. */
    char entries[PATH_BUF];
    sub_path(entries, root, "entries", NULL);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    fmt_into(sa.sun_path, sizeof sa.sun_path, "%s.mjc", t->hex);
    int cwd = open(".", O_RDONLY | O_DIRECTORY), s = socket(AF_UNIX, SOCK_STREAM, 0);
    int r = cwd >= 0 && s >= 0 && chdir(entries) == 0 ? bind(s, (struct sockaddr *)&sa, sizeof sa) : -1;
    if (cwd >= 0 && fchdir(cwd) != 0) r = -1;
    if (cwd >= 0) close(cwd);
    if (s >= 0) close(s);
    return r;
}

static void special_lookup_child(void *p) {
    const special_arg *a = p;
    alarm(HANG_LIMIT_S);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(a->dir, 0, &c));
    static const char kinds[] = "fsd";
    for (int k = 0; kinds[k]; k++) {
        char what[64];
        fmt_into(what, sizeof what, "a %s at the entry path",
                 kinds[k] == 'f' ? "FIFO" : kinds[k] == 's' ? "socket" : "directory");
        CHECK(plant_special(a->dir, a->t, kinds[k]) == 0, "%s: %s", what, strerror(errno));
        int64_t t0 = now_ns();
        expect_quarantined(c, a->dir, a->t, what);
        CHECK(now_ns() - t0 < 2000000000ll, "%s: the lookup took %.1f s", what,
              (double)(now_ns() - t0) / 1e9);
    }
    mj_cache_close(c);
}

static void special_verify_child(void *p) {
    const special_arg *a = p;
    alarm(HANG_LIMIT_S);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(a->dir, 0, &c));
    CHECK(plant_special(a->dir, a->t, 'f') == 0, "mkfifo: %s", strerror(errno));
    /* list shows it (bytes 0) so it is not invisible; reading it fails at once. */
    mj_cache_item *items = NULL;
    int n = 0, fifo_listed = 0;
    CHECK_OK(mj_cache_list(c, &items, &n));
    for (int i = 0; i < n; i++) fifo_listed += !strcmp(items[i].key_hex, a->t->hex) && items[i].bytes == 0;
    CHECK(n == 2 && fifo_listed == 1, "list with a FIFO entry: %d items, FIFO listed %d", n,
          fifo_listed);
    free(items);
    char path[PATH_BUF];
    entry_path(path, a->dir, a->t->hex);
    mj_cache_entry out;
    CHECK_STATUS(mj_cache_read_file(path, &out), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "not a regular file") != NULL, "read_file: %s", mj_last_error());
    /* verify counts it bad and moves it aside; the good entry stays. */
    int ok = -1, bad = -1;
    mj_cache_stats st;
    CHECK_OK(mj_cache_verify(c, &ok, &bad));
    mj_cache_get_stats(c, &st);
    CHECK(ok == 1 && bad == 1 && st.quarantined == 1, "verify: %d ok, %d bad, %lld quarantined",
          ok, bad, (long long)st.quarantined);
    CHECK(!exists(path), "the FIFO is still in entries/");
    mj_cache_close(c);
}

static void test_special_entries(void) {
    char dir[PATH_BUF];
    make_temp_dir(dir, "special");
    test_entry t, good;
    make_entry(&t, "special-file-key", 32, 0);
    make_entry(&good, "a-good-neighbour", 32, 0);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_store(c, good.hex, &good.e));
    mj_cache_close(c);
    special_arg a = {dir, &t, &good};
    reap(spawn(special_lookup_child, &a, -1), "lookups of special files (hang = SIGALRM)");
    reap(spawn(special_verify_child, &a, -1), "list/verify with a FIFO (hang = SIGALRM)");
    /* Quarantined: the FIFO, the socket, the directory (lookups) and the FIFO (verify). */
    char qdir[PATH_BUF];
    sub_path(qdir, dir, "quarantine", NULL);
    int fifos = 0, socks = 0, dirs = 0;
    DIR *d = opendir(qdir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        fifos += S_ISFIFO(st.st_mode), socks += S_ISSOCK(st.st_mode), dirs += S_ISDIR(st.st_mode);
    }
    if (d) closedir(d);
    CHECK(fifos == 2 && socks == 1 && dirs == 1, "quarantine: %d FIFOs, %d sockets, %d dirs",
          fifos, socks, dirs);
    CHECK(count_in(dir, "entries") == 1, "entries/ holds %d files, want the good one",
          count_in(dir, "entries"));
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------
 * The running totals file (v1/stats.json) and its lock (v1/locks/stats.lock)
 * ------------------------------------------------------------------------------------- */

static const double k_one_process[MJ_CACHE_N_TOTALS] = {1, 2, 3, 4, 5, 0, 6.5, 0, 0, 0, 0, 0};

static void expect_totals(mj_cache *c, int want_present, int64_t want_procs, const char *what) {
    double v[MJ_CACHE_N_TOTALS];
    int64_t procs = -1;
    int present = -1;
    CHECK_OK(mj_cache_totals(c, v, &procs, &present));
    CHECK(present == want_present && procs == want_procs &&
              (!want_present || (v[0] == 1 * (double)want_procs && v[4] == 5 * (double)want_procs)),
          "%s: present %d, %lld processes, mem_hits %g, compiles %g", what, present,
          (long long)procs, v[0], v[4]);
}

typedef struct stats_arg {
    const char *dir, *scratch;
} stats_arg;

/* In a child under alarm(): a FIFO at stats.json or stats.lock is never waited on. */
static void stats_fifo_child(void *p) {
    const stats_arg *a = p;
    alarm(HANG_LIMIT_S);
    char path[PATH_BUF];
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(a->dir, 0, &c));

    /* FIFO at stats.json: reading the totals finds none, adding replaces the FIFO. */
    sub_path(path, a->dir, "stats.json", NULL);
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo stats.json: %s", strerror(errno));
    expect_totals(c, 0, 0, "FIFO at stats.json");
    mj_cache_add_totals(c, k_one_process);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "stats.json after adding: mode %o",
          (unsigned)st.st_mode);
    expect_totals(c, 1, 1, "FIFO at stats.json, replaced");
    unlink(path);
    CHECK(!exists(path), "stats.json is still there");

    /* FIFO at locks/stats.lock: refused, so nothing is written. */
    sub_path(path, a->dir, "locks", "stats.lock");
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo stats.lock: %s", strerror(errno));
    mj_cache_add_totals(c, k_one_process);
    expect_totals(c, 0, 0, "FIFO at stats.lock");
    CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO at stats.lock was replaced");
    unlink(path);
    mj_cache_close(c);
}

static void test_stats_file(void) {
    char scratch[PATH_BUF], dir[PATH_BUF], path[PATH_BUF], outside[PATH_BUF];
    make_temp_dir(scratch, "stats");
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    expect_totals(c, 0, 0, "fresh cache");
    mj_cache_add_totals(c, k_one_process);
    mj_cache_add_totals(c, k_one_process);
    expect_totals(c, 1, 2, "two processes");
    sub_path(path, dir, "stats.json", NULL);
    unlink(path);

    /* A symlink at stats.json to a file outside the cache (holding totals of its own): it is
     * neither read through nor written through; the link itself is replaced. */
    static const char planted[] = "{\"processes\": 1000, \"mem_hits\": 1000, \"compiles\": 1000}\n";
    fmt_into(outside, sizeof outside, "%s/outside.json", scratch);
    write_file(outside, planted, strlen(planted));
    CHECK(symlink(outside, path) == 0, "symlink: %s", strerror(errno));
    expect_totals(c, 0, 0, "symlink at stats.json (read)");
    mj_cache_add_totals(c, k_one_process);
    char *text = slurp(outside);
    CHECK(!strcmp(text, planted), "the symlink's target was changed: \"%s\"", text);
    free(text);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "stats.json is not a regular file now");
    expect_totals(c, 1, 1, "symlink at stats.json, replaced");
    unlink(path);
    unlink(outside);

    /* A symlink at locks/stats.lock: its target is neither created nor changed, and since
     * there is no lock to hold, nothing is written. */
    char lock[PATH_BUF];
    sub_path(lock, dir, "locks", "stats.lock");
    unlink(lock); /* the real one, created by the adds above */
    CHECK(symlink(outside, lock) == 0, "symlink: %s", strerror(errno));
    mj_cache_add_totals(c, k_one_process);
    CHECK(!exists(outside), "a symlink at stats.lock created its target");
    expect_totals(c, 0, 0, "dangling symlink at stats.lock");
    write_file(outside, "keep me\n", 8);
    mj_cache_add_totals(c, k_one_process);
    text = slurp(outside);
    CHECK(!strcmp(text, "keep me\n"), "the lock symlink's target was changed: \"%s\"", text);
    free(text);
    expect_totals(c, 0, 0, "symlink at stats.lock");
    unlink(lock);
    CHECK(count_in(dir, "tmp") == 0, "tmp/ holds %d files", count_in(dir, "tmp"));
    mj_cache_close(c);

    stats_arg a = {dir, scratch};
    reap(spawn(stats_fifo_child, &a, -1), "FIFOs at stats.json / stats.lock (hang = SIGALRM)");
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * Unusable lock files: compile without the lock, never follow the link
 * ------------------------------------------------------------------------------------- */

static void lock_files_child(void *p) {
    const char *scratch = p;
    alarm(HANG_LIMIT_S);
    char dir[PATH_BUF], lock[PATH_BUF], outside[PATH_BUF], name[MJ_KEY_HEX_LEN + 8];
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    fmt_into(outside, sizeof outside, "%s/outside", scratch);
    static const char kinds[] = "LlfdF"; /* dangling link, link to a file, FIFO, dir, ok */
    for (int k = 0; kinds[k]; k++) {
        test_entry t;
        char key[32];
        fmt_into(key, sizeof key, "lock-file-key-%c", kinds[k]);
        make_entry(&t, key, 24, 0);
        fmt_into(name, sizeof name, "%s.lock", t.hex);
        mj_cache *c = NULL;
        CHECK_OK(mj_cache_open(dir, 0, &c));
        sub_path(lock, dir, "locks", name);
        unlink(outside);
        int planted = 0;
        switch (kinds[k]) {
        case 'L': planted = symlink(outside, lock); break;
        case 'l': planted = write_file(outside, "keep\n", 5) || symlink(outside, lock); break;
        case 'f': planted = mkfifo(lock, 0600); break;
        case 'd': planted = mkdir(lock, 0700); break;
        default: break;
        }
        CHECK(planted == 0, "%c: planting at %s: %s", kinds[k], lock, strerror(errno));
        capture cap;
        capture_begin(&cap, scratch);
        int fd = -2, waited = -1, fd2 = -2;
        mj_status s1 = mj_cache_lock(c, t.hex, &fd, &waited);
        mj_cache_unlock(fd);
        mj_status s2 = mj_cache_lock(c, t.hex, &fd2, NULL);
        mj_cache_unlock(fd2);
        mj_status s3 = mj_cache_store(c, t.hex, &t.e); /* the compile goes on, and is stored */
        char *err = capture_end(&cap);
        struct stat st;
        if (kinds[k] == 'F') {
            CHECK(s1 == MJ_OK && fd >= 0 && fd2 >= 0 && !err[0], "a good lock: %s fd %d, stderr \"%s\"",
                  mj_status_string(s1), fd, err);
        } else {
            CHECK(s1 == MJ_OK && s2 == MJ_OK && fd == -1 && fd2 == -1 && waited == 0,
                  "%c: lock -> %s (%s), fd %d, fd %d", kinds[k], mj_status_string(s1),
                  mj_last_error(), fd, fd2);
            CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, name) &&
                      strstr(err, "without the lock") && strstr(err, "remove it"),
                  "%c: stderr was \"%s\"", kinds[k], err);
            CHECK(lstat(lock, &st) == 0 && (kinds[k] == 'f'   ? S_ISFIFO(st.st_mode)
                                            : kinds[k] == 'd' ? S_ISDIR(st.st_mode)
                                                              : S_ISLNK(st.st_mode)),
                  "%c: what was planted at the lock changed", kinds[k]);
        }
        if (kinds[k] == 'L') CHECK(!exists(outside), "a symlinked lock created its target");
        if (kinds[k] == 'l') {
            char *text = slurp(outside);
            CHECK(!strcmp(text, "keep\n"), "a symlinked lock changed its target: \"%s\"", text);
            free(text);
        }
        CHECK(s3 == MJ_OK && mj_cache_writable(c), "%c: store -> %s, writable %d", kinds[k],
              mj_status_string(s3), mj_cache_writable(c));
        mj_cache_entry out;
        int found = 0;
        CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
        CHECK(found == 1, "%c: the entry stored without the lock is there", kinds[k]);
        mj_cache_entry_free(&out);
        free(err);
        mj_cache_close(c);
    }
}

static void test_lock_files(void) {
    char scratch[PATH_BUF];
    make_temp_dir(scratch, "locks");
    reap(spawn(lock_files_child, scratch, -1), "unusable lock files (hang = SIGALRM)");
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * Stores that fail: counted, warned once, nothing half-written
 * ------------------------------------------------------------------------------------- */

/* A file-size limit below the entry's size: the temp file's write fails with EFBIG
 * (SIGXFSZ ignored), as on a full disk. */
static void store_efbig_child(void *p) {
    const char *dir = p;
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 256;
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit: %s", strerror(errno));
    test_entry small, big;
    make_entry(&small, "fits-under-256-bytes", 4, 0);
    make_entry(&big, "does-not-fit-in-256-bytes", 400, 1);
    /* stderr into a pipe: a file would be cut by the limit too. */
    int pfd[2];
    CHECK(pipe(pfd) == 0, "pipe");
    fflush(stderr);
    int saved = dup(2);
    dup2(pfd[1], 2);
    close(pfd[1]);
    mj_status s1 = mj_cache_store(c, big.hex, &big.e);
    mj_status s2 = mj_cache_store(c, small.hex, &small.e);
    mj_status s3 = mj_cache_store(c, big.hex, &big.e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *err = calloc(1, 8192);
    ssize_t got = read(pfd[0], err, 8191);
    (void)got;
    close(pfd[0]);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(s1 == MJ_ERR_IO && s2 == MJ_OK && s3 == MJ_ERR_IO, "stores -> %s %s %s",
          mj_status_string(s1), mj_status_string(s2), mj_status_string(s3));
    CHECK(st.stores == 1 && st.store_failures == 2, "stores %lld, store_failures %lld",
          (long long)st.stores, (long long)st.store_failures);
    CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, "could not store") &&
              strstr(err, "File too large") && strstr(err, "kept in memory only"),
          "stderr was \"%s\"", err);
    CHECK(count_in(dir, "entries") == 1 && count_in(dir, "tmp") == 0,
          "%d entries, %d temp files", count_in(dir, "entries"), count_in(dir, "tmp"));
    CHECK(mj_cache_writable(c), "a failed store made the cache read-only");
    free(err);
    mj_cache_close(c);
}

static void test_store_failures(void) {
    char scratch[PATH_BUF], dir[PATH_BUF], path[PATH_BUF];
    make_temp_dir(scratch, "storefail");
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));

    /* A directory at the entry's name: the rename into place fails (EISDIR). */
    test_entry t, u;
    make_entry(&t, "entry-name-is-a-directory", 40, 0);
    make_entry(&u, "an-ordinary-entry", 40, 0);
    entry_path(path, dir, t.hex);
    CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
    capture cap;
    capture_begin(&cap, scratch);
    mj_status s1 = mj_cache_store(c, t.hex, &t.e);
    mj_status s2 = mj_cache_store(c, t.hex, &t.e);
    mj_status s3 = mj_cache_store(c, u.hex, &u.e);
    char *err = capture_end(&cap);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(s1 == MJ_ERR_IO && s2 == MJ_ERR_IO && s3 == MJ_OK, "stores -> %s %s %s",
          mj_status_string(s1), mj_status_string(s2), mj_status_string(s3));
    CHECK(st.store_failures == 2 && st.stores == 1, "store_failures %lld, stores %lld",
          (long long)st.store_failures, (long long)st.stores);
    CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, "could not store") &&
              strstr(err, dir) && strstr(err, "Is a directory"),
          "stderr was \"%s\"", err);
    CHECK(count_in(dir, "tmp") == 0, "a failed store left %d temp files", count_in(dir, "tmp"));
    free(err);
    mj_cache_close(c);
    rmdir(path);

    /* MOEJIT_QUIET=1 silences the warning, not the count. */
    CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
    setenv("MOEJIT_QUIET", "1", 1);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    capture_begin(&cap, scratch);
    s1 = mj_cache_store(c, t.hex, &t.e);
    err = capture_end(&cap);
    unsetenv("MOEJIT_QUIET");
    mj_cache_get_stats(c, &st);
    CHECK(s1 == MJ_ERR_IO && st.store_failures == 1 && !err[0], "quiet: %s, %lld, \"%s\"",
          mj_status_string(s1), (long long)st.store_failures, err);
    free(err);
    mj_cache_close(c);
    rmdir(path);

    char dir2[PATH_BUF];
    fmt_into(dir2, sizeof dir2, "%s/cache2", scratch);
    CHECK_OK(mj_cache_open(dir2, 0, &c));
    mj_cache_close(c);
    reap(spawn(store_efbig_child, dir2, -1), "stores over RLIMIT_FSIZE");
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * The cap: a bad $MOEJIT_CACHE_MAX_BYTES, and a cap smaller than one entry
 * ------------------------------------------------------------------------------------- */

static void test_cap(void) {
    char scratch[PATH_BUF], dir[PATH_BUF];
    make_temp_dir(scratch, "cap");
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    test_entry t, u;
    make_entry(&t, "cap-key-one", 300, 1);
    make_entry(&u, "cap-key-two", 300, 1);
    capture cap;
    mj_cache *c = NULL;

    /* Not a byte count: one warning naming the value and the default in force. */
    static const char *const bad_values[] = {"0", "-5", "abc", "1e9", "12abc", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_values / sizeof *bad_values; i++) {
        setenv("MOEJIT_CACHE_MAX_BYTES", bad_values[i], 1);
        capture_begin(&cap, scratch);
        CHECK_OK(mj_cache_open(dir, 0, &c));
        CHECK_OK(mj_cache_store(c, t.hex, &t.e));
        CHECK_OK(mj_cache_store(c, u.hex, &u.e));
        char *err = capture_end(&cap);
        char want[128];
        fmt_into(want, sizeof want, "MOEJIT_CACHE_MAX_BYTES=\"%s\" is not a byte count", bad_values[i]);
        CHECK(mj_cache_max_bytes(c) == MJ_CACHE_DEFAULT_MAX_BYTES, "%s: cap in force %lld",
              bad_values[i], (long long)mj_cache_max_bytes(c));
        CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, want) &&
                  strstr(err, "default cap of 1073741824 bytes"),
              "%s: stderr was \"%s\"", bad_values[i], err);
        CHECK(!strcmp(mj_cache_max_bytes_source(c), "default; $MOEJIT_CACHE_MAX_BYTES is not valid"),
              "%s: source \"%s\"", bad_values[i], mj_cache_max_bytes_source(c));
        free(err);
        mj_cache_close(c);
    }
    /* A good value is used without a word; an explicit argument wins over the variable. */
    setenv("MOEJIT_CACHE_MAX_BYTES", "123456789", 1);
    capture_begin(&cap, scratch);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    int64_t from_env = mj_cache_max_bytes(c);
    const char *src_env = mj_cache_max_bytes_source(c);
    mj_cache_close(c);
    setenv("MOEJIT_CACHE_MAX_BYTES", "1e9", 1);
    CHECK_OK(mj_cache_open(dir, 5000000, &c));
    int64_t from_arg = mj_cache_max_bytes(c);
    const char *src_arg = mj_cache_max_bytes_source(c);
    mj_cache_close(c);
    unsetenv("MOEJIT_CACHE_MAX_BYTES");
    CHECK_OK(mj_cache_open(dir, 0, &c));
    int64_t from_default = mj_cache_max_bytes(c);
    const char *src_default = mj_cache_max_bytes_source(c);
    mj_cache_close(c);
    char *err = capture_end(&cap);
    CHECK(from_env == 123456789 && !strcmp(src_env, "$MOEJIT_CACHE_MAX_BYTES") &&
              from_arg == 5000000 && !strcmp(src_arg, "set by the caller") &&
              from_default == MJ_CACHE_DEFAULT_MAX_BYTES && !strcmp(src_default, "default") && !err[0],
          "caps %lld (%s) %lld (%s) %lld (%s), stderr \"%s\"", (long long)from_env, src_env,
          (long long)from_arg, src_arg, (long long)from_default, src_default, err);
    free(err);

    /* A cap below one entry: the entry is kept only until the next store, so every run
     * recompiles. Said once per handle. */
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(mj_cache_encode(&t.e, &buf, &len));
    free(buf);
    capture_begin(&cap, scratch);
    CHECK_OK(mj_cache_open(dir, 100, &c));
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    CHECK_OK(mj_cache_store(c, u.hex, &u.e));
    mj_cache_close(c);
    CHECK_OK(mj_cache_open(dir, (int64_t)len * 3, &c)); /* room: no warning */
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    mj_cache_close(c);
    err = capture_end(&cap);
    char want[160];
    fmt_into(want, sizeof want, "entry of %zu bytes is larger than the cache cap of 100 bytes", len);
    CHECK(count_substr(err, "moejit: warning: ") == 1 && strstr(err, want) &&
              strstr(err, "MOEJIT_CACHE_MAX_BYTES"),
          "cap below one entry: stderr was \"%s\"", err);
    free(err);
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * Opening without creating, and read-only views (what `moejit inspect` uses)
 * ------------------------------------------------------------------------------------- */

static void test_open_flags(void) {
    char scratch[PATH_BUF], dir[PATH_BUF], missing[PATH_BUF], path[PATH_BUF], temp[PATH_BUF];
    make_temp_dir(scratch, "flags");
    fmt_into(missing, sizeof missing, "%s/missing/cache", scratch);
    capture cap;
    capture_begin(&cap, scratch);
    mj_cache *c = NULL;
    for (unsigned flags = MJ_CACHE_NO_CREATE; flags <= (MJ_CACHE_NO_CREATE | MJ_CACHE_READ_ONLY);
         flags += MJ_CACHE_READ_ONLY) {
        CHECK_OK(mj_cache_open_flags(missing, 0, flags, &c));
        char want[PATH_BUF + 32];
        fmt_into(want, sizeof want, "cache directory %s does not exist", missing);
        CHECK(c && !mj_cache_readable(c) && !mj_cache_writable(c) &&
                  strstr(mj_cache_problem(c), want),
              "flags %u on a missing directory: readable %d writable %d, problem \"%s\"", flags,
              mj_cache_readable(c), mj_cache_writable(c), mj_cache_problem(c));
        mj_cache_close(c);
    }
    fmt_into(path, sizeof path, "%s/missing", scratch);
    CHECK(!exists(path), "opening without creating created %s", path);

    /* A read-only view of a real cache changes nothing: no hit stamp, no quarantine, no
     * temp clean-up, no store. */
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    test_entry t, u, v;
    make_entry(&t, "read-only-view-good", 64, 1);
    make_entry(&u, "read-only-view-corrupt", 64, 0);
    make_entry(&v, "read-only-view-new", 64, 0);
    CHECK_OK(mj_cache_open(dir, 0, &c));
    CHECK_OK(mj_cache_store(c, t.hex, &t.e));
    mj_cache_close(c);
    plant(dir, u.hex, "garbage", 7);
    entry_path(path, dir, t.hex);
    set_mtime(path, -1000);
    int64_t stamp = mtime_of(path);
    sub_path(temp, dir, "tmp", "dead.writer.tmp");
    write_file(temp, "partial", 7);
    set_mtime(temp, -3 * 3600.0);
    CHECK_OK(mj_cache_open_flags(dir, 0, MJ_CACHE_READ_ONLY | MJ_CACHE_NO_CREATE, &c));
    CHECK(mj_cache_readable(c) && !mj_cache_writable(c) && mj_cache_dir_writable(c) &&
              !strcmp(mj_cache_problem(c), "opened read-only"),
          "read-only view: readable %d writable %d dir_writable %d problem \"%s\"",
          mj_cache_readable(c), mj_cache_writable(c), mj_cache_dir_writable(c), mj_cache_problem(c));
    mj_cache_entry out;
    int found = -1, fd = 0;
    CHECK_OK(mj_cache_lookup(c, t.hex, t.key, &out, &found));
    CHECK(found == 1 && mtime_of(path) == stamp, "read-only hit: found %d, stamp moved %d", found,
          mtime_of(path) != stamp);
    mj_cache_entry_free(&out);
    CHECK_OK(mj_cache_lookup(c, u.hex, u.key, &out, &found));
    CHECK_OK(mj_cache_store(c, v.hex, &v.e));
    CHECK_OK(mj_cache_lock(c, v.hex, &fd, NULL));
    mj_cache_add_totals(c, k_one_process);
    mj_cache_close(c);
    char *err = capture_end(&cap);
    CHECK(found == 0 && count_in(dir, "entries") == 2 && count_in(dir, "quarantine") == 0 &&
              exists(temp) && count_in(dir, "locks") == 0 && fd == -1,
          "read-only view changed the cache: %d entries, %d quarantined, temp %d, %d locks",
          count_in(dir, "entries"), count_in(dir, "quarantine"), exists(temp),
          count_in(dir, "locks"));
    sub_path(path, dir, "stats.json", NULL);
    CHECK(!exists(path), "a read-only view wrote stats.json");
    CHECK(!err[0], "opening without creating, or read-only, warned: \"%s\"", err);
    free(err);
    rm_rf(scratch);
}

/* ---------------------------------------------------------------------------------------
 * The default location
 * ------------------------------------------------------------------------------------- */

static char *save_env(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *v) {
    if (v) setenv(name, v, 1);
    else unsetenv(name);
    free(v);
}

static void expect_default(const char *want, const char *what) {
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(NULL, 0, &c));
    CHECK(c && !strcmp(mj_cache_dir(c), want) && mj_cache_writable(c), "%s: dir %s, want %s",
          what, c ? mj_cache_dir(c) : "-", want);
    char path[PATH_BUF];
    sub_path(path, want, "entries", NULL);
    CHECK(exists(path), "%s: %s not created", what, path);
    mj_cache_close(c);
}

static void test_default_dir(void) {
    char *env_dir = save_env("MOEJIT_CACHE_DIR"), *xdg = save_env("XDG_CACHE_HOME");
    char *home = save_env("HOME");
    char scratch[PATH_BUF], want[PATH_BUF];
    make_temp_dir(scratch, "default");

    fmt_into(want, sizeof want, "%s/env/a/b", scratch);
    setenv("MOEJIT_CACHE_DIR", want, 1);
    expect_default(want, "$MOEJIT_CACHE_DIR");
    /* mkdir -p: each directory we created is 0700. */
    char path[PATH_BUF];
    struct stat st;
    fmt_into(path, sizeof path, "%s/env", scratch);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0700, "created parent mode %o",
          (unsigned)st.st_mode);
    fmt_into(path, sizeof path, "%s/env/a/b/", scratch); /* a trailing slash is dropped */
    setenv("MOEJIT_CACHE_DIR", path, 1);
    expect_default(want, "trailing slash");

    setenv("MOEJIT_CACHE_DIR", "", 1); /* empty means unset */
    fmt_into(path, sizeof path, "%s/xdg", scratch);
    setenv("XDG_CACHE_HOME", path, 1);
    fmt_into(want, sizeof want, "%s/xdg/moejit", scratch);
    expect_default(want, "$XDG_CACHE_HOME");

    unsetenv("MOEJIT_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "relative/dir", 1); /* not absolute: ignored, per the XDG spec */
    fmt_into(path, sizeof path, "%s/home", scratch);
    mkdir(path, 0700);
    setenv("HOME", path, 1);
    fmt_into(want, sizeof want, "%s/home/.cache/moejit", scratch);
    expect_default(want, "$HOME");

    restore_env("MOEJIT_CACHE_DIR", env_dir);
    restore_env("XDG_CACHE_HOME", xdg);
    restore_env("HOME", home);
    rm_rf(scratch);
}

/* The 64 temp names the old scheme gave prefix (pid.tid.counter), each a planted file in tmp/. */
static void plant_temps(const char *dir, const char *prefix) {
    for (int n = 0; n < 64; n++) {
        char name[PATH_BUF], path[PATH_BUF];
        fmt_into(name, sizeof name, "%s.%ld.%ld.%d.tmp", prefix, (long)getpid(), (long)gettid(), n);
        sub_path(path, dir, "tmp", name);
        write_file(path, "planted", 7);
    }
}

/* Temp names nobody can predict: files planted at every name the store and the totals would
 * have used under a pid.tid.counter scheme (the first 64 counter values of this process) do
 * not make a store fail. The first case, so the counter is still below 64. */
static void test_planted_temps(void) {
    char scratch[PATH_BUF], dir[PATH_BUF], path[PATH_BUF];
    make_temp_dir(scratch, "planted");
    fmt_into(dir, sizeof dir, "%s/cache", scratch);
    mj_cache *c = NULL;
    CHECK_OK(mj_cache_open(dir, 0, &c));
    test_entry t[4];
    static const char *const keys[4] = {"planted-a", "planted-b", "planted-c", "planted-d"};
    for (int i = 0; i < 4; i++) {
        make_entry(&t[i], keys[i], 40 + (size_t)i, 0);
        plant_temps(dir, t[i].hex);
    }
    plant_temps(dir, "stats");
    for (int i = 0; i < 4; i++) CHECK_OK(mj_cache_store(c, t[i].hex, &t[i].e));
    mj_cache_add_totals(c, k_one_process);
    mj_cache_stats st;
    mj_cache_get_stats(c, &st);
    CHECK(st.stores == 4 && st.store_failures == 0, "planted temp names: %lld stores, %lld "
          "failures", (long long)st.stores, (long long)st.store_failures);
    expect_totals(c, 1, 1, "planted temp names");
    for (int i = 0; i < 4; i++) {
        entry_path(path, dir, t[i].hex);
        CHECK(exists(path), "entry %s not stored", keys[i]);
    }
    CHECK(count_in(dir, "tmp") == 5 * 64, "tmp/ holds %d files, want the %d planted ones",
          count_in(dir, "tmp"), 5 * 64);
    mj_cache_close(c);
    rm_rf(scratch);
}

/* umask 022 for the modes the cases check; no quiet switch or cap from the caller. */
static int setup(void) {
    umask(022);
    unsetenv("MOEJIT_QUIET");
    unsetenv("MOEJIT_CACHE_MAX_BYTES");
    return 0;
}

static const test_case cases[] = {
    TEST_CASE("planted_temps", test_planted_temps),
    TEST_CASE("hash", test_hash),
    TEST_CASE("round_trip", test_round_trip),
    TEST_CASE("decode_errors", test_decode_errors),
    TEST_CASE("store_lookup", test_store_lookup),
    TEST_CASE("truncation", test_truncation),
    TEST_CASE("flipped_bytes", test_flipped_bytes),
    TEST_CASE("wrong_magic_version_key", test_wrong_magic_version_key),
    TEST_CASE("unsafe", test_unsafe),
    TEST_CASE("read_only", test_read_only),
    TEST_CASE("eviction", test_eviction),
    TEST_CASE("killed_writer", test_killed_writer),
    TEST_CASE("temp_cleanup", test_temp_cleanup),
    TEST_CASE("processes", test_processes),
    TEST_CASE("threads", test_threads),
    TEST_CASE("special_entries", test_special_entries),
    TEST_CASE("stats_file", test_stats_file),
    TEST_CASE("lock_files", test_lock_files),
    TEST_CASE("store_failures", test_store_failures),
    TEST_CASE("cap", test_cap),
    TEST_CASE("open_flags", test_open_flags),
    TEST_CASE("default_dir", test_default_dir),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, NULL); }
