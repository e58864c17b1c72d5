/* ref.h — the CPU references (the oracle every kernel is tested against): NVFP4 codecs,
 * routing, the MoE layer's forward. Not installed, not public; tests include it
 * to reach the bit-level helpers. */
#ifndef MJ_REF_H
#define MJ_REF_H

#include "base.h"

/* ---- NVFP4 bit-level helpers (runtime/ref/nvfp4.c) ---- */
/* The encoders are the kernels' own (templates/prelude_fp.h) and follow the GPU's
 * cvt.rn.satfinite.{e2m1x2,e4m3x2}.f32: nearest, ties to the even code; a magnitude past the
 * largest finite value (Inf too) gives that value with x's sign; the code's sign bit is x's
 * sign bit, so +0.0 gives +0 while -0.0, and a negative x that rounds to zero, give -0. */
/* E2M1 code (low 4 bits; bit 3 = sign) -> value. */
float mj_e2m1_decode(uint8_t code);
/* Round to E2M1, saturating at +-6 (7 / 15); -0.0 and x in [-0.25, 0) give code 8 (-0).
 * x must not be NaN (it gives 7). */
uint8_t mj_e2m1_encode(float x);
/* E4M3FN byte -> value (0x7F / 0xFF are NaN). */
float mj_e4m3_decode(uint8_t b);
/* Round to E4M3FN, saturating at +-448 (0x7E / 0xFE); -0.0 and x in [-2^-10, 0) give 0x80
 * (-0). x must not be NaN (it gives 0x7F). */
uint8_t mj_e4m3_encode(float x);
/* Block scales re-expressed against a larger weight_scale_2 (ratio = old / new <= 1): each
 * non-zero scale times ratio, rounded to e4m3, and kept non-zero (0x01 at least), so a block
 * that had values keeps them. The checkpoint loader and mj_experts_adopt use it when gate's
 * and up's weight_scale_2 differ. */
void mj_nvfp4_scales_reexpress(uint8_t *sf, int64_t n, float ratio);
/* The first of n UE4M3 block scales NVFP4 cannot hold (the e4m3 NaN 0x7F / 0xFF, or a
 * negative one: the kernels read them unsigned), or -1: the checkpoint loader's and the
 * adoption's checks. */
int64_t mj_nvfp4_scale_bad(const uint8_t *sf, int64_t n);

#define MJ_E2M1_MAX 6.0f
#define MJ_E4M3_MAX 448.0f

/* ---- the layer (runtime/ref/layer.c; its type: runtime/weights/layer.h) ---- */
/* The experts' part of mj_moe_forward_ref for a given routing (ids, wts [B, k], nsel [B]),
 * on the host: what one rank's expert kernels must compute (runtime/ref/layer.c). */
mj_status mj_experts_ref(mj_layer_t L, mj_weight_mode mode, const uint16_t *hidden, int32_t B, int32_t num_valid,
                         const int32_t *ids, const float *wts, const int32_t *nsel, float *out);
/* Set every linear's input_scale in L (routed and shared) as ModelOpt calibrates: amax of the
 * linear's input over n_tok tokens calib [n_tok, H] (amax x_amax) / (6 * 448); w2's input is
 * the expert's SwiGLU activation of those tokens. */
mj_status mj_layer_calibrate_ref(mj_layer_t L, const float *calib, int32_t n_tok, float x_amax);

/* ---- routing (runtime/ref/route_ref.c) ---- */
/* A caller's params (any struct_size the library knows) as today's struct; fn labels the
 * error. */
mj_status mj_route_params_load(const mj_route_params *in, const char *fn, mj_route_params *out);

#endif /* MJ_REF_H */
