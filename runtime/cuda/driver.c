/* driver.c — the CUDA driver API, dlopen'd from libcuda.so.1 at run time (never linked, and
 * never the toolkit's stub in lib64/stubs): devices, modules, launches, the few memory
 * calls tests and tools need, and streams, events and CUDA graphs (for timing and graph
 * capture: `moejit bench`, the GPU tests).
 *
 * Contexts: each device's primary context is retained once, on first use, and kept for the
 * life of the process (as the CUDA runtime does), so device memory never disappears under
 * a caller when its last module is unloaded. mj_cuda_bind and mj_cuda_module_load make it
 * current on the calling thread; memory calls, launches and synchronize act in the calling
 * thread's current context. */
#include "cuda/cudalibs.h"
#include "dl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- the few driver types used (cuda.h, not included) -------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};
/* cuLaunchKernelEx's configuration, as cuda.h lays it out (CUlaunchAttribute: an id, padding
 * to 8, a union of 64 bytes; CUlaunchConfig: six dimensions, the shared memory, the stream,
 * the attributes and their count): the sizes and offsets of CUDA 12 and 13's cuda.h. */
typedef struct mj_cu_launch_attr {
    int id;
    char pad[4];
    union {
        char pad[64];
        int programmatic_stream_serialization;
    } value;
} mj_cu_launch_attr;
typedef struct mj_cu_launch_config {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem;
    CUstream stream;
    mj_cu_launch_attr *attrs;
    unsigned n_attrs;
} mj_cu_launch_config;
_Static_assert(sizeof(mj_cu_launch_attr) == 72, "CUlaunchAttribute is 72 bytes");
_Static_assert(sizeof(mj_cu_launch_config) == 56, "CUlaunchConfig is 56 bytes");
_Static_assert(offsetof(mj_cu_launch_attr, value) == 8, "CUlaunchAttribute::value at 8");
_Static_assert(offsetof(mj_cu_launch_config, stream) == 32 && offsetof(mj_cu_launch_config, attrs) == 40 &&
                   offsetof(mj_cu_launch_config, n_attrs) == 48,
               "CUlaunchConfig: hStream at 32, attrs at 40, numAttrs at 48");

static struct {
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSynchronize)(void);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
} cu;

/* The exported names: the versioned ones where cuda.h (CUDA 13) maps the plain name to a
 * _v2 (cuMemAlloc, cuMemFree, cuMemcpyHtoD/DtoH); the others have never been versioned.
 * The per-thread-default-stream variants (_ptds/_ptsz) are deliberately not used. */
static const mj_dl_sym k_syms[] = {
#define SYM(f, sym) {sym, offsetof(__typeof__(cu), f)}
    SYM(GetErrorName, "cuGetErrorName"),
    SYM(GetErrorString, "cuGetErrorString"),
    SYM(Init, "cuInit"),
    SYM(DriverGetVersion, "cuDriverGetVersion"),
    SYM(DeviceGetCount, "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet"),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(DeviceGetName, "cuDeviceGetName"),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    SYM(CtxGetCurrent, "cuCtxGetCurrent"),
    SYM(CtxSynchronize, "cuCtxSynchronize"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(FuncSetAttribute, "cuFuncSetAttribute"),
    SYM(LaunchKernel, "cuLaunchKernel"),
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemcpyHtoD, "cuMemcpyHtoD_v2"),
    SYM(MemcpyDtoH, "cuMemcpyDtoH_v2"),
#undef SYM
};

/* Streams, events and graphs: resolved apart, so that a driver without them (or a stand-in)
 * still runs kernels. Each entry lists its exported names, newest first: CUDA 12.8 made
 * cuEventElapsedTime a macro for cuEventElapsedTime_v2, older drivers have only the first. */
static struct {
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*GraphExecDestroy)(CUgraphExec);
} cx;
/* cuLaunchKernelEx (CUDA 12+): resolved on its own; without it, launches are plain ones. */
static CUresult (*g_launch_ex)(const mj_cu_launch_config *, CUfunction, void **, void **);

