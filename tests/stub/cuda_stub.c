/* cuda_stub.c — a stand-in for libcuda.so.1 that tests load through MOEJIT_LIBCUDA, so the
 * host side of the CUDA path (contexts, module loads, the shared-memory opt-in, launches,
 * memory calls, streams, events and CUDA graphs) is exercised on a machine without a GPU.
 *
 * One device: "moejit stub GPU", compute capability 12.0 (188 SMs, 101376 bytes of opt-in
 * shared memory), or 9.0 with MJ_STUB_CC=9.0 (132 SMs, 232448 bytes: an H200's). Device
 * memory is host memory. Kernels do not run: a launch checks what the real driver checks
 * that we care about (a current context; dynamic shared memory within what the function was
 * allowed, 48 KiB unless raised with cuFuncSetAttribute) and appends a line to $MJ_STUB_LOG.
 * Calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when the calling thread has
 * none current, as the driver does.
 *
 * Time: the stub keeps a device clock that only work advances, so timings are exact and a
 * test can check the arithmetic done on them: a kernel takes $MJ_STUB_KERNEL_US (10) µs, a
 * device-to-device copy of N bytes moves 2N bytes (read + written) at $MJ_STUB_COPY_GBPS
 * (1000) GB/s, a memset of N bytes writes N bytes at that rate. An event records the clock
 * when it is recorded (the stub runs everything at once, so every event has completed); both
 * are logged. L2: 128 MiB (60 MiB as sm_90).
 *
 * Graphs: cuStreamBeginCapture on a stream records what is enqueued on it (launches, async
 * copies, event records) instead of doing it; cuGraphLaunch of the instantiated graph does
 * it then, logging each launch again. While this thread captures (thread-local mode), the
 * calls the driver refuses during a capture — allocation, freeing, synchronous copies,
 * synchronizing the context or the capturing stream — fail with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture (cuStreamEndCapture then
 * fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). The stub is stricter than the driver in
 * one way: a launch or copy on another stream while this thread captures is refused too
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), because it would run outside the graph and a replay
 * would miss it. With MJ_STUB_FAIL_CAPTURED_LAUNCH set, every launch into a capture fails
 * (CUDA_ERROR_INVALID_VALUE) without breaking the capture: a caller's error path. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub_log.h"

typedef int CUresult;
enum {
    OK = 0,
    INVALID_VALUE = 1,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    CAPTURE_UNSUPPORTED = 900,
    CAPTURE_INVALIDATED = 901,
    CAPTURE_IMPLICIT = 906,
};

typedef struct func {
    char name[256];
    int max_dyn_smem;
    struct func *next; /* the module's functions, freed with it */
} func;

typedef struct module {
    func *funcs;
} module;

/* What a capture records, and a graph replays. */
typedef enum { NODE_KERNEL, NODE_COPY, NODE_EVENT } node_kind;
typedef struct node {
    node_kind kind;
    char line[400];            /* a kernel's log line                                       */
    void *dst;                 /* a copy: dst, its own copy of the bytes (a host source is
                                  read at capture time, as the driver's memcpy node does)    */
    const void *src;
    size_t bytes;
    int src_is_device;
    struct event *event;
} node;

typedef struct graph {
    node *nodes;
    int n, cap;
} graph;

typedef struct stream {
    int capturing;
    int invalid;               /* an unsafe call broke the capture                          */
    graph *g;
} stream;

typedef struct event {
    int recorded;
    double t_ns;
} event;

static int g_init;
static int g_ctx_token = 1; /* the primary context: any non-NULL pointer */
static __thread void *g_current;
static __thread stream *t_capture; /* the stream this thread is capturing, or NULL */
static pthread_mutex_t g_clock_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_clock_ns;
/* A synchronous cuMemcpyHtoD from pageable memory returns once the bytes are staged; the DMA
 * may still be in flight, ordered only with the legacy (NULL) stream. Set by such a copy,
 * cleared by what waits for the NULL stream (cuCtxSynchronize, cuStreamSynchronize(NULL), a
 * synchronous cuMemcpyDtoH); work enqueued on another stream meanwhile is logged as
 * "unordered". */
