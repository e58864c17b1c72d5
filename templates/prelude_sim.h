/* ---- prelude: the CPU interpreter (sim) ------------------------------------------------
 * The same generated kernel source NVRTC compiles for the GPU is compiled here by the host
 * C compiler (gnu11) into a shared object, which runtime/sim/sim.c loads and runs with
 * CUDA's execution model: each thread block on one worker thread, each CUDA thread of the
 * block a fiber (its own stack) on that worker. Fibers run until they block at a barrier or
 * a warp collective, or return; the runtime then releases barriers and collectives whose
 * threads have all arrived, and reports a launch that can make no progress as an error.
 *
 * Everything a kernel asks of the runtime (its indices, __syncthreads, shuffles, votes)
 * goes through the function table that mj_sim_bind() receives when the object is loaded,
 * so the object needs no symbol of libmoejit.
 *
 * Where the sim differs from a GPU (see runtime/sim/sim.c for the whole story):
 *   - __shared__ / MJ_SHARED variables are `static __thread`: a worker runs one block at a
 *     time, so a block's fibers share them; the next block on the same worker sees what the
 *     previous one left, which is CUDA's "shared memory starts uninitialized".
 *   - MJ_DYNAMIC_SHARED(type, name) must be used inside a function (it declares a pointer).
 *   - fibers are cooperative: a spin-wait on memory another thread writes never ends.
 *   - __activemask() waits until no lane of the warp can run, then returns the lanes that
 *     are waiting at an __activemask() (those that got there "together").
 *
 * Hooks: a helper that is inline PTX under NVRTC and C here (mj_lane_id, later the MMA and
 * conversion helpers) is defined with the same signature in prelude_cuda.h and in this
 * file, and declared in gen/reflect_prelude.h so templates that call it still reflect.
 * ------------------------------------------------------------------------------------- */
#define MJ_SIM 1

/* ---- the ABI shared with the runtime (runtime/sim/sim.c includes this part alone) ---- */
#ifndef MJ_SIM_ABI_H
#define MJ_SIM_ABI_H
#define MJ_SIM_ABI_VERSION 5

typedef struct mj_sim_dim3 { unsigned x, y, z; } mj_sim_dim3;

/* What a CUDA thread sees of itself; owned by the runtime, constant while it runs. */
typedef struct mj_sim_thread {
    mj_sim_dim3 thread_idx, block_idx, block_dim, grid_dim;
    unsigned lane;             /* linear thread index % 32                                 */
    unsigned warp;             /* linear thread index / 32                                 */
    void *dyn_smem;            /* the block's dynamic shared memory (launch's smem bytes)  */
    unsigned long long *stream_bytes; /* bytes loaded through mj_ld_stream (per worker)   */
    unsigned long long *prefetch;     /* [3]: mj_prefetch_l2's calls and the sums of their
                                       * lines' indices (address / 128) and of their squares,
                                       * per worker                                          */
} mj_sim_thread;

/* Warp collectives: one runtime entry, the operation named by op. */
enum mj_sim_op {
    MJ_SIM_OP_SYNCWARP = 0,
    MJ_SIM_OP_SHFL_IDX,
    MJ_SIM_OP_SHFL_UP,
    MJ_SIM_OP_SHFL_DOWN,
    MJ_SIM_OP_SHFL_XOR,
    MJ_SIM_OP_BALLOT,
    MJ_SIM_OP_ANY,
    MJ_SIM_OP_ALL,
    MJ_SIM_OP_ACTIVEMASK,      /* the lanes that reached it together (no mask)             */
    MJ_SIM_OP_MMA,             /* a warp-wide mma.sync: value points at the lane's fragments */
    MJ_SIM_OP_REDUX_UMAX,      /* __reduce_max_sync on unsigned: the largest of the mask's values */
    MJ_SIM_OP_REDUX_UMIN,      /* __reduce_min_sync on unsigned: the smallest                 */
    MJ_SIM_OP_COUNT
};

