/* dl.h — loading a shared library moejit uses without linking it (base/dl.c): the CUDA
 * driver, NVRTC and NCCL are dlopen'd at run time, once per process, so the library works
 * on a machine without them and a missing one is a clear error. Not installed, not public. */
#ifndef MJ_DL_H
#define MJ_DL_H

#include "base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* One function pointer of a table: its exported name and its offset in the table. */
typedef struct mj_dl_sym {
    const char *name;
    size_t offset;
} mj_dl_sym;

/* What went wrong before a library's own checks, for a library that words it itself. */
typedef enum mj_dl_failure {
    MJ_DL_ENV_UNOPENABLE, /* $env names a file that cannot be opened (path: it)             */
    MJ_DL_NOT_FOUND,      /* no candidate loads (path: NULL)                                 */
    MJ_DL_NO_SYMBOL,      /* path loaded but lacks a symbol (detail: its name)               */
} mj_dl_failure;

/* A library: what to load and how to say it is missing, then the loader's state. Define one
 * static descriptor a library with designated initializers, the state's lock as
 * `.lock = PTHREAD_MUTEX_INITIALIZER` and the rest of the state left zero. */
typedef struct mj_dl_lib {
    const char *env;  /* "MOEJIT_NVRTC": when set, the one file to load (no fallback)        */
    const char *what; /* "NVRTC": names the library in messages                              */
    const char *hint; /* what to do, ending every message ("install ... or set ENV=...")     */
    /* The search, in order, when $env is unset: dlopen names or paths. "$VAR/rest" is $VAR's
     * value followed by /rest, skipped when $VAR is unset or empty. NULL-terminated, at
     * most 16. */
    const char *const *candidates;
    mj_status missing; /* the status when nothing loads: MJ_ERR_LIBRARY (0: that)           */
    /* The symbols every use needs, resolved into table (table_size bytes); a missing one
     * fails the load ("<what> library PATH has no symbol S ..."), the table zeroed. */
    const mj_dl_sym *syms;
    size_t n_syms;
    void *table;
    size_t table_size;
    /* Optional: the library's own checks once its symbols resolve (a version, optional
     * symbols). MJ_OK, or a failure status with the reason in err; the handle then stays
     * open (init may close it, and clear the table, itself). lib->path names the file. */
    mj_status (*init)(struct mj_dl_lib *lib, void *handle, char *err, size_t err_len);
    /* Optional: the messages for the failures above in the library's own words (the
     * generic ones otherwise). */
    void (*explain)(const struct mj_dl_lib *lib, mj_dl_failure f, const char *path, const char *detail,
                    char *err, size_t err_len);

    /* ---- the loader's state ---- */
    pthread_mutex_t lock;
    atomic_int done;
    mj_status status;
    char error[2048]; /* the failure, replayed into each caller's mj_last_error */
    char path[512];   /* the file loaded: $env or the candidate that loaded     */
} mj_dl_lib;

/* Load lib on the first call in the process (thread-safe: other callers wait for it) and
 * keep it loaded; every call returns the status of that one load, a failure with its text
 * set as the calling thread's error. */
mj_status mj_dl_load_once(mj_dl_lib *lib);
/* The same, setting no error text. */
mj_status mj_dl_status(mj_dl_lib *lib);

/* For init: resolve syms into table; NULL, or the first missing name (the table is then
 * zeroed). */
const char *mj_dl_resolve(void *handle, const mj_dl_sym *syms, size_t n, void *table, size_t table_size);
void mj_dl_close(void *handle);

#endif /* MJ_DL_H */
