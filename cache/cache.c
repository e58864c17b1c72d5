/* cache.c — the on-disk kernel cache: directories, lookups, stores, locks, eviction.
 *
 * The entry format lives in entry.c; this file is about files and processes. Five rules
 * shape it:
 *
 *   1. A reader never sees half an entry. A store writes a temp file with a unique name in
 *      tmp/, fsyncs it and rename()s it into entries/ (rename is atomic within a file
 *      system), then fsyncs entries/ so the rename itself survives a crash. Entries are
 *      never modified in place, so an open entry file always reads as one whole version.
 *      A writer holds an flock on its temp file until it has renamed it; one killed
 *      mid-write leaves only a temp file, unlocked now (the kernel drops a dead process's
 *      locks), which the next open, store or gc deletes once it is a minute old. A temp
 *      file somebody holds locked is a live writer's and is never touched.
 *
 *   2. Nothing on disk is trusted. Every entry checks itself (magic, version, lengths,
 *      SHA-256) and must name the key we asked for; one that does not is a miss and is
 *      renamed into quarantine/ — kept for a post-mortem, out of the way of the next store.
 *      The worst a damaged or racing file can cause is a recompile, never a wrong kernel.
 *
 *   3. The directory must be ours. A cache that other users can write is a way to make us
 *      load their code, so the root, v<N>/ and its subdirectories must be owned by our
 *      effective uid, not group- or world-writable, and not symbolic links. They are opened
 *      once, checked with fstat on the open descriptor, and every later operation goes
 *      through those descriptors (openat, renameat, ...), so nobody can swap a checked
 *      directory for another one afterwards. An unsafe cache is never read nor written.
 *
 *   4. A bad directory never fails a program. Unsafe, read-only or uncreatable, the cache
 *      warns once on stderr (never stdout: we are a library; MOEJIT_QUIET=1 silences it),
 *      then lookups miss and stores do nothing: kernels are compiled and kept in memory.
 *
 *   5. N processes compile a key once. mj_cache_lock takes an flock on locks/<hex>.lock;
 *      the caller re-looks-up under the lock before compiling (someone may have stored it
 *      while we waited). flock is released by the kernel when the holder dies, so a crashed
 *      compiler never wedges the others. Lock files are never deleted: unlinking one that
 *      another process is about to lock would let two holders in.
 *
 * Eviction is least-recently-used by mtime, which a disk hit sets to "now" (atime is often
 * disabled by noatime/relatime). Sizes are the files' st_size. Concurrent evictions may
 * remove a little more than needed; that only costs a recompile.
 *
 * The handle may be used from several threads: after open, the directory descriptors and
 * paths are read-only, the counters are atomics, and "writable" (which drops to 0 if a
 * store finds the directory read-only after all) is atomic too.
 */
#include "cache.h"
#include "file.h"

#include <dirent.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S 1000000000ll
#define TEMP_GRACE_NS (60 * NS_PER_S) /* an unlocked temp file younger than this is spared */
#define ENTRY_SUFFIX ".mjc"
#define ENTRY_NAME_MAX (MJ_KEY_HEX_LEN + 8)

/* The subdirectories of v<N>/, in the order they are opened. */
enum { SUB_ENTRIES, SUB_LOCKS, SUB_QUARANTINE, SUB_TMP, SUB_COUNT };
static const char *const k_sub_name[SUB_COUNT] = {"entries", "locks", "quarantine", "tmp"};

struct mj_cache {
    char *root;               /* D; "" when no location could be found                 */
    char *problem;            /* why it cannot be read or written (at open), or NULL    */
    int v_fd;                 /* checked descriptor of D/v<N> (stats.json), -1 if absent */
    int sub_fd[SUB_COUNT];    /* checked descriptors of D/v<N>/<sub>, -1 when absent     */
    int64_t max_bytes;
    unsigned flags;           /* MJ_CACHE_NO_CREATE, MJ_CACHE_READ_ONLY                  */
    int dir_writable;         /* the directory could be written (even in a read-only view) */
    enum { CAP_CALLER, CAP_ENV, CAP_DEFAULT, CAP_DEFAULT_ENV_BAD } cap_from;
    int unsafe;               /* some directory failed the ownership/mode check          */
    int readable;
    atomic_int writable;
    atomic_int warned_unsafe, warned_unwritable, warned_lock;
    _Atomic int64_t disk_hits, disk_misses, stores, quarantined, evicted, lock_waits;
    _Atomic int64_t refused_unsafe, store_failures;
    atomic_int warned_store, warned_cap, warned_cap_small;
};

/* Makes temp names unique among the threads of one process (pid and tid do the rest). */
static atomic_ullong g_temp_counter;

/* ---------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * NS_PER_S + st->st_mtim.tv_nsec;
}

static void count(_Atomic int64_t *counter) {
    atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

static int is_writable(const mj_cache *c) {
    return atomic_load_explicit(&((mj_cache *)c)->writable, memory_order_relaxed);
}

/* Key hex must be exactly 64 lowercase hex digits: it becomes a file name, so anything else
 * (a '/', "..", an empty string left by a failed mj_key_hash) is refused. */
static int is_key_hex(const char *s) {
    for (int i = 0; i < MJ_KEY_HEX_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[MJ_KEY_HEX_LEN] == '\0';
}

static mj_status check_hex(const char *fn, const char *key_hex) {
    if (!key_hex) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: key_hex is NULL", fn);
    if (!is_key_hex(key_hex))
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: key \"%.80s\" is not 64 lowercase hex "
                            "digits", fn, key_hex);
    return MJ_OK;
}

