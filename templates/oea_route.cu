/* oea_route.cu — noaux_tc routing with OEA, and the dispatch metadata the grouped GEMMs use,
 * in one pass over the batch.
 *
 * The block takes the batch in rounds of NWARPS tokens: the round's sigmoid scores by every
 * thread (block_scores: a token's experts spread over the threads the round's tokens leave),
 * then a warp a token: lane l holds experts l, l+32, l+64, ... Each pick is a
 * warp-wide argmax over a 64-bit key (order-preserving bits of the selection score, then the
 * inverted expert id), so "higher score first, NaN after every number, ties to the lower id"
 * is one integer max, and every pick is deterministic. The arithmetic mirrors
 * runtime/route_ref.c exactly (same formulas, same summation order), so on the CPU
 * interpreter ids and counts match the reference bit for bit. With groups (NG > 1) a group
 * is scored as the model's topk_method says: GSCORE 0 the sum of its top-2 (noaux_tc),
 * GSCORE 1 its max (DeepSeek-V2's group_limited_greedy).
 *
 *   oea_route        in one block: phase 1 for every valid token, S_base as bit masks in
 *                    shared memory, __syncthreads, phase 2 + weights, __syncthreads,
 *                    dispatch. Any B up to 256 (dynamic shared memory holds the B x K ids).
 *                    In many blocks: plain top-k (k0 == k: no batch-wide set), for big
 *                    batches, and then once more in one block with logits NULL: the
 *                    dispatch metadata of the ids the many blocks wrote (the same entry,
 *                    so the dispatch's code is compiled once).
 *
 * Compile time is part of the design (a cold NVRTC compile is paid on a server's first call
 * of a shape): one entry holds the routing code once (ptxas optimizes every entry with its
 * callees inlined, so a second entry calling a token's routing or the dispatch would double its
 * work), loops whose trips depend on each other stay rolled, the dispatch's loops (one or
 * two trips a thread) too, per-expert math (expf, divisions) runs in rolled loops over
 * values its global loads left in shared memory (the loads themselves stay unrolled, all
 * in flight at once), and per-expert work is branch-free.
 */
MJ_TEMPLATE(oea_route, "noaux_tc / OEA routing of a batch plus per-expert counts, offsets, active list and permutation")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_PDL("each kernel waits on the grid before it, so it launches as its programmatic dependent on sm_90+")
MJ_KNOB_RANGE(E, int, 8, 1024, "routed experts")
MJ_KNOB_RANGE(K, int, 1, 16, "experts per token (top-k)")
MJ_KNOB_RANGE(K0, int, 1, 16, "OEA phase-1 experts per token (K0 == K: plain top-k)")
MJ_KNOB_RANGE(NG, int, 1, 32, "expert groups (1: no group limit)")
MJ_KNOB_RANGE(TG, int, 1, 32, "groups kept per token")
MJ_KNOB_SET(GSCORE, int, "0 1", "group score when NG > 1: 0 the sum of its top-2 (noaux_tc), 1 its max (group_limited_greedy)")
MJ_KNOB_SET(SCORING, int, "0 1", "0 sigmoid, 1 softmax")
MJ_KNOB_SET(RENORM, int, "0 1", "renormalize the chosen weights to sum 1 (then x rsf)")
MJ_KNOB_SET(NWARPS, int, "1 2 4 8 16 32", "warps per block (tokens routed at once)")
MJ_CONSTRAINT("K0 <= K", "phase 1 keeps at most top-k experts")
MJ_CONSTRAINT("K <= E", "top-k cannot exceed the experts")
MJ_CONSTRAINT("E % NG == 0", "groups split the experts evenly")
MJ_CONSTRAINT("TG <= NG", "cannot keep more groups than there are")
MJ_CONSTRAINT("TG * (E / NG) >= K", "the kept groups must hold top-k experts")
MJ_CONSTRAINT("NG <= 32", "group masks are 32-bit")
MJ_CONSTRAINT("NG > 1 || GSCORE == 0", "without groups the group score decides nothing: one specialization, GSCORE 0")
MJ_CONSTRAINT("(2 * NWARPS * E + (E <= 256) * NWARPS * ((E + 31) / 32) * 8 + E + 64) * 4 <= 96 * 1024", "the warps' score rows and lists (dynamic) and the counts fit the 99 KiB a block every target allows (runtime/route.c keeps the B x K ids within it too)")

/* A helper ptxas compiles as a function of its own (called, not inlined): ptxas's time grows
 * faster than the size of what it optimizes at once, so a once-a-launch step is cheaper to
 * compile apart, and costs one call. */
#ifdef __CUDACC_RTC__
#define MJ_NOINLINE static __device__ __noinline__
#else
#define MJ_NOINLINE MJ_DEVICE
#endif

#define LOCAL ((E + 31) / 32)       /* experts per lane                                       */
#define GSIZE (E / NG)              /* experts per group                                      */
#define KEY_NONE 0ull

/* Order-preserving bits of a score: bigger score, bigger bits; NaN is 1 (below -inf, above
 * "none" = 0); -0 is +0, as the reference's float compare has it. */
MJ_DEVICE uint32_t order_bits(float c) {
    const uint32_t u = mj_f32_bits(c + 0.0f); /* -0 + 0 is +0 */
    const uint32_t k = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* negative: ~u */
    return c != c ? 1u : k;
}

