/* internal.h — what the library's own files share; not installed, not public.
 * Tests include it to reach the bit-level helpers. */
#ifndef MJ_INTERNAL_H
#define MJ_INTERNAL_H

#include "moejit.h"

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define MJ_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MJ_PRINTF(a, b)
#endif

/* ---- errors (runtime/error.c) ----
 * mj_set_error records the detail for mj_last_error() and returns s, so a failure path is
 * one line: `return mj_set_error(MJ_ERR_CONFIG, "...: %s", why);`. */
mj_status mj_set_error(mj_status s, const char *fmt, ...) MJ_PRINTF(2, 3);
void mj_clear_error(void);

/* Propagate a failure, NCCL style. */
#define MJ_CHECK(call)                                                                   \
    do {                                                                                 \
        mj_status mj_check_s_ = (call);                                                  \
        if (mj_check_s_ != MJ_OK) return mj_check_s_;                                    \
    } while (0)
#define MJ_CHECK_GOTO(call, res, label)                                                  \
    do {                                                                                 \
        (res) = (call);                                                                  \
        if ((res) != MJ_OK) goto label;                                                  \
    } while (0)

/* ---- bf16 (runtime/bf16.c) ---- round to nearest even; NaN stays a (quiet) NaN. */
uint16_t mj_f32_to_bf16(float x);
float mj_bf16_to_f32(uint16_t x);

/* ---- NVFP4 bit-level helpers (runtime/nvfp4.c) ---- */
/* E2M1 code (low 4 bits; bit 3 = sign) -> value. */
float mj_e2m1_decode(uint8_t code);
/* Round to E2M1: nearest, ties to even code, saturating at +-6 (cvt.rn.satfinite).
 * A negative x that rounds to zero gives code 8 (-0). x must not be NaN. */
uint8_t mj_e2m1_encode(float x);
/* E4M3FN byte -> value (0x7F / 0xFF are NaN). */
float mj_e4m3_decode(uint8_t b);
/* Round a float to E4M3FN: nearest, ties to even, saturating at +-448. x must not be NaN. */
uint8_t mj_e4m3_encode(float x);

#define MJ_E2M1_MAX 6.0f
#define MJ_E4M3_MAX 448.0f

/* ---- the layer (runtime/layer.c) ---- */
struct mj_layer {
    mj_moe_config cfg;       /* the model's (unsplit) config                               */
    mj_parallel par;         /* how this handle was sliced (MJ_PAR_NONE: the whole layer)  */
    int32_t rank, n_ranks;
    int32_t i_local;         /* intermediate rows of one routed expert held here           */
    int32_t expert_begin;    /* first routed expert held here                              */
    int32_t n_local;         /* routed experts held here                                   */
    uint16_t *gate;          /* [E, H] bf16 router weight (every rank holds all of it)     */
    float *bias;             /* [E] e_score_correction_bias, or NULL                       */
    mj_nvfp4_linear *w13;    /* [n_local]: each [2*i_local, H], rows [gate ; up]           */
    mj_nvfp4_linear *w2;     /* [n_local]: each [H, i_local]                               */
    int32_t has_shared;      /* 1 if this handle holds (its slice of) the shared experts   */
    int32_t is_local;        /* shared intermediate rows held here                         */
    mj_nvfp4_linear shared_w13; /* [2*is_local, H]                                         */
    mj_nvfp4_linear shared_w2;  /* [H, is_local]                                           */
};

/* ---- small helpers ---- */
/* splitmix64: the seeded generator of tests and random layers. */
static inline uint64_t mj_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double mj_rng_uniform(uint64_t *state) {
    return (double)(mj_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}
/* Standard normal (Box-Muller). */
double mj_rng_normal(uint64_t *state);
void mj_rng_normal2(uint64_t *state, double *a, double *b);

#endif /* MJ_INTERNAL_H */
