/* npy.c — the .npy format, enough of it to be strict.
 *
 * A .npy file is: the magic "\x93NUMPY", a major and minor version byte, the header length
 * (u16 little-endian for version 1, u32 for versions 2 and 3), then a Python dict literal
 * such as {'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), } padded with spaces
 * to a 64-byte boundary, then the raw data. I parse the dict by hand (it is a tiny, fixed
 * grammar), refuse Fortran order and any dtype the caller did not ask for, and check that
 * the file holds exactly the bytes the shape promises.
 */
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>
#include <stdarg.h>

/* ---- temporaries removed on a signal --------------------------------------------------------
 * An output is written to a temporary beside it and renamed over it when complete. SIGINT,
 * SIGTERM or SIGHUP in between would leave the partial temporary behind, so every temporary
 * is listed here from its creation until it is renamed or removed, and a handler (installed
 * the first time, only over the default action: a signal the program ignores or handles
 * itself is left alone) unlinks those listed, then ends the process by the same signal.
 * The list is changed with these signals blocked in the calling thread, a name listed
 * before its file is created and unlisted after it is renamed or removed, the flag stored
 * after the name (release; the handler loads it with acquire): a signal taken by any thread
 * removes every temporary that exists. */
#define NPY_MAX_TEMPS 8
static char g_temps[NPY_MAX_TEMPS][4096];
static volatile sig_atomic_t g_temp_used[NPY_MAX_TEMPS];
static const int k_cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_CLEANUP_SIGNALS ((int)(sizeof k_cleanup_signals / sizeof *k_cleanup_signals))

static void on_cleanup_signal(int sig) {
    int e = errno;
    for (int i = 0; i < NPY_MAX_TEMPS; i++)
        if (__atomic_load_n(&g_temp_used[i], __ATOMIC_ACQUIRE)) unlink(g_temps[i]); /* async-signal-safe */
    /* The default action, then the signal again: it is delivered when this handler returns
     * (it is blocked while the handler runs), so the exit status says which signal it was. */
    signal(sig, SIG_DFL);
    raise(sig);
    errno = e;
}