/* The selection bits of an expert whose logit is v, score se and bias b: order_bits(se + b),
 * a NaN logit's as NaN's (below every number). */
MJ_DEVICE uint32_t select_bits(float v, float se, float b) {
    return order_bits((v != v) ? mj_f32_from_bits(0x7FC00000u) : se + b);
}

/* The score order_bits(c) came from: NaN comes back a NaN, a zero +0 (which no comparison
 * and no later order_bits tells from -0). */
MJ_DEVICE float bits_score(uint32_t k) { return mj_f32_from_bits((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k); }

MJ_DEVICE uint64_t make_key_bits(uint32_t bits, int e) {
    return ((uint64_t)bits << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)e);
}

MJ_DEVICE uint64_t make_key(float c, int e) { return make_key_bits(order_bits(c), e); }

MJ_DEVICE int key_expert(uint64_t key) { return (int)(0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFull)); }

/* The calling thread's warp in the block, as lane 0 has it: the same in every lane, and
 * ptxas knows it (a value it cannot prove warp-uniform makes every shuffle under a branch
 * or loop on it carry a divergent fallback). */
MJ_DEVICE int warp_index(void) { return __shfl_sync(0xFFFFFFFFu, (int)threadIdx.x / 32, 0); }

MJ_DEVICE uint64_t warp_max_key(uint64_t key) {
    for (int off = 16; off > 0; off /= 2) {
        uint32_t hi = __shfl_xor_sync(0xFFFFFFFFu, (uint32_t)(key >> 32), off);
        uint32_t lo = __shfl_xor_sync(0xFFFFFFFFu, (uint32_t)(key & 0xFFFFFFFFull), off);
        uint64_t other = ((uint64_t)hi << 32) | lo;
        if (other > key) key = other;
    }
    return key;
}

MJ_DEVICE float warp_max_f(float v) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xFFFFFFFFu, v, off);
        v = o > v ? o : v;
    }
    return v;
}

MJ_DEVICE int warp_sum_i(int v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return v;
}

/* Scores of tokens b0 .. b0 + nb - 1 (nb <= NWARPS, sigmoid: SCORING 0) into the warps' rows,
 * token b0 + i in warp i's: s[] the unbiased scores, c[] the selection score's order_bits (so
 * that every pick compares integers it need not convert). The rows are [NWARPS][E], side by
 * side, so pair i (token i / E, expert i % E) is s[i] and c[i], and the block's threads take
 * the pairs in turn: a token's experts spread over every thread the round's tokens leave
 * (at B 1 on 8 warps one expert a thread, the sigmoid loop once, not E / 32 times). The loads
 * first, all in flight at once (at most LOCAL a thread), then the math from shared memory in
 * a rolled loop (one copy of expf and the division), branch-free: every expert's sigmoid is
 * computed and NaN selected away. The formulas are runtime/route_ref.c's, so the bits are. A
 * subroutine of its own: its code compiles once, and the performance model reads it apart. */
MJ_NOINLINE void block_scores(const float *x, const float *bias, int nb, float *s, uint32_t *c) {
    /* No branch on bias (ptxas would keep a copy of each loop for either case): without one,
     * a load that is always valid whose bits are masked to +0.0f, which adds nothing. */
    const float *bp = bias ? bias : x;
    const uint32_t bmask = bias ? 0xFFFFFFFFu : 0u;
    const int t = (int)threadIdx.x, n = nb * E;
    float xv[LOCAL];
    uint32_t bv[LOCAL];
    for (int k = 0; k < LOCAL; k++) { /* guarded, not a loop that stops: every load in flight */
        const int i = t + k * NWARPS * 32, ok = i < n;
        xv[k] = ok ? x[i] : 0.0f;
        /* a thread's expert is the same in every trip where the block's threads are a
         * multiple of E (GLM-5's 256 on 8 warps and more): its bias is loaded once */
        bv[k] = k > 0 && (NWARPS * 32) % E == 0 ? bv[0] : ok ? mj_f32_bits(bp[(unsigned)i % E]) & bmask : 0u;
    }
    for (int k = 0; k < LOCAL; k++) {
        const int i = t + k * NWARPS * 32;
        if (i < n) s[i] = xv[k], c[i] = bv[k];
    }
#pragma unroll 1
    for (int i = t; i < n; i += NWARPS * 32) {
        const float v = s[i], b = mj_f32_from_bits(c[i]), sg = 1.0f / (1.0f + expf(-v));
        const float se = (v != v) ? 0.0f : sg;
        s[i] = se;
        c[i] = select_bits(v, se, b);
    }
}

/* Softmax scores (SCORING 1) of one token into s[] and c[], as block_scores has them; a warp
 * a token, lanes split the experts: the max over the numbers (a warp max: exact in any
 * order; only the sign of a zero max could differ, and it changes no result), exp per
 * expert, the sum in expert order by lane 0 (fp32 addition is not associative: this is the
 * one serial step), the division per expert. */