static int g_htod_in_flight;

static double env_num(const char *name, double dflt) {
    const char *v = getenv(name);
    double d = v && *v ? strtod(v, NULL) : 0;
    return d > 0 ? d : dflt;
}

static void advance(double ns) {
    pthread_mutex_lock(&g_clock_mu);
    g_clock_ns += ns;
    pthread_mutex_unlock(&g_clock_mu);
}

static double now_ns(void) {
    pthread_mutex_lock(&g_clock_mu);
    double t = g_clock_ns;
    pthread_mutex_unlock(&g_clock_mu);
    return t;
}

/* An event reached on its stream (directly or in a graph's replay): recorded now. */
static void event_fire(event *e) { e->recorded = 1, e->t_ns = now_ns(); }

/* 9.0 with MJ_STUB_CC=9.0 (or "90"), else 12.0. */
static int stub_sm(void) {
    const char *v = getenv("MJ_STUB_CC");
    if (v && (!strcmp(v, "9.0") || !strcmp(v, "90"))) return 90;
    return 120;
}
static int smem_optin(void) { return stub_sm() == 90 ? 232448 : 101376; }

static CUresult need_ctx(const char *call) {
    if (!g_init) return NOT_INITIALIZED;
    if (!g_current) {
        logf_("%s without a current context", call);
        return INVALID_CONTEXT;
    }
    return OK;
}

/* A call the driver refuses while this thread captures: refused, and the capture broken. */
static CUresult capture_unsafe(const char *call) {
    if (!t_capture) return OK;
    t_capture->invalid = 1;
    logf_("%s during a stream capture: refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)", call);
    return CAPTURE_UNSUPPORTED;
}

/* Work enqueued on stream s: recorded when s captures; refused when this thread captures
 * another stream (it would escape the graph); else done now (returns 0 and *record = 0). */
static CUresult enqueue(const char *call, void *s, int *record) {
    stream *st = s;
    *record = st && st->capturing;
    if (st && !*record && g_htod_in_flight && strcmp(call, "cuEventRecord"))
        logf_("unordered: %s on a non-blocking stream while a pageable cuMemcpyHtoD may still be in flight "
              "(synchronize first)", call);
    if (!*record && t_capture) {
        t_capture->invalid = 1;
        logf_("%s on another stream during a stream capture: refused (it would run outside the graph)", call);
        return CAPTURE_IMPLICIT;
    }
    return OK;
}

static node *graph_add(graph *g) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        node *v = realloc(g->nodes, sizeof *v * (size_t)cap);
        if (!v) return NULL;
        g->nodes = v, g->cap = cap;
    }
    node *n = &g->nodes[g->n++];
    memset(n, 0, sizeof *n);
    return n;
}

static void graph_free(graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].kind == NODE_COPY && !g->nodes[i].src_is_device) free((void *)g->nodes[i].src);
    free(g->nodes);
    free(g);
}

static void do_copy(void *dst, const void *src, size_t n, int d2d) {
    memcpy(dst, src, n);
    if (d2d) advance(2.0 * (double)n / env_num("MJ_STUB_COPY_GBPS", 1000.0));
}

static void run_kernel(const char *line) {
    logf_("%s", line);
    advance(1e3 * env_num("MJ_STUB_KERNEL_US", 10.0));
}

/* ---- the API ------------------------------------------------------------------------------ */

CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    case CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
    case CAPTURE_IMPLICIT: *s = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; break;
    default: *s = "CUDA_ERROR_STUB";
    }
    return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
    switch (r) {
    case INVALID_CONTEXT: *s = "invalid device context"; break;
    case INVALID_VALUE: *s = "invalid argument"; break;
    case INVALID_HANDLE: *s = "invalid resource handle"; break;
    case CAPTURE_UNSUPPORTED: *s = "operation not permitted when stream is capturing"; break;
    case CAPTURE_INVALIDATED: *s = "operation failed due to a previous error during capture"; break;
    case CAPTURE_IMPLICIT: *s = "work on another stream during a capture (stub)"; break;
    default: *s = "stub error";
    }
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
    const int sm = stub_sm();
    switch (attr) {
    case 16: *v = sm == 90 ? 132 : 188; break;             /* multiprocessors */
    case 38: *v = sm == 90 ? 60 << 20 : 128 << 20; break;  /* L2 bytes */
    case 75: *v = sm / 10; break;                          /* cc major */
    case 76: *v = sm % 10; break;                          /* cc minor */
    case 97: *v = smem_optin(); break;                     /* shared memory per block, opt-in */
    default: *v = 0;
    }
    return OK;
}
/* "moejit stub GPU", or $MJ_STUB_NAME (a GPU's name as a driver gives it). */
CUresult cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    const char *v = getenv("MJ_STUB_NAME");
    snprintf(name, (size_t)len, "%s", v && *v ? v : "moejit stub GPU");
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
CUresult cuCtxSynchronize(void) {
    CUresult r = need_ctx("cuCtxSynchronize");
    if (!r && !t_capture) g_htod_in_flight = 0;
    return r ? r : capture_unsafe("cuCtxSynchronize");
}
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
    if (value > smem_optin()) return INVALID_VALUE;
    f->max_dyn_smem = value;
    logf_("cuFuncSetAttribute %s max_dynamic_smem %d", f->name, value);
    return OK;
}
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *s, void **params, void **extra) {
    (void)params, (void)extra;
    CUresult r = need_ctx("cuLaunchKernel");
    if (r) return r;
    func *f = fn;
    if ((int)smem > f->max_dyn_smem) {
        logf_("cuLaunchKernel %s smem %u over the allowed %d", f->name, smem, f->max_dyn_smem);
        return INVALID_VALUE;
    }
    int record;
    if ((r = enqueue("cuLaunchKernel", s, &record))) return r;
    char line[400];
    snprintf(line, sizeof line, "cuLaunchKernel %s grid %u,%u,%u block %u,%u,%u smem %u", f->name, gx, gy, gz, bx,
             by, bz, smem);
    if (record && getenv("MJ_STUB_FAIL_CAPTURED_LAUNCH")) { /* a fault: the caller's error path */
        logf_("cuLaunchKernel %s during a capture: failed (MJ_STUB_FAIL_CAPTURED_LAUNCH)", f->name);
        return INVALID_VALUE;
    }
    if (record) {
        node *n = graph_add(((stream *)s)->g);
        if (!n) return 2;
        n->kind = NODE_KERNEL;
        snprintf(n->line, sizeof n->line, "%s", line);
        logf_("captured %s", line);
        return OK;
    }
    run_kernel(line);
    return OK;
}
/* cuLaunchKernelEx: the one attribute moejit sets, programmatic stream serialization (id 6,
 * value 1), logged; anything else refused. Then a launch as cuLaunchKernel's. */
typedef struct {
    int id;
    char pad[4];
    union {
        char pad[64];
        int value;
    } v;
} stub_launch_attr;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream;
    stub_launch_attr *attrs;
    unsigned n_attrs;
} stub_launch_config;
CUresult cuLaunchKernelEx(const stub_launch_config *c, void *fn, void **params, void **extra) {
    if (!c || !fn) return INVALID_VALUE;
    for (unsigned i = 0; i < c->n_attrs; i++) {
        if (c->attrs[i].id != 6 || c->attrs[i].v.value != 1) {
            logf_("cuLaunchKernelEx %s: attribute %d = %d refused", ((func *)fn)->name, c->attrs[i].id,
                  c->attrs[i].v.value);
            return INVALID_VALUE;
        }
        logf_("cuLaunchKernelEx %s pdl", ((func *)fn)->name);
    }
    return cuLaunchKernel(fn, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params, extra);
}
CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes) {
    CUresult r = need_ctx("cuMemAlloc");
    if (r || (r = capture_unsafe("cuMemAlloc"))) return r;
    void *m = calloc(1, bytes ? bytes : 1);
    if (!m) return 2;
    *p = (unsigned long long)(size_t)m;
    return OK;
}
CUresult cuMemFree_v2(unsigned long long p) {
    CUresult r = need_ctx("cuMemFree");
    if (r || (r = capture_unsafe("cuMemFree"))) return r;
    free((void *)(size_t)p);
    return OK;
}
CUresult cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) {
    CUresult r = need_ctx("cuMemcpyHtoD");
    if (r || (r = capture_unsafe("cuMemcpyHtoD"))) return r;
    do_copy((void *)(size_t)dst, src, n, 0);
    g_htod_in_flight = 1;
    return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) {
    CUresult r = need_ctx("cuMemcpyDtoH");
    if (r || (r = capture_unsafe("cuMemcpyDtoH"))) return r;
    do_copy(dst, (const void *)(size_t)src, n, 0);
    g_htod_in_flight = 0; /* it waits for the NULL stream */
    return OK;
}
CUresult cuMemcpyDtoD_v2(unsigned long long dst, unsigned long long src, size_t n) {
    CUresult r = need_ctx("cuMemcpyDtoD");
    if (r || (r = capture_unsafe("cuMemcpyDtoD"))) return r;
    do_copy((void *)(size_t)dst, (const void *)(size_t)src, n, 1);
    return OK;
}

