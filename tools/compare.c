/* compare.c — an output against a reference: see compare.h. */
#include "compare.h"

#include <math.h>
#include <stdio.h>

int tool_compare(const float *got, const float *want, size_t n, tool_cmp *c) {
    double num = 0, den = 0, mx = 0;
    c->got_nan = c->got_inf = c->want_nan = c->want_inf = 0;
    c->got_first = c->want_first = 0;
    for (size_t i = 0; i < n; i++) {
        const int gbad = !isfinite(got[i]), wbad = !isfinite(want[i]);
        if (gbad) {
            if (!c->got_nan && !c->got_inf) c->got_first = i;
            if (isnan(got[i])) c->got_nan++;
            else c->got_inf++;
        }
        if (wbad) {
            if (!c->want_nan && !c->want_inf) c->want_first = i;
            if (isnan(want[i])) c->want_nan++;
            else c->want_inf++;
        }
        if (gbad || wbad) continue;
        const double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    if (c->got_nan || c->got_inf || c->want_nan || c->want_inf) {
        c->rel_l2 = c->max_abs = NAN;
        return 1;
    }
    c->max_abs = mx;
    c->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return 0;
}

/* "N non-finite values (a NaN, b Inf; the first at row r, column k)" */
static int side(char *out, size_t cap, size_t nan, size_t inf, size_t first, size_t row_len) {
    const size_t n = nan + inf;
    if (row_len)
        return snprintf(out, cap, "%zu non-finite value%s (%zu NaN, %zu Inf; the first at row %zu, column %zu)", n,
                        n == 1 ? "" : "s", nan, inf, first / row_len, first % row_len);
    return snprintf(out, cap, "%zu non-finite value%s (%zu NaN, %zu Inf; the first at element %zu)", n,
                    n == 1 ? "" : "s", nan, inf, first);
}

void tool_compare_describe(const tool_cmp *c, size_t row_len, const char *got_what, const char *want_what, char *msg,
                           size_t cap) {
    char g[256], w[256];
    const int gbad = c->got_nan || c->got_inf, wbad = c->want_nan || c->want_inf;
    side(g, sizeof g, c->got_nan, c->got_inf, c->got_first, row_len);
    side(w, sizeof w, c->want_nan, c->want_inf, c->want_first, row_len);
    if (gbad && !wbad)
        snprintf(msg, cap, "%s holds %s where %s is finite", got_what, g, want_what);
    else if (!gbad && wbad)
        snprintf(msg, cap,
                 "not compared: %s holds %s while %s is finite: the reference overflows float32 on this input "
                 "(or with these weights)",
                 want_what, w, got_what);
    else if (gbad && wbad)
        snprintf(msg, cap,
                 "not compared: %s holds %s, and %s %s: the layer overflows float32 on this input (or with these "
                 "weights)",
                 want_what, w, got_what, g);
    else
        snprintf(msg, cap, "%s and %s are finite", got_what, want_what);
}
