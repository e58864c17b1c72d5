/* test_experts.c — the expert GEMM kernels on the interpreter against the CPU reference.
 *
 * A forward is checked stage by stage, each against an oracle computed here in double from
 * the layer's own (ModelOpt-layout) tensors, with a bound derived from the arithmetic:
 *
 *   quant (W4A4)  the hidden rows quantized per (token, expert): bytes equal
 *                 mj_nvfp4_quantize_act's exactly;
 *   up            each activation element: the SwiGLU of the exact gate and up sums, within
 *                 the float rounding the kernel may add (H/16 + NW1 + 4 roundings of at most
 *                 2^-24 of the sum of |terms| each), then rounded to bf16 (W4A16: the
 *                 kernel's value must lie between the roundings of the interval's ends) or
 *                 quantized to NVFP4 (W4A4: the bytes equal the oracle's, except at most 1%
 *                 of the blocks, and those by one code or one scale step: a sum that falls
 *                 within the bound of a rounding boundary can land either way);
 *   down          each output element: the weighted sum over the token's experts of w2 .
 *                 act, from the activations the kernel wrote, within (I/16 + k + NSUB + 4)
 *                 roundings of 2^-24 of the sum of |terms|.
 *
 * A swapped scale, a wrong lane or an off-by-one k-block moves results by far more than
 * these bounds: the mutation tests break the packed weights in exactly those ways and the
 * checks must fail. Also: the whole forward against mj_experts_ref (relative L2), bytes of
 * weights read (each active expert's once), same bits run after run, a recorded launch
 * sequence replayed at several token counts, W4A4's quantizer on -0.0, negatives that
 * round to zero and saturating blocks (the GPU's sign rule), every specialization the
 * dispatcher picks, GLM-5-shaped experts, refusals, the SASS of the compiled kernels, and
 * silu's division (done without a division instruction) against IEEE's, bit for bit, on
 * 4.3 million floats.
 */
#include "experts.h"
#include "sim/sim.h"
#include "test.h"
#include "test_routing.h"
#include "weights/pack.h"

#define U24 (1.0 / 16777216.0)

/* ---- a layer and a routing ------------------------------------------------------------------ */

/* A routing made by hand (B = 64, k = 4, E >= 16): experts 0..4 get 0, 1, 8, 9 and 33
 * tokens; the rest spread over experts 5..; tokens keep 2..4 of their slots (as OEA leaves
 * them); weights random. */
static void route_crafted(int B, int k, int E, uint64_t *rng, routing *r) {
    routing_alloc(r, B, k, E);
    r->nv = B;
    for (int b = 0; b < B; b++) {
        int n = 2 + (int)(mj_rng_next(rng) % (uint64_t)(k - 1));
        int want[4] = {b < 33 ? 4 : -1, b < 9 ? 3 : -1, b < 8 ? 2 : -1, b == 40 ? 1 : -1};
        int n_want = (want[0] >= 0) + (want[1] >= 0) + (want[2] >= 0) + (want[3] >= 0);
        if (n < n_want) n = n_want;
        int j = 0;
        for (int q = 0; q < 4 && j < n; q++)
            if (want[q] >= 0) r->ids[b * k + j++] = want[q];
        for (int q = 0; j < n; q++) {
            int e = 5 + (b * 3 + q * 5) % (E - 5);
            int dup = 0;
            for (int i = 0; i < j; i++) dup |= r->ids[b * k + i] == e;
            if (!dup) r->ids[b * k + j++] = e;
        }
        for (int i = 0; i < k; i++) r->w[b * k + i] = i < n ? (float)(0.1 + mj_rng_uniform(rng)) : 0.0f;
        for (int i = n; i < k; i++) r->ids[b * k + i] = -1;
        r->nsel[b] = n;
    }
    routing_dispatch(r);
}

/* ---- the oracle ----------------------------------------------------------------------------- */

/* An expert of the packed set: xi < n_local routed, else shared sub-expert xi - n_local. */
typedef struct oexpert {
    const mj_nvfp4_linear *w13, *w2;
    int gate0, up0, col0;
} oexpert;

static oexpert expert_of(mj_layer_t L, int xi) {
    if (xi < L->n_local) return (oexpert){&L->w13[xi], &L->w2[xi], 0, L->i_local, 0};
    int j = xi - L->n_local;
    return (oexpert){&L->shared_w13, &L->shared_w2, j * L->i_local, L->is_local + j * L->i_local, j * L->i_local};
}

/* Rows [r0, r0 + n) x columns [c0, c0 + m) of a linear in unit values (malloc'd). */
static double *unit_block(const mj_nvfp4_linear *l, int64_t r0, int64_t n, int64_t c0, int64_t m) {
    double *u = malloc(sizeof(double) * (size_t)(n * m)), e2m1[16];
    for (int i = 0; i < 16; i++) e2m1[i] = mj_e2m1_decode((uint8_t)i);
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < m; c += 16) { /* c0 and m are whole 16-blocks */
            const uint8_t *q = l->weight + (r0 + r) * (l->k_in / 2) + (c0 + c) / 2;
            double s = mj_e4m3_decode(l->weight_scale[(r0 + r) * (l->k_in / 16) + (c0 + c) / 16]);
            for (int j = 0; j < 16; j++) u[r * m + c + j] = e2m1[(q[j / 2] >> (4 * (j & 1))) & 15] * s;
        }
    return u;
}

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* Failures of the stage checks, when counting instead of asserting (mutation tests). */
static int g_count_only, g_counted;
/* run_forward checks quant and up alone, not down nor the forward against mj_experts_ref (a
 * routing that names an expert twice a token: down does not add such a token's two slots as
 * its oracle and the reference do) */
static int g_up_only;
#define STAGE(cond, ...)                                                                 \
    do {                                                                                 \
        if (g_count_only) g_counted += !(cond);                                          \
        else CHECK(cond, __VA_ARGS__);                                                   \
    } while (0)

typedef struct fwd {
    mj_layer_t L;
    mj_experts_t ex;
    mj_experts_view v;
    mj_weight_mode mode;
    mj_knobs_moe_experts kn;
    const uint16_t *hidden;
    const routing *r;
    const float *out;
} fwd;

/* The input x of an expert's up GEMM as the kernel multiplies it: bf16 (W4A16) or the NVFP4
 * unit values of its quantization with the expert's input_scale (W4A4). */
static void up_input(const fwd *f, int xi, int token, double *xin) {
    const int H = f->v.H;
    float *x = malloc(sizeof(float) * (size_t)H);
    for (int h = 0; h < H; h++) x[h] = mj_bf16_to_f32(f->hidden[(int64_t)token * H + h]);
    if (f->mode == MJ_MODE_W4A16) {
        for (int h = 0; h < H; h++) xin[h] = x[h];
    } else {
        uint8_t *q = malloc((size_t)H / 2), *sf = malloc((size_t)H / 16);
        CHECK_OK(mj_nvfp4_quantize_act(x, 1, H, expert_of(f->L, xi).w13->input_scale, "x", q, sf));
        for (int h = 0; h < H; h++)
            xin[h] = (double)mj_e2m1_decode((uint8_t)((h & 1) ? q[h / 2] >> 4 : q[h / 2] & 15)) * mj_e4m3_decode(sf[h / 16]);
        free(q), free(sf);
    }
    free(x);
}

/* Quantized activation rows are kept in fragment order (templates/moe_experts.cu): per
 * 64-element step, natural u32 word wi at word wi < 4 ? 2 wi : 2 (wi - 4) + 1. The natural
 * bytes of a row of k elements: */
static void frag_to_nat(const uint8_t *frag, int k, uint8_t *nat) {
    for (int s = 0; s < k / 64; s++)
        for (int wi = 0; wi < 8; wi++) {
            int fw = wi < 4 ? 2 * wi : 2 * (wi - 4) + 1;
            memcpy(nat + 32 * s + 4 * wi, frag + 32 * s + 4 * fw, 4);
        }
}

/* Stage quant (W4A4): the kernel's quantized rows equal mj_nvfp4_quantize_act's. */
static void check_quant(const fwd *f) {
    const int H = f->v.H, K = f->v.K;
    float *x = malloc(sizeof(float) * (size_t)H);
    uint8_t *q = malloc((size_t)H / 2), *sf = malloc((size_t)H / 16), *nat = malloc((size_t)H / 2);
    int bad = 0, rows = 0;
    for (int b = 0; b < f->r->nv; b++)
        for (int j = 0; j <= K; j++) {
            int xi, row;
            if (j < K) {
                if (j >= f->r->nsel[b]) continue;
                xi = f->r->ids[b * K + j] - f->v.expert_begin;
                if (xi < 0 || xi >= f->v.n_local) continue;
                row = f->r->perm[b * K + j];
            } else {
                if (!f->v.nsub) continue;
                xi = f->v.n_local, row = f->v.mb * K + b;
            }
            for (int h = 0; h < H; h++) x[h] = mj_bf16_to_f32(f->hidden[(int64_t)b * H + h]);
            CHECK_OK(mj_nvfp4_quantize_act(x, 1, H, expert_of(f->L, xi).w13->input_scale, "x", q, sf));
            frag_to_nat(f->v.xq + (int64_t)row * H / 2, H, nat);
            bad += memcmp(q, nat, (size_t)H / 2) != 0 ||
                   memcmp(sf, f->v.xsf + (int64_t)row * H / 16, (size_t)H / 16) != 0;
            rows++;
        }
    STAGE(bad == 0, "quant: %d of %d rows differ from mj_nvfp4_quantize_act", bad, rows);
    free(x), free(q), free(sf), free(nat);
}

/* The activation rows of one expert: (act row, token) pairs. */
typedef struct arow {
    int row, token;
} arow;

static int expert_rows(const fwd *f, int xi, arow *rows) {
    int n = 0;
    if (xi < f->v.n_local) {
        int e = xi + f->v.expert_begin;
        for (int i = 0; i < f->r->cnt[e]; i++) {
            int row = f->r->off[e] + i;
            rows[n++] = (arow){row, f->r->rix[row] / f->v.K};
        }
    } else {
        for (int b = 0; b < f->r->nv; b++) rows[n++] = (arow){f->v.mb * f->v.K + (xi - f->v.n_local) * f->v.mb + b, b};
    }
    return n;
}

static int e2m1_step(float mag) { /* index of a magnitude on the E2M1 grid */
    static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < 8; i++)
        if (grid[i] == mag) return i;
    return -100;
}

/* Stage up: every activation element of every expert that has rows. */
static void check_up(const fwd *f) {
    const int H = f->v.H, I = f->v.I, X = f->v.n_local + f->v.nsub;
    const double c1 = (H / 16 + f->kn.NW1 + 4) * U24;
    double *xin = malloc(sizeof(double) * (size_t)H), *h = malloc(sizeof(double) * (size_t)I),
           *hb = malloc(sizeof(double) * (size_t)I);
    arow *rows = malloc(sizeof(arow) * (size_t)(f->v.mb * (f->v.K + 1) + 1));
    int64_t bad = 0, n_el = 0, bad_blocks = 0, n_blocks = 0, far_blocks = 0;
    for (int xi = 0; xi < X; xi++) {
        oexpert o = expert_of(f->L, xi);
        const float ws2 = o.w13->weight_scale_2, alpha = f->mode == MJ_MODE_W4A4 ? o.w13->input_scale * ws2 : ws2;
        int n = expert_rows(f, xi, rows);
        if (n == 0) continue;
        double *ug = unit_block(o.w13, o.gate0, I, 0, H), *uu = unit_block(o.w13, o.up0, I, 0, H);
        for (int ri = 0; ri < n; ri++) {
            up_input(f, xi, rows[ri].token, xin);
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0, mg = 0, mu = 0;
                for (int k = 0; k < H; k++) {
                    double wg = ug[(int64_t)i * H + k], wu = uu[(int64_t)i * H + k];
                    g += xin[k] * wg, u += xin[k] * wu, mg += fabs(xin[k] * wg), mu += fabs(xin[k] * wu);
                }
                g *= alpha, u *= alpha, mg *= alpha, mu *= alpha;
                double dg = c1 * mg + fabs(g) * U24, du = c1 * mu + fabs(u) * U24;
                double sg = silu_d(g);
                h[i] = sg * u;
                hb[i] = 1.1 * fabs(u) * dg + (fabs(sg) + 1.1 * dg) * du + 8 * U24 * fabs(h[i]); /* + silu's own */
            }
            if (f->mode == MJ_MODE_W4A16) {
                const uint16_t *got = f->v.act + (int64_t)rows[ri].row * I;
                for (int i = 0; i < I; i++) {
                    float lo = mj_bf16_to_f32(mj_f32_to_bf16((float)(h[i] - hb[i])));
                    float hi = mj_bf16_to_f32(mj_f32_to_bf16((float)(h[i] + hb[i])));
                    float a = mj_bf16_to_f32(got[i]);
                    n_el++;
                    if (!(a >= lo && a <= hi)) {
                        if (bad < 3 && !g_count_only)
                            fprintf(stderr, "  up: expert %d row %d col %d: act %.9g, want %.9g (+-%.3g)\n", xi,
                                    rows[ri].row, i, (double)a, h[i], hb[i]);
                        bad++;
                    }
                }
            } else {
                float *hf = malloc(sizeof(float) * (size_t)I);
                uint8_t *q = malloc((size_t)I / 2), *sf = malloc((size_t)I / 16);
                for (int i = 0; i < I; i++) hf[i] = (float)h[i];
                CHECK_OK(mj_nvfp4_quantize_act(hf, 1, I, o.w2->input_scale, "act", q, sf));
                uint8_t *gq = malloc((size_t)I / 2);
                frag_to_nat(f->v.actq + (int64_t)rows[ri].row * I / 2, I, gq);
                const uint8_t *gsf = f->v.act_sf + (int64_t)rows[ri].row * I / 16;
                for (int blk = 0; blk < I / 16; blk++) {
                    n_blocks++;
                    if (!memcmp(q + blk * 8, gq + blk * 8, 8) && sf[blk] == gsf[blk]) continue;
                    bad_blocks++;
                    /* A near-boundary sum: one scale step, and each code within one step. */
                    int far = abs((int)sf[blk] - (int)gsf[blk]) > 1;
                    for (int j = 0; j < 16 && !far; j++) {
                        int s = 4 * (j & 1);
                        uint8_t cw = (uint8_t)((q[blk * 8 + j / 2] >> s) & 15), cg = (uint8_t)((gq[blk * 8 + j / 2] >> s) & 15);
                        float vw = mj_e2m1_decode(cw), vg = mj_e2m1_decode(cg);
                        if (sf[blk] != gsf[blk]) continue; /* a new scale moves every code: the scale step decides */
                        far |= abs(e2m1_step(fabsf(vw)) * (vw < 0 ? -1 : 1) - e2m1_step(fabsf(vg)) * (vg < 0 ? -1 : 1)) > 1;
                    }
                    far_blocks += far;
                }
                free(hf), free(q), free(sf), free(gq);
            }
        }
        free(ug), free(uu);
    }
    if (f->mode == MJ_MODE_W4A16)
        STAGE(bad == 0, "up: %lld of %lld activations outside the bound", (long long)bad, (long long)n_el);
    else
        STAGE(far_blocks == 0 && bad_blocks * 100 <= n_blocks,
              "up: %lld of %lld NVFP4 blocks differ from the oracle's, %lld by more than one step",
              (long long)bad_blocks, (long long)n_blocks, (long long)far_blocks);
    free(xin), free(h), free(hb), free(rows);
}

