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
/* The most experts whose lanes sort their lists (templates/oea_route.cu's SORTED: at most 8
 * experts a lane); above it the kernel has no list bytes. */
#define MJ_ROUTE_SORTED_MAX_E 256

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

/* The dynamic shared memory of a launch: the warps' score rows (s and c, E words each), their
 * sorted lists' expert slots where E <= MJ_ROUTE_SORTED_MAX_E (a byte for each
 * of 32 lanes x ceil(E / 32) entries), and the ids when B > 0 (the one-block kernel). */
static int64_t route_dyn_smem(int32_t nw, int32_t E, int32_t k, int32_t B) {
    const int64_t lists = E <= MJ_ROUTE_SORTED_MAX_E ? (int64_t)nw * ((E + 31) / 32) * 32 : 0;
    return 2LL * nw * E * 4 + lists + (int64_t)B * k * 4;
}

int64_t mj_route_dyn_smem(const mj_knobs_oea_route *kn, int32_t B) { return route_dyn_smem(kn->NWARPS, kn->E, kn->K, B); }

/* Shared memory of a route kernel: per warp a token's s, c and list (dynamic), the dispatch's
 * counts and S_base (32 mask words; static), and the B x k ids of the one-block kernel
 * (dynamic). */
static int64_t route_smem(int32_t nw, int32_t E, int32_t k, int32_t B) {
    return route_dyn_smem(nw, E, k, B) + (int64_t)E * 4 + 64 * 4;
}

/* Warps per block: one a token up to 32 (at least 8: the dispatch's loops over the experts
 * share them out), so that a warp routes one token and scores it once; 16 from 5 tokens, so
 * that the round's sigmoid scores are 4 pairs a thread, not 8 (the block's warps are then 4 a
 * scheduler, still fewer than one warp's own issue interval hides: GLM-5's B 8 on an H200, 4.9
 * us by the model, 5.5 on 8 warps) where B x k is past 32: B x k <= 32 keeps 8 warps and
 * the short dispatch, which blocks of more warps leave out; fewer when the shared memory would
 * not fit the budget. */