/* The MMAs the interpreter computes (the arg of MJ_SIM_OP_MMA), and one lane's fragments,
 * laid out as the PTX instruction takes them (see runtime/sim/sim.c, mma_compute). */
enum mj_sim_mma_kind {
    MJ_SIM_MMA_BF16_M16N8K16 = 1,   /* mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32          */
    MJ_SIM_MMA_E2M1_M16N8K64 = 2    /* mma.sync.m16n8k64.row.col.kind::mxf4nvf4.block_scale
                                       .scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3, ids {0, 0}    */
};
typedef struct mj_sim_mma {
    unsigned a[4], b[2];       /* A and B fragments                                        */
    float c[4], d[4];          /* C in, D out                                              */
    unsigned sfa, sfb;         /* block scales (E2M1 only): 4 ue4m3 bytes each             */
} mj_sim_mma;

struct mj_sim_api {
    int abi_version;
    const mj_sim_thread *(*self)(void);
    void (*syncthreads)(const char *file, int line);
    /* value: the lane's bits (shuffles) or predicate (votes); arg: source lane, delta or
     * lane mask; width: the shuffle's segment. Returns the lane's result. */
    unsigned long long (*warp)(int op, unsigned mask, unsigned long long value, int arg,
                               int width, const char *file, int line);
    void (*trap)(const char *file, int line); /* does not return                      */
    /* cp.async: op MJ_SIM_CP_COPY poisons the n destination bytes and queues the copy (on a
     * GPU the data may land any time until the wait), MJ_SIM_CP_COMMIT closes a group,
     * MJ_SIM_CP_WAIT performs every copy of the groups but the newest n; MJ_SIM_CP_COPY_INDEX
     * is a copy as MJ_SIM_CP_COPY, of an index rather than a weight (not counted with the
     * weight stream). */
    void (*cp_async)(int op, void *dst, const void *src, int n, const char *file, int line);
};
enum mj_sim_cp_op { MJ_SIM_CP_COPY = 0, MJ_SIM_CP_COMMIT, MJ_SIM_CP_WAIT, MJ_SIM_CP_COPY_INDEX };
#endif /* MJ_SIM_ABI_H */

#ifndef MJ_SIM_ABI_ONLY
#include <math.h>
#include <stdbool.h>
#include <stddef.h>

/* The integer types as prelude_cuda.h spells them (64-bit ones are long long there). */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

/* Kernels are plain functions, hidden in the object (it is built with -fvisibility=hidden);
 * the runtime calls the exported mj_sim_entry_<kernel> trampolines after the body. */
#define MJ_KERNEL
#define MJ_DEVICE static inline
#define MJ_SHARED static __thread
#define MJ_DYNAMIC_SHARED(type, name) type *const name = (type *)mj_sim_self()->dyn_smem
#define MJ_RESTRICT restrict
/* Before a loop that must be unrolled (it indexes register arrays). */
#define MJ_UNROLL 
#define MJ_NO_UNROLL
#define MJ_SIM_ENTRY __attribute__((visibility("default")))
#define MJ_TEMPLATE(name, doc)
#define MJ_TARGETS(list)
#define MJ_KNOB_RANGE(name, ctype, lo, hi, doc)
#define MJ_KNOB_SET(name, ctype, values, doc)
#define MJ_CONSTRAINT(expr, doc)
#define MJ_PDL(doc)

/* CUDA's own spellings, for kernels that use them. */
#define __global__
#define __device__
#define __host__
#define __shared__ static __thread
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

static const struct mj_sim_api *mj_sim_api_;

MJ_SIM_ENTRY int mj_sim_bind(const struct mj_sim_api *api) {
    mj_sim_api_ = api;
    return MJ_SIM_ABI_VERSION;
}

/* The calling thread's state. Constant for the whole run of one CUDA thread, hence const. */
__attribute__((const)) static inline const mj_sim_thread *mj_sim_self(void) {
    return mj_sim_api_->self();
}

