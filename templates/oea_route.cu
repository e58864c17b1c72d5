/* oea_route.cu — noaux_tc routing with OEA, and the dispatch metadata the grouped GEMMs use,
 * in one pass over the batch.
 *
 * A warp routes one token at a time: lane l holds experts l, l+32, l+64, ... Each pick is a
 * warp-wide argmax over a 64-bit key (order-preserving bits of the selection score, then the
 * inverted expert id), so "higher score first, NaN after every number, ties to the lower id"
 * is one integer max, and every pick is deterministic. The arithmetic mirrors
 * runtime/route_ref.c exactly (same formulas, same summation order), so on the CPU
 * interpreter ids and counts match the reference bit for bit.
 *
 *   oea_route        one block: phase 1 for every valid token, S_base as flags in shared
 *                    memory, __syncthreads, phase 2 + weights, __syncthreads, dispatch.
 *                    Any B up to 256 (dynamic shared memory holds the B x K ids).
 *   topk_route       many blocks, plain top-k (k0 == k: no batch-wide set), for big batches;
 *   route_dispatch   then this one block computes the dispatch metadata from the ids.
 */
MJ_TEMPLATE(oea_route, "noaux_tc / OEA routing of a batch plus per-expert counts, offsets, active list and permutation")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_KNOB_RANGE(E, int, 8, 1024, "routed experts")
MJ_KNOB_RANGE(K, int, 1, 16, "experts per token (top-k)")
MJ_KNOB_RANGE(K0, int, 1, 16, "OEA phase-1 experts per token (K0 == K: plain top-k)")
MJ_KNOB_RANGE(NG, int, 1, 32, "expert groups (1: no group limit)")
MJ_KNOB_RANGE(TG, int, 1, 32, "groups kept per token")
MJ_KNOB_SET(SCORING, int, "0 1", "0 sigmoid, 1 softmax")
MJ_KNOB_SET(RENORM, int, "0 1", "renormalize the chosen weights to sum 1 (then x rsf)")
MJ_KNOB_SET(NWARPS, int, "1 2 4 8 16", "warps per block (tokens routed at once)")
MJ_CONSTRAINT("K0 <= K", "phase 1 keeps at most top-k experts")
MJ_CONSTRAINT("K <= E", "top-k cannot exceed the experts")
MJ_CONSTRAINT("E % NG == 0", "groups split the experts evenly")
MJ_CONSTRAINT("TG <= NG", "cannot keep more groups than there are")
MJ_CONSTRAINT("TG * (E / NG) >= K", "the kept groups must hold top-k experts")
MJ_CONSTRAINT("NG <= 32", "group masks are 32-bit")
MJ_CONSTRAINT("(2 * NWARPS * E + E + NWARPS * K) * 4 <= 48 * 1024", "static shared memory fits the 48 KiB every target gives")

#define LOCAL ((E + 31) / 32)       /* experts per lane                                       */
#define GSIZE (E / NG)              /* experts per group                                      */
#define KEY_NONE 0ull

MJ_DEVICE uint32_t f2u(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    return v.u;
}

/* Order-preserving bits of a score: bigger score, bigger bits; NaN is 1 (below -inf, above
 * "none" = 0); -0 is +0, as the reference's float compare has it. */
MJ_DEVICE uint32_t order_bits(float c) {
    if (c != c) return 1u;
    if (c == 0.0f) return 0x80000000u;
    uint32_t u = f2u(c);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

MJ_DEVICE uint64_t make_key(float c, int e) {
    return ((uint64_t)order_bits(c) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)e);
}

MJ_DEVICE int key_expert(uint64_t key) { return (int)(0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFull)); }

MJ_DEVICE uint64_t warp_max_key(uint64_t key) {
    for (int off = 16; off > 0; off /= 2) {
        uint32_t hi = __shfl_xor_sync(0xFFFFFFFFu, (uint32_t)(key >> 32), off);
        uint32_t lo = __shfl_xor_sync(0xFFFFFFFFu, (uint32_t)(key & 0xFFFFFFFFull), off);
        uint64_t other = ((uint64_t)hi << 32) | lo;
        if (other > key) key = other;
    }
    return key;
}

