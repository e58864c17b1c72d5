/* safetensors.c — a safetensors reader (and the header half of a writer) of our own.
 *
 * The format is small enough to read by hand, and a checkpoint is outside input: a shard
 * comes from a download, so every number in it is checked before it is used as an offset.
 * What I check, in order:
 *   1. the 8-byte header length N: at least 2 ("{}"), at most MJ_ST_MAX_HEADER, and the
 *      header must fit inside the file;
 *   2. the header is one JSON object with no duplicate keys (jansson's
 *      JSON_REJECT_DUPLICATES: with duplicates, which entry is "the" tensor is up to the
 *      reader, and two readers of one file could see different weights);
 *   3. each entry: a dtype we know, a shape of at most MJ_ST_MAX_DIMS non-negative integers
 *      whose product (checked for overflow) times the dtype's size is exactly end - begin,
 *      and 0 <= begin <= end <= the data area's size;
 *   4. no two tensors overlap (sorted by begin, each starts at or after the previous end).
 * Gaps are allowed (the reference implementation refuses them, but they hurt no one).
 *
 * Files are read with pread, not mapped: a loader that wants one slice of a tensor reads
 * only that slice's bytes, and a file truncated by someone else while it is being read (a
 * `cp` over a shard in place) is a short read, an error naming the file, where a mapping
 * would fault (SIGBUS) and take the whole process, a server, with it. What remains: a file
 * rewritten in place with other bytes of the same size is read as it is then (its header
 * was checked at open, its data is whatever is there).
 */
#include "weights/safetensors.h"
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as it is (a little-endian host)"
#endif

static const struct {
    const char *name;
    int bits;
} k_dtypes[MJ_ST_DTYPE_COUNT] = {
    [MJ_ST_BOOL] = {"BOOL", 8},       [MJ_ST_U8] = {"U8", 8},
    [MJ_ST_I8] = {"I8", 8},           [MJ_ST_F8_E4M3] = {"F8_E4M3", 8},
    [MJ_ST_F8_E5M2] = {"F8_E5M2", 8}, [MJ_ST_F8_E8M0] = {"F8_E8M0", 8},
    [MJ_ST_I16] = {"I16", 16},        [MJ_ST_U16] = {"U16", 16},
    [MJ_ST_F16] = {"F16", 16},        [MJ_ST_BF16] = {"BF16", 16},
    [MJ_ST_I32] = {"I32", 32},        [MJ_ST_U32] = {"U32", 32},
    [MJ_ST_F32] = {"F32", 32},        [MJ_ST_I64] = {"I64", 64},
    [MJ_ST_U64] = {"U64", 64},        [MJ_ST_F64] = {"F64", 64},
    [MJ_ST_C64] = {"C64", 64},        [MJ_ST_F4] = {"F4", 4},
    [MJ_ST_F6_E2M3] = {"F6_E2M3", 6}, [MJ_ST_F6_E3M2] = {"F6_E3M2", 6},
};

const char *mj_st_dtype_name(mj_st_dtype d) {
    return (unsigned)d < MJ_ST_DTYPE_COUNT ? k_dtypes[d].name : "?";
}

int mj_st_dtype_bits(mj_st_dtype d) { return (unsigned)d < MJ_ST_DTYPE_COUNT ? k_dtypes[d].bits : 0; }

static int dtype_parse(const char *s, mj_st_dtype *out) {
    for (int i = 0; i < MJ_ST_DTYPE_COUNT; i++)
        if (!strcmp(s, k_dtypes[i].name)) {
            *out = (mj_st_dtype)i;
            return 1;
        }
    return 0;
}

int64_t mj_st_numel(const mj_st_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* ---- parsing ---------------------------------------------------------------------------- */

/* A file's tensors and their names live in one allocation: the array, then the names. */
void mj_st_release(mj_st_file *f) {
    if (!f) return;
    free(f->tensors);
    free(f->label);
    f->tensors = NULL;
    f->label = NULL;
    f->n_tensors = 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const mj_st_tensor *)a)->name, ((const mj_st_tensor *)b)->name);
}

