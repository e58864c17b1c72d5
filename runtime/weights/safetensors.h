/* safetensors.h — our reader and writer of the safetensors format (runtime/weights/safetensors.c).
 *
 *   [8 bytes: N, little-endian u64] [N bytes: JSON header] [data area]
 *   header: {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
 *            "__metadata__": {"key": "string", ...}}   (offsets relative to the data area)
 *
 * Not public: the checkpoint loader (checkpoint.c), the writer behind `moejit make-checkpoint`
 * (checkpoint_make.c), the tests and the fuzz harness use it. */
#ifndef MJ_SAFETENSORS_H
#define MJ_SAFETENSORS_H

#include "base.h"

/* Every dtype the format names; bits per element (F4 and F6 are packed below a byte). */
typedef enum mj_st_dtype {
    MJ_ST_BOOL, MJ_ST_U8, MJ_ST_I8, MJ_ST_F8_E4M3, MJ_ST_F8_E5M2, MJ_ST_F8_E8M0,
    MJ_ST_I16, MJ_ST_U16, MJ_ST_F16, MJ_ST_BF16,
    MJ_ST_I32, MJ_ST_U32, MJ_ST_F32,
    MJ_ST_I64, MJ_ST_U64, MJ_ST_F64, MJ_ST_C64,
    MJ_ST_F4, MJ_ST_F6_E2M3, MJ_ST_F6_E3M2,
    MJ_ST_DTYPE_COUNT
} mj_st_dtype;

const char *mj_st_dtype_name(mj_st_dtype d); /* "F8_E4M3"; "?" for a value out of range   */
int mj_st_dtype_bits(mj_st_dtype d);         /* 8 for U8, 4 for F4, ...; 0 out of range   */

/* A header larger than this is refused (the format's reference implementation caps it at
 * 100 MB too): nobody's checkpoint needs more, and the JSON is parsed into memory. */
#define MJ_ST_MAX_HEADER (100u << 20)
#define MJ_ST_MAX_DIMS 8

typedef struct mj_st_tensor {
    const char *name;          /* NUL-terminated, owned by the file                          */
    mj_st_dtype dtype;
    int32_t ndim;
    int64_t shape[MJ_ST_MAX_DIMS];
    uint64_t begin, end;       /* byte range within the data area; end - begin = its size    */
} mj_st_tensor;

typedef struct mj_st_file {
    char *label;               /* the path, for messages                                     */
    const uint8_t *base;       /* the caller's bytes (mj_st_parse), or the 8 + N bytes of the
                                  length and header read into memory (mj_st_open: ours)       */
    uint64_t size;             /* bytes of the whole file (when opened: its size then)        */
    uint64_t header_len;       /* N                                                          */
    const uint8_t *data;       /* base + 8 + N (mj_st_parse); NULL when opened: read the
                                  tensors with mj_st_read                                    */
    uint64_t data_size;        /* size - 8 - N                                               */
    mj_st_tensor *tensors;     /* [n_tensors], sorted by name                                */
    int64_t n_tensors;
    int fd;                    /* mj_st_open: the open file (read with pread); -1 otherwise  */
} mj_st_file;

/* Parse and check a safetensors file held in memory (bytes [0, size)): the header length
 * (at least 2, at most MJ_ST_MAX_HEADER, inside the file), the JSON (an object, no duplicate
 * keys), each entry (a known dtype, a shape of non-negative integers whose element count
 * times the dtype's size is end - begin, 0 <= begin <= end <= the data area's size), no two
 * tensors' byte ranges overlapping, __metadata__ an object of strings. Gaps between tensors
 * are allowed. `label` names the file in errors. On success *out refers to `bytes` (which must
 * outlive it) and is released with mj_st_release; on failure *out is untouched. */
mj_status mj_st_parse(const uint8_t *bytes, uint64_t size, const char *label, mj_st_file *out);

/* Open `name` in directory dirfd (AT_FDCWD: the working directory) read-only, refusing a
 * symbolic link (O_NOFOLLOW), a FIFO, device or directory (without blocking: O_NONBLOCK, then
 * fstat must say a regular file); read its length and header and parse them as mj_st_parse
 * does (the data area is not read). `label` names it in errors. Release with mj_st_close
 * (which closes it). */
mj_status mj_st_open(int dirfd, const char *name, const char *label, mj_st_file **out);
/* Copy len bytes at `offset` of f's data area into dst: from memory (mj_st_parse), or read
 * from the file (mj_st_open, pread: never a mapping, so a file truncated or replaced while
 * it is read is an error, MJ_ERR_IO naming it, not SIGBUS). The range must be inside the
 * data area the header was checked against. */
mj_status mj_st_read(const mj_st_file *f, uint64_t offset, uint64_t len, void *dst);
void mj_st_close(mj_st_file *f);
/* Free what mj_st_parse allocated in *f (not the bytes). */
void mj_st_release(mj_st_file *f);

/* The tensor called name, or NULL. */
const mj_st_tensor *mj_st_find(const mj_st_file *f, const char *name);
/* Elements of a tensor's shape (1 for a scalar, shape []). */
int64_t mj_st_numel(const mj_st_tensor *t);

/* ---- writing ----
 * One tensor to write: what goes into the header. Offsets are assigned in array order, each
 * tensor right after the previous one. */
typedef struct mj_st_entry {
    const char *name;
    mj_st_dtype dtype;
    int32_t ndim;
    int64_t shape[MJ_ST_MAX_DIMS];
    uint64_t nbytes;           /* must equal numel * bits / 8                                */
} mj_st_entry;

/* The first 8 + N bytes of a file holding these tensors: the length, the JSON header (with
 * "__metadata__": {"format": "pt"}, as Hugging Face's writers put it), padded with spaces so
 * the data area starts 8-byte aligned. *prefix is malloc'd; *data_size gets the sum of
 * nbytes. */
mj_status mj_st_build_header(const mj_st_entry *e, int64_t n, uint8_t **prefix, uint64_t *prefix_len,
                             uint64_t *data_size);

#endif /* MJ_SAFETENSORS_H */