/* "<hex>.mjc" -> 1 and the hex copied out; anything else in entries/ is not ours. */
static int entry_name_hex(const char *name, char hex[MJ_KEY_HEX_LEN + 1]) {
    if (strlen(name) != MJ_KEY_HEX_LEN + strlen(ENTRY_SUFFIX)) return 0;
    if (strcmp(name + MJ_KEY_HEX_LEN, ENTRY_SUFFIX) != 0) return 0;
    memcpy(hex, name, MJ_KEY_HEX_LEN);
    hex[MJ_KEY_HEX_LEN] = '\0';
    return is_key_hex(hex);
}

static int quiet(void) {
    const char *q = getenv("MOEJIT_QUIET");
    return q && *q && strcmp(q, "0") != 0;
}

/* One warning line on stderr, at most once per handle for each kind (flag). */
static void warn_once(atomic_int *flag, const char *fmt, ...) MJ_PRINTF(2, 3);
static void warn_once(atomic_int *flag, const char *fmt, ...) {
    if (atomic_exchange(flag, 1) || quiet()) return;
    char line[2 * PATH_MAX + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moejit: warning: %s\n", line); /* one call: lines do not interleave */
}

static void warn_unwritable(mj_cache *c, const char *why) {
    if (!c->root[0])
        warn_once(&c->warned_unwritable, "no cache directory (%s); kernels will be compiled "
                  "and kept in memory only", why);
    else
        warn_once(&c->warned_unwritable, "cache directory %s is not writable (%s); kernels "
                  "will be compiled and kept in memory only", c->root, why);
}

/* A store or lock found the directory read-only after all (remounted, chmod'ed): stop
 * writing from now on. */
static void became_unwritable(mj_cache *c, const char *what, int err) {
    char why[512];
    snprintf(why, sizeof why, "%s: %s", what, strerror(err));
    atomic_store(&c->writable, 0);
    warn_unwritable(c, why);
}

static int is_permission_error(int err) { return err == EACCES || err == EPERM || err == EROFS; }

static int write_all(int fd, const uint8_t *p, size_t len) {
    while (len) {
        size_t chunk = len < (1u << 30) ? len : (1u << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Finding and checking the directory
 * ------------------------------------------------------------------------------------- */

/* D, malloc'd, without trailing slashes: dir, $MOEJIT_CACHE_DIR, $XDG_CACHE_HOME/moejit
 * (only an absolute one, as the XDG spec says), $HOME/.cache/moejit, or the passwd home.
 * "" when there is none at all. */
static mj_status resolve_root(const char *dir, char **out) {
    const char *env;
    char *s = NULL;
    if (dir) {
        s = strdup(dir);
    } else if ((env = getenv("MOEJIT_CACHE_DIR")) && *env) {
        s = strdup(env);
    } else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') {
        if (asprintf(&s, "%s/moejit", env) < 0) s = NULL;
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) {
            struct passwd *pw = getpwuid(geteuid());
            home = pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
        }
        if (!home) s = strdup("");
        else if (asprintf(&s, "%s/.cache/moejit", home) < 0) s = NULL;
    }
    if (!s) return mj_set_error(MJ_ERR_NOMEM, "mj_cache_open: out of memory");
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/') s[--n] = '\0';
    *out = s;
    return MJ_OK;
}

/* mkdir -p with mode 0700 for the directories it creates (existing ones are left as they
 * are). 0, or the errno of the first mkdir that failed, with `why` saying which. */
static int mkdir_p(const char *path, char *why, size_t why_len) {
    char *p = strdup(path);
    if (!p) return ENOMEM;
    int err = 0;
    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q != '\0') continue;
        char saved = *q;
        *q = '\0';
        if (q[-1] != '/' && mkdir(p, 0700) != 0 && errno != EEXIST) {
            err = errno;
            snprintf(why, why_len, "cannot create %s: %s", p, strerror(err));
            break;
        }
        *q = saved;
        if (saved == '\0') break;
    }
    free(p);
    return err;
}

typedef enum { DIR_OK, DIR_MISSING, DIR_UNUSABLE, DIR_UNSAFE } dir_state;

/* Open parent/name as a directory and check it is ours. On DIR_OK *fd is the descriptor;
 * otherwise msg holds either the unsafe warning's text or the reason it cannot be used. */
static dir_state open_checked_dir(int parent, const char *name, const char *path, int *fd,
                                  char *msg, size_t msg_len) {
    struct stat st;
    *fd = -1;
    int d = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0) {
        int err = errno;
        if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            err = errno;
            snprintf(msg, msg_len, "%s: %s", path, strerror(err));
            return err == ENOENT ? DIR_MISSING : DIR_UNUSABLE;
        }
        if (S_ISLNK(st.st_mode)) {
            snprintf(msg, msg_len, "cache directory %s is a symbolic link; not using it", path);
            return DIR_UNSAFE;
        }
        if (!S_ISDIR(st.st_mode)) {
            snprintf(msg, msg_len, "%s is not a directory", path);
            return DIR_UNUSABLE;
        }
        snprintf(msg, msg_len, "%s: %s", path, strerror(err));
        return DIR_UNUSABLE;
    }
    if (fstat(d, &st) != 0) {
        snprintf(msg, msg_len, "%s: %s", path, strerror(errno));
        close(d);
        return DIR_UNUSABLE;
    }
    if (st.st_uid != geteuid()) {
        snprintf(msg, msg_len, "cache directory %s is owned by uid %u, not by you (uid %u); "
                 "not using it", path, (unsigned)st.st_uid, (unsigned)geteuid());
        close(d);
        return DIR_UNSAFE;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(msg, msg_len, "cache directory %s is writable by other users (mode %04o); "
                 "not using it \u2014 run chmod 700 %s", path, (unsigned)(st.st_mode & 07777), path);
        close(d);
        return DIR_UNSAFE;
    }
    *fd = d;
    return DIR_OK;
}

