/* moe_experts.cu — the experts of one rank's MoE layer: NVFP4 grouped GEMMs with SwiGLU and a
 * deterministic weighted combine, for decode first (and correct, if slower, for prefill).
 *
 * One forward is two launches (three in W4A4):
 *
 *   experts_quant  (W4A4 only) each valid token's hidden row quantized to NVFP4 once per
 *                  expert it goes to, with that expert's w13 input_scale, into row order;
 *   experts_up     block (tile t of 16 intermediate rows, slot): the slot's expert (an
 *                  active routed expert held here, or a shared sub-expert), its 16 gate and 16
 *                  up rows against its tokens; the block's warps split K (H) and add up in a
 *                  fixed order (at decode, STREAM, the grid's blocks instead take even runs
 *                  of the list of every tile's pieces of K, a tile's pieces then over
 *                  several blocks, and the last of them adds their sums in block order); SwiGLU; the activation
 *                  written as bf16 (W4A16) or requantized to NVFP4 with w2's input_scale (W4A4);
 *   experts_down   block (16 hidden dims, a tile of TPE tokens): its NW2 warps share the
 *                  active experts out. DEAL 1: by place in the list (warp w: entries w, w +
 *                  NW2, ..., the shared sub-experts as places after the list's), each writing
 *                  weight x (w2 . act) of a (token, expert) into that token's slot of the
 *                  block's tile (its top-k slot, or K + the shared sub-expert); then each
 *                  token's slots are added in slot order. DEAL 0 (where that tile does not
 *                  fit): by id (warp w: the ids w modulo NW2, ascending, then the shared
 *                  sub-experts w, w + NW2, ...), each adding into sums of its own; then the
 *                  warps' sums are added in warp order. The combine is fused and every
 *                  output element is summed in one fixed order that depends only on its
 *                  token's routing: the same inputs give the same bits, whatever else the
 *                  batch holds (no floating-point atomics: the one atomic counts a split up
 *                  tile's blocks in);
 *   (gated)        a shared expert with a sigmoid gate (Qwen2-MoE, Qwen3-Next: sgate, bf16
 *                  [H]): one up block (the first shared sub-expert's tile 0, split 0) also
 *                  writes each valid token's weight sgate_w[b] = sigmoid(x_b . sgate), and down
 *                  adds the shared sub-experts with it in place of 1;
 *   experts_silu   a check, not a step of the forward: silu against IEEE division, on the
 *                  interpreter (test_experts) and, compiled with PART 0, on a GPU.
 *
 * Compile time. NVRTC's time grows with the code it optimizes at once, and a first request
 * waits for it, so on a GPU each kernel is a specialization of its own (PART 1, 2, 3: the
 * other kernels are there with empty bodies, so a module always has all of them), compiled
 * apart and only when launched (W4A16 never compiles experts_quant); knobs a kernel does not read are
 * pinned (constraints below), so one compiled kernel serves every spec that differs only in
 * them. The interpreter builds them all at once (PART 0): one host compile.
 *
 * The MMA is swapped at decode: weight rows are its 16-row side (M), the few tokens of an
 * expert its 8-column side (N). W4A4 runs the block-scaled FP4 MMA m16n8k64 (sm_120a);
 * W4A16 dequantizes FP4 to bf16 in registers for the bf16 MMA m16n8k16 (every target). Both
 * stream the same packed weights, so one copy serves both modes (runtime/weights/pack.c
 * writes it from the ModelOpt tensors; below sm_120, W4A16 alone, each code word's bits are
 * placed for its dequantization: e2m1x8_bf16):
 *
 *   W13, one expert: for tile t (rows 16t.. of gate and of up), for k-step s (64 of H):
 *     +----------------------------+----------------------------+
 *     | gate: lane 0 .. lane 31     | up: lane 0 .. lane 31      |   1 KiB; lane L = 4g + p
 *     +----------------------------+----------------------------+   holds 16 bytes:
 *     a0 = row g,   k 64s + 8p .. +7        a1 = row g+8, same k     (each a u32 of 8 FP4
 *     a2 = row g,   k 64s + 32 + 8p .. +7   a3 = row g+8, same k      codes, natural order)
 *   which are exactly the A fragment of m16n8k64, and (split in four) of four m16n8k16.
 *   S13, one expert: for tile t, for run m of 4 k-steps (256 of H): gate rows 0..15 then up
 *     rows 0..15, 16 bytes each = the row's scales of k-groups 16m .. 16m+15 (0 past H/16).
 *   W2 / S2 the same with rows = 16 hidden dims (tile d), k = the intermediate (I).
 * Every warp load of weights is 512 contiguous bytes, 16 per lane, through cp.async into a
 * ring in shared memory of the warp's own (mj_cp_async16).
 *
 * Rows. Route rows (token, slot) are grouped by expert (expert_offsets, expert_counts) and
 * row_index[r] = token * K + slot. Activations live in row order: routed rows r in
 * [0, MB K), shared sub-expert j's rows at MB K + j MB + token (MB: the workspace's batch).
 * The W4A4 quantized input of routed row r is at row r; of the shared experts at MB K + token.
 */
MJ_TEMPLATE(moe_experts, "NVFP4 expert GEMMs: up (w13) + SwiGLU, down (w2) + weighted combine + shared expert")
MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
MJ_PDL("each kernel waits on the grid before it, so it launches as its programmatic dependent on sm_90+ (route -> quant -> up -> down: a kernel's blocks are resident while the one before finishes)")
MJ_KNOB_SET(MODE, int, "0 1", "0: W4A16 (bf16 activations, bf16 MMA), 1: W4A4 (NVFP4 activations, FP4 MMA)")
MJ_KNOB_RANGE(H, int, 64, 16384, "hidden size (K of up, N of down)")
MJ_KNOB_RANGE(I, int, 64, 8192, "one expert's intermediate rows held here (I_local)")
MJ_KNOB_RANGE(K, int, 1, 16, "experts per token (top-k)")
MJ_KNOB_SET(TPE, int, "8 16 32 64", "tokens an expert takes at once, and the token tile of down")
MJ_KNOB_SET(NW1, int, "1 2 4 8 16", "warps of an up block: they split H")
MJ_KNOB_SET(NW2, int, "1 2 4 8", "warps of a down block: they deal its 16 hidden dims' experts among them")
MJ_KNOB_RANGE(NSUB, int, 0, 8, "shared sub-experts of I rows each (the shared expert, split)")
MJ_KNOB_SET(PART, int, "0 1 2 3", "kernels with a body: 0 all (the interpreter's), 1 experts_quant, 2 experts_up, 3 experts_down")
MJ_KNOB_SET(STREAM, int, "0 1", "1: up's blocks (the grid the GPU holds at once) each take an even run of the list of the tiles' pieces of H (TPE 8: one chunk a tile); a tile's pieces over several blocks meet in the workspace, and the last block to finish adds their sums in block order")
MJ_KNOB_SET(DSTEPS, int, "2 4", "k-steps of w2 an item of down brings: 4 (a scale run), or 2 (half the ring's shared memory, so more blocks fit an SM)")
MJ_KNOB_SET(DEAL, int, "0 1", "down's experts to its warps: 0 by id, each warp's sums its own, added in warp order; 1 by place in the active list (even shares), each (token, expert) a slot of the block's tile, added in slot order")
MJ_KNOB_SET(QG, int, "2 8", "experts_quant's threads a 16-value group: 2 (8 values a thread) or 8 (2 values a thread: a shorter chain where few tokens leave SMs idle; each thread repeats the group's scale)")
MJ_CONSTRAINT("MODE == 0 || SM >= 120", "W4A4 needs the block-scaled FP4 MMA of sm_120a / sm_121a")
MJ_CONSTRAINT("H % 64 == 0 && I % 64 == 0", "H and I are whole k-steps of 64")
MJ_CONSTRAINT("NW1 * 6 * 1024 <= 64 * 1024", "up's weight rings (6 KiB a warp) fit shared memory")
MJ_CONSTRAINT("TPE <= 16 || NW1 * (6 * 1024 + TPE * 128) + TPE * 4 <= 64 * 1024", "past two token groups, up's rings and its sums (TPE * 128 bytes a warp) fit shared memory")
MJ_CONSTRAINT("NW2 * (TPE * 64 * ((TPE > 8 && I > 64 * DSTEPS) + 1 - DEAL) + 3 * (DSTEPS * 512 + 256 + 32 + 32 * (TPE == 16))) + DEAL * TPE * (K + NSUB) * 64 <= 64 * 1024 + 16 * 1024 * (SM == 90 || SM == 100)", "down's fragments, weight rings and sums (the warps' or the slot tile) fit shared memory (three blocks an SM of 228 KiB on sm_90a and sm_100a)")
MJ_CONSTRAINT("PART == 0 || PART == 3 || DEAL == 0", "only experts_down reads DEAL: 0 elsewhere")
MJ_CONSTRAINT("PART == 0 || PART == 1 || QG == 2", "only experts_quant reads QG: 2 elsewhere")
MJ_CONSTRAINT("PART != 1 || (MODE == 1 && TPE == 8 && NW1 == 1 && NW2 == 1)", "experts_quant is W4A4's alone and has no tile or warps to choose: TPE 8, NW1 1, NW2 1")
MJ_CONSTRAINT("PART != 2 || NW2 == 1", "experts_up has no down warps to choose: NW2 1")
MJ_CONSTRAINT("PART == 0 || PART == 3 || DSTEPS == 4", "only experts_down reads DSTEPS: 4 elsewhere")
MJ_CONSTRAINT("PART == 0 || PART == 2 || STREAM == 0", "only experts_up reads STREAM: 0 elsewhere")
MJ_CONSTRAINT("STREAM == 0 || TPE == 8", "up's runs of pieces hold one chunk of at most 8 tokens a tile: TPE 8")
MJ_CONSTRAINT("PART != 3 || NW1 == 1", "experts_down has no up warps to choose: NW1 1")

#define NT (TPE / 8)                  /* token groups of 8 (the MMA's N)                     */
#define NSLOT (K + NSUB)              /* down's slots a token: its top-k, its shared sub-experts */
#define DTILE (DEAL ? TPE * NSLOT * 16 : NW2 * TPE * 16) /* down's sums: floats of the block's */
#define KS1 (H / 64)                  /* k-steps of up                                       */
#define KS2 (I / 64)                  /* k-steps of down                                     */
#define RUNS1 ((KS1 + 3) / 4)         /* runs of 4 k-steps: one scale chunk each             */
#define RUNS2 ((KS2 + 3) / 4)
#define DPARTS ((KS2 + DSTEPS - 1) / DSTEPS) /* down's items an expert (16 rows): DSTEPS k-steps each */
#define DWHOLE (DPARTS == 1)          /* an item of down is a whole expert (16 rows, all of I)  */
/* down's fragments: floats a warp, where an expert's sums of several token groups wait for
 * its next part; none for one token group (registers) or a whole expert an item (its groups
 * one at a time, each in registers from its MMAs to its epilogue) */
#define DFRAG (NT > 1 && !DWHOLE ? TPE * 16 : 0)
#define W13_TILE ((long long)KS1 * 1024)
#define S13_TILE ((long long)RUNS1 * 512)
#define W2_TILE ((long long)KS2 * 512)
#define S2_TILE ((long long)RUNS2 * 256)
#define W13_EXPERT ((long long)(I / 16) * W13_TILE)
#define S13_EXPERT ((long long)(I / 16) * S13_TILE)
#define W2_EXPERT ((long long)(H / 16) * W2_TILE)
#define S2_EXPERT ((long long)(H / 16) * S2_TILE)
/* scal: SCAL floats an expert (runtime/experts.c writes them): w13's weight_scale_2 and
 * input_scale, w2's, then 1 / w13's input_scale and 1 / w2's (the quantizers' global
 * scales, divided once on the host as the reference divides them: no reciprocal's slow path
 * in a kernel), 2 unused. */
#define SCAL 8

/* A helper ptxas compiles as a function of its own (called, not inlined): code one block of a
 * launch runs (the shared expert's gate: *_once) or its first threads (up's prefetch: *_few),
 * kept out of the kernel's body; the performance model (tools/predict.c) leaves a subroutine
 * of those kinds out of a warp's count. */
#ifdef __CUDACC_RTC__
#define MJ_NOINLINE static __device__ __noinline__
#else
#define MJ_NOINLINE MJ_DEVICE
#endif

/* ---- NVFP4 helpers ------------------------------------------------------------------------ */