/* Scores of one token into s[] (unbiased) and c[] (selection): lanes split the experts;
 * softmax's max and sum are taken by lane 0 in expert order, as the reference does. */
MJ_DEVICE void token_scores(const float *x, const float *bias, float *s, float *c, int lane) {
    if (SCORING == 0) {
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e >= E) break;
            float v = x[e];
            s[e] = (v != v) ? 0.0f : 1.0f / (1.0f + expf(-v));
        }
    } else if (lane == 0) {
        float m = 0.0f;
        int have = 0, n_max = 0;
        for (int e = 0; e < E; e++) {
            float v = x[e];
            if (v != v) continue;
            if (!have || v > m) m = v;
            have = 1;
        }
        for (int e = 0; e < E; e++) s[e] = 0.0f;
        if (have && (m - m != m - m)) { /* the max is +-inf: the experts at it share the mass */
            for (int e = 0; e < E; e++) n_max += (x[e] == m);
            for (int e = 0; e < E; e++)
                if (x[e] == m) s[e] = 1.0f / (float)n_max;
        } else if (have) {
            float sum = 0.0f;
            for (int e = 0; e < E; e++) {
                if (x[e] != x[e]) continue;
                s[e] = expf(x[e] - m);
                sum += s[e];
            }
            for (int e = 0; e < E; e++) s[e] /= sum;
        }
    }
    __syncwarp(0xFFFFFFFFu);
    for (int i = 0; i < LOCAL; i++) {
        int e = lane + 32 * i;
        if (e >= E) break;
        float v = x[e];
        c[e] = (v != v) ? (0.0f / 0.0f) : s[e] + (bias ? bias[e] : 0.0f);
    }
    __syncwarp(0xFFFFFFFFu);
}

/* Which of the lane's experts are eligible under the group limit: bit i for expert
 * lane + 32 i. Group score = the sum of its two best c (NaN as -inf); the TG best groups
 * are kept, ties to the lower group id. */
MJ_DEVICE uint32_t eligible_mask(const float *c, int lane) {
    if (NG == 1) { /* every expert the lane holds (the last lane may hold fewer) */
        uint32_t all = 0;
        for (int i = 0; i < LOCAL; i++)
            if (lane + 32 * i < E) all |= 1u << i;
        return all;
    }
    float gs = -1.0f / 0.0f;
    if (lane < NG) {
        float b1 = -1.0f / 0.0f, b2 = -1.0f / 0.0f;
        for (int e = lane * GSIZE; e < (lane + 1) * GSIZE; e++) {
            float v = (c[e] != c[e]) ? (-1.0f / 0.0f) : c[e];
            if (v > b1) {
                b2 = b1;
                b1 = v;
            } else if (v > b2) {
                b2 = v;
            }
        }
        gs = GSIZE == 1 ? b1 : b1 + b2;
    }
    uint32_t kept = 0;
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
    return m;
}

/* The best expert among the lane-local candidates `cand` (bit i: expert lane + 32 i), or -1. */
MJ_DEVICE int pick(const float *c, uint32_t cand, int lane) {
    uint64_t key = KEY_NONE;
    for (int i = 0; i < LOCAL; i++) {
        if (!(cand & (1u << i))) continue;
        uint64_t k = make_key(c[lane + 32 * i], lane + 32 * i);
        if (k > key) key = k;
    }
    key = warp_max_key(key);
    return key == KEY_NONE ? -1 : key_expert(key);
}

/* Route one token: its best K0 eligible experts, then (while it has fewer than K) the best
 * of the rest that are in S_base (in_base flags; 0: no restriction, plain top-k). The picks
 * land in sel[] (by lane 0) in ranking order; returns how many. */
