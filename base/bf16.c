/* bf16.c — bfloat16 conversions and the normal deviate used by random layers. */
#include "base.h"

#include <math.h>

uint16_t mj_f32_to_bf16(float x) {
    uint32_t u = mj_f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) /* NaN: keep it quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float mj_bf16_to_f32(uint16_t x) { return mj_f32_from_bits((uint32_t)x << 16); }

/* Two standard normals from one polar (Marsaglia) draw: no trigonometry. */
void mj_rng_normal2(uint64_t *state, double *a, double *b) {
    double u, v, r;
    do {
        u = 2.0 * mj_rng_uniform(state) - 1.0;
        v = 2.0 * mj_rng_uniform(state) - 1.0;
        r = u * u + v * v;
    } while (r >= 1.0 || r == 0.0);
    double f = sqrt(-2.0 * log(r) / r);
    *a = u * f;
    *b = v * f;
}

double mj_rng_normal(uint64_t *state) {
    double u1 = mj_rng_uniform(state), u2 = mj_rng_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