MJ_DEVICE void token_scores(const float *x, const float *bias, float *s, uint32_t *c, int lane) {
    const float *bp = bias ? bias : x;
    const uint32_t bmask = bias ? 0xFFFFFFFFu : 0u;
    float m = -1.0f / 0.0f;
    int have = 0;
    for (int i = 0; i < LOCAL; i++) {
        int e = lane + 32 * i;
        if (e >= E) break;
        float v = x[e];
        m = v > m ? v : m; /* false for NaN */
        have |= v == v;
    }
    m = warp_max_f(m);
    /* Votes, so that ptxas knows the branches below are the same in every lane. */
    have = __any_sync(0xFFFFFFFFu, have);
    const int inf_max = __any_sync(0xFFFFFFFFu, have && (m - m != m - m));
    if (inf_max) { /* the max is +-inf: the experts at it share the mass (a rare row: rolled) */
        int n_max = 0;
#pragma unroll 1
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            n_max += x[e] == m;
        }
        n_max = warp_sum_i(n_max);
        const float share = 1.0f / (float)n_max;
#pragma unroll 1
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            s[e] = x[e] == m ? share : 0.0f;
        }
    } else if (have) {
#pragma unroll 1 /* x is in L1 since the max: one copy of expf */
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            float v = x[e], ev = expf(v - m);
            s[e] = (v != v) ? 0.0f : ev; /* + 0.0f leaves the sum as skipping it would */
        }
        __syncwarp(0xFFFFFFFFu);
        float sum = 0.0f;
        if (lane == 0)
            for (int e = 0; e < E; e++) sum += s[e];
        sum = __shfl_sync(0xFFFFFFFFu, sum, 0);
#pragma unroll 1 /* one copy of the division */
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            s[e] /= sum;
        }
    } else { /* no number in the row (a rare row: rolled) */
#pragma unroll 1
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            s[e] = 0.0f;
        }
    }
    for (int i = 0; i < LOCAL; i++) {
        int e = lane + 32 * i;
        if (e >= E) break;
        float v = x[e], b = mj_f32_from_bits(mj_f32_bits(bp[e]) & bmask);
        c[e] = select_bits(v, s[e], b);
    }
    __syncwarp(0xFFFFFFFFu);
}

/* Which of the lane's experts are eligible under the group limit: bit i for expert
 * lane + 32 i. Group score = the sum of its two best c (GSCORE 0, noaux_tc) or its best c
 * alone (GSCORE 1, group_limited_greedy), NaN as -inf; the TG best groups are kept, ties to
 * the lower group id. One scan serves both rules: GSCORE only picks what it returns. */
MJ_DEVICE uint32_t eligible_mask(const uint32_t *c, int lane) {
    if (NG == 1) { /* every expert the lane holds (the last lane may hold fewer) */
        uint32_t all = 0;
        for (int i = 0; i < LOCAL; i++)
            if (lane + 32 * i < E) all |= 1u << i;
        return all;
    }
    /* LPG lanes a group (when NG divides 32, else one): lane l scans every LPG-th expert of
     * group l / LPG, xor shuffles within the LPG lanes merge their top-2 (the top-2
     * multiset, as a serial scan keeps it), and lane l < NG takes group l's score. */
    const int LPG = 32 % NG == 0 ? 32 / NG : 1, grp = lane / LPG;
    uint32_t b1 = 0, b2 = 0; /* order bits: 0 none, 1 NaN, then -inf and up */
    if (grp < NG)
        for (int i = 0; i < (GSIZE + LPG - 1) / LPG; i++) { /* a constant trip count */
            const int e = grp * GSIZE + lane % LPG + i * LPG;
            const uint32_t v = e < (grp + 1) * GSIZE ? c[e] : 0u, lo = v < b1 ? v : b1;
            b2 = lo > b2 ? lo : b2, b1 = v > b1 ? v : b1; /* ties keep both: a multiset */
        }
    for (int off = 1; off < LPG; off *= 2) {
        const uint32_t o1 = __shfl_xor_sync(0xFFFFFFFFu, b1, off), o2 = __shfl_xor_sync(0xFFFFFFFFu, b2, off);
        const uint32_t lo = o1 > b1 ? b1 : o1, hi2 = o2 > b2 ? o2 : b2;
        b1 = o1 > b1 ? o1 : b1;
        b2 = hi2 > lo ? hi2 : lo;
    }
    /* Back to scores, NaN (and none) as -inf: the reference's group scores. */
    const float f1 = b1 > 1u ? bits_score(b1) : -1.0f / 0.0f, f2 = b2 > 1u ? bits_score(b2) : -1.0f / 0.0f;
    const float gs = __shfl_sync(0xFFFFFFFFu, (GSIZE == 1 || GSCORE) ? f1 : f1 + f2, (lane % NG) * LPG);
    uint32_t kept = 0;
#pragma unroll 1 /* each pick depends on the one before: nothing to gain from copies */
    for (int t = 0; t < TG; t++) {
        uint64_t key = (lane < NG && !(kept & (1u << lane))) ? make_key(gs, lane) : KEY_NONE;
        key = warp_max_key(key);
        kept |= 1u << key_expert(key);
    }
    uint32_t m = 0;
    for (int i = 0; i < LOCAL; i++) {
        int e = lane + 32 * i;
        if (e < E && (kept & (1u << (e / GSIZE)))) m |= 1u << i;
    }
    __syncwarp(0xFFFFFFFFu); /* the lanes read others' c above; lane_sort writes its own next */
    return m;
}

