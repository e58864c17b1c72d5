/* test_route_ref.c — the CPU routing reference (noaux_tc top-k and OEA) against a second,
 * independent statement of the algorithm.
 *
 * The library ranks experts with qsort; this test ranks them with a plain selection loop and
 * computes its own group limit, S_base and phase 2, so a wrong reading of the algorithm in
 * either place shows up as a disagreement. Then come hand-worked batches whose answers are
 * written out in comments, and the edge cases: padding rows, ties, the bias, NaN logits, a
 * hot expert and invalid arguments. Both group-score rules (noaux_tc's top-2 sum, DeepSeek-V2's
 * max) run through the random sweep, and hand-made logits on which the two rules keep
 * different groups show that each keeps the one it should; a caller with the old, smaller
 * mj_route_params gets the top-2 sum.
 */
#include "base.h"
#include "test.h"

#include <string.h>

#define MAXE 256
#define MAXB 64
#define MAXK 16

/* ---------------------------------------------------------------------------------------
 * The test's own router, written the simple way (selection loops, no sorting)
 * ------------------------------------------------------------------------------------- */

static float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Does (score a, id ia) come before (score b, id ib)? NaN after every number. */
static int t_before(float a, int ia, float b, int ib) {
    if (isnan(a) && isnan(b)) return ia < ib;
    if (isnan(a)) return 0;
    if (isnan(b)) return 1;
    if (a != b) return a > b;
    return ia < ib;
}

/* Unbiased scores (no infinities here: the edge-case tests check those by hand). */
static void t_scores(mj_scoring scoring, const float *x, int E, float *s) {
    if (scoring == MJ_SCORING_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = isnan(x[e]) ? 0.0f : sig(x[e]);
        return;
    }
    float m = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
        if (!isnan(x[e]) && x[e] > m) m = x[e];
    for (int e = 0; e < E; e++)
        if (!isnan(x[e])) sum += expf(x[e] - m);
    for (int e = 0; e < E; e++) s[e] = isnan(x[e]) ? 0.0f : expf(x[e] - m) / sum;
}

static float no_nan(float v) { return isnan(v) ? -INFINITY : v; }

/* ok[e] = 1 for the experts of the kept groups: each group scored by its best plus its
 * second best selection score (found by two scans), or by its best alone under
 * MJ_GROUP_SCORE_MAX, the best topk_group groups kept. */
static void t_groups(const mj_route_params *p, const float *c, unsigned char *ok) {
    int E = p->n_experts, G = p->n_group, size = E / G;
    if (G == 1) {
        for (int e = 0; e < E; e++) ok[e] = 1;
        return;
    }
    float gscore[MAXE];
    for (int g = 0; g < G; g++) {
        int first = g * size, b1 = first;
        for (int e = first; e < first + size; e++)
            if (no_nan(c[e]) > no_nan(c[b1])) b1 = e;
        if (size == 1 || p->group_score == MJ_GROUP_SCORE_MAX) {
            gscore[g] = no_nan(c[b1]);
            continue;
        }
        int b2 = -1;
        for (int e = first; e < first + size; e++)
            if (e != b1 && (b2 < 0 || no_nan(c[e]) > no_nan(c[b2]))) b2 = e;
        gscore[g] = no_nan(c[b1]) + no_nan(c[b2]);
    }
    unsigned char taken[MAXE] = {0};
    for (int e = 0; e < E; e++) ok[e] = 0;
    for (int t = 0; t < p->topk_group; t++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!taken[g] && (best < 0 || t_before(gscore[g], g, gscore[best], best))) best = g;
        taken[best] = 1;
        for (int e = best * size; e < (best + 1) * size; e++) ok[e] = 1;
    }
}

/* A token's full ranking of eligible experts (returns how many) and its scores s[]. */
static int t_ranking(const mj_route_params *p, const float *x, const float *bias, int *rank,
                     float *s) {
    int E = p->n_experts;
    float c[MAXE];
    unsigned char ok[MAXE], used[MAXE] = {0};
    t_scores(p->scoring, x, E, s);
    for (int e = 0; e < E; e++) c[e] = isnan(x[e]) ? NAN : s[e] + (bias ? bias[e] : 0.0f);
    t_groups(p, c, ok);
    int n = 0;
    for (int e = 0; e < E; e++) n += ok[e];
    for (int pos = 0; pos < n; pos++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (ok[e] && !used[e] && (best < 0 || t_before(c[e], e, c[best], best))) best = e;
        rank[pos] = best;
        used[best] = 1;
    }
    return n;
}

/* Expected weight of slot j of a token's list sel[0..n). */
static float t_weight(const float *s, const int32_t *sel, int n, int j, int renorm, float rsf) {
    if (!renorm) return s[sel[j]] * rsf;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += s[sel[i]];
    return s[sel[j]] / (sum + 1e-20f) * rsf;
}

static int count_distinct(const int32_t *list, int n, int E) {
    unsigned char seen[MAXE] = {0};
    int d = 0;
    for (int i = 0; i < n; i++)
        if (list[i] >= 0 && list[i] < E && !seen[list[i]]) {
            seen[list[i]] = 1;
            d++;
        }
    return d;
}

/* ---------------------------------------------------------------------------------------
 * Randomized cases
 * ------------------------------------------------------------------------------------- */

typedef struct rcase {
    mj_route_params p;
    int B, num_valid, use_bias;
    char tag[200];
} rcase;

/* What the randomized k0 sweep reached, so a branch no case reached is itself a failure. */
static int g_seen_pruned;  /* a token ended with exactly k0 < k experts               */
static int g_seen_partial; /* k0 < n_sel < k                                           */
static int g_seen_full;    /* n_sel == k > k0 (phase 2 filled the token up)           */

static void random_inputs(const rcase *rc, uint64_t *seed, float *x, float *bias) {
    int E = rc->p.n_experts;
    for (int i = 0; i < rc->B * E; i++) x[i] = (float)(2.0 * mj_rng_normal(seed));
    double scale = rc->p.scoring == MJ_SCORING_SIGMOID ? 0.3 : 0.5 / E;
    for (int e = 0; e < E; e++) bias[e] = (float)(scale * mj_rng_normal(seed));
}

/* k0 = k must be plain top-k: compare with the first k of the test's ranking. */
static void check_plain(const rcase *rc, const float *x, const float *bias) {
    const mj_route_params *p = &rc->p;
    int E = p->n_experts, k = p->topk, B = rc->B, nv = rc->num_valid;
    int32_t ids[MAXB * MAXK], n_sel[MAXB], all_ids[MAXB * MAXK];
    float w[MAXB * MAXK];
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    CHECK_OK(mj_route_ref(p, x, rc->use_bias ? bias : NULL, B, nv, ids, w, n_sel, &st));

    int bad = 0;
    for (int i = 0; i < nv; i++) {
        int rank[MAXE];
        float s[MAXE];
        t_ranking(p, x + i * E, rc->use_bias ? bias : NULL, rank, s);
        bad += n_sel[i] != k;
        for (int j = 0; j < k; j++) {
            all_ids[i * k + j] = rank[j];
            bad += ids[i * k + j] != rank[j];
        }
        for (int j = 0; j < k && !bad; j++) {
            float want =
                t_weight(s, all_ids + i * k, k, j, p->renormalize, p->routed_scaling_factor);
            bad += fabsf(w[i * k + j] - want) > 1e-6f * fabsf(want) + 1e-30f;
        }
        if (bad) {
            CHECK(0, "%s: token %d differs from plain top-k (n_sel %d; slot 0 id %d want %d)",
                  rc->tag, i, n_sel[i], ids[i * k], rank[0]);
            return;
        }
    }
    int distinct = count_distinct(all_ids, nv * k, E);
    CHECK(st.unique_before == distinct && st.unique_after == distinct,
          "%s: unique before %d after %d, want %d", rc->tag, st.unique_before, st.unique_after,
          distinct);
    CHECK(st.retained_mass == 1.0, "%s: retained %.17g at k0 == k", rc->tag, st.retained_mass);
    CHECK(st.mean_experts == (nv ? (double)k : 0.0), "%s: mean %g", rc->tag, st.mean_experts);
    CHECK(st.nan_logits == 0, "%s: nan_logits %lld", rc->tag, (long long)st.nan_logits);
}