static void install_cleanup_handlers(void) {
    static int done;
    if (done) return;
    done = 1;
    for (int i = 0; i < N_CLEANUP_SIGNALS; i++) {
        struct sigaction old;
        if (sigaction(k_cleanup_signals[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_cleanup_signal;
        sigemptyset(&sa.sa_mask);
        for (int j = 0; j < N_CLEANUP_SIGNALS; j++) sigaddset(&sa.sa_mask, k_cleanup_signals[j]);
        sigaction(k_cleanup_signals[i], &sa, NULL);
    }
}

static void block_cleanup_signals(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < N_CLEANUP_SIGNALS; i++) sigaddset(&set, k_cleanup_signals[i]);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

/* Stop listing the temporary `tmp` (renamed or removed). Called with the signals blocked. */
static void forget_temp(const char *tmp) {
    for (int i = 0; i < NPY_MAX_TEMPS; i++)
        if (g_temp_used[i] && strcmp(g_temps[i], tmp) == 0) g_temp_used[i] = 0;
}

/* Record a one-line reason and return -1. */
__attribute__((format(printf, 3, 4))) static int npy_fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}
#define ERR(...) npy_fail(err, errlen, __VA_ARGS__)

void npy_free(npy_array *a) {
    if (a) free(a->data), a->data = NULL;
}

const char *npy_shape_str(const npy_array *a, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < a->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", a->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* Find `'key':` in the header dict and return the text after the colon. */
static const char *dict_value(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (isspace((unsigned char)*p)) p++;
    if (*p != ':') return NULL;
    p++;
    while (isspace((unsigned char)*p)) p++;
    return p;
}

static int parse_header(const char *hdr, const char *path, npy_array *a, char *err, size_t errlen) {
    const char *d = dict_value(hdr, "descr");
    if (!d || (*d != '\'' && *d != '"')) return ERR("%s: .npy header has no 'descr'", path);
    char q = *d++;
    size_t n = 0;
    while (d[n] && d[n] != q && n < sizeof a->dtype - 1) n++;
    if (d[n] != q) return ERR("%s: .npy 'descr' is not a simple dtype (structured arrays are not supported)", path);
    memcpy(a->dtype, d, n);
    a->dtype[n] = '\0';

    const char *f = dict_value(hdr, "fortran_order");
    if (!f) return ERR("%s: .npy header has no 'fortran_order'", path);
    if (strncmp(f, "True", 4) == 0)
        return ERR("%s: array is in Fortran order; save it C-contiguous (np.ascontiguousarray)", path);
    if (strncmp(f, "False", 5) != 0) return ERR("%s: bad 'fortran_order' in .npy header", path);

    const char *s = dict_value(hdr, "shape");
    if (!s || *s != '(') return ERR("%s: .npy header has no 'shape' tuple", path);
    s++;
    a->ndim = 0;
    a->count = 1;
    for (;;) {
        while (isspace((unsigned char)*s)) s++;
        if (*s == ')') break;
        if (!isdigit((unsigned char)*s)) return ERR("%s: bad 'shape' in .npy header", path);
        if (a->ndim == NPY_MAX_DIMS) return ERR("%s: more than %d dimensions", path, NPY_MAX_DIMS);
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || v < 0 || v > (1LL << 40)) return ERR("%s: dimension out of range in 'shape'", path);
        a->shape[a->ndim++] = v;
        if (v && a->count > (INT64_C(1) << 50) / v) return ERR("%s: array too large", path);
        a->count *= v;
        s = end;
        while (isspace((unsigned char)*s)) s++;
        if (*s == ',') s++;
        else if (*s != ')') return ERR("%s: bad 'shape' in .npy header", path);
    }
    size_t len = strlen(a->dtype);
    /* A kind with no byte size is not a numeric array: Python objects ('|O'), strings. */
    if (len >= 2 && !strchr("biufc", a->dtype[1]))
        return ERR("%s: dtype '%s' is not a numeric array (Python objects, strings or records): save it as "
                   "float32 (np.asarray(x, dtype=np.float32))", path, a->dtype);
    if (len < 3 || (a->dtype[0] != '<' && a->dtype[0] != '|' && a->dtype[0] != '='))
        return ERR("%s: dtype '%s' is not little-endian", path, a->dtype);
    a->itemsize = (size_t)atoi(a->dtype + 2);
    if (a->itemsize == 0 || a->itemsize > 16) return ERR("%s: unsupported dtype '%s'", path, a->dtype);
    return 0;
}

/* The fixed start of a file: magic, version, header length. `p` holds the n bytes there are
 * (n >= 10). On success *pre is the preamble's size (10 for version 1, 12 for 2 and 3) and
 * *hlen the header's; version 2 and 3 need 12 bytes, and fewer is a truncated header. */
static int parse_preamble(const unsigned char *p, size_t n, const char *name, size_t *pre,
                          uint32_t *hlen, char *err, size_t errlen) {
    if (n < 10 || memcmp(p, "\x93NUMPY", 6) != 0) return ERR("%s: not a .npy file (bad magic)", name);
    int major = p[6];
    if (major == 1) {
        *pre = 10;
        *hlen = (uint32_t)p[8] | (uint32_t)p[9] << 8;
    } else if (major == 2 || major == 3) {
        if (n < 12) return ERR("%s: truncated .npy header", name);
        *pre = 12;
        *hlen = (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 | (uint32_t)p[11] << 24;
    } else {
        return ERR("%s: unsupported .npy format version %d", name, major);
    }
    if (*hlen > (1u << 20)) return ERR("%s: .npy header too large", name);
    return 0;
}

/* The header dict (hdr, NUL-terminated), then the dtype the caller wants. */
static int check_header(const char *hdr, const char *name, const char *want, npy_array *a, char *err,
                        size_t errlen) {
    if (parse_header(hdr, name, a, err, errlen)) return -1;
    /* '<', '|' and '=' all mean little-endian (or byte-sized) here: compare the rest. */
    if (want && strcmp(a->dtype + 1, want + 1) != 0)
        return ERR("%s: dtype is '%s', expected '%s'", name, a->dtype, want);
    return 0;
}

int npy_parse(const void *buf, size_t len, const char *name, const char *want, npy_array *out,
              char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!buf && len) return ERR("%s: no buffer", name);
    const unsigned char *p = buf;
    npy_array a = {0};
    size_t pre;
    uint32_t hlen;
    if (parse_preamble(p, len, name, &pre, &hlen, err, errlen)) return -1;
    if (len - pre < hlen) return ERR("%s: truncated .npy header", name);
    char *hdr = malloc((size_t)hlen + 1);
    if (!hdr) return ERR("%s: out of memory", name);
    memcpy(hdr, p + pre, hlen);
    hdr[hlen] = '\0';
    int rc = check_header(hdr, name, want, &a, err, errlen);
    free(hdr);
    if (rc) return -1;
    size_t left = len - pre - hlen;
    size_t bytes = (size_t)a.count * a.itemsize;
    if (left < bytes) return ERR("%s: truncated: the header promises %zu bytes of data", name, bytes);
    if (left > bytes) return ERR("%s: trailing bytes after the array data", name);
    a.data = malloc(bytes ? bytes : 1);
    if (!a.data) return ERR("%s: out of memory (%zu bytes)", name, bytes);
    if (bytes) memcpy(a.data, p + pre + hlen, bytes);
    *out = a;
    return 0;
}

int npy_load(const char *path, const char *want, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    /* O_NONBLOCK so that a FIFO with no writer cannot hang the open; then only a regular
     * file is read (a FIFO, device or socket never is), in blocking mode. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return ERR("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ERR("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (S_ISDIR(st.st_mode)) return ERR("%s: is a directory; give the path of a .npy file", path);
        return ERR("%s: not a regular file (a FIFO, device or socket); give the path of a .npy file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *fp = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return ERR("%s: cannot open: %s", path, strerror(e));
    }
    npy_array a = {0};
    char *hdr = NULL;
    int rc = -1;
    unsigned char pre[12];
    size_t npre = fread(pre, 1, 10, fp), prelen;
    uint32_t hlen;
    if (npre == 10 && (pre[6] == 2 || pre[6] == 3)) npre += fread(pre + 10, 1, 2, fp);
    if (parse_preamble(pre, npre, path, &prelen, &hlen, err, errlen)) goto done;
    if ((int64_t)hlen > (int64_t)st.st_size - (int64_t)prelen) {
        ERR("%s: truncated .npy header (it promises %u bytes; the file is %lld bytes)", path, hlen,
            (long long)st.st_size);
        goto done;
    }
    hdr = malloc((size_t)hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, fp) != hlen) {
        ERR("%s: truncated .npy header", path);
        goto done;
    }
    hdr[hlen] = '\0';
    if (check_header(hdr, path, want, &a, err, errlen)) goto done;
    /* The file's size against the header's promise first: a header is not allowed to make
     * me allocate more than the file holds. */
    size_t bytes = (size_t)a.count * a.itemsize;
    int64_t held = (int64_t)st.st_size - (int64_t)prelen - (int64_t)hlen;
    if (held < 0 || (uint64_t)held < bytes) {
        ERR("%s: truncated: the header promises %zu bytes of data, the file holds %lld", path, bytes,
            (long long)(held < 0 ? 0 : held));
        goto done;
    }
    if ((uint64_t)held > bytes) {
        ERR("%s: trailing bytes after the array data (the header promises %zu bytes, the file holds %lld)",
            path, bytes, (long long)held);
        goto done;
    }
    a.data = malloc(bytes ? bytes : 1);
    if (!a.data) {
        ERR("%s: out of memory (%zu bytes)", path, bytes);
        goto done;
    }
    /* The file may change under me: read what the header promised, and no more. */
    if (fread(a.data, 1, bytes, fp) != bytes) {
        ERR("%s: truncated: the header promises %zu bytes of data", path, bytes);
        goto done;
    }
    if (fgetc(fp) != EOF) {
        ERR("%s: trailing bytes after the array data", path);
        goto done;
    }
    *out = a;
    a.data = NULL;
    rc = 0;
done:
    free(a.data);
    free(hdr);
    fclose(fp);
    return rc;
}

/* The directory part of path ("." when it has none), for fsync after a rename. */
static void dir_of(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, len, ".");
    else if (slash == path) snprintf(buf, len, "/");
    else snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

static const char *kind_of(mode_t m) {
    return S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket" : S_ISDIR(m) ? "a directory" : "not a regular file";
}

/* The output path must be free or a regular file: what is there is replaced by rename.
 * Anything else is refused rather than written through or replaced: rename would turn a FIFO
 * or a device node (as root, /dev/null) into a regular file, and writing into one is not an
 * atomic output. A symbolic link is refused whatever it points to (a link is never
 * followed, nor replaced: /dev/stdout, through /proc/self/fd/1, can point at a regular
 * file, and replacing the link would break the system's /dev for every later process). */
int npy_check_output(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0; /* nothing there (or not visible): the rename decides */
    if (S_ISDIR(st.st_mode)) return ERR("%s: is a directory; remove it or choose another output name", path);
    if (S_ISLNK(st.st_mode)) {
        struct stat t;
        const char *what = stat(path, &t) != 0 ? "nothing (a dangling link)" : S_ISREG(t.st_mode) ? "a regular file"
                                                                                               : kind_of(t.st_mode);
        return ERR("%s: is a symbolic link to %s; outputs are written to a regular file (a temporary renamed "
                   "over the path), never through or over a link: give the file's own path", path, what);
    }
    if (!S_ISREG(st.st_mode))
        return ERR("%s: is %s; outputs are written to a regular file (a temporary renamed over the path), never "
                   "into a FIFO, device or socket: give a file path", path, kind_of(st.st_mode));
    return 0;
}

int npy_header(const char *dtype, int ndim, const int64_t *shape, char *out, size_t cap) {
    char dict[256];
    if (ndim < 0 || ndim > NPY_MAX_DIMS || strlen(dtype) >= sizeof ((npy_array *)0)->dtype) return -1;
    size_t n = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", dtype);
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%" PRId64 "%s", shape[i],
                              ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    n += (size_t)snprintf(dict + n, sizeof dict - n, "), }");
    if (n >= sizeof dict) return -1;
    /* Pad with spaces so that magic(6) + version(2) + len(2) + header ends on 64 bytes,
     * the header ending in '\n'. */
    size_t total = 10 + n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hbytes = 10 + n + pad + 1;
    if (hbytes > cap) return -1;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    uint16_t hl = (uint16_t)(n + pad + 1);
    out[8] = (char)(hl & 0xFF);
    out[9] = (char)(hl >> 8);
    memcpy(out + 10, dict, n);
    memset(out + 10 + n, ' ', pad);
    out[10 + n + pad] = '\n';
    return (int)hbytes;
}

int npy_write_temp(npy_out *o, const char *path, const char *dtype, size_t itemsize, int ndim,
                   const int64_t *shape, const void *data, char *err, size_t errlen) {
    o->tmp[0] = '\0';
    if ((size_t)snprintf(o->path, sizeof o->path, "%s", path) >= sizeof o->path ||
        (size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp.XXXXXX", path) >= sizeof o->tmp) {
        o->tmp[0] = '\0';
        return ERR("%s: path too long", path);
    }
    char header[NPY_MAX_HEADER];
    int hb = npy_header(dtype, ndim, shape, header, sizeof header);
    if (hb < 0) {
        o->tmp[0] = '\0';
        return ERR("%s: cannot describe dtype '%s' with %d dimensions", path, dtype, ndim);
    }
    size_t hbytes = (size_t)hb;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= shape[i];

    /* What rename could not replace, or must not, said before anything is written. */
    if (npy_check_output(path, err, errlen)) {
        o->tmp[0] = '\0';
        return -1;
    }
    /* A new file of a random name beside the output, created O_EXCL (so never through a
     * link or into someone else's file), mode 0600 until it is complete. Its name is listed
     * for the signal handler before the file exists, so a signal delivered to any thread
     * (this one blocks them meanwhile; a library's threads may not) finds it listed as soon
     * as there is something to remove. */
    install_cleanup_handlers();
    const size_t tl = strlen(o->tmp);
    int fd = -1, e = EEXIST;
    for (int attempt = 0; attempt < 64 && fd < 0 && e == EEXIST; attempt++) {
        static const char k_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        unsigned char rnd[6];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            e = errno ? errno : EIO;
            break;
        }
        for (int i = 0; i < 6; i++) o->tmp[tl - 6 + (size_t)i] = k_chars[rnd[i] % 62];
        sigset_t old;
        block_cleanup_signals(&old);
        int slot = -1;
        for (int i = 0; i < NPY_MAX_TEMPS && slot < 0; i++)
            if (!__atomic_load_n(&g_temp_used[i], __ATOMIC_ACQUIRE)) slot = i;
        if (slot < 0) {
            e = EMFILE;
        } else {
            memcpy(g_temps[slot], o->tmp, tl + 1);
            __atomic_store_n(&g_temp_used[slot], 1, __ATOMIC_RELEASE); /* the name, then the flag */
            fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            e = fd < 0 ? errno : 0;
            if (fd < 0) __atomic_store_n(&g_temp_used[slot], 0, __ATOMIC_RELEASE);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (fd < 0) {
        o->tmp[0] = '\0';
        return ERR("%s: cannot create a temporary file beside it: %s", path, strerror(e));
    }
    mode_t mask = umask(0);
    umask(mask);
    size_t bytes = (size_t)count * itemsize;
    int ok = write_all(fd, header, hbytes) == 0 && write_all(fd, data, bytes) == 0;
    ok = ok && fchmod(fd, 0666 & ~mask) == 0;
    ok = ok && fsync(fd) == 0;
    e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    if (!ok) {
        npy_discard(o);
        return ERR("%s: write failed: %s", path, strerror(e));
    }
    return 0;
}

int npy_commit(npy_out *o, char *err, size_t errlen) {
    /* Once more just before the rename: the output path may have changed since the
     * temporary was written. */
    if (npy_check_output(o->path, err, errlen)) {
        npy_discard(o);
        return -1;
    }
    sigset_t old;
    block_cleanup_signals(&old);
    int rc = rename(o->tmp, o->path), e = errno;
    if (rc == 0) forget_temp(o->tmp), o->tmp[0] = '\0';
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        npy_discard(o);
        return ERR("%s: cannot replace it: %s", o->path, strerror(e));
    }
    /* Make the rename durable (best effort: the data itself is already synced). */
    char dir[4096];
    dir_of(o->path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

void npy_discard(npy_out *o) {
    sigset_t old;
    block_cleanup_signals(&old);
    if (o->tmp[0]) unlink(o->tmp), forget_temp(o->tmp);
    o->tmp[0] = '\0';
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int npy_save(const char *path, const char *dtype, size_t itemsize, int ndim, const int64_t *shape,
             const void *data, char *err, size_t errlen) {
    npy_out o;
    if (npy_write_temp(&o, path, dtype, itemsize, ndim, shape, data, err, errlen)) return -1;
    return npy_commit(&o, err, errlen);
}
