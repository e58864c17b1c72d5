/* router_gemm.cu — logits [B, E] f32 = hidden [B, H] bf16 x gate [E, H] bf16, at decode sizes.
 *
 * The gate (E*H bf16: 3 MB for GLM-5) is what this kernel costs; the hidden rows are small
 * and every block reads the same ones (L1/L2 hits). So the gate is streamed once, in
 * 16-byte loads, with all of it in flight at once, and the arithmetic waits on nothing else:
 *
 *   - a block takes one expert (blockIdx.x) and one tile of up to TILE = 64 hidden rows
 *     (blockIdx.y): a launch streams the gate once per tile, so once for B <= 64;
 *   - thread t of the block's NT = NWARPS * 32 holds the expert's 16-byte gate chunks t,
 *     t + NT, ... (CH of them, coalesced: a warp loads 512 contiguous bytes at a time),
 *     loaded through mj_ld_stream (non-coherent, not kept in L1: read once) before any
 *     arithmetic: a GLM-5 launch (256 blocks x 12 KB) has the whole gate in flight;
 *   - it walks the tile's rows ROWS at a time: per row and chunk, one 16-byte load of the
 *     hidden row and 8 fp32 products added in order into the row's register;
 *   - a group's ROWS partial sums are reduced across the warp by a fixed shuffle tree
 *     (each step halves the rows a lane carries, then xor steps finish), one lane per row
 *     writes the warp's sum to shared memory, and at the end thread r adds row r's NWARPS
 *     warp sums in warp order.
 * Every sum has one fixed order: the same bits on every run. No atomics.
 */
MJ_TEMPLATE(router_gemm, "router GEMM: logits = hidden (bf16) x gate^T (bf16), fp32 accumulation")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_PDL("each kernel waits on the grid before it, so it launches as its programmatic dependent on sm_90+")
MJ_KNOB_RANGE(H, int, 64, 16384, "hidden size (a multiple of 64)")
MJ_KNOB_RANGE(E, int, 1, 1024, "routed experts (one block each)")
MJ_KNOB_SET(ROWS, int, "1 2 4 8", "hidden rows accumulated at once in registers (the largest power of 2 <= B, capped at 8)")
MJ_KNOB_SET(NWARPS, int, "1 2 4 8", "warps per block: they split the expert's gate row")
MJ_CONSTRAINT("H % 64 == 0", "the gate row splits into 16-byte chunks of 8 bf16, 8 chunks per 128-byte line")
MJ_CONSTRAINT("H <= 2048 * NWARPS", "at most 8 gate chunks (32 registers, 64 as fp32) a thread: more warps for a wider row")
MJ_CONSTRAINT("(H / 8 + NWARPS * 32 - 1) / (NWARPS * 32) * ROWS <= 48", "at most 48 chunk-rows unrolled a group (registers, compile time): fewer rows for more chunks")

#define TILE 64                     /* hidden rows a block covers (gridDim.y = ceil(B / TILE)) */
#define NT (NWARPS * 32)            /* threads per block                                       */
#define CHUNKS (H / 8)              /* 16-byte chunks in a gate row                            */
#define CH ((CHUNKS + NT - 1) / NT) /* chunks a thread holds                                   */

MJ_DEVICE float bf16_lo(uint32_t w) {
    union { uint32_t u; float f; } v;
    v.u = w << 16;
    return v.f;
}

MJ_DEVICE float bf16_hi(uint32_t w) {
    union { uint32_t u; float f; } v;
    v.u = w & 0xFFFF0000u;
    return v.f;
}

/* Whether thread t's chunk i exists (always, when the row splits evenly). */
MJ_DEVICE int has_chunk(int t, int i) { return CHUNKS % NT == 0 || t + NT * i < CHUNKS; }

/* acc + the 8 products of a hidden chunk with the gate chunk g, in element order. */
MJ_DEVICE float dot8(uint4 x, const float *g, float acc) {
    acc += bf16_lo(x.x) * g[0];
    acc += bf16_hi(x.x) * g[1];
    acc += bf16_lo(x.y) * g[2];
    acc += bf16_hi(x.y) * g[3];
    acc += bf16_lo(x.z) * g[4];
    acc += bf16_hi(x.z) * g[5];
    acc += bf16_lo(x.w) * g[6];
    acc += bf16_hi(x.w) * g[7];
    return acc;
}