static const struct {
    const char *names[2];
    size_t offset;
} k_ext_syms[] = {
#define SYM(f, a, b) {{a, b}, offsetof(__typeof__(cx), f)}
    SYM(StreamCreate, "cuStreamCreate", NULL),
    SYM(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy"),
    SYM(StreamSynchronize, "cuStreamSynchronize", NULL),
    SYM(MemcpyDtoD, "cuMemcpyDtoD_v2", NULL),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL),
    SYM(MemsetD8Async, "cuMemsetD8Async", NULL),
    SYM(EventCreate, "cuEventCreate", NULL),
    SYM(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy"),
    SYM(EventRecord, "cuEventRecord", NULL),
    SYM(EventSynchronize, "cuEventSynchronize", NULL),
    SYM(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    SYM(StreamBeginCapture, "cuStreamBeginCapture_v2", NULL),
    SYM(StreamEndCapture, "cuStreamEndCapture", NULL),
    SYM(GraphInstantiate, "cuGraphInstantiateWithFlags", NULL),
    SYM(GraphLaunch, "cuGraphLaunch", NULL),
    SYM(GraphDestroy, "cuGraphDestroy", NULL),
    SYM(GraphExecDestroy, "cuGraphExecDestroy", NULL),
#undef SYM
};
static const char *g_ext_missing; /* the first of them the driver lacks, or NULL          */
static int g_driver_version;

#define MJ_NO_DRIVER_HINT "moejit can still compile with --arch"
#define MJ_MAX_DEVICES 64

static int g_n_devices;
static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_ctx[MJ_MAX_DEVICES];

struct mj_cuda_module {
    CUmodule mod;
    CUcontext ctx;
    int ordinal;
};

/* Names for when the driver cannot name its own errors (the toolkit's stub answers every
 * call, cuGetErrorName included, with CUDA_ERROR_STUB_LIBRARY). */
static const struct {
    CUresult r;
    const char *name, *text;
} k_errors[] = {
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "the API call requires a newer CUDA driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" */
static void describe(CUresult r, char *buf, size_t len) {
    const char *name = NULL, *text = NULL;
    if (!cu.GetErrorName || cu.GetErrorName(r, &name) != CUDA_SUCCESS || !name) name = NULL;
    if (!cu.GetErrorString || cu.GetErrorString(r, &text) != CUDA_SUCCESS || !text) text = NULL;
    if (!name)
        for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
            if (k_errors[i].r == r) {
                name = k_errors[i].name;
                text = k_errors[i].text;
            }
    if (name)
        snprintf(buf, len, "%s (%s)", name, text ? text : "no description");
    else
        snprintf(buf, len, "CUresult %d", (int)r);
}

/* A failed driver call -> MJ_ERR_CUDA naming the call and the error. */
static mj_status cuda_fail(CUresult r, const char *what) {
    char d[256];
    describe(r, d, sizeof d);
    return mj_set_error(MJ_ERR_CUDA, "%s failed: %s%s", what, d,
                        r == CUDA_ERROR_INVALID_CONTEXT
                            ? "; no CUDA context on this thread: call mj_cuda_bind (or "
                              "mj_cuda_module_load) on it first"
                            : "");
}

/* The driver's own words for not being there: "no CUDA driver" leads (callers and tests
 * look for it), and the hint says compiling still works. */
static void driver_explain(const mj_dl_lib *lib, mj_dl_failure f, const char *path, const char *detail, char *err,
                           size_t len) {
    (void)lib;
    if (f == MJ_DL_ENV_UNOPENABLE)
        snprintf(err, len, "no CUDA driver (MOEJIT_LIBCUDA=%s cannot be opened: %s): " MJ_NO_DRIVER_HINT, path,
                 detail);
    else if (f == MJ_DL_NOT_FOUND)
        snprintf(err, len, "no CUDA driver (libcuda.so.1 not found: %s): " MJ_NO_DRIVER_HINT, detail);
    else
        snprintf(err, len,
                 "the CUDA driver %s has no symbol %s: it is too old for moejit or not the "
                 "driver (update the NVIDIA driver, or set MOEJIT_LIBCUDA=/path/to/libcuda.so.1)",
                 path, detail);
}

/* Once the symbols resolve: the optional ones, cuInit, the devices. */
static mj_status driver_init(mj_dl_lib *lib, void *h, char *err, size_t err_len) {
    (void)lib;
    for (size_t i = 0; i < sizeof k_ext_syms / sizeof k_ext_syms[0] && !g_ext_missing; i++) {
        const char *miss = k_ext_syms[i].names[0];
        for (int a = 0; a < 2 && miss; a++) {
            /* One name into one slot: a failed mj_dl_resolve zeroes the table it is given,
             * so it must not be given cx (the entries found so far would go). */
            void *slot = NULL;
            const mj_dl_sym one = {k_ext_syms[i].names[a], 0};
            if (one.name && !mj_dl_resolve(h, &one, 1, &slot, sizeof slot)) {
                memcpy((char *)&cx + k_ext_syms[i].offset, &slot, sizeof slot);
                miss = NULL;
            }
        }
        if (miss) g_ext_missing = miss;
    }
    if (g_ext_missing) memset(&cx, 0, sizeof cx); /* all or none                          */
    {
        void *slot = NULL;
        const mj_dl_sym ex = {"cuLaunchKernelEx", 0};
        if (!mj_dl_resolve(h, &ex, 1, &slot, sizeof slot)) memcpy(&g_launch_ex, &slot, sizeof slot);
    }
    CUresult r = cu.Init(0);
    if (r != CUDA_SUCCESS) {
        char d[256];
        describe(r, d, sizeof d);
        snprintf(err, err_len, "cuInit failed: %s: " MJ_NO_DRIVER_HINT, d);
        return MJ_ERR_NO_DEVICE;
    }
    int n = 0;
    r = cu.DeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        char d[256] = "0 devices";
        if (r != CUDA_SUCCESS) describe(r, d, sizeof d);
        snprintf(err, err_len, "no CUDA device (cuDeviceGetCount: %s): " MJ_NO_DRIVER_HINT, d);
        return MJ_ERR_NO_DEVICE;
    }
    g_n_devices = n;
    if (cu.DriverGetVersion(&g_driver_version) != CUDA_SUCCESS) g_driver_version = 0;
    return MJ_OK;
}

/* libcuda.so.1 only: never the toolkit's stub in lib64/stubs, which answers every call
 * with CUDA_ERROR_STUB_LIBRARY. */
static const char *const k_candidates[] = {"libcuda.so.1", NULL};

static mj_dl_lib g_lib = {
    .env = "MOEJIT_LIBCUDA",
    .what = "the CUDA driver",
    .hint = MJ_NO_DRIVER_HINT,
    .candidates = k_candidates,
    .missing = MJ_ERR_NO_DEVICE,
    .syms = k_syms,
    .n_syms = sizeof k_syms / sizeof k_syms[0],
    .table = &cu,
    .table_size = sizeof cu,
    .init = driver_init,
    .explain = driver_explain,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

mj_status mj_cuda_load(void) { return mj_dl_load_once(&g_lib); }

mj_status mj_cuda_device_count(int *n) {
    if (!n) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_device_count: n is NULL");
    *n = 0;
    MJ_CHECK(mj_cuda_load());
    *n = g_n_devices;
    return MJ_OK;
}

static mj_status check_ordinal(int ordinal) {
    if (ordinal < 0 || ordinal >= g_n_devices || ordinal >= MJ_MAX_DEVICES)
        return mj_set_error(MJ_ERR_INVALID_ARG, "CUDA device %d does not exist (%d device%s)",
                            ordinal, g_n_devices, g_n_devices == 1 ? "" : "s");
    return MJ_OK;
}

mj_status mj_cuda_device_info(int ordinal, mj_device_info *out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_device_info: out is NULL");
    memset(out, 0, sizeof *out);
    out->ordinal = ordinal;
    out->target = MJ_TARGET_COUNT;
    MJ_CHECK(mj_cuda_load());
    MJ_CHECK(check_ordinal(ordinal));
    CUdevice dev;
    CUresult r = cu.DeviceGet(&dev, ordinal);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuDeviceGet");
    r = cu.DeviceGetName(out->name, (int)sizeof out->name, dev);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuDeviceGetName");
    out->name[sizeof out->name - 1] = '\0';
    static const struct {
        int attr;
        size_t offset;
        const char *what;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, offsetof(mj_device_info, cc_major),
         "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, offsetof(mj_device_info, cc_minor),
         "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)"},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, offsetof(mj_device_info, sm_count),
         "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
         offsetof(mj_device_info, smem_per_block_optin),
         "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)"},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, offsetof(mj_device_info, l2_bytes),
         "cuDeviceGetAttribute(L2_CACHE_SIZE)"},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int v = 0;
        r = cu.DeviceGetAttribute(&v, attrs[i].attr, dev);
        if (r != CUDA_SUCCESS) return cuda_fail(r, attrs[i].what);
        memcpy((char *)out + attrs[i].offset, &v, sizeof v);
    }
    /* An unsupported capability still describes the device; only the target is missing. */
    if (mj_target_from_cc(out->cc_major, out->cc_minor, &out->target) != MJ_OK) {
        out->target = MJ_TARGET_COUNT;
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "CUDA device %d (%s) has compute capability %d.%d, which moejit does "
                            "not target (supported: 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 10.3, 12.0, 12.1)",
                            ordinal, out->name, out->cc_major, out->cc_minor);
    }
    return MJ_OK;
}

