/* wrapper_mismatch.c — compiled by ctest, never run: with MJ_WRAPPER_OK the call matches
 * fixture_saxpy(int n, float a, const float *x, float *y) and compiles; without it the
 * call passes an int* where a float* belongs and must be rejected (-Werror). */
#include "mj_test_registry.h"

mj_status call(const mj_function *fn, mj_launch_dims d, const float *x, float *y, int *wrong);
mj_status call(const mj_function *fn, mj_launch_dims d, const float *x, float *y, int *wrong) {
#ifdef MJ_WRAPPER_OK
    (void)wrong;
    return mj_launch_fixture_saxpy(fn, d, 1024, 2.0f, x, y);
#else
    (void)y;
    return mj_launch_fixture_saxpy(fn, d, 1024, 2.0f, x, wrong);
#endif
}