/* The largest magnitude of n values v[0], v[stride], ... (a NaN never wins). */
MJ_DEVICE float quant_amax(const float *v, int stride, int n) {
    float amax = 0.0f;
    MJ_NO_UNROLL
    for (int j = 0; j < n; j++) {
        float a = v[j * stride] < 0.0f ? -v[j * stride] : v[j * stride];
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* The E2M1 codes of n values (n even, at most 16; v, stride apart) of a group whose scale is
 * `scale` (0: every code 0), value j's in nibble j of *lo (j < 8) or nibble j - 8 of *hi;
 * q = e2m1(x * gs / scale). */
MJ_DEVICE void quant_codes(const float *v, int stride, int n, float gs, float scale, uint32_t *lo, uint32_t *hi) {
    uint32_t l = 0, h = 0;
    MJ_NO_UNROLL
    for (int j = 0; j < n; j += 2) {
        uint32_t c = scale == 0.0f ? 0u : mj_cvt_e2m1x2((v[j * stride] * gs) / scale, (v[(j + 1) * stride] * gs) / scale);
        if (j < 8) l |= c << (4 * j);
        else h |= c << (4 * (j - 8));
    }
    *lo = l, *hi = h;
}

/* 16 values (v[0], v[stride], ..., in shared memory) -> NVFP4 with global scale gs: the
 * scale byte, and the 8 bytes of codes as two words (codes 0-7, 8-15; code j in nibble j),
 * as mj_nvfp4_quantize_act does (SF = e4m3(gs * amax / 6), q = e2m1(x * gs / SF)). Both
 * loops stay rolled: the divisions are IEEE (as the reference's), each a call-sized
 * sequence, and one copy of them compiles in a fraction of the time of sixteen. */
MJ_DEVICE uint32_t quant16(const float *v, int stride, float gs, uint32_t *w0, uint32_t *w1) {
    const uint32_t sf = mj_cvt_e4m3(gs * quant_amax(v, stride, 16) / 6.0f);
    quant_codes(v, stride, 16, gs, mj_e4m3_dec_c(sf), w0, w1);
    return sf;
}

/* Quantized activations (the W4A4 input of up and of down) are stored in fragment order:
 * each 64-element step is 32 bytes, lane p's B fragment (b0: elements 8p..8p+7, b1:
 * 32+8p..) side by side at byte 8p, so a lane loads its 8 bytes at once. Natural u32 word wi
 * of a step (elements 8wi..8wi+7) lives at word (wi < 4 ? 2wi : 2(wi - 4) + 1). */
MJ_DEVICE int frag_word(int wi) { return wi < 4 ? 2 * wi : 2 * (wi - 4) + 1; }

/* Where word h (codes 8h .. 8h + 7) of 16-element group grp of a row lives, in fragment order. */
MJ_DEVICE uint32_t *q16_word(uint8_t *row, int grp, int h) {
    return (uint32_t *)(row + 32 * (grp / 4) + 4 * frag_word(2 * (grp % 4) + h));
}

/* Store the codes of 16-element group grp of a row (quant16's two words), in fragment order. */
MJ_DEVICE void store_q16(uint8_t *row, int grp, uint32_t w0, uint32_t w1) {
    *q16_word(row, grp, 0) = w0;
    *q16_word(row, grp, 1) = w1;
}

/* W4A16's dequantization works in units of 2^-7: a weight's bf16 is its code's value times
 * its block scale times 2^-7 (exact: at most 6 significant bits, and at least 2^-17), so the
 * MMAs' sums are the true ones times 2^-7, exactly (a power of two), and the epilogues
 * multiply them by DQ_UNIT before anything else. That is what lets the codes' bits go
 * straight into place below, with no table. */
#define DQ_UNIT (MODE == 0 ? 128.0f : 1.0f)

/* Eight E2M1 codes as bf16 pairs times sc (a bf16 pair, both halves the block scale times
 * 2^119): pair q holds codes 2q (low half) and 2q + 1. A code's exponent and mantissa bits
 * (e1 e0 m) go to a bf16's two lowest exponent bits and its top mantissa bit (bits 8 7 6 of
 * its half), its sign to the sign (bit 15): that bf16 is the code's value times 2^-126,
 * exactly, for all 16 codes (the exponent-0 codes 0 and 0.5 become bf16 subnormals, which
 * the bf16 multiply keeps), and times sc it is value x scale x 2^-7.
 *
 * Below sm_120 (W4A16 alone) the packed words are bit-placed (runtime/weights/pack.c,
 * mj_pack_place_word): pairs 0 .. 2 are one shift and a mask each, pair 3 a shift, a mask,
 * a multiply by 1 + 2^5 + 2^11 (three copies that share no bit) and a mask; with the
 * scale's multiply, 2 to 5 instructions a pair (a left shift can be an IMAD, which Hopper
 * issues to its FMA pipe, not its ALU: 6 ALU instructions a word of 4 pairs). On sm_120a / sm_121a the
 * words are the codes as W4A4's MMA reads them (code j in nibble j): a byte permute puts
 * codes 2q and 2q + 1 at bits 0 and 16, a mask clears the rest, one multiply by 2^6 + 2^12
 * moves the magnitude bits by 6 and the sign bit by 12 at once (the two shifted copies
 * share no bit), a mask keeps those: 5 instructions a pair, with the scale's multiply. */
#define DQ_MASK 0x81C081C0u
#if MJ_TARGET_SM < 120
MJ_DEVICE void e2m1x8_bf16(uint32_t w, uint32_t sc, uint32_t r[4]) {
    r[0] = mj_mul_bf16x2((w << 6) & DQ_MASK, sc);
    r[1] = mj_mul_bf16x2((w << 3) & DQ_MASK, sc);
    r[2] = mj_mul_bf16x2(w & DQ_MASK, sc);
    r[3] = mj_mul_bf16x2(((w >> 7) & 0x00D800D8u) * 0x821u & DQ_MASK, sc);
}
#else
MJ_DEVICE void e2m1x8_bf16(uint32_t w, uint32_t sc, uint32_t r[4]) {
    const uint32_t w4 = w >> 4;
    MJ_UNROLL
    for (int q = 0; q < 4; q++) {
        const uint32_t t = __byte_perm(w, w4, 0x4400u + 0x1111u * (uint32_t)q) & 0x000F000Fu;
        r[q] = mj_mul_bf16x2((t * 0x1040u) & DQ_MASK, sc);
    }
}
#endif

MJ_DEVICE uint32_t bf16_bits(float x) { /* round to nearest even; x finite */
    uint32_t u = mj_f32_bits(x);
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* silu(x) = x / (1 + e^-x), the division correctly rounded without a division instruction:
 * ptxas compiles an IEEE division with a slow path of about 100 SASS instructions (of W4A16's
 * up, the one division), up to 7 % of the whole compile. d = 1 + e^-x is 1 (x above about
 * 16.6, and +inf), 2 (|x| below 2^-25, subnormals and zeros too), inf (x at most about -88.7)
 * or in between. The ends are exact in one step (x / 2 for every |x| below 2^-25, so no
 * quotient here is ever subnormal, whatever a GPU's expf gives for a tiny x); the rest takes
 * a reciprocal (a bit trick, then three Newton steps: within an ulp), a quotient corrected
 * once by its remainder (within an ulp), and then whichever of it and its neighbour toward
 * the remainder leaves the smaller exact remainder (fma: exact for a normal quotient within
 * an ulp), ties to the even one. From d = 2^64 on, both are scaled by 2^-64 (exact), so the
 * reciprocal stays normal. With the C library's expf, every float x gives the bits of
 * x / (1.0f + expf(-x)) (all 2^32: MOEJIT_TEST_SILU_STRIDE=1 test_experts); experts_silu
 * checks it against the division where it runs. W4A4 keeps the division: its requantization
 * divides too, so its up compiles the slow path anyway. */
MJ_DEVICE float silu(float x) {
    float d = 1.0f + expf(-x);
    if (MODE == 1) return x / d; /* W4A4's requantization divides anyway: its slow path is there */
    if (d == 1.0f) return x;
    /* |x| < 2^-25: d is 2 with a correctly rounded expf; where a GPU's is not, x / 2 is
     * still within an ulp, and no subnormal quotient reaches the steps below */
    if ((x < 0.0f ? -x : x) < 0x1p-25f) return x * 0.5f;
    if (!(d <= 0x1.fffffep+127f)) return x * 0.0f; /* d inf: -0 (x -inf: NaN); x NaN: NaN */
    if (d >= 0x1p64f) x *= 0x1p-64f, d *= 0x1p-64f;
    float y = mj_f32_from_bits(0x7EF311C3u - mj_f32_bits(d));
    MJ_NO_UNROLL
    for (int i = 0; i < 3; i++) y = fmaf(fmaf(-d, y, 1.0f), y, y);
    float q = x * y;
    q = fmaf(fmaf(-q, d, x), y, q);
    const float r = fmaf(-q, d, x);
    if (r == 0.0f) return q;
    const uint32_t qb = mj_f32_bits(q), nb = (r > 0.0f) == (q > 0.0f) ? qb + 1u : qb - 1u;
    const float rn = fmaf(-mj_f32_from_bits(nb), d, x);
    const float ar = r < 0.0f ? -r : r, an = rn < 0.0f ? -rn : rn;
    return an < ar || (an == ar && !(nb & 1u)) ? mj_f32_from_bits(nb) : q;
}

/* The real token count (read on every launch: a CUDA graph replays with the count of now). */
MJ_DEVICE int valid_tokens(const int32_t *num_valid, int B) {
    if (!num_valid) return B;
    int v = num_valid[0];
    return v < 0 ? 0 : v > B ? B : v;
}

/* ---- fragments ---------------------------------------------------------------------------- */

/* The UE4M3 scales in bytes q and q + 2 of w (a lane's k-groups in the two halves of a
 * k-step: q = p / 2), each times 2^119, as one bf16 pair (byte q's low; exact: an E4M3 has 4
 * significant bits, and 448 x 2^119 < 2^128). A byte's exponent and mantissa go where a
 * bf16's low exponent and top mantissa bits are (an E4M3 is a float of bias 7, not 127):
 * that bf16 is the value times 2^-120, for the exponent-0 scales too (as bf16 subnormals,
 * which the bf16 multiply keeps; zero stays zero), and two multiplies, by 2^120 and by
 * 2^119, make it what e2m1x8_bf16 takes. A block scale's sign bit is 0 (the checkpoint
 * loader and mj_experts_adopt refuse any other byte, by mj_nvfp4_scale_bad: runtime/ref/
 * nvfp4.c), so a byte permute to bits 0 and 16 and one left shift place both, which the
 * compiler can issue as an IMAD to Hopper's FMA pipes: 4 instructions for both halves'
 * scales, 1 of them on the ALU (the sign's own mask and merge had been 3 more there). A sign
 * bit here would land in the bf16's exponent (2^16 times the scale: Inf after the
 * multiplies), not make the scale negative. */
MJ_DEVICE uint32_t e4m3x2_bf16(uint32_t w, int q) {
    const uint32_t t = __byte_perm(w, 0u, 0x4240u + 0x101u * (uint32_t)q); /* bytes q, q + 2 at bits 0, 16 (q 0 or 1) */
    return mj_mul_bf16x2(mj_mul_bf16x2(t << 4, 0x7B807B80u /* 2^120 */), 0x7B007B00u /* 2^119 */);
}

/* Half hf of a bf16 pair, in both halves. */
MJ_DEVICE uint32_t bf16_bcast(uint32_t v, int hf) { return __byte_perm(v, 0u, 0x1010u + 0x2222u * (uint32_t)hf); }

/* W4A16, half hf of a k-step (m16n8k16 steps 2hf and 2hf + 1, k 32hf .. of the step): the
 * A fragments (in units of 2^-7, DQ_UNIT) from this lane's words w (row g: w.x, row g + 8:
 * w.y; k 32hf + 8p ..: words 2hf and 2hf + 1 of the m16n8k64 fragment), dequantized with
 * row g's scale pair sp and row g + 8's sp8 (e4m3x2_bf16 of the step's scale words: half hf
 * is this half's). Step kk takes codes 4kk .. 4kk + 3 of the words (bytes 2kk and 2kk + 1,
 * or below sm_120 where e2m1x8_bf16's placement puts them). */
MJ_DEVICE void dequant_half(uint2 w, uint32_t sp, uint32_t sp8, int hf, uint32_t a[2][4]) {
    uint32_t u[4], v[4];
    e2m1x8_bf16(w.x, bf16_bcast(sp, hf), u);
    e2m1x8_bf16(w.y, bf16_bcast(sp8, hf), v);
    MJ_UNROLL
    for (int kk = 0; kk < 2; kk++) a[kk][0] = u[2 * kk], a[kk][1] = v[2 * kk], a[kk][2] = u[2 * kk + 1], a[kk][3] = v[2 * kk + 1];
}

/* W4A16: the four m16n8k16 A fragments hidden in one m16n8k64 fragment w (lane (g, p) holds
 * k 8p .. 8p + 7 in words a0 / a1 and 32 + 8p .. in a2 / a3): its two halves, with row g's
 * scale word sg and row g + 8's sg8 (byte q: k-group 4s + q of the step). */
MJ_DEVICE void dequant_frag(uint4 w, uint32_t sg, uint32_t sg8, int p, uint32_t a[4][4]) {
    const uint32_t sp = e4m3x2_bf16(sg, p >> 1), sp8 = e4m3x2_bf16(sg8, p >> 1);
    dequant_half(make_uint2(w.x, w.y), sp, sp8, 0, a);
    dequant_half(make_uint2(w.z, w.w), sp, sp8, 1, a + 2);
}

/* W4A16 B fragments of half hf of a k-step from a bf16 row (k 64s + 32hf + 8p ..): step kk
 * takes pairs (2kk, 2kk + 1) of the 16 bytes. */
MJ_DEVICE void bf16_bhalf(const uint16_t *row, int s, int hf, int p, uint32_t b[2][2]) {
    const uint4 v = *(const uint4 *)(row + 64 * s + 32 * hf + 8 * p);
    b[0][0] = v.x, b[0][1] = v.y, b[1][0] = v.z, b[1][1] = v.w;
}

/* W4A16 B fragments of a whole k-step: its two halves. */
MJ_DEVICE void bf16_bfrag(const uint16_t *row, int s, int p, uint32_t b[4][2]) {
    bf16_bhalf(row, s, 0, p, b);
    bf16_bhalf(row, s, 1, p, b + 2);
}

/* W4A4 B fragment of k-step s from an NVFP4 row of KD elements in fragment order (lane p's 8
 * bytes of the step) and, lane p == 0, its scale word; zeros for src < 0 (no token). */
MJ_DEVICE void fp4_bfrag(const uint8_t *xq, const uint8_t *xsf, long long src, int KD, int s, int p, uint32_t bq[2],
                         uint32_t *sfb) {
    bq[0] = bq[1] = 0, *sfb = 0;
    if (src < 0) return;
    const uint2 v = *(const uint2 *)(xq + src * (KD / 2) + 32 * s + 8 * p);
    bq[0] = v.x, bq[1] = v.y;
    if (p == 0) *sfb = *(const uint32_t *)(xsf + src * (KD / 16) + 4 * s);
}

/* ---- experts_quant (W4A4) --------------------------------------------------------------------
 * grid (B, K + 1, ceil(H / 16 / (QT / QG))), block QT, dynamic shared memory QT x 16 / QG
 * floats: block (b, j, c) quantizes the c-th QT / QG 16-element groups of token b's hidden
 * row for its j-th expert (j < K: with that expert's input scale, into its route row, if the
 * expert is held here) or, j = K, for the shared experts (row MB K + b). QG threads a group
 * (QV = 16 / QG values each: each value's quantization is a chain of an IEEE division and a
 * conversion), so even one token's K + 1 rows spread over many SMs and a thread's chain is a
 * QG-th of a group's: the group's largest magnitude meets by log2(QG) shuffles (a max: exact,
 * in any order), each thread codes its values with quant16's arithmetic into its nibbles of
 * the group's word (w0: the first 8 values, w1: the last 8), and the QG / 2 threads of a word
 * OR their parts together. More threads a group repeat its scale's chain each: QG 2 where the
 * tokens fill the GPU (by the model 4 took B 32 from 3.2 to 3.9 us on the RTX PRO 6000), 8 at
 * TPE 8 (runtime/experts.c). */
#define QT 64
#define QV (16 / QG) /* values a thread */

/* The group's scale byte and the word (w0 or w1 of quant16) holding the lane's QV values of
 * it, v stride apart (the group's other values held by its other QG - 1 lanes, every lane of
 * the warp calling this): lane h of the group holds values h QV .. h QV + QV - 1. */
MJ_DEVICE uint32_t quant_part(const float *v, int stride, float gs, int h, uint32_t *w) {
    float amax = quant_amax(v, stride, QV);
    for (int m = 1; m < QG; m <<= 1) {
        const float o = __shfl_xor_sync(0xFFFFFFFFu, amax, m);
        amax = o > amax ? o : amax;
    }
    const uint32_t sf = mj_cvt_e4m3(gs * amax / 6.0f);
    uint32_t lo, none;
    quant_codes(v, stride, QV, gs, mj_e4m3_dec_c(sf), &lo, &none);
    uint32_t word = lo << (4 * ((h * QV) % 8)); /* its nibbles of its word */
    for (int m = 1; m < QG / 2; m <<= 1) word |= (uint32_t)__shfl_xor_sync(0xFFFFFFFFu, word, m);
    *w = word;
    return sf;
}

MJ_KERNEL void experts_quant(const uint16_t *x, const float *scal, const int32_t *ids, const int32_t *perm,
                             int B, const int32_t *num_valid, int mb, int n_local, int expert_begin,
                             uint8_t *xq, uint8_t *xsf) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
#if PART == 0 || PART == 1 /* else an empty kernel: this specialization compiles another */
    MJ_DYNAMIC_SHARED(float, vbuf); /* the values quant_part reads: [QV][QT threads] */
    const int b = (int)blockIdx.x, j = (int)blockIdx.y;
    if (MODE == 0 || b >= valid_tokens(num_valid, B)) return; /* W4A16 never launches it */
    const uint16_t *xr = x + (long long)b * H;
    {
        int row, xi;
        if (j < K) {
            int e = ids[b * K + j];
            xi = e - expert_begin;
            if (e < 0 || xi < 0 || xi >= n_local) return;
            row = perm[b * K + j];
        } else {
            if (NSUB == 0) return;
            xi = n_local;
            row = mb * K + b;
        }
        const float gs = scal[xi * SCAL + 4];
        const int h = (int)threadIdx.x % QG; /* the lane's part of its group */
        /* the block's groups, QT / QG at a time: every lane takes part in each round (the
         * group's shuffles), those past the row's groups on zeros, writing nothing */
        for (int g0 = (int)blockIdx.z * (QT / QG); g0 < H / 16; g0 += (int)gridDim.z * (QT / QG)) {
            const int grp = g0 + (int)threadIdx.x / QG, live = grp < H / 16;
            float *v = vbuf + threadIdx.x; /* this thread's QV values, QT floats apart */
            for (int i = 0; i < QV; i++)
                v[i * QT] = live ? mj_f32_from_bits((uint32_t)xr[grp * 16 + h * QV + i] << 16) : 0.0f;
            uint32_t w;
            const uint32_t sf = quant_part(v, QT, gs, h, &w);
            if (!live) continue;
            if (h == 0) xsf[(long long)row * (H / 16) + grp] = (uint8_t)sf;
            if (h % (QG / 2) == 0) *q16_word(xq + (long long)row * (H / 2), grp, h / (QG / 2)) = w;
        }
    }
#endif
}

/* ---- experts_up --------------------------------------------------------------------------- */

/* Which rows a block (or warp) works on: an active routed expert's (off .. off + n) or the
 * valid tokens for a shared sub-expert. xi: the expert's index in the packed arrays. */
typedef struct rows_t {
    int xi, shared, off, n;
} rows_t;

MJ_DEVICE rows_t slot_rows(int slot, int n_slots, const int32_t *counts, const int32_t *offsets,
                           const int32_t *active, const int32_t *n_active, int n_local, int expert_begin,
                           int nv) {
    rows_t r = {-1, 0, 0, 0};
    if (slot < n_slots) {
        if (slot >= n_active[0]) return r;
        int e = active[slot];
        if (e < 0 || e - expert_begin < 0 || e - expert_begin >= n_local) return r;
        r.xi = e - expert_begin, r.off = offsets[e], r.n = counts[e];
    } else {
        r.xi = n_local + (slot - n_slots), r.shared = 1, r.n = nv;
    }
    return r;
}

/* The activation row token i of a slot's rows reads: W4A16 the hidden row (its token),
 * W4A4 its quantized input (the route row, or for the shared experts MB K + token). */
MJ_DEVICE long long src_row(const rows_t *rs, int i, const int32_t *row_index, int mb) {
    if (MODE == 0) return rs->shared ? i : row_index[rs->off + i] / K;
    return rs->shared ? (long long)mb * K + i : rs->off + i;
}

/* The row of act / actq up writes for token i of a slot's rows (down reads it back): the
 * route row, or shared sub-expert j's rows at MB K + j MB + token. */
MJ_DEVICE long long act_row(const rows_t *rs, int i, int mb, int n_local) {
    return rs->shared ? (long long)mb * K + (long long)(rs->xi - n_local) * mb + i : rs->off + i;
}

/* The pieces of a tile's k-steps are dealt to its block's NW1 warps in turn (warp w: pieces w,
 * w + NW1, ...), or with STREAM taken in runs by the grid's warps. A piece is a run of 4
 * k-steps (one scale chunk of the weights' layout) where the runs deal evenly to the warps, else
 * half a run (SPP 2); with STREAM half-runs, the finer grain the runs are cut at (GLM-5's 24
 * runs a tile are 48 pieces). */
/* k-steps a piece: half-runs where they deal better, and every run's halves hold a k-step
 * (H / 64 = 1 or 2 modulo 4 would leave the last run's second half of scale bytes, padding,
 * unread: the byte-once accounting counts the packed chunk whole) */
#define SPP ((STREAM || RUNS1 % NW1 != 0) && KS1 % 4 != 1 && KS1 % 4 != 2 ? 2 : 4)
#define PIECES1 ((KS1 + SPP - 1) / SPP) /* a tile's pieces (the last may be short)           */
#define SCHUNK (SPP * 128)              /* a piece's scale chunk in the ring: [gate, up][16 rows][SPP k-steps][4 groups] */
/* The scale word of (gate 0 / up 1) h, row r and step q of the piece in its chunk at c (the
 * pointer moved a term at a time: ptxas then shares the row's part between a step's reads,
 * where one sum of the offsets cost up's loop 5 to 7 instructions). */
#define SPTR(c, h, r, q) ((c) + (h) * (SPP * 64) + (r) * (SPP * 4) + 4 * (q))

/* An up warp streams its k-steps (those of its pieces, whose scale chunk serves the piece's
 * steps) through a ring in shared memory, its own: RING slots of one step's gate and up
 * fragments (1 KiB; each lane's 16 bytes where it reads them back) and RUNRING pieces' scale
 * chunks (1 KiB in all). cp.async keeps RING - 1 = 4 steps in flight while one computes (4 KiB
 * a warp, what the register prefetch of a run used to hold), and a slot is refilled only after
 * the step that read it (a piece's scales after its last step: the step issued while step j
 * computes is 4 on, so the pieces of steps j .. j + 4 are 2 with runs (RUNRING 2), 3 with
 * half-runs (RUNRING 4)). So the step loop is one rolled copy of a step's code, with no
 * register copies or selects between steps, and the bytes in flight take shared memory, not
 * registers (up's registers about halve). */
#define RING 5
#define RUNRING (SPP == 4 ? 2 : 4)
#define RING_BYTES (RING * 1024 + RUNRING * SCHUNK)

/* Queue the copies of k-step s into ring slot `slot` (and, at a piece's first step, the
 * piece's scale chunk into scale slot `sslot`), as a group of its own (an empty one when the warp's
 * sequence has ended, !live: the wait counts groups). The loop keeps s and the slots as
 * cursors, so a step's copies cost no division. */
MJ_DEVICE void up_issue(uint8_t *ring, const uint8_t *wt, const uint8_t *st, uint32_t s, uint32_t slot, uint32_t sslot,
                        int first, int live, int lane) {
    const uint32_t g = (uint32_t)lane >> 2, p = (uint32_t)lane & 3u;
    if (live) {
        if (s < KS1) {
            uint8_t *dst = ring + slot * 1024u + (uint32_t)lane * 16u;
            const uint8_t *src = wt + (s * 1024u + (uint32_t)lane * 16u);
            mj_cp_async16(dst, src);
            mj_cp_async16(dst + 512, src + 512);
        }
        if (SPP == 4 && first && p < 2) { /* a run's first step brings its scales: rows g + 8p */
            uint8_t *sr = ring + RING * 1024 + sslot * 512u + (p * 8u + g) * 16u;
            const uint8_t *src = st + ((s >> 2) * 512u + (p * 8u + g) * 16u);
            mj_cp_async16(sr, src);
            mj_cp_async16(sr + 256, src + 256);
        } else if (SPP == 2 && first) { /* half a run's: 8 bytes of each (h, row), lane 16h + row */
            const uint32_t h = (uint32_t)lane >> 4, r = (uint32_t)lane & 15u;
            uint8_t *sr = SPTR(ring + RING * 1024 + sslot * SCHUNK, h, r, 0u);
            const uint8_t *src = st + ((s >> 2) * 512u + h * 256u + r * 16u + ((s >> 1) & 1u) * 8u);
            mj_cp_async8(sr, src);
        }
    }
    mj_cp_async_commit();
}

/* A warp's sums. With one or two token groups (TPE 8, 16) they are registers, the groups'
 * code unrolled. With more (SUMS_SMEM: TPE 32, 64) they live in shared memory, the warp's
 * own: group n's gate (h 0) and up (h 1) D fragments, each lane's four values side by side
 * (one 16-byte access), acc[((n * 2 + h) * 32 + lane) * 4 + i]; then gate and up, and the
 * groups, are rolled loops whose MMAs read and write them: one copy of a group's code (and
 * of W4A16's dequantization) whatever TPE is, so the compile and the registers stop growing
 * with it, and only groups that hold tokens run. Past two groups the loops are cheaper to
 * compile than the unrolled copies; below, they and their shared-memory traffic cost more
 * than they save. */
#define SUMS_SMEM (NT >= 4)
#define UPACC (SUMS_SMEM ? NT * 1024 : 0) /* bytes a warp */
/* Token groups whose sums registers hold: every group below SUMS_SMEM; past it the first
 * alone, for a chunk of at most 8 tokens (most chunks at decode, whatever TPE is), which
 * then takes the registers' path and its activations a step ahead, as TPE 8 does. */
#define NTR (SUMS_SMEM ? 1 : NT)

/* One token group's MMAs of k-step s into c, for one 16-row A fragment: W4A4 from the raw
 * fragment a4 and its scales sfa, W4A16 from the dequantized a16; the B side is row src
 * (-1: none) of the activations, KD long (H for up, I for down): xb bf16, or xq / xsf
 * NVFP4 in fragment order. */
MJ_DEVICE void mma_group(const uint32_t a4[4], uint32_t sfa, const uint32_t a16[4][4], int s, long long src, int KD,
                         const uint16_t *xb, const uint8_t *xq, const uint8_t *xsf, int p, float c[4]) {
    if (MODE == 1) {
        uint32_t bq[2], sfb;
        fp4_bfrag(xq, xsf, src, KD, s, p, bq, &sfb);
        mj_mma_e2m1_m16n8k64(c, a4, bq, c, sfa, sfb);
    } else {
        uint32_t b[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
        if (src >= 0) bf16_bfrag(xb + src * KD, s, p, b);
        for (int kt = 0; kt < 4; kt++) mj_mma_bf16_m16n8k16(c, a16[kt], b[kt], c);
    }
}

/* The activations (B fragments) of k-step s for the register sums' token groups (this
 * lane's rows src[]): W4A16 b16[n] (both halves; one group from xrow[0], the row's lane-p
 * part, x + src H + 8p, set once a chunk so that a step's address is one add: about 8
 * instructions a k-step fewer; two groups from src, where two pointers would cost registers
 * the 3 blocks an SM of up_bounds do not have), W4A4 bq[n] and its scale word bsf[n]. Loaded
 * a step ahead of their MMAs, so the step loop makes no dependent global load. Two W4A16
 * groups and W4A4 are zeros for a lane without a token or past the k-steps; one W4A16 group
 * is loaded as it is, not zeroed first: a lane without a token reads row 0 (xrow), whose
 * products land in sums no token has (an MMA's column is its B column's alone, and the
 * epilogue reads the chunk's tokens only), and past the k-steps nothing is loaded, as no MMA
 * runs. */
MJ_DEVICE void up_bload(int s, const int *src, const uint16_t *x, const uint16_t *const *xrow, const uint8_t *xq,
                        const uint8_t *xsf, int p, uint32_t b16[][4][2], uint32_t bq[][2], uint32_t *bsf) {
    MJ_UNROLL
    for (int n = 0; n < NTR; n++) {
        if (MODE == 0 && NTR == 1) {
            if (s < KS1) bf16_bfrag(xrow[n], s, 0, b16[n]);
            continue;
        }
        for (int kt = 0; kt < 4; kt++) b16[n][kt][0] = b16[n][kt][1] = 0;
        bq[n][0] = bq[n][1] = bsf[n] = 0;
        if (s >= KS1) continue;
        if (MODE == 1) fp4_bfrag(xq, xsf, src[n], H, s, p, bq[n], &bsf[n]);
        else if (src[n] >= 0) bf16_bfrag(x + (long long)src[n] * H, s, p, b16[n]); /* two groups: fewer registers */
    }
}

/* The MMAs of k-step s (its fragments in slot, its piece's scales in sr; step s4 of the piece)
 * against the chunk's nc tokens: the sums accr (registers: nc <= 8 * NTR) with the
 * activations up_bload brought (b16, bq, bsf), or the rows srcs[] and the sums in acc
 * (SUMS_SMEM, nc > 8). */
MJ_DEVICE void up_step(const uint8_t *slot, const uint8_t *sr, int s, int s4, const int *srcs, int nc,
                       const uint16_t *x, const uint8_t *xq, const uint8_t *xsf, int lane, float accr[][2][4],
                       float *acc, const uint32_t b16[][4][2], const uint32_t bq[][2], const uint32_t *bsf) {
    const int g = lane >> 2, p = lane & 3;
    if (SUMS_SMEM && nc > 8) {
        /* Gate, then up (h): the fragment and its scales from the ring, then the groups
         * that hold tokens, their sums in shared memory. One copy of the dequantization
         * (W4A16), the activations of a group read once for each. */
        MJ_NO_UNROLL
        for (int h = 0; h < 2; h++) {
            const uint4 wf = *(const uint4 *)(slot + h * 512 + lane * 16);
            const uint32_t a4[4] = {wf.x, wf.y, wf.z, wf.w};
            uint32_t sfa = 0, a16[4][4];
            if (MODE == 1) sfa = p < 2 ? *(const uint32_t *)(SPTR(sr, h, p * 8 + g, s4)) : 0u;
            else
                dequant_frag(wf, *(const uint32_t *)(SPTR(sr, h, g, s4)), *(const uint32_t *)(SPTR(sr, h, g + 8, s4)), p,
                             a16);
            MJ_NO_UNROLL
            for (int n = 0; n < NT && n * 8 < nc; n++) {
                float4 *cp = (float4 *)acc + (n * 2 + h) * 32 + lane;
                const float4 v = *cp;
                float c[4] = {v.x, v.y, v.z, v.w};
                mma_group(a4, sfa, a16, s, n * 8 + g < nc ? srcs[n * 8 + g] : -1, H, x, xq, xsf, p, c);
                *cp = make_float4(c[0], c[1], c[2], c[3]);
            }
        }
        return;
    }
    /* Registers: gate and up side by side, each group's activations read once. */
    const uint4 wf[2] = {*(const uint4 *)(slot + lane * 16), *(const uint4 *)(slot + 512 + lane * 16)};
    if (MODE == 1) {
        /* lanes p < 2 give the scales of rows g + 8p (the A scale operand), the rest 0 */
        uint32_t sfa[2] = {0, 0};
        if (p < 2)
            for (int h = 0; h < 2; h++) sfa[h] = *(const uint32_t *)(SPTR(sr, h, p * 8 + g, s4));
        MJ_UNROLL
        for (int n = 0; n < NTR; n++) {
            if (n * 8 >= nc) continue;
            for (int h = 0; h < 2; h++) {
                const uint32_t a[4] = {wf[h].x, wf[h].y, wf[h].z, wf[h].w};
                mj_mma_e2m1_m16n8k64(accr[n][h], a, bq[n], accr[n][h], sfa[h], bsf[n]);
            }
        }
    } else {
        /* the halves of the step unrolled (rolled, Hopper's half-rate integer pipe paid the
         * loop's counter and the selects of b16 by half, ~45 of 372 instructions a k-step);
         * each accumulator takes the steps kt 0, 1, 2, 3 in order */
        uint32_t sg[2], sg8[2]; /* rows g and g + 8 (any lane reads any row's scales): both halves' */
        for (int h = 0; h < 2; h++)
            sg[h] = e4m3x2_bf16(*(const uint32_t *)(SPTR(sr, h, g, s4)), p >> 1),
            sg8[h] = e4m3x2_bf16(*(const uint32_t *)(SPTR(sr, h, g + 8, s4)), p >> 1);
        MJ_UNROLL
        for (int hf = 0; hf < 2; hf++) {
            MJ_UNROLL
            for (int h = 0; h < 2; h++) { /* gate, then up: one half's fragments live at a time */
                uint32_t a[2][4];
                dequant_half(*(const uint2 *)(slot + h * 512 + lane * 16 + 8 * hf), sg[h], sg8[h], hf, a);
                MJ_UNROLL
                for (int n = 0; n < NTR; n++) {
                    if (n * 8 >= nc) continue;
                    for (int kk = 0; kk < 2; kk++) {
                        /* this half's pair, picked by value (an index by hf would put b16 in local memory) */
                        const uint32_t b[2] = {hf ? b16[n][2 + kk][0] : b16[n][kk][0], hf ? b16[n][2 + kk][1] : b16[n][kk][1]};
                        mj_mma_bf16_m16n8k16(accr[n][h], a[kk], b, accr[n][h]);
                    }
                }
            }
        }
    }
}

/* The shared expert's gate (Qwen2-MoE, Qwen3-Next): sgate_w[b] = 1 / (1 + e^-(x_b . sgate)) for
 * each valid token b (x_b and sgate bf16 [H]). One warp a token (warp w of nw: tokens w, w + nw,
 * ...); lane l adds the products of elements 8l .. 8l + 7, then 256 + 8l .., in index order, and
 * the lanes' sums are added by a butterfly (xor 16, 8, 4, 2, 1; float addition commutes, so
 * every lane holds the same bits): a fixed order, so a token's weight does not depend on the
 * other tokens or on NW1. The reciprocal is __fdividef's (no IEEE division's slow path in W4A16's
 * up; within 2 ulp; 0 past d = 2^126, where the weight is below 1e-38 anyway). */
MJ_NOINLINE void shared_gate_once(const uint16_t *x, const uint16_t *sgate, int nv, int w, int nw, int lane,
                                  float *sgate_w) {
    MJ_NO_UNROLL
    for (int b = w; b < nv; b += nw) {
        const uint16_t *xr = x + (long long)b * H;
        float dot = 0.0f;
        MJ_NO_UNROLL
        for (int h0 = 8 * lane; h0 < H; h0 += 256) {
            const uint4 xv = *(const uint4 *)(xr + h0), gv = *(const uint4 *)(sgate + h0);
            const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
            for (int i = 0; i < 4; i++) {
                dot += mj_f32_from_bits(xw[i] << 16) * mj_f32_from_bits(gw[i] << 16);
                dot += mj_f32_from_bits(xw[i] & 0xFFFF0000u) * mj_f32_from_bits(gw[i] & 0xFFFF0000u);
            }
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
        if (lane == 0) sgate_w[b] = __fdividef(1.0f, 1.0f + expf(-dot));
    }
}

/* STREAM (TPE 8: decode, one chunk of at most 8 tokens a tile, but for an expert a token's
 * top-k names twice): the grid's W = G NW1 warps (G the blocks the GPU holds at once) each take
 * an even run of the list of every unit's pieces, unit u = y I / 16 + t being slot y's tile t
 * (the shared sub-experts' slots first, then the active experts', as many as the device's
 * count says): P = (NSUB + active) I / 16 PIECES1 pieces (an int: at most 136 x 512 x 128),
 * warp v's run starting at run_start(v) = v base + min(v, rem), base = P / W, the first rem =
 * P % W runs one longer. A run is a segment of a unit at each end and whole units between.
 *
 * A piece's sums start from 0 (its SPP k-steps' MMAs in order), and a unit's are its pieces'
 * added in piece order, T = ((S0 + S1) + S2) + ..., whichever warps compute them: so a token's
 * bits depend on neither where the runs cut the list nor anything else in the batch. A warp
 * whose segment starts at the unit's first piece adds as it goes; any other writes each piece's
 * sums to upart ([PIECES1][UPROWS][I / 16][gate 16, up 16]: the chunk's rows by place, routed
 * then shared, as at most 8 tokens hold them). A unit over several warps: the first one's
 * running sum is written at its last piece's place, each warp counts its pieces in on
 * ucount[u], and the one that completes the count adds the later pieces to that sum, makes the
 * SwiGLU and sets the count back to 0 for the next launch (a graph's replay). No barrier: each
 * warp runs its own ring, sums and epilogue. */
#define UPROWS (8 * (K + NSUB))
/* upart's row of the chunk row i of a slot's rows: the route row, or shared sub-expert j's
 * 8 rows after the routed 8 K. */
MJ_DEVICE int upart_row(const rows_t *rs, int i, int n_local) {
    return rs->shared ? 8 * K + (rs->xi - n_local) * 8 + i : rs->off + i;
}
MJ_DEVICE void stream_cut(const int32_t *n_active, int n_slots, int W, int *base, int *rem) {
    const int na = n_active[0] < 0 ? 0 : n_active[0] < n_slots ? n_active[0] : n_slots;
    const int P = (NSUB + na) * (I / 16) * PIECES1;
    *base = P / W, *rem = P - *base * W;
}
MJ_DEVICE int run_start(int v, int base, int rem) { return v * base + (v < rem ? v : rem); }
/* The warp whose run holds piece q: the first rem runs hold base + 1 pieces, the rest base (at
 * least 1 where q lies past those: P >= W then). One division, where a walk back from the
 * finisher took a step a run (at B 1 a tile spans some 20 runs). */
MJ_DEVICE int run_of(int q, int base, int rem) {
    const int long_end = rem * (base + 1);
    return q < long_end ? q / (base + 1) : rem + (q - long_end) / base;
}

/* The SwiGLU of (token ci of the unit's rows, row r of tile t) from its gate and up sums: W4A16
 * the bf16 activation, W4A4 into the tile row hrow for up_requant. */
MJ_DEVICE void up_out(const rows_t *rs, int ci, int t, int r, float gate, float up, float alpha, int mb, int n_local,
                      uint16_t *act, float *hrow) {
    const float hv = silu(gate * alpha) * (up * alpha);
    if (MODE == 0) act[act_row(rs, ci, mb, n_local) * I + 16 * t + r] = (uint16_t)bf16_bits(hv);
    else hrow[r] = hv;
}

/* W4A4: the chunk's nc rows of the SwiGLU tile (htile [nc][16]) requantized with w2's input
 * scale, a lane a row. */
MJ_DEVICE void up_requant(const rows_t *rs, int c0, int nc, int t, float gs2, int mb, int n_local, uint8_t *actq,
                          uint8_t *act_sf, float *htile, int lane) {
    __syncwarp(0xFFFFFFFFu);
    MJ_NO_UNROLL
    for (int ti = lane; ti < nc; ti += 32) {
        const long long orow = act_row(rs, c0 + ti, mb, n_local);
        uint32_t w0, w1;
        act_sf[orow * (I / 16) + t] = (uint8_t)quant16(htile + ti * 16, 1, gs2, &w0, &w1);
        store_q16(actq + orow * (I / 2), t, w0, w1);
    }
    __syncwarp(0xFFFFFFFFu);
}

#if STREAM
/* The finisher's fold, for a unit its run does not hold whole: upart's slots k .. PIECES1 - 1
 * (the first warp's running sum through piece k, then each later piece's sums) added in
 * piece order, from -0 (which adds as nothing), into ts, the chunk's sums in the epilogue's
 * place (token ti, row r, gate h 0 / up 1 at h 128 + (4 (r % 8) + ti / 2) 4 + ti % 2 + 2 (r / 8)).
 * The chunk's rows are upart's prow0 + ti. Lane l takes token tp + l / 16 of each pair and
 * floats 2 (l % 16) and the next of its 128-byte line (gate rows 0..15, then up's): 16 lanes a
 * line. The loads go FOLD pieces at a time, all in flight before the first is added, so a
 * unit's fold waits on L2 ceil(nc / 2) ceil((PIECES1 - k) / FOLD) times, not once a piece and
 * value (tools/predict.c counts those trips): whole trips of FOLD pieces with no test a piece
 * (the model's tail loop), then the rest in one trip. */
#define FOLD 16
MJ_DEVICE void up_fold(const float *upart, int k, int prow0, int t, int nc, float *ts, int lane) {
    const int e = lane & 15, h = e >> 3, r = 2 * (e & 7);
    const long long step = (long long)UPROWS * (I / 16) * 32; /* a piece's slot */
    MJ_NO_UNROLL
    for (int tp = 0; tp < nc; tp += 2) {
        const int ti = tp + (lane >> 4), on = ti < nc;
        const float *pp = upart + (((long long)k * UPROWS + prow0 + (on ? ti : 0)) * (I / 16) + t) * 32 + 2 * e;
        float a0 = -0.0f, a1 = -0.0f;
        int pc0 = k;
        /* FOLD whole pieces a trip, no test a piece (a lane past nc reads the chunk's first
         * token's sums, in bounds, and stores nothing) */
        MJ_NO_UNROLL
        for (; pc0 + FOLD <= PIECES1; pc0 += FOLD) {
            float2 v[FOLD];
            MJ_UNROLL
            for (int j = 0; j < FOLD; j++) v[j] = mj_ld_cg_f32x2(pp + j * step);
            MJ_UNROLL
            for (int j = 0; j < FOLD; j++) a0 += v[j].x, a1 += v[j].y; /* in piece order */
            pp += FOLD * step;
        }
        if (pc0 < PIECES1) { /* the last pieces, fewer than FOLD */
            float2 v[FOLD];
            MJ_UNROLL
            for (int j = 0; j < FOLD; j++)
                v[j] = pc0 + j < PIECES1 ? mj_ld_cg_f32x2(pp + j * step) : make_float2(0.0f, 0.0f);
            MJ_UNROLL
            for (int j = 0; j < FOLD; j++) /* past the last none (+0 would turn a -0) */
                if (pc0 + j < PIECES1) a0 += v[j].x, a1 += v[j].y;
        }
        if (on)
            for (int j = 0; j < 2; j++) {
                const int rr = r + j;
                ts[h * 128 + (4 * (rr & 7) + (ti >> 1)) * 4 + (ti & 1) + 2 * (rr >> 3)] = j ? a1 : a0;
            }
    }
}

MJ_DEVICE void experts_up_stream(const uint16_t *x, const uint8_t *xq, const uint8_t *xsf, const uint8_t *w13,
                                 const uint8_t *s13, const float *scal, const int32_t *counts,
                                 const int32_t *offsets, const int32_t *active, const int32_t *n_active,
                                 const int32_t *row_index, int nv, int mb, int n_local, int expert_begin,
                                 int n_slots, uint16_t *act, uint8_t *actq, uint8_t *act_sf, float *upart,
                                 uint32_t *ucount, const uint16_t *sgate, float *sgate_w, float *smem, int w,
                                 int lane) {
    const int g = lane >> 2, p = lane & 3;
    const int v = (int)blockIdx.x * NW1 + w; /* this warp in the grid's */
    int base, rem;
    stream_cut(n_active, n_slots, (int)gridDim.x * NW1, &base, &rem);
    const int r0 = run_start(v, base, rem), r1 = r0 + base + (v < rem);
    uint8_t *ring = (uint8_t *)smem + w * RING_BYTES;
    float *htile = (float *)ring; /* W4A4's SwiGLU tile [8][16], after the k loop: the ring's first bytes */
    for (int q0 = r0; q0 < r1;) {
        const int u = q0 / PIECES1, ub = u * PIECES1, q1 = r1 < ub + PIECES1 ? r1 : ub + PIECES1;
        const int t = u % (I / 16), y = u / (I / 16), seg0 = q0 - ub, seg1 = q1 - ub;
        q0 = q1;
        const int slot = y < NSUB ? n_slots + y : y - NSUB;
        rows_t rs = slot_rows(slot, n_slots, counts, offsets, active, n_active, n_local, expert_begin, nv);
        if (rs.xi < 0 || rs.n == 0) continue;
        if (sgate && rs.shared && rs.xi == n_local && t == 0 && seg0 == 0) /* one warp: the first shared tile's first */
            shared_gate_once(x, sgate, nv, 0, 1, lane, sgate_w);
        const uint8_t *wt = w13 + rs.xi * W13_EXPERT + t * W13_TILE;
        const uint8_t *st = s13 + rs.xi * S13_EXPERT + t * S13_TILE;
        const float ws2 = scal[rs.xi * SCAL + 0], is13 = scal[rs.xi * SCAL + 1];
        const float alpha = MODE == 1 ? is13 * ws2 : ws2;
        const float gs2 = scal[rs.xi * SCAL + 5];
        for (int c0 = 0; c0 < rs.n; c0 += TPE) {
            /* A later chunk (more rows than TPE) is the whole of the warp holding the unit's
             * first piece. */
            if (c0 > 0 && seg0 > 0) break;
            const int cs0 = c0 > 0 ? 0 : seg0, cs1 = c0 > 0 ? PIECES1 : seg1;
            const int nc = rs.n - c0 < TPE ? rs.n - c0 : TPE;
            int src[1];
            const uint16_t *xrow[1];
            src[0] = g < nc ? (int)src_row(&rs, c0 + g, row_index, mb) : -1;
            xrow[0] = MODE == 0 ? x + (long long)(src[0] >= 0 ? src[0] : 0) * H + 8 * p : 0;
            /* the running sum starts at -0, which adds to the first piece's sums as nothing
             * (-0 + x is x, bit for bit, +0 too): T0 is S0 */
            float tot[2][4], accr[1][2][4];
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++) tot[h][i] = -0.0f, accr[0][h][i] = 0.0f;
            /* d_i: intermediate row 16t + g (+8 for i >= 2), token 2p (+1 for odd i); a piece's
             * sums in upart at pb (token 2p's row, row g) and the constant offsets from it */
            const int prow0 = upart_row(&rs, c0 + 2 * p, n_local);
            const int w0 = cs0 > 0 && 2 * p < nc, w1 = cs0 > 0 && 2 * p + 1 < nc; /* this lane's upart stores */
            float *pb = upart + (((long long)cs0 * UPROWS + prow0) * (I / 16) + t) * 32 + g;
            /* the segment's k-steps, in order, through the warp's ring (RING - 1 in flight) */
            const int nq = (cs1 - cs0) * SPP;
            const uint32_t s0 = (uint32_t)(cs0 * SPP);
            MJ_NO_UNROLL
            for (int q = 0; q < RING - 1; q++)
                up_issue(ring, wt, st, s0 + (uint32_t)q, (uint32_t)q, (uint32_t)(q / SPP), q % SPP == 0, q < nq, lane);
            uint32_t b16[1][4][2] = {{{0}}}, bq[1][2], bsf[1];
            up_bload(nq > 0 ? (int)s0 : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
            uint32_t cs = 0u;
            MJ_NO_UNROLL
            for (int j = 0; j < nq; j++) {
                const uint32_t uj = (uint32_t)j, s = s0 + uj, s4 = uj % SPP;
                up_issue(ring, wt, st, s + 4u, cs == 0u ? RING - 1u : cs - 1u, (uj / SPP + 4u / SPP) % RUNRING, s4 == 0u,
                         j + RING - 1 < nq, lane);
                /* W4A16: this step's activations came during the last, the next step's load
                 * after this step's MMAs; W4A4: the next step's now, a whole step ahead */
                uint32_t cq[1][2], csf[1];
                if (MODE == 1) {
                    cq[0][0] = bq[0][0], cq[0][1] = bq[0][1], csf[0] = bsf[0];
                    up_bload(j + 1 < nq ? (int)s + 1 : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
                }
                mj_cp_async_wait(RING - 1); /* step j's group has landed... */
                __syncwarp(0xFFFFFFFFu);    /* ...every lane's (scales are shared) */
                if (s < KS1)
                    up_step(ring + cs * 1024u, ring + RING * 1024 + (uj / SPP % RUNRING) * SCHUNK, (int)s, (int)s4, 0, nc, x,
                            xq, xsf, lane, accr, 0, b16, MODE == 1 ? cq : bq, MODE == 1 ? csf : bsf);
                if (MODE == 0) up_bload(j + 1 < nq ? (int)s + 1 : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
                if (s4 == SPP - 1u) { /* a piece's end: its sums into the running sum (used where the
                                       * segment starts the unit), and to upart where it does not */
                    for (int h = 0; h < 2; h++) {
                        if (w0) pb[16 * h] = accr[0][h][0], pb[16 * h + 8] = accr[0][h][2];
                        if (w1) pb[(I / 16) * 32 + 16 * h] = accr[0][h][1], pb[(I / 16) * 32 + 16 * h + 8] = accr[0][h][3];
                        for (int i = 0; i < 4; i++) tot[h][i] += accr[0][h][i], accr[0][h][i] = 0.0f;
                    }
                    pb += (long long)UPROWS * (I / 16) * 32;
                }
                cs = cs == RING - 1u ? 0u : cs + 1u;
            }
            int last = cs0 == 0 && cs1 == PIECES1;
            if (!last) {
                if (cs0 == 0) /* the running sum, at its last piece's place */
                    for (int i = 0; i < 4; i++) {
                        const int ti = 2 * p + (i & 1), r = g + 8 * (i >> 1);
                        if (ti >= nc) continue;
                        const int prow = upart_row(&rs, c0 + ti, n_local);
                        float *pp = upart + (((long long)(cs1 - 1) * UPROWS + prow) * (I / 16) + t) * 32 + r;
                        pp[0] = tot[0][i], pp[16] = tot[1][i];
                    }
                __threadfence(); /* this warp's sums are visible to the warp that adds them */
                __syncwarp(0xFFFFFFFFu);
                uint32_t done = 0u;
                if (lane == 0) done = atomicAdd(&ucount[u], (uint32_t)(cs1 - cs0)) == (uint32_t)(PIECES1 - (cs1 - cs0));
                last = (int)__shfl_sync(0xFFFFFFFFu, done, 0);
                if (last) {
                    __syncwarp(0xFFFFFFFFu); /* lane 0's atomic before every lane's fence and loads */
                    __threadfence();
                }
            }
            if (last) {
                /* the running sums through the ring's memory (past W4A4's tile), so that the
                 * SwiGLU below is one rolled copy, as the block's epilogue is */
                float *ts = (float *)(ring + 1024);
                if (cs0 == 0 && cs1 == PIECES1)
                    for (int i = 0; i < 4; i++) ts[lane * 4 + i] = tot[0][i], ts[128 + lane * 4 + i] = tot[1][i];
                else { /* the first warp's sum, then the later pieces', in order: the warp whose
                        * run holds the unit's first piece has its sum where that run ends */
                    const int fe = run_start(run_of(ub, base, rem) + 1, base, rem) - ub;
                    up_fold(upart, (fe < PIECES1 ? fe : PIECES1) - 1, upart_row(&rs, c0, n_local), t, nc, ts, lane);
                }
                __syncwarp(0xFFFFFFFFu);
                MJ_NO_UNROLL
                for (int i = 0; i < 4; i++) {
                    const int ti = 2 * p + (i & 1), r = g + 8 * (i >> 1);
                    if (ti >= nc) continue;
                    float gate = ts[lane * 4 + i], up = ts[128 + lane * 4 + i];
                    gate *= DQ_UNIT, up *= DQ_UNIT; /* exact: W4A16's sums are in units of 2^-7 */
                    up_out(&rs, c0 + ti, t, r, gate, up, alpha, mb, n_local, act, htile + ti * 16);
                }
                if (MODE == 1) up_requant(&rs, c0, nc, t, gs2, mb, n_local, actq, act_sf, htile, lane);
                if (!(cs0 == 0 && cs1 == PIECES1) && lane == 0) ucount[u] = 0u;
            }
            __syncwarp(0xFFFFFFFFu); /* the ring (and W4A4's tile in it) is the next segment's */
        }
    }
}
#endif

/* grid (I / 16, n_slots + NSUB) (STREAM: G blocks, the GPU's SMs times the blocks an SM holds),
 * block NW1 * 32, dynamic shared memory NW1 * RING_BYTES
 * (the warps' rings; after the k loop the warps' sums, then the SwiGLU tile), and with
 * SUMS_SMEM NW1 * UPACC + TPE * 4 bytes more (the warps' sums and the chunk's source rows;
 * the tile after the k loop at the start). sgate: the shared expert's gate, bf16 [H] (NULL:
 * none, sgate_w untouched), whose weights one block writes to sgate_w [B] for down. */
/* Up's blocks an SM for ptxas (__launch_bounds__): a block of 8 warps (TPE 16) takes 48 KiB of
 * rings, so an SM of 164 or 228 KiB (sm_80, sm_90a, sm_100a) holds 3 where their registers
 * let it (80 a thread, not the 2 blocks that ptxas's own choice of about 100 leaves room for:
 * up at TPE 16 is its warps' own issue, and a third block is a half more of them). */
#define UP_MINB (NW1 == 8 && (MJ_TARGET_SM == 80 || MJ_TARGET_SM == 90 || MJ_TARGET_SM == 100) ? 3 : 1)
#if UP_MINB > 1
#define UP_BOUNDS __launch_bounds__(NW1 * 32, UP_MINB)
#else
#define UP_BOUNDS /* ptxas's own choice: a bound of 1 block would let it take more registers */
#endif
/* What up and down read whatever the routing decides, the shared sub-experts' weights and
 * scales (NSUB after the n_local routed ones), brought into L2 before the grid dependence's
 * wait: on sm_90+ this grid's blocks are resident while the kernels before it run (the
 * routing, one block on one SM: the memory idle), and a hint needs nothing they write. Four
 * regions, each array's NSUB sub-experts, their 128-byte lines one list that the grid's
 * threads take in turn, each region's first line from its first byte (every address inside
 * it); thread tid of T calls it only where tid < PF_LINES (at least the list's lines), so most
 * warps skip it. Ints: a grid of at most (I / 16) (E + NSUB) blocks of 256 threads, a region
 * at most 2^21 lines (the knobs' ranges). */
#define PF_LINES ((int)((NSUB * (W13_EXPERT + S13_EXPERT + W2_EXPERT + S2_EXPERT)) / 128 + 8)) /* each region's
                                                          * bytes / 128 and 2 lines more, at least */
MJ_NOINLINE void prefetch_shared_few(const uint8_t *w13, const uint8_t *s13, const uint8_t *w2, const uint8_t *s2,
                                     int n_local, int tid, int T) {
    const uint8_t *const base[4] = {w13 + n_local * W13_EXPERT, s13 + n_local * S13_EXPERT, w2 + n_local * W2_EXPERT,
                                    s2 + n_local * S2_EXPERT};
    const long long bytes[4] = {NSUB * W13_EXPERT, NSUB * S13_EXPERT, NSUB * W2_EXPERT, NSUB * S2_EXPERT};
    int i = tid; /* the line in the regions' lines, one after another */
    MJ_UNROLL
    for (int r = 0; r < 4; r++) {
        const int lead = (int)((unsigned long long)base[r] & 127u), lines = (int)((bytes[r] + lead + 127) >> 7);
        MJ_NO_UNROLL
        for (; i < lines; i += T) mj_prefetch_l2(base[r] + (i > 0 ? 128 * i - lead : 0));
        i -= lines; /* past this region: the next one's line */
    }
}

MJ_KERNEL void UP_BOUNDS experts_up(const uint16_t *x, const uint8_t *xq, const uint8_t *xsf, const uint8_t *w13,
                          const uint8_t *s13, const uint8_t *w2, const uint8_t *s2, const float *scal, const int32_t *counts,
                          const int32_t *offsets, const int32_t *active, const int32_t *n_active,
                          const int32_t *row_index, int B, const int32_t *num_valid, int mb, int n_local,
                          int expert_begin, int n_slots, uint16_t *act, uint8_t *actq, uint8_t *act_sf,
                          float *upart, uint32_t *ucount, const uint16_t *sgate, float *sgate_w) {
#if (PART == 0 || PART == 2) && MJ_TARGET_SM >= 90 /* below, no PDL: nothing would overlap it */
    if (NSUB > 0) { /* weights: nothing the grid before this one writes */
        const int tid = (int)((blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x);
        if (tid < PF_LINES) prefetch_shared_few(w13, s13, w2, s2, n_local, tid, (int)(gridDim.x * gridDim.y * blockDim.x));
    }
#endif
    mj_grid_dep_wait(); /* before any other memory: the grid before this one has finished */
#if PART == 0 || PART == 2 /* else an empty kernel: this specialization compiles another */
    MJ_DYNAMIC_SHARED(float, smem);
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32;
    const int g = lane >> 2, p = lane & 3;
    const int nv = valid_tokens(num_valid, B);
#if STREAM
    experts_up_stream(x, xq, xsf, w13, s13, scal, counts, offsets, active, n_active, row_index, nv, mb, n_local,
                      expert_begin, n_slots, act, actq, act_sf, upart, ucount, sgate, sgate_w, smem, w, lane);
#else
    const int t = (int)blockIdx.x, dw = w; /* this warp's first piece of the tile */
    /* The shared sub-experts' blocks first (y < NSUB), then the routed slots: a shared one
     * takes every valid token, the longest blocks of a grid at B > 8, and the last blocks a
     * GPU starts are the ones it waits for at the end. */
    const int y = (int)blockIdx.y, slot = y < NSUB ? n_slots + y : y - NSUB;
    rows_t rs = slot_rows(slot, n_slots, counts, offsets, active, n_active, n_local, expert_begin, nv);
    if (rs.xi < 0 || rs.n == 0) return;
    if (sgate && rs.shared && rs.xi == n_local && t == 0) /* one block: the first shared sub-expert's */
        shared_gate_once(x, sgate, nv, w, NW1, lane, sgate_w);
    const uint8_t *wt = w13 + rs.xi * W13_EXPERT + t * W13_TILE;
    const uint8_t *st = s13 + rs.xi * S13_EXPERT + t * S13_TILE;
    const float ws2 = scal[rs.xi * SCAL + 0], is13 = scal[rs.xi * SCAL + 1];
    const float alpha = MODE == 1 ? is13 * ws2 : ws2;
    const float gs2 = scal[rs.xi * SCAL + 5];
    uint8_t *ring = (uint8_t *)smem + w * RING_BYTES;
    /* every warp's sums, [NW1][NT][2][32][4]; the SwiGLU tile [TPE][16] (W4A4 requant) */
    float *accs = SUMS_SMEM ? (float *)((uint8_t *)smem + NW1 * RING_BYTES) : smem;
    float *htile = SUMS_SMEM ? smem : smem + NW1 * NT * 256;
    float *acc = accs + w * NT * 256;                                  /* this warp's (SUMS_SMEM) */
    int *srcs = (int *)((uint8_t *)smem + NW1 * (RING_BYTES + UPACC)); /* [TPE] (SUMS_SMEM)       */

    for (int c0 = 0; c0 < rs.n; c0 += TPE) {
        const int nc = rs.n - c0 < TPE ? rs.n - c0 : TPE;
        /* The source rows of the chunk's tokens (this lane's: token n * 8 + g of each group),
         * and zero sums: in registers (regs; block-uniform), or in shared memory. */
        const int regs = !SUMS_SMEM || nc <= 8;
        int src[NTR]; /* rows are ints, as the dispatch counts them (srcs[] too) */
        const uint16_t *xrow[NTR]; /* W4A16: up_bload's */
        float accr[NTR][2][4];
        if (regs) {
            MJ_UNROLL
            for (int n = 0; n < NTR; n++) {
                src[n] = n * 8 + g < nc ? (int)src_row(&rs, c0 + n * 8 + g, row_index, mb) : -1;
                xrow[n] = MODE == 0 && NTR == 1 ? x + (long long)(src[n] >= 0 ? src[n] : 0) * H + 8 * p : 0;
                for (int h = 0; h < 2; h++)
                    for (int q = 0; q < 4; q++) accr[n][h][q] = 0.0f;
            }
        } else {
            MJ_NO_UNROLL
            for (int i = (int)threadIdx.x; i < nc; i += NW1 * 32) srcs[i] = (int)src_row(&rs, c0 + i, row_index, mb);
            MJ_NO_UNROLL
            for (int i = 0; i < 2 * NT && (i >> 1) * 8 < nc; i++) ((float4 *)acc)[i * 32 + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            __syncthreads();
        }
        /* Pieces of SPP k-steps, one scale chunk each, dealt to the warps in turn, through
         * the warp's ring: RING - 1 steps in flight while one computes. */
        const int nq = dw < PIECES1 ? (PIECES1 - dw + NW1 - 1) / NW1 * SPP : 0;
        /* Step j's k-step sj and ring slot cs, kept as cursors: within a piece the next step,
         * then the first of the warp's next piece (SPP NW1 - SPP + 1 on); step j + RING - 1 =
         * j + 4, the one issued while j computes, is 4 / SPP pieces on (sj + 4 NW1 either way)
         * in the slot before cs. */
        MJ_NO_UNROLL
        for (int q = 0; q < RING - 1; q++) /* the warp's steps 0 .. 3: piece q / SPP of its (runs: the first) */
            up_issue(ring, wt, st, SPP == 4 ? (uint32_t)(dw * 4 + q) : (uint32_t)((dw + q / SPP * NW1) * SPP + q % SPP),
                     (uint32_t)q, SPP == 4 ? 0u : (uint32_t)(q / SPP), SPP == 4 ? q == 0 : q % SPP == 0, q < nq, lane);
        uint32_t sj = (uint32_t)(dw * SPP), cs = 0u;
        /* the register sums' activations: with one token group step j's (b16, bq, bsf) are
         * loaded during step j - 1; with two, at the start of step j (a copy of both groups
         * held across a step would double their registers) */
        uint32_t b16[NTR][4][2] = {{{0}}}, bq[NTR][2], bsf[NTR];
        up_bload(NTR == 1 && regs && nq > 0 ? dw * SPP : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
        MJ_NO_UNROLL
        for (int j = 0; j < nq; j++) {
            const uint32_t uj = (uint32_t)j, s = sj, s4 = uj % SPP; /* s4: the step's place in its piece */
            /* into the slot step j - 1 read; a piece's scales into the slot 4 / SPP on */
            up_issue(ring, wt, st, s + 4u * NW1, cs == 0u ? RING - 1u : cs - 1u, (uj / SPP + 4u / SPP) % RUNRING, s4 == 0u,
                     j + RING - 1 < nq, lane);
            const uint32_t sn = s4 == SPP - 1u ? s + (SPP * NW1 - (SPP - 1u)) : s + 1u; /* step j + 1's */
            /* one W4A16 group: this step's came during the last, the next step's load after
             * this step's MMAs, into the same registers (no copy); one W4A4 group: this
             * step's from the last, the next step's now, a whole step before its MMAs (W4A4
             * has no dequantization to hide a load behind); two groups: this step's, before
             * the wait (registers) */
            const int reuse = NTR == 1 && MODE == 0;
            uint32_t c16[NTR][4][2], cq[NTR][2], csf[NTR];
            if (NTR == 1 && MODE == 1 && regs) {
                cq[0][0] = bq[0][0], cq[0][1] = bq[0][1], csf[0] = bsf[0];
                up_bload(j + 1 < nq ? (int)sn : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
            } else if (NTR > 1 && regs) {
                up_bload((int)s, src, x, xrow, xq, xsf, p, c16, cq, csf);
            }
            mj_cp_async_wait(RING - 1); /* step j's group has landed... */
            __syncwarp(0xFFFFFFFFu);    /* ...every lane's (scales are shared) */
            if (s < KS1)
                up_step(ring + cs * 1024u, ring + RING * 1024 + (uj / SPP % RUNRING) * SCHUNK, (int)s, (int)s4, srcs, nc, x,
                        xq, xsf, lane, accr, acc, reuse ? b16 : c16, reuse ? bq : cq, reuse ? bsf : csf);
            if (reuse && regs) up_bload(j + 1 < nq ? (int)sn : KS1, src, x, xrow, xq, xsf, p, b16, bq, bsf);
            sj = sn, cs = cs == RING - 1u ? 0u : cs + 1u;
        }
        __syncthreads(); /* the rings' memory is the tile's (and the register sums') below */
        if (regs) {
            MJ_UNROLL
            for (int n = 0; n < NTR; n++)
                for (int h = 0; h < 2; h++)
                    for (int i = 0; i < 4; i++) acc[((n * 2 + h) * 32 + lane) * 4 + i] = accr[n][h][i];
            __syncthreads();
        }
        /* Warp 0 adds the warps' sums in warp order as the SwiGLU below reads them: a rolled
         * loop over the token groups, the four values of each and the warps, one copy of its
         * code (expf and silu's division). */
        if (w == 0) {
            /* d_i: intermediate row 16t + g (+8 for i >= 2), token 2p (+1 for odd i). */
            MJ_NO_UNROLL
            for (int n = 0; n < NT && n * 8 < nc; n++)
                MJ_NO_UNROLL
                for (int i = 0; i < 4; i++) {
                    int ti = n * 8 + 2 * p + (i & 1), r = g + 8 * (i >> 1);
                    if (ti >= nc) continue;
                    const float *av = accs + (n * 2 * 32 + lane) * 4 + i; /* warp 0's gate; up 128 on */
                    float gate = av[0], up = av[128];
                    MJ_NO_UNROLL
                    for (int v = 1; v < NW1; v++) gate += av[v * NT * 256], up += av[v * NT * 256 + 128];
                    gate *= DQ_UNIT, up *= DQ_UNIT; /* exact: W4A16's sums are in units of 2^-7 */
                    up_out(&rs, c0 + ti, t, r, gate, up, alpha, mb, n_local, act, htile + ti * 16);
                }
            if (MODE == 1) up_requant(&rs, c0, nc, t, gs2, mb, n_local, actq, act_sf, htile, lane);
        }
        __syncthreads(); /* the next chunk's rings, sums and rows reuse this memory */
    }
#endif /* STREAM */
#endif
}

/* ---- experts_down ------------------------------------------------------------------------- */

/* The first row in [lo, hi) of an expert whose token is >= tok (rows go by token). */
MJ_DEVICE int first_row(const int32_t *row_index, int lo, int hi, int tok) {
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (row_index[mid] / K < tok) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* A warp of down streams (expert, part) items: every DSTEPS k-steps of every active expert
 * held here with rows in the token tile, in ascending expert id, then the shared
 * sub-experts. */
typedef struct down_item_t {
    int xi;          /* packed expert, -1: none left                                       */
    int r0, n;       /* its rows (tokens t0 .. of the tile)                                */
    int shared_row0; /* the shared sub-expert's first act row, -1 for a routed expert     */
    float alpha;     /* the expert's scale times DQ_UNIT                                   */
    int part;        /* which DSTEPS k-steps of the expert                                 */
} down_item_t;

/* A warp's share of the active list, and after the list's na places the shared sub-experts'
 * NSUB (place na + j: sub-expert j), goes 32 of its places at a time (a chunk; lane l: the
 * chunk's l-th). Its places are w, w + NW2, ... (DEAL 1: by place) or every place whose
 * expert's id (a shared sub-expert's j) is w modulo NW2 (DEAL 0: by id; a chunk is then 32
 * consecutive places, the others' lanes empty). A lane keeps its place's expert in one
 * register (the loop keeps it across its MMAs): the packed expert (low 16 bits: n_local + j
 * for shared sub-expert j) and its rows in the tile (high; 0 when the place is not the warp's
 * to take, or is taken). The warp's position, one register too: the next chunk's first place
 * (low 15 bits: in the warp's places for DEAL 1, in the list's for DEAL 0) and whether the
 * chunk before was its last (bit 15). */
#define POS_CHUNK(pos) ((pos) & 0x7FFF)
#define POS_LAST(pos) ((pos) & 0x8000)

/* The token tile's bounds, again where needed (not kept in registers across the loop). */
MJ_DEVICE int tile_t0(void) { return (int)blockIdx.y * TPE; }
MJ_DEVICE int tile_t1(int B) { return tile_t0() + TPE < B ? tile_t0() + TPE : B; }
/* Whether the tile holds the whole batch (every decode launch): an expert's rows are then
 * all the dispatch counted, no search by token. */
MJ_DEVICE int tile_whole(int B) { return tile_t0() == 0 && tile_t1(B) == B; }

/* The warp's next chunk (from *pos on) into the lane's place registers: *xn its expert and
 * rows in the tile, *xr its first row (0 for a shared sub-expert: its rows are the tile's tn
 * valid tokens, in down_issue's and the loop's own places). Every lane its own place's
 * expert, offset and count at once, one chain of dependent loads (the id, then its offset and
 * count) a chunk, not one an expert. A tile that holds the whole batch takes an expert's rows
 * as the dispatch counted them; others search them by token (first_row). */
MJ_DEVICE void fill_places(int *pos, int *xn, int *xr, int na, const int32_t *counts, const int32_t *offsets,
                           const int32_t *active, const int32_t *row_index, int n_local, int expert_begin, int B,
                           int tn, int w, int lane) {
    const int t0 = tile_t0(), t1 = tile_t1(B);
    const int k = POS_CHUNK(*pos) + lane, c = DEAL ? w + NW2 * k : k, e = c < na ? active[c] : -1, xi = e - expert_begin;
    const int j = c - na; /* past the list: shared sub-expert j */
    const int routed = e >= 0 && (DEAL || (e & (NW2 - 1)) == w) && xi >= 0 && xi < n_local;
    const int shared = c >= na && j < NSUB && (DEAL || (j & (NW2 - 1)) == w) && tn > 0;
    int n = shared ? tn : 0, r0 = 0;
    if (routed) {
        const int off = offsets[e], cnt = counts[e];
        if (tile_whole(B)) {
            n = cnt, r0 = off;
        } else {
            r0 = first_row(row_index, off, off + cnt, t0);
            n = first_row(row_index, off, off + cnt, t1) - r0;
        }
    }
    *xn = routed || shared ? ((routed ? xi : n_local + j) & 0xFFFF) | (n << 16) : 0;
    *xr = r0;
    *pos += 32;
    if ((DEAL ? w + NW2 * POS_CHUNK(*pos) : POS_CHUNK(*pos)) >= na + NSUB) *pos |= 0x8000;
}

/* The warp's next item of its chunk (lowest place first); xi -1 when the chunk has no more.
 * The expert's rows come from its place (fill_places: no load here), its scales are the one
 * load. By place the warps' shares differ by one at most, and which warp takes an expert
 * does not reach the output (each (token, expert) has a slot of its own, added in slot
 * order); by id a token's sum goes over the same warps in the same order whatever else the
 * batch holds. Either way a token's output does not depend on the other tokens (padding rows
 * included). */
MJ_DEVICE down_item_t next_expert(int *xn, int *xr, const float *scal, int n_local, int mb, int lane) {
    down_item_t it = {-1, 0, 0, -1, 0.0f, 0};
    const unsigned m = __ballot_sync(0xFFFFFFFFu, *xn >> 16 != 0);
    if (m) {
        const int f = __ffs((int)m) - 1, v = __shfl_sync(0xFFFFFFFFu, *xn, f), r = __shfl_sync(0xFFFFFFFFu, *xr, f);
        /* TPE rows at most an item (the sums hold TPE / 8 token groups): an expert with more
         * rows in the tile (a token's top-k naming it twice) stays in its place with the rest,
         * its next item the next TPE rows (a shared sub-expert has at most TPE) */
        const int n = v >> 16, take = n < TPE ? n : TPE;
        if (lane == f) *xn = n > take ? (v & 0xFFFF) | ((n - take) << 16) : 0, *xr = r + take; /* taken */
        it.xi = v & 0xFFFF, it.n = take, it.r0 = r;
        it.shared_row0 = it.xi >= n_local ? mb * (K + it.xi - n_local) : -1; /* sub-expert j's act rows: mb K + j mb */
        const float ws2 = scal[it.xi * SCAL + 2];
        /* the scale times DQ_UNIT (W4A16's sums are in units of 2^-7): a power of 2, so a sum
         * times it is the sum times DQ_UNIT times the scale, rounded once */
        it.alpha = (MODE == 1 ? scal[it.xi * SCAL + 3] * ws2 : ws2) * DQ_UNIT;
    }
    return it;
}

/* A down warp streams its items through a ring in shared memory, its own: DRING slots of an
 * item's DSTEPS k-steps of w2 fragments (DSTEPS x 512 bytes; each lane's 16 bytes where it
 * reads them back), its run's scale chunk (256 bytes: rows 0-15, 4 k-steps: brought by the
 * run's first item; with DSTEPS 2 the second item reads it in the slot before its own) and,
 * with an expert's last part, the top-k entries (row_index) of its first DRIDX rows: the
 * epilogue's weights are then one load from what the ring holds, not a load of an entry and
 * then of its weight. The item itself every lane holds in registers (next_expert's result is
 * the same in every lane): the one in flight, kept a trip. cp.async keeps DRING - 2 items in
 * flight while one computes (at decode with I_local 256 and DSTEPS 4 an item is a whole
 * expert: the next experts' weights arrive during this one). Item q's slot is q % DRING: the
 * trip that computes item j first issues item j + 1 into the slot item j - 2 had (item j - 1's
 * stays, whose scale chunk item j reads where DSTEPS is 2 and j is a run's second part), and
 * every trip ends with a __syncwarp: the scales and the entries, which lanes read across,
 * are free by then. */
#define DRING 3
#if DRING != 3
#error "experts_down's loop keeps one item in flight in registers (held): DRING - 2 must be 1"
#endif
#define DRIDX (TPE == 16 ? 16 : 8) /* rows whose top-k entries a slot carries: TPE 16 all, else one group */
#define DSLOT (DSTEPS * 512 + 256 + 4 * DRIDX)
#define DSCALES (DSTEPS * 512) /* a slot's scale chunk, then its rows' entries */
#define DINDEX (DSCALES + 256)

/* Slot i (0 .. DRING - 1) of a warp's ring: item q's is q % DRING. */
MJ_DEVICE uint8_t *dslot(uint8_t *ring, unsigned i) { return ring + i * DSLOT; }
/* An item's first k-step: its part's (with one part an expert, 0 where the compiler sees it). */
MJ_DEVICE int item_step0(int part) { return DPARTS == 1 ? 0 : part * DSTEPS; }

/* Queue item it's copies (its k-steps `part`) into ring slot `slot`, as a group of its own
 * (an empty group when it.xi < 0: the none-left item). */
MJ_DEVICE void down_issue(const uint8_t *w2, const uint8_t *s2, const int32_t *row_index,
                          const down_item_t *it, int part, int d, uint8_t *slot, int lane) {
    const int g = lane >> 2, p = lane & 3;
    if (it->xi >= 0) {
        const int s0 = item_step0(part);
        /* the (expert, 16 dims) tile: one 32-bit index (n_local x H / 16 < 2^26), one wide
         * multiply a region */
        const unsigned u = (unsigned)(it->xi * (H / 16) + d);
        const uint8_t *wt = w2 + (unsigned long long)u * W2_TILE + (unsigned)(s0 * 512 + lane * 16);
        const uint8_t *st = s2 + (unsigned long long)u * S2_TILE + (unsigned)((s0 / 4) * 256 + (p * 8 + g) * 16);
        MJ_UNROLL
        for (int i = 0; i < DSTEPS; i++) /* one base, the steps at immediate offsets */
            if (KS2 % DSTEPS == 0 || s0 + i < KS2) mj_cp_async16(slot + i * 512 + lane * 16, wt + i * 512);
        if (p < 2 && (DSTEPS == 4 || s0 % 4 == 0)) mj_cp_async16(slot + DSCALES + (p * 8 + g) * 16, st);
        /* the expert's last part: its first DRIDX rows' top-k entries, for the epilogue */
        if (it->shared_row0 < 0 && (DPARTS == 1 || part == DPARTS - 1) && lane < it->n && lane < DRIDX)
            mj_cp_async4(slot + DINDEX + lane * 4, row_index + (unsigned)(it->r0 + lane)); /* a row is >= 0 */
    }
    mj_cp_async_commit();
}

/* One token group's MMAs of an item (its fragments in slot, its run's scale chunk at sr; its
 * first k-step s0) into acc: the group's rows row0 + g for g < n (none past n), the
 * activations of all its DSTEPS steps loaded first, side by side (W4A16 8 registers a step,
 * W4A4 3): one global latency a group, not one a step. */
MJ_DEVICE void down_group(const uint8_t *slot, const uint8_t *sr, int s0, long long row0, int n, const uint16_t *act,
                          const uint8_t *actq, const uint8_t *act_sf, int lane, float acc[4]) {
    const int g = lane >> 2, p = lane & 3;
    const long long src = g < n ? row0 + g : -1;
    uint32_t b[DSTEPS][4][2], bq[DSTEPS][2], sfb[DSTEPS];
    MJ_UNROLL
    for (int i = 0; i < DSTEPS; i++) {
        const int s = s0 + i;
        if (MODE == 0) { /* as they are: a lane past the rows reads the group's first (n >= 1),
                          * into sums no row has (down_epi_group reads rows below n only) */
            if (KS2 % DSTEPS != 0 && s >= KS2) continue; /* no MMA reads it */
            bf16_bfrag(act + (row0 + (g < n ? g : 0)) * I, s, p, b[i]);
            continue;
        }
        bq[i][0] = bq[i][1] = sfb[i] = 0;
        if (KS2 % DSTEPS != 0 && s >= KS2) continue;
        fp4_bfrag(actq, act_sf, src, I, s, p, bq[i], &sfb[i]);
    }
    MJ_UNROLL
    for (int i = 0; i < DSTEPS; i++) {
        const int s = s0 + i, s4 = s & 3;
        if (KS2 % DSTEPS != 0 && s >= KS2) break;
        const uint4 wf = *(const uint4 *)(slot + i * 512 + lane * 16);
        if (MODE == 1) {
            const uint32_t a4[4] = {wf.x, wf.y, wf.z, wf.w};
            const uint32_t sfa = p < 2 ? *(const uint32_t *)(sr + (p * 8 + g) * 16 + 4 * s4) : 0u;
            mj_mma_e2m1_m16n8k64(acc, a4, bq[i], acc, sfa, sfb[i]);
        } else {
            uint32_t a16[4][4];
            dequant_frag(wf, *(const uint32_t *)(sr + g * 16 + 4 * s4), *(const uint32_t *)(sr + (g + 8) * 16 + 4 * s4),
                         p, a16);
            for (int kt = 0; kt < 4; kt++) mj_mma_bf16_m16n8k16(acc, a16[kt], b[i][kt], acc);
        }
    }
}

/* The MMAs of an item that is part of an expert (DPARTS > 1; its fragments in slot, its run's
 * scale chunk at sr) against the expert's n rows in the tile (row0 + i for token i): this
 * lane's sums accr (registers, the groups unrolled), or with SUMS_SMEM the sums in frag (the
 * warp's shared memory, [NT][32 lanes][4]: each lane's four side by side) and the groups one
 * rolled loop, as up's. An expert with at most 8 rows in the tile (one token group: every item
 * at TPE 8, and most at decode whatever TPE is) takes down_group: its sums in accr[0]
 * (registers, whatever SUMS_SMEM says). */
MJ_DEVICE void down_step(const uint8_t *slot, const uint8_t *sr, int part, long long row0, int n, const uint16_t *act,
                         const uint8_t *actq, const uint8_t *act_sf, int lane, float accr[][4], float *frag) {
    const int g = lane >> 2, p = lane & 3;
    const int s0 = item_step0(part);
    if (NT == 1 || n <= 8) {
        down_group(slot, sr, s0, row0, n, act, actq, act_sf, lane, accr[0]);
        return;
    }
    MJ_NO_UNROLL
    for (int i = 0; i < DSTEPS; i++) {
        const int s = s0 + i, s4 = s & 3;
        if (KS2 % DSTEPS != 0 && s >= KS2) break;
        const uint4 wf = *(const uint4 *)(slot + i * 512 + lane * 16);
        const uint32_t a4[4] = {wf.x, wf.y, wf.z, wf.w};
        uint32_t sfa = 0, a16[4][4];
        if (MODE == 1) sfa = p < 2 ? *(const uint32_t *)(sr + (p * 8 + g) * 16 + 4 * s4) : 0u;
        else
            dequant_frag(wf, *(const uint32_t *)(sr + g * 16 + 4 * s4), *(const uint32_t *)(sr + (g + 8) * 16 + 4 * s4),
                         p, a16);
        if (!SUMS_SMEM) {
            MJ_UNROLL
            for (int c = 0; c < NT; c++)
                if (c * 8 < n) mma_group(a4, sfa, a16, s, c * 8 + g < n ? row0 + c * 8 + g : -1, I, act, actq, act_sf, p, accr[c]);
            continue;
        }
        MJ_NO_UNROLL
        for (int c = 0; c < NT && c * 8 < n; c++) {
            float4 *cp = (float4 *)frag + c * 32 + lane;
            const float4 v = *cp;
            float d[4] = {v.x, v.y, v.z, v.w};
            mma_group(a4, sfa, a16, s, c * 8 + g < n ? row0 + c * 8 + g : -1, I, act, actq, act_sf, p, d);
            *cp = make_float4(d[0], d[1], d[2], d[3]);
        }
    }
}

/* One token group's D fragment of an expert (d, a lane's four sums) into the sums: d_i is
 * dim g (+8 for i >= 2) of the expert's row c * 8 + 2p (+1 for odd i), times weight * alpha
 * (a shared sub-expert's weight: 1, or the token's gate sgate_w[token] that up wrote). A row's
 * token, slot and weight are read once, for both its dims. DEAL 1: into the block's slot tile,
 * tile[token - t0][slot][dim] =, slot the row's top-k slot (row_index's, modulo K) or K + j
 * for shared sub-expert j; DEAL 0: into the warp's own, tile[token - t0][dim] +=, in the
 * warp's expert order. Each element is one lane's of one warp's. */
MJ_DEVICE void down_epi_group(const down_item_t *it, int c, const float d[4], const int32_t *idx,
                              const int32_t *row_index, const float *weights, int t0, int lane, float *tile,
                              const float *sgate_w, int n_local) {
    const int g = lane >> 2, p = lane & 3;
    const int routed = it->shared_row0 < 0;
    /* One load, whichever the weight: a routed row's (weights[entry]) or a shared
     * sub-expert's, its token's gate (sgate_w[token]); without a gate it is 1, and the
     * load reads weights[token] (in bounds: B K entries) for nothing. No branch on
     * sgate_w: ptxas would compile the rest of the epilogue once for either case. */
    const float *const wsrc = routed || !sgate_w ? weights : sgate_w;
    const int wone = !routed && !sgate_w;
    MJ_UNROLL
    for (int h = 0; h < 2; h++) {
        /* Both rows, branch-free (they share their setup); a row past n takes the item's
         * first row's entry or token (every load in bounds) and stores nothing. */
        const int ti = c * 8 + 2 * p + h, ok = ti < it->n, tr = ok ? ti : c * 8;
        int tt = tr, slot = K + it->xi - n_local, wi = t0 + tr; /* tt: the row's token - t0 */
        if (routed) {
            const int ri = c * 8 + 8 <= DRIDX ? idx[tr] : row_index[it->r0 + tr], tk = (int)((unsigned)ri / K);
            tt = tk - t0, slot = ri - tk * K, wi = ri; /* an entry is >= 0 */
        }
        const float wv = wsrc[wi], wgt = wone ? 1.0f : wv;
        float *o = tile + (DEAL ? tt * NSLOT + slot : tt) * 16 + g;
        const float v0 = wgt * (d[h] * it->alpha), v1 = wgt * (d[h + 2] * it->alpha);
        if (ok) {
            if (DEAL) o[0] = v0, o[8] = v1;
            else o[0] += v0, o[8] += v1;
        }
    }
}

/* An expert's sums of more than one token group, from frag (each lane's own, [NT][32][4]):
 * one rolled loop over the groups, one copy of down_epi_group's code. */
MJ_DEVICE void down_epilogue(const down_item_t *it, const int32_t *idx, const int32_t *row_index, const float *weights,
                             int t0, int lane, const float *frag, float *tile, const float *sgate_w, int n_local) {
    MJ_NO_UNROLL
    for (int c = 0; c < NT && c * 8 < it->n; c++) {
        const float4 v = ((const float4 *)frag)[c * 32 + lane];
        const float d[4] = {v.x, v.y, v.z, v.w};
        down_epi_group(it, c, d, idx, row_index, weights, t0, lane, tile, sgate_w, n_local);
    }
}

/* grid (H / 16, ceil(B / TPE)), block NW2 * 32, dynamic shared memory
 * NW2 * (DFRAG * 4 + DRING * DSLOT) + DTILE * 4 bytes: each warp's fragments (past one token
 * group), the sums (the block's slot tile, or each warp's), then each warp's ring. out [B, H] f32, or with out16 (not NULL) [B, H] bf16 there instead (rounded to
 * nearest even from the same f32 sum, NaN kept quiet, as mj_f32_to_bf16): every element
 * written (0 for padding tokens). sgate_w: the shared sub-experts' weight of each token (up's
 * shared_gate_once), or NULL: 1. With 8 warps, 3 blocks an SM (the knobs' choice where an SM
 * has 228 KiB, runtime/experts.c): ptxas keeps to the registers that lets (80). */
MJ_KERNEL void __launch_bounds__(NW2 * 32, NW2 == 8 ? 3 : 1) experts_down(const uint16_t *act, const uint8_t *actq, const uint8_t *act_sf, const uint8_t *w2,
                            const uint8_t *s2, const float *scal, const int32_t *counts,
                            const int32_t *offsets, const int32_t *active, const int32_t *n_active,
                            const int32_t *row_index, const float *weights, int B, const int32_t *num_valid,
                            int mb, int n_local, int expert_begin, int n_slots, float *out, uint16_t *out16,
                            const float *sgate_w) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
#if PART == 0 || PART == 3 /* else an empty kernel: this specialization compiles another */
    MJ_DYNAMIC_SHARED(float, smem);
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g = lane >> 2;
    const int d = (int)blockIdx.x; /* the block's 16 dims: 16d .. */
    const int t0 = tile_t0(), t1 = tile_t1(B);
    /* this warp's [NT][32][4]; the sums: [TPE][NSLOT][16] (DEAL 1) or [NW2][TPE][16] */
    float *frag = smem + w * DFRAG, *sums = smem + NW2 * DFRAG;
    float *tile = DEAL ? sums : sums + w * TPE * 16;
    MJ_NO_UNROLL
    for (int i = (int)threadIdx.x; i < DTILE; i += NW2 * 32) sums[i] = 0.0f; /* what no expert fills stays 0 */
    __syncthreads();
    const int na = n_active[0] < n_slots ? n_active[0] : n_slots;
    const int nv = valid_tokens(num_valid, B), tn = (nv < t1 ? nv : t1) - t0; /* the tile's valid tokens (<= 0: none) */
    uint8_t *ring = (uint8_t *)smem + NW2 * DFRAG * 4 + DTILE * 4 + w * DRING * DSLOT;
    /* The producer: the item DRING - 2 ahead of the one computed (one place that fetches
     * items, so next_expert's searches are compiled once). The warp's share: fill_places and
     * next_expert. By place the shared sub-experts take the places after the list's (na + j),
     * so the warp that took the last routed place is not given one too. */
    int pos = 0;
    int xn = 0, xr = 0; /* the lane's place in the warp's chunk, and its expert's first row (fill_places) */
    int row0 = 0; /* the item's first act row (token t0 + i at row0 + i; rows are ints, as the dispatch counts them) */
    float accr[SUMS_SMEM ? 1 : NT][4]; /* not read where DWHOLE */
    /* A pass a chunk of the warp's places (the list's, then the shared sub-experts'): the
     * chunk's experts stream through the ring (the inner loop, down's hot loop), which drains
     * before the next chunk (at decode one chunk holds a warp's share: GLM-5 at B 32 has 103
     * active experts, two chunks of 32 places by id with 4 warps, one by place). */
    MJ_NO_UNROLL
    for (int last = 0; !last;) {
        fill_places(&pos, &xn, &xr, na, counts, offsets, active, row_index, n_local, expert_begin, B, tn, w, lane);
        int ppart = DPARTS - 1;
        down_item_t pit = {0, 0, 0, -1, 0.0f, 0};
        down_item_t held = pit; /* the item issued on the trip before (item j: DRING - 2 is 1) */
        MJ_NO_UNROLL
        for (int j = -(DRING - 2);; j++) {
            /* item j + DRING - 2: the expert's next part, or the next expert's first */
            if (pit.xi >= 0) {
                if (++ppart == DPARTS) {
                    ppart = 0;
                    pit = next_expert(&xn, &xr, scal, n_local, mb, lane);
                }
            }
            down_issue(w2, s2, row_index, &pit, ppart, d, dslot(ring, (unsigned)(j + 1) % DRING), lane);
            const down_item_t it = held; /* item j, in every lane's registers alike */
            held = pit, held.part = ppart;
            if (j < 0) continue;
            mj_cp_async_wait(DRING - 2); /* item j's group has landed... */
            __syncwarp(0xFFFFFFFFu);     /* ...every lane's */
            const uint8_t *slot = dslot(ring, (unsigned)j % DRING);
            const int32_t *idx = (const int32_t *)(slot + DINDEX); /* its rows' top-k entries (last part) */
            if (it.xi < 0) break;
            const int ipart = DPARTS == 1 ? 0 : it.part; /* one part an expert: 0, known here */
            /* the run's scale chunk: in this slot for a run's first part, else (DSTEPS 2, the
             * run's second part) in the slot of the item before, the same expert's first */
            const uint8_t *sr = (DSTEPS == 4 || (ipart & 1) == 0 ? slot : dslot(ring, (unsigned)(j + DRING - 1) % DRING)) + DSCALES;
            if (ipart == 0) /* a new expert: its rows */
                row0 = it.shared_row0 >= 0 ? it.shared_row0 + t0 : it.r0;
            if (DWHOLE) {
                /* The item is the whole expert: its token groups one at a time, each from its
                 * MMAs to its epilogue in registers (a second group, rare at decode, reads
                 * the item's fragments from the ring again). */
                MJ_NO_UNROLL
                for (int c = 0; c < NT && c * 8 < it.n; c++) {
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    down_group(slot, sr, 0, row0 + c * 8, it.n - c * 8, act, actq, act_sf, lane, acc);
                    down_epi_group(&it, c, acc, idx, row_index, weights, t0, lane, tile, sgate_w, n_local);
                }
            } else {
                if (ipart == 0) { /* a new expert: fresh sums (each lane its own) */
                    if (!SUMS_SMEM) {
                        MJ_UNROLL
                        for (int c = 0; c < NT; c++)
                            for (int q = 0; q < 4; q++) accr[c][q] = 0.0f;
                    } else if (it.n <= 8) { /* down_step's one-group path: registers */
                        for (int q = 0; q < 4; q++) accr[0][q] = 0.0f;
                    } else {
                        MJ_NO_UNROLL
                        for (int c = 0; c < NT && c * 8 < it.n; c++) ((float4 *)frag)[c * 32 + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
                }
                down_step(slot, sr, ipart, row0, it.n, act, actq, act_sf, lane, accr, frag);
                if (ipart == DPARTS - 1) {
                    if (NT == 1 || it.n <= 8) { /* one token group: its sums in accr[0] */
                        down_epi_group(&it, 0, accr[0], idx, row_index, weights, t0, lane, tile, sgate_w, n_local);
                    } else {
                        if (!SUMS_SMEM) {
                            MJ_UNROLL
                            for (int c = 0; c < NT; c++)
                                for (int q = 0; q < 4; q++) frag[(c * 32 + lane) * 4 + q] = accr[c][q];
                        }
                        down_epilogue(&it, idx, row_index, weights, t0, lane, frag, tile, sgate_w, n_local);
                    }
                }
            }
            __syncwarp(0xFFFFFFFFu); /* every lane is done with this slot and the one before */
        }
        mj_cp_async_wait(0); /* the chunk's last groups (empty) have landed: the ring is free */
        __syncwarp(0xFFFFFFFFu);
        last = POS_LAST(pos);
    }
    mj_cp_async_wait(0); /* nothing lands after the warp is done (the empty groups) */
    __syncthreads();     /* every warp's experts are in the sums */
    /* Each token's slots added in slot order (its top-k slots, then the shared sub-experts),
     * or the warps' sums in warp order (each its experts' in ascending id). */
    MJ_NO_UNROLL
    for (int i = (int)threadIdx.x; i < (t1 - t0) * 16; i += NW2 * 32) {
        const float *ts = DEAL ? sums + (i / 16) * NSLOT * 16 + i % 16 : sums + i;
        float v = ts[0];
        MJ_NO_UNROLL
        for (int u = 1; u < (DEAL ? NSLOT : NW2); u++) v += ts[u * (DEAL ? 16 : TPE * 16)];
        const long long o = (long long)(t0 + i / 16) * H + 16 * d + i % 16;
        if (out16) {
            const uint32_t u = mj_f32_bits(v);
            out16[o] = (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 0x40u : bf16_bits(v));
        } else {
            out[o] = v;
        }
    }
#endif
}

/* ---- experts_silu (a check of silu) --------------------------------------------------------
 * y[i] = silu(x[i]) and want[i] = x[i] / (1.0f + expf(-x[i])), IEEE division where it runs
 * (the C compiler's on the interpreter, the GPU's division instruction on a GPU), a
 * grid-stride loop; a body only in PART 0: test_experts compares y with want bit for bit. */
MJ_KERNEL void experts_silu(const float *x, int n, float *y, float *want) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
#if PART == 0
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        y[i] = silu(x[i]);
        want[i] = x[i] / (1.0f + expf(-x[i]));
    }
#endif
}

/* ---- experts_dequant (a check of W4A16's dequantization) ------------------------------------
 * out[8i + 4hf .. + 3] = the four bf16 pairs e2m1x8_bf16 makes of the eight codes in words[i]
 * (as the target's packed weights hold them: bit-placed below sm_120) with the block scale in
 * byte 2hf + (i & 1) of scales[i] (as e4m3x2_bf16 brings both, for a lane's either place in
 * a k-group pair), a grid-stride loop; a body only in PART 0: test_experts (on the
 * interpreter) and test_moe_gpu dequant (on a GPU) compare each bf16 with the code's value x
 * the scale x 2^-7, bit for bit, for every code and every block scale byte (0x00 - 0x7E). */
MJ_KERNEL void experts_dequant(const uint32_t *words, const uint32_t *scales, int n, uint32_t *out) {
    mj_grid_dep_wait(); /* before any memory: the grid before this one has finished */
#if PART == 0
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        const uint32_t sp = e4m3x2_bf16(scales[i], i & 1);
        for (int hf = 0; hf < 2; hf++) {
            uint32_t r[4];
            e2m1x8_bf16(words[i], bf16_bcast(sp, hf), r);
            for (int q = 0; q < 4; q++) out[8 * i + 4 * hf + q] = r[q];
        }
    }
#endif
}