/* The warp's sums of ROWS values (v, clobbered): after the halving steps (offsets 16, 8, ..)
 * lane l carries one row, the xor steps finish it. Returns the sum of the lane's row;
 * *row gets that row (lanes l with l % (32 / ROWS) == 0 hold every row once). */
MJ_DEVICE float warp_sum_rows(float *v, int lane, int *row) {
    int off = 16, r = 0;
    for (int h = ROWS / 2; h >= 1; h /= 2, off /= 2) {
        const int up = (lane & off) != 0;
        for (int j = 0; j < h; j++) {
            float send = up ? v[j] : v[j + h], keep = up ? v[j + h] : v[j];
            v[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, off);
        }
        r += up ? h : 0;
    }
    for (; off >= 1; off /= 2) v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], off);
    *row = r;
    return v[0];
}

/* grid (E, ceil(B / TILE)), block NT threads; B >= ROWS; hidden and gate 16-byte aligned. */
MJ_KERNEL void router_gemm(const uint16_t *hidden, const uint16_t *gate, int B, float *logits) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
    MJ_SHARED float red[NWARPS][TILE];
    const int t = (int)threadIdx.x, lane = t % 32, w = t / 32, e = (int)blockIdx.x;
    const int row0 = (int)blockIdx.y * TILE, nrows = B - row0 < TILE ? B - row0 : TILE;
    const uint16_t *grow = gate + (long long)e * H;
    if (B < ROWS) __trap(); /* the launcher picks ROWS <= B: a group never reads past B */

    uint4 graw[CH]; /* every load issued before the first use */
    for (int i = 0; i < CH; i++)
        if (has_chunk(t, i)) graw[i] = mj_ld_stream(grow + (t + NT * i) * 8);
    float g[CH][8];
    for (int i = 0; i < CH; i++)
        if (has_chunk(t, i)) {
            g[i][0] = bf16_lo(graw[i].x), g[i][1] = bf16_hi(graw[i].x);
            g[i][2] = bf16_lo(graw[i].y), g[i][3] = bf16_hi(graw[i].y);
            g[i][4] = bf16_lo(graw[i].z), g[i][5] = bf16_hi(graw[i].z);
            g[i][6] = bf16_lo(graw[i].w), g[i][7] = bf16_hi(graw[i].w);
        }

    /* Groups of ROWS rows; the last one shifts back (and a tile's first one too, when the
     * tile is the batch's last and shorter than ROWS) so that every row it reads exists:
     * rows are computed twice, then, never read past B. The sum of a row does not depend
     * on where in its group it sits, so a row written twice is written the same. */
    for (int r0 = 0; r0 < nrows; r0 += ROWS) {
        const int ws = row0 + r0 < B - ROWS ? row0 + r0 : B - ROWS;
        const uint16_t *x0 = hidden + (long long)ws * H;
        float acc[ROWS];
        for (int j = 0; j < ROWS; j++) {
            const uint16_t *x = x0 + j * H;
            acc[j] = 0.0f;
            for (int i = 0; i < CH; i++)
                if (has_chunk(t, i)) acc[j] = dot8(*(const uint4 *)(x + (t + NT * i) * 8), g[i], acc[j]);
        }
        int jr;
        const float s = warp_sum_rows(acc, lane, &jr);
        const int tr = ws + jr - row0; /* the row's index in the tile */
        if (lane % (32 / ROWS) == 0 && tr >= r0 && tr < nrows) red[w][tr] = s;
    }
    __syncthreads();
    MJ_NO_UNROLL /* one or two trips: unrolled it would only cost compile time */
    for (int r = t; r < nrows; r += NT) {
        float v = red[0][r];
        for (int k = 1; k < NWARPS; k++) v += red[k][r];
        logits[(long long)(row0 + r) * E + e] = v;
    }
}