/* How a lane finds its next best expert after it wins a pick, one of two ways by E:
 *   SORTED (E <= 256: at most 8 experts a lane): the lane sorts its experts' selection bits
 *     once a token (lane_sort) into a list, best first, so that a pick costs the lane that
 *     wins it one step down its list (lane_next): the list's j-th entry has its bits in c's
 *     slot lane + 32 j (c is not read by expert after the sort) and which of the lane's
 *     experts it is in ord[j * 32 + lane];
 *   else: the winning lane scans its candidates again (lane_best). A sort of 9 to 32 values,
 *     unrolled, would cost ptxas more time than the scans it saves.
 * Either way the highest bits come first and, among equal ones, the lowest expert; an expert
 * the lane may not take has bits 0 ("none"). */
#define SORTED (LOCAL <= 8)

/* One token's picking state, a lane's share: the best of what is left (its bits, its slot),
 * then what is left: the candidates (bit i: expert lane + 32 i) unsorted, the list's head
 * and length (lim: the lane's experts, fewer after the narrowing to S_base) sorted. */
typedef struct route_state {
    uint32_t best; /* 0: none left */
    int bi;        /* expert lane + 32 bi */
    uint32_t cand;
    int ptr, lim;
    int sel; /* lane j: the token's pick j (-1: none) */
    int n;   /* picks made (the same in every lane) */
} route_state;

/* The lane's best among its candidates `cand`: 32-bit compares, no branch (a slot not in
 * cand is read and ignored). */
MJ_DEVICE uint32_t lane_best(const uint32_t *c, uint32_t cand, int lane, int *bi) {
    uint32_t best = 0; /* below every score's bits (NaN's are 1): none yet */
    int at = 0;
    for (int i = 0; i < LOCAL; i++) {
        const uint32_t ob = c[lane + 32 * i < E ? lane + 32 * i : E - 1];
        const int take = ((cand >> i) & 1u) & (ob > best);
        best = take ? ob : best;
        at = take ? i : at;
    }
    *bi = at;
    return best;
}

/* SORTED: the lane's list from c and cand, by an odd-even transposition sort of the bits,
 * unrolled, in registers. Its compare-exchanges are of neighbours and swap only on a strict
 * less, so the sort is stable: among equal bits the lower expert stays first, with no index
 * in the key (one 32-bit compare an exchange). Experts past E and those not in cand have
 * bits 0: they sort last and are never picked. */
MJ_DEVICE void lane_sort(uint32_t *c, uint8_t *ord, uint32_t cand, int lane, route_state *st) {
    uint32_t kb[LOCAL], ki[LOCAL];
#pragma unroll
    for (int i = 0; i < LOCAL; i++) {
        const int e = lane + 32 * i;
        kb[i] = e < E && ((cand >> i) & 1u) ? c[e < E ? e : E - 1] : 0u;
        ki[i] = (uint32_t)i;
    }
#pragma unroll
    for (int r = 0; r < LOCAL; r++)
#pragma unroll
        for (int j = r % 2; j + 1 < LOCAL; j += 2) {
            const uint32_t a = kb[j], b = kb[j + 1], ia = ki[j], ib = ki[j + 1];
            const int swap = a < b;
            kb[j] = swap ? b : a, kb[j + 1] = swap ? a : b;
            ki[j] = swap ? ib : ia, ki[j + 1] = swap ? ia : ib;
        }
    st->lim = 0;
#pragma unroll
    for (int j = 0; j < LOCAL; j++)
        if (lane + 32 * j < E) {
            c[lane + 32 * j] = kb[j];
            ord[j * 32 + lane] = (uint8_t)ki[j];
            st->lim = j + 1;
        }
    st->ptr = 0;
    st->best = kb[0];
    st->bi = (int)ki[0];
}

/* The lane's next best after it won a pick: a step down its list, or a new scan. */
MJ_DEVICE void lane_next(const uint32_t *c, const uint8_t *ord, int lane, route_state *st) {
    if (SORTED) {
        st->ptr++;
        st->best = st->ptr < st->lim ? c[lane + 32 * st->ptr] : 0u;
        st->bi = st->ptr < st->lim ? (int)ord[st->ptr * 32 + lane] : 0;
    } else {
        st->cand &= ~(1u << st->bi);
        st->best = lane_best(c, st->cand, lane, &st->bi);
    }
}

/* A token's start: its scores into s and c (softmax: here; sigmoid: block_scores has written
 * them), its eligible experts, each lane's best. */
MJ_DEVICE void token_begin(const float *x, const float *bias, float *s, uint32_t *c, uint8_t *ord, int lane,
                           route_state *st) {
    if (SCORING == 1) token_scores(x, bias, s, c, lane);
    st->cand = eligible_mask(c, lane);
    if (SORTED) lane_sort(c, ord, st->cand, lane, st);
    else st->best = lane_best(c, st->cand, lane, &st->bi);
    st->sel = -1;
    st->n = 0;
}

/* Picks st->n .. kmax - 1: each is the best expert left, the highest bits and among equal
 * ones the lowest expert: the largest lane best (one REDUX), then the lowest expert among
 * the lanes holding it (a second); the winning lane finds its next best (the other lanes
 * keep theirs). Stops for good when no candidate is left. A pick depends on the one before,
 * so the loop is not unrolled (unrolling would only copy the code). */
MJ_DEVICE void token_picks(const uint32_t *c, const uint8_t *ord, int kmax, int lane, route_state *st) {
#pragma unroll 1
    for (int j = st->n; j < kmax; j++) {
        const uint32_t top = mj_warp_umax(st->best);
        if (top == 0) break; /* the same in every lane: no candidate left */
        const int e = (int)mj_warp_umin(st->best == top ? (uint32_t)(lane + 32 * st->bi) : 0xFFFFFFFFu);
        if ((e & 31) == lane) lane_next(c, ord, lane, st);
        if (lane == j) st->sel = e;
        st->n = j + 1;
    }
}