MJ_DEVICE int route_token(const float *x, const float *bias, const int *in_base, float *s, float *c,
                          int *sel, int lane) {
    token_scores(x, bias, s, c, lane);
    uint32_t cand = eligible_mask(c, lane), base = cand;
    if (in_base) {
        base = 0;
        for (int i = 0; i < LOCAL; i++) {
            int e = lane + 32 * i;
            if (e < E && in_base[e]) base |= 1u << i;
        }
    }
    int n = 0;
    for (int j = 0; j < K; j++) {
        int e = pick(c, j < K0 ? cand : (cand & base), lane);
        if (e < 0) break;
        if (e % 32 == lane) cand &= ~(1u << (e / 32));
        if (lane == 0) sel[j] = e;
        __syncwarp(0xFFFFFFFFu);
        n = j + 1;
    }
    return n;
}

/* Weights of a token's n chosen experts, by lane 0: the sum in slot order, then w = s /
 * (sum + 1e-20) * rsf (or s * rsf); slots past n get id -1 and weight 0. */
MJ_DEVICE void token_finish(const float *s, const int *sel, int n, float rsf, int32_t *ids,
                            float *weights, int32_t *n_sel, int b, int lane) {
    if (lane != 0) return;
    float denom = 1.0f;
    if (RENORM) {
        float sum = 0.0f;
        for (int j = 0; j < n; j++) sum += s[sel[j]];
        denom = sum + 1e-20f;
    }
    for (int j = 0; j < K; j++) {
        ids[b * K + j] = j < n ? sel[j] : -1;
        weights[b * K + j] = j < n ? (RENORM ? s[sel[j]] / denom * rsf : s[sel[j]] * rsf) : 0.0f;
    }
    n_sel[b] = n;
}

/* Counts, offsets, active experts, the permutation and its inverse (row_index) from ids
 * [B, K] (rows of a token in slot order, tokens in order). One thread an expert:
 * deterministic, no atomics. */
MJ_DEVICE void dispatch(const int32_t *ids, int B, int32_t *counts, int32_t *offsets,
                        int32_t *active, int32_t *n_active, int32_t *perm, int32_t *row_index,
                        int32_t *cnt) {
    int t = (int)threadIdx.x, nt = (int)blockDim.x;
    /* Rows past the routed ones have no source: -1 (the routed rows are written below, after
     * a barrier). */
    if (row_index)
        for (int r = t; r < B * K; r += nt) row_index[r] = -1;
    for (int e = t; e < E; e += nt) {
        int n = 0;
        for (int r = 0; r < B * K; r++) n += ids[r] == e;
        cnt[e] = n;
    }
    __syncthreads();
    if (t == 0) {
        int off = 0, na = 0;
        for (int e = 0; e < E; e++) {
            if (offsets) offsets[e] = off;
            if (counts) counts[e] = cnt[e];
            if (cnt[e]) {
                if (active) active[na] = e;
                na++;
            }
            int c0 = cnt[e];
            cnt[e] = off; /* from here on: the next free row of expert e */
            off += c0;
        }
        if (offsets) offsets[E] = off;
        if (active)
            for (int e = na; e < E; e++) active[e] = -1;
        if (n_active) n_active[0] = na;
    }
    __syncthreads();
    if (perm || row_index) {
        for (int e = t; e < E; e += nt) {
            int row = cnt[e];
            for (int r = 0; r < B * K; r++)
                if (ids[r] == e) {
                    if (perm) perm[r] = row;
                    if (row_index) row_index[row] = r;
                    row++;
                }
        }
        for (int r = t; r < B * K; r += nt)
            if (ids[r] < 0 && perm) perm[r] = -1;
    }
}

/* The real token count: *num_valid when given (read on every launch, so a CUDA graph replays
 * with whatever count was written there), clamped to 0..B; B when NULL. */
MJ_DEVICE int valid_rows(const int32_t *num_valid, int B) {
    if (!num_valid) return B;
    int v = num_valid[0];
    return v < 0 ? 0 : v > B ? B : v;
}

