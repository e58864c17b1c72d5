/* jit.h — the JIT machinery's internal interfaces: rendering, keys, NVRTC, the driver,
 * the cubin cache. Not public; the library's files and the tests share it. */
#ifndef MJ_JIT_H
#define MJ_JIT_H

#include "internal.h"
#include "registry.h"

#include <stddef.h>
#include <stdint.h>

/* ---- targets (gen/target.c) ---------------------------------------------------------- */
const char *mj_target_name(mj_target t);                /* "sm_120a"                       */
mj_status mj_target_parse(const char *name, mj_target *out); /* "sm_120a" / "120a" / "12.0" */
int mj_target_sm(mj_target t);                          /* 120                             */

/* ---- NVRTC (runtime/nvrtc.c): dlopen'd, never linked ---------------------------------- */
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
/* The fixed option list moejit compiles with for a target, space-separated (stable: part
 * of the disk key). */
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

/* ---- the CUDA driver (runtime/cuda.c): dlopen'd libcuda.so.1 ------------------------- */
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
/* Compute capability -> target: 12.0 -> sm_120a, 9.0 -> sm_90a, 8.6 -> sm_86 ... */
mj_status mj_target_from_cc(int major, int minor, mj_target *out);

typedef struct mj_cuda_module mj_cuda_module;   /* a loaded cubin (CUmodule)               */
typedef void *mj_cuda_function;                  /* CUfunction                              */
mj_status mj_cuda_module_load(int ordinal, const void *cubin, size_t len, mj_cuda_module **out);
mj_status mj_cuda_module_function(mj_cuda_module *m, const char *name, mj_cuda_function *out);
mj_status mj_cuda_set_max_dynamic_smem(mj_cuda_function f, int bytes);
mj_status mj_cuda_launch(mj_cuda_function f, const uint32_t grid[3], const uint32_t block[3],
                         uint32_t smem_bytes, void *stream, void **args);
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

/* ---- specializations (gen/render.c) --------------------------------------------------- */
/* A specialization: template + knob values + target. Everything that selects a kernel. */
typedef struct mj_spec {
    int32_t tpl;                        /* index into mj_registry_templates               */
    mj_target target;
    mj_backend backend;
    int32_t knobs[MJ_MAX_KNOBS];        /* in the template's declaration order; rest 0    */
} mj_spec;

const mj_template_desc *mj_template_find(const char *name, int32_t *index);
/* Check every knob against its declared range/set, the target against the template's. */
mj_status mj_spec_validate(const mj_spec *s);
/* Render the specialization's source (malloc'd, NUL-terminated): a comment header naming
 * every knob and the target, the knobs as #defines, the backend's prelude, the body.
 * Deterministic: same spec, same bytes. */
mj_status mj_render(const mj_spec *s, char **source, size_t *len);
/* The disk key text of a rendered source (malloc'd): format version, backend, target,
 * compiler version, options, template, SHA-256 of the source. No paths. */
mj_status mj_key_text(const mj_spec *s, const char *source, size_t len, const char *compiler,
                      const char *options, char **text);
/* One JSON line {"template":..., "knobs":{...}, "arch":...} (malloc'd, no newline). */
mj_status mj_spec_to_json(const mj_spec *s, char **line);
/* Parse such a line; `where` labels errors ("manifest.jsonl:3"). Every knob of the
 * template must be given, and nothing else. */
mj_status mj_spec_from_json(const char *line, const char *where, mj_spec *out);
/* "fixture_saxpy BLOCK=256 VEC=4 sm_120a" for messages (buf of at least 256 bytes). */
const char *mj_spec_describe(const mj_spec *s, char *buf, size_t len);

/* Where the running totals of every process's JIT counters live (a JSON object). */
mj_status mj_stats_file_path(const char *cache_dir, char *buf, size_t len);

/* ---- the JIT (runtime/jit.c) ---------------------------------------------------------- */
typedef struct mj_launch_dims {
    uint32_t grid[3], block[3];
    uint32_t smem;                      /* dynamic shared memory, bytes                    */
    void *stream;                       /* CUstream (NULL: the default stream)             */
} mj_launch_dims;

/* A compiled specialization: its cache entry and, when the context has a device, the loaded
 * module and one function per kernel of the template. Owned by the context. */
typedef struct mj_function mj_function;

/* Get (from memory, else disk, else by compiling) the specialization. Hot path: one integer
 * hash of the spec and a read lock; no strings, no hashing of source. */
mj_status mj_jit_get(mj_context_t ctx, const mj_spec *s, const mj_function **out);
/* What a function holds, for inspect and tests. */
const char *mj_function_key(const mj_function *f);
const mj_ptxas_report *mj_function_report(const mj_function *f);
const char *mj_function_source(const mj_function *f);
/* Launch kernel `kernel` (index within the template `tpl`) with packed args; the typed
 * wrappers in mj_kernels.h call this. MJ_ERR_NO_DEVICE for a CUDA function in a
 * compile-only context. A sim function (spec backend MJ_BACKEND_SIM) runs on the CPU: its
 * pointer arguments are host pointers, d.stream is ignored, the launch is synchronous (the
 * results are there when it returns) and a kernel that deadlocks or traps returns
 * MJ_ERR_KERNEL naming the kernel, block and thread. */
mj_status mj_function_launch(const mj_function *fn, int tpl, int kernel, mj_launch_dims d,
                             void **args, int nargs);

/* The specialization of template `template_name` with knob values `knobs` (in the
 * template's declaration order; may be NULL for a template without knobs) for this
 * context: its target (mj_context_options.target, else the device's, else sm_120a) and
 * backend (cuda, or sim: MJ_BACKEND_AUTO is sim without a device). Validated: an unknown
 * template or a knob out of range is MJ_ERR_INVALID_ARG, a target the template does not
 * declare MJ_ERR_UNSUPPORTED. Then mj_jit_get(ctx, &spec, &fn) and mj_launch_<kernel>(fn...). */
mj_status mj_context_spec(mj_context_t ctx, const char *template_name, const int32_t *knobs,
                          mj_spec *out);
/* The same without the name lookup or validation, for launch paths that know the template's
 * index (MJ_TPL_* from mj_kernels.h) and pass knobs mj_jit_get will validate on a miss. */
void mj_context_spec_fill(mj_context_t c, int32_t tpl, const int32_t *knobs, int32_t n_knobs, mj_spec *out);

#endif
