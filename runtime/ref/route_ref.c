/* route_ref.c — the CPU reference of MoE routing: noaux_tc top-k and OEA.
 *
 * This file is the oracle every routing kernel is tested against, so it is written to be
 * read, not to be fast. It does, per token, what the routing contract of docs/architecture.md
 * describes (noaux_tc top-k, then OEA), in fp32 as the GPU will:
 *
 *   1. scores      s_e = sigmoid(logit_e), or the softmax of the token's logits;
 *   2. selection   c_e = s_e + bias_e (the bias only chooses experts; it never weighs them);
 *   3. groups      with n_group > 1 only the topk_group best groups stay eligible, a group's
 *                  score being the sum of its two best c (noaux_tc: DeepSeek-V3, GLM-5) or its
 *                  best c alone (group_limited_greedy: DeepSeek-V2), as group_score says;
 *   4. ranking     the eligible experts by c, best first, ties to the lower expert id;
 *   5. OEA phase 1 each token keeps the first k0 of its ranking; S_base is the union of
 *                  those over the valid tokens of the batch;
 *   6. OEA phase 2 each token walks the rest of its ranking and takes the experts that are
 *                  already in S_base, until it has k;
 *   7. weights     the unbiased s of the chosen experts, renormalized over the final set when
 *                  norm_topk_prob, times routed_scaling_factor.
 *
 * With k0 == k phase 2 has nothing to add and this is plain top-k routing (SGLang / HF).
 * With k0 < k a token may end with fewer than k experts, but never with an expert that no
 * token of the batch wanted in its own first k0: that is how OEA shrinks the number of
 * distinct experts whose weights a decode step must read.
 *
 * NaN logits: a NaN ranks below every number (below -inf too) and weighs nothing (s = 0),
 * so a token picks an expert with a NaN logit only when fewer than k experts have a number.
 *
 * The batch is done in two passes because phase 2 needs S_base, which needs every token's
 * phase 1: pass 1 ranks every valid token and builds S_base, pass 2 finishes each token.
 */
#include "ref/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------
 * Parameters
 * ------------------------------------------------------------------------------------- */

mj_status mj_route_params_from_config(const mj_moe_config *cfg, mj_route_params *p) {
    if (!cfg || !p)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_params_from_config: %s is NULL; pass a config (e.g. from "
                            "mj_moe_config_read) and a params struct to fill",
                            !cfg ? "cfg" : "p");
    mj_route_params r = MJ_ROUTE_PARAMS_INIT;
    r.n_experts = cfg->n_experts;
    r.topk = cfg->topk;
    r.k0 = cfg->topk; /* plain top-k until the caller chooses an OEA k0 */
    r.n_group = cfg->n_group;
    r.topk_group = cfg->topk_group;
    r.scoring = cfg->scoring;
    r.routed_scaling_factor = cfg->routed_scaling_factor;
    r.renormalize = cfg->norm_topk_prob;
    r.group_score = cfg->group_score;
    *p = r;
    return MJ_OK;
}

mj_status mj_route_params_load(const mj_route_params *in, const char *fn, mj_route_params *out) {
    mj_route_params d = MJ_ROUTE_PARAMS_INIT;
    *out = d;
    if (!in) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: params is NULL", fn);
    /* A caller built before group_score existed passes MJ_ROUTE_PARAMS_V1_SIZE: the fields it
     * does not know keep their defaults from MJ_ROUTE_PARAMS_INIT (the top-2 sum). */
    mj_status st = mj_struct_load(in, MJ_ROUTE_PARAMS_V1_SIZE, sizeof(mj_route_params), out,
                                  "mj_route_params", "MJ_ROUTE_PARAMS_INIT");
    if (st != MJ_OK) return mj_error_prefix(st, "%s", fn);
    return MJ_OK;
}

