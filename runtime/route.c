/* route.c — routing on the device: the host side of templates/oea_route.cu and
 * templates/router_gemm.cu (picking the specialization, the launch shape), the k0 policy,
 * and the host reference of the dispatch metadata.
 *
 * The launch path does no string work: a call fills its specialization (the template by its
 * MJ_TPL_ index, a handful of integer knobs) and looks it up in the context's lock-free
 * in-memory table; only the first call per shape validates, renders, hashes or compiles.
 */
#include "jit.h"
#include "mj_kernels.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

/* The one-block OEA kernel takes up to this many tokens; above it, plain top-k only. */
#define MJ_ROUTE_ONE_BLOCK_MAX 256
#define MJ_ROUTE_MAX_EXPERTS 1024
#define MJ_ROUTE_MAX_TOPK 16
#define MJ_ROUTE_MAX_GROUPS 32
/* Static shared memory a route kernel may use (of the 48 KiB every target allows). */
#define MJ_ROUTE_SMEM_BUDGET (44 * 1024)

static int32_t next_pow2(int32_t v) {
    int32_t p = 1;
    while (p < v) p *= 2;
    return p;
}

/* ---- k0 policy ---------------------------------------------------------------------- */

mj_status mj_k0_policy_parse(const char *text, int32_t topk, mj_k0_policy *out) {
    if (!text || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_k0_policy_parse: NULL argument");
    if (topk < 1) return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy: top-k %d must be >= 1", topk);
    mj_k0_policy p;
    memset(&p, 0, sizeof p);
    const char *s = text;
    char *end;
    /* A bare number: that k0 for every batch size. */
    long v = strtol(s, &end, 10);
    if (end != s && *end == '\0') {
        if (v < 1 || v > topk)
            return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy '%s': k0 %ld must be in 1..%d", text, v, topk);
        p.n_rules = 1;
        p.rules[0].b_lo = 1, p.rules[0].b_hi = INT32_MAX, p.rules[0].k0 = (int32_t)v;
        *out = p;
        return MJ_OK;
    }
    /* Rules "LO-HI:K0", "LO-:K0" or "B:K0", comma-separated. */
    while (*s) {
        if (p.n_rules == MJ_K0_POLICY_MAX_RULES)
            return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy '%s': more than %d rules", text, MJ_K0_POLICY_MAX_RULES);
        long lo = strtol(s, &end, 10), hi;
        if (end == s || lo < 1) goto bad;
        s = end;
        if (*s == '-') {
            s++;
            if (*s == ':') hi = INT32_MAX;
            else {
                hi = strtol(s, &end, 10);
                if (end == s) goto bad;
                s = end;
            }
        } else {
            hi = lo;
        }
        if (*s != ':' || hi < lo || hi > INT32_MAX) goto bad;
        s++;
        long k0 = strtol(s, &end, 10);
        if (end == s) goto bad;
        s = end;
        if (k0 < 1 || k0 > topk)
            return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy '%s': k0 %ld must be in 1..%d", text, k0, topk);
        for (int32_t i = 0; i < p.n_rules; i++)
            if (lo <= p.rules[i].b_hi && hi >= p.rules[i].b_lo)
                return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy '%s': batch sizes %ld..%ld overlap rule %d",
                                    text, lo, hi, i + 1);
        p.rules[p.n_rules].b_lo = (int32_t)lo;
        p.rules[p.n_rules].b_hi = (int32_t)hi;
        p.rules[p.n_rules].k0 = (int32_t)k0;
        p.n_rules++;
        if (*s == ',') {
            if (!*++s) goto bad; /* a trailing comma */
        } else if (*s) {
            goto bad;
        }
    }
    if (p.n_rules == 0) goto bad;
    *out = p;
    return MJ_OK;
bad:
    return mj_set_error(MJ_ERR_INVALID_ARG,
                        "k0 policy '%s' is malformed: write a k0 (\"4\") or rules LO-HI:K0 / LO-:K0 / "
                        "B:K0 separated by commas (\"1-3:8,4-15:6,16-:4\")",
                        text);
}

mj_status mj_k0_policy_resolve(const mj_k0_policy *p, int32_t B, int32_t *k0) {
    if (!p || !k0) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_k0_policy_resolve: NULL argument");
    for (int32_t i = 0; i < p->n_rules; i++)
        if (B >= p->rules[i].b_lo && B <= p->rules[i].b_hi) {
            *k0 = p->rules[i].k0;
            return MJ_OK;
        }
    return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy has no rule for batch size %d; add one", B);
}