/* Create (as far as we may) and check D, D/v<N> and its subdirectories, and decide what the
 * cache can do: c->unsafe, c->readable, c->writable. Never fails. */
static void setup_dirs(mj_cache *c) {
    char why[2 * PATH_MAX + 256] = ""; /* the first reason we cannot write, if any */
    char msg[2 * PATH_MAX + 256];
    char vname[32], path[PATH_MAX];
    char missing[PATH_MAX + 96] = ""; /* MJ_CACHE_NO_CREATE: D or v<N> is not there       */
    int root_fd = -1, v_fd = -1;
    int writable = 1;
    const int create = !(c->flags & MJ_CACHE_NO_CREATE);

    if (!c->root[0]) {
        snprintf(why, sizeof why, "HOME is not set and uid %u has no home directory",
                 (unsigned)geteuid());
        goto done;
    }
    if (create) mkdir_p(c->root, why, sizeof why);

    /* Level 0: D, level 1: v<N>, levels 2..: the subdirectories. */
    snprintf(vname, sizeof vname, "v%d", MJ_CACHE_FORMAT);
    for (int level = 0; level < 2 + SUB_COUNT; level++) {
        int parent = level == 0 ? AT_FDCWD : level == 1 ? root_fd : v_fd;
        const char *name = level == 0 ? c->root : level == 1 ? vname : k_sub_name[level - 2];
        if (level == 0) snprintf(path, sizeof path, "%s", c->root);
        else if (level == 1) snprintf(path, sizeof path, "%s/%s", c->root, vname);
        else snprintf(path, sizeof path, "%s/%s/%s", c->root, vname, name);

        if (create && level > 0 && mkdirat(parent, name, 0700) != 0 && errno != EEXIST && !why[0])
            snprintf(why, sizeof why, "cannot create %s: %s", path, strerror(errno));

        int fd;
        dir_state st = open_checked_dir(parent, name, path, &fd, msg, sizeof msg);
        if (st == DIR_UNSAFE) {
            c->unsafe = 1;
            c->problem = strdup(msg);
            warn_once(&c->warned_unsafe, "%s", msg);
            goto done;
        }
        if (st != DIR_OK) {
            writable = 0;
            if (st == DIR_MISSING && !create && level < 2)
                snprintf(missing, sizeof missing, level == 0 ? "cache directory %s does not exist"
                         : "cache directory %s holds no cache (no %s/ in it)", c->root, vname);
            if (!why[0]) snprintf(why, sizeof why, "%s", msg);
            if (level < 2) break; /* nothing below a missing D or v<N> */
            continue;
        }
        if (faccessat(fd, ".", W_OK | X_OK, AT_EACCESS) != 0) {
            writable = 0;
            if (!why[0]) snprintf(why, sizeof why, "%s: %s", path, strerror(errno));
        }
        if (level == 0) root_fd = fd;
        else if (level == 1) v_fd = fd;
        else c->sub_fd[level - 2] = fd;
    }

done:
    if (root_fd >= 0) close(root_fd);
    c->v_fd = v_fd;
    if (c->unsafe) {
        for (int i = 0; i < SUB_COUNT; i++) {
            if (c->sub_fd[i] >= 0) close(c->sub_fd[i]);
            c->sub_fd[i] = -1;
        }
        if (c->v_fd >= 0) close(c->v_fd);
        c->v_fd = -1;
        return;
    }
    c->readable = c->sub_fd[SUB_ENTRIES] >= 0;
    for (int i = 0; i < SUB_COUNT; i++) writable &= c->sub_fd[i] >= 0;
    if (why[0]) writable = 0;
    c->dir_writable = writable;
    if (c->flags & MJ_CACHE_READ_ONLY) writable = 0;
    atomic_store(&c->writable, writable);
    if (!writable) {
        const char *reason = why[0] ? why : "unknown reason";
        if (missing[0]) c->problem = strdup(missing);
        else if (!c->root[0]) c->problem = strdup(reason);
        else if (c->dir_writable) c->problem = strdup("opened read-only");
        else if (asprintf(&c->problem, "cache directory %s is not writable (%s)", c->root, reason) < 0)
            c->problem = NULL;
        /* A caller that asked not to create or not to write knows; it reports the problem. */
        if (!c->flags) warn_unwritable(c, reason);
    }
}

/* A fresh DIR* over one of our checked directories (its own file offset, so two threads
 * may scan at once); NULL on failure. */