/* The activation the kernel wrote, as the down GEMM multiplies it (unit values for W4A4). */
static double act_value(const fwd *f, int row, int i) {
    const int I = f->v.I;
    if (f->mode == MJ_MODE_W4A16) return mj_bf16_to_f32(f->v.act[(int64_t)row * I + i]);
    int s = i / 64, wi = (i % 64) / 8, fw = wi < 4 ? 2 * wi : 2 * (wi - 4) + 1;
    uint8_t byte = f->v.actq[(int64_t)row * I / 2 + 32 * s + 4 * fw + (i % 8) / 2];
    return (double)mj_e2m1_decode((uint8_t)((i & 1) ? byte >> 4 : byte & 15)) * mj_e4m3_decode(f->v.act_sf[(int64_t)row * I / 16 + i / 16]);
}

/* Stage down: every output element, from the kernel's own activations. */
static void check_down(const fwd *f) {
    const int H = f->v.H, I = f->v.I, K = f->v.K, B = f->r->B, X = f->v.n_local + f->v.nsub;
    double *want = calloc((size_t)B * H, sizeof(double)), *mag = calloc((size_t)B * H, sizeof(double));
    arow *rows = malloc(sizeof(arow) * (size_t)(f->v.mb * (K + 1) + 1));
    for (int xi = 0; xi < X; xi++) {
        oexpert o = expert_of(f->L, xi);
        const float ws2 = o.w2->weight_scale_2, alpha = f->mode == MJ_MODE_W4A4 ? o.w2->input_scale * ws2 : ws2;
        int n = expert_rows(f, xi, rows);
        if (n == 0) continue;
        double *u2 = unit_block(o.w2, 0, H, o.col0, I), *a = malloc(sizeof(double) * (size_t)I);
        for (int ri = 0; ri < n; ri++) {
            double wt = xi < f->v.n_local ? f->r->w[f->r->rix[rows[ri].row]] : 1.0;
            for (int i = 0; i < I; i++) a[i] = act_value(f, rows[ri].row, i);
            for (int d = 0; d < H; d++) {
                double y = 0, m = 0;
                for (int i = 0; i < I; i++) {
                    double t = a[i] * u2[(int64_t)d * I + i];
                    y += t, m += fabs(t);
                }
                want[(int64_t)rows[ri].token * H + d] += wt * alpha * y;
                mag[(int64_t)rows[ri].token * H + d] += fabs(wt) * alpha * m;
            }
        }
        free(u2), free(a);
    }
    const double c2 = (I / 16 + K + f->v.nsub + 4) * U24;
    int64_t bad = 0;
    for (int64_t i = 0; i < (int64_t)B * H; i++) {
        double tol = c2 * mag[i];
        if (!(fabs(f->out[i] - want[i]) <= tol)) {
            if (bad < 3 && !g_count_only)
                fprintf(stderr, "  down: out[%lld][%lld] = %.9g, want %.9g (+-%.3g)\n", (long long)(i / H),
                        (long long)(i % H), (double)f->out[i], want[i], tol);
            bad++;
        }
    }
    STAGE(bad == 0, "down: %lld of %lld outputs outside the bound", (long long)bad, (long long)B * H);
    free(want), free(mag), free(rows);
}

/* ---- running a forward -------------------------------------------------------------------- */

/* The route outputs of r, poisoned-buffer style: copied in (host pointers on the sim). */
static mj_route_outputs route_outputs(const routing *r) {
    mj_route_outputs o = MJ_ROUTE_OUTPUTS_INIT;
    o.ids = r->ids, o.weights = r->w, o.n_sel = r->nsel, o.expert_counts = r->cnt, o.expert_offsets = r->off;
    o.active_experts = r->act, o.n_active = &((routing *)r)->na, o.permutation = r->perm, o.row_index = r->rix;
    return o;
}

/* What the tests saw of the dispatcher's choices. */
static int g_seen_halfruns; /* up's pieces of half a run (its runs did not deal evenly) */
static int g_seen_tpe[65], g_seen_nw1[17], g_seen_nw2[9], g_seen_ds[5], g_seen_stream[2], g_seen_deal[2], g_seen_chunks,
    g_seen_tiles;
/* The shapes up's STREAM runs took: [0] a tile over 2 or more warps, [1] over 3 or more (a
 * run inside a tile), [2] a run holding a whole tile and part of another, [3] an empty run
 * (fewer pieces than warps), [4] a run of whole tiles alone. */
static int g_seen_runs[5];

/* What warp b's run of P pieces (G warps, tiles of U pieces) is, as the template cuts it
 * (stream_cut: the first P % G runs P / G + 1 long, the rest P / G). */
static void stream_seen(int64_t P, int64_t G, int64_t U) {
    for (int64_t b = 0; b < G; b++) {
        const int64_t base = P / G, rem = P % G, r0 = b * base + (b < rem ? b : rem), r1 = r0 + base + (b < rem);
        if (r0 == r1) {
            g_seen_runs[3] = 1;
            continue;
        }
        const int cut0 = r0 % U != 0, cut1 = r1 % U != 0 && r1 < P;
        g_seen_runs[0] |= cut0 || cut1;
        g_seen_runs[1] |= cut0 && cut1 && r0 / U == r1 / U;
        g_seen_runs[2] |= (cut0 || cut1) && (r0 + U - 1) / U * U + U <= r1;
        g_seen_runs[4] |= !cut0 && !cut1;
    }
}

/* One forward of routing r on L in mode, checked stage by stage and against mj_experts_ref.
 * Returns the stage failures when counting (mutation tests). */
static int run_forward(mj_context_t ctx, mj_layer_t L, mj_experts_t ex, mj_weight_mode mode, const uint16_t *hidden,
                       const routing *r, const char *what) {
    const int B = r->B, H = L->cfg.hidden;
    fwd f = {L, ex, {0}, mode, {0}, hidden, r, NULL};
    mj_experts_view_get(ex, &f.v);
    mj_experts_plan(ex, mode, B, &f.kn);
    g_seen_tpe[f.kn.TPE] = g_seen_nw1[f.kn.NW1] = g_seen_nw2[f.kn.NW2] = g_seen_ds[f.kn.DSTEPS] = 1;
    g_seen_stream[f.kn.STREAM] = g_seen_deal[f.kn.DEAL] = 1;
    g_seen_halfruns |= mj_experts_up_spp(H, f.kn.NW1, f.kn.STREAM) == 2;
    if (f.kn.STREAM) {
        const int64_t U = mj_experts_up_pieces(H, f.kn.NW1, 1), n_slots = (int64_t)B * r->k < r->E ? (int64_t)B * r->k : r->E;
        stream_seen((f.v.nsub + (r->na < n_slots ? r->na : n_slots)) * (f.v.I / 16) * U,
                    (int64_t)mj_experts_up_grid(ex, &f.kn, 0) * f.kn.NW1, U);
    }
    for (int e = 0; e < r->E; e++) g_seen_chunks |= r->cnt[e] > f.kn.TPE;
    g_seen_tiles |= B > f.kn.TPE;
    tbuf out = tbuf_new(sizeof(float) * (size_t)B * H, 0);
    tbuf_poison(&out, 0x55);
    int32_t nv = r->nv;
    mj_route_outputs ro = route_outputs(r);
    int before = g_fail;
    CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, nv == B ? NULL : &nv, out.p, NULL));
    if (f.v.ucount && mj_experts_device(ex) == MJ_DEVICE_NONE) { /* up's counters back to 0 for the next forward */
        mj_experts_view_get(ex, &f.v);
        int64_t left = 0;
        for (int64_t i = 0; i < (int64_t)f.v.ucount_tiles * (f.v.I / 16); i++) left += f.v.ucount[i] != 0;
        CHECK(left == 0, "%s: %lld of up's tile counters not back to 0", what, (long long)left);
    }
    float *got = malloc(sizeof(float) * (size_t)B * H);
    tbuf_get(&out, got, "experts out");
    f.out = got;
    g_counted = 0;
    if (g_fail == before) {
        if (mode == MJ_MODE_W4A4) check_quant(&f);
        check_up(&f);
        if (!g_up_only) check_down(&f);
        if (!g_count_only && !g_up_only) {
            float *want = malloc(sizeof(float) * (size_t)B * H);
            CHECK_OK(mj_experts_ref(L, mode, hidden, B, nv, r->ids, r->w, r->nsel, want));
            double e = test_rel_l2(got, want, (size_t)B * H);
            /* W4A16: both round act to bf16 (an element may go the other way: 2^-8 of it);
             * W4A4: a requantized element may land one code away. */
            CHECK(e <= (mode == MJ_MODE_W4A16 ? 2e-3 : 5e-2), "%s: forward vs mj_experts_ref: relative L2 %.3g", what, e);
            int pad_bad = 0;
            for (int64_t i = (int64_t)nv * H; i < (int64_t)B * H; i++) pad_bad += got[i] != 0.0f;
            CHECK(pad_bad == 0, "%s: %d padding outputs are not 0", what, pad_bad);
            free(want);
        }
    }
    if (g_fail != before && !g_count_only)
        fprintf(stderr, "  in %s (%s, B=%d, valid=%d, TPE=%d NW1=%d NW2=%d)\n", what,
                mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", B, nv, f.kn.TPE, f.kn.NW1, f.kn.NW2);
    free(got);
    tbuf_free(&out);
    return g_counted;
}

/* ---- the tests ------------------------------------------------------------------------------ */

/* Pack then unpack gives the tensors back, and the packed bytes sit where the kernel's
 * fragment map says (an independent spot check of the picture in templates/moe_experts.cu). */
