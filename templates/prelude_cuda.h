/* ---- prelude: CUDA (NVRTC) ------------------------------------------------------------
 * No CUDA headers: the few types and qualifiers kernels use are spelled out here, so a
 * cold compile stays fast. Kernels are C-style CUDA; entry points are extern "C" so their
 * names are the template's names. */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define MJ_KERNEL extern "C" __global__
#define MJ_DEVICE static __device__ __forceinline__
#define MJ_SHARED __shared__
#define MJ_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define MJ_RESTRICT __restrict__
/* Template declarations are read at build time by gen/reflect; here they are no-ops. */
#define MJ_TEMPLATE(name, doc)
#define MJ_TARGETS(list)
#define MJ_KNOB_RANGE(name, ctype, lo, hi, doc)
#define MJ_KNOB_SET(name, ctype, values, doc)
#define MJ_CONSTRAINT(expr, doc)
/* Hooks: helpers that are inline PTX here and C in prelude_sim.h (same signatures). */
/* The lane of the calling thread within its warp (%laneid). */
MJ_DEVICE unsigned mj_lane_id(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
    return r;
}
/* ---- end of prelude ------------------------------------------------------------------ */