static DIR *open_sub(const mj_cache *c, int sub) {
    int fd = openat(c->sub_fd[sub], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return NULL;
    DIR *d = fdopendir(fd);
    if (!d) close(fd);
    return d;
}

/* Create a temp file in tmp/ (dirfd) under a name nobody can predict: the prefix, our pid and
 * 64 random bits. O_EXCL|O_NOFOLLOW: a name that exists, whatever it is, is never opened; a
 * clash (someone planted that name, or chance) just draws another name. Returns the fd, or
 * -1 with errno set; name receives the name. */
static int open_unique_temp(int dirfd, const char *prefix, char *name, size_t cap) {
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned long long r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            r = ((unsigned long long)now_ns() * 0x9E3779B97F4A7C15ull) ^
                atomic_fetch_add(&g_temp_counter, 1);
        snprintf(name, cap, "%s.%ld.%016llx.tmp", prefix, (long)getpid(), r);
        int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Delete what writers killed mid-write left in tmp/. Those files count against no cap (the
 * eviction sums entries/ only), so they must not linger; but a live writer's temp file must
 * never go, or its rename fails. Rather than guess from the age (the old rule: an hour) or
 * count the temp files in the size the eviction sees (which would evict good entries to make
 * room for garbage that stays), we ask the kernel: every writer holds an flock on its temp
 * file from just after creating it until it has renamed it or given up, and the kernel drops
 * that lock when the writer dies. A temp file we can lock is therefore a dead writer's. The
 * minute of grace spares the instant between a writer's create and its flock, and writers
 * of older moejit versions (no flock; their temp files live for the milliseconds of one
 * write). It runs at open, before each store's eviction, and in gc. */
static void remove_stale_temps(mj_cache *c) {
    const int tmp = c->sub_fd[SUB_TMP];
    DIR *d = open_sub(c, SUB_TMP);
    if (!d) return;
    int64_t cutoff = now_ns() - TEMP_GRACE_NS;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st, fst, now;
        if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, ".."))) continue;
        if (fstatat(tmp, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) || mtime_ns(&st) >= cutoff) continue;
        int fd = openat(tmp, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        /* Locked by us, it is no writer's: unlink the name if it still names this file. */
        if (fstat(fd, &fst) == 0 && fst.st_dev == st.st_dev && fst.st_ino == st.st_ino &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(tmp, de->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            now.st_dev == fst.st_dev && now.st_ino == fst.st_ino)
            unlinkat(tmp, de->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* ---------------------------------------------------------------------------------------
 * Open / close
 * ------------------------------------------------------------------------------------- */

/* The cap: max_bytes when > 0, else $MOEJIT_CACHE_MAX_BYTES when it is a whole number of
 * bytes above 0, else the default. A value that is not ("0", "-5", "1e9", "2G") is said
 * once, with the default that is used instead. */
static void set_max_bytes(mj_cache *c, int64_t max_bytes) {
    if (max_bytes > 0) {
        c->max_bytes = max_bytes;
        c->cap_from = CAP_CALLER;
        return;
    }
    c->max_bytes = MJ_CACHE_DEFAULT_MAX_BYTES;
    c->cap_from = CAP_DEFAULT;
    const char *s = getenv("MOEJIT_CACHE_MAX_BYTES");
    if (!s || !*s) return;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!errno && end != s && !*end && v > 0 && s[0] >= '0' && s[0] <= '9') {
        c->max_bytes = v;
        c->cap_from = CAP_ENV;
        return;
    }
    c->cap_from = CAP_DEFAULT_ENV_BAD;
    warn_once(&c->warned_cap, "MOEJIT_CACHE_MAX_BYTES=\"%.64s\" is not a byte count (a whole "
              "number above 0); using the default cap of %lld bytes \u2014 set it to a number of "
              "bytes, such as 4294967296, or unset it", s, (long long)MJ_CACHE_DEFAULT_MAX_BYTES);
}

mj_status mj_cache_open(const char *dir, int64_t max_bytes, mj_cache **out) {
    return mj_cache_open_flags(dir, max_bytes, 0, out);
}

mj_status mj_cache_open_flags(const char *dir, int64_t max_bytes, unsigned flags, mj_cache **out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_open: out is NULL");
    *out = NULL;
    if (dir && !*dir) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_open: empty directory");

    mj_status ret = MJ_OK;
    mj_cache *c = calloc(1, sizeof *c);
    if (!c) return mj_set_error(MJ_ERR_NOMEM, "mj_cache_open: out of memory");
    if (flags & ~(MJ_CACHE_NO_CREATE | MJ_CACHE_READ_ONLY)) {
        free(c);
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_open_flags: unknown flags %#x", flags);
    }
    c->flags = flags;
    for (int i = 0; i < SUB_COUNT; i++) c->sub_fd[i] = -1;
    c->v_fd = -1;
    MJ_CHECK_GOTO(resolve_root(dir, &c->root), ret, exit);
    set_max_bytes(c, max_bytes);

    setup_dirs(c);
    if (is_writable(c)) remove_stale_temps(c);
    *out = c;
    c = NULL;

exit:
    mj_cache_close(c);
    return ret;
}

void mj_cache_close(mj_cache *c) {
    if (!c) return;
    for (int i = 0; i < SUB_COUNT; i++)
        if (c->sub_fd[i] >= 0) close(c->sub_fd[i]);
    if (c->v_fd >= 0) close(c->v_fd);
    free(c->root);
    free(c->problem);
    free(c);
}

const char *mj_cache_dir(const mj_cache *c) { return c ? c->root : NULL; }
int mj_cache_readable(const mj_cache *c) { return c && !c->unsafe && c->readable; }
int mj_cache_writable(const mj_cache *c) { return c && !c->unsafe && is_writable(c); }
int mj_cache_dir_writable(const mj_cache *c) { return c && !c->unsafe && c->dir_writable; }
int64_t mj_cache_max_bytes(const mj_cache *c) { return c ? c->max_bytes : 0; }
const char *mj_cache_max_bytes_source(const mj_cache *c) {
    static const char *const names[] = {"set by the caller", "$MOEJIT_CACHE_MAX_BYTES", "default",
                                        "default; $MOEJIT_CACHE_MAX_BYTES is not valid"};
    return c ? names[c->cap_from] : "";
}
const char *mj_cache_problem(const mj_cache *c) {
    if (!c) return "no cache";
    if (c->problem) return c->problem;
    return c->unsafe || !is_writable(c) ? "cache directory is not writable" : "";
}

void mj_cache_get_stats(const mj_cache *c, mj_cache_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    out->disk_hits = atomic_load(&c->disk_hits);
    out->disk_misses = atomic_load(&c->disk_misses);
    out->stores = atomic_load(&c->stores);
    out->quarantined = atomic_load(&c->quarantined);
    out->evicted = atomic_load(&c->evicted);
    out->lock_waits = atomic_load(&c->lock_waits);
    out->refused_unsafe = atomic_load(&c->refused_unsafe);
    out->store_failures = atomic_load(&c->store_failures);
}

/* ---------------------------------------------------------------------------------------
 * Quarantine
 * ------------------------------------------------------------------------------------- */

/* Move entries/<name> to quarantine/<hex>.<unix ns>.bad — but only if it is still the file
 * we read (`seen`): a writer may have renamed a good entry over it since, and that one must
 * stay. (A rename in the instant between the check and ours can still move a good entry
 * aside; the cost is one recompile.) On a cache we may not write, the file just stays. */
static void quarantine(mj_cache *c, const char *name, const struct stat *seen) {
    if (!is_writable(c)) return;
    struct stat now;
    if (fstatat(c->sub_fd[SUB_ENTRIES], name, &now, AT_SYMLINK_NOFOLLOW) != 0) return;
    if (now.st_dev != seen->st_dev || now.st_ino != seen->st_ino) return;
    int64_t ns = now_ns();
    for (int tries = 0; tries < 1000; tries++, ns++) {
        char qname[ENTRY_NAME_MAX + 32];
        struct stat taken;
        snprintf(qname, sizeof qname, "%.*s.%lld.bad", MJ_KEY_HEX_LEN, name, (long long)ns);
        if (fstatat(c->sub_fd[SUB_QUARANTINE], qname, &taken, AT_SYMLINK_NOFOLLOW) == 0)
            continue; /* same nanosecond as an earlier one: keep both */
        if (renameat(c->sub_fd[SUB_ENTRIES], name, c->sub_fd[SUB_QUARANTINE], qname) == 0)
            count(&c->quarantined);
        return;
    }
}

/* Read and verify entries/<name>: MJ_OK with *e filled and *ok = 1, or *ok = 0 (missing,
 * or bad — then quarantined). key_text: the key the entry must carry, or NULL to check the
 * stored key against the file name instead (verify). Errors only for out of memory. */
static mj_status load_entry(mj_cache *c, const char *name, const char *key_text,
                            mj_cache_entry *e, int *ok, int *existed) {
    mj_status ret = MJ_OK;
    char *buf = NULL;
    size_t len = 0;
    struct stat st;
    *ok = 0;
    *existed = 0;
    memset(e, 0, sizeof *e);

    /* Only a regular file is ever opened, never through a symbolic link (base/file.c): what
     * is not one (a link, a FIFO, a device, a socket) is quarantined unopened. */
    int err;
    int fd = mj_file_open(c->sub_fd[SUB_ENTRIES], name, 0, &st, &err);
    if (fd < 0) {
        if (err == ENOENT) goto exit; /* a plain miss (or removed since it was listed) */
        *existed = 1;
        if (err == ELOOP || err == MJ_FILE_NOT_REGULAR) quarantine(c, name, &st);
        goto exit; /* anything else we cannot open (EACCES): never used, left alone */
    }
    *existed = 1;
    ret = mj_file_read_fd(fd, &st, name, SIZE_MAX, &buf, &len);
    if (ret == MJ_ERR_IO) { /* a bad sector, say, or cut short: the file is as good as corrupt */
        ret = MJ_OK;
        quarantine(c, name, &st);
        goto exit;
    }
    if (ret != MJ_OK) goto exit;

    ret = mj_cache_decode((const uint8_t *)buf, len, e);
    if (ret == MJ_ERR_PARSE) {
        ret = MJ_OK;
        quarantine(c, name, &st);
        goto exit;
    }
    if (ret != MJ_OK) goto exit;

    int key_ok;
    if (key_text) {
        key_ok = strcmp(e->key_text, key_text) == 0;
    } else {
        char hex[MJ_KEY_HEX_LEN + 1];
        mj_key_hash(e->key_text, hex);
        key_ok = strncmp(hex, name, MJ_KEY_HEX_LEN) == 0;
    }
    if (!key_ok) { /* a hash collision, or a file copied under the wrong name */
        mj_cache_entry_free(e);
        quarantine(c, name, &st);
        goto exit;
    }
    if (key_text && is_writable(c)) {
        /* The LRU stamp: mtime = now, atime untouched. Best effort (read-only media). */
        const struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_NOW}};
        (void)futimens(fd, times);
    }
    *ok = 1;

exit:
    if (fd >= 0) close(fd);
    free(buf);
    if (!*ok) mj_cache_entry_free(e);
    return ret;
}

