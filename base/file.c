/* file.c — reading a whole file, by one rule.
 *
 * The rule, for every file moejit reads whole (a model's config and quantization JSON, a
 * checkpoint's JSON files, kernel cache entries and their totals, the interpreter's compiled
 * kernels, the templates gen/reflect reads at build time):
 *
 *   - Only a regular file is read. What is at the name is looked at before it is opened, and
 *     a FIFO, socket, device or directory is refused unopened; the open is O_NONBLOCK and
 *     the opened file is checked again (fstat), so one swapped in meanwhile is refused too
 *     and never blocks the reader (a FIFO with no writer would block a plain open forever).
 *
 *   - A symbolic link is never followed where moejit finds the name itself: an entry or the
 *     totals in the kernel cache, a file in a checkpoint directory (config.json,
 *     hf_quant_config.json, the index, the shards), a file in a temporary directory moejit
 *     made. The caller did not choose such a link, someone put it there: it is refused
 *     (O_NOFOLLOW), and the message says to use the file itself.
 *
 *   - A path the caller names itself is the caller's choice, and a link there is followed
 *     (MJ_FILE_FOLLOW), as `cat` would: the config.json and quantization file given to
 *     mj_moe_config_read and mj_checkpoint_make (`--config`, `--quant`), and the files named
 *     on gen/reflect's command line. Such files are often links — a Hugging Face cache's
 *     snapshots/REV/config.json is a link into blobs/, and `moejit prewarm --config` on it
 *     must work. What the link leads to must still be a regular file.
 *
 *   - Every read has a size cap, the caller's (64 MiB for a JSON config, ...): a larger file
 *     is refused before any of it is read, naming its size and the cap.
 *
 * Errors are MJ_ERR_IO (MJ_ERR_NOMEM for memory), naming the file and what is wrong with it. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int mj_file_open(int dirfd, const char *name, unsigned flags, struct stat *st, int *err) {
    const int follow = (flags & MJ_FILE_FOLLOW) != 0;
    memset(st, 0, sizeof *st);
    /* What is there, before anything is opened: a FIFO or a device is refused unopened. */
    if (fstatat(dirfd, name, st, follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0) {
        *err = errno;
        if (*err == ELOOP) memset(st, 0, sizeof *st); /* a loop of links when following */
        return -1;
    }
    if (S_ISLNK(st->st_mode)) return *err = ELOOP, -1;
    if (!S_ISREG(st->st_mode)) return *err = MJ_FILE_NOT_REGULAR, -1;
    int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        /* Swapped since the look: say what is there now (a link, a socket: ENXIO). */
        int e = errno;
        struct stat now;
        if ((e == ELOOP || e == ENXIO) && fstatat(dirfd, name, &now, follow ? 0 : AT_SYMLINK_NOFOLLOW) == 0) {
            *st = now;
            e = S_ISLNK(now.st_mode) ? ELOOP : MJ_FILE_NOT_REGULAR;
        } else {
            memset(st, 0, sizeof *st);
        }
        *err = e;
        return -1;
    }
    if (fstat(fd, st) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return *err = MJ_FILE_NOT_REGULAR, -1;
    }
    *err = 0;
    return fd;
}

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISDIR(m)  ? "a directory"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a file";
}

mj_status mj_file_open_error(const char *label, int err, const struct stat *st) {
    if (err == ELOOP && S_ISLNK(st->st_mode))
        return mj_set_error(MJ_ERR_IO, "%s is a symbolic link: refused (a link moejit finds is never "
                            "followed: put the file itself there)", label);
    if (err == MJ_FILE_NOT_REGULAR)
        return mj_set_error(MJ_ERR_IO, "%s is not a regular file (%s): refused", label, kind_of(st->st_mode));
    return mj_set_error(MJ_ERR_IO, "cannot open %s: %s", label, strerror(err));
}

/* "64 MiB", "16 KiB", "1000 bytes" */
static void size_text(size_t n, char *buf, size_t len) {
    if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0) snprintf(buf, len, "%zu KiB", n >> 10);
    else snprintf(buf, len, "%zu bytes", n);
}

mj_status mj_file_read_fd(int fd, const struct stat *st, const char *label, size_t cap, char **data,
                          size_t *len) {
    *data = NULL;
    *len = 0;
    if (st->st_size < 0 || (uint64_t)st->st_size > cap) {
        char limit[48];
        size_text(cap, limit, sizeof limit);
        return mj_set_error(MJ_ERR_IO, "%s is %lld bytes, more than the %s limit for this file: is it the right "
                            "file?", label, (long long)st->st_size, limit);
    }
    size_t n = (size_t)st->st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) return mj_set_error(MJ_ERR_NOMEM, "out of memory reading %s (%zu bytes)", label, n);
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return mj_set_error(MJ_ERR_IO, "cannot read %s: %s", label, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got != n) {
        free(buf);
        return mj_set_error(MJ_ERR_IO, "cannot read %s: it ended at byte %zu of %zu (it changed size while being "
                            "read)", label, got, n);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MJ_OK;
}

mj_status mj_file_read(int dirfd, const char *name, const char *label, size_t cap, unsigned flags,
                       char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    if (!label) label = name;
    struct stat st;
    int err;
    int fd = mj_file_open(dirfd, name, flags, &st, &err);
    if (fd < 0) {
        if (err == ENOENT && (flags & MJ_FILE_OPTIONAL)) return MJ_OK;
        return mj_file_open_error(label, err, &st);
    }
    mj_status s = mj_file_read_fd(fd, &st, label, cap, data, len);
    close(fd);
    return s;
}