/* The picks past K0 come from S_base only (in_base: S_base as a mask a lane, bit i of word l
 * for expert l + 32 i): what is left of the lane's list narrowed to it, in order (SORTED),
 * or the candidates narrowed and their best found again. */
MJ_DEVICE void token_narrow(uint32_t *c, uint8_t *ord, const uint32_t *in_base, int lane, route_state *st) {
    const uint32_t base = in_base[lane];
    if (!SORTED) {
        st->cand &= base;
        st->best = lane_best(c, st->cand, lane, &st->bi);
        return;
    }
    int w = 0;
#pragma unroll 1
    for (int j = st->ptr; j < st->lim; j++) { /* w <= j: in place */
        const uint32_t b = c[lane + 32 * j];
        const int i = ord[j * 32 + lane];
        if ((base >> i) & 1u) c[lane + 32 * w] = b, ord[w * 32 + lane] = (uint8_t)i, w++;
    }
    st->ptr = -1, st->lim = w;
    lane_next(c, ord, lane, st);
}

/* Weights of a token's n chosen experts (lane j holds slot j's expert in sel): the sum in
 * slot order (every lane the same), then lane j writes slot j: w = s / (sum + 1e-20) * rsf
 * (or s * rsf); slots past n get id -1 and weight 0. */
MJ_DEVICE void token_finish(const float *s, int sel, int n, float rsf, int32_t *ids, float *weights,
                            int32_t *n_sel, int b, int lane) {
    float denom = 1.0f;
    const float sv = lane < n ? s[sel] : 0.0f; /* lane j: slot j's score */
    if (RENORM) { /* the slots past n add +0.0f, which leaves the sum as it is */
        float sum = 0.0f;
        for (int j = 0; j < K; j++) sum += __shfl_sync(0xFFFFFFFFu, sv, j);
        denom = sum + 1e-20f;
    }
    if (lane < K) {
        ids[b * K + lane] = lane < n ? sel : -1;
        weights[b * K + lane] = lane < n ? (RENORM ? sv / denom * rsf : sv * rsf) : 0.0f;
    }
    if (lane == 0) n_sel[b] = n;
}

/* Inclusive sums of *a and *b over lanes 0..lane, within the first n lanes (a power of 2). */
MJ_DEVICE void warp_scan2(int *a, int *b, int n, int lane) {
    for (int d = 1; d < n; d *= 2) {
        const int x = __shfl_up_sync(0xFFFFFFFFu, *a, d), y = __shfl_up_sync(0xFFFFFFFFu, *b, d);
        *a += lane >= d ? x : 0, *b += lane >= d ? y : 0;
    }
}

/* Mask words an expert in one chunk of the dispatch's rank step (DW x 32 entries a chunk),
 * within the scratch of the warps' score rows (2 x NWARPS x E words). */
#define DW (2 * NWARPS < 8 ? 2 * NWARPS : 8)

/* The warps that take part in the dispatch: at most 8 up to 256 experts (GLM-5's 256 are a
 * thread each on 8 warps, and so are a decode batch's B x K entries; the dispatch-alone launch
 * of a big batch has 8 warps anyway), all of them past that. The block's other warps meet its
 * barriers and issue nothing else, so a block of 32 spends a quarter of the issue on it.
 * runtime/route.c's mj_route_dispatch_warps says the same (test_route_kernels holds them
 * together), and the performance model counts it so. */
#define DWARPS (NWARPS > 8 && E <= 256 ? 8 : NWARPS)
#define DT (DWARPS * 32)                 /* the dispatch's threads                      */
#define SL ((E + DT - 1) / DT)           /* experts a thread in the dispatch's scan     */

/* The dispatch metadata (the permutation and its inverse, row_index, among it) from ids
 * [B, K]: rows grouped by expert (experts in id order), within an expert in entry order
 * (entry r = b * K + j: tokens in order, a token's slots in order), -1 in empty slots (row_index
 * -1 in rows past the routed ones). An id outside 0..E-1 is an empty slot. The dispatch's
 * threads (DT of them: DWARPS warps) take entries and experts in strides, and
 *   1. count each expert's entries (shared integer atomics: the totals do not depend on the
 *      order);
 *   2. the exclusive scan over the experts (offsets) and the active list: thread t takes
 *      experts t*SL .. t*SL+SL-1 (one at GLM-5's E 256), a shuffle scan in each warp, warp 0
 *      the scan of the warps' totals (in wsum: 2 x NWARPS ints, shared);
 *   3. the outputs, copied in parallel;
 *   4. by chunks of DW x 32 entries: each entry sets its bit in its expert's mask (atomicOr:
 *      the masks do not depend on the order), and its row is the expert's base (offset plus
 *      the entries of the chunks before) plus the bits below its own: its rank among the
 *      expert's entries. O(1) a thread at decode batches, however many tokens an expert has.
 * Integer work only, each result in a fixed place: deterministic; duplicate ids in a token
 * get rows of their own, in slot order, as the reference gives them. Every warp meets every
 * barrier. cnt: E ints (shared); scr: 2 x NWARPS x E words (shared): the offsets and the
 * active list (steps 2-3), then the masks [DW][E] (step 4). */