/* ---------------------------------------------------------------------------------------
 * Lookup and store
 * ------------------------------------------------------------------------------------- */

mj_status mj_cache_lookup(mj_cache *c, const char *key_hex, const char *key_text,
                          mj_cache_entry *out, int *found) {
    if (found) *found = 0;
    if (out) memset(out, 0, sizeof *out);
    if (!c || !key_text || !out || !found)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_lookup: NULL argument");
    MJ_CHECK(check_hex("mj_cache_lookup", key_hex));

    if (c->unsafe) {
        count(&c->refused_unsafe);
        count(&c->disk_misses);
        return MJ_OK;
    }
    if (!c->readable) {
        count(&c->disk_misses);
        return MJ_OK;
    }
    char name[ENTRY_NAME_MAX];
    snprintf(name, sizeof name, "%s" ENTRY_SUFFIX, key_hex);
    int existed;
    MJ_CHECK(load_entry(c, name, key_text, out, found, &existed));
    count(*found ? &c->disk_hits : &c->disk_misses);
    return MJ_OK;
}

typedef struct item_list {
    mj_cache_item *v;
    int n, cap;
} item_list;

/* Every entry file in entries/ (regular files named <hex>.mjc), oldest stamp first, ties by
 * name — the order eviction goes in. */
static int by_last_used(const void *pa, const void *pb) {
    const mj_cache_item *a = pa, *b = pb;
    if (a->last_used_ns != b->last_used_ns) return a->last_used_ns < b->last_used_ns ? -1 : 1;
    return strcmp(a->key_hex, b->key_hex);
}