/* One block routes the whole batch with OEA; dynamic shared memory: B * K int32. */
MJ_KERNEL void oea_route(const float *logits, const float *bias, int B, const int32_t *num_valid_p,
                         float rsf, int32_t *ids, float *weights, int32_t *n_sel, int32_t *counts,
                         int32_t *offsets, int32_t *active, int32_t *n_active, int32_t *perm,
                         int32_t *row_index) {
    MJ_SHARED float sm_s[NWARPS][E];
    MJ_SHARED float sm_c[NWARPS][E];
    MJ_SHARED int sm_base[E];
    MJ_SHARED int sm_sel[NWARPS][K];
    MJ_DYNAMIC_SHARED(int32_t, sm_ids);
    const int num_valid = valid_rows(num_valid_p, B);
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32;
    float *s = sm_s[w], *c = sm_c[w];
    int *sel = sm_sel[w];

    for (int e = (int)threadIdx.x; e < E; e += NWARPS * 32) sm_base[e] = 0;
    __syncthreads();
    /* Phase 1: each valid token's first K0; they make S_base. */
    for (int b = w; b < num_valid; b += NWARPS) {
        token_scores(logits + (long long)b * E, bias, s, c, lane);
        uint32_t cand = eligible_mask(c, lane);
        for (int j = 0; j < K0; j++) {
            int e = pick(c, cand, lane);
            if (e < 0) break; /* fewer eligible experts than K0: not reachable when valid */
            if (e % 32 == lane) cand &= ~(1u << (e / 32));
            if (lane == 0) {
                sel[j] = e;
                sm_base[e] = 1;
            }
            __syncwarp(0xFFFFFFFFu);
        }
    }
    __syncthreads();
    /* Phase 2: the best experts of S_base past each token's first K0, until K. */
    for (int b = w; b < B; b += NWARPS) {
        int n = b < num_valid ? route_token(logits + (long long)b * E, bias, sm_base, s, c, sel, lane) : 0;
        token_finish(s, sel, n, rsf, ids, weights, n_sel, b, lane);
        if (lane == 0)
            for (int j = 0; j < K; j++) sm_ids[b * K + j] = j < n ? sel[j] : -1;
        __syncwarp(0xFFFFFFFFu);
    }
    __syncthreads();
    dispatch(sm_ids, B, counts, offsets, active, n_active, perm, row_index, sm_base);
}

/* Plain top-k for big batches (K0 == K): a block's warps take tokens blockIdx.x*NWARPS + w,
 * stepping by the grid. The dispatch follows in route_dispatch. */
MJ_KERNEL void topk_route(const float *logits, const float *bias, int B, const int32_t *num_valid_p,
                          float rsf, int32_t *ids, float *weights, int32_t *n_sel) {
    const int num_valid = valid_rows(num_valid_p, B);
    MJ_SHARED float sm_s[NWARPS][E];
    MJ_SHARED float sm_c[NWARPS][E];
    MJ_SHARED int sm_sel[NWARPS][K];
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32;
    float *s = sm_s[w], *c = sm_c[w];
    int *sel = sm_sel[w];
    for (int b = (int)blockIdx.x * NWARPS + w; b < B; b += (int)gridDim.x * NWARPS) {
        int n = b < num_valid ? route_token(logits + (long long)b * E, bias, 0, s, c, sel, lane) : 0;
        token_finish(s, sel, n, rsf, ids, weights, n_sel, b, lane);
        __syncwarp(0xFFFFFFFFu);
    }
}

/* The dispatch metadata of ids [B, K], one block. */
MJ_KERNEL void route_dispatch(const int32_t *ids, int B, int32_t *counts, int32_t *offsets,
                              int32_t *active, int32_t *n_active, int32_t *perm,
                              int32_t *row_index) {
    MJ_SHARED int sm_cnt[E];
    dispatch(ids, B, counts, offsets, active, n_active, perm, row_index, sm_cnt);
}