MJ_NOINLINE void dispatch(const int32_t *ids, int B, int32_t *counts, int32_t *offsets,
                          int32_t *active, int32_t *n_active, int32_t *perm, int32_t *row_index,
                          int32_t *cnt, uint32_t *scr, int32_t *wsum) {
    const int t = (int)threadIdx.x, lane = t % 32, w = warp_index(), n = B * K;
    const int on = w < DWARPS; /* the same in every lane */
    int32_t *const off = (int32_t *)scr, *const act = (int32_t *)scr + E;
    if (on) {
#pragma unroll 1
        for (int e = t; e < E; e += DT) cnt[e] = 0;
        /* Rows past the routed ones have no source: -1 (the routed rows are written in step
         * 4, after barriers). */
        if (row_index) {
#pragma unroll 1
            for (int r = t; r < n; r += DT) row_index[r] = -1;
        }
    }
    __syncthreads();
    if (on) {
#pragma unroll 1
        for (int r = t; r < n; r += DT) {
            const int e = ids[r];
            if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
        }
    }
    __syncthreads();
    /* thread t: experts t * SL .. t * SL + SL - 1; a warp's inclusive scan by shuffles, the
     * warps' totals scanned by warp 0 (wsum: NWARPS totals, then NWARPS active counts; a warp
     * past the dispatch's, none) */
    int tot = 0, nz = 0, it = 0, iz = 0;
    if (on) {
#pragma unroll 1
        for (int i = 0; i < SL; i++) {
            const int e = t * SL + i, c = e < E ? cnt[e] : 0;
            tot += c, nz += c > 0;
        }
        it = tot, iz = nz;
        warp_scan2(&it, &iz, 32, lane);
    }
    if (lane == 31) wsum[w] = it, wsum[NWARPS + w] = iz;
    __syncthreads();
    if (w == 0) { /* warp 0 alone (w is known warp-uniform: no divergent shuffles) */
        int s = lane < NWARPS ? wsum[lane] : 0, z = lane < NWARPS ? wsum[NWARPS + lane] : 0;
        warp_scan2(&s, &z, NWARPS, lane);
        if (lane < NWARPS) wsum[lane] = s, wsum[NWARPS + lane] = z; /* inclusive, by warp */
    }
    __syncthreads();
    const int n_act = wsum[2 * NWARPS - 1];
    if (on) {
        int o = (w ? wsum[w - 1] : 0) + it - tot, na = (w ? wsum[NWARPS + w - 1] : 0) + iz - nz;
#pragma unroll 1
        for (int i = 0; i < SL; i++) {
            const int e = t * SL + i;
            if (e < E) {
                off[e] = o;
                if (cnt[e]) act[na++] = e;
                o += cnt[e];
            }
        }
#pragma unroll 1
        for (int e = n_act + t; e < E; e += DT) act[e] = -1;
    }
    if (t == NWARPS * 32 - 1) {
        if (offsets) offsets[E] = wsum[NWARPS - 1];
        if (n_active) n_active[0] = n_act;
    }
    __syncthreads();
    if (on) {
#pragma unroll 1
        for (int e = t; e < E; e += DT) {
            if (counts) counts[e] = cnt[e];
            if (offsets) offsets[e] = off[e];
            if (active) active[e] = act[e];
            cnt[e] = off[e]; /* from here: the expert's next chunk's first row */
        }
    }
    if (!perm && !row_index) return;
    __syncthreads(); /* off and act are read: the scratch takes the masks */
#pragma unroll 1
    for (int c0 = 0; c0 < n; c0 += DW * 32) {
        const int c1 = c0 + DW * 32 < n ? c0 + DW * 32 : n;
        if (on) { /* 16 bytes a store where the masks are whole 16-byte words */
            if ((DW * E) % 4 == 0) {
#pragma unroll 1
                for (int i = t; i < DW * E / 4; i += DT) ((uint4 *)scr)[i] = make_uint4(0u, 0u, 0u, 0u);
            } else {
#pragma unroll 1
                for (int i = t; i < DW * E; i += DT) scr[i] = 0;
            }
        }
        __syncthreads();
        if (on) {
#pragma unroll 1
            for (int r = c0 + t; r < c1; r += DT) {
                const int e = ids[r];
                if (e >= 0 && e < E) atomicOr(&scr[(r - c0) / 32 * E + e], 1u << ((r - c0) % 32));
            }
        }
        __syncthreads();
        if (on) {
#pragma unroll 1
            for (int r = c0 + t; r < c1; r += DT) {
                const int e = ids[r], q = (r - c0) / 32;
                int row = -1;
                if (e >= 0 && e < E) {
                    row = cnt[e] + __popc(scr[q * E + e] & ((1u << ((r - c0) % 32)) - 1u));
#pragma unroll 1
                    for (int j = 0; j < q; j++) row += __popc(scr[j * E + e]);
                }
                if (perm) perm[r] = row;
                if (row_index && row >= 0) row_index[row] = r;
            }
        }
        if (c1 < n) { /* another chunk: the bases move past this one's entries */
            __syncthreads();
            if (on) {
#pragma unroll 1
                for (int e = t; e < E; e += DT) {
                    int m = 0;
#pragma unroll 1
                    for (int j = 0; j < DW; j++) m += __popc(scr[j * E + e]);
                    cnt[e] += m;
                }
            }
            __syncthreads();
        }
    }
}

