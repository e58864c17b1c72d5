/* test_compare.c — the command's output-against-reference comparison (tools/compare.c, behind
 * `run --check` and `demo`): a finite pair measured as before; a NaN or Inf on either side
 * counted per side, never measured (no "relative L2 nan"), and a non-finite reference never
 * blamed on the output. */
#include "compare.h"
#include "test.h"

#define N 12 /* three rows of 4 */

/* The pairs the cases compare (setup): want 1..N; got the same with 0.5 added at element 5;
 * bad: want with 2 NaN and 1 Inf, the first at element 6 (row 1, column 2); wbad: want with an
 * Inf at element 0. */
static float got[N], want[N], bad[N], wbad[N];

static int setup(void) {
    for (int i = 0; i < N; i++) want[i] = (float)(i + 1), got[i] = want[i];
    got[5] += 0.5f;
    memcpy(bad, want, sizeof bad);
    bad[6] = NAN, bad[9] = -INFINITY, bad[11] = NAN;
    memcpy(wbad, want, sizeof wbad);
    wbad[0] = INFINITY;
    return 0;
}

/* Finite: the relative L2 and max |diff| as before; an all-zero reference: the absolute L2. */
static void test_finite(void) {
    tool_cmp c;
    double num = 0.25, den = 0;
    for (int i = 0; i < N; i++) den += (double)want[i] * want[i];
    CHECK(tool_compare(got, want, N, &c) == 0, "a finite pair reported non-finite");
    CHECK_NEAR(c.rel_l2, sqrt(num / den), 1e-12);
    CHECK_NEAR(c.max_abs, 0.5, 1e-12);
    CHECK(c.got_nan + c.got_inf + c.want_nan + c.want_inf == 0, "non-finite counts on a finite pair");
    float zero[N] = {0};
    CHECK(tool_compare(got, zero, N, &c) == 0, "zeros reported non-finite");
    double abs2 = 0;
    for (int i = 0; i < N; i++) abs2 += (double)got[i] * got[i];
    CHECK_NEAR(c.rel_l2, sqrt(abs2), 1e-9);
}

/* The output alone: 2 NaN and 1 Inf, the first at element 6 (row 1, column 2). */
static void test_output_nonfinite(void) {
    tool_cmp c;
    char msg[768];
    CHECK(tool_compare(bad, want, N, &c) == 1, "a NaN in the output not reported");
    CHECK(isnan(c.rel_l2) && isnan(c.max_abs), "a non-finite pair measured: %g %g", c.rel_l2, c.max_abs);
    CHECK(c.got_nan == 2 && c.got_inf == 1 && c.got_first == 6, "got: %zu NaN %zu Inf first %zu", c.got_nan,
          c.got_inf, c.got_first);
    CHECK(c.want_nan == 0 && c.want_inf == 0, "want: %zu NaN %zu Inf", c.want_nan, c.want_inf);
    tool_compare_describe(&c, 4, "the kernels' output", "the CPU reference", msg, sizeof msg);
    CHECK(strstr(msg, "the kernels' output holds 3 non-finite values (2 NaN, 1 Inf; the first at row 1, column 2)") &&
              strstr(msg, "the CPU reference is finite") && !strstr(msg, "not compared"),
          "msg: %s", msg);
}

/* The reference alone: 1 Inf at element 0; the output is not blamed. */
static void test_reference_nonfinite(void) {
    tool_cmp c;
    char msg[768];
    CHECK(tool_compare(got, wbad, N, &c) == 1, "an Inf in the reference not reported");
    CHECK(c.want_inf == 1 && c.want_nan == 0 && c.want_first == 0 && c.got_nan + c.got_inf == 0,
          "want: %zu NaN %zu Inf first %zu; got %zu", c.want_nan, c.want_inf, c.want_first, c.got_nan + c.got_inf);
    tool_compare_describe(&c, 4, "the kernels' output", "the CPU reference", msg, sizeof msg);
    CHECK(strstr(msg, "not compared: the CPU reference holds 1 non-finite value (0 NaN, 1 Inf; the first at row 0, "
                      "column 0)") &&
              strstr(msg, "the kernels' output is finite") && strstr(msg, "the reference overflows"),
          "msg: %s", msg);
}

/* Both: each side counted, the reference first; no row split without a row length. A NaN
 * where both sides hold one at the same element is counted on both. */
static void test_both_nonfinite(void) {
    tool_cmp c;
    char msg[768];
    CHECK(tool_compare(bad, wbad, N, &c) == 1, "a non-finite pair not reported");
    CHECK(c.got_nan == 2 && c.got_inf == 1 && c.want_inf == 1, "both: got %zu/%zu want %zu", c.got_nan, c.got_inf,
          c.want_inf);
    tool_compare_describe(&c, 0, "the kernels' output", "the CPU reference", msg, sizeof msg);
    CHECK(strstr(msg, "not compared: the CPU reference holds 1 non-finite value (0 NaN, 1 Inf; the first at element "
                      "0), and the kernels' output 3 non-finite values (2 NaN, 1 Inf; the first at element 6)") &&
              strstr(msg, "the layer overflows"),
          "msg: %s", msg);
    float g2[N], w2[N];
    memcpy(g2, got, sizeof g2), memcpy(w2, want, sizeof w2);
    g2[3] = NAN, w2[3] = NAN;
    CHECK(tool_compare(g2, w2, N, &c) == 1 && c.got_nan == 1 && c.want_nan == 1 && c.got_first == 3 &&
              c.want_first == 3,
          "shared NaN: got %zu want %zu", c.got_nan, c.want_nan);
}

static const test_case cases[] = {
    TEST_CASE("finite", test_finite),
    TEST_CASE("output_nonfinite", test_output_nonfinite),
    TEST_CASE("reference_nonfinite", test_reference_nonfinite),
    TEST_CASE("both_nonfinite", test_both_nonfinite),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, NULL); }