typedef mj_sim_dim3 uint3;
typedef mj_sim_dim3 dim3;
#define threadIdx (mj_sim_self()->thread_idx)
#define blockIdx (mj_sim_self()->block_idx)
#define blockDim (mj_sim_self()->block_dim)
#define gridDim (mj_sim_self()->grid_dim)
#define warpSize 32

/* ---- barriers and warp collectives ---------------------------------------------------- */
#define __syncthreads() mj_sim_api_->syncthreads(__FILE__, __LINE__)
#define MJ_SIM_FIRST_OR_FULL_(dummy, a, ...) a
#define MJ_SIM_FIRST_OR_FULL(...) MJ_SIM_FIRST_OR_FULL_(, ##__VA_ARGS__, 0xFFFFFFFFu)
#define __syncwarp(...)                                                                     \
    ((void)mj_sim_api_->warp(MJ_SIM_OP_SYNCWARP, MJ_SIM_FIRST_OR_FULL(__VA_ARGS__), 0, 0, 32, \
                             __FILE__, __LINE__))
#define __activemask() ((unsigned)mj_sim_api_->warp(MJ_SIM_OP_ACTIVEMASK, 0, 0, 0, 32, __FILE__, __LINE__))
#define __trap() (mj_sim_api_->trap(__FILE__, __LINE__), __builtin_unreachable())

static inline unsigned long long mj_sim_warp_(int op, unsigned mask, unsigned long long v, int a,
                                              int w, const char *f, int l) {
    return mj_sim_api_->warp(op, mask, v, a, w, f, l);
}
static inline int mj_sim_shfl_i(int op, unsigned m, int v, int a, int w, const char *f, int l) {
    return (int)(unsigned)mj_sim_warp_(op, m, (unsigned)v, a, w, f, l);
}
static inline unsigned mj_sim_shfl_u(int op, unsigned m, unsigned v, int a, int w, const char *f, int l) {
    return (unsigned)mj_sim_warp_(op, m, v, a, w, f, l);
}
static inline long mj_sim_shfl_l(int op, unsigned m, long v, int a, int w, const char *f, int l) {
    return (long)mj_sim_warp_(op, m, (unsigned long long)v, a, w, f, l);
}
static inline unsigned long mj_sim_shfl_ul(int op, unsigned m, unsigned long v, int a, int w,
                                           const char *f, int l) {
    return (unsigned long)mj_sim_warp_(op, m, v, a, w, f, l);
}
static inline long long mj_sim_shfl_ll(int op, unsigned m, long long v, int a, int w, const char *f,
                                       int l) {
    return (long long)mj_sim_warp_(op, m, (unsigned long long)v, a, w, f, l);
}
static inline unsigned long long mj_sim_shfl_ull(int op, unsigned m, unsigned long long v, int a,
                                                 int w, const char *f, int l) {
    return mj_sim_warp_(op, m, v, a, w, f, l);
}
static inline float mj_sim_shfl_f(int op, unsigned m, float v, int a, int w, const char *f, int l) {
    union { float f; unsigned u; } x;
    x.f = v;
    x.u = (unsigned)mj_sim_warp_(op, m, x.u, a, w, f, l);
    return x.f;
}
static inline double mj_sim_shfl_d(int op, unsigned m, double v, int a, int w, const char *f, int l) {
    union { double d; unsigned long long u; } x;
    x.d = v;
    x.u = mj_sim_warp_(op, m, x.u, a, w, f, l);
    return x.d;
}
/* The overloads of CUDA's shuffles, chosen by the value's type; the width is optional. */
#define MJ_SIM_SHFL_(op, mask, v, arg, width, ...)                                          \
    _Generic((v), float: mj_sim_shfl_f, double: mj_sim_shfl_d, unsigned: mj_sim_shfl_u,      \
             long: mj_sim_shfl_l, unsigned long: mj_sim_shfl_ul, long long: mj_sim_shfl_ll,  \
             unsigned long long: mj_sim_shfl_ull, default: mj_sim_shfl_i)(                   \
        op, (mask), (v), (arg), (width), __FILE__, __LINE__)