/* Whether this specialization has dispatch_small. The runtime gives a block of more than 8
 * warps only to batches with B x K past 32 (runtime/route.c, route_warps), or past 16 tokens,
 * where B x K <= 32 means top-1: those leave it out (its code costs a compile about 45 ms) and
 * take the whole dispatch, which is right for any B. */
#define SMALL_DISPATCH (NWARPS <= 8)

/* The dispatch metadata of at most 32 entries (B x K <= 32: decode's B 1 to 4 at top-8), the
 * same outputs as dispatch() from a shorter chain (about 270 warp-instructions, not 450):
 *   1. warp 0 sorts the entries by (expert, entry) with a bitonic network across its lanes
 *      (a key a lane, (id << 5) | r, unique; an empty slot's key all ones, last), so that
 *      lane l holds row l: its entry goes to perm and row_index, and the first lane of each
 *      expert's run is an active expert (placed by a ballot); the rows' experts go to srt
 *      (32 ints, shared: sm_base's upper half, which S_base leaves free; past the routed
 *      rows E, above every expert);
 *   2. every thread takes experts: an expert's offset is the rows before it, its count the
 *      rows up to the next expert, each a branch-free binary search of srt.
 * wsum: 1 int (shared), the active experts. */
MJ_NOINLINE void dispatch_small(const int32_t *ids, int n, int32_t *counts, int32_t *offsets, int32_t *active,
                                int32_t *n_active, int32_t *perm, int32_t *row_index, int32_t *srt,
                                int32_t *wsum) {
    const int t = (int)threadIdx.x, lane = t % 32;
    if (warp_index() == 0) {
        const int e = lane < n ? ids[lane] : -1, ok = lane < n && e >= 0 && e < E;
        if (lane < n && !ok && perm) perm[lane] = -1; /* an empty slot: no row */
        uint32_t key = ok ? ((uint32_t)e << 5) | (uint32_t)lane : 0xFFFFFFFFu;
#pragma unroll
        for (int a = 1; a <= 5; a++) /* merges of runs of 2^a, ascending at the last */
#pragma unroll
            for (int d = a - 1; d >= 0; d--) {
                const uint32_t o = __shfl_xor_sync(0xFFFFFFFFu, key, 1 << d);
                const int low = ((lane >> d) & 1) == 0, up = ((lane >> a) & 1) == 0;
                key = low == up ? (o < key ? o : key) : (o > key ? o : key);
            }
        const int nv = __popc(__ballot_sync(0xFFFFFFFFu, ok)), routed = lane < nv;
        const int ex = (int)(key >> 5), r = (int)(key & 31u);
        const uint32_t pkey = __shfl_up_sync(0xFFFFFFFFu, key, 1); /* lane l - 1's (lane 0: its own) */
        const int prev = (int)(pkey >> 5);
        const uint32_t first = __ballot_sync(0xFFFFFFFFu, routed && (lane == 0 || prev != ex));
        if (routed && perm) perm[r] = lane;
        if (lane < n && row_index) row_index[lane] = routed ? r : -1;
        if (((first >> lane) & 1u) && active) active[__popc(first & ((1u << lane) - 1u))] = ex;
        srt[lane] = routed ? ex : E;
        if (lane == 0) {
            wsum[0] = __popc(first);
            if (offsets) offsets[E] = nv;
            if (n_active) n_active[0] = __popc(first);
        }
    }
    __syncthreads();
    const int na = wsum[0];
#pragma unroll 1
    for (int e = t; e < E; e += NWARPS * 32) {
        int lo = 0, hi = 0; /* the rows whose expert is below e, and at most e */
#pragma unroll
        for (int step = 16; step > 0; step /= 2) {
            lo += srt[lo + step - 1] < e ? step : 0;
            hi += srt[hi + step - 1] <= e ? step : 0;
        }
        lo += srt[lo] < e, hi += srt[hi] <= e; /* lo, hi <= 31 here: srt[31] is read at most */
        if (counts) counts[e] = hi - lo;
        if (offsets) offsets[e] = lo;
        if (active && e >= na) active[e] = -1;
    }
}

/* The real token count: *num_valid when given (read on every launch, so a CUDA graph replays
 * with whatever count was written there), clamped to 0..B; B when NULL. */
MJ_DEVICE int valid_rows(const int32_t *num_valid, int B) {
    if (!num_valid) return B;
    int v = num_valid[0];
    return v < 0 ? 0 : v > B ? B : v;
}

/* Routing, one launch shape per use (dynamic shared memory in each: a token's s and c per
 * warp, NWARPS x E floats and as many words, which the dispatch reuses as its scratch, then
 * where SORTED the warps' lists' expert slots, NWARPS x 32 x LOCAL bytes; the one-block launch
 * adds the B x K ids):
 *   grid 1     the whole batch (B <= 256) in one block, with OEA when K0 < K, and the
 *              dispatch;
 *   grid > 1   plain top-k (K0 == K) for big batches: a block's warps take tokens
 *              blockIdx.x * NWARPS + w, stepping by the grid; no dispatch; then
 *   grid 1, logits NULL: the dispatch alone, of the ids [B, K] in global memory (written by
 *              the launch before); nothing else is read or written but the dispatch's
 *              outputs.
 * Both run one loop over the phases, so a token's routing is inlined once (every copy of it
 * costs compile time, none of them speed): phase 0 takes each valid token's first K0 (they
 * make S_base), phase 1 each token's K (past K0 from S_base only). Plain top-k skips phase
 * 0: with K0 == K phase 1 never looks at S_base. When every warp has one token at most (B <=
 * NWARPS), phase 1 goes on from where phase 0 stopped (its first K0 picks are phase 0's,
 * the token's scores still in the warp's rows): a token is scored once. A phase goes by
 * rounds of a block's NWARPS tokens, every warp through every round (a warp without a token
 * waits at the round's barriers): the round's sigmoid scores by the whole block, then each
 * warp its token's picks. */