static void test_pack(uint64_t seed) {
    mj_moe_config c = test_moe_cfg(320, 192, 2, 2, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    const int H = 320, I = 192;
    int64_t b13 = mj_pack_w13_bytes(H, I), s13 = mj_pack_s13_bytes(H, I), b2 = mj_pack_w2_bytes(H, I),
            s2 = mj_pack_s2_bytes(H, I);
    CHECK(b13 == 2 * I * H / 2 && b2 == H * I / 2, "packed code bytes equal the natural ones");
    CHECK(s13 == (I / 16) * 2 * 512 && s2 == (H / 16) * 1 * 256, "scale chunks: runs of 4 k-steps, padded");
    uint8_t *p13 = malloc((size_t)b13), *q13 = malloc((size_t)s13), *p2 = malloc((size_t)b2), *q2 = malloc((size_t)s2);
    CHECK_OK(mj_pack_expert(&L->w13[1], 0, I, I, &L->w2[1], 0, 0, p13, q13, p2, q2));
    /* Lane 13 = (g 3, p 1), word a2 of tile 2 / step 3 / up: row I + 32 + 3, bytes 32*3 + 16 + 4. */
    CHECK(!memcmp(p13 + 2 * (H / 64) * 1024 + 3 * 1024 + 512 + 13 * 16 + 8,
                  L->w13[1].weight + (int64_t)(I + 32 + 3) * (H / 2) + 96 + 16 + 4, 4),
          "w13 fragment word a2 of lane 13");
    /* Scale chunk: tile 1, run 1, gate row 9: k-groups 16..19 of row 16 + 9 (H/16 = 20). */
    CHECK(!memcmp(q13 + 1 * 2 * 512 + 1 * 512 + 9 * 16, L->w13[1].weight_scale + (int64_t)25 * 20 + 16, 4) &&
              q13[1 * 2 * 512 + 512 + 9 * 16 + 4] == 0,
          "w13 scale chunk of a partial run, zero padded");
    mj_nvfp4_linear w13 = {2 * I, H, malloc((size_t)I * H), malloc((size_t)2 * I * H / 16), 0, 0};
    mj_nvfp4_linear w2 = {H, I, malloc((size_t)H * I / 2), malloc((size_t)H * I / 16), 0, 0};
    CHECK_OK(mj_unpack_expert(p13, q13, p2, q2, H, I, 0, &w13, &w2));
    CHECK(!memcmp(w13.weight, L->w13[1].weight, (size_t)I * H) &&
              !memcmp(w13.weight_scale, L->w13[1].weight_scale, (size_t)2 * I * H / 16),
          "w13 round trip");
    CHECK(!memcmp(w2.weight, L->w2[1].weight, (size_t)H * I / 2) && !memcmp(w2.weight_scale, L->w2[1].weight_scale, (size_t)H * I / 16),
          "w2 round trip");
    /* A shared expert of 2 I rows: sub-expert 1 is rows I.. of gate and of up, columns I.. */
    mj_moe_config c2 = test_moe_cfg(128, 64, 2, 2, 2);
    mj_layer_t L2 = NULL;
    CHECK_OK(mj_layer_create_random(&c2, seed + 1, &L2));
    if (L2) {
        uint8_t *a = malloc(64 * 128), *b = malloc(64 * 128 / 8 * 2), *cc = malloc(64 * 128 / 2), *d = malloc(8 * 256);
        CHECK_OK(mj_pack_expert(&L2->shared_w13, 64, 128 + 64, 64, &L2->shared_w2, 64, 0, a, b, cc, d));
        /* step 0 lane 0 word a0 of the gate half: row 64, bytes 0..3 */
        CHECK(!memcmp(a, L2->shared_w13.weight + 64 * 64, 4), "shared sub-expert gate rows");
        CHECK(!memcmp(a + 512, L2->shared_w13.weight + 192 * 64, 4), "shared sub-expert up rows");
        /* w2 tile 0 step 0 lane 0 word a0: row 0, columns 64.. = bytes 32.. */
        CHECK(!memcmp(cc, L2->shared_w2.weight + 32, 4), "shared sub-expert w2 columns");
        CHECK_STATUS(mj_pack_expert(&L2->shared_w13, 64, 200, 64, &L2->shared_w2, 64, 0, a, b, cc, d), MJ_ERR_INVALID_ARG);
        free(a), free(b), free(cc), free(d);
        mj_layer_free(L2);
    }
    /* Placed (W4A16 below sm_120): the same bytes, each code word bit-placed, and back. */
    uint8_t *r13 = malloc((size_t)b13), *r2 = malloc((size_t)b2), *t13 = malloc((size_t)s13), *t2 = malloc((size_t)s2);
    CHECK_OK(mj_pack_expert(&L->w13[1], 0, I, I, &L->w2[1], 0, 1, r13, t13, r2, t2));
    int off = 0;
    for (int64_t i = 0; i < b13; i += 4) {
        uint32_t a, b;
        memcpy(&a, p13 + i, 4), memcpy(&b, r13 + i, 4);
        off += b != mj_pack_place_word(a);
    }
    for (int64_t i = 0; i < b2; i += 4) {
        uint32_t a, b;
        memcpy(&a, p2 + i, 4), memcpy(&b, r2 + i, 4);
        off += b != mj_pack_place_word(a);
    }
    CHECK(off == 0 && !memcmp(t13, q13, (size_t)s13) && !memcmp(t2, q2, (size_t)s2),
          "placed: %d code words are not the plain pack's placed; the scales are the plain pack's", off);
    memset(w13.weight, 0, (size_t)I * H), memset(w2.weight, 0, (size_t)H * I / 2);
    CHECK_OK(mj_unpack_expert(r13, t13, r2, t2, H, I, 1, &w13, &w2));
    CHECK(!memcmp(w13.weight, L->w13[1].weight, (size_t)I * H) && !memcmp(w2.weight, L->w2[1].weight, (size_t)H * I / 2),
          "placed: w13 and w2 round trip");
    free(r13), free(r2), free(t13), free(t2);
    free(w13.weight), free(w13.weight_scale), free(w2.weight), free(w2.weight_scale);
    free(p13), free(q13), free(p2), free(q2);
    mj_layer_free(L);
}

/* The bit placement by hand (runtime/weights/pack.c's map: pair q's code 2q has m, e0, e1, s
 * at {0 1 2 9}, {3 4 5 12}, {6 7 8 15}, {13 14 10 11}; code 2q + 1 16 higher), a bijection on
 * random words, and what the kernel's placed e2m1x8_bf16 computes from a placed word (its four
 * expressions, here in C) is each code's e1 e0 m at bits 8 7 6 and s at 15 of its half. */
static void test_placement(uint64_t seed) {
    static const struct { uint32_t nat, placed; } hand[] = {
        {0x00000001u, 0x00000001u}, {0x00000008u, 0x00000200u}, {0x000000F0u, 0x02070000u},
        {0x00000F00u, 0x00001038u}, {0x0000F000u, 0x10380000u}, {0x000F0000u, 0x000081C0u},
        {0x00F00000u, 0x81C00000u}, {0x01000000u, 0x00002000u}, {0x02000000u, 0x00004000u},
        {0x04000000u, 0x00000400u}, {0x08000000u, 0x00000800u}, {0xF0000000u, 0x6C000000u},
        {0xFFFFFFFFu, 0xFFFFFFFFu}, {0u, 0u},
    };
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        CHECK(mj_pack_place_word(hand[i].nat) == hand[i].placed, "place(0x%08X) = 0x%08X, want 0x%08X", hand[i].nat,
              mj_pack_place_word(hand[i].nat), hand[i].placed);
        CHECK(mj_pack_unplace_word(hand[i].placed) == hand[i].nat, "unplace(0x%08X) = 0x%08X, want 0x%08X",
              hand[i].placed, mj_pack_unplace_word(hand[i].placed), hand[i].nat);
    }
    uint64_t rng = seed;
    int bad = 0, dq = 0;
    for (int i = 0; i < 100000; i++) {
        const uint32_t w = (uint32_t)(mj_rng_next(&rng) >> 32), p = mj_pack_place_word(w);
        bad += mj_pack_unplace_word(p) != w;
        const uint32_t r[4] = {(p << 6) & 0x81C081C0u, (p << 3) & 0x81C081C0u, p & 0x81C081C0u,
                               (((p >> 7) & 0x00D800D8u) * 0x821u) & 0x81C081C0u};
        for (int j = 0; j < 8; j++) {
            const uint32_t c = w >> (4 * j) & 15u, half = r[j / 2] >> (16 * (j & 1)) & 0xFFFFu;
            dq += half != ((c & 7u) << 6 | (c & 8u) << 12);
        }
    }
    CHECK(bad == 0, "placement: %d of 100000 random words (seed %llu) do not come back", bad, (unsigned long long)seed);
    CHECK(dq == 0, "placement: %d codes of 100000 random words do not come out at bits 8 7 6 and 15", dq);
}

static mj_experts_t make_experts(mj_context_t ctx, mj_layer_t L, int mb) {
    mj_experts_options o = MJ_EXPERTS_OPTIONS_INIT;
    o.max_batch = mb;
    mj_experts_t ex = NULL;
    CHECK_OK(mj_experts_create(ctx, L, &o, &ex));
    return ex;
}

/* ---- W4A16's dequantization ------------------------------------------------------------------ */

/* experts_dequant (the helpers up and down dequantize with) on every E2M1 code in every nibble
 * with every UE4M3 scale byte but the NaNs: each bf16 must be value x scale x 2^-7, bit for
 * bit (the exponent-0 codes are bf16 subnormals on the way: the interpreter's bf16 multiply
 * keeps them, as the GPU's must; test_moe_gpu dequant checks that one). */
static void test_dequant(mj_context_t ctx) {
    uint32_t *words = malloc(4 * TEST_DQ_WORDS), *laid = malloc(4 * TEST_DQ_WORDS), *scales = malloc(4 * TEST_DQ_WORDS),
             *out = malloc(32 * TEST_DQ_WORDS);
    const mj_function *f = NULL;
    CHECK_OK(test_silu_kernel(ctx, &f));
    CHECK(words && laid && scales && out, "dequant: no memory");
    if (f && words && laid && scales && out) {
        test_dequant_inputs(words, scales);
        test_dequant_layout(ctx, words, laid);
        memset(out, 0xEE, 32 * TEST_DQ_WORDS);
        const mj_launch_dims d = {{16, 1, 1}, {128, 1, 1}, 0, NULL};
        CHECK_OK(mj_launch_experts_dequant(f, d, laid, scales, TEST_DQ_WORDS, out));
        const int bad = test_dequant_bad(words, scales, out);
        CHECK(bad == 0, "dequant (%s): %d of %d bf16 values are not code x scale x 2^-7",
              mj_target_name(mj_context_target(ctx)), bad, 16 * TEST_DQ_WORDS);
    }
    free(words), free(laid), free(scales), free(out);
}

/* ---- silu ------------------------------------------------------------------------------------ */

/* silu's counts over the inputs checked so far. */
typedef struct silu_tally {
    unsigned long long n;
    long long bad, host, once_off;
} silu_tally;

/* experts_silu on x[0..len) (y and want its outputs), tallied. */
static void silu_chunk(const mj_function *f, const float *x, int len, float *y, float *want, silu_tally *t) {
    const mj_launch_dims d = {{64, 1, 1}, {256, 1, 1}, 0, NULL};
    CHECK_OK(mj_launch_experts_silu(f, d, x, len, y, want));
    for (int i = 0; i < len; i++) {
        const float v = x[i], w = v / (1.0f + expf(-v));
        t->n++;
        if (mj_f32_bits(want[i]) != mj_f32_bits(w) && !(w != w && want[i] != want[i])) t->host++;
        if (mj_f32_bits(y[i]) != mj_f32_bits(want[i]) && !(want[i] != want[i] && y[i] != y[i]))
            if (t->bad++ < 4) fprintf(stderr, "  silu(%a) = %a, want %a\n", (double)v, (double)y[i], (double)want[i]);
        /* the quotient before the kernel's last step, for the inputs that reach it */
        float dd = 1.0f + expf(-v), xx = v;
        if (dd == 1.0f || fabsf(xx) < 0x1p-25f || !(dd <= 0x1.fffffep+127f)) continue;
        if (dd >= 0x1p64f) xx *= 0x1p-64f, dd *= 0x1p-64f;
        float r = mj_f32_from_bits(0x7EF311C3u - mj_f32_bits(dd));
        for (int k = 0; k < 3; k++) r = fmaf(fmaf(-dd, r, 1.0f), r, r);
        float q = xx * r;
        q = fmaf(fmaf(-q, dd, xx), r, q);
        t->once_off += mj_f32_bits(q) != mj_f32_bits(want[i]);
    }
}

/* The kernels' silu divides without a division instruction (see the template): experts_silu
 * runs it on the interpreter for every float at a stride (MOEJIT_TEST_SILU_STRIDE, default
 * 1021; 1 is all 2^32, about 2 minutes more), the neighbourhoods of its branches' edges and the
 * inputs whose quotient is hardest to round; each result must be the bits of the kernel's own
 * x / (1.0f + expf(-x)), which must be this program's. The sweep holds inputs where a quotient
 * corrected once (the kernel's step before the last) is an ulp off, so the last step is
 * exercised. */
static void test_silu(mj_context_t ctx) {
    const char *env = getenv("MOEJIT_TEST_SILU_STRIDE");
    const uint64_t stride = env && atoll(env) > 0 ? (uint64_t)atoll(env) : 1021;
    enum { CHUNK = 1 << 22 };
    float *x = malloc(sizeof(float) * CHUNK), *y = malloc(sizeof(float) * CHUNK), *want = malloc(sizeof(float) * CHUNK);
    const mj_function *f = NULL;
    CHECK_OK(test_silu_kernel(ctx, &f));
    CHECK(x && y && want, "silu sweep: no memory");
    if (f && x && y && want) {
        silu_tally t = {0, 0, 0, 0};
        int m = 0;
        for (uint64_t u = 0; u < (1ull << 32); u += stride) {
            x[m++] = mj_f32_from_bits((uint32_t)u);
            if (m == CHUNK) silu_chunk(f, x, m, y, want, &t), m = 0;
        }
        if (m) silu_chunk(f, x, m, y, want, &t), m = 0;
        silu_chunk(f, x, test_silu_edges(x), y, want, &t);
        const unsigned long long n = ((1ull << 32) + stride - 1) / stride + TEST_SILU_EDGES;
        CHECK(t.n == n, "silu sweep: %llu inputs, %llu expected", t.n, n);
        CHECK(t.host == 0, "silu: the kernel's IEEE x / (1 + expf(-x)) differs from this program's for %lld inputs", t.host);
        CHECK(t.bad == 0, "silu: %lld of %llu inputs differ from x / (1 + expf(-x))", t.bad, t.n);
        CHECK(t.once_off > 0, "silu: the sweep never needs the last step (%llu inputs)", t.n);
        if (t.bad == 0)
            printf("silu: %llu inputs (stride %llu), the bits of x / (1 + expf(-x)) for every one (%lld need the last step)\n",
                   t.n, (unsigned long long)stride, t.once_off);
    }
    free(x), free(y), free(want);
}

/* A forward case: a random layer (one shared expert) of hidden H, intermediate I, E experts,
 * top-k; B random tokens, nv valid, routed by the router with OEA's k0. */
typedef struct fwd_case {
    int H, I, E, k, B, nv, k0;
} fwd_case;

/* Case ci of cases (seed + ci) on experts of workspace mb in ctx, checked by run_forward in
 * W4A16 and, with both_modes, W4A4; placed >= 0: the handle's code words must be bit-placed
 * (1) or not (0). */
