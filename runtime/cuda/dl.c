/* dl.c — the one loader of shared libraries moejit uses without linking them: the CUDA
 * driver, NVRTC and NCCL are dlopen'd at run time, so the library and `moejit prewarm
 * --arch` work on a machine without them, and a missing one is a clear error. */
#include "cuda/cudalibs.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

void *mj_dl_open(const char *const *candidates, int n, char *loaded, size_t loaded_len, char *err,
                 size_t err_len) {
    char tried[1024] = "", last[512] = "";
    for (int i = 0; i < n; i++) {
        if (!candidates[i] || !candidates[i][0]) continue;
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            if (loaded) snprintf(loaded, loaded_len, "%s", candidates[i]);
            return h;
        }
        const char *e = dlerror();
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", candidates[i]);
        snprintf(last, sizeof last, "%s", e ? e : "unknown error");
    }
    if (err) snprintf(err, err_len, "tried %s; last error: %s", tried[0] ? tried : "nothing", last);
    return NULL;
}

void *mj_dl_open_env(const char *env, const char *what, const char *hint, const char *const *candidates, int n,
                     char *loaded, size_t loaded_len, char *err, size_t err_len) {
    char why[1200];
    const char *path = getenv(env);
    if (path && *path) {
        void *h = mj_dl_open(&path, 1, loaded, loaded_len, why, sizeof why);
        if (!h) snprintf(err, err_len, "%s not loaded: %s=%s cannot be opened (%s): %s", what, env, path, why, hint);
        return h;
    }
    void *h = mj_dl_open(candidates, n, loaded, loaded_len, why, sizeof why);
    if (!h) snprintf(err, err_len, "%s not found (%s): %s", what, why, hint);
    return h;
}

const char *mj_dl_resolve(void *handle, const mj_dl_sym *syms, size_t n, void *table,
                          size_t table_size) {
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