#define __shfl_sync(mask, v, ...) MJ_SIM_SHFL_(MJ_SIM_OP_SHFL_IDX, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_up_sync(mask, v, ...) MJ_SIM_SHFL_(MJ_SIM_OP_SHFL_UP, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_down_sync(mask, v, ...) MJ_SIM_SHFL_(MJ_SIM_OP_SHFL_DOWN, mask, v, __VA_ARGS__, 32, 0)
#define __shfl_xor_sync(mask, v, ...) MJ_SIM_SHFL_(MJ_SIM_OP_SHFL_XOR, mask, v, __VA_ARGS__, 32, 0)
#define __ballot_sync(mask, pred) \
    ((unsigned)mj_sim_warp_(MJ_SIM_OP_BALLOT, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) \
    ((int)mj_sim_warp_(MJ_SIM_OP_ANY, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) \
    ((int)mj_sim_warp_(MJ_SIM_OP_ALL, (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
/* The unsigned warp reductions of every lane (prelude_cuda.h: __reduce_max/min_sync, one
 * REDUX instruction on sm_80 and later). */
#define mj_warp_umax(v) \
    ((unsigned)mj_sim_warp_(MJ_SIM_OP_REDUX_UMAX, 0xFFFFFFFFu, (unsigned)(v), 0, 32, __FILE__, __LINE__))
#define mj_warp_umin(v) \
    ((unsigned)mj_sim_warp_(MJ_SIM_OP_REDUX_UMIN, 0xFFFFFFFFu, (unsigned)(v), 0, 32, __FILE__, __LINE__))

/* ---- bit and math intrinsics ------------------------------------------------------------ */
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}
/* (glibc declares __expf and __logf itself: macros here.) */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
#define __ldg(p) (*(p))
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* ---- atomics: real atomics across the workers (relaxed, as CUDA's are) ------------------ */
#define MJ_SIM_RMW_(name, T, op) \
    static inline T name(T *p, T v) { return __atomic_fetch_##op(p, v, __ATOMIC_RELAXED); }
MJ_SIM_RMW_(mj_sim_add_i, int, add)
MJ_SIM_RMW_(mj_sim_add_u, unsigned, add)
MJ_SIM_RMW_(mj_sim_add_ul, unsigned long, add)
MJ_SIM_RMW_(mj_sim_add_ull, unsigned long long, add)
MJ_SIM_RMW_(mj_sim_sub_i, int, sub)
MJ_SIM_RMW_(mj_sim_sub_u, unsigned, sub)
MJ_SIM_RMW_(mj_sim_and_i, int, and)
MJ_SIM_RMW_(mj_sim_and_u, unsigned, and)
MJ_SIM_RMW_(mj_sim_and_ull, unsigned long long, and)
MJ_SIM_RMW_(mj_sim_or_i, int, or)
MJ_SIM_RMW_(mj_sim_or_u, unsigned, or)
MJ_SIM_RMW_(mj_sim_or_ull, unsigned long long, or)
MJ_SIM_RMW_(mj_sim_xor_i, int, xor)
MJ_SIM_RMW_(mj_sim_xor_u, unsigned, xor)
MJ_SIM_RMW_(mj_sim_xor_ull, unsigned long long, xor)
#define MJ_SIM_XCHG_(name, T) \
    static inline T name(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
MJ_SIM_XCHG_(mj_sim_xchg_i, int)
MJ_SIM_XCHG_(mj_sim_xchg_u, unsigned)
MJ_SIM_XCHG_(mj_sim_xchg_ull, unsigned long long)
#define MJ_SIM_CAS_(name, T)                                                                \
    static inline T name(T *p, T expected, T desired) {                                    \
        __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
        return expected;                                                                    \
    }
MJ_SIM_CAS_(mj_sim_cas_i, int)
MJ_SIM_CAS_(mj_sim_cas_u, unsigned)
MJ_SIM_CAS_(mj_sim_cas_ull, unsigned long long)
/* The rest are compare-and-swap loops over the value's bits. */
#define MJ_SIM_CAS_LOOP_(name, T, B, update)                                                \
    static inline T name(T *p, T v) {                                                       \
        union { T t; B b; } old, nw;                                                        \
        old.b = __atomic_load_n((B *)p, __ATOMIC_RELAXED);                                  \
        do {                                                                                \
            nw.t = (update);                                                                \
        } while (!__atomic_compare_exchange_n((B *)p, &old.b, nw.b, 1, __ATOMIC_RELAXED,     \
                                              __ATOMIC_RELAXED));                           \
        return old.t;                                                                       \
    }
MJ_SIM_CAS_LOOP_(mj_sim_add_f, float, unsigned, old.t + v)
MJ_SIM_CAS_LOOP_(mj_sim_add_d, double, unsigned long long, old.t + v)
MJ_SIM_CAS_LOOP_(mj_sim_xchg_f, float, unsigned, v)
MJ_SIM_CAS_LOOP_(mj_sim_max_i, int, int, old.t > v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_max_u, unsigned, unsigned, old.t > v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_max_ll, long long, long long, old.t > v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_max_ull, unsigned long long, unsigned long long, old.t > v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_min_i, int, int, old.t < v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_min_u, unsigned, unsigned, old.t < v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_min_ll, long long, long long, old.t < v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_min_ull, unsigned long long, unsigned long long, old.t < v ? old.t : v)
MJ_SIM_CAS_LOOP_(mj_sim_inc_u, unsigned, unsigned, old.t >= v ? 0u : old.t + 1u)
MJ_SIM_CAS_LOOP_(mj_sim_dec_u, unsigned, unsigned, (old.t == 0u || old.t > v) ? v : old.t - 1u)

#define atomicAdd(p, v)                                                                     \
    _Generic((p), int *: mj_sim_add_i, unsigned *: mj_sim_add_u, unsigned long *: mj_sim_add_ul, \
             unsigned long long *: mj_sim_add_ull, float *: mj_sim_add_f,                   \
             double *: mj_sim_add_d)((p), (v))
#define atomicSub(p, v) _Generic((p), int *: mj_sim_sub_i, unsigned *: mj_sim_sub_u)((p), (v))
#define atomicExch(p, v)                                                                    \
    _Generic((p), int *: mj_sim_xchg_i, unsigned *: mj_sim_xchg_u,                          \
             unsigned long long *: mj_sim_xchg_ull, float *: mj_sim_xchg_f)((p), (v))
#define atomicCAS(p, e, d)                                                                  \
    _Generic((p), int *: mj_sim_cas_i, unsigned *: mj_sim_cas_u,                            \
             unsigned long long *: mj_sim_cas_ull)((p), (e), (d))
#define atomicMax(p, v)                                                                     \
    _Generic((p), int *: mj_sim_max_i, unsigned *: mj_sim_max_u, long long *: mj_sim_max_ll, \
             unsigned long long *: mj_sim_max_ull)((p), (v))
#define atomicMin(p, v)                                                                     \
    _Generic((p), int *: mj_sim_min_i, unsigned *: mj_sim_min_u, long long *: mj_sim_min_ll, \
             unsigned long long *: mj_sim_min_ull)((p), (v))
#define atomicAnd(p, v) \
    _Generic((p), int *: mj_sim_and_i, unsigned *: mj_sim_and_u, unsigned long long *: mj_sim_and_ull)((p), (v))
#define atomicOr(p, v) \
    _Generic((p), int *: mj_sim_or_i, unsigned *: mj_sim_or_u, unsigned long long *: mj_sim_or_ull)((p), (v))
#define atomicXor(p, v) \
    _Generic((p), int *: mj_sim_xor_i, unsigned *: mj_sim_xor_u, unsigned long long *: mj_sim_xor_ull)((p), (v))
#define atomicInc(p, v) mj_sim_inc_u((p), (v))
#define atomicDec(p, v) mj_sim_dec_u((p), (v))

/* ---- vector types (NVRTC has them built in, with the same alignment) -------------------- */
typedef struct __attribute__((aligned(8))) { float x, y; } float2;
typedef struct { float x, y, z; } float3;
typedef struct __attribute__((aligned(16))) { float x, y, z, w; } float4;
typedef struct __attribute__((aligned(8))) { int x, y; } int2;
typedef struct { int x, y, z; } int3;
typedef struct __attribute__((aligned(16))) { int x, y, z, w; } int4;
typedef struct __attribute__((aligned(8))) { unsigned x, y; } uint2;
typedef struct __attribute__((aligned(16))) { unsigned x, y, z, w; } uint4;
static inline float2 make_float2(float x, float y) { float2 r = {x, y}; return r; }
static inline float3 make_float3(float x, float y, float z) { float3 r = {x, y, z}; return r; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = {x, y, z, w}; return r; }
static inline int2 make_int2(int x, int y) { int2 r = {x, y}; return r; }
static inline int3 make_int3(int x, int y, int z) { int3 r = {x, y, z}; return r; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 r = {x, y, z, w}; return r; }
static inline uint2 make_uint2(unsigned x, unsigned y) { uint2 r = {x, y}; return r; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 r = {x, y, z}; return r; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 r = {x, y, z, w}; return r; }

/* A float's bits, and back (what base/base.h's mj_f32_bits / mj_f32_from_bits are on the host). */
MJ_DEVICE uint32_t mj_f32_bits(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    return v.u;
}
MJ_DEVICE float mj_f32_from_bits(uint32_t u) {
    union { uint32_t u; float f; } v;
    v.u = u;
    return v.f;
}
/* ---- hooks: helpers that are inline PTX under NVRTC (prelude_cuda.h) ------------------- */
/* The lane of the calling thread within its warp (%laneid). */
MJ_DEVICE unsigned mj_lane_id(void) { return mj_sim_self()->lane; }

/* The warp-wide MMAs: every lane of the warp must reach them (as mma.sync requires);
 * the runtime gathers the 32 lanes' fragments and computes D = A B + C. */
static inline void mj_sim_mma_(int kind, float d[4], const unsigned a[4], const unsigned b[2],
                               const float c[4], unsigned sfa, unsigned sfb, const char *f, int l) {
    mj_sim_mma m;
    for (int i = 0; i < 4; i++) m.a[i] = a[i], m.c[i] = c[i];
    m.b[0] = b[0], m.b[1] = b[1], m.sfa = sfa, m.sfb = sfb;
    mj_sim_api_->warp(MJ_SIM_OP_MMA, 0xFFFFFFFFu, (unsigned long long)(size_t)&m, kind, 32, f, l);
    for (int i = 0; i < 4; i++) d[i] = m.d[i];
}
#define mj_mma_bf16_m16n8k16(d, a, b, c) \
    mj_sim_mma_(MJ_SIM_MMA_BF16_M16N8K16, (d), (a), (b), (c), 0u, 0u, __FILE__, __LINE__)
#define mj_mma_e2m1_m16n8k64(d, a, b, c, sfa, sfb) \
    mj_sim_mma_(MJ_SIM_MMA_E2M1_M16N8K64, (d), (a), (b), (c), (sfa), (sfb), __FILE__, __LINE__)

/* Asynchronous copies into shared memory: the destination is poisoned (0xFF) at the copy
 * and the data lands at the wait that covers its group, the two ends of when a GPU may
 * land it (so early reads and early refills both read poison); counted with the streamed
 * loads. */
MJ_DEVICE void mj_cp_async16(void *dst, const void *src) {
    mj_sim_api_->cp_async(MJ_SIM_CP_COPY, dst, src, 16, __FILE__, __LINE__);
}
/* An 8-byte copy of weights (half a run's scales): counted with them. */
MJ_DEVICE void mj_cp_async8(void *dst, const void *src) {
    mj_sim_api_->cp_async(MJ_SIM_CP_COPY, dst, src, 8, __FILE__, __LINE__);
}
/* A 4-byte copy of an index (a row's top-k entry) beside the weights: not a weight byte. */
MJ_DEVICE void mj_cp_async4(void *dst, const void *src) {
    mj_sim_api_->cp_async(MJ_SIM_CP_COPY_INDEX, dst, src, 4, __FILE__, __LINE__);
}
MJ_DEVICE void mj_cp_async_commit(void) { mj_sim_api_->cp_async(MJ_SIM_CP_COMMIT, 0, 0, 0, __FILE__, __LINE__); }
/* An L2 prefetch: the byte at p read (so a prefetch outside an allocation is found, as the
 * sanitizers see reads), and counted with its line's index for the tests. */
MJ_DEVICE void mj_prefetch_l2(const void *p) {
    (void)*(const volatile unsigned char *)p;
    unsigned long long *c = mj_sim_self()->prefetch, line = (unsigned long long)(size_t)p >> 7;
    c[0] += 1, c[1] += line, c[2] += line * line;
}
/* Programmatic dependent launch: on the interpreter, launches run one after another. */
MJ_DEVICE void mj_grid_dep_wait(void) {}
#define mj_cp_async_wait(n) mj_sim_api_->cp_async(MJ_SIM_CP_WAIT, 0, 0, (n), __FILE__, __LINE__)
/* A 16-byte load of weights that are read once: counted, so tests can prove which bytes a
 * launch read and how often. */
/* A float written by another block of the same grid (another worker): an atomic load. */
MJ_DEVICE float mj_ld_cg_f32(const float *p) {
    float v;
    __atomic_load((const float *)p, &v, __ATOMIC_RELAXED);
    return v;
}
/* Two such floats (8-byte aligned: a GPU faults on a misaligned vector load, so does this). */
MJ_DEVICE float2 mj_ld_cg_f32x2(const float *p) {
    if ((size_t)p & 7u) __trap();
    return make_float2(mj_ld_cg_f32(p), mj_ld_cg_f32(p + 1));
}
MJ_DEVICE uint4 mj_ld_stream(const void *p) {
    *mj_sim_self()->stream_bytes += 16;
    return *(const uint4 *)p;
}
/* The FP4 / FP8 encoders (the conversion hooks below call them), on the rule of the
 * cvt.rn.satfinite instructions prelude_cuda.h uses. */
#include "prelude_fp.h"

/* CUDA's __byte_perm: byte n of the result is byte (s >> 4n) & 7 of y:x (x bytes 0..3). */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}
/* Two bf16 products, rounded to nearest even (as fma.rn.bf16x2 with -0 does). */
static inline float mj_sim_bf16_f_(unsigned h) {
    union { unsigned u; float f; } v = {h << 16};
    return v.f;
}
static inline unsigned mj_sim_f_bf16_(float f) {
    union { float f; unsigned u; } v = {f};
    if ((v.u & 0x7F800000u) == 0x7F800000u && (v.u & 0x7FFFFFu)) return (v.u >> 16) | 0x40u;
    return (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16;
}
MJ_DEVICE uint32_t mj_mul_bf16x2(uint32_t a, uint32_t b) {
    return mj_sim_f_bf16_(mj_sim_bf16_f_(a & 0xFFFFu) * mj_sim_bf16_f_(b & 0xFFFFu)) |
           mj_sim_f_bf16_(mj_sim_bf16_f_(a >> 16) * mj_sim_bf16_f_(b >> 16)) << 16;
}
/* The conversion hooks: two E2M1 codes (lo in bits 0..3), an E4M3 byte. */
MJ_DEVICE uint32_t mj_cvt_e2m1x2(float lo, float hi) { return mj_e2m1_enc_c(lo) | mj_e2m1_enc_c(hi) << 4; }
MJ_DEVICE uint32_t mj_cvt_e4m3(float x) { return mj_e4m3_enc_c(x); }
#endif /* MJ_SIM_ABI_ONLY */
/* ---- end of prelude ------------------------------------------------------------------ */