/* Everything mj_route_ref needs to be true of p before it touches an output. */
static mj_status check_params(const mj_route_params *p) {
    const int32_t E = p->n_experts, k = p->topk, k0 = p->k0;
    if (E < 1)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: n_experts = %d; it must be at least 1", E);
    if (k < 1 || k > E)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: topk = %d with n_experts = %d; topk must be in 1..%d",
                            k, E, E);
    if (k0 < 1 || k0 > k)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: k0 = %d with topk = %d; k0 must be in 1..%d "
                            "(k0 = topk is plain top-k)",
                            k0, k, k);
    if (p->n_group < 1 || E % p->n_group != 0)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: n_group = %d with n_experts = %d; n_group must be "
                            "at least 1 and divide n_experts (1 turns group limits off)",
                            p->n_group, E);
    if (p->topk_group < 1 || p->topk_group > p->n_group)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: topk_group = %d with n_group = %d; topk_group must "
                            "be in 1..%d",
                            p->topk_group, p->n_group, p->n_group);
    if (p->n_group > 1 && (int64_t)p->topk_group * (E / p->n_group) < k)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: topk_group = %d groups of %d experts leave %lld "
                            "experts, fewer than topk = %d; raise topk_group",
                            p->topk_group, E / p->n_group,
                            (long long)p->topk_group * (E / p->n_group), k);
    if (p->scoring != MJ_SCORING_SIGMOID && p->scoring != MJ_SCORING_SOFTMAX)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: scoring = %d; use MJ_SCORING_SIGMOID or "
                            "MJ_SCORING_SOFTMAX",
                            (int)p->scoring);
    if (p->group_score != MJ_GROUP_SCORE_TOP2_SUM && p->group_score != MJ_GROUP_SCORE_MAX)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: group_score = %d; use MJ_GROUP_SCORE_TOP2_SUM "
                            "(noaux_tc) or MJ_GROUP_SCORE_MAX (group_limited_greedy)",
                            (int)p->group_score);
    if (!isfinite(p->routed_scaling_factor))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: routed_scaling_factor is %g; it must be finite "
                            "(1.0 when the model has none)",
                            (double)p->routed_scaling_factor);
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * The order of experts
 * ------------------------------------------------------------------------------------- */

/* The one ordering used everywhere here: does (score a, id ia) rank before (b, ib)?
 * Higher score first; NaN after every number; equal scores (or two NaNs) by the lower id.
 * It is a total order on distinct ids, so every sort and every pick is deterministic. */
static int ranks_before(float a, int32_t ia, float b, int32_t ib) {
    int a_nan = isnan(a), b_nan = isnan(b);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && a != b) return a > b;
    return ia < ib;
}

typedef struct scored {
    float c;    /* selection score                                                   */
    int32_t id; /* expert (or group) id                                              */
} scored;

static int compare_scored(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->id == b->id) return 0;
    return ranks_before(a->c, a->id, b->c, b->id) ? -1 : 1;
}

/* ---------------------------------------------------------------------------------------
 * Step 1: scores. Returns the number of NaN logits in the row.
 * ------------------------------------------------------------------------------------- */

static int32_t sigmoid_scores(const float *x, int32_t E, float *s) {
    int32_t nans = 0;
    for (int32_t e = 0; e < E; e++) {
        if (isnan(x[e])) {
            s[e] = 0.0f;
            nans++;
        } else {
            s[e] = 1.0f / (1.0f + expf(-x[e]));
        }
    }
    return nans;
}

/* Softmax over the row's non-NaN logits, with the max subtracted. Two edge cases get an
 * answer instead of a NaN: when the max is +inf the +inf experts share the mass equally,
 * and when it is -inf (every number in the row is -inf) all of them share it equally. */
