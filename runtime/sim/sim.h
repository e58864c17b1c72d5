/* sim.h — the CPU interpreter ("sim" backend): the generated kernel source compiled by the
 * host C compiler into a shared object, run with CUDA's execution model. Internal.
 *
 *   sim_so.c  the host compiler (fork/exec, no shell), loading the object (dlopen);
 *   sim.c     the interpreter: blocks on worker threads, CUDA threads as fibers, barriers,
 *             warp collectives, deadlock detection.
 *
 * Pointers a sim kernel gets are host pointers; a launch is synchronous (the stream is
 * ignored) and returns the kernel's failure (a deadlock, __trap) as its status.
 */
#ifndef MJ_SIM_H
#define MJ_SIM_H

#include "jit.h"

#include <stddef.h>
#include <stdint.h>

/* Whether libmoejit itself is built with AddressSanitizer: then kernel objects are too. */
#if defined(__SANITIZE_ADDRESS__)
#define MJ_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MJ_SIM_ASAN 1
#endif
#endif
#ifndef MJ_SIM_ASAN
#define MJ_SIM_ASAN 0
#endif

/* ---- the host compiler (sim_so.c) ------------------------------------------------------ */
/* "sim gcc (Debian 12.2.0-14) 12.2.0": the backend and the first line of `$CC --version`
 * ($CC, else cc), found once per process. A compiler that cannot be run: MJ_ERR_COMPILE
 * naming it. */
mj_status mj_sim_compiler(const char **version);
/* The fixed options the source is compiled with, space-separated (part of the disk key):
 * with -fsanitize=address when libmoejit itself is built with AddressSanitizer. */
const char *mj_sim_options(void);
/* Compile source into a shared object: out->cubin holds its bytes, out->log the compiler's
 * output, no PTX, a zero report. A compile error is MJ_ERR_COMPILE with the log and the path
 * of the kept source in mj_last_error() (out->log has the whole log; free out either way). */
mj_status mj_sim_compile(const char *source, const char *name, mj_compile_result *out);

/* ---- a loaded object ------------------------------------------------------------------- */
typedef void (*mj_sim_entry)(void **args);
typedef struct mj_sim_module mj_sim_module;
/* Load the object (from a private temp file, unlinked once open) and look up
 * mj_sim_bind and mj_sim_entry_<kernel> for each kernel of template t. */
mj_status mj_sim_module_load(const void *so, size_t len, const mj_template_desc *t,
                             mj_sim_module **out);
void mj_sim_module_unload(mj_sim_module *m);
mj_sim_entry mj_sim_module_entry(const mj_sim_module *m, int kernel);

/* ---- running (sim.c) ------------------------------------------------------------------- */
/* Run entry over grid x block threads with smem bytes of dynamic shared memory; args as
 * for cuLaunchKernel. Blocks spread over $MOEJIT_SIM_THREADS workers (default: the CPUs
 * this process may use); fiber stacks of $MOEJIT_SIM_STACK_KB KiB (default 64, 256 under
 * AddressSanitizer); MOEJIT_SIM_UCONTEXT=1 switches fibers with swapcontext instead of the
 * x86-64 switch. A barrier or warp collective that cannot complete, or __trap(), is
 * MJ_ERR_KERNEL naming the kernel, the block, the thread and what was wrong. */
/* The function table every kernel object gets through its mj_sim_bind (a struct mj_sim_api,
 * templates/prelude_sim.h). */
const void *mj_sim_api_table(void);
mj_status mj_sim_run(mj_sim_entry entry, const char *kernel, const uint32_t grid[3],
                     const uint32_t block[3], uint32_t smem, void **args);
/* Bytes the sim launches of the calling thread loaded through mj_ld_stream or copied with
 * mj_cp_async16 or mj_cp_async8 (the weight stream) since the last call, not the indices
 * copied with mj_cp_async4; the count restarts at 0. */
unsigned long long mj_sim_stream_bytes_take(void);
/* The L2 prefetches (mj_prefetch_l2) of the calling thread's sim launches since the last call,
 * into out (NULL: dropped): how many, the sum of their 128-byte lines' indices (address / 128)
 * and the sum of those indices' squares, so that a test can tell which lines; all restart at 0. */
void mj_sim_prefetch_take(unsigned long long out[3]);

#endif