static void forward_cases(mj_context_t ctx, const fwd_case *cases, size_t n, uint64_t seed, int mb, int both_modes,
                          int placed, const char *label) {
    for (size_t ci = 0; ci < n; ci++) {
        mj_moe_config c = test_moe_cfg(cases[ci].H, cases[ci].I, cases[ci].E, cases[ci].k, 1);
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_create_random(&c, seed + ci, &L));
        if (!L) continue;
        mj_experts_t ex = make_experts(ctx, L, mb);
        if (ex) {
            mj_experts_view v;
            mj_experts_view_get(ex, &v);
            CHECK(placed < 0 || v.placed == placed, "%s: the packed code words %sbit-placed", label,
                  placed ? "" : "not ");
            uint64_t rng = seed * 31 + ci;
            uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)cases[ci].B * c.hidden);
            test_random_hidden(hidden, (size_t)cases[ci].B * c.hidden, &rng);
            routing r;
            route_layer(L, hidden, cases[ci].B, cases[ci].nv, cases[ci].k0, &r);
            char what[96];
            snprintf(what, sizeof what, "%s case %zu", label, ci);
            for (int m = 0; m < (both_modes ? 2 : 1); m++)
                run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, what);
            routing_free(&r);
            free(hidden);
        }
        mj_experts_free(ex);
        mj_layer_free(L);
    }
}

/* Small shapes: every bucket, split-K and tile choice, routing from the router (k0 = k and
 * k0 < k, padding) and by hand (experts with 0, 1, 8, 9, 33 tokens), both modes. */
static void test_small(mj_context_t ctx, uint64_t seed) {
    static const fwd_case cases[] = {
        {256, 128, 16, 4, 1, 1, 4},   {256, 128, 16, 4, 2, 2, 2},  {512, 64, 16, 4, 7, 5, 4},
        {1024, 128, 16, 4, 16, 16, 2}, {2048, 64, 16, 4, 64, 61, 4}, {512, 128, 16, 4, 257, 250, 4},
        {4096, 64, 8, 2, 3, 3, 1},    {256, 64, 16, 4, 32, 30, 2},
        /* W4A4's quantizer at TPE 8 (8 threads a group, 8 groups a round) over 20 groups: a
         * last round part empty (H 320) */
        {320, 64, 16, 4, 3, 3, 4},
        /* up as STREAM at TPE 8 (H 1024: 8 pieces a tile; 4096 above: 32), and 8 up warps
         * (TPE 16, H 2048) */
        {1024, 64, 16, 4, 5, 4, 4},   {2048, 64, 16, 4, 12, 12, 4},
        /* sums in shared memory (TPE 32, 64) with several up warps, and down items of two runs
         * (I 320: the second short): TPE 32 NW1 4; TPE 64 over chunks; TPE 64 NW1 2 */
        {1024, 320, 16, 4, 32, 29, 4}, {1024, 320, 16, 4, 100, 97, 4}, {4096, 320, 8, 4, 40, 40, 4},
        /* many active experts (the kernels of two cases above: nothing more to compile):
         * down's warps read the active list in several chunks of 32 places, in one token tile
         * and in two (B 72: the rows then searched by token) */
        {256, 64, 128, 4, 32, 30, 4}, {512, 128, 128, 4, 72, 72, 4},
    };
    forward_cases(ctx, cases, sizeof cases / sizeof cases[0], seed, 320, 1, -1, "small");
    /* Up's pieces at a tile's end (B 3: STREAM, pieces of half a run): H 1472 (23 k-steps, a
     * last run of 3, a last half-run of 1 step); H 1344 (21: a last run of 1 step) keeps runs,
     * whose last half would hold no k-step. W4A16 alone (W4A4's up reads its scales through
     * the same ring: glm5_shapes takes its half-runs at H 6144). */
    static const fwd_case pieces[] = {{1472, 64, 16, 4, 3, 3, 4}, {1344, 64, 16, 4, 3, 3, 4}};
    forward_cases(ctx, pieces, 2, seed + 50, 8, 0, -1, "small: up's pieces");
    /* An expert with more rows than TPE at decode: every token's top-k names expert 0 twice
     * (an engine's ids may: mj_experts_forward_topk takes them), so at B 5 it has 10 rows, two
     * chunks of up, whose tiles' pieces STREAM splits over warps (H 1024: 8 pieces a tile; 7
     * SMs), and two items of down (TPE rows an item: down dropped the rows past TPE, the
     * last token's two slots of expert 0, 1024 of the 5120 outputs, relative L2 0.33 against
     * mj_experts_ref); at I 320 (H 256) down's items are parts of an expert (5 k-steps, 2
     * parts of 4), whose sums span the parts. Up's rows (each route row's), down's outputs and the forward must be
     * the oracles' (each slot added), the counters come back to 0, and a forward repeat bit
     * for bit. */
    for (int sh = 0; sh < 2; sh++) {
        const int H = sh ? 256 : 1024, I = sh ? 320 : 64;
        mj_moe_config c = test_moe_cfg(H, I, 16, 4, 1);
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_create_random(&c, seed + 70, &L));
        mj_experts_t ex = L ? make_experts(ctx, L, 8) : NULL;
        if (ex) {
            uint64_t rng = seed + 71;
            uint16_t *hidden = malloc(sizeof(uint16_t) * 5 * H);
            test_random_hidden(hidden, 5 * H, &rng);
            routing r;
            routing_alloc(&r, 5, 4, 16);
            r.nv = 5;
            for (int b = 0; b < 5; b++) {
                const int ids[4] = {0, 0, 1 + b, 9 + b};
                for (int i = 0; i < 4; i++) r.ids[b * 4 + i] = ids[i], r.w[b * 4 + i] = (float)(0.1 + mj_rng_uniform(&rng));
                r.nsel[b] = 4;
            }
            routing_dispatch(&r);
            CHECK(r.cnt[0] == 10, "expert 0 has %d rows", r.cnt[0]);
            mj_route_outputs ro = route_outputs(&r);
            mj_experts_view v;
            float *o1 = malloc(sizeof(float) * 5 * H), *o2 = malloc(sizeof(float) * 5 * H);
            static const int32_t sms[] = {7};
            for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++)
                for (int m = 0; m < 2; m++) {
                    const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
                    CHECK_OK(mj_experts_set_sms(ex, sms[i]));
                    char what[96];
                    snprintf(what, sizeof what, "small: an expert named twice a token, H %d I %d, %d SMs", H, I, (int)sms[i]);
                    run_forward(ctx, L, ex, mode, hidden, &r, what);
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, 5, NULL, o1, NULL));
                    mj_experts_view_get(ex, &v);
                    int64_t left = 0;
                    for (int64_t j = 0; j < (int64_t)v.ucount_tiles * (v.I / 16); j++) left += v.ucount[j] != 0;
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, 5, NULL, o2, NULL));
                    CHECK(left == 0 && !memcmp(o1, o2, sizeof(float) * 5 * H),
                          "%s, %s: %lld counters left, outputs %s", what,
                          m ? "W4A4" : "W4A16", (long long)left, memcmp(o1, o2, sizeof(float) * 5 * H) ? "differ" : "repeat");
                }
            free(o1), free(o2);
            routing_free(&r);
            free(hidden);
        }
        mj_experts_free(ex);
        mj_layer_free(L);
    }
    /* Up's STREAM on a grid of 60 SMs (runs inside a tile, a tile over many warps, empty runs;
     * the other cases run the interpreter's 1 SM: long runs, whole tiles in a run). */
    {
        mj_moe_config c = test_moe_cfg(1024, 64, 16, 4, 1);
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_create_random(&c, seed + 60, &L));
        mj_experts_t ex = L ? make_experts(ctx, L, 8) : NULL;
        if (ex) {
            uint64_t rng = seed + 61;
            uint16_t *hidden = malloc(sizeof(uint16_t) * 6 * 1024);
            test_random_hidden(hidden, 6 * 1024, &rng);
            routing r;
            route_layer(L, hidden, 6, 5, 4, &r);
            CHECK_OK(mj_experts_set_sms(ex, 60));
            for (int m = 0; m < 2; m++)
                run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "small: up's STREAM on 60 SMs");
            routing_free(&r);
            free(hidden);
        }
        mj_experts_free(ex);
        mj_layer_free(L);
    }
    /* Token counts by hand: experts with 0, 1, 8, 9 and 33 tokens. */
    mj_moe_config c = test_moe_cfg(512, 128, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed + 100, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, 64);
    uint64_t rng = seed + 101;
    uint16_t *hidden = malloc(sizeof(uint16_t) * 64 * 512);
    test_random_hidden(hidden, 64 * 512, &rng);
    routing r;
    route_crafted(64, 4, 16, &rng, &r);
    CHECK(r.cnt[0] == 0 && r.cnt[1] == 1 && r.cnt[2] == 8 && r.cnt[3] == 9 && r.cnt[4] == 33,
          "crafted counts %d %d %d %d %d", r.cnt[0], r.cnt[1], r.cnt[2], r.cnt[3], r.cnt[4]);
    for (int m = 0; m < 2 && ex; m++) run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "crafted counts");
    routing_free(&r);
    free(hidden);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* W4A16 on sm_90a, where the packed code words are bit-placed (runtime/weights/pack.c) and
 * up and down dequantize them with the placed e2m1x8_bf16: every stage against its check and
 * the forward against mj_experts_ref, over the token buckets, up split over blocks and 8 up
 * warps, the shared expert, and down's items of two runs. */
static void test_placed_forward(const char *cache, uint64_t seed) {
    static const fwd_case cases[] = {
        {256, 128, 16, 4, 1, 1, 4}, {1024, 64, 16, 4, 5, 4, 4}, {2048, 64, 16, 4, 12, 12, 4},
        {1024, 320, 16, 4, 32, 29, 4}, {2048, 64, 16, 4, 64, 61, 4},
    };
    mj_context_t c90 = test_new_context(cache, MJ_BACKEND_SIM, "sm_90a", 0);
    if (!c90) return;
    forward_cases(c90, cases, sizeof cases / sizeof cases[0], seed, 64, 0, 1, "sm_90a placed");
    CHECK(g_seen_nw2[8] && g_seen_deal[1], "sm_90a: down's 8-warp blocks, dealt by place, reached");
    /* its dequantization on every code and scale, in the placed layout */
    test_dequant(c90);
    mj_context_destroy(c90);
}

/* Prefill: 4096 tokens (experts with hundreds of rows, 64 token tiles in down). */
static void test_prefill(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(128, 64, 32, 8, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, 4096);
    uint64_t rng = seed + 1;
    uint16_t *hidden = malloc(sizeof(uint16_t) * 4096 * 128);
    test_random_hidden(hidden, 4096 * 128, &rng);
    routing r;
    route_layer(L, hidden, 4096, 4000, 8, &r);
    int most = 0;
    for (int e = 0; e < 32; e++) most = r.cnt[e] > most ? r.cnt[e] : most;
    CHECK(most > 64 * 8, "an expert with more than 8 token chunks (%d rows)", most);
    for (int m = 0; m < 2 && ex; m++) run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "prefill");
    routing_free(&r);
    free(hidden);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* TP and EP shards: a rank's slice of every expert, or a rank's experts (and no shared). */
static void test_shards(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(512, 256, 16, 4, 1);
    mj_layer_t full = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &full));
    if (!full) return;
    uint64_t rng = seed + 7;
    uint16_t *hidden = malloc(sizeof(uint16_t) * 16 * 512);
    test_random_hidden(hidden, 16 * 512, &rng);
    routing r;
    route_layer(full, hidden, 16, 14, 2, &r);
    const struct { mj_parallel kind; int rank, n; } shards[] = {{MJ_PAR_TP, 1, 2}, {MJ_PAR_EP, 1, 2}, {MJ_PAR_EP, 0, 4}};
    for (int i = 0; i < 3; i++) {
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_shard(full, shards[i].kind, shards[i].rank, shards[i].n, &L));
        if (!L) continue;
        mj_experts_t ex = make_experts(ctx, L, 16);
        for (int m = 0; m < 2 && ex; m++) run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "shard");
        mj_experts_free(ex);
        mj_layer_free(L);
    }
    routing_free(&r);
    free(hidden);
    mj_layer_free(full);
}

/* GLM-5's shapes (H 6144; I_local 256 as at TP 8, and 2048 unsplit) for a few experts. */
static void test_glm5_shapes(mj_context_t ctx, uint64_t seed) {
    static const struct { int I, E, k, B; int modes; } cases[] = {{256, 8, 4, 4, 3}, {2048, 4, 2, 2, 1}};
    for (int ci = 0; ci < 2; ci++) {
        mj_moe_config c = test_moe_cfg(6144, cases[ci].I, cases[ci].E, cases[ci].k, 1);
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_create_random(&c, seed + ci, &L));
        if (!L) continue;
        mj_experts_t ex = make_experts(ctx, L, 8);
        uint64_t rng = seed + 50 + ci;
        uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)cases[ci].B * 6144);
        test_random_hidden(hidden, (size_t)cases[ci].B * 6144, &rng);
        routing r;
        route_layer(L, hidden, cases[ci].B, cases[ci].B, cases[ci].k, &r);
        double t0 = test_now_ms();
        for (int m = 0; m < 2 && ex; m++)
            if (cases[ci].modes >> m & 1)
                run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "GLM-5 shape");
        printf("GLM-5 shape H 6144 I %d, B %d: %.0f ms on the interpreter (with checks)\n", cases[ci].I, cases[ci].B,
               test_now_ms() - t0);
        routing_free(&r);
        free(hidden);
        mj_experts_free(ex);
        mj_layer_free(L);
    }
}

/* Every UE4M3 scale byte (0x00 .. 0x7E: zero, the subnormals 0x01 .. 0x07, up to 448) in
 * every expert's w13 and w2 blocks, through both modes and both up paths (TPE 8: register
 * sums, the halves of a step; TPE 32: shared-memory sums, gate then up): the kernels turn
 * scale bytes into bf16 (W4A16) by bit placement and a product, which the subnormal codes
 * exercise, and the oracle decodes them with mj_e4m3_decode. */
static void fill_scales(mj_nvfp4_linear *l, int salt) {
    const int64_t n = (int64_t)l->n_out * (l->k_in / 16);
    for (int64_t i = 0; i < n; i++) l->weight_scale[i] = (uint8_t)((i * 37 + salt) % 127);
}

