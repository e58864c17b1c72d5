/* cudalibs.h — the CUDA libraries moejit reaches at run time, never at link time (loaded by
 * base/dl.c): NVRTC (compile generated source to a cubin), the driver (devices, modules,
 * launches, memory). Not installed, not public. */
#ifndef MJ_CUDALIBS_H
#define MJ_CUDALIBS_H

#include "gen.h"

#include <stddef.h>
#include <stdint.h>

/* ---- NVRTC (runtime/cuda/nvrtc.c): dlopen'd, never linked ---------------------------------- */
typedef struct mj_ptxas_report {
    int32_t registers;         /* max over the module's entry functions                    */
    int32_t spill_stores;      /* bytes, summed over entry functions                       */
    int32_t spill_loads;
    int32_t stack_frame;       /* bytes, max                                               */
    int32_t smem_static;       /* bytes, max                                               */
    int32_t cmem0;             /* bytes of constant bank 0, max                            */
    int32_t n_functions;       /* entry functions reported                                 */
} mj_ptxas_report;

typedef struct mj_compile_result {
    uint8_t *cubin;  size_t cubin_len;
    char *ptx;       size_t ptx_len;     /* NUL-terminated too                             */
    char *log;                           /* NVRTC's log incl. the ptxas report (may be "") */
    mj_ptxas_report report;
    double compile_ms;
} mj_compile_result;

/* Load libnvrtc (once per process; thread-safe). $MOEJIT_NVRTC names the library file to
 * use instead of the search (no fallback). Fails with MJ_ERR_LIBRARY naming the library or
 * the missing symbol. */
mj_status mj_nvrtc_load(void);
/* "nvrtc 13.0" */
mj_status mj_nvrtc_version(int *major, int *minor);
/* Whether NVRTC can compile for the target (nvrtcGetSupportedArchs). */
mj_status mj_nvrtc_supports(mj_target t, int *supported);
/* The option list moejit compiles with for a target, space-separated: fixed for a target
 * and the loaded NVRTC (-minimal from NVRTC 12.4 on; this loads NVRTC to ask its version),
 * and part of the disk key. */
const char *mj_nvrtc_options(mj_target t);
/* Compile source (name labels messages) straight to a cubin for target t, keeping the PTX
 * and the log. A compile error returns MJ_ERR_COMPILE; mj_last_error() has the log and the
 * path of the dumped source ($TMPDIR/moejit-failed-<hash>.cu); out->log keeps the whole log
 * on failure too (free out with mj_compile_result_free either way). */
mj_status mj_nvrtc_compile(const char *source, const char *name, mj_target t,
                           mj_compile_result *out);
void mj_compile_result_free(mj_compile_result *r);
/* Parse the "ptxas info" lines of a log. */
void mj_ptxas_parse(const char *log, mj_ptxas_report *out);

/* ---- the CUDA driver (runtime/cuda/driver.c): dlopen'd libcuda.so.1 ------------------------- */
typedef struct mj_device_info {
    int ordinal;
    char name[256];
    int cc_major, cc_minor;
    mj_target target;          /* from the compute capability                              */
    int sm_count;
    int smem_per_block_optin;  /* bytes                                                    */
    int l2_bytes;
} mj_device_info;

/* Load the driver and cuInit. No libcuda, or no device: MJ_ERR_NO_DEVICE. */
mj_status mj_cuda_load(void);
mj_status mj_cuda_device_count(int *n);
/* A capability moejit does not target still fills out (target = MJ_TARGET_COUNT) and
 * returns MJ_ERR_UNSUPPORTED. */
mj_status mj_cuda_device_info(int ordinal, mj_device_info *out);

typedef struct mj_cuda_module mj_cuda_module;   /* a loaded cubin (CUmodule)               */
typedef void *mj_cuda_function;                  /* CUfunction                              */
mj_status mj_cuda_module_load(int ordinal, const void *cubin, size_t len, mj_cuda_module **out);
mj_status mj_cuda_module_function(mj_cuda_module *m, const char *name, mj_cuda_function *out);
mj_status mj_cuda_set_max_dynamic_smem(mj_cuda_function f, int bytes);
mj_status mj_cuda_launch(mj_cuda_function f, const uint32_t grid[3], const uint32_t block[3],
                         uint32_t smem_bytes, void *stream, void **args);