/* with_special: also list names <hex>.mjc that are not regular files (a FIFO, a socket, a
 * directory: damage that verify must find and list must show), with bytes 0. Eviction
 * counts regular files only. */
static mj_status scan_entries(mj_cache *c, int with_special, item_list *out) {
    memset(out, 0, sizeof *out);
    DIR *d = open_sub(c, SUB_ENTRIES);
    if (!d) return mj_set_error(MJ_ERR_IO, "%s: cannot list entries: %s", c->root, strerror(errno));
    mj_status ret = MJ_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        mj_cache_item it;
        struct stat st;
        if (!entry_name_hex(de->d_name, it.key_hex)) continue;
        if (fstatat(c->sub_fd[SUB_ENTRIES], de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) && !with_special) continue;
        it.bytes = S_ISREG(st.st_mode) ? (int64_t)st.st_size : 0;
        it.last_used_ns = mtime_ns(&st);
        if (out->n == out->cap) {
            int cap = out->cap ? 2 * out->cap : 64;
            mj_cache_item *v = realloc(out->v, (size_t)cap * sizeof *v);
            if (!v) {
                ret = mj_set_error(MJ_ERR_NOMEM, "mj_cache: listing entries: out of memory");
                goto exit;
            }
            out->v = v;
            out->cap = cap;
        }
        out->v[out->n++] = it;
    }
    if (out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, by_last_used);

exit:
    closedir(d);
    if (ret != MJ_OK) {
        free(out->v);
        memset(out, 0, sizeof *out);
    }
    return ret;
}

/* Unlink least-recently-used entries while the total exceeds cap. `keep` (a key hex, or
 * NULL) is never evicted: the entry just stored stays even when it alone is over the cap. */
static mj_status evict(mj_cache *c, int64_t cap, const char *keep, int *n_evicted) {
    item_list items;
    MJ_CHECK(scan_entries(c, 0, &items));
    int64_t total = 0;
    for (int i = 0; i < items.n; i++) total += items.v[i].bytes;
    for (int i = 0; i < items.n && total > cap; i++) {
        if (keep && strcmp(items.v[i].key_hex, keep) == 0) continue;
        char name[ENTRY_NAME_MAX];
        snprintf(name, sizeof name, "%s" ENTRY_SUFFIX, items.v[i].key_hex);
        if (unlinkat(c->sub_fd[SUB_ENTRIES], name, 0) == 0) {
            count(&c->evicted);
            if (n_evicted) (*n_evicted)++;
            total -= items.v[i].bytes;
        } else if (errno == ENOENT) {
            total -= items.v[i].bytes; /* another process evicted it first */
        }
    }
    free(items.v);
    return MJ_OK;
}

mj_status mj_cache_store(mj_cache *c, const char *key_hex, const mj_cache_entry *e) {
    if (!c || !e) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_store: NULL argument");
    MJ_CHECK(check_hex("mj_cache_store", key_hex));
    if (!e->key_text)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_store: the entry has no key_text");
    /* The file name must be the hash of the key inside, or every lookup would reject it. */
    char hex[MJ_KEY_HEX_LEN + 1];
    mj_key_hash(e->key_text, hex);
    if (strcmp(hex, key_hex) != 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_store: key %s is not the SHA-256 of "
                            "the entry's key text (%s)", key_hex, hex);
    if (c->unsafe || !is_writable(c)) { /* warned about at open: only counted here */
        count(&c->store_failures);
        return MJ_OK;
    }

    mj_status ret = MJ_OK;
    uint8_t *buf = NULL;
    size_t len = 0;
    int fd = -1, temp_exists = 0, stored = 0;
    char temp[ENTRY_NAME_MAX + 96], name[ENTRY_NAME_MAX];
    const int tmp_dir = c->sub_fd[SUB_TMP], entries_dir = c->sub_fd[SUB_ENTRIES];

    MJ_CHECK_GOTO(mj_cache_encode(e, &buf, &len), ret, exit);
    snprintf(name, sizeof name, "%s" ENTRY_SUFFIX, key_hex);
    fd = open_unique_temp(tmp_dir, key_hex, temp, sizeof temp);
    if (fd < 0) {
        int err = errno;
        if (is_permission_error(err)) became_unwritable(c, "creating a temp file", err);
        else ret = mj_set_error(MJ_ERR_IO, "cache store: creating %s/v%d/tmp/%s: %s", c->root,
                                MJ_CACHE_FORMAT, temp, strerror(err));
        goto exit;
    }
    temp_exists = 1;
    /* Our flock marks the temp file as a live writer's (see remove_stale_temps); it is held
     * until after the rename, so fd stays open until then. Without flock (some network file
     * systems) the store still works; only the clean-up may then take the file for dead. */
    (void)flock(fd, LOCK_EX | LOCK_NB);
    if (write_all(fd, buf, len) != 0 || fsync(fd) != 0) {
        ret = mj_set_error(MJ_ERR_IO, "cache store: writing %s (%zu bytes): %s", temp, len,
                           strerror(errno));
        goto exit;
    }
    if (renameat(tmp_dir, temp, entries_dir, name) != 0) {
        ret = mj_set_error(MJ_ERR_IO, "cache store: renaming %s into entries/: %s", temp,
                           strerror(errno));
        goto exit;
    }
    temp_exists = 0;
    stored = 1;
    close(fd); /* after fsync, close has nothing left to report */
    fd = -1;
    /* Make the rename durable. Should this fail, a crash may lose the entry — which a
     * lookup then simply misses — so it does not fail the store. */
    (void)fsync(entries_dir);
    count(&c->stores);
    if ((int64_t)len > c->max_bytes)
        warn_once(&c->warned_cap_small, "a kernel cache entry of %zu bytes is larger than the "
                  "cache cap of %lld bytes (%s): each entry is kept only until the next store "
                  "evicts it, so kernels are compiled again on every run \u2014 raise "
                  "MOEJIT_CACHE_MAX_BYTES", len, (long long)c->max_bytes,
                  mj_cache_max_bytes_source(c));
    remove_stale_temps(c);
    MJ_CHECK_GOTO(evict(c, c->max_bytes, key_hex, NULL), ret, exit);

exit:
    if (fd >= 0) close(fd);
    if (temp_exists) unlinkat(tmp_dir, temp, 0);
    free(buf);
    if (!stored) {
        /* The caller keeps the kernel in memory; say once that the disk has not got it (a
         * full disk would otherwise only show as compiles on every run). A store that
         * found the directory read-only has warned already (became_unwritable). */
        count(&c->store_failures);
        if (ret != MJ_OK)
            warn_once(&c->warned_store, "could not store a kernel in the cache directory %s "
                      "(%s); it is kept in memory only and the next process will compile it "
                      "again \u2014 check the free space and the directory", c->root,
                      mj_last_error());
    }
    return ret;
}