/* ---- dispatch metadata, on the host -------------------------------------------------- */

mj_status mj_route_dispatch_ref(const int32_t *ids, const int32_t *n_sel, int32_t B, int32_t k,
                                int32_t E, int32_t *counts, int32_t *offsets, int32_t *active,
                                int32_t *n_active, int32_t *perm) {
    if ((B > 0 && (!ids || !n_sel)) || B < 0 || k < 1 || E < 1)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route_dispatch_ref: bad arguments (B=%d k=%d E=%d)", B, k, E);
    int32_t *cnt = calloc((size_t)E, sizeof *cnt), *next = malloc(sizeof *next * (size_t)E);
    if (!cnt || !next) {
        free(cnt), free(next);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < n_sel[b]; j++) {
            int32_t e = ids[b * k + j];
            if (e < 0 || e >= E) {
                free(cnt), free(next);
                return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route_dispatch_ref: id %d out of range at [%lld, %lld]",
                                    e, (long long)b, (long long)j);
            }
            cnt[e]++;
        }
    int32_t off = 0, na = 0;
    for (int32_t e = 0; e < E; e++) {
        if (counts) counts[e] = cnt[e];
        if (offsets) offsets[e] = off;
        next[e] = off;
        if (cnt[e] && active) active[na] = e;
        na += cnt[e] > 0;
        off += cnt[e];
    }
    if (offsets) offsets[E] = off;
    if (active)
        for (int32_t e = na; e < E; e++) active[e] = -1;
    if (n_active) *n_active = na;
    if (perm)
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < k; j++)
                perm[b * k + j] = j < n_sel[b] ? next[ids[b * k + j]]++ : -1;
    free(cnt), free(next);
    return MJ_OK;
}

/* ---- mj_route -------------------------------------------------------------------------- */

static mj_status check_route(const mj_route_params *p, int32_t B, int32_t num_valid) {
    const int32_t E = p->n_experts, k = p->topk;
    if (E < 8 || E > MJ_ROUTE_MAX_EXPERTS)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_route: %d experts; the route kernel takes 8..%d", E,
                            MJ_ROUTE_MAX_EXPERTS);
    if (k < 1 || k > E || k > MJ_ROUTE_MAX_TOPK)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: top-k %d must be in 1..min(E, %d)", k, MJ_ROUTE_MAX_TOPK);
    if (p->k0 < 1 || p->k0 > k)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: k0 %d must be in 1..top-k (%d)", p->k0, k);
    if (p->n_group < 1 || p->n_group > MJ_ROUTE_MAX_GROUPS || E % p->n_group)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: n_group %d must divide %d experts and be at most %d",
                            p->n_group, E, MJ_ROUTE_MAX_GROUPS);
    if (p->topk_group < 1 || p->topk_group > p->n_group || (int64_t)p->topk_group * (E / p->n_group) < k)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route: topk_group %d of %d groups leaves fewer than top-k %d experts",
                            p->topk_group, p->n_group, k);
    if (p->scoring != MJ_SCORING_SIGMOID && p->scoring != MJ_SCORING_SOFTMAX)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: unknown scoring %d", (int)p->scoring);
    if (!(p->routed_scaling_factor == p->routed_scaling_factor) || p->routed_scaling_factor - p->routed_scaling_factor != 0.0f)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: routed scaling factor must be finite");
    if (B < 0 || num_valid < 0 || num_valid > B)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: num_valid %d must be in 0..B (B=%d)", num_valid, B);
    if (B > MJ_ROUTE_ONE_BLOCK_MAX && p->k0 != k)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "mj_route: OEA (k0 %d < top-k %d) runs in one block of at most %d tokens; "
                            "B = %d: use k0 = top-k (plain top-k) for batches this large, where OEA "
                            "saves little",
                            p->k0, k, MJ_ROUTE_ONE_BLOCK_MAX, B);
    return MJ_OK;
}

/* Warps per block: 8, fewer when the experts' score arrays would not fit shared memory. */
static int32_t route_warps(int32_t E, int32_t k, int32_t bmax) {
    for (int32_t nw = 8; nw > 1; nw /= 2) {
        int64_t bytes = 2LL * nw * E * 4 + (int64_t)E * 4 + (int64_t)bmax * k * 4 + (int64_t)nw * k * 4;
        if (bytes <= MJ_ROUTE_SMEM_BUDGET) return nw;
    }
    return 1;
}

