/* compare.h — an output against a reference (run --check, demo): the relative L2 error when
 * both are finite, and which side holds how many NaN/Inf when one is not. */
#ifndef MJ_COMPARE_H
#define MJ_COMPARE_H

#include <stddef.h>

typedef struct tool_cmp {
    double rel_l2;           /* ||got - want|| / ||want|| (||got - want|| when want is all 0); */
    double max_abs;          /* max |got - want|: both only when neither side has a NaN/Inf  */
    size_t got_nan, got_inf; /* non-finite elements of each side                             */
    size_t want_nan, want_inf;
    size_t got_first, want_first; /* the first non-finite element's index (when there is one) */
} tool_cmp;

/* Compare n elements. Returns 0 when both sides are finite (rel_l2 and max_abs set), else 1
 * (rel_l2 and max_abs NaN: there is nothing to measure). */
int tool_compare(const float *got, const float *want, size_t n, tool_cmp *c);

/* After tool_compare returned 1: one sentence (no trailing newline) saying which side holds
 * how many NaN and Inf and where the first one is (row and column for rows of row_len
 * elements), with got_what/want_what naming the sides ("the kernels' output", "the CPU
 * reference"). A non-finite reference is never blamed on got. */
void tool_compare_describe(const tool_cmp *c, size_t row_len, const char *got_what, const char *want_what, char *msg,
                           size_t cap);

#endif
