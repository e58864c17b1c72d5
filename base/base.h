/* base.h — what every layer of the library shares: error reporting, bf16, the seeded
 * generator, environment settings. Depends on the public header alone. Not installed, not public. */
#ifndef MJ_BASE_H
#define MJ_BASE_H

#include "moejit.h"

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define MJ_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MJ_PRINTF(a, b)
#endif

/* ---- errors (base/error.c) ----
 * mj_set_error records the detail for mj_last_error() and returns s, so a failure path is
 * one line: `return mj_set_error(MJ_ERR_CONFIG, "...: %s", why);`. */
mj_status mj_set_error(mj_status s, const char *fmt, ...) MJ_PRINTF(2, 3);
/* Context for a failure passed up: keeps s and the calling thread's detail, prepending
 * "<fmt...>: " to it (just the prefix when there is no detail). Returns s, so a caller adds
 * where it was in one line: `return mj_error_prefix(st, "%s", path);`. The arguments may
 * point into mj_last_error()'s text. */
mj_status mj_error_prefix(mj_status s, const char *fmt, ...) MJ_PRINTF(2, 3);
void mj_clear_error(void);
/* A warning on stderr ("moejit: warning: ..."), unless $MOEJIT_QUIET is set. */
void mj_warn(const char *fmt, ...) MJ_PRINTF(1, 2);

/* s made safe to quote in a message: control characters and non-ASCII bytes as \\xNN,
 * cut with "..." to fit buf. Returns buf. */
const char *mj_printable(const char *s, char *buf, size_t len);

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

/* ---- versioned structs (base/error.c) ----
 * A public struct that starts with uint32_t struct_size (set by its _INIT macro) may grow:
 * a caller built against an older header passes a smaller size. mj_struct_load copies what
 * the caller has over *out, which the callee filled with the defaults first; any size from
 * the first published one (v1_size) to sizeof is accepted, anything else is an error naming
 * the struct and its initializer. mj_struct_store copies a result back, as much of it as the
 * caller's struct holds. */
mj_status mj_struct_load(const void *in, size_t v1_size, size_t size, void *out, const char *type,
                         const char *init);
void mj_struct_store(void *caller, const void *result, size_t size);

/* ---- the environment (base/env.c) ----
 * $name as a whole number in lo..hi, else dflt (unset or empty: dflt; anything else, with
 * *bad set to 1 when bad is not NULL, so the caller can name it in a warning). */
long mj_env_long(const char *name, long lo, long hi, long dflt, int *bad);
/* The CPUs this process may run on (its affinity mask), at least 1. */
int mj_cpu_count(void);

/* ---- a float's bits, and back ---- */
static inline uint32_t mj_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float mj_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- bf16 (base/bf16.c) ---- round to nearest even; NaN stays a (quiet) NaN. */
uint16_t mj_f32_to_bf16(float x);
float mj_bf16_to_f32(uint16_t x);

/* ---- the seeded generator of tests and random layers: splitmix64 ---- */
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

/* Batch-size policies (rules.c): "V" or "LO-HI:V,LO-:V,B:V"; value() reads one V (1: read,
 * 0: malformed, -1: out of range, error set). `what` names the policy in errors, `example`
 * shows a good one. */
typedef struct mj_rule {
    int32_t lo, hi, v; /* batch sizes lo..hi (hi INT32_MAX: open) take v */
} mj_rule;
mj_status mj_rules_parse(const char *text, const char *what, const char *example,
                         int (*value)(const char *s, size_t n, int32_t *v, void *arg), void *arg,
                         mj_rule *rules, int32_t cap, int32_t *n_rules);
/* The v of the rule covering B: 1, or 0 when none does. */
int mj_rules_find(const mj_rule *rules, int32_t n_rules, int32_t B, int32_t *v);

#endif /* MJ_BASE_H */
