/* rules.c — batch-size policies: "V" (V for every batch size) or rules "LO-HI:V", "LO-:V"
 * and "B:V" separated by commas ("1-3:8,4-15:6,16-:4"). The k0 policy and the experts'
 * mode policy are both written this way; the caller says how a value V is read.
 *
 * Every batch size belongs to at most one rule (overlaps are an error that names both); a
 * batch size no rule covers is the resolver's error, not the parser's. A value reader returns
 * 1 (read), 0 (not a value: the text is malformed) or -1 (a value out of range: it has set
 * the error). */
#include "base.h"

#include <limits.h>
#include <stdlib.h>

mj_status mj_rules_parse(const char *text, const char *what, const char *example,
                         int (*value)(const char *s, size_t n, int32_t *v, void *arg), void *arg,
                         mj_rule *rules, int32_t cap, int32_t *n_rules) {
    int32_t n = 0, v;
    char shown[96];
    if (!text) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL text", what);
    mj_printable(text, shown, sizeof shown);
    /* A bare value: the same for every batch size. */
    int r = value(text, strlen(text), &v, arg);
    if (r < 0) return MJ_ERR_INVALID_ARG;
    if (r > 0) {
        rules[0] = (mj_rule){1, INT32_MAX, v};
        *n_rules = 1;
        return MJ_OK;
    }
    const char *s = text;
    while (*s) {
        char *end;
        if (n == cap) return mj_set_error(MJ_ERR_INVALID_ARG, "%s '%s': more than %d rules", what, shown, cap);
        if (*s < '0' || *s > '9') goto bad; /* strtol would take spaces and signs */
        long lo = strtol(s, &end, 10), hi;
        if (lo < 1 || lo > INT32_MAX) goto bad;
        s = end;
        if (*s == '-') {
            s++;
            if (*s == ':') {
                hi = INT32_MAX;
            } else {
                if (*s < '0' || *s > '9') goto bad;
                hi = strtol(s, &end, 10);
                s = end;
            }
        } else {
            hi = lo;
        }
        if (*s++ != ':' || hi < lo || hi > INT32_MAX) goto bad;
        size_t len = strcspn(s, ",");
        if ((r = value(s, len, &v, arg)) < 0) return MJ_ERR_INVALID_ARG;
        if (!r) goto bad;
        s += len;
        for (int32_t i = 0; i < n; i++)
            if (lo <= rules[i].hi && hi >= rules[i].lo)
                return mj_set_error(MJ_ERR_INVALID_ARG, "%s '%s': batch sizes %ld..%ld overlap rule %d", what,
                                    shown, lo, hi, (int)i + 1);
        rules[n++] = (mj_rule){(int32_t)lo, (int32_t)hi, v};
        if (*s == ',' && !*++s) goto bad; /* a trailing comma */
    }
    if (!n) goto bad;
    *n_rules = n;
    return MJ_OK;
bad:
    return mj_set_error(MJ_ERR_INVALID_ARG,
                        "%s '%s' is malformed: write one value for every batch size, or rules LO-HI:V / LO-:V / "
                        "B:V separated by commas (\"%s\")",
                        what, shown, example);
}

int mj_rules_find(const mj_rule *rules, int32_t n_rules, int32_t B, int32_t *v) {
    for (int32_t i = 0; i < n_rules; i++)
        if (B >= rules[i].lo && B <= rules[i].hi) return *v = rules[i].v, 1;
    return 0;
}