/* Every k0 in 1..k: the OEA properties, checked against the test's own S_base. */
static void check_oea_sweep(const rcase *rc, const float *x, const float *bias) {
    mj_route_params p = rc->p;
    int E = p.n_experts, k = p.topk, B = rc->B, nv = rc->num_valid;
    const float *b = rc->use_bias ? bias : NULL;
    static int rank[MAXB][MAXE], nrank[MAXB];
    static float s[MAXB][MAXE];
    int32_t topk_ids[MAXB * MAXK];
    double mass_topk = 0.0;
    for (int i = 0; i < nv; i++) {
        nrank[i] = t_ranking(&p, x + i * E, b, rank[i], s[i]);
        for (int j = 0; j < k; j++) {
            topk_ids[i * k + j] = rank[i][j];
            mass_topk += s[i][rank[i][j]];
        }
    }
    int want_before = count_distinct(topk_ids, nv * k, E);
    int prev_unique = 0;
    double prev_mass = 0.0;

    for (int k0 = 1; k0 <= k; k0++) {
        p.k0 = k0;
        int32_t ids[MAXB * MAXK], n_sel[MAXB];
        float w[MAXB * MAXK];
        mj_route_stats st = MJ_ROUTE_STATS_INIT;
        CHECK_OK(mj_route_ref(&p, x, b, B, nv, ids, w, n_sel, &st));

        unsigned char base[MAXE] = {0};
        int nbase = 0;
        for (int i = 0; i < nv; i++)
            for (int j = 0; j < k0; j++) base[rank[i][j]] = 1;
        for (int e = 0; e < E; e++) nbase += base[e];

        int failed = 0;
        long total = 0;
        double mass_kept = 0.0;
        for (int i = 0; i < nv && !failed; i++) {
            const int32_t *row = ids + i * k;
            int n = n_sel[i];
            total += n;
            if (n < k0 || n > k) {
                CHECK(0, "%s k0=%d: token %d has %d experts", rc->tag, k0, i, n);
                failed = 1;
                break;
            }
            /* The expected list: its first k0, then the base experts of rank[k0..], to k. */
            int32_t want[MAXK];
            int nw = 0;
            for (int j = 0; j < k0; j++) want[nw++] = rank[i][j];
            for (int j = k0; j < nrank[i] && nw < k; j++)
                if (base[rank[i][j]]) want[nw++] = rank[i][j];
            int pos[MAXE];
            for (int e = 0; e < E; e++) pos[e] = -1;
            for (int j = 0; j < nrank[i]; j++) pos[rank[i][j]] = j;
            unsigned char dup[MAXE] = {0};
            for (int j = 0; j < n && !failed; j++) {
                int e = row[j];
                if (e < 0 || e >= E || pos[e] < 0 || dup[e]) {
                    CHECK(0, "%s k0=%d: token %d slot %d id %d (out of range, not eligible or "
                          "repeated)", rc->tag, k0, i, j, e);
                    failed = 1;
                    break;
                }
                dup[e] = 1;
                if (j < k0 && e != rank[i][j]) {
                    CHECK(0, "%s k0=%d: token %d slot %d id %d, its top-k0 has %d", rc->tag,
                          k0, i, j, e, rank[i][j]);
                    failed = 1;
                }
            }
            if (failed) break;
            int same = n == nw;
            for (int j = 0; same && j < n; j++) same = row[j] == want[j];
            if (!same) {
                CHECK(0, "%s k0=%d: token %d got %d experts (last %d), want %d (last %d)",
                      rc->tag, k0, i, n, row[n - 1], nw, want[nw - 1]);
                failed = 1;
                break;
            }
            if (n < k) /* it stopped short: no base expert of rank[k0..] was left behind */
                for (int j = k0; j < nrank[i]; j++)
                    if (base[rank[i][j]] && !dup[rank[i][j]]) {
                        CHECK(0, "%s k0=%d: token %d stopped at %d but base expert %d was "
                              "at rank %d", rc->tag, k0, i, n, rank[i][j], j);
                        failed = 1;
                        break;
                    }
            if (p.n_group == 1 && n != (nbase < k ? nbase : k)) {
                CHECK(0, "%s k0=%d: token %d has %d experts, |S_base| %d (no group limit: "
                      "every token gets min(k, |S_base|))", rc->tag, k0, i, n, nbase);
                failed = 1;
            }
            float wsum = 0.0f;
            for (int j = 0; j < n; j++) {
                float want_w = t_weight(s[i], row, n, j, p.renormalize, p.routed_scaling_factor);
                wsum += w[i * k + j];
                mass_kept += s[i][row[j]];
                if (fabsf(w[i * k + j] - want_w) > 1e-6f * fabsf(want_w) + 1e-30f) {
                    CHECK(0, "%s k0=%d: token %d slot %d weight %.9g want %.9g", rc->tag, k0, i,
                          j, w[i * k + j], want_w);
                    failed = 1;
                    break;
                }
            }
            if (p.renormalize && !failed)
                CHECK(fabs(wsum - p.routed_scaling_factor) <= 1e-5 * p.routed_scaling_factor,
                      "%s k0=%d: token %d weights sum to %.9g, want rsf %g", rc->tag, k0, i,
                      wsum, p.routed_scaling_factor);
            for (int j = n; j < k; j++)
                if (row[j] != -1 || w[i * k + j] != 0.0f) {
                    CHECK(0, "%s k0=%d: token %d slot %d past n_sel holds %d / %g", rc->tag, k0,
                          i, j, row[j], w[i * k + j]);
                    failed = 1;
                    break;
                }
            if (n == k0 && k0 < k) g_seen_pruned = 1;
            if (n > k0 && n < k) g_seen_partial = 1;
            if (n == k && k0 < k) g_seen_full = 1;
        }
        for (int i = nv; i < B && !failed; i++) {
            int clean = n_sel[i] == 0;
            for (int j = 0; j < k; j++) clean = clean && ids[i * k + j] == -1 && w[i * k + j] == 0;
            CHECK(clean, "%s k0=%d: padding row %d has n_sel %d", rc->tag, k0, i, n_sel[i]);
        }
        if (failed) return;

        CHECK(st.unique_after == nbase, "%s k0=%d: unique_after %d, |S_base| %d", rc->tag, k0,
              st.unique_after, nbase);
        CHECK(st.unique_before == want_before, "%s k0=%d: unique_before %d want %d", rc->tag,
              k0, st.unique_before, want_before);
        CHECK(st.unique_after >= prev_unique, "%s k0=%d: unique %d grew as k0 fell (%d at k0-1)",
              rc->tag, k0, st.unique_after, prev_unique);
        if (k0 == k)
            CHECK(st.unique_after == st.unique_before, "%s: unique after %d before %d at k0=k",
                  rc->tag, st.unique_after, st.unique_before);
        CHECK_NEAR(st.mean_experts, nv ? (double)total / nv : 0.0, 1e-12);
        double want_mass = (k0 == k || mass_topk == 0.0) ? 1.0 : mass_kept / mass_topk;
        CHECK(fabs(st.retained_mass - want_mass) <= 1e-9, "%s k0=%d: retained %.12g want %.12g",
              rc->tag, k0, st.retained_mass, want_mass);
        if (!rc->use_bias) /* ranked by s itself: keeping fewer can only lose mass */
            CHECK(st.retained_mass <= 1.0 + 1e-12 && st.retained_mass >= prev_mass - 1e-12,
                  "%s k0=%d: retained %.12g (at k0-1: %.12g)", rc->tag, k0, st.retained_mass,
                  prev_mass);
        prev_unique = st.unique_after;
        prev_mass = st.retained_mass;
    }
}

/* Whether some valid token's plain top-k differs between the two group rules. */
static int routes_differ_by_rule(const rcase *rc, const float *x, const float *bias) {
    mj_route_params p = rc->p;
    int32_t ids[2][MAXB * MAXK], n_sel[MAXB];
    float w[MAXB * MAXK];
    for (int r = 0; r < 2; r++) {
        p.group_score = r ? MJ_GROUP_SCORE_MAX : MJ_GROUP_SCORE_TOP2_SUM;
        CHECK_OK(mj_route_ref(&p, x, rc->use_bias ? bias : NULL, rc->B, rc->num_valid, ids[r],
                              w, n_sel, NULL));
    }
    return memcmp(ids[0], ids[1], sizeof(int32_t) * (size_t)rc->num_valid * p.topk) != 0;
}

