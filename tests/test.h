/* test.h — the assertions every test uses. A failed CHECK prints where and what, the run
 * goes on, and test_finish() prints "N passed, N failed" and returns the exit code. */
#ifndef MJ_TEST_H
#define MJ_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (cond) {                                                                      \
            g_pass++;                                                                    \
        } else {                                                                         \
            g_fail++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
        }                                                                                \
    } while (0)

/* A call that must succeed: on failure print the status and mj_last_error(). */
#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        mj_status check_ok_s_ = (call);                                                  \
        CHECK(check_ok_s_ == MJ_OK, "%s -> %s: %s", #call, mj_status_string(check_ok_s_), \
              mj_last_error());                                                          \
    } while (0)

/* A call that must fail with status `want`. */
#define CHECK_STATUS(call, want)                                                         \
    do {                                                                                 \
        mj_status check_st_s_ = (call);                                                  \
        CHECK(check_st_s_ == (want), "%s -> %s (want %s): %s", #call,                    \
              mj_status_string(check_st_s_), mj_status_string(want), mj_last_error());   \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                            \
    do {                                                                                 \
        double cn_a_ = (double)(a), cn_b_ = (double)(b);                                 \
        CHECK(fabs(cn_a_ - cn_b_) <= (tol), "%s = %.9g, %s = %.9g, |diff| %.3g > %.3g",   \
              #a, cn_a_, #b, cn_b_, fabs(cn_a_ - cn_b_), (double)(tol));                 \
    } while (0)

/* Seed for randomized tests: $MJ_TEST_SEED or the default; printed so a failure can be
 * replayed. */
static inline uint64_t test_seed(uint64_t dflt) {
    const char *s = getenv("MJ_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 0) : dflt;
    printf("seed %" PRIu64 " (set MJ_TEST_SEED to replay)\n", seed);
    return seed;
}

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