/* A block of 32 warps must fit 64 registers a thread: ptxas is told so (below 32 warps a
 * bound only changes what ptxas aims for, and at E 1024 on 2 warps made it spill). */
#if NWARPS == 32
#define ROUTE_BOUNDS __launch_bounds__(1024)
#else
#define ROUTE_BOUNDS
#endif
MJ_KERNEL void ROUTE_BOUNDS oea_route(const float *logits, const float *bias, int B, const int32_t *num_valid_p,
                         float rsf, int32_t *ids, float *weights, int32_t *n_sel, int32_t *counts,
                         int32_t *offsets, int32_t *active, int32_t *n_active, int32_t *perm,
                         int32_t *row_index) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
    MJ_SHARED int sm_cnt[E];        /* the dispatch's counts */
    MJ_SHARED uint32_t sm_base[64]; /* S_base, a mask a lane (see token_narrow); then the
                                     * dispatch's scan of the warps' totals, or the short
                                     * dispatch's total and (from 32) sorted rows */
    MJ_DYNAMIC_SHARED(int32_t, sm_dyn);
    float *const sm_s = (float *)sm_dyn;                        /* [NWARPS][E] */
    uint32_t *const sm_c = (uint32_t *)(sm_dyn + NWARPS * E);   /* [NWARPS][E] */
    uint8_t *const sm_ord = (uint8_t *)(sm_dyn + 2 * NWARPS * E); /* [NWARPS][LOCAL][32], SORTED */
    int32_t *const sm_ids = sm_dyn + 2 * NWARPS * E + (SORTED ? NWARPS * LOCAL * 8 : 0); /* [B][K], one block */
    const int num_valid = valid_rows(num_valid_p, B);
    const int lane = (int)threadIdx.x % 32, w = warp_index();
    const int only_dispatch = logits == 0; /* the same in every thread: a kernel argument */
    const int one_block = gridDim.x == 1, oea = one_block && K0 < K && !only_dispatch;
    const int keep = oea && B <= NWARPS; /* phase 1 goes on with phase 0's state */
    float *s = sm_s + w * E;
    uint32_t *c = sm_c + w * E;
    uint8_t *ord = sm_ord + w * LOCAL * 32;
    route_state st;
    st.best = 0, st.bi = 0, st.cand = 0, st.ptr = 0, st.lim = 0, st.sel = -1, st.n = 0;

    if (oea) {
        if (threadIdx.x < 32) sm_base[threadIdx.x] = 0;
        __syncthreads();
    }
#pragma unroll 1
    for (int phase = oea ? 0 : 1; phase < 2 && !only_dispatch; phase++) {
        const int rows = phase ? B : num_valid, score = !(keep && phase); /* the same in every thread */
        /* Rounds of the block's NWARPS tokens (the same rounds in every warp: a barrier's) */
        for (int b0 = (int)blockIdx.x * NWARPS; b0 < rows; b0 += (int)gridDim.x * NWARPS) {
            const int b = b0 + w;
            if (SCORING == 0 && score && b0 < num_valid) { /* the round's sigmoid scores, by the whole block */
                __syncthreads(); /* every warp is done with its row (the round before's lists) */
                block_scores(logits + (long long)b0 * E, bias, num_valid - b0 < NWARPS ? num_valid - b0 : NWARPS, sm_s, sm_c);
                __syncthreads();
            }
            if (b >= rows) continue; /* no token this round (the barriers above are every warp's) */
            if (b < num_valid) {
                if (score) {
                    token_begin(logits + (long long)b * E, bias, s, c, ord, lane, &st);
                    token_picks(c, ord, K0, lane, &st);
                }
                if (phase && oea) token_narrow(c, ord, sm_base, lane, &st);
                if (phase) token_picks(c, ord, K, lane, &st);
            } else {
                st.sel = -1, st.n = 0;
            }
            if (phase == 0) {
                if (lane < st.n) atomicOr(&sm_base[st.sel % 32], 1u << (st.sel / 32));
            } else {
                token_finish(s, st.sel, st.n, rsf, ids, weights, n_sel, b, lane);
                if (one_block && lane < K) sm_ids[b * K + lane] = lane < st.n ? st.sel : -1;
            }
            __syncwarp(0xFFFFFFFFu);
        }
        __syncthreads();
    }
    if (!one_block) return;
    /* The per-warp score rows are free now: the dispatch's scratch. */
    /* B is a kernel argument: the same in every thread. */
    if (SMALL_DISPATCH && B * K <= 32)
        dispatch_small(only_dispatch ? ids : sm_ids, B * K, counts, offsets, active, n_active, perm, row_index,
                       (int32_t *)sm_base + 32, (int32_t *)sm_base);
    else
        dispatch(only_dispatch ? ids : sm_ids, B, counts, offsets, active, n_active, perm, row_index, sm_cnt,
                 (uint32_t *)sm_dyn, (int32_t *)sm_base);
}