/* Retain (once) and bind device ordinal's primary context on this thread. */
static mj_status bind_ctx(int ordinal, CUcontext *ctx_out) {
    MJ_CHECK(mj_cuda_load());
    MJ_CHECK(check_ordinal(ordinal));
    pthread_mutex_lock(&g_ctx_lock);
    CUcontext ctx = g_ctx[ordinal];
    CUresult r = CUDA_SUCCESS;
    const char *what = NULL;
    if (!ctx) {
        CUdevice dev;
        r = cu.DeviceGet(&dev, ordinal);
        what = "cuDeviceGet";
        if (r == CUDA_SUCCESS) {
            r = cu.DevicePrimaryCtxRetain(&ctx, dev);
            what = "cuDevicePrimaryCtxRetain";
        }
        if (r == CUDA_SUCCESS) g_ctx[ordinal] = ctx;
    }
    pthread_mutex_unlock(&g_ctx_lock);
    if (r != CUDA_SUCCESS) return cuda_fail(r, what);
    r = cu.CtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuCtxSetCurrent");
    if (ctx_out) *ctx_out = ctx;
    return MJ_OK;
}

mj_status mj_cuda_bind(int ordinal) { return bind_ctx(ordinal, NULL); }

mj_status mj_cuda_module_load(int ordinal, const void *cubin, size_t len, mj_cuda_module **out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_module_load: out is NULL");
    *out = NULL;
    if (!cubin || len == 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_module_load: empty cubin");
    CUcontext ctx = NULL;
    MJ_CHECK(bind_ctx(ordinal, &ctx));
    mj_cuda_module *m = calloc(1, sizeof *m);
    if (!m) return mj_set_error(MJ_ERR_NOMEM, "out of memory for a CUDA module");
    /* The cubin is an ELF image that carries its own size; the driver copies it. */
    CUresult r = cu.ModuleLoadData(&m->mod, cubin);
    if (r != CUDA_SUCCESS) {
        free(m);
        char what[64];
        snprintf(what, sizeof what, "cuModuleLoadData (device %d)", ordinal);
        return cuda_fail(r, what);
    }
    m->ctx = ctx;
    m->ordinal = ordinal;
    *out = m;
    return MJ_OK;
}

mj_status mj_cuda_module_function(mj_cuda_module *m, const char *name, mj_cuda_function *out) {
    if (!m || !name || !out)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_module_function: NULL argument");
    *out = NULL;
    MJ_CHECK(mj_cuda_load());
    CUfunction f = NULL;
    CUresult r = cu.ModuleGetFunction(&f, m->mod, name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return mj_set_error(MJ_ERR_CUDA,
                            "kernel '%s' is not in the module (cuModuleGetFunction: "
                            "CUDA_ERROR_NOT_FOUND); is it extern \"C\"?",
                            name);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuModuleGetFunction");
    *out = (mj_cuda_function)f;
    return MJ_OK;
}

mj_status mj_cuda_set_max_dynamic_smem(mj_cuda_function f, int bytes) {
    if (!f || bytes < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_set_max_dynamic_smem: bad argument");
    MJ_CHECK(mj_cuda_load());
    CUresult r = cu.FuncSetAttribute((CUfunction)f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     bytes);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d)", bytes);
        return cuda_fail(r, what);
    }
    return MJ_OK;
}

mj_status mj_cuda_launch(mj_cuda_function f, const uint32_t grid[3], const uint32_t block[3],
                         uint32_t smem_bytes, void *stream, void **args) {
    return mj_cuda_launch_ex(f, grid, block, smem_bytes, stream, args, 0);
}

mj_status mj_cuda_launch_ex(mj_cuda_function f, const uint32_t grid[3], const uint32_t block[3],
                            uint32_t smem_bytes, void *stream, void **args, int pdl) {
    if (!f || !grid || !block)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_launch: NULL argument");
    for (int i = 0; i < 3; i++)
        if (grid[i] == 0 || block[i] == 0)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "mj_cuda_launch: empty launch (grid %ux%ux%u, block %ux%ux%u)",
                                grid[0], grid[1], grid[2], block[0], block[1], block[2]);
    MJ_CHECK(mj_cuda_load());
    CUresult r;
    /* Programmatic launches inside a captured graph need a CUDA 12.3 driver or later; an older
     * one gets plain launches (the kernels' griddepcontrol.wait then returns at once). */
    if (pdl && g_launch_ex && g_driver_version >= 12030) {
        mj_cu_launch_attr attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
        attr.value.programmatic_stream_serialization = 1;
        const mj_cu_launch_config cfg = {grid[0], grid[1],    grid[2], block[0], block[1], block[2],
                                         smem_bytes, (CUstream)stream, &attr, 1};
        r = g_launch_ex(&cfg, (CUfunction)f, args, NULL);
    } else {
        r = cu.LaunchKernel((CUfunction)f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem_bytes,
                            (CUstream)stream, args, NULL);
    }
    if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuLaunchKernel (grid %ux%ux%u, block %ux%ux%u, %u bytes smem)",
                 grid[0], grid[1], grid[2], block[0], block[1], block[2], smem_bytes);
        return cuda_fail(r, what);
    }
    return MJ_OK;
}