static void test_scale_bytes(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(256, 128, 8, 2, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    for (int e = 0; e < L->n_local; e++) fill_scales(&L->w13[e], 2 * e), fill_scales(&L->w2[e], 2 * e + 1);
    fill_scales(&L->shared_w13, 61), fill_scales(&L->shared_w2, 62);
    mj_experts_t ex = make_experts(ctx, L, 32);
    uint64_t rng = seed + 1;
    uint16_t *hidden = malloc(sizeof(uint16_t) * 32 * 256);
    test_random_hidden(hidden, 32 * 256, &rng);
    static const int batches[] = {8, 32};
    for (int bi = 0; bi < 2 && ex; bi++) {
        routing r;
        route_layer(L, hidden, batches[bi], batches[bi], 2, &r);
        for (int m = 0; m < 2; m++)
            run_forward(ctx, L, ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, hidden, &r, "every scale byte");
        routing_free(&r);
    }
    free(hidden);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* W4A4's quantizer on the encoders' rule (templates/prelude_fp.h, the GPU's cvt.rn.satfinite):
 * a code's sign bit is its value's, and past the largest finite value comes that value with
 * the sign. Token 0's hidden row is crafted: block 0 holds A (its amax), -0.0, +0.0, -A/64 and
 * +A/64 (6/64 of a unit after scaling: under E2M1's first midpoint, so zero), the rest 0;
 * block 1 holds +-S, eight times past 6 * 448 input scales (its scale saturates at 448,
 * 0x7E, and the codes at +-6), and a -0.0. Every quantized row of token 0 that
 * experts_quant writes (on the interpreter) must read 7, 8, 0, 8, 0 and 7, 15, 8 there, and
 * so must mj_nvfp4_quantize_act's (run_forward's quant stage also compares all bytes). */
static void test_quant_signs(mj_context_t ctx, uint64_t seed) {
    enum { B = 4, H = 256 };
    mj_moe_config c = test_moe_cfg(H, 64, 8, 2, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, B);
    float in_lo = INFINITY, in_hi = 0;
    for (int xi = 0; xi < L->n_local + (L->has_shared ? 1 : 0); xi++) {
        const float in = expert_of(L, xi).w13->input_scale;
        in_lo = fminf(in_lo, in), in_hi = fmaxf(in_hi, in);
    }
    const float A = mj_bf16_to_f32(mj_f32_to_bf16(448.0f * in_lo));
    const float S = mj_bf16_to_f32(mj_f32_to_bf16(8 * 2688.0f * in_hi));
    CHECK(in_hi < 100 * in_lo, "input scales %g .. %g: block 0's scale would leave E4M3's normal range", (double)in_lo,
          (double)in_hi);
    static uint16_t hidden[B * H];
    uint64_t rng = seed + 1;
    test_random_hidden(hidden, B * H, &rng);
    for (int h = 0; h < 32; h++) hidden[h] = mj_f32_to_bf16(0.0f);
    const float row0[] = {A, -0.0f, 0.0f, -A / 64, A / 64};
    for (int h = 0; h < 5; h++) hidden[h] = mj_f32_to_bf16(row0[h]);
    hidden[16] = mj_f32_to_bf16(S), hidden[17] = mj_f32_to_bf16(-S), hidden[18] = mj_f32_to_bf16(-0.0f);
    CHECK(hidden[1] == 0x8000 && hidden[18] == 0x8000, "bf16 -0.0 is 0x8000");
    static const int at[] = {0, 1, 2, 3, 4, 16, 17, 18};
    static const uint8_t want[] = {7, 8, 0, 8, 0, 7, 15, 8};
    routing r;
    route_layer(L, hidden, B, B, 2, &r);
    if (ex) run_forward(ctx, L, ex, MJ_MODE_W4A4, hidden, &r, "signs of zero and saturation");
    mj_experts_view v;
    if (ex) mj_experts_view_get(ex, &v);
    float x[H];
    uint8_t nat[H / 2], q[H / 2], sf[H / 16];
    for (int h = 0; h < H; h++) x[h] = mj_bf16_to_f32(hidden[h]);
    int rows = 0, bad_kernel = 0, bad_ref = 0;
    for (int j = 0; ex && j <= v.K; j++) {
        int xi, row;
        if (j < v.K) {
            if (j >= r.nsel[0]) continue;
            xi = r.ids[j] - v.expert_begin;
            if (xi < 0 || xi >= v.n_local) continue;
            row = r.perm[j];
        } else {
            if (!v.nsub) continue;
            xi = v.n_local, row = v.mb * v.K;
        }
        frag_to_nat(v.xq + (int64_t)row * H / 2, H, nat);
        CHECK_OK(mj_nvfp4_quantize_act(x, 1, H, expert_of(L, xi).w13->input_scale, "x", q, sf));
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
            const int s = 4 * (at[i] & 1), gk = (nat[at[i] / 2] >> s) & 15, gr = (q[at[i] / 2] >> s) & 15;
            if (gk != want[i] && bad_kernel++ < 4)
                fprintf(stderr, "  experts_quant: expert %d element %d (%g): code %d, want %d\n", xi, at[i],
                        (double)x[at[i]], gk, want[i]);
            if (gr != want[i] && bad_ref++ < 4)
                fprintf(stderr, "  mj_nvfp4_quantize_act: expert %d element %d (%g): code %d, want %d\n", xi, at[i],
                        (double)x[at[i]], gr, want[i]);
        }
        bad_kernel += v.xsf[(int64_t)row * H / 16 + 1] != 0x7E;
        bad_ref += sf[1] != 0x7E;
        rows++;
    }
    CHECK(rows >= 2, "token 0 was quantized for %d rows", rows);
    CHECK(bad_kernel == 0, "experts_quant: %d codes of token 0 break the sign / saturation rule", bad_kernel);
    CHECK(bad_ref == 0, "mj_nvfp4_quantize_act: %d codes of token 0 break the sign / saturation rule", bad_ref);
    routing_free(&r);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* Broken packs must fail the stage checks: a lane's fragment swapped with its neighbour's,
 * the scales of rows g and g+8 swapped, a row's scales shifted by one k-group, gate and up
 * swapped for one k-step. */
static void test_mutations(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(512, 128, 8, 2, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, 8);
    if (!ex) return;
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    uint64_t rng = seed + 3;
    uint16_t *hidden = malloc(sizeof(uint16_t) * 8 * 512);
    test_random_hidden(hidden, 8 * 512, &rng);
    routing r;
    route_layer(L, hidden, 8, 8, 2, &r);
    int xi = r.act[0]; /* an active expert */
    uint8_t *w13 = v.w13 + (int64_t)xi * v.bytes_w13, *s13 = v.s13 + (int64_t)xi * v.bytes_s13;
    uint8_t *s2 = v.s2 + (int64_t)xi * v.bytes_s2;
    for (int m = 0; m < 2; m++) {
        mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        g_count_only = 1;
        CHECK(run_forward(ctx, L, ex, mode, hidden, &r, "unmutated") == 0, "the unmutated pack passes (mode %d)", m);
        for (int mu = 0; mu < 4; mu++) {
            uint8_t save[1024];
            uint8_t *at;
            size_t len;
            switch (mu) {
            case 0: at = w13 + 1 * 1024 + 5 * 16, len = 32; break;   /* tile 0 step 1: lanes 5, 6 */
            case 1: at = s13 + 2 * 16, len = 8 * 16 + 16; break;     /* tile 0 run 0: rows 2, 10 */
            case 2: at = s2 + 3 * 16, len = 16; break;               /* w2 tile 0 run 0 row 3 */
            default: at = w13 + 2 * 1024, len = 1024; break;          /* tile 0 step 2: gate/up */
            }
            memcpy(save, at, len);
            if (mu == 0 || mu == 1) { /* swap the first and last 16 bytes */
                uint8_t t[16];
                memcpy(t, at, 16), memcpy(at, at + len - 16, 16), memcpy(at + len - 16, t, 16);
            } else if (mu == 2) {
                for (int j = 15; j > 0; j--) at[j] = at[j - 1];
            } else {
                uint8_t t[512];
                memcpy(t, at, 512), memcpy(at, at + 512, 512), memcpy(at + 512, t, 512);
            }
            int fails = run_forward(ctx, L, ex, mode, hidden, &r, "mutated");
            CHECK(fails > 0, "mutation %d (mode %d) was not caught by the stage checks", mu, m);
            memcpy(at, save, len);
        }
        g_count_only = 0;
    }
    routing_free(&r);
    free(hidden);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* Bytes of weights read: each active expert's (and each shared sub-expert's) exactly once
 * for B <= 64; none of an inactive one. Same bits run after run. */
static void test_bytes(mj_context_t ctx, const char *cache, uint64_t seed) {
    /* H 256 at every batch bucket, both modes, each forward twice; then, at B 8 in W4A16 once
     * (up's copies are the same in both modes) with 16 experts of top-4, up's k-steps dealt in
     * half-runs (H 1472: 6 runs over 4 warps, a last run of 3 k-steps) and in runs with a last
     * run of 1 (H 1344: half-runs would leave its second half of scale bytes, padding, unread) */
    static const int Hs[] = {256, 1472, 1344};
    for (int hi = 0; hi < 3; hi++) {
        const int H = Hs[hi];
        /* H 1344: two shared sub-experts (up's prefetch of each, below) */
        mj_moe_config c = hi ? test_moe_cfg(H, 64, 16, 4, hi == 2 ? 2 : 1) : test_moe_cfg(H, 64, 64, 8, 1);
        mj_layer_t L = NULL;
        CHECK_OK(mj_layer_create_random(&c, seed + (uint64_t)hi, &L));
        if (!L) return;
        mj_experts_t ex = make_experts(ctx, L, 64);
        if (!ex) {
            mj_layer_free(L);
            return;
        }
        mj_experts_view v;
        mj_experts_view_get(ex, &v);
        const int64_t per = v.bytes_w13 + v.bytes_s13 + v.bytes_w2 + v.bytes_s2;
        static const int Bs[] = {1, 8, 32, 64};
        for (int bi = hi ? 1 : 0; bi < (hi ? 2 : 4); bi++) /* the larger H: B 8 */
            for (int k0 = hi ? 4 : 8; k0 >= 4; k0 -= 4) /* the larger H: top-4, k0 4 */
                for (int m = 0; m < (hi ? 1 : 2); m++) {
                    int B = Bs[bi];
                    uint64_t rng = seed + (uint64_t)bi;
                    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)B * H);
                    test_random_hidden(hidden, (size_t)B * H, &rng);
                    routing r;
                    route_layer(L, hidden, B, B, k0, &r);
                    mj_route_outputs ro = route_outputs(&r);
                    float *o1 = malloc(sizeof(float) * (size_t)B * H), *o2 = malloc(sizeof(float) * (size_t)B * H);
                    mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
                    mj_sim_stream_bytes_take();
                    mj_sim_prefetch_take(NULL);
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, NULL, o1, NULL));
                    unsigned long long got = mj_sim_stream_bytes_take();
                    unsigned long long want = (unsigned long long)(r.na + v.nsub) * (unsigned long long)per;
                    CHECK(got == want,
                          "H=%d B=%d k0=%d mode %d: %llu bytes read, want %llu (%d active experts + shared, %lld each)", H,
                          B, k0, m, got, want, r.na, (long long)per);
                    /* before the routing's outputs are there, up prefetches into L2 every line
                     * of the shared sub-experts' weights and scales (gate/up and down), once,
                     * and nothing else */
                    unsigned long long pf[3], lw[3] = {0, 0, 0};
                    mj_sim_prefetch_take(pf);
                    for (int j = 0; j < 4; j++) { /* each array's shared sub-experts, one region */
                        uint8_t *const base[4] = {v.w13, v.s13, v.w2, v.s2};
                        const int64_t size[4] = {v.bytes_w13, v.bytes_s13, v.bytes_w2, v.bytes_s2};
                        const uintptr_t a = (uintptr_t)(base[j] + (int64_t)v.n_local * size[j]);
                        const uintptr_t n = (uintptr_t)(v.nsub * size[j]);
                        for (uintptr_t line = a >> 7; line <= (a + n - 1) >> 7; line++)
                            lw[0]++, lw[1] += line, lw[2] += (unsigned long long)line * line;
                    }
                    CHECK(v.nsub == (hi == 2 ? 2 : 1) && pf[0] == lw[0] && pf[1] == lw[1] && pf[2] == lw[2],
                          "H=%d B=%d k0=%d mode %d: %llu L2 prefetches (line sums %llu, %llu), want %llu (%llu, %llu): the "
                          "%d shared sub-experts' w13, s13, w2 and s2 lines, each once", H, B, k0, m, pf[0], pf[1], pf[2], lw[0],
                          lw[1], lw[2], v.nsub);
                    if (!hi) {
                        CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, NULL, o2, NULL));
                        CHECK(!memcmp(o1, o2, sizeof(float) * (size_t)B * H), "H=%d B=%d: two runs differ in some bit", H,
                              B);
                    }
                    printf("bytes H=%-4d B=%-2d k0=%d %s: %d active + %d shared experts, %llu bytes read = the floor\n", H,
                           B, k0, m ? "W4A4 " : "W4A16", r.na, v.nsub, got);
                    free(o1), free(o2), free(hidden);
                    routing_free(&r);
                }
        if (!hi) { /* sm_80: no programmatic dependent launch, nothing to overlap: no prefetch */
            mj_context_t c80 = test_new_context(cache, MJ_BACKEND_SIM, "sm_80", 0);
            mj_experts_t e80 = c80 ? make_experts(c80, L, 64) : NULL;
            uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)H);
            float *o = malloc(sizeof(float) * (size_t)H);
            if (e80 && hidden && o) {
                uint64_t rng = seed + 99;
                test_random_hidden(hidden, (size_t)H, &rng);
                routing r;
                route_layer(L, hidden, 1, 1, 8, &r);
                mj_route_outputs ro = route_outputs(&r);
                unsigned long long pf[3];
                mj_sim_prefetch_take(NULL);
                CHECK_OK(mj_experts_forward(c80, e80, MJ_MODE_W4A16, hidden, &ro, 1, NULL, o, NULL));
                mj_sim_prefetch_take(pf);
                CHECK(pf[0] == 0, "sm_80: %llu L2 prefetches (no PDL there: none)", pf[0]);
                routing_free(&r);
            }
            free(hidden), free(o);
            mj_experts_free(e80);
            mj_context_destroy(c80);
        }
        if (!hi) { /* B 128 with 40 valid tokens: down's second token tile (TPE 64) holds only
                    * padding, so it reads no expert, not even the shared one */
            mj_experts_t e128 = make_experts(ctx, L, 128);
            const int B = 128, nv = 40;
            uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)B * H);
            float *o = malloc(sizeof(float) * (size_t)B * H);
            if (e128 && hidden && o) {
                uint64_t rng = seed + 77;
                test_random_hidden(hidden, (size_t)B * H, &rng);
                routing r;
                route_layer(L, hidden, B, nv, 8, &r);
                mj_route_outputs ro = route_outputs(&r);
                const int32_t nvv = nv;
                mj_sim_stream_bytes_take();
                CHECK_OK(mj_experts_forward(ctx, e128, MJ_MODE_W4A16, hidden, &ro, B, &nvv, o, NULL));
                const unsigned long long got = mj_sim_stream_bytes_take(),
                                         want = (unsigned long long)(r.na + v.nsub) * (unsigned long long)per;
                CHECK(got == want, "B %d, %d valid (a token tile of padding): %llu bytes read, want %llu (%d active + %d shared)",
                      B, nv, got, want, r.na, v.nsub);
                routing_free(&r);
            }
            free(hidden), free(o);
            mj_experts_free(e128);
        }
        mj_experts_free(ex);
        mj_layer_free(L);
    }
}