static void test_random(uint64_t seed) {
    static const struct { int E, k, G, TG; } shapes[] = {
        {64, 6, 1, 1},   /* no group limit                                        */
        {64, 6, 8, 3},   /* 8 groups of 8, keep 3                                 */
        {64, 6, 8, 1},   /* one group of 8 is all a token may use                 */
        {24, 5, 12, 4},  /* groups of 2: the top-2 sum is the whole group         */
        {16, 4, 16, 6},  /* groups of 1: the group score is the expert's score    */
        {8, 8, 1, 1},    /* k == E                                                 */
        {256, 8, 1, 1},  /* GLM-5                                                  */
    };
    static const int batches[][2] = {{1, 1}, {7, 5}, {32, 32}, {64, 61}};
    static float x[MAXB * MAXE], bias[MAXE];
    int cases = 0, max_cases = 0, rules_differ = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int gmax = 0; gmax < (shapes[sh].G > 1 ? 2 : 1); gmax++) /* both group rules */
            for (int scoring = 0; scoring < 2; scoring++)
                for (int use_bias = 0; use_bias < 2; use_bias++)
                    for (int renorm = 0; renorm < 2; renorm++)
                        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                            rcase rc;
                            memset(&rc, 0, sizeof rc);
                            rc.p = (mj_route_params)MJ_ROUTE_PARAMS_INIT;
                            rc.p.n_experts = shapes[sh].E;
                            rc.p.topk = rc.p.k0 = shapes[sh].k;
                            rc.p.n_group = shapes[sh].G;
                            rc.p.topk_group = shapes[sh].TG;
                            rc.p.group_score = gmax ? MJ_GROUP_SCORE_MAX : MJ_GROUP_SCORE_TOP2_SUM;
                            rc.p.scoring = scoring ? MJ_SCORING_SOFTMAX : MJ_SCORING_SIGMOID;
                            rc.p.routed_scaling_factor = renorm ? 2.5f : 1.5f;
                            rc.p.renormalize = renorm;
                            rc.B = batches[bi][0];
                            rc.num_valid = batches[bi][1];
                            rc.use_bias = use_bias;
                            uint64_t case_seed = seed + 7919u * (uint64_t)cases++;
                            snprintf(rc.tag, sizeof rc.tag,
                                     "[E=%d k=%d n_group=%d topk_group=%d group score %s %s bias=%d "
                                     "renorm=%d B=%d valid=%d case seed %llu]",
                                     rc.p.n_experts, rc.p.topk, rc.p.n_group, rc.p.topk_group,
                                     gmax ? "max" : "top2-sum", scoring ? "softmax" : "sigmoid",
                                     use_bias, renorm, rc.B, rc.num_valid,
                                     (unsigned long long)case_seed);
                            uint64_t st = case_seed;
                            random_inputs(&rc, &st, x, bias);
                            check_plain(&rc, x, bias);
                            check_oea_sweep(&rc, x, bias);
                            if (gmax) {
                                max_cases++;
                                rules_differ += routes_differ_by_rule(&rc, x, bias);
                            }
                        }
    /* The max cases would prove nothing if the rules always agreed on random logits. */
    CHECK(rules_differ > max_cases / 4, "the two group rules routed alike in %d of %d cases",
          max_cases - rules_differ, max_cases);
    printf("random: the max and top-2-sum rules route differently in %d of %d cases\n",
           rules_differ, max_cases);
    CHECK(g_seen_pruned && g_seen_partial && g_seen_full,
          "the random sweep never reached: %s%s%s", g_seen_pruned ? "" : "n_sel == k0 < k; ",
          g_seen_partial ? "" : "k0 < n_sel < k; ", g_seen_full ? "" : "n_sel == k > k0");
    printf("random: %d cases\n", cases);
}

/* ---------------------------------------------------------------------------------------
 * Hand-worked batches
 * ------------------------------------------------------------------------------------- */

static mj_route_params small_params(int E, int k, int k0) {
    mj_route_params p = MJ_ROUTE_PARAMS_INIT;
    p.n_experts = E;
    p.topk = k;
    p.k0 = k0;
    p.n_group = 1;
    p.topk_group = 1;
    p.scoring = MJ_SCORING_SIGMOID;
    p.routed_scaling_factor = 1.0f;
    p.renormalize = 1;
    return p;
}

/* Row logits that rank the experts as order[]: the expert at position q gets 3 - 0.5 q,
 * so positions 0..7 hold 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5. */
static void logits_for(const int order[8], float *x) {
    for (int q = 0; q < 8; q++) x[order[q]] = 3.0f - 0.5f * (float)q;
}

/* Check one token of a hand example: its ids and weights from the logits of its experts. */
static void check_token(const char *name, int t, const int32_t *ids, const float *w, int n_sel,
                        int k, int want_n, const int want_ids[], const float want_logit[]) {
    CHECK(n_sel == want_n, "%s token %d: n_sel %d want %d", name, t, n_sel, want_n);
    float sum = 0.0f;
    for (int j = 0; j < want_n; j++) sum += sig(want_logit[j]);
    for (int j = 0; j < k; j++) {
        int want_id = j < want_n ? want_ids[j] : -1;
        float want_w = j < want_n ? sig(want_logit[j]) / (sum + 1e-20f) : 0.0f;
        CHECK(ids[j] == want_id, "%s token %d slot %d: id %d want %d", name, t, j, ids[j],
              want_id);
        CHECK(fabsf(w[j] - want_w) <= 1e-7f, "%s token %d slot %d: weight %.9g want %.9g",
              name, t, j, w[j], want_w);
    }
}

/* 3 tokens x 8 experts, k = 4, k0 = 2, sigmoid, no bias, renormalized, rsf 1.
 *
 * Example A: a batch that agrees, so OEA shrinks it to 3 experts.
 *   token 0 ranking  0 1 3 2 4 5 6 7   phase 1 {0,1}
 *   token 1 ranking  1 0 4 5 6 7 2 3   phase 1 {1,0}
 *   token 2 ranking  2 0 5 1 3 4 6 7   phase 1 {2,0}
 *   S_base = {0,1,2}.  Plain top-4 sets {0,1,3,2} {1,0,4,5} {2,0,5,1}: 6 distinct experts.
 *   phase 2, walking each ranking from position 2:
 *   token 0: 3 no, 2 yes -> [0 1 2]; 4 5 6 7 no.           3 experts (logits 3, 2.5, 1.5)
 *   token 1: 4 5 6 7 no, 2 yes -> [1 0 2]; 3 no.           3 experts (logits 3, 2.5, 0)
 *   token 2: 5 no, 1 yes -> [2 0 1]; 3 4 6 7 no.            3 experts (logits 3, 2.5, 1.5)
 *   Without a group limit every token ends with min(k, |S_base|) = 3 experts. Expert 2 of
 *   token 1 comes from position 6: phase 2 may reach far down a ranking.
 *   retained mass = (2 (s3 + s2.5 + s1.5) + (s3 + s2.5 + s0)) / (3 (s3 + s2.5 + s2 + s1.5)),
 *   with sX = sigmoid(X).
 *
 * Example B: a batch that disagrees, so phase 2 stops at k with base experts left over.
 *   token 0 ranking  0 1 2 3 4 5 6 7   phase 1 {0,1}
 *   token 1 ranking  2 3 7 0 6 1 4 5   phase 1 {2,3}
 *   token 2 ranking  4 0 5 6 1 2 3 7   phase 1 {4,0}
 *   S_base = {0,1,2,3,4}. Plain top-4 sets {0,1,2,3} {2,3,7,0} {4,0,5,6}: all 8 experts.
 *   token 0: 2 yes, 3 yes -> [0 1 2 3], stop (4 is in S_base but not needed): its top-4.
 *   token 1: 7 no, 0 yes, 6 no, 1 yes -> [2 3 0 1], stop (4 left over).
 *   token 2: 5 no, 6 no, 1 yes, 2 yes -> [4 0 1 2], stop (3 left over).
 *   logits of the chosen: token 0 (3, 2.5, 2, 1.5); token 1 (3, 2.5, 1.5, 0.5);
 *   token 2 (3, 2.5, 1, 0.5). unique 8 -> 5.
 */