void mj_cuda_module_unload(mj_cuda_module *m) {
    if (!m) return;
    if (mj_cuda_load() == MJ_OK) {
        /* The module belongs to its context: unload it there, then give the thread back
         * whatever context it had. */
        CUcontext prev = NULL;
        if (cu.CtxGetCurrent(&prev) != CUDA_SUCCESS) prev = m->ctx;
        if (prev != m->ctx) cu.CtxSetCurrent(m->ctx);
        cu.ModuleUnload(m->mod);
        if (prev != m->ctx) cu.CtxSetCurrent(prev);
    }
    free(m);
}

/* ---- memory (tests and tools) ---------------------------------------------------------- */
mj_status mj_cuda_malloc(size_t bytes, uint64_t *dptr) {
    if (!dptr) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_malloc: dptr is NULL");
    *dptr = 0;
    MJ_CHECK(mj_cuda_load());
    CUdeviceptr p = 0;
    CUresult r = cu.MemAlloc(&p, bytes ? bytes : 1);
    if (r != CUDA_SUCCESS) {
        char what[80];
        snprintf(what, sizeof what, "cuMemAlloc(%zu bytes)", bytes);
        return cuda_fail(r, what);
    }
    *dptr = (uint64_t)p;
    return MJ_OK;
}

mj_status mj_cuda_free(uint64_t dptr) {
    if (!dptr) return MJ_OK;
    MJ_CHECK(mj_cuda_load());
    CUresult r = cu.MemFree((CUdeviceptr)dptr);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuMemFree");
    return MJ_OK;
}

