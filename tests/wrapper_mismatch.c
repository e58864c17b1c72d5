/* wrapper_mismatch.c — compiled by ctest, never run. Two tests compile it with -Werror:
 *   launch_wrapper_typecheck_ok (-DMJ_WRAPPER_OK) must compile: the call matches
 *     fixture_saxpy(int n, float a, const float *x, float *y), and the static assertion below
 *     holds (the generated wrapper takes exactly the kernel's parameter types, not void *);
 *   launch_wrapper_typecheck (WILL_FAIL) must not compile: the call passes an int * where a
 *     float * belongs. Were the wrapper's parameters untyped, this would compile and the test
 *     would fail. */
#include "mj_test_registry.h"

typedef mj_status (*saxpy_wrapper)(const mj_function *, mj_launch_dims, int, float, const float *, float *);
_Static_assert(_Generic(&mj_launch_fixture_saxpy, saxpy_wrapper: 1, default: 0),
               "mj_launch_fixture_saxpy takes fixture_saxpy's parameter types");

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
