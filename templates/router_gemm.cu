/* router_gemm.cu — logits [B, E] f32 = hidden [B, H] bf16 x gate [E, H] bf16, at decode sizes.
 *
 * The gate weight (E*H bf16: 3 MB for GLM-5) is what this kernel reads; the hidden rows are
 * small and stay in cache. So a warp takes one expert and streams its gate row once, lane l
 * reading bf16 pairs l, l+32, ... as 32-bit words (a coalesced 128 B a step), against ROWS
 * hidden rows at a time; a shuffle tree sums the lanes. Fixed order: deterministic.
 */
MJ_TEMPLATE(router_gemm, "router GEMM: logits = hidden (bf16) x gate^T (bf16), fp32 accumulation")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_KNOB_RANGE(H, int, 64, 16384, "hidden size (a multiple of 64)")
MJ_KNOB_RANGE(E, int, 1, 1024, "routed experts")
MJ_KNOB_SET(ROWS, int, "1 2 4 8", "hidden rows a warp accumulates at once (the batch bucket, capped at 8)")
MJ_KNOB_SET(NWARPS, int, "1 2 4 8", "warps per block (experts per block)")

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

/* grid (ceil(E / NWARPS), ceil(B / ROWS)), block NWARPS * 32. */
MJ_KERNEL void router_gemm(const uint16_t *hidden, const uint16_t *gate, int B, float *logits) {
    const int lane = (int)threadIdx.x % 32;
    const int e = (int)blockIdx.x * NWARPS + (int)threadIdx.x / 32;
    const int r0 = (int)blockIdx.y * ROWS;
    if (e >= E) return; /* whole warps only: no collective below is split */
    const uint32_t *g = (const uint32_t *)(gate + (long long)e * H);
    float acc[ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    for (int p = lane; p < H / 2; p += 32) {
        uint32_t gw = g[p];
        float g0 = bf16_lo(gw), g1 = bf16_hi(gw);
        for (int r = 0; r < ROWS; r++) {
            if (r0 + r >= B) break;
            uint32_t xw = ((const uint32_t *)(hidden + (long long)(r0 + r) * H))[p];
            acc[r] += bf16_lo(xw) * g0;
            acc[r] += bf16_hi(xw) * g1;
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float v = acc[r];
        for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
        if (lane == 0 && r0 + r < B) logits[(long long)(r0 + r) * E + e] = v;
    }
}