static int32_t route_warps(int32_t E, int32_t k, int32_t B) {
    int32_t nw = B > 16 ? 32 : B > 4 && (int64_t)B * k > 32 ? 16 : 8;
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

int32_t mj_route_dispatch_warps(const mj_knobs_oea_route *kn) {
    return kn->NWARPS > MJ_ROUTE_DISPATCH_WARPS && kn->E <= 256 ? MJ_ROUTE_DISPATCH_WARPS : kn->NWARPS;
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

/* The router GEMM's launch (templates/router_gemm.cu): blocks of 16 experts, a part of H
 * and a tile of ROWS rows. H is split into parts until the grid has about
 * MJ_ROUTER_BLOCKS blocks (the gate streams with every SM), at most one run of KCH chunks
 * (128 k) per warp and part. */
#define MJ_ROUTER_BLOCKS 256
/* The workspace: the counters first (what must be zero), the parts after them. The counters'
 * region is the same for every B (H is split only while the grid has fewer than
 * MJ_ROUTER_BLOCKS tiles, so there are fewer counters than that): a launch's counters never
 * lie where another B's partial sums were left, and each launch leaves the region at 0. */
#define MJ_ROUTER_COUNTS (MJ_ROUTER_BLOCKS * sizeof(uint32_t))

void mj_router_knobs(int32_t H, int32_t E, int32_t B, mj_knobs_router_gemm *kn) {
    /* ROWS: the fewest groups of 8 that hold B, at most 64. NWARPS: 4, fewer when the row
     * has fewer runs. */
    const int32_t runs = (H + MJ_ROUTER_RUN - 1) / MJ_ROUTER_RUN;
    int32_t nw = 1;
    while (nw < 4 && nw < runs) nw *= 2;
    *kn = (mj_knobs_router_gemm){.H = H, .E = E, .ROWS = B <= 8 ? 8 : B <= 16 ? 16 : B <= 32 ? 32 : 64, .NWARPS = nw};
}

void mj_router_grid(const mj_knobs_router_gemm *kn, int32_t B, mj_router_dims *d) {
    const int64_t et = (kn->E + 15) / 16, rt = ((int64_t)B + kn->ROWS - 1) / kn->ROWS;
    const int64_t runs = (kn->H + MJ_ROUTER_RUN - 1) / MJ_ROUTER_RUN, most = (runs + kn->NWARPS - 1) / kn->NWARPS;
    int64_t ks = (MJ_ROUTER_BLOCKS + et * rt - 1) / (et * rt);
    if (ks > most) ks = most;
    if (ks < 1) ks = 1;
    /* blocks of one part hold the same number of runs: a part of rpz runs, KS = the parts
     * that rpz leaves (so no part is empty) */
    const int64_t rpz = (runs + ks - 1) / ks;
    ks = (runs + rpz - 1) / rpz;
    d->et = (int32_t)et, d->ks = (int32_t)ks, d->rpz = (int32_t)rpz, d->rt = (int32_t)rt;
    d->part_bytes = ks > 1 ? (size_t)(rt * et * ks * kn->ROWS * 16) * sizeof(float) : 0;
    d->count_bytes = ks > 1 ? (size_t)(rt * et) * sizeof(uint32_t) : 0; /* < MJ_ROUTER_BLOCKS of them */
}

/* The workspace a launch of dims d needs: the counters' region and the parts, when H is split. */
static size_t router_need(const mj_router_dims *d) { return d->ks > 1 ? MJ_ROUTER_COUNTS + d->part_bytes : 0; }

mj_status mj_router_gemm_workspace(int32_t B, int32_t H, int32_t E, size_t *bytes) {
    if (!bytes || B < 0) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_router_gemm_workspace: NULL bytes or B < 0");
    *bytes = 0;
    if (H < MJ_KNOB_router_gemm_H_MIN || H > MJ_KNOB_router_gemm_H_MAX || H % 64)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm_workspace: hidden %d must be a multiple of 64 in %d..%d",
                            H, MJ_KNOB_router_gemm_H_MIN, MJ_KNOB_router_gemm_H_MAX);
    if (E < MJ_KNOB_router_gemm_E_MIN || E > MJ_KNOB_router_gemm_E_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm_workspace: %d experts; %d..%d supported", E,
                            MJ_KNOB_router_gemm_E_MIN, MJ_KNOB_router_gemm_E_MAX);
    /* The most any B up to the given one needs: H is split only while the grid is short of
     * MJ_ROUTER_BLOCKS blocks, so no B past 64 * MJ_ROUTER_BLOCKS rows needs any. */
    const int32_t top = B < 64 * MJ_ROUTER_BLOCKS ? B : 64 * MJ_ROUTER_BLOCKS;
    for (int32_t b = 1; b <= top; b++) {
        mj_knobs_router_gemm kn;
        mj_router_dims d;
        mj_router_knobs(H, E, b, &kn);
        mj_router_grid(&kn, b, &d);
        if (router_need(&d) > *bytes) *bytes = router_need(&d);
    }
    return MJ_OK;
}

mj_status mj_router_gemm(mj_context_t ctx, const uint16_t *hidden, const uint16_t *gate, int32_t B,
                         int32_t H, int32_t E, float *logits, void *workspace, size_t workspace_bytes, void *stream) {
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
    mj_knobs_router_gemm kn;
    mj_router_dims d;
    mj_router_knobs(H, E, B, &kn);
    mj_router_grid(&kn, B, &d);
    if (d.rt > 65535)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_router_gemm: B = %d is more than the %lld rows supported", B,
                            65535LL * kn.ROWS);
    float *part = NULL;
    uint32_t *count = NULL;
    if (d.ks > 1) {
        const size_t need = router_need(&d);
        if (!workspace || workspace_bytes < need || (uintptr_t)workspace % 16)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "mj_router_gemm: B = %d splits H over %d blocks, which needs %zu bytes of workspace "
                                "(16-byte aligned, zeroed once before its first use); got %zu at %p: size it "
                                "with mj_router_gemm_workspace for the largest B",
                                B, d.ks, need, workspace_bytes, workspace);
        count = (uint32_t *)workspace;
        part = (float *)((uint8_t *)workspace + MJ_ROUTER_COUNTS);
    }
    mj_spec s;
    const mj_function *fn;
    mj_spec_router_gemm(ctx, &kn, &s);
    MJ_CHECK(mj_jit_get(ctx, &s, &fn));
    mj_launch_dims ld = {{(uint32_t)d.et, (uint32_t)d.ks, (uint32_t)d.rt}, {(uint32_t)kn.NWARPS * 32, 1, 1}, 0, stream};
    return mj_launch_router_gemm(fn, ld, hidden, gate, B, d.rpz, logits, part, count);
}