/* A token's output does not depend on the rest of its batch (within one specialization):
 * with per-token routing (k0 = k), the same 8 tokens in another order give each token's row
 * the same bits, and so does a batch whose later tokens are padding. Down's warps share the
 * experts out by id, so a token's sum goes over the same warps in the same order whatever
 * the other tokens route to. */
static void batch_invariance(mj_context_t ctx, uint64_t seed, int H, int sms) {
    mj_moe_config c = test_moe_cfg(H, 64, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, 8);
    if (!ex) return;
    if (sms) CHECK_OK(mj_experts_set_sms(ex, sms));
    enum { B = 8 };
    static const int perm[B] = {5, 2, 7, 0, 3, 6, 1, 4};
    uint64_t rng = seed + 3;
    uint16_t *hidden = malloc(sizeof(uint16_t) * B * H), *hp = malloc(sizeof(uint16_t) * B * H);
    float *out = malloc(sizeof(float) * B * H), *outp = malloc(sizeof(float) * B * H);
    /* values over 2^-24 .. 2^0, so that the sums' bits are not exact in fp32: where they were
     * (test_random_hidden's), any order of addition gave the same bits */
    for (int64_t i = 0; i < (int64_t)B * H; i++) {
        const uint64_t z = mj_rng_next(&rng);
        hidden[i] = (uint16_t)(((z >> 63) << 15) | ((127 - (z >> 8) % 25) << 7) | (z & 0x7F));
    }
    for (int i = 0; i < B; i++) memcpy(hp + i * H, hidden + perm[i] * H, sizeof(uint16_t) * H);
    for (int m = 0; m < 2; m++) {
        const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        CHECK_OK(mj_experts_prepare(ctx, ex, mode, B));
        routing r, rp, rv;
        route_layer(L, hidden, B, B, 4, &r);
        route_layer(L, hp, B, B, 4, &rp);
        route_layer(L, hidden, B, 3, 4, &rv);
        mj_route_outputs ro = route_outputs(&r), rop = route_outputs(&rp), rov = route_outputs(&rv);
        int32_t nv = B, nv3 = 3;
        CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, &nv, out, NULL));
        CHECK_OK(mj_experts_forward(ctx, ex, mode, hp, &rop, B, &nv, outp, NULL));
        int diff = 0;
        for (int i = 0; i < B; i++) diff += memcmp(outp + i * H, out + perm[i] * H, sizeof(float) * H) != 0;
        CHECK(diff == 0, "H %d on %d SMs, %s: %d of %d tokens' rows change bits when the batch is reordered", H, sms,
              m ? "W4A4" : "W4A16", diff, B);
        if (sms) { /* the same batch on another grid: its runs cut elsewhere; up's activations too */
            mj_experts_view v;
            mj_experts_view_get(ex, &v);
            const size_t na = (size_t)v.mb * v.K * v.I * 2, nq = (size_t)v.mb * v.K * v.I / 2, ns = (size_t)v.mb * v.K * v.I / 16;
            uint8_t *keep = malloc(na + nq + ns);
            CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, &nv, outp, NULL));
            if (m == 0) memcpy(keep, v.act, na);
            else memcpy(keep, v.actq, nq), memcpy(keep + nq, v.act_sf, ns);
            CHECK_OK(mj_experts_set_sms(ex, 2 * sms + 1));
            CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, &nv, outp, NULL));
            const int act_same = m == 0 ? !memcmp(keep, v.act, na) : !memcmp(keep, v.actq, nq) && !memcmp(keep + nq, v.act_sf, ns);
            CHECK(act_same, "H %d, %s: up's activations change bits on %d SMs, not %d", H, m ? "W4A4" : "W4A16", 2 * sms + 1, sms);
            free(keep);
            CHECK_OK(mj_experts_set_sms(ex, sms));
            diff = 0;
            for (int i = 0; i < B; i++) diff += memcmp(outp + i * H, out + i * H, sizeof(float) * H) != 0;
            CHECK(diff == 0, "H %d, %s: %d of %d tokens' rows change bits on %d SMs, not %d", H, m ? "W4A4" : "W4A16", diff, B,
                  2 * sms + 1, sms);
        }
        CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &rov, B, &nv3, outp, NULL));
        diff = 0;
        for (int i = 0; i < 3; i++) diff += memcmp(outp + i * H, out + i * H, sizeof(float) * H) != 0;
        CHECK(diff == 0, "H %d on %d SMs, %s: %d of 3 valid tokens' rows change bits when the others are padding", H, sms,
              m ? "W4A4" : "W4A16", diff);
        routing_free(&r), routing_free(&rp), routing_free(&rv);
    }
    free(hidden), free(hp), free(out), free(outp);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* A token's row the same bits whatever else its batch holds: H 256 (a tile's 2 pieces), and H
 * 1024 (8) on 2 and 5 SMs, where up's STREAM runs cut the tiles at places that move with the
 * batch's active experts (their pieces' sums added in piece order whoever holds them). */
static void test_batch_invariance(mj_context_t ctx, uint64_t seed) {
    batch_invariance(ctx, seed, 256, 0);
    batch_invariance(ctx, seed + 1, 1024, 2);
    batch_invariance(ctx, seed + 2, 1024, 5);
    /* and a token alone (B 1, the same specialization) against the same token in a batch of 8,
     * on grids of 1, 5 and 40 SMs: where the runs cut its tiles moves with all three */
    mj_moe_config c = test_moe_cfg(1024, 64, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed + 24, &L));
    mj_experts_t ex = L ? make_experts(ctx, L, 8) : NULL;
    if (ex) {
        enum { B = 8, H = 1024 };
        uint64_t rng = seed + 25;
        uint16_t *hidden = malloc(sizeof(uint16_t) * B * H);
        float *out = malloc(sizeof(float) * B * H), *one = malloc(sizeof(float) * H);
        test_random_hidden(hidden, (size_t)B * H, &rng);
        routing r, r1;
        route_layer(L, hidden, B, B, 4, &r);
        route_layer(L, hidden, 1, 1, 4, &r1);
        mj_route_outputs ro = route_outputs(&r), ro1 = route_outputs(&r1);
        static const int32_t sms[] = {1, 5, 40};
        for (int m = 0; m < 2; m++) {
            const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
            for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++) {
                CHECK_OK(mj_experts_set_sms(ex, sms[i]));
                CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, NULL, out, NULL));
                for (size_t j = 0; j < sizeof sms / sizeof sms[0]; j++) {
                    CHECK_OK(mj_experts_set_sms(ex, sms[j]));
                    CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro1, 1, NULL, one, NULL));
                    int diff = 0;
                    for (int h = 0; h < H; h++) diff += memcmp(&one[h], &out[h], sizeof(float)) != 0;
                    CHECK(diff == 0, "%s: token 0 alone on %d SMs against in a batch of 8 on %d: %d of %d values differ",
                          m ? "W4A4" : "W4A16", (int)sms[j], (int)sms[i], diff, H);
                }
            }
        }
        routing_free(&r), routing_free(&r1);
        free(hidden), free(out), free(one);
    }
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* One recorded launch sequence (what a CUDA graph is), replayed with new token counts. */
static void test_replay(mj_context_t ctx, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(256, 64, 16, 4, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    if (!L) return;
    mj_experts_t ex = make_experts(ctx, L, 16);
    if (!ex) return;
    const int B = 16, H = 256;
    uint64_t rng = seed + 9;
    uint16_t *hidden = malloc(sizeof(uint16_t) * B * H);
    test_random_hidden(hidden, (size_t)B * H, &rng);
    for (int m = 0; m < 2; m++) {
        mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        routing r;
        route_layer(L, hidden, B, B, 2, &r);
        mj_route_outputs ro = route_outputs(&r);
        int32_t nv = B;
        float *out = malloc(sizeof(float) * B * H), *want = malloc(sizeof(float) * B * H);
        CHECK_OK(mj_experts_prepare(ctx, ex, mode, B));
        mj_sim_graph *g = NULL;
        CHECK_OK(mj_sim_capture_begin(ctx));
        CHECK_OK(mj_experts_forward(ctx, ex, mode, hidden, &ro, B, &nv, out, NULL));
        CHECK_OK(mj_sim_capture_end(ctx, &g));
        CHECK(mj_sim_graph_launches(g) == (m ? 3 : 2), "recorded %d launches", mj_sim_graph_launches(g));
        static const int counts[] = {16, 11, 1, 0};
        for (int i = 0; i < 4; i++) {
            /* The engine routes the new count into the same buffers, then replays. */
            routing r2;
            route_layer(L, hidden, B, counts[i], 2, &r2);
            memcpy(r.ids, r2.ids, 4 * B * 4), memcpy(r.w, r2.w, 4 * B * 4), memcpy(r.nsel, r2.nsel, 4 * B);
            memcpy(r.cnt, r2.cnt, 4 * 16), memcpy(r.off, r2.off, 4 * 17), memcpy(r.act, r2.act, 4 * 16);
            memcpy(r.perm, r2.perm, 4 * B * 4), memcpy(r.rix, r2.rix, 4 * B * 4), r.na = r2.na;
            nv = counts[i];
            memset(out, 0x55, sizeof(float) * B * H);
            CHECK_OK(mj_sim_graph_replay(g));
            CHECK_OK(mj_experts_ref(L, mode, hidden, B, nv, r.ids, r.w, r.nsel, want));
            double e = test_rel_l2(out, want, (size_t)B * H);
            CHECK(e <= (m ? 5e-2 : 2e-3), "replay at %d tokens (mode %d): relative L2 %.3g", nv, m, e);
            routing_free(&r2);
        }
        mj_sim_graph_free(g);
        routing_free(&r);
        free(out), free(want);
    }
    free(hidden);
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* What cannot run is refused, naming the value and what would work. */
static void test_refusals(mj_context_t ctx, const char *cache) {
    mj_moe_config c = test_moe_cfg(256, 64, 8, 2, 1);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, 5, &L));
    if (!L) return;
    /* W4A4 on sm_90a. */
    mj_context_t c90 = test_new_context(cache, MJ_BACKEND_SIM, "sm_90a", 0);
    mj_experts_t ex90 = NULL;
    if (c90) {
        mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
        eo.mode_policy = "1-4:w4a16,5-:w4a4";
        CHECK_STATUS(mj_experts_create(c90, L, &eo, &ex90), MJ_ERR_UNSUPPORTED);
        CHECK(strstr(mj_last_error(), "sm_90a") && strstr(mj_last_error(), "w4a16"), "%s", mj_last_error());
        ex90 = make_experts(c90, L, 8);
        mj_weight_mode m;
        if (ex90) {
            CHECK_STATUS(mj_experts_mode(ex90, MJ_MODE_W4A4, 4, &m), MJ_ERR_UNSUPPORTED);
            CHECK(strstr(mj_last_error(), "sm_90a") && strstr(mj_last_error(), "MJ_MODE_W4A16"), "%s", mj_last_error());
            CHECK_OK(mj_experts_mode(ex90, MJ_MODE_AUTO, 64, &m));
            CHECK(m == MJ_MODE_W4A16, "sm_90a's default policy is W4A16 for every B");
            /* sm_90a's experts (bit-placed code words, sm_90a's shapes) with an sm_120a context */
            mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
            uint16_t h[256] = {0};
            float o[256];
            CHECK_STATUS(mj_experts_forward(ctx, ex90, MJ_MODE_W4A16, h, &ro, 1, NULL, o, NULL), MJ_ERR_INVALID_ARG);
            CHECK(strstr(mj_last_error(), "made for sm_90a") && strstr(mj_last_error(), "targets sm_120a"),
                  "another target's context: %s", mj_last_error());
            CHECK_STATUS(mj_experts_prepare(ctx, ex90, MJ_MODE_AUTO, 1), MJ_ERR_INVALID_ARG);
            CHECK(strstr(mj_last_error(), "made for sm_90a") != NULL, "prepare: %s", mj_last_error());
        }
        mj_experts_free(ex90);
        mj_context_destroy(c90);
    }
    mj_experts_t ex = make_experts(ctx, L, 8);
    if (ex) {
        mj_weight_mode m;
        CHECK_OK(mj_experts_mode(ex, MJ_MODE_AUTO, 8, &m));
        CHECK(m == MJ_MODE_W4A16, "sm_120a policy at B = 8: W4A16");
        CHECK_OK(mj_experts_mode(ex, MJ_MODE_AUTO, 9, &m));
        CHECK(m == MJ_MODE_W4A4, "sm_120a policy at B = 9: W4A4");
        uint16_t hidden[256 * 9] = {0};
        float out[256 * 9];
        routing r;
        route_layer(L, hidden, 9, 9, 2, &r);
        mj_route_outputs ro = route_outputs(&r);
        CHECK_STATUS(mj_experts_forward(ctx, ex, MJ_MODE_W4A16, hidden, &ro, 9, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "0..8") && strstr(mj_last_error(), "max_batch"), "%s", mj_last_error());
        ro.row_index = NULL;
        CHECK_STATUS(mj_experts_forward(ctx, ex, MJ_MODE_W4A16, hidden, &ro, 4, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "row_index") != NULL, "%s", mj_last_error());
        CHECK_STATUS(mj_experts_forward(ctx, ex, (mj_weight_mode)7, hidden, &ro, 4, NULL, out, NULL), MJ_ERR_INVALID_ARG);
        routing_free(&r);
    }
    static const char *bad[] = {"", "w4a8", "1-8:w4a16,8-:w4a4", "1-:w4a16,", "0-4:w4a16", "x:w4a4"};
    for (int i = 0; i < 6; i++) {
        mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
        eo.mode_policy = bad[i];
        mj_experts_t e2 = NULL;
        CHECK_STATUS(mj_experts_create(ctx, L, &eo, &e2), MJ_ERR_INVALID_ARG);
    }
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = 0;
    mj_experts_t e3 = NULL;
    CHECK_STATUS(mj_experts_create(ctx, L, &eo, &e3), MJ_ERR_INVALID_ARG);
    /* A shared expert that is no multiple of the routed experts' size. */
    int32_t keep = L->is_local;
    L->is_local = 96;
    CHECK_STATUS(mj_experts_create(ctx, L, NULL, &e3), MJ_ERR_UNSUPPORTED);
    CHECK(strstr(mj_last_error(), "96") && strstr(mj_last_error(), "64"), "%s", mj_last_error());
    L->is_local = keep;
    /* An intermediate size the FP4 MMA cannot step through. */
    keep = L->i_local;
    L->i_local = 96;
    CHECK_STATUS(mj_experts_create(ctx, L, NULL, &e3), MJ_ERR_UNSUPPORTED);
    CHECK(strstr(mj_last_error(), "96") && strstr(mj_last_error(), "multiple of 64"), "%s", mj_last_error());
    L->i_local = keep;
    mj_experts_free(ex);
    mj_layer_free(L);
}

