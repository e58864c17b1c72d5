/* dl.c — the one loader of the shared libraries moejit uses without linking them (the CUDA
 * driver, NVRTC, NCCL): the environment variable or the search, the symbol table, the
 * library's own checks, once per process, and the failure replayed to every caller.
 *
 * It lives in base/ because nothing in it is CUDA's: runtime/cuda (driver, NVRTC) and
 * runtime/comm (NCCL) both describe their library to it and reach it as a peer, instead of
 * the communicator reaching into the CUDA directory for its loader. */
#include "dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define MJ_DL_MAX_CANDIDATES 16

/* dlopen the first of candidates that loads (empty entries skipped); its name into loaded.
 * NULL when none loads, with "tried a, b; last error: ..." in err. */
static void *open_first(const char *const *candidates, int n, char *loaded, size_t loaded_len, char *err,
                        size_t err_len) {
    char tried[1024] = "", last[512] = "";
    for (int i = 0; i < n; i++) {
        if (!candidates[i] || !candidates[i][0]) continue;
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(loaded, loaded_len, "%s", candidates[i]);
            return h;
        }
        const char *e = dlerror();
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", candidates[i]);
        snprintf(last, sizeof last, "%s", e ? e : "unknown error");
    }
    snprintf(err, err_len, "tried %s; last error: %s", tried[0] ? tried : "nothing", last);
    return NULL;
}

/* "$VAR/rest" -> $VAR's value and /rest into buf ("" when $VAR is unset or empty); anything
 * else as it is. */
static const char *expand(const char *c, char *buf, size_t len) {
    if (c[0] != '$') return c;
    const char *slash = strchr(c, '/');
    size_t n = slash ? (size_t)(slash - c - 1) : strlen(c + 1);
    char name[64];
    if (n == 0 || n >= sizeof name) return "";
    memcpy(name, c + 1, n);
    name[n] = '\0';
    const char *v = getenv(name);
    if (!v || !*v) return "";
    snprintf(buf, len, "%s%s", v, slash ? slash : "");
    return buf;
}

static void explain(const mj_dl_lib *lib, mj_dl_failure f, const char *path, const char *detail, char *err,
                    size_t len) {
    if (lib->explain) {
        lib->explain(lib, f, path, detail, err, len);
        return;
    }
    switch (f) {
    case MJ_DL_ENV_UNOPENABLE:
        snprintf(err, len, "%s not loaded: %s=%s cannot be opened (%s): %s", lib->what, lib->env, path, detail,
                 lib->hint);
        break;
    case MJ_DL_NOT_FOUND:
        snprintf(err, len, "%s not found (%s): %s", lib->what, detail, lib->hint);
        break;
    case MJ_DL_NO_SYMBOL:
        snprintf(err, len, "%s library %s has no symbol %s (not %s, or too old): %s", lib->what, path, detail,
                 lib->what, lib->hint);
        break;
    }
}

static void load(mj_dl_lib *lib) {
    char why[1200];
    void *h;
    const char *env = lib->env ? getenv(lib->env) : NULL;
    if (env && *env) {
        /* An explicit choice is authoritative: no silent fallback to the search. */
        h = open_first(&env, 1, lib->path, sizeof lib->path, why, sizeof why);
        if (!h) explain(lib, MJ_DL_ENV_UNOPENABLE, env, why, lib->error, sizeof lib->error);
    } else {
        char bufs[MJ_DL_MAX_CANDIDATES][512];
        const char *cands[MJ_DL_MAX_CANDIDATES];
        int n = 0;
        for (; lib->candidates && lib->candidates[n] && n < MJ_DL_MAX_CANDIDATES; n++)
            cands[n] = expand(lib->candidates[n], bufs[n], sizeof bufs[n]);
        h = open_first(cands, n, lib->path, sizeof lib->path, why, sizeof why);
        if (!h) explain(lib, MJ_DL_NOT_FOUND, NULL, why, lib->error, sizeof lib->error);
    }
    if (!h) {
        lib->status = lib->missing != MJ_OK ? lib->missing : MJ_ERR_LIBRARY;
        return;
    }
    const char *missing = mj_dl_resolve(h, lib->syms, lib->n_syms, lib->table, lib->table_size);
    if (missing) {
        explain(lib, MJ_DL_NO_SYMBOL, lib->path, missing, lib->error, sizeof lib->error);
        lib->status = MJ_ERR_LIBRARY;
        mj_dl_close(h);
        return;
    }
    lib->status = lib->init ? lib->init(lib, h, lib->error, sizeof lib->error) : MJ_OK;
}

mj_status mj_dl_status(mj_dl_lib *lib) {
    if (!atomic_load_explicit(&lib->done, memory_order_acquire)) {
        pthread_mutex_lock(&lib->lock);
        if (!atomic_load_explicit(&lib->done, memory_order_relaxed)) {
            load(lib);
            atomic_store_explicit(&lib->done, 1, memory_order_release);
        }
        pthread_mutex_unlock(&lib->lock);
    }
    return lib->status;
}

mj_status mj_dl_load_once(mj_dl_lib *lib) {
    mj_status s = mj_dl_status(lib);
    if (s != MJ_OK) return mj_set_error(s, "%s", lib->error);
    return MJ_OK;
}

const char *mj_dl_resolve(void *handle, const mj_dl_sym *syms, size_t n, void *table, size_t table_size) {
    for (size_t i = 0; i < n; i++) {
        dlerror();
        void *p = dlsym(handle, syms[i].name);
        if (!p) {
            memset(table, 0, table_size);
            return syms[i].name;
        }
        memcpy((char *)table + syms[i].offset, &p, sizeof p);
    }
    return NULL;
}

void mj_dl_close(void *handle) {
    if (handle) dlclose(handle);
}