static int32_t softmax_scores(const float *x, int32_t E, float *s) {
    int32_t nans = 0, n_max = 0;
    float m = -INFINITY;
    int have_number = 0;
    for (int32_t e = 0; e < E; e++) {
        if (isnan(x[e])) {
            nans++;
            continue;
        }
        if (!have_number || x[e] > m) m = x[e];
        have_number = 1;
    }
    for (int32_t e = 0; e < E; e++) s[e] = 0.0f;
    if (!have_number) return nans; /* all NaN: nothing weighs anything */

    if (isinf(m)) { /* +inf max, or a row of -inf: the experts at the max share it */
        for (int32_t e = 0; e < E; e++) n_max += (x[e] == m);
        for (int32_t e = 0; e < E; e++)
            if (x[e] == m) s[e] = 1.0f / (float)n_max;
        return nans;
    }
    float sum = 0.0f; /* fp32, in expert order */
    for (int32_t e = 0; e < E; e++) {
        if (isnan(x[e])) continue;
        s[e] = expf(x[e] - m);
        sum += s[e];
    }
    for (int32_t e = 0; e < E; e++) s[e] /= sum; /* sum >= 1: the max contributes 1 */
    return nans;
}

/* ---------------------------------------------------------------------------------------
 * Steps 2-4: selection scores, the group limit, and the ranking of one token.
 * ------------------------------------------------------------------------------------- */

/* A group's score: the sum of its two best selection scores (the best one alone for a
 * group of one expert), or with MJ_GROUP_SCORE_MAX its best one. NaN counts as -inf here, as
 * a masked expert would. */
static float group_score(const float *c, int32_t first, int32_t size, mj_group_score rule) {
    float best1 = -INFINITY, best2 = -INFINITY;
    for (int32_t e = first; e < first + size; e++) {
        float v = isnan(c[e]) ? -INFINITY : c[e];
        if (v > best1) {
            best2 = best1;
            best1 = v;
        } else if (v > best2) {
            best2 = v;
        }
    }
    return (size == 1 || rule == MJ_GROUP_SCORE_MAX) ? best1 : best1 + best2;
}

/* eligible[e] = 1 for the experts of the topk_group best groups (all experts when
 * n_group == 1). groups is scratch of n_group entries. */
static void mark_eligible(const mj_route_params *p, const float *c, scored *groups,
                          uint8_t *eligible) {
    const int32_t E = p->n_experts, G = p->n_group, size = E / G;
    if (G == 1) {
        memset(eligible, 1, (size_t)E);
        return;
    }
    for (int32_t g = 0; g < G; g++) {
        groups[g].c = group_score(c, g * size, size, p->group_score);
        groups[g].id = g;
    }
    qsort(groups, (size_t)G, sizeof *groups, compare_scored);
    memset(eligible, 0, (size_t)E);
    for (int32_t j = 0; j < p->topk_group; j++)
        memset(eligible + (size_t)groups[j].id * size, 1, (size_t)size);
}

/* Rank one token: fill rank[] with its eligible experts, best first; return how many. */
static int32_t rank_token(const mj_route_params *p, const float *x, const float *s,
                          const float *bias, float *c, scored *groups, uint8_t *eligible,
                          scored *order, int32_t *rank) {
    const int32_t E = p->n_experts;
    for (int32_t e = 0; e < E; e++) /* a NaN logit's selection score is NaN: ranks last */
        c[e] = isnan(x[e]) ? NAN : s[e] + (bias ? bias[e] : 0.0f);
    mark_eligible(p, c, groups, eligible);

    int32_t n = 0;
    for (int32_t e = 0; e < E; e++) {
        if (!eligible[e]) continue;
        order[n].c = c[e];
        order[n].id = e;
        n++;
    }
    qsort(order, (size_t)n, sizeof *order, compare_scored);
    for (int32_t j = 0; j < n; j++) rank[j] = order[j].id;
    return n;
}

/* ---------------------------------------------------------------------------------------
 * Steps 5-7 and the batch
 * ------------------------------------------------------------------------------------- */