/* ---------------------------------------------------------------------------------------
 * Locks
 * ------------------------------------------------------------------------------------- */

/* A lock file we cannot use (something planted at its name, or flock failing): the lock
 * only saves duplicate compiles, so compile without it rather than fail. */
static void lock_unusable(mj_cache *c, const char *name, const char *why) {
    warn_once(&c->warned_lock, "cache lock file %s/v%d/locks/%s cannot be used (%s); compiling "
              "without the lock, so another process may compile the same kernel at the same "
              "time \u2014 remove it", c->root, MJ_CACHE_FORMAT, name, why);
}

mj_status mj_cache_lock(mj_cache *c, const char *key_hex, int *fd, int *waited) {
    if (fd) *fd = -1;
    if (waited) *waited = 0;
    if (!c || !fd) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_lock: NULL argument");
    MJ_CHECK(check_hex("mj_cache_lock", key_hex));
    if (c->unsafe || !is_writable(c)) return MJ_OK; /* nobody can store: nothing to serialize */

    char name[ENTRY_NAME_MAX];
    snprintf(name, sizeof name, "%s.lock", key_hex);
    /* O_NOFOLLOW: a symlink planted here is never followed (nor its target created);
     * O_NONBLOCK: nor is a FIFO waited on. */
    int lfd = openat(c->sub_fd[SUB_LOCKS], name,
                     O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (lfd < 0) {
        int err = errno;
        if (is_permission_error(err)) {
            became_unwritable(c, "creating a lock file", err);
            return MJ_OK;
        }
        lock_unusable(c, name, err == ELOOP ? "it is a symbolic link" : strerror(err));
        return MJ_OK;
    }
    struct stat st;
    if (fstat(lfd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(lfd);
        lock_unusable(c, name, "it is not a regular file");
        return MJ_OK;
    }
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err == EWOULDBLOCK) {
            if (waited) *waited = 1;
            count(&c->lock_waits);
            do err = flock(lfd, LOCK_EX) == 0 ? 0 : errno; /* block until it is ours */
            while (err == EINTR);
        }
        if (err != 0) {
            close(lfd);
            char why[256];
            snprintf(why, sizeof why, "flock: %s", strerror(err));
            lock_unusable(c, name, why);
            return MJ_OK;
        }
    }
    *fd = lfd;
    return MJ_OK;
}

void mj_cache_unlock(int fd) {
    if (fd >= 0) close(fd); /* closing the last descriptor releases the flock */
}

/* ---------------------------------------------------------------------------------------
 * Maintenance: list, read_file, verify, gc
 * ------------------------------------------------------------------------------------- */

mj_status mj_cache_list(mj_cache *c, mj_cache_item **items, int *n) {
    if (items) *items = NULL;
    if (n) *n = 0;
    if (!c || !items || !n) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_list: NULL argument");
    if (c->unsafe || !c->readable) return MJ_OK;
    item_list list;
    MJ_CHECK(scan_entries(c, 1, &list));
    *items = list.v;
    *n = list.n;
    return MJ_OK;
}

mj_status mj_cache_read_file(const char *path, mj_cache_entry *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!path || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_read_file: NULL argument");
    /* An entry is a regular file, never a symbolic link; a FIFO planted at an entry's name
     * is refused without blocking (base/file.c). */
    char *buf;
    size_t len;
    MJ_CHECK(mj_file_read(AT_FDCWD, path, path, SIZE_MAX, 0, &buf, &len));
    mj_status ret = mj_cache_decode((const uint8_t *)buf, len, out);
    if (ret != MJ_OK) mj_error_prefix(ret, "%s", path);
    free(buf);
    return ret;
}

