/* route.c — routing on the device: the host side of templates/oea_route.cu and
 * templates/router_gemm.cu (picking the specialization, the launch shape), the k0 policy,
 * and the host reference of the dispatch metadata.
 *
 * The launch path does no string work: a call fills its specialization (the template by its
 * MJ_TPL_ index, a handful of integer knobs) and looks it up in the context's lock-free
 * in-memory table; only the first call per shape validates, renders, hashes or compiles.
 */
#include "jit.h"
#include "plan.h"
#include "ref/ref.h"
#include "mj_kernels.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The one-block OEA kernel takes up to this many tokens; above it, plain top-k only. */
#define MJ_ROUTE_ONE_BLOCK_MAX 256
/* Shared memory a route kernel may use, static and dynamic: within the 99 KiB a block that
 * every target allows once a kernel opts in (runtime/jit.c does, past 48 KiB). */
#define MJ_ROUTE_SMEM_BUDGET (96 * 1024)

/* ---- k0 policy ---------------------------------------------------------------------- */

static int k0_value(const char *s, size_t n, int32_t *v, void *arg) {
    const int32_t topk = *(const int32_t *)arg;
    char *end;
    if (!n || *s < '0' || *s > '9') return 0;
    long k0 = strtol(s, &end, 10);
    if ((size_t)(end - s) != n) return 0;
    if (k0 < 1 || k0 > topk) {
        mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy: k0 %ld must be in 1..%d (the top-k)", k0, topk);
        return -1;
    }
    *v = (int32_t)k0;
    return 1;
}

mj_status mj_k0_policy_parse(const char *text, int32_t topk, mj_k0_policy *out) {
    if (!text || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_k0_policy_parse: NULL argument");
    if (topk < 1) return mj_set_error(MJ_ERR_INVALID_ARG, "k0 policy: top-k %d must be >= 1", topk);
    mj_rule r[MJ_K0_POLICY_MAX_RULES];
    int32_t n;
    MJ_CHECK(mj_rules_parse(text, "k0 policy", "1-3:8,4-15:6,16-:4", k0_value, &topk, r, MJ_K0_POLICY_MAX_RULES, &n));
    mj_k0_policy p;
    memset(&p, 0, sizeof p);
    p.n_rules = n;
    for (int32_t i = 0; i < n; i++) p.rules[i].b_lo = r[i].lo, p.rules[i].b_hi = r[i].hi, p.rules[i].k0 = r[i].v;
    *out = p;
    return MJ_OK;
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
                                int32_t *n_active, int32_t *perm, int32_t *row_index) {
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
    if (row_index)
        for (int64_t r = 0; r < (int64_t)B * k; r++) row_index[r] = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < k; j++) {
            int32_t row = j < n_sel[b] ? next[ids[b * k + j]]++ : -1;
            if (perm) perm[b * k + j] = row;
            if (row_index && row >= 0) row_index[row] = (int32_t)(b * k + j);
        }
    free(cnt), free(next);
    return MJ_OK;
}

/* ---- mj_route -------------------------------------------------------------------------- */