/* Scratch for one call, one malloc each, all freed by scratch_free. */
typedef struct scratch {
    float *s;         /* [num_valid, E] unbiased scores                              */
    int32_t *rank;    /* [num_valid, E] each valid token's ranking                   */
    int32_t *n_rank;  /* [num_valid] how many experts each ranking holds             */
    float *c;         /* [E] selection scores of the token being ranked              */
    scored *order;    /* [E] sort buffer                                             */
    scored *groups;   /* [n_group] sort buffer                                       */
    uint8_t *eligible;/* [E] group mask                                              */
    uint8_t *in_base; /* [E] S_base                                                  */
    uint8_t *seen;    /* [E] for counting distinct experts                           */
} scratch;

static void scratch_free(scratch *w) {
    free(w->s);
    free(w->rank);
    free(w->n_rank);
    free(w->c);
    free(w->order);
    free(w->groups);
    free(w->eligible);
    free(w->in_base);
    free(w->seen);
}

static mj_status scratch_alloc(scratch *w, int32_t E, int32_t G, int32_t num_valid) {
    size_t rows = num_valid > 0 ? (size_t)num_valid : 1, nE = (size_t)E;
    memset(w, 0, sizeof *w);
    w->s = malloc(rows * nE * sizeof *w->s);
    w->rank = malloc(rows * nE * sizeof *w->rank);
    w->n_rank = malloc(rows * sizeof *w->n_rank);
    w->c = malloc(nE * sizeof *w->c);
    w->order = malloc(nE * sizeof *w->order);
    w->groups = malloc((size_t)G * sizeof *w->groups);
    w->eligible = malloc(nE);
    w->in_base = calloc(nE, 1);
    w->seen = calloc(nE, 1);
    if (!w->s || !w->rank || !w->n_rank || !w->c || !w->order || !w->groups || !w->eligible ||
        !w->in_base || !w->seen) {
        scratch_free(w);
        return mj_set_error(MJ_ERR_NOMEM,
                            "mj_route_ref: out of memory for the scratch of %d tokens x %d "
                            "experts; route a smaller batch",
                            num_valid, E);
    }
    return MJ_OK;
}

/* Phase 2 for one token: its first k0, then the experts of rank[k0..] that are in S_base,
 * until it has k. Writes them to sel[] in ranking order; returns how many. */
static int32_t finish_token(const int32_t *rank, int32_t n_rank, int32_t k0, int32_t k,
                            const uint8_t *in_base, int32_t *sel) {
    int32_t n = 0;
    for (int32_t j = 0; j < k0; j++) sel[n++] = rank[j];
    for (int32_t j = k0; j < n_rank && n < k; j++)
        if (in_base[rank[j]]) sel[n++] = rank[j];
    return n;
}

/* Weights of one token's chosen experts, slot by slot. The renormalizing sum is fp32 in
 * slot order, with HF's 1e-20 guard against an all-zero set. */
static void token_weights(const float *s, const int32_t *sel, int32_t n, int renormalize,
                          float rsf, float *w) {
    float denom = 1.0f;
    if (renormalize) {
        float sum = 0.0f;
        for (int32_t j = 0; j < n; j++) sum += s[sel[j]];
        denom = sum + 1e-20f;
    }
    for (int32_t j = 0; j < n; j++)
        w[j] = renormalize ? s[sel[j]] / denom * rsf : s[sel[j]] * rsf;
}

/* Mark the experts of list[0..n) in seen[]; return how many were new. */
static int32_t mark_seen(uint8_t *seen, const int32_t *list, int32_t n) {
    int32_t fresh = 0;
    for (int32_t j = 0; j < n; j++) {
        fresh += !seen[list[j]];
        seen[list[j]] = 1;
    }
    return fresh;
}

static double mass_of(const float *s, const int32_t *list, int32_t n) {
    double m = 0.0;
    for (int32_t j = 0; j < n; j++) m += (double)s[list[j]];
    return m;
}