static int cmp_range(const void *a, const void *b) {
    const mj_st_tensor *x = *(const mj_st_tensor *const *)a, *y = *(const mj_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_nonneg(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x;
}

/* One header entry into *t (name set by the caller). */
static mj_status parse_entry(const char *label, const char *name, const json_t *v, uint64_t data_size,
                             mj_st_tensor *t) {
    char pn[160];
    mj_printable(name, pn, sizeof pn);
    if (!json_is_object(v))
        return mj_set_error(MJ_ERR_PARSE, "%s: header entry '%s' is not an object with dtype, shape and "
                            "data_offsets: not a valid safetensors file", label, pn);
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' lacks %s (a safetensors entry has a string "
                            "dtype, a shape array and a data_offsets array)", label, pn,
                            !json_is_string(dt) ? "a string 'dtype'" : !json_is_array(sh) ? "a 'shape' array"
                                                                                         : "a 'data_offsets' array");
    char pd[64];
    if (!dtype_parse(json_string_value(dt), &t->dtype))
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' has dtype '%s', which safetensors does not "
                            "define (BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, F16, BF16, I32, "
                            "U32, F32, I64, U64, F64, C64, F4, F6_E2M3, F6_E3M2)", label, pn,
                            mj_printable(json_string_value(dt), pd, sizeof pd));
    size_t nd = json_array_size(sh);
    if (nd > MJ_ST_MAX_DIMS)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' has %zu dimensions; at most %d are read", label,
                            pn, nd, MJ_ST_MAX_DIMS);
    t->ndim = (int32_t)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        int64_t d = json_nonneg(json_array_get(sh, i));
        if (d < 0)
            return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                                label, pn, i);
        t->shape[i] = d;
        overflow |= __builtin_mul_overflow(numel, (uint64_t)d, &numel);
    }
    if (json_array_size(off) != 2)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': data_offsets must be [begin, end], got %zu "
                            "numbers", label, pn, json_array_size(off));
    int64_t b = json_nonneg(json_array_get(off, 0)), e = json_nonneg(json_array_get(off, 1));
    if (b < 0 || e < 0)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': data_offsets must be non-negative integers",
                            label, pn);
    if (e < b)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': data_offsets [%lld, %lld] end before they "
                            "begin", label, pn, (long long)b, (long long)e);
    if ((uint64_t)e > data_size)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': data_offsets [%lld, %lld] run past the data "
                            "area (%llu bytes): the file is truncated or its header lies", label, pn,
                            (long long)b, (long long)e, (unsigned long long)data_size);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    /* bytes = numel * bits / 8, exactly (sub-byte dtypes must fill whole bytes). */
    uint64_t bits;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)mj_st_dtype_bits(t->dtype), &bits);
    if (overflow)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': the shape's size overflows 64 bits", label, pn);
    if (bits % 8)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': %llu %s elements are not a whole number of bytes",
                            label, pn, (unsigned long long)numel, mj_st_dtype_name(t->dtype));
    if (bits / 8 != t->end - t->begin)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': %llu %s elements are %llu bytes, but data_offsets "
                            "[%lld, %lld] hold %lld: the header lies", label, pn, (unsigned long long)numel,
                            mj_st_dtype_name(t->dtype), (unsigned long long)(bits / 8), (long long)b,
                            (long long)e, (long long)(e - b));
    return MJ_OK;
}

/* bytes holds the first `have` bytes of a file of `size` bytes: all of it (mj_st_parse), or
 * at least the length and header (mj_st_open). */
static mj_status parse_impl(const uint8_t *bytes, uint64_t have, uint64_t size, const char *label, mj_st_file *out);

mj_status mj_st_parse(const uint8_t *bytes, uint64_t size, const char *label, mj_st_file *out) {
    if (!bytes || !out || !label) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_st_parse: NULL argument");
    return parse_impl(bytes, size, size, label, out);
}