mj_status mj_cuda_memcpy_htod(uint64_t dst, const void *src, size_t bytes) {
    if (bytes == 0) return MJ_OK;
    if (!dst || !src) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memcpy_htod: NULL pointer");
    MJ_CHECK(mj_cuda_load());
    CUresult r = cu.MemcpyHtoD((CUdeviceptr)dst, src, bytes);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuMemcpyHtoD");
    return MJ_OK;
}

mj_status mj_cuda_memcpy_dtoh(void *dst, uint64_t src, size_t bytes) {
    if (bytes == 0) return MJ_OK;
    if (!dst || !src) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memcpy_dtoh: NULL pointer");
    MJ_CHECK(mj_cuda_load());
    CUresult r = cu.MemcpyDtoH(dst, (CUdeviceptr)src, bytes);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuMemcpyDtoH");
    return MJ_OK;
}

mj_status mj_cuda_synchronize(void) {
    MJ_CHECK(mj_cuda_load());
    CUresult r = cu.CtxSynchronize();
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuCtxSynchronize");
    return MJ_OK;
}

mj_status mj_cuda_driver_version(int *version) {
    if (!version) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_driver_version: version is NULL");
    *version = 0;
    MJ_CHECK(mj_cuda_load());
    *version = g_driver_version;
    return MJ_OK;
}