mj_status mj_route_ref(const mj_route_params *params, const float *logits, const float *bias,
                       int32_t B, int32_t num_valid, int32_t *ids, float *weights,
                       int32_t *n_sel, mj_route_stats *stats) {
    if (!params || !logits || !ids || !weights || !n_sel)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: %s is NULL; only bias and stats may be NULL",
                            !params ? "p" : !logits ? "logits" : !ids ? "ids" : !weights ? "weights"
                                                                                          : "n_sel");
    mj_route_params pv;
    MJ_CHECK(mj_route_params_load(params, "mj_route_ref", &pv));
    const mj_route_params *p = &pv;
    if (stats) {
        mj_route_stats probe;
        MJ_CHECK(mj_struct_load(stats, sizeof(mj_route_stats), sizeof(mj_route_stats), &probe,
                                "mj_route_stats", "MJ_ROUTE_STATS_INIT"));
    }
    MJ_CHECK(check_params(p));
    if (B < 0 || num_valid < 0 || num_valid > B)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_route_ref: B = %d, num_valid = %d; need 0 <= num_valid <= B "
                            "(rows at and past num_valid are padding)",
                            B, num_valid);

    const int32_t E = p->n_experts, k = p->topk, k0 = p->k0;
    scratch w;
    MJ_CHECK(scratch_alloc(&w, E, p->n_group, num_valid));

    /* Pass 1: scores and ranking of every valid token; phase 1 builds S_base. */
    int64_t nan_logits = 0;
    for (int32_t i = 0; i < num_valid; i++) {
        const float *x = logits + (size_t)i * E;
        float *s = w.s + (size_t)i * E;
        int32_t *rank = w.rank + (size_t)i * E;
        nan_logits += p->scoring == MJ_SCORING_SIGMOID ? sigmoid_scores(x, E, s)
                                                       : softmax_scores(x, E, s);
        w.n_rank[i] = rank_token(p, x, s, bias, w.c, w.groups, w.eligible, w.order, rank);
        for (int32_t j = 0; j < k0; j++) w.in_base[rank[j]] = 1;
    }

    /* Statistics of plain top-k (the first k of each ranking), before phase 2. */
    int32_t unique_before = 0;
    double mass_topk = 0.0;
    for (int32_t i = 0; i < num_valid; i++) {
        const int32_t *rank = w.rank + (size_t)i * E;
        unique_before += mark_seen(w.seen, rank, k);
        mass_topk += mass_of(w.s + (size_t)i * E, rank, k);
    }
    memset(w.seen, 0, (size_t)E);

    /* Pass 2: phase 2 and weights for the valid rows; padding rows get nothing. */
    int32_t unique_after = 0;
    int64_t total_sel = 0;
    double mass_kept = 0.0;
    for (int32_t i = 0; i < B; i++) {
        int32_t *row_ids = ids + (size_t)i * k;
        float *row_w = weights + (size_t)i * k;
        int32_t n = 0;
        if (i < num_valid) {
            const float *s = w.s + (size_t)i * E;
            n = finish_token(w.rank + (size_t)i * E, w.n_rank[i], k0, k, w.in_base, row_ids);
            token_weights(s, row_ids, n, p->renormalize, p->routed_scaling_factor, row_w);
            unique_after += mark_seen(w.seen, row_ids, n);
            total_sel += n;
            mass_kept += mass_of(s, row_ids, n);
        }
        for (int32_t j = n; j < k; j++) {
            row_ids[j] = -1;
            row_w[j] = 0.0f;
        }
        n_sel[i] = n;
    }

    if (stats) {
        mj_route_stats st = MJ_ROUTE_STATS_INIT;
        st.unique_before = unique_before;
        st.unique_after = unique_after;
        st.mean_experts = num_valid > 0 ? (double)total_sel / num_valid : 0.0;
        st.retained_mass = (k0 == k || mass_topk == 0.0) ? 1.0 : mass_kept / mass_topk;
        st.nan_logits = nan_logits;
        mj_struct_store(stats, &st, sizeof st);
    }
    scratch_free(&w);
    return MJ_OK;
}
