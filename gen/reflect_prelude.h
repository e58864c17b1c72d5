/* reflect_prelude.h — what gen/reflect (libclang) sees in front of a template: the CUDA
 * qualifiers as plain C, and the template declarations as annotated declarations it can
 * find in the AST. Templates are C-style CUDA, so they parse as C11 with this. */
#include <stdint.h>
#define __global__
#define __device__
#define __shared__
#define __forceinline__ inline
#define __restrict__ restrict
#define __launch_bounds__(...)
#define MJ_KERNEL __attribute__((annotate("mj_kernel")))
#define MJ_DEVICE static inline
#define MJ_SHARED
#define MJ_DYNAMIC_SHARED(type, name) extern type name[]
#define MJ_RESTRICT restrict
/* Before a loop that must be unrolled (it indexes register arrays). */
#define MJ_UNROLL 
#define MJ_NO_UNROLL
#define MJ_TEMPLATE(name, doc) \
    __attribute__((annotate("mj_template|" #name "|" doc))) static const int mj_decl_template_##name = 0;
#define MJ_TARGETS(list) \
    __attribute__((annotate("mj_targets|" list))) static const int mj_decl_targets = 0;
#define MJ_KNOB_RANGE(name, ctype, lo, hi, doc) \
    __attribute__((annotate("mj_knob|range|" #name "|" #ctype "|" #lo "|" #hi "|" doc))) \
    static const int mj_decl_knob_##name = 0;
#define MJ_KNOB_SET(name, ctype, values, doc) \
    __attribute__((annotate("mj_knob|set|" #name "|" #ctype "|" values "|" doc))) \
    static const int mj_decl_knob_##name = 0;
#define MJ_PDL(doc) \
    __attribute__((annotate("mj_pdl|" doc))) static const int mj_decl_pdl = 0;
#define MJ_REFLECT_CAT2_(a, b) a##b
#define MJ_REFLECT_CAT_(a, b) MJ_REFLECT_CAT2_(a, b)
#define MJ_CONSTRAINT(expr, doc) \
    __attribute__((annotate("mj_constraint|" doc "|" expr))) \
    static const int MJ_REFLECT_CAT_(mj_decl_constraint_, __LINE__) = 0;
typedef struct { unsigned x, y, z; } mj_reflect_dim3;
extern const mj_reflect_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern const int warpSize;
/* The device functions templates may call, loosely typed (only parsing needs them): the
 * shuffles take an optional width, the atomics any pointer. */
void __syncthreads(void);
void __syncwarp();
unsigned __activemask(void);
void __trap(void);
void __threadfence(void);
void __threadfence_block(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask, ...);
float __shfl_down_sync(unsigned mask, float v, int delta, ...);
float __shfl_up_sync(unsigned mask, float v, int delta, ...);
float __shfl_sync(unsigned mask, float v, int src, ...);
unsigned __ballot_sync(unsigned mask, int pred);
int __any_sync(unsigned mask, int pred);
int __all_sync(unsigned mask, int pred);
int __popc(unsigned x);
int __popcll(unsigned long long x);
int __ffs(int x);
int __ffsll(long long x);
int __clz(int x);
int __clzll(long long x);
unsigned __brev(unsigned x);
float __expf(float x);
float __logf(float x);
float __fdividef(float a, float b);
float rsqrtf(float x);
float __saturatef(float x);
float expf(float x);
float logf(float x);
float sqrtf(float x);
float fabsf(float x);
float fminf(float a, float b);
float fmaxf(float a, float b);
float atomicAdd(void *p, ...);
int atomicSub(void *p, ...);
int atomicExch(void *p, ...);
int atomicCAS(void *p, ...);
int atomicMax(void *p, ...);
int atomicMin(void *p, ...);
int atomicAnd(void *p, ...);
int atomicOr(void *p, ...);
int atomicXor(void *p, ...);
unsigned atomicInc(void *p, ...);
unsigned atomicDec(void *p, ...);
typedef struct { float x, y; } float2;
typedef struct { float x, y, z; } float3;
typedef struct { float x, y, z, w; } float4;
typedef struct { int x, y; } int2;
typedef struct { int x, y, z; } int3;
typedef struct { int x, y, z, w; } int4;
typedef struct { unsigned x, y; } uint2;
typedef mj_reflect_dim3 uint3;
typedef struct { unsigned x, y, z, w; } uint4;
float2 make_float2(float x, float y);
float3 make_float3(float x, float y, float z);
float4 make_float4(float x, float y, float z, float w);
int2 make_int2(int x, int y);
int3 make_int3(int x, int y, int z);
int4 make_int4(int x, int y, int z, int w);
uint2 make_uint2(unsigned x, unsigned y);
uint3 make_uint3(unsigned x, unsigned y, unsigned z);
uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w);
uint32_t mj_f32_bits(float f);
float mj_f32_from_bits(uint32_t u);
/* Hooks (inline PTX in prelude_cuda.h, C in prelude_sim.h). */
unsigned mj_lane_id(void);
void mj_mma_bf16_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
void mj_mma_e2m1_m16n8k64(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                          uint32_t sfa, uint32_t sfb);
uint4 mj_ld_stream(const void *p);
void mj_cp_async16(void *dst, const void *src);
void mj_cp_async4(void *dst, const void *src);
void mj_cp_async_commit(void);
void mj_grid_dep_wait(void);
float mj_ld_cg_f32(const float *p);
void mj_cp_async_wait(int n);
uint32_t mj_cvt_e2m1x2(float lo, float hi);
uint32_t mj_cvt_e4m3(float x);
/* templates/prelude_fp.h, which both preludes include. */
uint32_t mj_e4m3_enc_c(float x);
uint32_t mj_e2m1_enc_c(float x);
float mj_e4m3_dec_c(uint32_t b);
uint32_t mj_mul_bf16x2(uint32_t a, uint32_t b);
unsigned __byte_perm(unsigned x, unsigned y, unsigned s);
