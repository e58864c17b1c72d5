/* file.h — the one way moejit reads a whole file (base/file.c, where the rule for symbolic
 * links, FIFOs and sizes is written down). Not installed, not public. */
#ifndef MJ_FILE_H
#define MJ_FILE_H

#include "base.h"

#include <stddef.h>
#include <sys/stat.h>

/* flags */
#define MJ_FILE_OPTIONAL 1u /* no such file is not an error: MJ_OK, *data NULL, *len 0        */
#define MJ_FILE_FOLLOW 2u   /* a path the caller named itself: a symbolic link is followed   */

/* mj_file_open's *err when what is there is not a regular file (*st says what it is). */
#define MJ_FILE_NOT_REGULAR (-1)

/* Open dirfd/name (dirfd AT_FDCWD: name is a path) for reading by the rule in file.c: the
 * descriptor, with the file's fstat in *st; or -1 with *err an errno value (ENOENT: nothing
 * there; ELOOP: a symbolic link, *st its lstat) or MJ_FILE_NOT_REGULAR (*st what is there).
 * Sets no error text: mj_file_open_error says it. */
int mj_file_open(int dirfd, const char *name, unsigned flags, struct stat *st, int *err);
/* The error for a failed mj_file_open, naming label: MJ_ERR_IO. */
mj_status mj_file_open_error(const char *label, int err, const struct stat *st);
/* Read the whole of fd (opened by mj_file_open, *st its fstat) into a malloc'd buffer,
 * NUL-terminated (*len excludes the NUL). A file larger than cap bytes is refused without
 * reading it; one that ends before its size is MJ_ERR_IO. */
mj_status mj_file_read_fd(int fd, const struct stat *st, const char *label, size_t cap, char **data,
                          size_t *len);
/* mj_file_open, then mj_file_read_fd: a whole file, errors naming label (NULL: name). */
mj_status mj_file_read(int dirfd, const char *name, const char *label, size_t cap, unsigned flags,
                       char **data, size_t *len);

#endif /* MJ_FILE_H */
