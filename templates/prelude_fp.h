/* ---- prelude: the FP8 (E4M3FN) and FP4 (E2M1) encoders and the E4M3 decoder, in C -------
 * One copy, included by prelude_cuda.h (the C that targets without the cvt instruction
 * run, and the decoder the kernels use), by prelude_sim.h (the interpreter) and by
 * runtime/ref/nvfp4.c (the CPU reference: mj_e4m3_encode, mj_e2m1_encode and
 * mj_e4m3_decode are these). NVRTC and the interpreter's compiler read no files: when
 * gen/reflect.c embeds a prelude it replaces each `#include "..."` line naming a file beside
 * it by that file's text, so the rendered source holds this inline. Whoever includes it
 * has defined MJ_DEVICE, uint32_t, mj_f32_bits and mj_f32_from_bits.
 *
 * The rule is the GPU's: that of cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.satfinite.e2m1x2.f32
 * (PTX ISA, "Data Movement and Conversion Instructions: cvt"), which prelude_cuda.h uses
 * where the target has them (E4M3 from sm_89, E2M1 from sm_100):
 *   - round to nearest, ties to the even code (.rn);
 *   - a magnitude past the largest finite value, Inf included, gives that value with the
 *     sign of x (.satfinite: "sign-preserved MAX_NORM"): E4M3 +-448 = 0x7E / 0xFE, E2M1
 *     +-6 = 7 / 15;
 *   - the code's sign bit is x's sign bit, as IEEE rounding keeps the sign of a zero: +0.0
 *     gives +0 (0x00 / 0); -0.0, and a negative x that rounds to zero, give -0 (0x80 / 8);
 *   - NaN, which no caller passes: E4M3 0x7F (of either sign); E2M1 has no NaN: +6 (7).
 * CUDA's own software conversions, __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and
 * __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) of cuda_fp8.hpp / cuda_fp4.hpp (what
 * those headers use where they cannot emit the cvt), give the same byte as these for every
 * one of the 2^32 floats.
 * ModelOpt's weight export takes the sign as x < 0 instead (-0.0 gives +0): the reference's
 * weight quantizer, which writes ModelOpt's bytes, turns a -0.0 quotient into +0 first. */
#ifndef MJ_PRELUDE_FP_H
#define MJ_PRELUDE_FP_H

/* Round to E4M3FN (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
 * subnormal, (m/8) 2^-6; 0x7F is NaN, so the largest finite value is 0x7E = 448). */
MJ_DEVICE uint32_t mj_e4m3_enc_c(float x) {
    uint32_t u = mj_f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7Fu;         /* NaN, of either sign */
    if (a >= 0x43E80000u) return sign | 0x7Eu; /* |x| >= 464 = 448 + half a step, Inf: 448 */
    if (a < 0x3C800000u) {                     /* |x| < 2^-6: subnormal steps of 2^-9 */
        float q = mj_f32_from_bits(a) * 512.0f; /* exact: a power-of-two scale */
        uint32_t n = (uint32_t)q;               /* 0..7 */
        float r = q - (float)n;                 /* exact: the low bits of q */
        if (r > 0.5f || (r == 0.5f && (n & 1u))) n++;
        return sign | n; /* n == 8 is 0x08 = 2^-6, the first normal: right */
    }
    /* Keep 3 of the 23 mantissa bits, the 20 dropped rounded to nearest even; a carry out of
     * the mantissa bumps the exponent, which is right. 448 < |x| < 464 rounds to 448. */
    a += 0x7FFFFu + ((a >> 20) & 1u);
    uint32_t c = (((a >> 23) - 120u) << 3) | ((a >> 20) & 7u); /* exponent - 127 + 7 */
    return sign | (c > 0x7Eu ? 0x7Eu : c);
}

/* Round to E2M1 (1 sign, 2 exponent bits, 1 mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3,
 * 4, 6 for codes 0..7). A magnitude on a midpoint goes to the even code: <= for the
 * midpoints above an even code, < for those above an odd one. */
MJ_DEVICE uint32_t mj_e2m1_enc_c(float x) {
    uint32_t u = mj_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 7u; /* NaN: +6 */
    float a = mj_f32_from_bits(u & 0x7FFFFFFFu);
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7; /* past 5, Inf too: 6 */
    return ((u >> 28) & 8u) | c;
}

/* An E4M3FN byte's value: (m/8) 2^-6 for exponent 0, else (1 + m/8) 2^(e-7), placed as a
 * float's exponent and top mantissa bits. The NaN bytes 0x7F / 0xFF read +-480 here: the
 * kernels decode scales the cvt made or the checkpoint check passed, and the reference's
 * mj_e4m3_decode tests for the NaN first. */
MJ_DEVICE float mj_e4m3_dec_c(uint32_t b) {
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v = e ? mj_f32_from_bits(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    return (b & 0x80u) ? -v : v;
}

#endif /* MJ_PRELUDE_FP_H */
