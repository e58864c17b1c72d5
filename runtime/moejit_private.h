/* moejit_private.h — what the `moejit` command (tools/) may use of the library beyond
 * include/moejit.h. The command is a client of the public API first; what it needs that an
 * application does not (compile timings, the cache's files, plans as manifest lines, the
 * interpreter's counters, device timing) it reaches through this header alone: no file of
 * tools/ includes another header of the library. Not installed, not public.
 *
 * It includes the internal headers that declare what the groups below name, rather than
 * declaring those things again: each declaration keeps one home, next to its definition, so
 * the library and the command cannot disagree about a prototype or a struct. The price is
 * that an included header brings more than the command uses; each group says what it is
 * there for. One thing is declared here instead: the layer handle's router (see "layers"),
 * so that struct mj_layer (runtime/weights/layer.h) stays inside the library.
 *
 * The headers below need the library's internal include directories, so the command is
 * compiled with them and the compiler alone cannot hold it to this list: the ctest test
 * tools_includes (tests/check_tools_includes.cmake) fails when a file of tools/ includes a
 * project header other than moejit.h, this one and tools/'s own. */
#ifndef MOEJIT_PRIVATE_H
#define MOEJIT_PRIVATE_H

#include "moejit.h"

/* ---- errors, bf16, the seeded generator (base/base.h) ----------------------------------
 * mj_set_error and MJ_CHECK, for a tool's own failures in the library's style; mj_f32_to_bf16
 * (inputs rounded to bf16 as a model's hidden states are); mj_rng_normal (seeded inputs). */
#include "base.h"

/* ---- targets, specializations, templates (gen/gen.h) -----------------------------------
 * MJ_DEFAULT_TARGET, MJ_TARGET_LIST, mj_target_parse / mj_target_name (--arch); mj_spec with
 * mj_spec_describe, mj_spec_to_json and mj_spec_from_json (a plan's kernels by name, as
 * manifest lines, and manifest lines read back); mj_registry_count and mj_template_at
 * (`inspect templates`). */
#include "gen.h"

/* ---- the kernel cache (cache/cache.h) ---------------------------------------------------
 * `inspect` reads and maintains a cache directory: mj_cache_open_flags (MJ_CACHE_NO_CREATE,
 * MJ_CACHE_READ_ONLY) and mj_cache_close; mj_cache_dir, _readable, _writable, _dir_writable,
 * _problem, _max_bytes and _max_bytes_source; mj_cache_list, mj_cache_read_file with
 * mj_cache_entry_free (MJ_CACHE_FORMAT and MJ_KEY_HEX_LEN name an entry's file);
 * mj_cache_verify, mj_cache_gc, mj_cache_get_stats; mj_cache_totals and mj_cache_total_names.
 * `prewarm` checks that its context's cache can be written (mj_cache_writable,
 * mj_cache_problem, mj_cache_dir). */
#include "cache.h"

/* ---- JIT contexts and compiled functions (jit.h) ----------------------------------------
 * mj_jit_get and mj_function_key / _report / _binary (bench's compile, load and lookup
 * times; the performance model's registers and SASS); mj_context_cache, mj_context_target,
 * mj_context_device and mj_jit_compile_threads; mj_launch_dims (the experts' launches).
 * The interpreter's graphs: mj_sim_capture_begin / _end, mj_sim_graph_launches and
 * mj_sim_graph_free (bench's launch path: a forward's launches recorded, not run). */
#include "jit.h"

/* ---- the interpreter's weight stream (sim/sim.h) ----------------------------------------
 * mj_sim_stream_bytes_take: the weight bytes the sim launches of this thread read (bench's
 * bytes against the floor, run's and demo's bytes a rank). */
#include "sim/sim.h"

/* ---- plans (plan.h, experts.h) -----------------------------------------------------------
 * mj_plan_build / mj_plan_free, mj_plan_rank_shape, mj_plan_get_all and mj_batches_parse (the
 * plan prewarm compiles and bench times, from the planner mj_moe_prepare uses); mj_mode_policy_parse,
 * mj_mode_policy_default and mj_mode_resolve (--mode); the launchers' knob choices,
 * mj_router_knobs, mj_route_knobs, mj_experts_knobs, mj_experts_specs and mj_experts_dims,
 * with mj_spec_router_gemm and mj_spec_oea_route of the generated mj_kernels.h (through
 * mj_context_spec_fill): the performance model's kernels, as the runtime would launch them;
 * MJ_EXPERTS_DRING and MJ_EXPERTS_DSLOT (down's ring: the model's bytes in flight);
 * mj_experts_stream_round (STREAM up's blocks an SM: the model's grid is the runtime's). */
#include "plan.h"

/* ---- the CUDA driver, for timing (cuda/cudalibs.h) --------------------------------------
 * mj_cuda_load, mj_cuda_device_count and mj_cuda_device_info (is there a GPU, which);
 * mj_cuda_bind, device memory (mj_cuda_malloc, _free, _memcpy_*, _memset_async); streams,
 * events and CUDA graphs (bench's timings and graph replays); mj_cuda_synchronize;
 * mj_cuda_driver_version. */
#include "cuda/cudalibs.h"

/* ---- memory where the kernels run (mem.h) ------------------------------------------------
 * mj_mem_alloc / _put / _get / _free: device memory on a GPU, host memory on the
 * interpreter, for a forward's inputs and outputs (run, demo, bench). */
#include "mem.h"

/* ---- packing sizes (weights/pack.h) -------------------------------------------------------
 * mj_pack_expert_bytes and mj_pack_w13 / s13 / w2 / s2_bytes: the bytes a forward reads of
 * one active expert (bench's floor, inspect's roofline, the performance model). */
#include "weights/pack.h"

/* ---- communicators (comm/comm.h) ---------------------------------------------------------
 * mj_comm_abort: a rank of `run` or `demo` whose forward failed releases the loopback ranks
 * waiting for it in the all-reduce at once. */
#include "comm/comm.h"

/* ---- model families (weights/family.h) ----------------------------------------------------
 * mj_families, mj_family_names and the mj_family rows: `moejit models` lists the table the
 * config reader and the checkpoint loader follow. */
#include "weights/family.h"

/* ---- layers (runtime/weights/layer.c) ----------------------------------------------------
 * The router of a layer handle, in host memory and owned by it: gate [E, H] bf16 and the
 * e_score_correction_bias [E] (NULL when the model has none). Bench copies them to the GPU to
 * time the router GEMM and routing alone. */
mj_status mj_layer_router(mj_layer_t layer, const uint16_t **gate, const float **bias);

#endif /* MOEJIT_PRIVATE_H */
