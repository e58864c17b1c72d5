/* router_gemm.cu — logits [B, E] f32 = hidden [B, H] bf16 x gate [E, H] bf16, at decode sizes.
 *
 * The gate (E*H bf16: 3 MB for GLM-5) is what this kernel costs. It runs on the bf16 MMA
 * (m16n8k16, fp32 accumulation), swapped as the experts are: 16 experts are the MMA's rows,
 * 8 tokens its columns. So a gate byte costs a fraction of an instruction, and a block reads
 * its tokens' hidden rows only over its own part of H:
 *
 *   - a block takes 16 experts (blockIdx.x), one part of H (blockIdx.y, of KS = gridDim.y)
 *     and one tile of up to ROWS rows (blockIdx.z). The launcher splits H into KS parts
 *     when the tiles alone are too few to stream the gate with every SM (decode);
 *   - H is walked in runs of KCH chunks of 32 k. The part's runs are dealt to the block's
 *     warps in turn. For a run, lane (g, q) (g = lane / 4, q = lane % 4) loads the 16 bytes
 *     at k 8q of the gate rows g and g + 8 of each chunk, every load issued before the
 *     first MMA (mj_ld_stream: read once, not kept in L1): a GLM-5 decode launch has the
 *     whole gate in flight at once;
 *   - then per group of 8 rows, the lane loads the same 16 bytes of its token g's hidden
 *     row, and a chunk is 2 MMAs. The k order inside a chunk is permuted, the same way for
 *     both operands: fragment pair (2q, 2q + 1) holds k (8q, 8q + 1), pair (2q + 8, 2q + 9)
 *     holds k (8q + 2, 8q + 3), and the second MMA takes k 8q + 4 .. 8q + 7 likewise;
 *   - the warps' sums meet in shared memory and are added in warp order. With KS = 1 that
 *     is the logit. With KS > 1 each block writes its sums to the workspace (part), counts
 *     itself in on its tile's counter (count), and the last of the KS blocks adds the parts
 *     in part order (0, 1, ...: the same whichever block is last), writes the logits and
 *     sets the counter back to 0 for the next launch (a graph's replay).
 * Every sum has one fixed order: the same bits on every run of the same B (KS follows B, so
 * a token's logits may differ in the last bits between batch sizes). No floating-point atomics.
 */
MJ_TEMPLATE(router_gemm, "router GEMM: logits = hidden (bf16) x gate^T (bf16) on the bf16 MMA, fp32 accumulation")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_PDL("each kernel waits on the grid before it, so it launches as its programmatic dependent on sm_90+")
MJ_KNOB_RANGE(H, int, 64, 16384, "hidden size (a multiple of 64)")
MJ_KNOB_RANGE(E, int, 1, 1024, "routed experts (16 a block)")
MJ_KNOB_SET(ROWS, int, "8 16 32 64", "hidden rows a block covers, in groups of 8 (the MMA's N): the fewest groups that hold B, at most 64 rows (the gate streams once for B <= 64)")
MJ_KNOB_SET(NWARPS, int, "1 2 4 8", "warps per block: they take the block's runs of H in turn")
MJ_CONSTRAINT("H % 64 == 0", "the gate row splits into chunks of 32 k (64 bytes), a 16-byte load per lane and row")

#define NT (NWARPS * 32)               /* threads per block                              */
#define NGRP (ROWS / 8)                /* token groups a block covers                    */
#define KCH 4                          /* chunks of 32 k a run: 4 KiB of gate a warp     */
#define NCH (H / 32)                   /* chunks in a gate row                           */
#define NRUN ((NCH + KCH - 1) / KCH)   /* runs in a gate row (the last may be short)     */
#define RS 20                          /* a row's stride in red: the lanes' stores of one
                                        * fragment value (rows 2q, experts g) hit 32 banks */

/* grid (ceil(E / 16), KS, ceil(B / ROWS)), block NT threads; hidden and gate 16-byte
 * aligned; rpz the runs a part holds (the launcher's split: part z takes runs z rpz ..).
 * part: [ceil(B / ROWS)][ceil(E / 16)][KS][ROWS * 16] f32 and count: [ceil(B / ROWS)]
 * [ceil(E / 16)] u32 (0 before the first launch), both unused at KS 1. */
