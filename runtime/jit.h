/* jit.h — the JIT: a context turns a specialization into a loaded function, through its
 * in-memory table, the disk cache and the compiler (NVRTC, or the host C compiler for the
 * interpreter). Not public; the library's files and the tests share it. */
#ifndef MJ_JIT_H
#define MJ_JIT_H

#include "cuda/cudalibs.h"
#include "gen.h"
#include "base.h"

#include <stddef.h>
#include <stdint.h>

/* ---- keys (runtime/jit.c) -------------------------------------------------------------- */
/* The disk key text of a rendered source (malloc'd): format version, backend, target,
 * compiler version, options, template, SHA-256 of the source. No paths. */
mj_status mj_key_text(const mj_spec *s, const char *source, size_t len, const char *compiler,
                      const char *options, char **text);

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
/* Get n specializations into out[i], building those not in memory side by side: a pool of
 * mj_jit_compile_threads(ctx) workers (a bound per call), the caller's thread one of them,
 * takes them in order.
 * A launch sequence of several kernels, or a plan, waits for about its sum divided by the
 * workers, not the sum. All in memory: no thread, as mj_jit_get's hot path. Every spec is
 * tried; on failure the first failing spec's status and error, in order (out[i] of a
 * failed one NULL). */
mj_status mj_jit_get_many(mj_context_t ctx, const mj_spec *s, int n, const mj_function **out);
/* How many builds one mj_jit_get_many call runs at once: $MOEJIT_COMPILE_THREADS (1..256), else the
 * CPUs this process may run on (at most 256). */
int mj_jit_compile_threads(mj_context_t ctx);
/* The most builds mj_jit_get_many's workers have run at once in ctx, over all calls (tests
 * check the bound with one caller). */
int mj_jit_pool_peak(mj_context_t ctx);
/* What a function holds, for inspect and tests. */
const char *mj_function_key(const mj_function *f);
const mj_ptxas_report *mj_function_report(const mj_function *f);
const char *mj_function_source(const mj_function *f);
/* The compiled binary (a cubin, or the interpreter's shared object). */
const void *mj_function_binary(const mj_function *f, size_t *len);
/* Launch kernel `kernel` (index within the template `tpl`) with packed args; the typed
 * wrappers in mj_kernels.h call this. MJ_ERR_NO_DEVICE for a CUDA function in a
 * compile-only context. A sim function (spec backend MJ_BACKEND_SIM) runs on the CPU: its
 * pointer arguments are host pointers, d.stream is ignored, the launch is synchronous (the
 * results are there when it returns) and a kernel that deadlocks or traps returns
 * MJ_ERR_KERNEL naming the kernel, block and thread. */
mj_status mj_function_launch(const mj_function *fn, int tpl, int kernel, mj_launch_dims d,
                             void **args, int nargs);

/* The context's disk cache (cache/cache.h), for the tools: where it is, whether it can be
 * written. Owned by the context. */
struct mj_cache *mj_context_cache(mj_context_t ctx);

/* The specialization of template `template_name` with knob values `knobs` (in the
 * template's declaration order; may be NULL for a template without knobs) for this
 * context: its target (mj_context_options.target, else the device's, else sm_120a) and
 * backend (cuda, or sim: MJ_BACKEND_AUTO is sim without a device). Validated: an unknown
 * template or a knob out of range is MJ_ERR_INVALID_ARG, a target the template does not
 * declare MJ_ERR_UNSUPPORTED. Then mj_jit_get(ctx, &spec, &fn) and mj_launch_<kernel>(fn...). */
mj_status mj_context_spec(mj_context_t ctx, const char *template_name, const int32_t *knobs,
                          mj_spec *out);
/* Recorded launches on the interpreter: what a captured CUDA graph is on a GPU. Between
 * begin and end, every sim launch on ctx is recorded (argument values copied, pointers by
 * value) instead of run; replay runs the recording again, as often as wanted. Lets a test
 * prove that a launch sequence is graph-safe: replayed with new data in the same buffers
 * (a new token count, say), it computes the new answer. One thread at a time per context. */
typedef struct mj_sim_graph mj_sim_graph;
mj_status mj_sim_capture_begin(mj_context_t ctx);
mj_status mj_sim_capture_end(mj_context_t ctx, mj_sim_graph **out);
int mj_sim_graph_launches(const mj_sim_graph *g);
mj_status mj_sim_graph_replay(const mj_sim_graph *g);
void mj_sim_graph_free(mj_sim_graph *g);

/* The target, device (MJ_DEVICE_NONE without one) and device info of a context. */
mj_target mj_context_target(mj_context_t ctx);
int mj_context_device(mj_context_t ctx, mj_device_info *info);

/* The grid a grid-stride kernel should cap itself at on this context's device (8 blocks per
 * SM on a GPU; 64 on the interpreter). */
int32_t mj_context_max_blocks(mj_context_t ctx);

/* Dynamic shared memory a kernel may use without opting in (every target). */
#define MJ_SMEM_DEFAULT_LIMIT (48u * 1024u)

/* The same without the name lookup or validation, for launch paths that know the template's
 * index (MJ_TPL_* from mj_kernels.h) and pass knobs mj_jit_get will validate on a miss. */
void mj_context_spec_fill(mj_context_t c, int32_t tpl, const int32_t *knobs, int32_t n_knobs, mj_spec *out);

#endif
