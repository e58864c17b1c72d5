/* reflect_prelude.h — what gen/reflect (libclang) sees in front of a template: the CUDA
 * qualifiers as plain C, and the template declarations as annotated declarations it can
 * find in the AST. Templates are C-style CUDA, so they parse as C11 with this. */
#include <stdint.h>
#define __global__
#define __device__
#define __shared__
#define __forceinline__ inline
#define __restrict__ restrict
#define MJ_KERNEL __attribute__((annotate("mj_kernel")))
#define MJ_DEVICE static inline
#define MJ_SHARED
#define MJ_DYNAMIC_SHARED(type, name) extern type name[]
#define MJ_RESTRICT restrict
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
typedef struct { unsigned x, y, z; } mj_reflect_dim3;
extern const mj_reflect_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern const int warpSize;
void __syncthreads(void);
void __syncwarp(unsigned mask);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
float __shfl_down_sync(unsigned mask, float v, int delta);
float __shfl_up_sync(unsigned mask, float v, int delta);
float __shfl_sync(unsigned mask, float v, int src);
unsigned __ballot_sync(unsigned mask, int pred);
int __any_sync(unsigned mask, int pred);
int __all_sync(unsigned mask, int pred);
int __popc(unsigned x);
int __ffs(int x);
int __clz(int x);
float atomicAdd(float *p, float v);