MJ_KERNEL void router_gemm(const uint16_t *hidden, const uint16_t *gate, int B, int rpz, float *logits,
                           float *part, uint32_t *count) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
    MJ_SHARED float red[NWARPS][ROWS * RS];
    MJ_SHARED int s_last;
    const unsigned t = threadIdx.x, lane = t % 32u; /* unsigned: shifts and masks */
    const int w = (int)(t / 32u), g = (int)(lane / 4u), q = (int)(lane % 4u);
    const int e0 = (int)blockIdx.x * 16, z = (int)blockIdx.y, ks = (int)gridDim.y;
    const int row0 = (int)blockIdx.z * ROWS, nrows = B - row0 < ROWS ? B - row0 : ROWS;
    const int r_lo = z * rpz, r_hi = r_lo + rpz < NRUN ? r_lo + rpz : NRUN; /* the part's runs */
    /* the lane's gate rows g and g + 8; past E the last row stands in (read, never written):
     * with E a multiple of 16 both come from one base (row g + 8 at a constant offset) */
    const int ea = E % 16 == 0 || e0 + g < E ? e0 + g : E - 1, eb = E % 16 == 0 || e0 + g + 8 < E ? e0 + g + 8 : E - 1;
    const uint16_t *ga = gate + (long long)ea * H + q * 8, *gb = gate + (long long)eb * H + q * 8;
    /* the lane's token g of each group, from the tile's first row; past B the tile's last
     * row stands in (read, never written) */
    const uint16_t *xt = hidden + (long long)row0 * H + q * 8;
    int xo[NGRP];
    for (int n = 0; n < NGRP; n++) xo[n] = (n * 8 + g < nrows ? n * 8 + g : nrows - 1) * H;

    float acc[NGRP][4];
    for (int n = 0; n < NGRP; n++)
        for (int i = 0; i < 4; i++) acc[n][i] = 0.0f;
    MJ_NO_UNROLL
    for (int run = r_lo + w; run < r_hi; run += NWARPS) {
        const int k0 = run * (KCH * 32);
        uint4 wa[KCH], wb[KCH]; /* rows g and g + 8 of the run's chunks, all in flight */
        MJ_UNROLL
        for (int c = 0; c < KCH; c++)
            if (NCH % KCH == 0 || run * KCH + c < NCH) {
                wa[c] = mj_ld_stream(ga + k0 + c * 32);
                wb[c] = mj_ld_stream(gb + k0 + c * 32);
            }
        MJ_UNROLL
        for (int n = 0; n < NGRP; n++) {
            if (n * 8 >= nrows) break; /* the block's rows end here (the same in every lane) */
            const uint16_t *x = xt + xo[n] + k0;
            uint4 xv[KCH];
            MJ_UNROLL
            for (int c = 0; c < KCH; c++)
                if (NCH % KCH == 0 || run * KCH + c < NCH) xv[c] = *(const uint4 *)(x + c * 32);
            MJ_UNROLL
            for (int c = 0; c < KCH; c++) {
                if (NCH % KCH != 0 && run * KCH + c >= NCH) break;
                const uint32_t a0[4] = {wa[c].x, wb[c].x, wa[c].y, wb[c].y}, b0[2] = {xv[c].x, xv[c].y};
                const uint32_t a1[4] = {wa[c].z, wb[c].z, wa[c].w, wb[c].w}, b1[2] = {xv[c].z, xv[c].w};
                mj_mma_bf16_m16n8k16(acc[n], a0, b0, acc[n]);
                mj_mma_bf16_m16n8k16(acc[n], a1, b1, acc[n]);
            }
        }
    }
    /* acc[n][i]: expert g (+8 for i >= 2), row n 8 + 2q (+1 for odd i) */
    for (int n = 0; n < NGRP; n++)
        for (int i = 0; i < 4; i++) red[w][(n * 8 + 2 * q + (i & 1)) * RS + g + 8 * (i >> 1)] = acc[n][i];
    __syncthreads();

    const int ne = E - e0 < 16 ? E - e0 : 16;
    const long long tile = (long long)blockIdx.z * gridDim.x + blockIdx.x;
    float *mine = part + (tile * ks + z) * (ROWS * 16);
    MJ_NO_UNROLL
    for (unsigned o = t; o < (unsigned)nrows * 16u; o += NT) {
        const unsigned ro = o / 16u * RS + o % 16u;
        float v = red[0][ro];
        for (int k = 1; k < NWARPS; k++) v += red[k][ro];
        if (ks == 1) {
            if (o % 16u < (unsigned)ne) logits[(long long)(row0 + (int)(o / 16u)) * E + e0 + (int)(o % 16u)] = v;
        } else {
            mine[o] = v;
        }
    }
    if (ks == 1) return;
    __threadfence(); /* this block's sums are visible to the block that adds them */
    __syncthreads();
    if (t == 0) s_last = atomicAdd(&count[tile], 1u) == (uint32_t)(ks - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    const float *parts = part + tile * ks * (ROWS * 16);
    MJ_NO_UNROLL
    for (unsigned o = t; o < (unsigned)nrows * 16u; o += NT) {
        float v = mj_ld_cg_f32(parts + o);
        MJ_NO_UNROLL
        for (int k = 1; k < ks; k++) v += mj_ld_cg_f32(parts + k * (ROWS * 16) + o);
        if (o % 16u < (unsigned)ne) logits[(long long)(row0 + (int)(o / 16u)) * E + e0 + (int)(o % 16u)] = v;
    }
    if (t == 0) count[tile] = 0u;
}
