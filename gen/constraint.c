/* constraint.c — the evaluator of MJ_CONSTRAINT expressions: C integer expressions over a
 * template's knobs, such as "K0 <= K" or "H % 64 == 0 && SMEM >= BLOCK * 4".
 *
 * A recursive-descent parser that computes as it parses (the expressions are a line long;
 * no tree is kept). C's precedence, loosest first:
 *
 *   ||  &&  |  ^  &  == !=  < <= > >=  << >>  + -  * / %  unary ! - ~  (expr) number name
 *
 * 64-bit signed arithmetic; && and || do not short-circuit errors away (both sides must
 * parse), but they do skip the evaluation of a division by zero on the side not taken. */
#include "gen.h"

#include <ctype.h>
#include <stdio.h>

typedef struct parser {
    const char *s, *p;
    const char *const *names;
    const int32_t *values;
    int n;
    int failed;
    char *err;
    size_t err_len;
} parser;

static void fail(parser *ps, const char *what) {
    if (ps->failed) return;
    ps->failed = 1;
    snprintf(ps->err, ps->err_len, "%s at column %d of \"%s\"", what, (int)(ps->p - ps->s) + 1, ps->s);
}

static void skip_space(parser *ps) {
    while (isspace((unsigned char)*ps->p)) ps->p++;
}

/* Consume op if it is next (and not the start of a longer operator). */
static int accept(parser *ps, const char *op) {
    skip_space(ps);
    size_t n = strlen(op);
    if (strncmp(ps->p, op, n) != 0) return 0;
    char next = ps->p[n];
    /* "<" must not take the first char of "<=" or "<<"; "&" not of "&&"; "|" not of "||". */
    if (n == 1 && (op[0] == '<' || op[0] == '>') && (next == '=' || next == op[0])) return 0;
    if (n == 1 && (op[0] == '&' || op[0] == '|') && next == op[0]) return 0;
    if (n == 1 && (op[0] == '!' || op[0] == '=') && next == '=') return 0;
    ps->p += n;
    return 1;
}

static int64_t expr_or(parser *ps, int live);

static int64_t primary(parser *ps, int live) {
    skip_space(ps);
    if (accept(ps, "(")) {
        int64_t v = expr_or(ps, live);
        if (!accept(ps, ")")) fail(ps, "expected ')'");
        return v;
    }
    if (isdigit((unsigned char)*ps->p)) {
        int64_t v = 0;
        while (isdigit((unsigned char)*ps->p)) {
            if (v > (INT64_MAX - 9) / 10) {
                fail(ps, "number too large");
                return 0;
            }
            v = v * 10 + (*ps->p++ - '0');
        }
        return v;
    }
    if (isalpha((unsigned char)*ps->p) || *ps->p == '_') {
        const char *b = ps->p;
        while (isalnum((unsigned char)*ps->p) || *ps->p == '_') ps->p++;
        size_t len = (size_t)(ps->p - b);
        for (int i = 0; i < ps->n; i++)
            if (strlen(ps->names[i]) == len && !strncmp(ps->names[i], b, len)) return ps->values[i];
        ps->p = b;
        fail(ps, "unknown knob name");
        return 0;
    }
    fail(ps, *ps->p ? "unexpected character" : "unexpected end");
    return 0;
}

static int64_t unary(parser *ps, int live) {
    if (accept(ps, "!")) return !unary(ps, live);
    if (accept(ps, "-")) return -unary(ps, live);
    if (accept(ps, "~")) return ~unary(ps, live);
    return primary(ps, live);
}

static int64_t mul(parser *ps, int live) {
    int64_t v = unary(ps, live);
    for (;;) {
        int op = accept(ps, "*") ? '*' : accept(ps, "/") ? '/' : accept(ps, "%") ? '%' : 0;
        if (!op) return v;
        int64_t r = unary(ps, live);
        if (op == '*') v *= r;
        else if (r == 0) {
            if (live) fail(ps, "division by zero");
            v = 0;
        } else v = op == '/' ? v / r : v % r;
    }
}

static int64_t add(parser *ps, int live) {
    int64_t v = mul(ps, live);
    for (;;) {
        if (accept(ps, "+")) v += mul(ps, live);
        else if (accept(ps, "-")) v -= mul(ps, live);
        else return v;
    }
}

static int64_t shift(parser *ps, int live) {
    int64_t v = add(ps, live);
    for (;;) {
        int left = accept(ps, "<<");
        if (!left && !accept(ps, ">>")) return v;
        int64_t r = add(ps, live);
        if (r < 0 || r > 62) {
            if (live) fail(ps, "shift out of range");
            r = 0;
        }
        v = left ? (int64_t)((uint64_t)v << r) : v >> r;
    }
}

static int64_t rel(parser *ps, int live) {
    int64_t v = shift(ps, live);
    for (;;) {
        if (accept(ps, "<=")) v = v <= shift(ps, live);
        else if (accept(ps, ">=")) v = v >= shift(ps, live);
        else if (accept(ps, "<")) v = v < shift(ps, live);
        else if (accept(ps, ">")) v = v > shift(ps, live);
        else return v;
    }
}

static int64_t eq(parser *ps, int live) {
    int64_t v = rel(ps, live);
    for (;;) {
        if (accept(ps, "==")) v = v == rel(ps, live);
        else if (accept(ps, "!=")) v = v != rel(ps, live);
        else return v;
    }
}

static int64_t bit_and(parser *ps, int live) {
    int64_t v = eq(ps, live);
    while (accept(ps, "&")) v &= eq(ps, live);
    return v;
}

static int64_t bit_xor(parser *ps, int live) {
    int64_t v = bit_and(ps, live);
    while (accept(ps, "^")) v ^= bit_and(ps, live);
    return v;
}

static int64_t bit_or(parser *ps, int live) {
    int64_t v = bit_xor(ps, live);
    while (accept(ps, "|")) v |= bit_xor(ps, live);
    return v;
}

static int64_t log_and(parser *ps, int live) {
    int64_t v = bit_or(ps, live);
    while (accept(ps, "&&")) {
        int64_t r = bit_or(ps, live && v);
        v = v && r;
    }
    return v;
}

static int64_t expr_or(parser *ps, int live) {
    int64_t v = log_and(ps, live);
    while (accept(ps, "||")) {
        int64_t r = log_and(ps, live && !v);
        v = v || r;
    }
    return v;
}

int mj_constraint_eval(const char *expr, const char *const *names, const int32_t *values, int n,
                       int64_t *value, char *err, size_t err_len) {
    char dummy[8];
    parser ps = {expr, expr, names, values, n, 0, err ? err : dummy, err ? err_len : sizeof dummy};
    if (!expr) {
        snprintf(ps.err, ps.err_len, "no expression");
        return -1;
    }
    int64_t v = expr_or(&ps, 1);
    skip_space(&ps);
    if (!ps.failed && *ps.p) fail(&ps, "unexpected text");
    if (ps.failed) return -1;
    if (value) *value = v;
    return 0;
}
