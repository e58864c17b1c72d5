/* ---- prelude: the FP8 (E4M3FN) and FP4 (E2M1) encoders, in C ---------------------------
 * One copy, included by prelude_cuda.h (the C that targets without the cvt instruction
 * run) and by prelude_sim.h (the interpreter). NVRTC and the interpreter's compiler read no
 * files: when gen/reflect.c embeds a prelude it replaces each `#include "..."` line naming
 * a file beside it by that file's text, so the rendered source holds this inline. Whoever
 * includes it has defined MJ_DEVICE and uint32_t. */
#ifndef MJ_PRELUDE_FP_H
#define MJ_PRELUDE_FP_H

/* Conversions to the FP4 / FP8 formats: round to nearest even, saturating (E2M1 at +-6,
 * E4M3 at +-448), the sign bit for x < 0 (-0.0 gives +0, as ModelOpt writes it). The C
 * definitions below are the reference's (runtime/ref/nvfp4.c) and the interpreter's. */
/* Round to E4M3 (nearest, ties even, saturating at 448), as runtime/ref/nvfp4.c does. */
MJ_DEVICE uint32_t mj_e4m3_enc_c(float x) {
    uint32_t sign = x < 0.0f ? 0x80u : 0u;
    float a = x < 0.0f ? -x : x;
    if (a >= 464.0f) return sign | 0x7Eu;    /* 448 + half a step: saturate */
    if (a < 0.015625f) {                      /* below 2^-6: subnormal steps of 2^-9 */
        float q = a * 512.0f;
        uint32_t n = (uint32_t)q;
        float r = q - (float)n;
        if (r > 0.5f || (r == 0.5f && (n & 1u))) n++;
        return sign | n; /* n == 8 is 0x08 = 2^-6, the first normal: right */
    }
    union { float f; uint32_t u; } fb;
    fb.f = a;
    uint32_t u = fb.u;
    uint32_t e = (u >> 23) - 127u + 7u, mant = (u >> 20) & 7u, rest = u & 0xFFFFFu;
    if (rest > 0x80000u || (rest == 0x80000u && (mant & 1u))) {
        mant++;
        if (mant == 8u) mant = 0, e++;
    }
    uint32_t r = (e << 3) | mant;
    return sign | (r > 0x7Eu ? 0x7Eu : r);
}

/* Round to E2M1 (nearest, ties to the even code, saturating at 6); sign as x < 0. */
MJ_DEVICE uint32_t mj_e2m1_enc_c(float x) {
    uint32_t sign = x < 0.0f ? 8u : 0u;
    float a = x < 0.0f ? -x : x;
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return sign | c;
}

#endif /* MJ_PRELUDE_FP_H */