static void route_knobs(const mj_route_params *p, int32_t k0, int32_t nwarps, int32_t bmax, int32_t *kn) {
    kn[0] = p->n_experts, kn[1] = p->topk, kn[2] = k0, kn[3] = p->n_group;
    kn[4] = p->n_group > 1 ? p->topk_group : 1;
    kn[5] = p->scoring == MJ_SCORING_SOFTMAX, kn[6] = p->renormalize != 0;
    kn[7] = nwarps, kn[8] = bmax;
}

mj_status mj_route(mj_context_t ctx, const mj_route_params *p, const float *logits, const float *bias,
                   int32_t B, int32_t num_valid, const mj_route_outputs *out, void *stream) {
    if (!ctx || !p || !out || (B > 0 && (!logits || !out->ids || !out->weights || !out->n_sel)))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: NULL context, params, logits or a required output "
                                                "(ids, weights, n_sel)");
    MJ_CHECK(check_route(p, B, num_valid));
    const int32_t E = p->n_experts, k = p->topk;
    int32_t kn[MJ_MAX_KNOBS] = {0};
    mj_spec s;
    const mj_function *fn;
    if (B <= MJ_ROUTE_ONE_BLOCK_MAX) {
        int32_t bmax = next_pow2(B > 0 ? B : 1), nw = route_warps(E, k, bmax);
        route_knobs(p, p->k0, nw, bmax, kn);
        mj_context_spec_fill(ctx, MJ_TPL_oea_route, kn, MJ_MAX_KNOBS, &s);
        MJ_CHECK(mj_jit_get(ctx, &s, &fn));
        mj_launch_dims d = {{1, 1, 1}, {(uint32_t)nw * 32, 1, 1}, 0, stream};
        return mj_launch_oea_route(fn, d, logits, bias, B, num_valid, p->routed_scaling_factor, out->ids,
                                   out->weights, out->n_sel, out->expert_counts, out->expert_offsets,
                                   out->active_experts, out->n_active, out->permutation);
    }
    /* Plain top-k over many blocks, then the dispatch in one block. */
    int32_t nw = route_warps(E, k, 1);
    route_knobs(p, k, nw, 1, kn);
    mj_context_spec_fill(ctx, MJ_TPL_oea_route, kn, MJ_MAX_KNOBS, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    uint32_t blocks = (uint32_t)((B + nw - 1) / nw);
    if (blocks > 65535) blocks = 65535;
    mj_launch_dims d = {{blocks, 1, 1}, {(uint32_t)nw * 32, 1, 1}, 0, stream};
    MJ_CHECK(mj_launch_topk_route(fn, d, logits, bias, B, num_valid, p->routed_scaling_factor, out->ids,
                                  out->weights, out->n_sel));
    if (!out->expert_counts && !out->expert_offsets && !out->active_experts && !out->n_active &&
        !out->permutation)
        return MJ_OK;
    mj_launch_dims d1 = {{1, 1, 1}, {256, 1, 1}, 0, stream};
    return mj_launch_route_dispatch(fn, d1, out->ids, B, out->expert_counts, out->expert_offsets,
                                    out->active_experts, out->n_active, out->permutation);
}

/* ---- the router GEMM -------------------------------------------------------------------- */

mj_status mj_router_gemm(mj_context_t ctx, const uint16_t *hidden, const uint16_t *gate, int32_t B,
                         int32_t H, int32_t E, float *logits, void *stream) {
    if (!ctx || (B > 0 && (!hidden || !gate || !logits)) || B < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_router_gemm: NULL argument or B < 0");
    if (H < 64 || H > 16384 || H % 64)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: hidden %d must be a multiple of 64 in 64..16384", H);
    if (E < 1 || E > MJ_ROUTE_MAX_EXPERTS)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: %d experts; 1..%d supported", E, MJ_ROUTE_MAX_EXPERTS);
    if (B == 0) return MJ_OK;
    int32_t rows = next_pow2(B) < 8 ? next_pow2(B) : 8, nw = 4;
    int32_t kn[MJ_MAX_KNOBS] = {H, E, rows, nw};
    mj_spec s;
    const mj_function *fn;
    mj_context_spec_fill(ctx, MJ_TPL_router_gemm, kn, MJ_MAX_KNOBS, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    mj_launch_dims d = {{(uint32_t)((E + nw - 1) / nw), (uint32_t)((B + rows - 1) / rows), 1},
                        {(uint32_t)nw * 32, 1, 1}, 0, stream};
    return mj_launch_router_gemm(fn, d, hidden, gate, B, logits);
}