static mj_status check_route(const mj_route_params *p, int32_t B) {
    const int32_t E = p->n_experts, k = p->topk;
    if (E < MJ_KNOB_oea_route_E_MIN || E > MJ_KNOB_oea_route_E_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_route: %d experts; the route kernel takes %d..%d", E,
                            MJ_KNOB_oea_route_E_MIN, MJ_KNOB_oea_route_E_MAX);
    if (k < 1 || k > E || k > MJ_KNOB_oea_route_K_MAX)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: top-k %d must be in 1..min(E, %d)", k,
                            MJ_KNOB_oea_route_K_MAX);
    if (p->k0 < 1 || p->k0 > k)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: k0 %d must be in 1..top-k (%d)", p->k0, k);
    if (p->n_group < 1 || p->n_group > MJ_KNOB_oea_route_NG_MAX || E % p->n_group)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: n_group %d must divide %d experts and be at most %d",
                            p->n_group, E, MJ_KNOB_oea_route_NG_MAX);
    if (p->topk_group < 1 || p->topk_group > p->n_group || (int64_t)p->topk_group * (E / p->n_group) < k)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route: topk_group %d of %d groups leaves fewer than top-k %d experts",
                            p->topk_group, p->n_group, k);
    if (p->scoring != MJ_SCORING_SIGMOID && p->scoring != MJ_SCORING_SOFTMAX)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: unknown scoring %d", (int)p->scoring);
    if (p->group_score != MJ_GROUP_SCORE_TOP2_SUM && p->group_score != MJ_GROUP_SCORE_MAX)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route: unknown group_score %d; use MJ_GROUP_SCORE_TOP2_SUM (noaux_tc) "
                            "or MJ_GROUP_SCORE_MAX (group_limited_greedy)",
                            (int)p->group_score);
    if (!(p->routed_scaling_factor == p->routed_scaling_factor) || p->routed_scaling_factor - p->routed_scaling_factor != 0.0f)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: routed scaling factor must be finite");
    if (B < 0) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: B = %d must not be negative", B);
    if (B > MJ_ROUTE_ONE_BLOCK_MAX && p->k0 != k)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "mj_route: OEA (k0 %d < top-k %d) runs in one block of at most %d tokens; "
                            "B = %d: use k0 = top-k (plain top-k) for batches this large, where OEA "
                            "saves little",
                            p->k0, k, MJ_ROUTE_ONE_BLOCK_MAX, B);
    return MJ_OK;
}

/* The dynamic shared memory of a launch: the warps' score rows, and the ids when B > 0 (the
 * one-block kernel). */
static int64_t route_dyn_smem(int32_t nw, int32_t E, int32_t k, int32_t B) {
    return 2LL * nw * E * 4 + (int64_t)B * k * 4;
}

int64_t mj_route_dyn_smem(const mj_knobs_oea_route *kn, int32_t B) { return route_dyn_smem(kn->NWARPS, kn->E, kn->K, B); }

/* Shared memory of a route kernel: per warp a token's s and c (dynamic), the dispatch's
 * counts and S_base (32 mask words; static), and the B x k ids of the one-block kernel
 * (dynamic). */
static int64_t route_smem(int32_t nw, int32_t E, int32_t k, int32_t B) {
    return route_dyn_smem(nw, E, k, B) + (int64_t)E * 4 + 64 * 4;
}

/* Warps per block: one a token up to 32 (at least 8: the dispatch's loops over the experts
 * share them out), so that a warp routes one token and scores it once; fewer when the shared
 * memory would not fit the budget. */
static int32_t route_warps(int32_t E, int32_t k, int32_t B) {
    int32_t nw = B > 16 ? 32 : B > 8 ? 16 : 8;
    while (nw > 1 && route_smem(nw, E, k, B) > MJ_ROUTE_SMEM_BUDGET) nw /= 2;
    return nw;
}

static mj_knobs_oea_route route_knobs(const mj_route_params *p, int32_t k0, int32_t nwarps) {
    return (mj_knobs_oea_route){.E = p->n_experts,
                                .K = p->topk,
                                .K0 = k0,
                                .NG = p->n_group,
                                .TG = p->n_group > 1 ? p->topk_group : 1,
                                /* without groups the rule decides nothing: one kernel */
                                .GSCORE = p->n_group > 1 && p->group_score == MJ_GROUP_SCORE_MAX,
                                .SCORING = p->scoring == MJ_SCORING_SOFTMAX,
                                .RENORM = p->renormalize != 0,
                                .NWARPS = nwarps};
}

mj_status mj_route_knobs(const mj_route_params *p, int32_t B, mj_knobs_oea_route *kn) {
    MJ_CHECK(check_route(p, B));
    if (B <= MJ_ROUTE_ONE_BLOCK_MAX) *kn = route_knobs(p, p->k0, route_warps(p->n_experts, p->topk, B));
    else *kn = route_knobs(p, p->topk, route_warps(p->n_experts, p->topk, 0));
    return MJ_OK;
}