/* An async copy: recorded into a capturing stream, else done now. */
static CUresult copy_async(const char *call, void *dst, const void *src, size_t n, int d2d, void *s) {
    CUresult r = need_ctx(call);
    int record;
    if (r || (r = enqueue(call, s, &record))) return r;
    if (!record) {
        do_copy(dst, src, n, d2d);
        return OK;
    }
    node *nd = graph_add(((stream *)s)->g);
    if (!nd) return 2;
    nd->kind = NODE_COPY, nd->dst = dst, nd->bytes = n, nd->src_is_device = d2d;
    if (d2d) {
        nd->src = src;
    } else { /* the host bytes as they are now */
        void *copy = malloc(n ? n : 1);
        if (!copy) return 2;
        memcpy(copy, src, n);
        nd->src = copy;
    }
    return OK;
}
CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s) {
    return copy_async("cuMemcpyHtoDAsync", (void *)(size_t)dst, src, n, 0, s);
}
CUresult cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void *s) {
    return copy_async("cuMemcpyDtoDAsync", (void *)(size_t)dst, (const void *)(size_t)src, n, 1, s);
}

/* A memset on a stream: writes N bytes at $MJ_STUB_COPY_GBPS on the clock; logged with its
 * size (what a test of an L2 flush looks for). Not recorded into a capture (not modelled).
 * Above 16 MiB the bytes are not written (an L2 flush's buffer, which nothing reads: writing
 * hundreds of MiB per timed call would cost the tests seconds). */
CUresult cuMemsetD8Async(unsigned long long dst, unsigned char v, size_t n, void *s) {
    CUresult r = need_ctx("cuMemsetD8Async");
    int record;
    if (r || (r = enqueue("cuMemsetD8Async", s, &record))) return r;
    if (record) return INVALID_VALUE;
    if (n <= ((size_t)16 << 20)) memset((void *)(size_t)dst, v, n);
    advance((double)n / env_num("MJ_STUB_COPY_GBPS", 1000.0));
    logf_("cuMemsetD8Async %zu bytes", n);
    return OK;
}