/* What a forward fetches (mj_experts_specs): on a GPU one specialization per kernel it
 * launches, knobs the kernel does not read pinned (so W4A4's experts_quant is one spec for
 * every TPE), each valid; on the interpreter one spec with all three. A manifest line
 * that pins a knob otherwise, or asks W4A16 for experts_quant, is refused by name. */
static void test_specs(const char *cache) {
    static const char *const backends[] = {"cuda", "sim"};
    for (int b = 0; b < 2; b++) {
        mj_context_t c = test_new_context(cache, b ? MJ_BACKEND_SIM : MJ_BACKEND_CUDA, "sm_120a", 0);
        if (!c) continue;
        int32_t quant_tpe = -1;
        for (int mode = 0; mode < 2; mode++)
            for (int tpe = 8; tpe <= 64; tpe *= 2) {
                mj_knobs_moe_experts k = {.MODE = mode, .H = 6144, .I = 256, .K = 8, .TPE = tpe, .NW1 = 4, .NW2 = 2,
                                          .NSUB = 1, .STREAM = 0, .DSTEPS = 2, .QG = 8};
                mj_spec s[3];
                const int32_t n = mj_experts_specs(c, &k, s);
                CHECK(n == (b ? 1 : mode ? 3 : 2), "%s %s TPE %d: %d specializations", backends[b],
                      mode ? "W4A4" : "W4A16", tpe, n);
                for (int32_t q = 0; q < n && q < 3; q++) {
                    const int32_t *kn = s[q].knobs; /* MODE H I K TPE NW1 NW2 NSUB PART STREAM DSTEPS DEAL QG */
                    CHECK_OK(mj_spec_validate(&s[q]));
                    CHECK(kn[0] == mode && kn[1] == 6144 && kn[2] == 256 && kn[3] == 8 && kn[7] == 1,
                          "%s: the shape knobs are the forward's", backends[b]);
                    const int32_t part = kn[8];
                    if (b) {
                        CHECK(part == 0 && kn[4] == tpe && kn[5] == 4 && kn[6] == 2 && kn[10] == 2 && kn[12] == 8,
                              "sim: PART 0 with every knob");
                    } else if (part == 1) {
                        CHECK(mode == 1 && kn[4] == 8 && kn[5] == 1 && kn[6] == 1 && kn[9] == 0 && kn[10] == 4 && kn[12] == 8,
                              "quant: TPE 8, NW1 1, NW2 1, STREAM 0, DSTEPS 4, the plan's QG");
                        CHECK(quant_tpe < 0 || quant_tpe == kn[4], "one experts_quant for every TPE");
                        quant_tpe = kn[4];
                    } else {
                        CHECK(part == 2 ? kn[4] == tpe && kn[5] == 4 && kn[6] == 1 && kn[9] == 0 && kn[10] == 4 && kn[12] == 2
                                        : kn[4] == tpe && kn[5] == 1 && kn[6] == 2 && kn[9] == 0 && kn[10] == 2 && kn[12] == 2,
                              "%s PART %d TPE %d: NW1 %d NW2 %d STREAM %d DSTEPS %d", mode ? "W4A4" : "W4A16", part, tpe,
                              kn[5], kn[6], kn[9], kn[10]);
                    }
                }
            }
        mj_context_destroy(c);
    }
    static const char *const bad[] = {
        "{\"template\": \"moe_experts\", \"knobs\": {\"MODE\": 0, \"H\": 6144, \"I\": 256, \"K\": 8, \"TPE\": 8, "
        "\"NW1\": 1, \"NW2\": 1, \"NSUB\": 1, \"PART\": 1, \"STREAM\": 0, \"DSTEPS\": 4, \"DEAL\": 0, \"QG\": 2}, \"arch\": \"sm_120a\"}",
        "{\"template\": \"moe_experts\", \"knobs\": {\"MODE\": 0, \"H\": 6144, \"I\": 256, \"K\": 8, \"TPE\": 8, "
        "\"NW1\": 8, \"NW2\": 2, \"NSUB\": 1, \"PART\": 2, \"STREAM\": 0, \"DSTEPS\": 4, \"DEAL\": 0, \"QG\": 2}, \"arch\": \"sm_120a\"}",
        "{\"template\": \"moe_experts\", \"knobs\": {\"MODE\": 0, \"H\": 6144, \"I\": 256, \"K\": 8, \"TPE\": 8, "
        "\"NW1\": 8, \"NW2\": 2, \"NSUB\": 1, \"PART\": 3, \"STREAM\": 0, \"DSTEPS\": 4, \"DEAL\": 0, \"QG\": 2}, \"arch\": \"sm_120a\"}",
    };
    /* mj_jit_get_many: every spec, the first failure (in order) reported with its text, and
     * nothing at all for n = 0. */
    mj_context_t c = test_new_context(cache, MJ_BACKEND_SIM, "sm_120a", 0);
    if (c) {
        mj_knobs_moe_experts k = {.MODE = 0, .H = 256, .I = 128, .K = 4, .TPE = 8, .NW1 = 2, .NW2 = 1, .NSUB = 1,
                                  .STREAM = 0, .DSTEPS = 4, .QG = 2};
        mj_spec two[3];
        CHECK(mj_experts_specs(c, &k, two) == 1, "sim: one spec");
        two[1] = two[0];
        two[1].knobs[8] = 1; /* experts_quant in W4A16: refused */
        const mj_function *f[2] = {NULL, NULL}, *one = NULL;
        mj_status st = mj_jit_get_many(c, two, 2, f);
        CHECK(st == MJ_ERR_INVALID_ARG && strstr(mj_last_error(), "experts_quant"), "get_many of a bad spec: %s: %s",
              mj_status_string(st), mj_last_error());
        CHECK_OK(mj_jit_get_many(c, two, 1, f));
        CHECK_OK(mj_jit_get(c, &two[0], &one));
        CHECK(f[0] && f[0] == one, "get_many and get agree");
        CHECK_OK(mj_jit_get_many(c, two, 0, f));
        CHECK(mj_jit_get_many(c, two, -1, f) == MJ_ERR_INVALID_ARG, "a negative count refused");
        mj_context_destroy(c);
    }
    static const char *const why[] = {"experts_quant", "NW2 1", "NW1 1"};
    for (int i = 0; i < 3; i++) {
        mj_spec s;
        mj_status st = mj_spec_from_json(bad[i], "test", &s);
        if (st == MJ_OK) st = mj_spec_validate(&s);
        CHECK(st == MJ_ERR_INVALID_ARG && strstr(mj_last_error(), why[i]), "bad PART line %d: %s: %s", i,
              mj_status_string(st), mj_last_error());
    }
}

/* Every specialization of the GLM-5 decode plan (H 6144, I_local 256 and 2048, one shared
 * expert, B 1..64) compiles with 0 spills: W4A4 and W4A16 for sm_120a, W4A16 for sm_90a
 * and sm_80, each kernel a specialization of its own as a forward fetches them
 * (mj_experts_specs: experts_quant in W4A4, experts_up, experts_down). The SASS of up and
 * down has the MMAs and 128-bit weight loads. */