static mj_status load_outputs(const mj_route_outputs *in, mj_route_outputs *out) {
    mj_route_outputs d = MJ_ROUTE_OUTPUTS_INIT;
    *out = d;
    if (!in) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: outputs are NULL");
    mj_status st = mj_struct_load(in, MJ_ROUTE_OUTPUTS_V1_SIZE, sizeof(mj_route_outputs), out,
                                  "mj_route_outputs", "MJ_ROUTE_OUTPUTS_INIT");
    if (st != MJ_OK) return mj_error_prefix(st, "mj_route");
    return MJ_OK;
}

mj_status mj_route(mj_context_t ctx, const mj_route_params *params, const float *logits, const float *bias,
                   int32_t B, const int32_t *num_valid, const mj_route_outputs *outputs, void *stream) {
    if (!ctx || !params || !outputs)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: NULL context, params or outputs");
    mj_route_params p;
    mj_route_outputs out;
    MJ_CHECK(mj_route_params_load(params, "mj_route", &p));
    MJ_CHECK(load_outputs(outputs, &out));
    if (B > 0 && (!logits || !out.ids || !out.weights || !out.n_sel))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_route: NULL logits or a required output "
                                                "(ids, weights, n_sel)");
    mj_knobs_oea_route kn;
    MJ_CHECK(mj_route_knobs(&p, B, &kn));
    const int32_t k = p.topk, nw = kn.NWARPS;
    mj_spec s;
    const mj_function *fn;
    mj_spec_oea_route(ctx, &kn, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    if (B <= MJ_ROUTE_ONE_BLOCK_MAX) {
        mj_launch_dims d = {{1, 1, 1}, {(uint32_t)nw * 32, 1, 1}, (uint32_t)route_dyn_smem(nw, kn.E, k, B), stream};
        return mj_launch_oea_route(fn, d, logits, bias, B, num_valid, p.routed_scaling_factor, out.ids,
                                   out.weights, out.n_sel, out.expert_counts, out.expert_offsets,
                                   out.active_experts, out.n_active, out.permutation, out.row_index);
    }
    /* Plain top-k over many blocks (a grid-stride loop over tokens, the grid capped at what
     * the device keeps busy; at least 2 blocks: a grid of one is the one-block OEA launch,
     * which needs the ids' dynamic shared memory), then the dispatch in one block of the
     * same warps. */
    int64_t blocks = (B + nw - 1) / nw, cap = mj_context_max_blocks(ctx);
    if (blocks > cap) blocks = cap;
    if (blocks < 2) blocks = 2;
    mj_launch_dims d = {{(uint32_t)blocks, 1, 1}, {(uint32_t)nw * 32, 1, 1}, (uint32_t)route_dyn_smem(nw, kn.E, k, 0),
                        stream};
    MJ_CHECK(mj_launch_oea_route(fn, d, logits, bias, B, num_valid, p.routed_scaling_factor, out.ids,
                                 out.weights, out.n_sel, NULL, NULL, NULL, NULL, NULL, NULL));
    if (!out.expert_counts && !out.expert_offsets && !out.active_experts && !out.n_active &&
        !out.permutation && !out.row_index)
        return MJ_OK;
    /* The dispatch: the same kernel in one block with logits NULL reads the ids just written. */
    mj_launch_dims d1 = {{1, 1, 1}, {(uint32_t)nw * 32, 1, 1}, (uint32_t)route_dyn_smem(nw, kn.E, k, 0), stream};
    return mj_launch_oea_route(fn, d1, NULL, NULL, B, NULL, 0.0f, out.ids, NULL, NULL, out.expert_counts,
                               out.expert_offsets, out.active_experts, out.n_active, out.permutation,
                               out.row_index);
}

mj_status mj_route_dispatch_knobs(int32_t E, int32_t k, mj_knobs_oea_route *kn) {
    mj_route_params p = MJ_ROUTE_PARAMS_INIT;
    p.n_experts = E, p.topk = k, p.k0 = k;
    MJ_CHECK(check_route(&p, 0));
    *kn = route_knobs(&p, k, route_warps(E, k, 0));
    return MJ_OK;
}