static mj_status parse_impl(const uint8_t *bytes, uint64_t have, uint64_t size, const char *label, mj_st_file *out) {
    if (size < 8)
        return mj_set_error(MJ_ERR_PARSE, "%s: %llu bytes is too short for a safetensors file (an 8-byte "
                            "header length first)", label, (unsigned long long)size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
    if (n < 2 || n > MJ_ST_MAX_HEADER)
        return mj_set_error(MJ_ERR_PARSE, "%s: header length %llu is not in 2..%u: not a safetensors file",
                            label, (unsigned long long)n, MJ_ST_MAX_HEADER);
    if (n > size - 8)
        return mj_set_error(MJ_ERR_PARSE, "%s: header length %llu runs past the end of the file (%llu "
                            "bytes): the file is truncated or not a safetensors file", label,
                            (unsigned long long)n, (unsigned long long)size);
    if (8 + n > have) return mj_set_error(MJ_ERR_INTERNAL, "%s: the header was not read whole", label);
    if (bytes[8] != '{')
        return mj_set_error(MJ_ERR_PARSE, "%s: the header does not start with '{': not a safetensors file",
                            label);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return mj_set_error(MJ_ERR_PARSE, "%s: the JSON header is malformed (line %d, column %d: %s)",
                            label, jerr.line, jerr.column, jerr.text);
    mj_status st = MJ_OK;
    mj_st_file f;
    memset(&f, 0, sizeof f);
    const mj_st_tensor **by_range = NULL;
    if (!json_is_object(root)) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: the header is not a JSON object", label);
        goto done;
    }
    f.base = bytes;
    f.fd = -1;
    f.size = size;
    f.header_len = n;
    f.data = have == size ? bytes + 8 + n : NULL;
    f.data_size = size - 8 - n;
    f.label = strdup(label);
    /* One allocation: tensors, then their names. */
    size_t count = 0, name_bytes = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        count++;
        name_bytes += strlen(key) + 1;
    }
    f.tensors = malloc(count * sizeof *f.tensors + name_bytes + 1);
    by_range = malloc((count ? count : 1) * sizeof *by_range);
    if (!f.label || !f.tensors || !by_range) {
        st = mj_set_error(MJ_ERR_NOMEM, "%s: out of memory for a header of %zu tensors", label, count);
        goto done;
    }
    char *names = (char *)(f.tensors + count);
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                st = mj_set_error(MJ_ERR_PARSE, "%s: __metadata__ is not an object of strings", label);
                goto done;
            }
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                char pk[96];
                st = mj_set_error(MJ_ERR_PARSE, "%s: __metadata__ value of '%s' is not a string", label,
                                  mj_printable(mk, pk, sizeof pk));
                goto done;
            }
            continue;
        }
        mj_st_tensor *t = &f.tensors[f.n_tensors];
        memset(t, 0, sizeof *t);
        MJ_CHECK_GOTO(parse_entry(label, key, v, f.data_size, t), st, done);
        size_t len = strlen(key) + 1;
        memcpy(names, key, len);
        t->name = names;
        names += len;
        by_range[f.n_tensors] = t;
        f.n_tensors++;
    }
    /* Overlaps: sorted by where they begin, each must start at or after the previous end. */
    qsort(by_range, (size_t)f.n_tensors, sizeof *by_range, cmp_range);
    for (int64_t i = 1; i < f.n_tensors; i++)
        if (by_range[i]->begin < by_range[i - 1]->end) {
            char pa[160], pb[160];
            st = mj_set_error(MJ_ERR_PARSE, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap: the "
                              "header lies about data_offsets", label,
                              mj_printable(by_range[i - 1]->name, pa, sizeof pa),
                              (unsigned long long)by_range[i - 1]->begin, (unsigned long long)by_range[i - 1]->end,
                              mj_printable(by_range[i]->name, pb, sizeof pb),
                              (unsigned long long)by_range[i]->begin, (unsigned long long)by_range[i]->end);
            goto done;
        }
    free(by_range);
    by_range = NULL;
    qsort(f.tensors, (size_t)f.n_tensors, sizeof *f.tensors, cmp_name);
    *out = f;
    memset(&f, 0, sizeof f);
done:
    free(by_range);
    mj_st_release(&f);
    json_decref(root);
    return st;
}

const mj_st_tensor *mj_st_find(const mj_st_file *f, const char *name) {
    if (!f || !name || !f->n_tensors) return NULL;
    mj_st_tensor key;
    key.name = name;
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_name);
}

/* ---- files -------------------------------------------------------------------------------- */

/* len bytes at byte `at` of the open file fd (of `size` bytes when opened) into dst. A short
 * read is the file having shrunk since: an error naming it, as is any read error. */
