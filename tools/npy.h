/* npy.h — reading and writing NumPy .npy files (format versions 1-3, C order). */
#ifndef MJ_NPY_H
#define MJ_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8
#define NPY_MAX_HEADER 512  /* the most bytes npy_header writes                          */

typedef struct npy_array {
    char dtype[8];          /* "<f4", "|u1", "<i4", ...                                  */
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;          /* product of shape (1 for a scalar)                         */
    size_t itemsize;
    void *data;             /* count * itemsize bytes, owned                             */
} npy_array;

/* Load `path` and check its dtype is `want_dtype` (e.g. "<f4"; NULL accepts any). Only a
 * regular file is read (a directory, FIFO or device is refused without blocking), and the
 * file's size must match the header's shape before anything is allocated for the data. On
 * failure returns -1 with a one-line reason in err (no partial result). */
int npy_load(const char *path, const char *want_dtype, npy_array *out, char *err, size_t errlen);

/* The same from memory: `buf` holds a whole .npy file of `len` bytes; `name` labels the
 * messages. npy_load reads a file with the same preamble and header parser. */
int npy_parse(const void *buf, size_t len, const char *name, const char *want_dtype, npy_array *out,
              char *err, size_t errlen);

/* The preamble and header npy_save writes (version 1, padded to 64 bytes): the byte count
 * (at most NPY_MAX_HEADER), or -1 when it does not fit `cap` or ndim/dtype are out of range.
 * The data follows it. */
int npy_header(const char *dtype, int ndim, const int64_t *shape, char *out, size_t cap);

/* Write an array atomically: to a new temporary file beside path (random name, created
 * O_EXCL, so never through a planted link), fsynced, then renamed over path. Returns 0, or
 * -1 with err (and no temporary left). path must be free, a regular file or a link to one
 * (the link is replaced): a directory, FIFO, device, socket or a link to one is refused,
 * never written through. SIGINT, SIGTERM or SIGHUP (left at their default action by the
 * program) while a temporary exists remove it before the process ends by that signal. */
int npy_save(const char *path, const char *dtype, size_t itemsize, int ndim,
             const int64_t *shape, const void *data, char *err, size_t errlen);

/* What npy_save says of path before it writes anything (a command checks its outputs
 * before its work): 0, or -1 with err when path is a directory, a special file or a link
 * to one. */
int npy_check_output(const char *path, char *err, size_t errlen);

/* The same in two steps, for several outputs that should all be replaced or none:
 * npy_write_temp each (a failure leaves no temporary of its own), then npy_commit each, or
 * npy_discard the temporaries already written. */
typedef struct npy_out {
    char path[4096];        /* the destination                                            */
    char tmp[4096];         /* the temporary beside it; "" once committed or discarded    */
} npy_out;
int npy_write_temp(npy_out *o, const char *path, const char *dtype, size_t itemsize, int ndim,
                   const int64_t *shape, const void *data, char *err, size_t errlen);
int npy_commit(npy_out *o, char *err, size_t errlen); /* a failure discards the temporary */
void npy_discard(npy_out *o);

void npy_free(npy_array *a);

/* "[2, 3]" for messages. */
const char *npy_shape_str(const npy_array *a, char *buf, size_t len);

#endif