mj_status mj_route_dispatch(mj_context_t ctx, const int32_t *ids, int32_t B, int32_t k, int32_t E,
                            const mj_route_outputs *out, void *stream) {
    mj_knobs_oea_route kn;
    MJ_CHECK(mj_route_dispatch_knobs(E, k, &kn));
    mj_spec s;
    const mj_function *fn;
    mj_spec_oea_route(ctx, &kn, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    if (B <= 0) return MJ_OK;
    mj_launch_dims d = {{1, 1, 1}, {(uint32_t)kn.NWARPS * 32, 1, 1}, (uint32_t)route_dyn_smem(kn.NWARPS, E, k, 0),
                        stream};
    /* ids are only read in this launch shape (logits NULL) */
    return mj_launch_oea_route(fn, d, NULL, NULL, B, NULL, 0.0f, (int32_t *)ids, NULL, NULL, out->expert_counts,
                               out->expert_offsets, out->active_experts, out->n_active, out->permutation,
                               out->row_index);
}

/* ---- the router GEMM -------------------------------------------------------------------- */

/* The router GEMM's rows per tile (templates/router_gemm.cu TILE): the gate is streamed once
 * per tile, so once for B <= 64. */
#define MJ_ROUTER_TILE 64

/* Warps per block: the fewest that leave a thread at most 4 of the gate row's 16-byte
 * chunks (so a GLM-5 row, 768 chunks, gets 8 warps and 3 chunks a thread), at most 8. */
static int32_t router_warps(int32_t H) {
    int32_t nw = 1;
    while (nw < 8 && H / 8 > nw * 32 * 4) nw *= 2;
    return nw;
}

void mj_router_knobs(int32_t H, int32_t E, int32_t B, mj_knobs_router_gemm *kn) {
    /* ROWS: the largest power of 2 <= B (a group of rows never reads past B), at most 8,
     * and at most 32 chunk-rows a group (the unrolled body: 24 for GLM-5, 3 chunks x 8). */
    const int32_t nw = router_warps(H), ch = (H / 8 + nw * 32 - 1) / (nw * 32);
    int32_t rows = 1;
    while (rows < 8 && rows * 2 <= B && ch * rows * 2 <= 32) rows *= 2;
    *kn = (mj_knobs_router_gemm){.H = H, .E = E, .ROWS = rows, .NWARPS = nw};
}

mj_status mj_router_gemm(mj_context_t ctx, const uint16_t *hidden, const uint16_t *gate, int32_t B,
                         int32_t H, int32_t E, float *logits, void *stream) {
    if (!ctx || (B > 0 && (!hidden || !gate || !logits)) || B < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_router_gemm: NULL argument or B < 0");
    if (H < MJ_KNOB_router_gemm_H_MIN || H > MJ_KNOB_router_gemm_H_MAX || H % 64)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: hidden %d must be a multiple of 64 in %d..%d", H,
                            MJ_KNOB_router_gemm_H_MIN, MJ_KNOB_router_gemm_H_MAX);
    if (E < MJ_KNOB_router_gemm_E_MIN || E > MJ_KNOB_router_gemm_E_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: %d experts; %d..%d supported", E,
                            MJ_KNOB_router_gemm_E_MIN, MJ_KNOB_router_gemm_E_MAX);
    if (B == 0) return MJ_OK;
    if (((uintptr_t)hidden | (uintptr_t)gate) % 16)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_router_gemm: hidden (%p) and gate (%p) must be 16-byte aligned "
                                                "(the kernel reads them in 16-byte loads)",
                            (const void *)hidden, (const void *)gate);
    if (B > 65535LL * MJ_ROUTER_TILE)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: B = %d is more than %lld rows", B,
                            65535LL * MJ_ROUTER_TILE);
    mj_knobs_router_gemm kn;
    mj_router_knobs(H, E, B, &kn);
    mj_spec s;
    const mj_function *fn;
    mj_spec_router_gemm(ctx, &kn, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    mj_launch_dims d = {{(uint32_t)E, (uint32_t)((B + MJ_ROUTER_TILE - 1) / MJ_ROUTER_TILE), 1},
                        {(uint32_t)kn.NWARPS * 32, 1, 1}, 0, stream};
    return mj_launch_router_gemm(fn, d, hidden, gate, B, logits);
}
