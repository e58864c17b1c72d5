/* cuda_stub.c — a stand-in for libcuda.so.1 that tests load through MOEJIT_LIBCUDA, so the
 * host side of the CUDA path (contexts, module loads, the shared-memory opt-in, launches,
 * memory calls) is exercised on a machine without a GPU.
 *
 * One device: "moejit stub GPU", compute capability 12.0, 188 SMs, 101376 bytes of opt-in
 * shared memory. Device memory is host memory. Kernels do not run: a launch checks what the
 * real driver checks that we care about (a current context; dynamic shared memory within
 * what the function was allowed, 48 KiB unless raised with cuFuncSetAttribute) and appends a
 * line to $MJ_STUB_LOG. Calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when
 * the calling thread has none current, as the driver does. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum {
    OK = 0,
    INVALID_VALUE = 1,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    NOT_FOUND = 500,
};

typedef struct func {
    char name[256];
    int max_dyn_smem;
    struct func *next; /* the module's functions, freed with it */
} func;

typedef struct module {
    func *funcs;
} module;

static int g_init;
static int g_ctx_token = 1; /* the primary context: any non-NULL pointer */
static __thread void *g_current;

static void logf_(const char *fmt, ...) {
    const char *path = getenv("MJ_STUB_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static CUresult need_ctx(const char *call) {
    if (!g_init) return NOT_INITIALIZED;
    if (!g_current) {
        logf_("%s without a current context", call);
        return INVALID_CONTEXT;
    }
    return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
    *s = r == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" : r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_STUB";
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
    *s = r == INVALID_CONTEXT ? "invalid device context" : r == INVALID_VALUE ? "invalid argument" : "stub error";
    return OK;
}
CUresult cuInit(unsigned flags) {
    (void)flags;
    g_init = 1;
    return OK;
}
CUresult cuDriverGetVersion(int *v) {
    *v = 13000;
    return OK;
}
CUresult cuDeviceGetCount(int *n) {
    *n = g_init ? 1 : 0;
    return g_init ? OK : NOT_INITIALIZED;
}
CUresult cuDeviceGet(int *d, int ordinal) {
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    switch (attr) {
    case 16: *v = 188; break;          /* multiprocessors */
    case 38: *v = 128 << 20; break;    /* L2 bytes */
    case 75: *v = 12; break;           /* cc major */
    case 76: *v = 0; break;            /* cc minor */
    case 97: *v = 101376; break;       /* shared memory per block, opt-in */
    default: *v = 0;
    }
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, (size_t)len, "moejit stub GPU");
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev;
    *ctx = &g_ctx_token;
    return OK;
}
CUresult cuCtxSetCurrent(void *ctx) {
    g_current = ctx;
    return OK;
}
CUresult cuCtxGetCurrent(void **ctx) {
    *ctx = g_current;
    return OK;
}
CUresult cuCtxSynchronize(void) { return need_ctx("cuCtxSynchronize"); }
CUresult cuModuleLoadData(void **mod, const void *image) {
    CUresult r = need_ctx("cuModuleLoadData");
    if (r) return r;
    (void)image;
    *mod = calloc(1, sizeof(module));
    logf_("cuModuleLoadData");
    return OK;
}
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    module *m = mod;
    func *f = calloc(1, sizeof *f);
    f->next = m->funcs, m->funcs = f;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->max_dyn_smem = 48 * 1024;
    *fn = f;
    return OK;
}
CUresult cuModuleUnload(void *mod) {
    module *m = mod;
    while (m && m->funcs) {
        func *f = m->funcs;
        m->funcs = f->next;
        free(f);
    }
    free(m);
    return OK;
}
CUresult cuFuncSetAttribute(void *fn, int attr, int value) {
    func *f = fn;
    if (attr != 8) return INVALID_VALUE; /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    if (value > 101376) return INVALID_VALUE;
    f->max_dyn_smem = value;
    logf_("cuFuncSetAttribute %s max_dynamic_smem %d", f->name, value);
    return OK;
}
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *stream, void **params, void **extra) {
    (void)params, (void)extra, (void)stream;
    CUresult r = need_ctx("cuLaunchKernel");
    if (r) return r;
    func *f = fn;
    if ((int)smem > f->max_dyn_smem) {
        logf_("cuLaunchKernel %s smem %u over the allowed %d", f->name, smem, f->max_dyn_smem);
        return INVALID_VALUE;
    }
    logf_("cuLaunchKernel %s grid %u,%u,%u block %u,%u,%u smem %u", f->name, gx, gy, gz, bx, by, bz, smem);
    return OK;
}
CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes) {
    CUresult r = need_ctx("cuMemAlloc");
    if (r) return r;
    void *m = calloc(1, bytes ? bytes : 1);
    if (!m) return 2;
    *p = (unsigned long long)(size_t)m;
    return OK;
}
CUresult cuMemFree_v2(unsigned long long p) {
    CUresult r = need_ctx("cuMemFree");
    if (r) return r;
    free((void *)(size_t)p);
    return OK;
}
CUresult cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) {
    CUresult r = need_ctx("cuMemcpyHtoD");
    if (r) return r;
    memcpy((void *)(size_t)dst, src, n);
    return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) {
    CUresult r = need_ctx("cuMemcpyDtoH");
    if (r) return r;
    memcpy(dst, (const void *)(size_t)src, n);
    return OK;
}