/* The same, and with pdl != 0 as a programmatic dependent of the stream's previous kernel
 * (cuLaunchKernelEx, PROGRAMMATIC_STREAM_SERIALIZATION: the kernel must call
 * griddepcontrol.wait before it touches memory). A driver without cuLaunchKernelEx, or older
 * than CUDA 12.3 (programmatic launches in captured graphs), launches it plainly. */
mj_status mj_cuda_launch_ex(mj_cuda_function f, const uint32_t grid[3], const uint32_t block[3],
                            uint32_t smem_bytes, void *stream, void **args, int pdl);
void mj_cuda_module_unload(mj_cuda_module *m);
/* Make device ordinal's primary context (retained once, kept for the process) current on
 * the calling thread; mj_cuda_module_load does this too. Memory calls, launches and
 * synchronize act in the calling thread's current context. */
mj_status mj_cuda_bind(int ordinal);
/* Device memory, for tests and tools. */
mj_status mj_cuda_malloc(size_t bytes, uint64_t *dptr);
mj_status mj_cuda_free(uint64_t dptr);
mj_status mj_cuda_memcpy_htod(uint64_t dst, const void *src, size_t bytes);
mj_status mj_cuda_memcpy_dtoh(void *dst, uint64_t src, size_t bytes);
mj_status mj_cuda_synchronize(void);
mj_status mj_cuda_memcpy_dtod(uint64_t dst, uint64_t src, size_t bytes);
/* The driver's version (cuDriverGetVersion: 13000 for CUDA 13.0). */
mj_status mj_cuda_driver_version(int *version);

/* ---- streams, events and CUDA graphs: what timing and graph capture need -----------------
 * Resolved when the driver loads, apart from the table above: a driver too old for them
 * (or a stand-in without them) still runs kernels, and these calls then fail with
 * MJ_ERR_LIBRARY naming the missing symbol. Streams, events and graphs are opaque pointers
 * (CUstream, CUevent, CUgraph, CUgraphExec); every call acts in the calling thread's current
 * context (mj_cuda_bind). */
/* A stream that does not synchronize with the legacy default stream (CU_STREAM_NON_BLOCKING). */
mj_status mj_cuda_stream_create(void **stream);
mj_status mj_cuda_stream_destroy(void *stream);
mj_status mj_cuda_stream_synchronize(void *stream);
mj_status mj_cuda_memcpy_htod_async(uint64_t dst, const void *src, size_t bytes, void *stream);
mj_status mj_cuda_memcpy_dtod_async(uint64_t dst, uint64_t src, size_t bytes, void *stream);
/* Set bytes of device memory to value, enqueued on stream (cuMemsetD8Async). */
mj_status mj_cuda_memset_async(uint64_t dst, uint8_t value, size_t bytes, void *stream);
mj_status mj_cuda_event_create(void **event);
mj_status mj_cuda_event_destroy(void *event);
mj_status mj_cuda_event_record(void *event, void *stream);
mj_status mj_cuda_event_synchronize(void *event);
/* Milliseconds between two recorded (and completed) events. */
mj_status mj_cuda_event_elapsed(void *start, void *end, float *ms);
/* Capture the work enqueued on stream (thread-local mode: this thread may not make unsafe
 * calls meanwhile, other threads may) into a graph, instantiate it, replay it. */
mj_status mj_cuda_graph_capture_begin(void *stream);
mj_status mj_cuda_graph_capture_end(void *stream, void **graph);
mj_status mj_cuda_graph_instantiate(void *graph, void **exec);
mj_status mj_cuda_graph_launch(void *exec, void *stream);
mj_status mj_cuda_graph_destroy(void *graph);
mj_status mj_cuda_graph_exec_destroy(void *exec);

#endif /* MJ_CUDALIBS_H */