mj_status mj_cache_verify(mj_cache *c, int *n_ok, int *n_bad) {
    if (n_ok) *n_ok = 0;
    if (n_bad) *n_bad = 0;
    if (!c) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_verify: NULL cache");
    if (c->unsafe || !c->readable) return MJ_OK;

    mj_status ret = MJ_OK;
    item_list list;
    MJ_CHECK(scan_entries(c, 1, &list));
    for (int i = 0; i < list.n; i++) {
        char name[ENTRY_NAME_MAX];
        mj_cache_entry e;
        int ok, existed;
        snprintf(name, sizeof name, "%s" ENTRY_SUFFIX, list.v[i].key_hex);
        MJ_CHECK_GOTO(load_entry(c, name, NULL, &e, &ok, &existed), ret, exit);
        mj_cache_entry_free(&e);
        if (ok && n_ok) (*n_ok)++;
        if (!ok && existed && n_bad) (*n_bad)++;
    }

exit:
    free(list.v);
    return ret;
}

mj_status mj_cache_gc(mj_cache *c, int64_t max_bytes, int *n_evicted) {
    if (n_evicted) *n_evicted = 0;
    if (!c) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_gc: NULL cache");
    if (c->unsafe || !is_writable(c)) return MJ_OK;
    remove_stale_temps(c);
    return evict(c, max_bytes < 0 ? c->max_bytes : max_bytes, NULL, n_evicted);
}

/* ---------------------------------------------------------------------------------------
 * Running totals: v<N>/stats.json
 *
 * Each process adds its JIT counters when its context goes, so `moejit inspect --stats` can
 * show what every process did with this cache. The file is a JSON object rewritten whole:
 * under locks/stats.lock, read stats.json, add, write a temp file in tmp/ (a unique name,
 * O_EXCL), rename it over stats.json. Every open is O_NOFOLLOW | O_NONBLOCK and must find a
 * regular file: a symbolic link or a FIFO planted at either name is refused, never followed
 * or waited on. Best effort: a problem costs the totals, never the program.
 * ------------------------------------------------------------------------------------- */

const char *const mj_cache_total_names[MJ_CACHE_N_TOTALS] = {
    "mem_hits", "mem_misses", "disk_hits", "disk_misses", "compiles", "compile_failures",
    "compile_ms", "quarantined", "lock_waits", "evicted", "strict_misses", "refused_unsafe",
    "store_failures"};
#define TOTAL_MS 6 /* compile_ms: the one real-valued total */

/* Open dir/name with flags, only if it is a regular file; -1 otherwise. */
static int open_regular(int dir, const char *name, int flags, mode_t mode) {
    int fd = openat(dir, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* The stats file's object (a new empty one when there is none or it is not usable). */
static json_t *read_totals(const mj_cache *c, int *present) {
    *present = 0;
    if (c->v_fd < 0) return json_object();
    /* Best effort and quiet: no stats.json yet (or a link, a FIFO: base/file.c) is no totals,
     * with no error text left behind. */
    json_t *o = NULL;
    struct stat st;
    int err;
    int fd = mj_file_open(c->v_fd, "stats.json", 0, &st, &err);
    char *buf;
    size_t len;
    if (fd >= 0 && mj_file_read_fd(fd, &st, "stats.json", 1u << 20, &buf, &len) == MJ_OK) {
        o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
        free(buf);
    }
    if (fd >= 0) close(fd);
    if (json_is_object(o)) *present = 1;
    else json_decref(o), o = json_object();
    return o;
}

void mj_cache_add_totals(mj_cache *c, const double v[MJ_CACHE_N_TOTALS]) {
    int any = 0;
    for (int i = 0; i < MJ_CACHE_N_TOTALS; i++) any |= v[i] != 0;
    if (!any || !c || c->unsafe || !is_writable(c) || c->v_fd < 0) return;
    int lfd = open_regular(c->sub_fd[SUB_LOCKS], "stats.lock", O_RDWR | O_CREAT, 0600);
    if (lfd < 0) return;
    if (flock(lfd, LOCK_EX) == 0) {
        int present;
        json_t *o = read_totals(c, &present);
        for (int i = 0; i < MJ_CACHE_N_TOTALS; i++) {
            json_t *old = json_object_get(o, mj_cache_total_names[i]);
            double prev = json_is_number(old) ? json_number_value(old) : 0.0;
            json_object_set_new(o, mj_cache_total_names[i],
                                i == TOTAL_MS ? json_real(prev + v[i]) : json_integer((json_int_t)(prev + v[i])));
        }
        json_t *np = json_object_get(o, "processes");
        json_object_set_new(o, "processes", json_integer(json_integer_value(np) + 1));
        char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_INDENT(1));
        char temp[128];
        int fd = text ? open_unique_temp(c->sub_fd[SUB_TMP], "stats", temp, sizeof temp) : -1;
        if (fd >= 0) {
            (void)flock(fd, LOCK_EX | LOCK_NB); /* a live writer's temp (remove_stale_temps) */
            int ok = write_all(fd, (const uint8_t *)text, strlen(text)) == 0;
            if (!ok || renameat(c->sub_fd[SUB_TMP], temp, c->v_fd, "stats.json") != 0)
                unlinkat(c->sub_fd[SUB_TMP], temp, 0);
            close(fd);
        }
        free(text);
        json_decref(o);
    }
    close(lfd);
}

mj_status mj_cache_totals(const mj_cache *c, double v[MJ_CACHE_N_TOTALS], int64_t *processes,
                          int *present) {
    if (!c || !v || !processes || !present) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_totals: NULL argument");
    json_t *o = read_totals(c, present);
    for (int i = 0; i < MJ_CACHE_N_TOTALS; i++) {
        json_t *x = json_object_get(o, mj_cache_total_names[i]);
        v[i] = json_is_number(x) ? json_number_value(x) : 0.0;
    }
    *processes = json_integer_value(json_object_get(o, "processes"));
    json_decref(o);
    return MJ_OK;
}