static void test_hand_examples(void) {
    mj_route_params p = small_params(8, 4, 2);
    float x[3 * 8];
    int32_t ids[3 * 4], n_sel[3];
    float w[3 * 4];
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    double s3 = sig(3.0f), s25 = sig(2.5f), s2 = sig(2.0f), s15 = sig(1.5f), s0 = sig(0.0f);

    {
        const int r0[8] = {0, 1, 3, 2, 4, 5, 6, 7}, r1[8] = {1, 0, 4, 5, 6, 7, 2, 3},
                  r2[8] = {2, 0, 5, 1, 3, 4, 6, 7};
        logits_for(r0, x);
        logits_for(r1, x + 8);
        logits_for(r2, x + 16);
        CHECK_OK(mj_route_ref(&p, x, NULL, 3, 3, ids, w, n_sel, &st));
        const int i0[] = {0, 1, 2}, i1[] = {1, 0, 2}, i2[] = {2, 0, 1};
        const float l0[] = {3.0f, 2.5f, 1.5f}, l1[] = {3.0f, 2.5f, 0.0f},
                    l2[] = {3.0f, 2.5f, 1.5f};
        check_token("example A", 0, ids, w, n_sel[0], 4, 3, i0, l0);
        check_token("example A", 1, ids + 4, w + 4, n_sel[1], 4, 3, i1, l1);
        check_token("example A", 2, ids + 8, w + 8, n_sel[2], 4, 3, i2, l2);
        CHECK(st.unique_before == 6 && st.unique_after == 3, "example A: unique %d -> %d",
              st.unique_before, st.unique_after);
        CHECK_NEAR(st.mean_experts, 3.0, 0.0);
        double want = (2 * (s3 + s25 + s15) + (s3 + s25 + s0)) / (3 * (s3 + s25 + s2 + s15));
        CHECK_NEAR(st.retained_mass, want, 1e-12);
        CHECK(st.nan_logits == 0, "example A: nan_logits %lld", (long long)st.nan_logits);
    }
    {
        const int r0[8] = {0, 1, 2, 3, 4, 5, 6, 7}, r1[8] = {2, 3, 7, 0, 6, 1, 4, 5},
                  r2[8] = {4, 0, 5, 6, 1, 2, 3, 7};
        logits_for(r0, x);
        logits_for(r1, x + 8);
        logits_for(r2, x + 16);
        CHECK_OK(mj_route_ref(&p, x, NULL, 3, 3, ids, w, n_sel, &st));
        const int i0[] = {0, 1, 2, 3}, i1[] = {2, 3, 0, 1}, i2[] = {4, 0, 1, 2};
        const float l0[] = {3.0f, 2.5f, 2.0f, 1.5f}, l1[] = {3.0f, 2.5f, 1.5f, 0.5f},
                    l2[] = {3.0f, 2.5f, 1.0f, 0.5f};
        check_token("example B", 0, ids, w, n_sel[0], 4, 4, i0, l0);
        check_token("example B", 1, ids + 4, w + 4, n_sel[1], 4, 4, i1, l1);
        check_token("example B", 2, ids + 8, w + 8, n_sel[2], 4, 4, i2, l2);
        CHECK(st.unique_before == 8 && st.unique_after == 5, "example B: unique %d -> %d",
              st.unique_before, st.unique_after);
        CHECK_NEAR(st.mean_experts, 4.0, 0.0);
        double s1 = sig(1.0f), s05 = sig(0.5f), top = s3 + s25 + s2 + s15;
        double want = (top + (s3 + s25 + s15 + s05) + (s3 + s25 + s1 + s05)) / (3 * top);
        CHECK_NEAR(st.retained_mass, want, 1e-12);
    }
}

/* Identical tokens: S_base is their common top-k0 and nothing after it is in S_base, so
 * every token is pruned to k0, exactly as a batch of one. A batch whose tokens agree on the
 * top-k *set* but order it differently keeps all k at every k0. */
static void test_identical_and_agreeing(uint64_t seed) {
    enum { E = 32, K = 4, B = 6 };
    mj_route_params p = small_params(E, K, K);
    p.routed_scaling_factor = 2.5f;
    float x[B * E];
    int32_t ids[B * K], ids1[K], n_sel[B], n1;
    float w[B * K], w1[K];
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    for (int e = 0; e < E; e++) x[e] = (float)mj_rng_normal(&seed);
    for (int i = 1; i < B; i++) memcpy(x + i * E, x, sizeof(float) * E);
    for (int k0 = 1; k0 <= K; k0++) {
        p.k0 = k0;
        CHECK_OK(mj_route_ref(&p, x, NULL, B, B, ids, w, n_sel, &st));
        CHECK_OK(mj_route_ref(&p, x, NULL, 1, 1, ids1, w1, &n1, NULL));
        CHECK(n1 == k0, "identical k0=%d: a batch of one kept %d", k0, n1);
        for (int i = 0; i < B; i++) {
            CHECK(n_sel[i] == k0, "identical k0=%d: token %d kept %d", k0, i, n_sel[i]);
            CHECK(memcmp(ids + i * K, ids1, sizeof ids1) == 0 &&
                      memcmp(w + i * K, w1, sizeof w1) == 0,
                  "identical k0=%d: token %d differs from the batch of one", k0, i);
        }
        CHECK(st.unique_after == k0 && st.unique_before == K, "identical k0=%d: unique %d -> %d",
              k0, st.unique_before, st.unique_after);
    }

    /* Agreeing: token t ranks experts 10..13 first, rotated by t; the rest far below. */
    for (int i = 0; i < 4; i++) {
        for (int e = 0; e < E; e++) x[i * E + e] = -2.0f - 0.01f * (float)e;
        for (int q = 0; q < 4; q++) x[i * E + 10 + (i + q) % 4] = 3.0f - 0.5f * (float)q;
    }
    int32_t plain[4 * K];
    float plain_w[4 * K];
    p.k0 = K;
    CHECK_OK(mj_route_ref(&p, x, NULL, 4, 4, plain, plain_w, n_sel, NULL));
    for (int k0 = 1; k0 <= K; k0++) {
        p.k0 = k0;
        CHECK_OK(mj_route_ref(&p, x, NULL, 4, 4, ids, w, n_sel, &st));
        int all = 1;
        for (int i = 0; i < 4; i++) all = all && n_sel[i] == K;
        CHECK(all && memcmp(ids, plain, sizeof plain) == 0 &&
                  memcmp(w, plain_w, sizeof plain_w) == 0,
              "agreeing k0=%d: tokens did not keep their plain top-%d", k0, K);
        CHECK(st.unique_before == 4 && st.unique_after == 4 && st.retained_mass == 1.0,
              "agreeing k0=%d: unique %d -> %d, mass %.17g", k0, st.unique_before,
              st.unique_after, st.retained_mass);
    }
}

/* Padding rows: nothing for them, and they must not widen S_base. Valid token i has expert i
 * first and expert 31 second; the padding rows put expert 31 first. At k0 = 1 S_base is
 * {0..4} without them; with them (wrongly counted) every valid token would take 31. */