/* ---- streams, events, graphs -------------------------------------------------------------- */

/* The driver loaded, with the timing and graph entry points. */
static mj_status ext_ready(const char *call) {
    MJ_CHECK(mj_cuda_load());
    if (g_ext_missing)
        return mj_set_error(MJ_ERR_LIBRARY,
                            "%s: the CUDA driver has no %s: it is too old for moejit's timing and graph "
                            "calls (update the NVIDIA driver)",
                            call, g_ext_missing);
    return MJ_OK;
}

#define EXT_CALL(name, call)                                                              \
    do {                                                                                  \
        MJ_CHECK(ext_ready(name));                                                        \
        CUresult r_ = (call);                                                             \
        if (r_ != CUDA_SUCCESS) return cuda_fail(r_, name);                               \
    } while (0)

mj_status mj_cuda_stream_create(void **stream) {
    if (!stream) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_stream_create: stream is NULL");
    *stream = NULL;
    CUstream s = NULL;
    EXT_CALL("cuStreamCreate", cx.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    *stream = s;
    return MJ_OK;
}

mj_status mj_cuda_stream_destroy(void *stream) {
    if (!stream) return MJ_OK;
    EXT_CALL("cuStreamDestroy", cx.StreamDestroy((CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_stream_synchronize(void *stream) {
    EXT_CALL("cuStreamSynchronize", cx.StreamSynchronize((CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_memcpy_dtod(uint64_t dst, uint64_t src, size_t bytes) {
    if (bytes == 0) return MJ_OK;
    if (!dst || !src) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memcpy_dtod: NULL pointer");
    EXT_CALL("cuMemcpyDtoD", cx.MemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, bytes));
    return MJ_OK;
}

mj_status mj_cuda_memcpy_htod_async(uint64_t dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0) return MJ_OK;
    if (!dst || !src) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memcpy_htod_async: NULL pointer");
    EXT_CALL("cuMemcpyHtoDAsync", cx.MemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, (CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_memcpy_dtod_async(uint64_t dst, uint64_t src, size_t bytes, void *stream) {
    if (bytes == 0) return MJ_OK;
    if (!dst || !src) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memcpy_dtod_async: NULL pointer");
    EXT_CALL("cuMemcpyDtoDAsync", cx.MemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, bytes, (CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_memset_async(uint64_t dst, uint8_t value, size_t bytes, void *stream) {
    if (bytes == 0) return MJ_OK;
    if (!dst) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_memset_async: NULL pointer");
    EXT_CALL("cuMemsetD8Async", cx.MemsetD8Async((CUdeviceptr)dst, value, bytes, (CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_event_create(void **event) {
    if (!event) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_event_create: event is NULL");
    *event = NULL;
    CUevent e = NULL;
    EXT_CALL("cuEventCreate", cx.EventCreate(&e, CU_EVENT_DEFAULT));
    *event = e;
    return MJ_OK;
}

mj_status mj_cuda_event_destroy(void *event) {
    if (!event) return MJ_OK;
    EXT_CALL("cuEventDestroy", cx.EventDestroy((CUevent)event));
    return MJ_OK;
}

mj_status mj_cuda_event_record(void *event, void *stream) {
    if (!event) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_event_record: event is NULL");
    EXT_CALL("cuEventRecord", cx.EventRecord((CUevent)event, (CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_event_synchronize(void *event) {
    if (!event) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_event_synchronize: event is NULL");
    EXT_CALL("cuEventSynchronize", cx.EventSynchronize((CUevent)event));
    return MJ_OK;
}

mj_status mj_cuda_event_elapsed(void *start, void *end, float *ms) {
    if (!start || !end || !ms) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_event_elapsed: NULL argument");
    *ms = 0.0f;
    EXT_CALL("cuEventElapsedTime", cx.EventElapsedTime(ms, (CUevent)start, (CUevent)end));
    return MJ_OK;
}

mj_status mj_cuda_graph_capture_begin(void *stream) {
    if (!stream)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_cuda_graph_capture_begin: the legacy default stream cannot be captured: create "
                            "a stream (mj_cuda_stream_create)");
    EXT_CALL("cuStreamBeginCapture", cx.StreamBeginCapture((CUstream)stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    return MJ_OK;
}

mj_status mj_cuda_graph_capture_end(void *stream, void **graph) {
    if (!stream || !graph) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_graph_capture_end: NULL argument");
    *graph = NULL;
    CUgraph g = NULL;
    EXT_CALL("cuStreamEndCapture", cx.StreamEndCapture((CUstream)stream, &g));
    *graph = g;
    return MJ_OK;
}

mj_status mj_cuda_graph_instantiate(void *graph, void **exec) {
    if (!graph || !exec) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_graph_instantiate: NULL argument");
    *exec = NULL;
    CUgraphExec e = NULL;
    EXT_CALL("cuGraphInstantiateWithFlags", cx.GraphInstantiate(&e, (CUgraph)graph, 0));
    *exec = e;
    return MJ_OK;
}

mj_status mj_cuda_graph_launch(void *exec, void *stream) {
    if (!exec) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cuda_graph_launch: exec is NULL");
    EXT_CALL("cuGraphLaunch", cx.GraphLaunch((CUgraphExec)exec, (CUstream)stream));
    return MJ_OK;
}

mj_status mj_cuda_graph_destroy(void *graph) {
    if (!graph) return MJ_OK;
    EXT_CALL("cuGraphDestroy", cx.GraphDestroy((CUgraph)graph));
    return MJ_OK;
}

mj_status mj_cuda_graph_exec_destroy(void *exec) {
    if (!exec) return MJ_OK;
    EXT_CALL("cuGraphExecDestroy", cx.GraphExecDestroy((CUgraphExec)exec));
    return MJ_OK;
}
