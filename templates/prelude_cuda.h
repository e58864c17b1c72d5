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
#define MJ_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[] /* 16-byte accesses, past any static */
#define MJ_RESTRICT __restrict__
/* Before a loop whose unrolling buys nothing on the GPU but costs compile time. */
/* Before a loop that must be unrolled (it indexes register arrays). */
#define MJ_UNROLL _Pragma("unroll")
#define MJ_NO_UNROLL _Pragma("unroll 1")
/* Template declarations are read at build time by gen/reflect; here they are no-ops. */
#define MJ_TEMPLATE(name, doc)
#define MJ_TARGETS(list)
#define MJ_KNOB_RANGE(name, ctype, lo, hi, doc)
#define MJ_KNOB_SET(name, ctype, values, doc)
#define MJ_CONSTRAINT(expr, doc)
#define MJ_PDL(doc)
/* A float's bits, and back (what base/base.h's mj_f32_bits / mj_f32_from_bits are on the host):
 * CUDA's own reinterpretations. */
MJ_DEVICE uint32_t mj_f32_bits(float f) { return __float_as_uint(f); }
MJ_DEVICE float mj_f32_from_bits(uint32_t u) { return __uint_as_float(u); }
/* Hooks: helpers that are inline PTX here and C in prelude_sim.h (same signatures). */
/* The lane of the calling thread within its warp (%laneid). */
MJ_DEVICE unsigned mj_lane_id(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(r));
    return r;
}
/* The warp-wide MMAs, D = A B + C with the PTX fragment layouts (every lane of the warp). */
MJ_DEVICE void mj_mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%10,%11,%12,%13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}
/* Block-scaled FP4 (sm_120a, sm_121a): 4 ue4m3 scales per row of A (lanes p = 0, 1) and per
 * column of B (lane p = 0), one per 16 k; byte and thread ids 0. */
MJ_DEVICE void mj_mma_e2m1_m16n8k64(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                                    uint32_t sfa, uint32_t sfb) {
#if MJ_TARGET_SM >= 120
    asm volatile("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1."
                 "e2m1.f32.ue4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13}, %14, {0, 0}, "
                 "%15, {0, 0};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]), "r"(sfa), "r"(sfb));
#else
    (void)d, (void)a, (void)b, (void)c, (void)sfa, (void)sfb;
    __trap(); /* no FP4 tensor cores on this target: the dispatcher never picks it */
#endif
}
/* A 16-byte load of weights that are read once: through the non-coherent path, not kept in
 * L1 (they will not be read again). */
/* A float written by another block of the same grid: loaded through L2 (ld.global.cg), never
 * from a line this SM's L1 may hold. */
MJ_DEVICE float mj_ld_cg_f32(const float *p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
/* Two such floats (8-byte aligned). */
MJ_DEVICE float2 mj_ld_cg_f32x2(const float *p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0,%1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
    return v;
}
MJ_DEVICE uint4 mj_ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
/* Asynchronous copies of weights into shared memory (sm_80+): a 16-byte copy through L2
 * only (cp.async.cg: weights read once need no L1), the copies so far made one group, and
 * a wait until at most n groups are pending (n a constant). The "memory" clobbers keep the
 * compiler from moving shared-memory reads across them. */
MJ_DEVICE void mj_cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
/* An 8-byte copy of weights (cp.async.ca: .cg takes 16 bytes alone): half a run's scales. */
MJ_DEVICE void mj_cp_async8(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
/* A 4-byte copy (cp.async.ca: the only form of that size) of an index beside the weights. */
MJ_DEVICE void mj_cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;"
                 :
                 : "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
MJ_DEVICE void mj_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Programmatic dependent launch (sm_90+; templates that declare MJ_PDL): a kernel launched
 * while the one before it still runs waits here until that grid has finished and its
 * memory is visible; and lets the next kernel's blocks be scheduled as soon as every block
 * of this grid has started. Elsewhere, nothing. */
MJ_DEVICE void mj_grid_dep_wait(void) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* A hint: the 128-byte line holding p into L2 (prefetch.global.L2; nothing waits for it,
 * nothing is loaded into registers, and a GPU drops it rather than fault). */
MJ_DEVICE void mj_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}
/* The largest and the smallest of an unsigned value over every lane of the warp, in every
 * lane: one REDUX instruction (sm_80 and later, every target of ours). */
MJ_DEVICE uint32_t mj_warp_umax(uint32_t v) { return __reduce_max_sync(0xFFFFFFFFu, v); }
MJ_DEVICE uint32_t mj_warp_umin(uint32_t v) { return __reduce_min_sync(0xFFFFFFFFu, v); }
#define mj_cp_async_wait(n) asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory")
/* Conversions to the FP4 / FP8 formats: the cvt.rn.satfinite instruction where the target
 * has it, else prelude_fp.h's C, which follows the instruction's rule (nearest even, sign-
 * preserving saturation, the code's sign bit x's: -0.0 gives -0; see there). */
#include "prelude_fp.h"
/* Two E2M1 codes, lo in bits 0..3 (sm_100 and later: cvt.rn.satfinite.e2m1x2.f32). */
MJ_DEVICE uint32_t mj_cvt_e2m1x2(float lo, float hi) {
#if MJ_TARGET_SM >= 100
    uint32_t r;
    asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n mov.b32 %0, {t, t, t, t};\n}"
        : "=r"(r) : "f"(hi), "f"(lo));
    return r & 0xFFu;
#else
    return mj_e2m1_enc_c(lo) | mj_e2m1_enc_c(hi) << 4;
#endif
}
/* An E4M3 byte (sm_89 and later: cvt.rn.satfinite.e4m3x2.f32). */
MJ_DEVICE uint32_t mj_cvt_e4m3(float x) {
#if MJ_TARGET_SM >= 89
    uint32_t r;
    asm("{\n .reg .b16 t, z;\n mov.b16 z, 0;\n cvt.rn.satfinite.e4m3x2.f32 t, %1, %2;\n mov.b32 %0, {t, z};\n}"
        : "=r"(r) : "f"(0.0f), "f"(x));
    return r & 0xFFu;
#else
    return mj_e4m3_enc_c(x);
#endif
}
/* Two bf16 products, a * b elementwise (fma with -0: a zero keeps its sign). */
MJ_DEVICE uint32_t mj_mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}
/* ---- end of prelude ------------------------------------------------------------------ */