/* ---- streams and events ---- */
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    CUresult r = need_ctx("cuStreamCreate");
    if (r) return r;
    *s = calloc(1, sizeof(stream));
    return *s ? OK : 2;
}
CUresult cuStreamDestroy_v2(void *s) {
    stream *st = s;
    if (st && st->capturing) return INVALID_VALUE;
    free(st);
    return OK;
}
CUresult cuStreamSynchronize(void *s) {
    CUresult r = need_ctx("cuStreamSynchronize");
    if (r) return r;
    stream *st = s;
    if (st && st->capturing) {
        st->invalid = 1;
        logf_("cuStreamSynchronize of a capturing stream: refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)");
        return CAPTURE_UNSUPPORTED;
    }
    if (!st) g_htod_in_flight = 0;
    return OK;
}
CUresult cuEventCreate(void **e, unsigned flags) {
    (void)flags;
    CUresult r = need_ctx("cuEventCreate");
    if (r) return r;
    *e = calloc(1, sizeof(event));
    return *e ? OK : 2;
}
CUresult cuEventDestroy_v2(void *e) {
    free(e);
    return OK;
}
CUresult cuEventRecord(void *e, void *s) {
    CUresult r = need_ctx("cuEventRecord");
    int record;
    if (r || (r = enqueue("cuEventRecord", s, &record))) return r;
    if (!e) return INVALID_HANDLE;
    if (record) {
        node *n = graph_add(((stream *)s)->g);
        if (!n) return 2;
        n->kind = NODE_EVENT, n->event = e;
        return OK;
    }
    event_fire(e);
    logf_("cuEventRecord %p", e);
    return OK;
}
CUresult cuEventSynchronize(void *e) {
    CUresult r = need_ctx("cuEventSynchronize");
    if (r || (r = capture_unsafe("cuEventSynchronize"))) return r;
    return e ? OK : INVALID_HANDLE;
}
CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    event *a = start, *b = end;
    if (!a || !b || !a->recorded || !b->recorded) return INVALID_HANDLE;
    *ms = (float)((b->t_ns - a->t_ns) / 1e6);
    return OK;
}

/* ---- graphs ---- */
CUresult cuStreamBeginCapture_v2(void *s, int mode) {
    (void)mode;
    stream *st = s;
    if (!st || st->capturing || t_capture) return INVALID_VALUE;
    if (!(st->g = calloc(1, sizeof(graph)))) return 2;
    st->capturing = 1, st->invalid = 0;
    t_capture = st;
    logf_("cuStreamBeginCapture");
    return OK;
}
CUresult cuStreamEndCapture(void *s, void **out) {
    stream *st = s;
    if (!st || !st->capturing) return INVALID_VALUE;
    st->capturing = 0;
    if (t_capture == st) t_capture = NULL;
    graph *g = st->g;
    st->g = NULL;
    if (st->invalid) {
        graph_free(g);
        *out = NULL;
        logf_("cuStreamEndCapture: invalidated");
        return CAPTURE_INVALIDATED;
    }
    logf_("cuStreamEndCapture: %d nodes", g->n);
    *out = g;
    return OK;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
    (void)flags;
    graph *src = g, *e = calloc(1, sizeof *e);
    if (!src || !e) return src ? 2 : INVALID_VALUE;
    e->n = e->cap = src->n;
    e->nodes = malloc(sizeof *e->nodes * (size_t)(src->n ? src->n : 1));
    if (!e->nodes) return free(e), 2;
    for (int i = 0; i < src->n; i++) {
        e->nodes[i] = src->nodes[i];
        if (src->nodes[i].kind == NODE_COPY && !src->nodes[i].src_is_device) {
            void *copy = malloc(src->nodes[i].bytes ? src->nodes[i].bytes : 1);
            if (!copy) return 2;
            memcpy(copy, src->nodes[i].src, src->nodes[i].bytes);
            e->nodes[i].src = copy;
        }
    }
    *exec = e;
    return OK;
}
CUresult cuGraphLaunch(void *exec, void *s) {
    CUresult r = need_ctx("cuGraphLaunch");
    int record;
    if (r || (r = enqueue("cuGraphLaunch", s, &record))) return r;
    graph *e = exec;
    if (!e) return INVALID_VALUE;
    if (record) return INVALID_VALUE; /* a graph launched into a capture: not modelled */
    logf_("cuGraphLaunch: %d nodes", e->n);
    for (int i = 0; i < e->n; i++) {
        node *n = &e->nodes[i];
        if (n->kind == NODE_KERNEL) run_kernel(n->line);
        else if (n->kind == NODE_COPY) do_copy(n->dst, n->src, n->bytes, n->src_is_device);
        else event_fire(n->event);
    }
    return OK;
}
CUresult cuGraphDestroy(void *g) {
    graph_free(g);
    return OK;
}
CUresult cuGraphExecDestroy(void *e) {
    graph_free(e);
    return OK;
}