static mj_status read_at(int fd, const char *label, uint64_t at, uint64_t len, void *dst, uint64_t size) {
    uint8_t *p = dst;
    while (len) {
        size_t want = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t r = pread(fd, p, want, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return mj_set_error(MJ_ERR_IO, "cannot read %s: %s", label, strerror(errno));
        if (r == 0) {
            struct stat sb;
            long long now = fstat(fd, &sb) == 0 ? (long long)sb.st_size : -1;
            return mj_set_error(MJ_ERR_IO, "%s: the file ends at byte %llu (%lld bytes now, %llu when opened): it "
                                "was truncated or replaced while being read; copy it whole again, then reopen the "
                                "checkpoint", label, (unsigned long long)at, now, (unsigned long long)size);
        }
        p += r, at += (uint64_t)r, len -= (uint64_t)r;
    }
    return MJ_OK;
}

mj_status mj_st_open(int dirfd, const char *name, const char *label, mj_st_file **out) {
    if (!name || !label || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_st_open: NULL argument");
    /* Only a regular file, never through a symbolic link, never blocking on a FIFO
     * (base/file.c). */
    struct stat sb;
    int err;
    int fd = mj_file_open(dirfd, name, 0, &sb, &err);
    if (fd < 0) {
        if (err == ELOOP && S_ISLNK(sb.st_mode))
            return mj_set_error(MJ_ERR_IO, "%s is a symbolic link: refused (a shard must be a regular file "
                                "inside the checkpoint directory; a Hugging Face cache snapshot is links: "
                                "download with --local-dir to get the files themselves)", label);
        return mj_file_open_error(label, err, &sb);
    }
    if (sb.st_size < 8) {
        close(fd);
        return mj_set_error(MJ_ERR_PARSE, "%s: %lld bytes is too short for a safetensors file (an 8-byte "
                            "header length first)", label, (long long)sb.st_size);
    }
    const uint64_t size = (uint64_t)sb.st_size;
    /* The length, then the header: only these are read now. */
    uint8_t len8[8];
    mj_status st = read_at(fd, label, 0, 8, len8, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    uint8_t *head = NULL;
    mj_st_file *f = NULL;
    if (st == MJ_OK && n >= 2 && n <= MJ_ST_MAX_HEADER && n <= size - 8) {
        head = malloc((size_t)(8 + n));
        f = calloc(1, sizeof *f);
        if (!head || !f) st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", label);
        else memcpy(head, len8, 8), st = read_at(fd, label, 8, n, head + 8, size);
    } else if (st == MJ_OK) {
        head = malloc(8), f = calloc(1, sizeof *f); /* parse_impl says what is wrong with n */
        if (!head || !f) st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", label);
        else memcpy(head, len8, 8), n = 0;
    }
    if (st == MJ_OK) st = parse_impl(head, 8 + n, size, label, f);
    if (st != MJ_OK) {
        close(fd);
        free(head);
        free(f);
        return st;
    }
    f->fd = fd;
    *out = f;
    return MJ_OK;
}

mj_status mj_st_read(const mj_st_file *f, uint64_t offset, uint64_t len, void *dst) {
    if (offset > f->data_size || len > f->data_size - offset)
        return mj_set_error(MJ_ERR_INTERNAL, "%s: a read of %llu bytes at %llu is outside the data area (%llu bytes)",
                            f->label, (unsigned long long)len, (unsigned long long)offset,
                            (unsigned long long)f->data_size);
    if (f->fd < 0) {
        if (len) memcpy(dst, f->data + offset, (size_t)len);
        return MJ_OK;
    }
    return read_at(f->fd, f->label, 8 + f->header_len + offset, len, dst, f->size);
}

void mj_st_close(mj_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free((void *)f->base);
    mj_st_release(f);
    free(f);
}

/* ---- writing -------------------------------------------------------------------------------- */

mj_status mj_st_build_header(const mj_st_entry *e, int64_t n, uint8_t **prefix, uint64_t *prefix_len,
                             uint64_t *data_size) {
    if ((n > 0 && !e) || n < 0 || !prefix || !prefix_len || !data_size)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_st_build_header: bad arguments");
    mj_status st = MJ_OK;
    json_t *root = json_object(), *meta = json_object();
    char *text = NULL;
    uint64_t off = 0;
    if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) ||
        json_object_set(root, "__metadata__", meta)) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory building a safetensors header");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t numel = 1, bits;
        for (int32_t d = 0; d < e[i].ndim; d++) numel *= (uint64_t)e[i].shape[d];
        bits = numel * (uint64_t)mj_st_dtype_bits(e[i].dtype);
        if (e[i].ndim < 0 || e[i].ndim > MJ_ST_MAX_DIMS || bits % 8 || bits / 8 != e[i].nbytes) {
            st = mj_set_error(MJ_ERR_INTERNAL, "safetensors writer: tensor '%s' says %llu bytes, its shape "
                              "and dtype make %llu bits", e[i].name, (unsigned long long)e[i].nbytes,
                              (unsigned long long)bits);
            goto done;
        }
        json_t *ent = json_object(), *shape = json_array(), *offs = json_array();
        int bad = !ent || !shape || !offs;
        for (int32_t d = 0; !bad && d < e[i].ndim; d++) bad |= json_array_append_new(shape, json_integer(e[i].shape[d]));
        bad = bad || json_array_append_new(offs, json_integer((json_int_t)off)) ||
              json_array_append_new(offs, json_integer((json_int_t)(off + e[i].nbytes))) ||
              json_object_set_new(ent, "dtype", json_string(mj_st_dtype_name(e[i].dtype))) ||
              json_object_set(ent, "shape", shape) || json_object_set(ent, "data_offsets", offs);
        json_decref(shape);
        json_decref(offs);
        if (bad || json_object_set_new(root, e[i].name, ent)) {
            if (bad) json_decref(ent);
            st = mj_set_error(MJ_ERR_NOMEM, "out of memory building a safetensors header");
            goto done;
        }
        off += e[i].nbytes;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory building a safetensors header");
        goto done;
    }
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory building a safetensors header");
        goto done;
    }
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    *prefix = buf;
    *prefix_len = 8 + padded;
    *data_size = off;
done:
    free(text);
    json_decref(meta);
    json_decref(root);
    return st;
}