static void test_padding(uint64_t seed) {
    enum { E = 32, K = 4, B = 8, NV = 5 };
    mj_route_params p = small_params(E, K, 1);
    float x[B * E];
    for (int i = 0; i < B; i++)
        for (int e = 0; e < E; e++) {
            double v = mj_rng_normal(&seed);
            x[i * E + e] = (float)(v > 3 ? 3 : v < -3 ? -3 : v);
        }
    for (int i = 0; i < NV; i++) {
        x[i * E + i] = 5.0f;
        x[i * E + 31] = 4.0f;
    }
    for (int i = NV; i < B; i++) {
        x[i * E + 31] = 10.0f;
        x[i * E + 7] = NAN; /* not counted: padding */
    }
    int32_t ids[B * K], n_sel[B], ids_v[NV * K], n_v[NV], ids_all[B * K], n_all[B];
    float w[B * K], w_v[NV * K], w_all[B * K];
    mj_route_stats st = MJ_ROUTE_STATS_INIT, st_v = MJ_ROUTE_STATS_INIT;
    for (int k0 = 1; k0 <= K; k0++) {
        p.k0 = k0;
        CHECK_OK(mj_route_ref(&p, x, NULL, B, NV, ids, w, n_sel, &st));
        CHECK_OK(mj_route_ref(&p, x, NULL, NV, NV, ids_v, w_v, n_v, &st_v));
        CHECK(memcmp(ids, ids_v, sizeof ids_v) == 0 && memcmp(w, w_v, sizeof w_v) == 0 &&
                  memcmp(n_sel, n_v, sizeof n_v) == 0,
              "padding k0=%d: the valid rows differ from routing them alone", k0);
        CHECK(st.unique_before == st_v.unique_before && st.unique_after == st_v.unique_after &&
                  st.mean_experts == st_v.mean_experts &&
                  st.retained_mass == st_v.retained_mass && st.nan_logits == 0,
              "padding k0=%d: stats differ (unique %d/%d, nan %lld)", k0, st.unique_after,
              st_v.unique_after, (long long)st.nan_logits);
        for (int i = NV; i < B; i++) {
            int clean = n_sel[i] == 0;
            for (int j = 0; j < K; j++) clean = clean && ids[i * K + j] == -1 && w[i * K + j] == 0;
            CHECK(clean, "padding k0=%d: row %d got n_sel %d id %d", k0, i, n_sel[i],
                  ids[i * K]);
        }
    }
    /* The counterfactual: had the padding rows been valid, the result would change. */
    p.k0 = 1;
    CHECK_OK(mj_route_ref(&p, x, NULL, NV, NV, ids_v, w_v, n_v, NULL));
    CHECK_OK(mj_route_ref(&p, x, NULL, B, B, ids_all, w_all, n_all, NULL));
    CHECK(memcmp(ids_all, ids_v, sizeof ids_v) != 0 && ids_all[1] == 31,
          "padding: counting the padding rows should have given token 0 expert 31 (got %d)",
          ids_all[1]);
    CHECK(ids_v[1] != 31 && ids_v[0] == 0, "padding: token 0 got %d %d without padding",
          ids_v[0], ids_v[1]);
    /* num_valid = 0: everything is padding. */
    CHECK_OK(mj_route_ref(&p, x, NULL, B, 0, ids, w, n_sel, &st));
    int clean = 1;
    for (int i = 0; i < B * K; i++) clean = clean && ids[i] == -1 && w[i] == 0.0f;
    for (int i = 0; i < B; i++) clean = clean && n_sel[i] == 0;
    CHECK(clean && st.unique_before == 0 && st.unique_after == 0 && st.mean_experts == 0.0 &&
              st.retained_mass == 1.0 && st.nan_logits == 0,
          "num_valid = 0: rows or stats not empty");
    CHECK_OK(mj_route_ref(&p, x, NULL, 0, 0, ids, w, n_sel, NULL)); /* B = 0 is fine too */
}