static void test_compile(const char *cache) {
    static const char *targets[] = {"sm_120a", "sm_90a", "sm_80"};
    static const char *kernel[] = {"all", "quant", "up", "down"};
    for (int t = 0; t < 3; t++) {
        mj_context_t c = test_new_context(cache, MJ_BACKEND_CUDA, targets[t], 0);
        if (!c) continue;
        for (int ii = 0; ii < 2; ii++)
            for (int mode = 0; mode < (t == 0 ? 2 : 1); mode++)
                for (int tpe = 8; tpe <= 64; tpe *= 2) {
                    mj_knobs_moe_experts k; /* the dispatcher's pick for B = tpe */
                    mj_target tg;
                    CHECK_OK(mj_target_parse(targets[t], &tg));
                    mj_experts_knobs(6144, ii ? 2048 : 256, 8, 1, mode ? MJ_MODE_W4A4 : MJ_MODE_W4A16, tpe, tg, &k);
                    /* items of 2 k-steps: W4A16 past TPE 8 where an SM has 100 KiB (sm_120a), and at
                     * TPE 32 where it has 228 KiB (sm_90a) and an expert takes several items (I
                     * 2048), for 8 down warps in 72 KiB; with the whole expert an item (I 256) no
                     * fragments wait in shared memory, and 8 warps with items of 4 fit */
                    const int ds = mode == 0 && ((tpe > 8 && t == 0) || (tpe == 32 && t == 1 && ii)) ? 2 : 4;
                    CHECK(k.DSTEPS == ds, "%s %s TPE %d: down's items of %d k-steps, want %d", targets[t],
                          mode ? "W4A4" : "W4A16", tpe, k.DSTEPS, ds);
                    /* down's warps: 8 on sm_90a up to TPE 32 (3 blocks an SM of 228 KiB; not sm_80's
                     * 164), else 4 within 48 KiB (2 at TPE 64 with items of 4 k-steps where an
                     * expert takes several: their fragments wait in shared memory) */
                    const int nw2 = t == 1 && tpe <= 32 ? 8 : tpe == 64 && ds == 4 && ii ? 2 : 4;
                    CHECK(k.NW2 == nw2, "%s %s TPE %d: %d down warps, want %d", targets[t], mode ? "W4A4" : "W4A16",
                          tpe, k.NW2, nw2);
                    /* by place where the slot tile keeps the blocks an SM: sm_90a's 8 warps (GLM-5: 9
                     * slots a token), sm_120a's at TPE 8 (3 blocks of 4 warps either way: one token
                     * group keeps its sums in registers, no fragments in shared memory) and TPE 16
                     * (W4A4: 2 blocks either way; W4A16: 3, its ring's slots carrying 16 rows'
                     * entries); elsewhere it would cost a block an SM. With the whole expert an
                     * item (I 256) no fragments wait in shared memory, and the sizes move:
                     * sm_120a W4A4 keeps 3 blocks by id at TPE 16 (2 by place), 2 either way at
                     * TPE 32; sm_80's 4 warps hold the slot tile at TPE 16 in as many blocks.
                     * Except W4A16 at TPE 16 on sm_120a and sm_80: there the warps' own sums (by
                     * id) let one block more an SM than the slot tile (sm_120a: 4, not 3) */
                    int deal = (t == 1 && tpe <= 32) || (t == 0 && tpe <= 16);
                    if (!ii && ((t == 0 && mode == 1 && (tpe == 16 || tpe == 32)) || (t == 2 && tpe == 16)))
                        deal = !deal;
                    if (mode == 0 && tpe == 16 && t != 1) deal = 0;
                    CHECK(k.DEAL == deal, "%s %s TPE %d: down's experts dealt %s", targets[t], mode ? "W4A4" : "W4A16",
                          tpe, k.DEAL ? "by place" : "by id");
                    mj_spec s[3];
                    const int32_t n = mj_experts_specs(c, &k, s);
                    CHECK(n == (mode ? 3 : 2), "%s %s: %d specializations, want one per kernel launched",
                          targets[t], mode ? "W4A4" : "W4A16", n);
                    const mj_function *many[3] = {NULL, NULL, NULL}; /* compiled side by side */
                    CHECK_OK(mj_jit_get_many(c, s, n, many));
                    for (int32_t q = 0; q < n; q++) {
                        const int32_t part = s[q].knobs[8] /* PART, the template's last knob */;
                        const mj_function *f = NULL;
                        CHECK(part == (mode ? 1 : 2) + q, "%s: part %d of the specs is PART %d", targets[t], q, part);
                        CHECK_OK(mj_jit_get(c, &s[q], &f));
                        CHECK(f == many[q], "%s: mj_jit_get_many's function %d is mj_jit_get's", targets[t], q);
                        if (!f) continue;
                        const mj_ptxas_report *rep = mj_function_report(f);
                        CHECK(rep->spill_stores == 0 && rep->spill_loads == 0 && rep->stack_frame == 0,
                              "%s %s %s I %d TPE %d: %d/%d spill bytes, %d B of stack (local memory)", targets[t],
                              mode ? "W4A4" : "W4A16", kernel[part], k.I, tpe, rep->spill_stores, rep->spill_loads,
                              rep->stack_frame);
                        CHECK(rep->smem_static == 0, "%s: %d B of static shared memory", targets[t], rep->smem_static);
                        /* 8 down warps: 3 blocks of 256 threads an SM need 80 registers or fewer */
                        CHECK(part != 3 || k.NW2 != 8 || rep->registers <= 80, "%s %s TPE %d down: %d registers for "
                              "3 blocks of 8 warps an SM", targets[t], kernel[part], tpe, rep->registers);
                        /* 8 up warps (TPE 16) where an SM holds 3 blocks' rings (sm_90a, sm_80): 80 or
                         * fewer too (about 100 by ptxas's own choice: 2 blocks an SM) */
                        CHECK(part != 2 || k.NW1 != 8 || t == 0 || rep->registers <= 80, "%s %s TPE %d up: %d registers "
                              "for 3 blocks of 8 warps an SM", targets[t], kernel[part], tpe, rep->registers);
                        if (ii == 0)
                            printf("plan %-7s %-5s TPE %2d %-5s: %3d registers, %d spill bytes\n", targets[t],
                                   mode ? "W4A4" : "W4A16", tpe, kernel[part], rep->registers, rep->spill_stores);
                        if (ii == 0 && tpe == 8 && part >= 2) {
                            /* The SASS: the tensor-core MMA of the mode, and every weight load a
                             * 128-bit cp.async copy through L2 into the warp's ring
                             * (LDGSTS.E.BYPASS.128), nothing through the old register stream. */
                            size_t len;
                            const void *bin = mj_function_binary(f, &len);
                            char *sass = test_sass(bin, len);
                            CHECK(sass != NULL, "nvdisasm did not run (scripts/setup.sh installs it)");
                            if (!sass) continue;
                            const char *mma = mode ? "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X" : "HMMA.16816.F32.BF16";
                            const char *ld = "LDGSTS.E.BYPASS", *ld128 = "LDGSTS.E.BYPASS.128";
                            int n_mma = test_count(sass, mma), n_ld = test_count(sass, ld);
                            int n_ld128 = test_count(sass, ld128);
                            /* down's one other copy: the 4-byte top-k entries of an expert's rows
                             * (cp.async.ca, not through L2 alone); up's, at H 6144 (24 runs over
                             * 16 warps: pieces of half a run), half a run's scales, 8 bytes a lane
                             * (cp.async.ca: .cg takes 16 alone) */
                            const int n_idx = part == 3 ? 1 : 0, n_8 = test_count(sass, "LDGSTS.E.64 [");
                            CHECK(test_count(sass, "LDG.E.NA") == 0 &&
                                      test_count(sass, "LDGSTS") == n_ld + n_idx + n_8 &&
                                      test_count(sass, "LDGSTS.E [") == n_idx && (part == 2 ? n_8 > 0 : n_8 == 0),
                                  "%s %s %s: weights only through the ring (%d LDGSTS, %d of them 4-byte, %d 8-byte, %d "
                                  "LDG.E.NA)",
                                  targets[t], mode ? "W4A4" : "W4A16", kernel[part], test_count(sass, "LDGSTS"),
                                  test_count(sass, "LDGSTS.E ["), test_count(sass, "LDGSTS.E.64 ["),
                                  test_count(sass, "LDG.E.NA"));
                            CHECK(n_mma > 0, "%s %s %s: no %s in the SASS", targets[t], mode ? "W4A4" : "W4A16",
                                  kernel[part], mma);
                            CHECK(n_ld128 > 0 && n_ld128 == n_ld, "%s %s %s: %d of %d weight-stream loads are 128-bit",
                                  targets[t], mode ? "W4A4" : "W4A16", kernel[part], n_ld128, n_ld);
                            printf("sass %-7s %-5s %-5s: %d x %s, %d weight loads, all %s\n", targets[t],
                                   mode ? "W4A4" : "W4A16", kernel[part], n_mma, mma, n_ld128, ld128);
                            free(sass);
                        }
                    }
                }
        mj_context_destroy(c);
    }
}

/* The cases' seed, the kernel cache and a context on the interpreter (setup). */
static uint64_t g_seed;
static const char *g_cache;
static mj_context_t g_ctx;

static int setup(void) {
    g_seed = test_seed(2026);
    g_cache = test_shared_cache();
    g_ctx = test_new_context(g_cache, MJ_BACKEND_SIM, "sm_120a", 0);
    return g_ctx ? 0 : test_finish();
}

static void teardown(void) { mj_context_destroy(g_ctx); }

/* The dispatcher's choices the forwards saw: every bucket, split-K width and down width.
 * Checked after small, whose shapes alone reach each one, so it holds when small runs alone. */
static void check_seen(void) {
    CHECK(g_seen_tpe[8] && g_seen_tpe[16] && g_seen_tpe[32] && g_seen_tpe[64], "every token bucket reached");
    CHECK(g_seen_nw1[1] && g_seen_nw1[2] && g_seen_nw1[4] && g_seen_nw1[8], "every split-K width reached");
    CHECK(g_seen_stream[0] && g_seen_stream[1], "up with and without STREAM reached");
    CHECK(g_seen_runs[0] && g_seen_runs[1] && g_seen_runs[2] && g_seen_runs[3] && g_seen_runs[4],
          "up's STREAM runs: a tile over 2 blocks %d, over 3 %d, a whole tile and part of another %d, an empty run %d, "
          "whole tiles alone %d",
          g_seen_runs[0], g_seen_runs[1], g_seen_runs[2], g_seen_runs[3], g_seen_runs[4]);
    CHECK(g_seen_halfruns, "up's pieces of half a run reached (runs that do not deal evenly to its warps)");
    CHECK(g_seen_nw2[4], "down's 4-warp blocks reached");
    CHECK(g_seen_ds[4] && g_seen_ds[2], "both item sizes of down reached (4 k-steps at TPE 8, 2 past it)");
    CHECK(g_seen_deal[0] && g_seen_deal[1], "down's experts dealt by id and by place both reached");
    CHECK(g_seen_chunks && g_seen_tiles, "an expert with more tokens than a bucket, and several token tiles");
}

/* An expert wider than the kernels take per rank needs MORE TP ranks (each holds I / TP); one
 * below 64 or off the 64 grid needs fewer (or EP). The hint must point the right way. */
static void test_wide_expert(void) {
    mj_moe_config c = test_moe_cfg(64, MJ_KNOB_moe_experts_I_MAX + 64, 2, 1, 0);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, 7, &L));
    if (!L) return;
    mj_experts_t ex = NULL;
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    CHECK_STATUS(mj_experts_create(g_ctx, L, &eo, &ex), MJ_ERR_UNSUPPORTED);
    CHECK(strstr(mj_last_error(), "more TP ranks") != NULL, "a wide expert's hint: %s", mj_last_error());
    CHECK(ex == NULL, "nothing made");
    mj_layer_free(L);
}

/* The host's picture of down's ring (runtime/experts.h: the launch's shared memory, the
 * performance model's bytes in flight) is the template's. */
static void case_ring(void) {
    int32_t tpl = -1;
    const mj_template_desc *t = mj_template_find("moe_experts", &tpl);
    CHECK(t != NULL, "moe_experts in the registry");
    if (!t) return;
    char want[64];
    snprintf(want, sizeof want, "\n#define DRING %d\n", MJ_EXPERTS_DRING);
    CHECK(strstr(t->body, want) != NULL, "templates/moe_experts.cu defines DRING as runtime/experts.h (%d)",
          MJ_EXPERTS_DRING);
    CHECK(strstr(t->body, "\n#define DRIDX (TPE == 16 ? 16 : 8) ") &&
              strstr(t->body, "\n#define DSLOT (DSTEPS * 512 + 256 + 4 * DRIDX)\n") &&
              MJ_EXPERTS_DSLOT(2, 8) == 2 * 512 + 256 + 4 * 8 && MJ_EXPERTS_DSLOT(4, 16) == 4 * 512 + 256 + 4 * 16 &&
              MJ_EXPERTS_DSLOT(2, 64) == 2 * 512 + 256 + 4 * 8,
          "DSLOT: the template's and runtime/experts.h's agree (%d, %d, %d)", MJ_EXPERTS_DSLOT(2, 8),
          MJ_EXPERTS_DSLOT(4, 16), MJ_EXPERTS_DSLOT(2, 64));
    /* experts_quant's block and group: the launch's grid and shared memory follow them */
    snprintf(want, sizeof want, "\n#define QT %d\n", MJ_EXPERTS_QT);
    CHECK(strstr(t->body, want) != NULL, "templates/moe_experts.cu defines QT as runtime/experts.h (%d)", MJ_EXPERTS_QT);
    /* QG is a knob: the plan's choice (8 at W4A4's TPE 8, else 2) and the launch's grid and
     * shared memory from it */
    CHECK(strstr(t->body, "\n#define QV (16 / QG) ") != NULL, "templates/moe_experts.cu: a thread's values, 16 / QG");
    mj_target t120;
    CHECK_OK(mj_target_parse("sm_120a", &t120));
    for (int tpe = 8; tpe <= 64; tpe *= 2)
        for (int mode = 0; mode < 2; mode++) {
            mj_knobs_moe_experts k;
            mj_experts_knobs(6144, 256, 8, 1, mode ? MJ_MODE_W4A4 : MJ_MODE_W4A16, tpe, t120, &k);
            mj_launch_dims d[3];
            mj_experts_dims(&k, tpe, 8 * tpe, 1, NULL, d);
            const int qg = mode && tpe == 8 ? 8 : 2;
            CHECK(k.QG == qg && d[0].smem == (uint32_t)(16 / qg * MJ_EXPERTS_QT * 4) &&
                      d[0].grid[2] == (uint32_t)((6144 / 16 + MJ_EXPERTS_QT / qg - 1) / (MJ_EXPERTS_QT / qg)),
                  "TPE %d mode %d: QG %d (want %d), quant smem %u, grid.z %u", tpe, mode, k.QG, qg, d[0].smem,
                  d[0].grid[2]);
        }
}

static void case_pack(void) { test_pack(g_seed); }
static void case_placement(void) { test_placement(g_seed + 10); }
static void case_placed(void) { test_placed_forward(g_cache, g_seed + 20); }
static void case_silu(void) { test_silu(g_ctx); }
static void case_dequant(void) { test_dequant(g_ctx); }
static void case_small(void) { test_small(g_ctx, g_seed); check_seen(); }
static void case_shards(void) { test_shards(g_ctx, g_seed + 200); }
static void case_prefill(void) { test_prefill(g_ctx, g_seed + 250); }
static void case_scale_bytes(void) { test_scale_bytes(g_ctx, g_seed + 280); }
static void case_quant_signs(void) { test_quant_signs(g_ctx, g_seed + 290); }
static void case_mutations(void) { test_mutations(g_ctx, g_seed + 300); }
static void case_bytes(void) { test_bytes(g_ctx, g_cache, g_seed + 400); }
static void case_replay(void) { test_replay(g_ctx, g_seed + 500); }
static void case_batch_invariance(void) { test_batch_invariance(g_ctx, g_seed + 550); }
static void case_refusals(void) { test_refusals(g_ctx, g_cache); }
static void case_glm5_shapes(void) { test_glm5_shapes(g_ctx, g_seed + 600); }
static void case_specs(void) { test_specs(g_cache); }
static void case_compile(void) { test_compile(g_cache); }

static const test_case cases[] = {
    TEST_CASE("ring", case_ring),
    TEST_CASE("pack", case_pack),
    TEST_CASE("placement", case_placement),
    TEST_CASE("placed", case_placed),
    TEST_CASE("silu", case_silu),
    TEST_CASE("dequant", case_dequant),
    TEST_CASE("small", case_small),
    TEST_CASE("shards", case_shards),
    TEST_CASE("prefill", case_prefill),
    TEST_CASE("scale_bytes", case_scale_bytes),
    TEST_CASE("quant_signs", case_quant_signs),
    TEST_CASE("mutations", case_mutations),
    TEST_CASE("bytes", case_bytes),
    TEST_CASE("replay", case_replay),
    TEST_CASE("batch_invariance", case_batch_invariance),
    TEST_CASE("refusals", case_refusals),
    TEST_CASE("wide_expert", test_wide_expert),
    TEST_CASE("glm5_shapes", case_glm5_shapes),
    TEST_CASE("specs", case_specs),
    TEST_CASE("compile", case_compile),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