/* Ties go to the lower id; the bias chooses but does not weigh; groups use the top-2 sum. */
static void test_ties_and_bias(void) {
    int32_t ids[8], n_sel[2];
    float w[8];
    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};

    mj_route_params p = small_params(8, 3, 3);
    CHECK_OK(mj_route_ref(&p, x, NULL, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2, "equal logits: %d %d %d, want 0 1 2",
          ids[0], ids[1], ids[2]);
    for (int j = 0; j < 3; j++) CHECK_NEAR(w[j], 1.0f / 3.0f, 1e-7);

    float bias[8] = {0, 0, 0.05f, 0, 0, 0.1f, 0.1f, 0};
    CHECK_OK(mj_route_ref(&p, x, bias, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 5 && ids[1] == 6 && ids[2] == 2, "bias ties: %d %d %d, want 5 6 2", ids[0],
          ids[1], ids[2]);
    for (int j = 0; j < 3; j++) CHECK_NEAR(w[j], 1.0f / 3.0f, 1e-7); /* the bias weighs nothing */

    /* The bias flips the order: s = sigmoid(1) > sigmoid(0.5), but c1 = s1 + 0.5 wins. */
    float x2[4] = {1.0f, 0.5f, 0.0f, -1.0f}, b2[4] = {0.0f, 0.5f, 0.0f, 0.0f};
    mj_route_params q = small_params(4, 2, 2);
    q.renormalize = 0;
    q.routed_scaling_factor = 2.5f;
    CHECK_OK(mj_route_ref(&q, x2, b2, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 1 && ids[1] == 0, "bias flip: %d %d, want 1 0", ids[0], ids[1]);
    CHECK(w[0] == sig(0.5f) * 2.5f && w[1] == sig(1.0f) * 2.5f,
          "bias flip: weights %.9g %.9g want %.9g %.9g (unbiased s x rsf)", w[0], w[1],
          sig(0.5f) * 2.5f, sig(1.0f) * 2.5f);
    q.renormalize = 1;
    CHECK_OK(mj_route_ref(&q, x2, b2, 1, 1, ids, w, n_sel, NULL));
    float den = sig(0.5f) + sig(1.0f) + 1e-20f;
    CHECK_NEAR(w[0], sig(0.5f) / den * 2.5f, 1e-6);
    CHECK_NEAR(w[1], sig(1.0f) / den * 2.5f, 1e-6);
    CHECK(w[0] < w[1], "bias flip: slot 0 (chosen by bias) should weigh less: %g %g", w[0],
          w[1]);
    q.k0 = 1; /* B = 1, k0 = 1: pure pruning to the bias-chosen expert, weight rsf */
    CHECK_OK(mj_route_ref(&q, x2, b2, 1, 1, ids, w, n_sel, NULL));
    CHECK(n_sel[0] == 1 && ids[0] == 1 && ids[1] == -1 && w[1] == 0.0f,
          "k0=1 at B=1: n_sel %d ids %d %d", n_sel[0], ids[0], ids[1]);
    CHECK_NEAR(w[0], 2.5, 1e-6);

    /* Groups of 2 scored by the sum of their top 2, not by their max. Logits -30 make s tiny,
     * so c is the bias: group 0 {0.9, 0.1} sums 1.0, group 1 {0.6, 0.6} sums 1.2 and wins;
     * expert 0 has the highest c of all and is still never chosen. */
    float xg[8], bg[8] = {0.9f, 0.1f, 0.6f, 0.6f, 0.5f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < 8; e++) xg[e] = -30.0f;
    mj_route_params g = small_params(8, 2, 2);
    g.n_group = 4;
    g.topk_group = 1;
    CHECK_OK(mj_route_ref(&g, xg, bg, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 2 && ids[1] == 3, "groups: %d %d, want 2 3 (group 1 by top-2 sum)", ids[0],
          ids[1]);
    /* Equal group scores: the lower group wins. */
    float bz[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_OK(mj_route_ref(&g, xg, bz, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 0 && ids[1] == 1, "group ties: %d %d, want 0 1", ids[0], ids[1]);
    /* A NaN counts as -inf in a group's score (not as 0): group 0 has c = {NaN, -0.5}, so
     * its score is -inf; group 1 has c = {-0.4, -0.4}, score -0.8, and wins. Were the NaN a 0,
     * group 0 would score -0.5 and win. */
    float xn[4] = {NAN, -30.0f, -30.0f, -30.0f}, bn[4] = {0.0f, -0.5f, -0.4f, -0.4f};
    mj_route_params gn = small_params(4, 1, 1);
    gn.n_group = 2;
    gn.topk_group = 1;
    CHECK_OK(mj_route_ref(&gn, xn, bn, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 2, "NaN in a group: chose %d, want 2 (group 0 scores -inf)", ids[0]);
    /* With OEA, a base expert of an excluded group is never taken. Token 0 keeps group 1
     * (experts 2, 3), token 1 (all logits equal) keeps group 0 (experts 0, 1). At k0 = 1
     * S_base = {2, 0}. Token 0 ranks only 2 3: 3 is not in S_base, and 0 is, but lies in a
     * group token 0 dropped, so token 0 ends with [2]. Likewise token 1 ends with [0]. */
    float xo[16], bo[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int e = 0; e < 8; e++) {
        xo[e] = e == 2 || e == 3 ? 1.0f : -1.0f;
        xo[8 + e] = 0.0f;
    }
    g.k0 = 1;
    CHECK_OK(mj_route_ref(&g, xo, bo, 2, 2, ids, w, n_sel, NULL));
    CHECK(n_sel[0] == 1 && ids[0] == 2 && ids[1] == -1 && n_sel[1] == 1 && ids[2] == 0,
          "groups + OEA: token 0 n %d ids %d %d, token 1 n %d ids %d", n_sel[0], ids[0], ids[1],
          n_sel[1], ids[2]);
}

/* NaN logits rank last (after -inf), weigh nothing and are counted in valid rows only. */
static void test_nan_and_inf(void) {
    const float nan = NAN, inf = INFINITY;
    int32_t ids[16], n_sel[4];
    float w[16];
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    mj_route_params p = small_params(8, 4, 4);
    p.routed_scaling_factor = 2.0f;

    float x[3 * 8] = {
        nan, 0.1f, 0.2f, nan, 0.4f, 0.5f, 0.6f, 0.7f, /* top-4: 7 6 5 4              */
        nan, nan, 1.0f, nan, nan, 2.0f, nan, nan,     /* 2 numbers: 5 2, then NaNs 0 1 */
        nan, nan, nan, nan, nan, nan, nan, nan,       /* padding: not counted         */
    };
    float bias[8] = {100.0f, 0, 0, 0, 0, 0, 0, 0};   /* a NaN logit stays last        */
    for (int use_bias = 0; use_bias < 2; use_bias++) {
        CHECK_OK(mj_route_ref(&p, x, use_bias ? bias : NULL, 3, 2, ids, w, n_sel, &st));
        CHECK(ids[0] == 7 && ids[1] == 6 && ids[2] == 5 && ids[3] == 4,
              "NaN row 0 (bias %d): %d %d %d %d", use_bias, ids[0], ids[1], ids[2], ids[3]);
        CHECK(ids[4] == 5 && ids[5] == 2 && ids[6] == 0 && ids[7] == 1,
              "NaN row 1 (bias %d): %d %d %d %d, want 5 2 0 1", use_bias, ids[4], ids[5],
              ids[6], ids[7]);
        float den = sig(2.0f) + sig(1.0f) + 1e-20f;
        CHECK_NEAR(w[4], sig(2.0f) / den * 2.0f, 1e-6);
        CHECK_NEAR(w[5], sig(1.0f) / den * 2.0f, 1e-6);
        CHECK(w[6] == 0.0f && w[7] == 0.0f, "NaN experts weigh %g %g", w[6], w[7]);
        CHECK(st.nan_logits == 8, "nan_logits %lld, want 8 (padding not counted)",
              (long long)st.nan_logits);
        CHECK(n_sel[2] == 0 && ids[8] == -1, "NaN padding row: n_sel %d", n_sel[2]);
    }

    /* Softmax over the numbers only; an all-NaN row weighs nothing. */
    p.scoring = MJ_SCORING_SOFTMAX;
    CHECK_OK(mj_route_ref(&p, x, NULL, 3, 3, ids, w, n_sel, &st));
    float e1 = expf(1.0f - 2.0f), sm5 = 1.0f / (1.0f + e1), sm2 = e1 / (1.0f + e1);
    CHECK(ids[4] == 5 && ids[5] == 2 && ids[6] == 0 && ids[7] == 1,
          "softmax NaN row 1: %d %d %d %d", ids[4], ids[5], ids[6], ids[7]);
    CHECK_NEAR(w[4], sm5 / (sm5 + sm2 + 1e-20f) * 2.0f, 1e-6);
    CHECK(w[6] == 0.0f && w[7] == 0.0f, "softmax NaN weights %g %g", w[6], w[7]);
    CHECK(ids[8] == 0 && ids[9] == 1 && ids[10] == 2 && ids[11] == 3 && n_sel[2] == 4,
          "all-NaN valid row: %d %d %d %d (n %d), want 0 1 2 3", ids[8], ids[9], ids[10],
          ids[11], n_sel[2]);
    for (int j = 8; j < 12; j++) CHECK(w[j] == 0.0f, "all-NaN row weight %d = %g", j, w[j]);
    CHECK(st.nan_logits == 16, "nan_logits %lld, want 16", (long long)st.nan_logits);

    /* Infinities. Sigmoid: -inf is a number (s = 0), so it ranks after -1 but before NaN. */
    mj_route_params r = small_params(4, 4, 4);
    float xi[4] = {nan, -inf, -1.0f, nan};
    CHECK_OK(mj_route_ref(&r, xi, NULL, 1, 1, ids, w, n_sel, &st));
    CHECK(ids[0] == 2 && ids[1] == 1 && ids[2] == 0 && ids[3] == 3,
          "-inf vs NaN: %d %d %d %d, want 2 1 0 3", ids[0], ids[1], ids[2], ids[3]);
    CHECK_NEAR(w[0], 1.0, 1e-6);
    CHECK(st.nan_logits == 2, "nan_logits %lld", (long long)st.nan_logits);
    /* Softmax with +inf: the +inf experts share the mass. */
    r.scoring = MJ_SCORING_SOFTMAX;
    r.topk = r.k0 = 2;
    r.renormalize = 0;
    float xp[4] = {0.0f, inf, 5.0f, inf};
    CHECK_OK(mj_route_ref(&r, xp, NULL, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 1 && ids[1] == 3 && w[0] == 0.5f && w[1] == 0.5f,
          "softmax +inf: ids %d %d weights %g %g", ids[0], ids[1], w[0], w[1]);
    /* Softmax of a row of -inf and NaN: the -inf experts share equally (the limit). */
    float xm[4] = {-inf, nan, -inf, -inf};
    CHECK_OK(mj_route_ref(&r, xm, NULL, 1, 1, ids, w, n_sel, NULL));
    CHECK(ids[0] == 0 && ids[1] == 2 && fabsf(w[0] - 1.0f / 3.0f) < 1e-7f,
          "softmax -inf row: ids %d %d weight %g", ids[0], ids[1], w[0]);
}

/* One expert every token wants (logit 50 in every row): it is in every token's set at every
 * k0, and first wherever nothing can outrank it (no bias; or softmax, where s_5 ~ 1 and
 * every other s ~ e^-40, so a bias of 0.01 cannot reach it). */
static void test_hot_expert(uint64_t seed) {
    enum { E = 64, K = 6, B = 32 };
    static float x[B * E];
    float bias[E];
    mj_route_params p = small_params(E, K, K);
    p.routed_scaling_factor = 2.5f;
    for (int i = 0; i < B * E; i++) x[i] = (float)(2.0 * mj_rng_normal(&seed));
    for (int i = 0; i < B; i++) x[i * E + 5] = 50.0f;
    for (int e = 0; e < E; e++) bias[e] = (float)(0.01 * mj_rng_normal(&seed));
    int32_t ids[B * K], n_sel[B];
    float w[B * K];
    for (int scoring = 0; scoring < 2; scoring++)
        for (int use_bias = 0; use_bias < 2; use_bias++)
            for (int k0 = 1; k0 <= K; k0++) {
                p.scoring = scoring ? MJ_SCORING_SOFTMAX : MJ_SCORING_SIGMOID;
                p.k0 = k0;
                CHECK_OK(mj_route_ref(&p, x, use_bias ? bias : NULL, B, B, ids, w, n_sel, NULL));
                int member = 0, first = 0;
                for (int i = 0; i < B; i++) {
                    first += ids[i * K] == 5;
                    for (int j = 0; j < n_sel[i]; j++) member += ids[i * K + j] == 5;
                }
                CHECK(member == B, "hot expert (%s, bias %d, k0=%d): in %d of %d tokens",
                      scoring ? "softmax" : "sigmoid", use_bias, k0, member, B);
                if (!use_bias || scoring)
                    CHECK(first == B, "hot expert (%s, bias %d, k0=%d): first in %d of %d",
                          scoring ? "softmax" : "sigmoid", use_bias, k0, first, B);
            }
}

/* ---------------------------------------------------------------------------------------
 * The group-score rules, on logits where they disagree
 * ------------------------------------------------------------------------------------- */

/* Route B tokens and compare every slot's id (-1 past n_sel) with want[B][4]; check the
 * test's own router agrees on each token's top-k. */
static void expect_ids(const char *what, const mj_route_params *p, const float *x,
                       const float *bias, int B, const int32_t want[][4]) {
    int32_t ids[4 * 4], n_sel[4];
    float w[4 * 4];
    CHECK(p->topk <= 4 && B <= 4, "%s: test shape", what);
    CHECK_OK(mj_route_ref(p, x, bias, B, B, ids, w, n_sel, NULL));
    for (int i = 0; i < B; i++) {
        int same = 1;
        for (int j = 0; j < p->topk; j++) same = same && ids[i * p->topk + j] == want[i][j];
        CHECK(same, "%s: token %d got [%d %d %d %d] (n_sel %d), want [%d %d %d %d]", what, i,
              ids[i * p->topk], p->topk > 1 ? ids[i * p->topk + 1] : -9,
              p->topk > 2 ? ids[i * p->topk + 2] : -9, p->topk > 3 ? ids[i * p->topk + 3] : -9,
              n_sel[i], want[i][0], want[i][1], want[i][2], want[i][3]);
        if (p->k0 == p->topk) { /* plain top-k: the oracle's ranking says the same */
            int rank[MAXE];
            float sc[MAXE];
            mj_route_params eff = *p; /* an old caller's struct ends before group_score */
            if (eff.struct_size <= MJ_ROUTE_PARAMS_V1_SIZE) eff.group_score = MJ_GROUP_SCORE_TOP2_SUM;
            t_ranking(&eff, x + i * p->n_experts, bias, rank, sc);
            for (int j = 0; j < p->topk; j++)
                CHECK(rank[j] == want[i][j], "%s: the test's router puts %d at rank %d, want %d",
                      what, rank[j], j, want[i][j]);
        }
    }
}

/* 8 experts in 4 groups of 2. Row R = (4, -10 | 3.5, 3.5 | -10, -10 | -10, -10):
 *   sigmoid: group 0 has s 0.982 and 4.5e-5, group 1 has 0.9707 twice. Top-2 sums 0.982 vs
 *            1.941: group 1; maxima 0.982 vs 0.9707: group 0.
 *   softmax: e^4 = 54.6 vs 2 e^3.5 = 66.2 (over the same sum): the same two answers.
 * So keeping one group, top-2: the top-2 sum routes to [2 3], the max to [0 1]. The max is
 * over selection scores: a bias of 0.1 on expert 2 lifts group 1's max to 1.0707, above
 * group 0's 0.982, and the max rule follows it to [2 3].
 *
 * OEA (k = 4, k0 = 2, keep 2 groups, sigmoid). Token 0 = (4, -10 | 3.5, 3.5 | 1, 1 | -10,
 * -10), token 1 = (-10, -10 | -10, -10 | 1, 1 | 3, -10); s(1) = 0.731, s(3) = 0.953.
 *   top-2 sum: token 0 keeps groups 1 (1.941) and 2 (1.462), ranking 2 3 4 5; token 1 keeps
 *     groups 2 (1.462) and 3 (0.953), ranking 6 4 5 7. S_base = {2, 3} u {6, 4}: token 0
 *     takes 4 (in S_base), not 5 -> [2 3 4]; token 1 neither 5 nor 7 -> [6 4].
 *   max: token 0 keeps groups 0 (0.982) and 1 (0.971), ranking 0 2 3 1; token 1 the same
 *     groups as before. S_base = {0, 2} u {6, 4}: token 0 takes neither 3 nor 1 -> [0 2];
 *     token 1 -> [6 4].
 */
static void test_group_rules(void) {
    static const float row[8] = {4, -10, 3.5f, 3.5f, -10, -10, -10, -10};
    static const int32_t top2_pick[1][4] = {{2, 3, -1, -1}}, max_pick[1][4] = {{0, 1, -1, -1}};
    for (int softmax = 0; softmax < 2; softmax++) {
        mj_route_params p = small_params(8, 2, 2);
        p.n_group = 4;
        p.topk_group = 1;
        p.scoring = softmax ? MJ_SCORING_SOFTMAX : MJ_SCORING_SIGMOID;
        char what[96];
        snprintf(what, sizeof what, "%s, top-2 sum", softmax ? "softmax" : "sigmoid");
        p.group_score = MJ_GROUP_SCORE_TOP2_SUM;
        expect_ids(what, &p, row, NULL, 1, top2_pick);
        snprintf(what, sizeof what, "%s, max", softmax ? "softmax" : "sigmoid");
        p.group_score = MJ_GROUP_SCORE_MAX;
        expect_ids(what, &p, row, NULL, 1, max_pick);
        /* The weights are the chosen experts' own s, renormalized: group 0 under the max
         * rule holds nearly all the mass on expert 0. */
        int32_t ids[2], n;
        float w[2];
        CHECK_OK(mj_route_ref(&p, row, NULL, 1, 1, ids, w, &n, NULL));
        float s[8];
        t_scores(p.scoring, row, 8, s);
        CHECK_NEAR(w[0], s[0] / (s[0] + s[1] + 1e-20f), 1e-6);
        CHECK_NEAR(w[1], s[1] / (s[0] + s[1] + 1e-20f), 1e-6);
        /* Groups of one expert: both rules score the expert itself, so they agree. */
        mj_route_params p1 = p;
        p1.n_group = 8, p1.topk_group = 2;
        static const int32_t single[1][4] = {{0, 2, -1, -1}};
        p1.group_score = MJ_GROUP_SCORE_MAX;
        expect_ids("groups of one, max", &p1, row, NULL, 1, single);
        p1.group_score = MJ_GROUP_SCORE_TOP2_SUM;
        expect_ids("groups of one, top-2 sum", &p1, row, NULL, 1, single);
    }
    { /* the max rule scores selection scores: a bias moves it */
        mj_route_params p = small_params(8, 2, 2);
        p.n_group = 4, p.topk_group = 1, p.group_score = MJ_GROUP_SCORE_MAX;
        float bias[8] = {0};
        bias[2] = 0.1f;
        expect_ids("sigmoid, max, bias on expert 2", &p, row, bias, 1, top2_pick);
    }
    { /* OEA with groups */
        static const float x[16] = {4, -10, 3.5f, 3.5f, 1, 1, -10, -10,
                                    -10, -10, -10, -10, 1, 1, 3, -10};
        mj_route_params p = small_params(8, 4, 2);
        p.n_group = 4, p.topk_group = 2;
        static const int32_t top2_oea[2][4] = {{2, 3, 4, -1}, {6, 4, -1, -1}},
                             max_oea[2][4] = {{0, 2, -1, -1}, {6, 4, -1, -1}},
                             top2_plain[2][4] = {{2, 3, 4, 5}, {6, 4, 5, 7}},
                             max_plain[2][4] = {{0, 2, 3, 1}, {6, 4, 5, 7}};
        p.group_score = MJ_GROUP_SCORE_TOP2_SUM;
        expect_ids("OEA k0=2, top-2 sum", &p, x, NULL, 2, top2_oea);
        p.group_score = MJ_GROUP_SCORE_MAX;
        expect_ids("OEA k0=2, max", &p, x, NULL, 2, max_oea);
        p.k0 = 4;
        p.group_score = MJ_GROUP_SCORE_TOP2_SUM;
        expect_ids("k0=k, top-2 sum", &p, x, NULL, 2, top2_plain);
        p.group_score = MJ_GROUP_SCORE_MAX;
        expect_ids("k0=k, max", &p, x, NULL, 2, max_plain);
    }
}

/* A caller built before group_score existed passes the old struct size: accepted, the bytes
 * past its struct never read, the top-2 sum used. Larger or smaller sizes are refused. */
static void test_old_params_size(void) {
    static const float row[8] = {4, -10, 3.5f, 3.5f, -10, -10, -10, -10};
    mj_route_params p = small_params(8, 2, 2);
    p.n_group = 4, p.topk_group = 1;
    CHECK(MJ_ROUTE_PARAMS_V1_SIZE == offsetof(mj_route_params, group_score) &&
              MJ_ROUTE_PARAMS_V1_SIZE < sizeof(mj_route_params),
          "MJ_ROUTE_PARAMS_V1_SIZE %zu", (size_t)MJ_ROUTE_PARAMS_V1_SIZE);
    static const int32_t top2_pick[1][4] = {{2, 3, -1, -1}};
    const mj_group_score junk[] = {MJ_GROUP_SCORE_MAX, (mj_group_score)77};
    for (int i = 0; i < 2; i++) {
        mj_route_params old = p;
        old.struct_size = (uint32_t)MJ_ROUTE_PARAMS_V1_SIZE;
        old.group_score = junk[i]; /* past the old struct: what an old caller never wrote */
        expect_ids("old params size", &old, row, NULL, 1, top2_pick);
    }
    mj_route_params bad = p;
    bad.struct_size = (uint32_t)MJ_ROUTE_PARAMS_V1_SIZE - 4;
    int32_t ids[2], n;
    float w[2];
    CHECK_STATUS(mj_route_ref(&bad, row, NULL, 1, 1, ids, w, &n, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "MJ_ROUTE_PARAMS_INIT") != NULL, "%s", mj_last_error());
    bad.struct_size = sizeof bad + 4;
    CHECK_STATUS(mj_route_ref(&bad, row, NULL, 1, 1, ids, w, &n, NULL), MJ_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------
 * Invalid arguments: MJ_ERR_INVALID_ARG and not one output byte written
 * ------------------------------------------------------------------------------------- */

enum { SB = 4, SLOTS = 64 };
static int32_t g_ids[SLOTS], g_nsel[SLOTS];
static float g_w[SLOTS];
static mj_route_stats g_st;

static void fill_sentinels(void) {
    memset(g_ids, 0x5A, sizeof g_ids);
    memset(g_nsel, 0x5A, sizeof g_nsel);
    memset(g_w, 0x5A, sizeof g_w);
    memset(&g_st, 0x5A, sizeof g_st);
    g_st.struct_size = sizeof g_st; /* a valid struct, every other byte a sentinel */
}

static int sentinels_intact(void) {
    const unsigned char *bufs[4] = {(const void *)g_ids, (const void *)g_nsel,
                                    (const void *)g_w, (const unsigned char *)&g_st + sizeof g_st.struct_size};
    size_t sizes[4] = {sizeof g_ids, sizeof g_nsel, sizeof g_w, sizeof g_st - sizeof g_st.struct_size};
    for (int b = 0; b < 4; b++)
        for (size_t i = 0; i < sizes[b]; i++)
            if (bufs[b][i] != 0x5A) return 0;
    return 1;
}

static void expect_rejected(const char *what, const mj_route_params *p, const float *logits,
                            int32_t B, int32_t nv, int null_ids, int null_w, int null_nsel) {
    fill_sentinels();
    mj_status s = mj_route_ref(p, logits, NULL, B, nv, null_ids ? NULL : g_ids,
                               null_w ? NULL : g_w, null_nsel ? NULL : g_nsel, &g_st);
    CHECK(s == MJ_ERR_INVALID_ARG, "%s: got %s (%s)", what, mj_status_string(s),
          mj_last_error());
    CHECK(sentinels_intact(), "%s: an output was written", what);
    CHECK(mj_last_error()[0] != '\0', "%s: no error detail", what);
}

static void test_invalid(void) {
    static float x[SB * 64];
    mj_route_params good = small_params(8, 4, 2), p;
#define BAD(field, value)                                                                  \
    do {                                                                                   \
        p = good;                                                                          \
        p.field = value;                                                                   \
        expect_rejected(#field " = " #value, &p, x, SB, SB, 0, 0, 0);                      \
    } while (0)
    BAD(n_experts, 0);
    BAD(n_experts, -8);
    BAD(topk, 0);
    BAD(topk, 9);
    BAD(k0, 0);
    BAD(k0, 5);
    BAD(k0, -1);
    BAD(n_group, 0);
    BAD(n_group, 3);
    BAD(topk_group, 0);
    BAD(scoring, (mj_scoring)7);
    BAD(group_score, (mj_group_score)2);
    BAD(group_score, (mj_group_score)-1);
    BAD(routed_scaling_factor, NAN);
    BAD(routed_scaling_factor, INFINITY);
#undef BAD
    p = good;
    p.n_group = 2;
    p.topk_group = 3;
    expect_rejected("topk_group > n_group", &p, x, SB, SB, 0, 0, 0);
    p.n_group = 4; /* 1 group of 2 experts cannot give top-4 */
    p.topk_group = 1;
    expect_rejected("topk_group leaves too few experts", &p, x, SB, SB, 0, 0, 0);
    p.topk_group = 2; /* 2 groups of 2: exactly 4, allowed */
    fill_sentinels();
    CHECK_OK(mj_route_ref(&p, x, NULL, SB, SB, g_ids, g_w, g_nsel, &g_st));

    expect_rejected("p NULL", NULL, x, SB, SB, 0, 0, 0);
    expect_rejected("logits NULL", &good, NULL, SB, SB, 0, 0, 0);
    expect_rejected("ids NULL", &good, x, SB, SB, 1, 0, 0);
    expect_rejected("weights NULL", &good, x, SB, SB, 0, 1, 0);
    expect_rejected("n_sel NULL", &good, x, SB, SB, 0, 0, 1);
    expect_rejected("B < 0", &good, x, -1, 0, 0, 0, 0);
    expect_rejected("num_valid < 0", &good, x, SB, -1, 0, 0, 0);
    expect_rejected("num_valid > B", &good, x, SB, SB + 1, 0, 0, 0);
}

static void test_params_from_config(void) {
    mj_moe_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_experts = 256;
    cfg.topk = 8;
    cfg.n_group = 8;
    cfg.topk_group = 4;
    cfg.scoring = MJ_SCORING_SOFTMAX;
    cfg.routed_scaling_factor = 2.5f;
    cfg.norm_topk_prob = 1;
    cfg.group_score = MJ_GROUP_SCORE_MAX;
    mj_route_params p;
    memset(&p, 0x5A, sizeof p);
    CHECK_OK(mj_route_params_from_config(&cfg, &p));
    CHECK(p.struct_size == sizeof p && p.n_experts == 256 && p.topk == 8 && p.k0 == 8 && p.n_group == 8 &&
              p.topk_group == 4 && p.scoring == MJ_SCORING_SOFTMAX &&
              p.routed_scaling_factor == 2.5f && p.renormalize == 1 &&
              p.group_score == MJ_GROUP_SCORE_MAX,
          "params: E %d k %d k0 %d groups %d/%d scoring %d rsf %g renorm %d group_score %d",
          p.n_experts, p.topk, p.k0, p.n_group, p.topk_group, (int)p.scoring,
          (double)p.routed_scaling_factor, p.renormalize, (int)p.group_score);
    cfg.group_score = MJ_GROUP_SCORE_TOP2_SUM;
    CHECK_OK(mj_route_params_from_config(&cfg, &p));
    CHECK(p.group_score == MJ_GROUP_SCORE_TOP2_SUM, "group_score %d", (int)p.group_score);
    CHECK_STATUS(mj_route_params_from_config(NULL, &p), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_route_params_from_config(&cfg, NULL), MJ_ERR_INVALID_ARG);
}

static uint64_t g_seed;

static int setup(void) {
    g_seed = test_seed(20240611);
    return 0;
}

static void case_identical_and_agreeing(void) { test_identical_and_agreeing(g_seed ^ 0x1111); }
static void case_padding(void) { test_padding(g_seed ^ 0x2222); }
static void case_hot_expert(void) { test_hot_expert(g_seed ^ 0x3333); }
static void case_random(void) { test_random(g_seed); }

static const test_case cases[] = {
    TEST_CASE("params_from_config", test_params_from_config),
    TEST_CASE("hand_examples", test_hand_examples),
    TEST_CASE("identical_and_agreeing", case_identical_and_agreeing),
    TEST_CASE("padding", case_padding),
    TEST_CASE("ties_and_bias", test_ties_and_bias),
    TEST_CASE("nan_and_inf", test_nan_and_inf),
    TEST_CASE("hot_expert", case_hot_expert),
    TEST_CASE("group_rules", test_group_rules),
    TEST_CASE("old_params_size", test_old_params_size),
    TEST_CASE("invalid", test_invalid),
    TEST_CASE("random", case_random),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, NULL); }
