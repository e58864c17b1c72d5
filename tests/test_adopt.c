/* test_adopt.c — experts adopted from tensors laid out as serving engines hold them
 * (mj_experts_adopt, runtime/adopt.c), on the interpreter.
 *
 * An "engine" here is a random layer's experts written out the way SGLang's and vLLM's
 * ModelOpt NVFP4 MoE layers keep them: w13 [E, 2I, H/2] as [gate; up] or [up; gate], block
 * scales linear or swizzled into the 128x4 layout (written here with the reshape and permute
 * SGLang's swizzle_blockscale does, not with adopt.c's formula), weight_scale_2 [E, 2], input
 * scales of every expert of the model [E_global, 2] with this rank's rows at expert_begin,
 * reciprocals where CompressedTensors keeps them, and top-k ids as an engine passes them:
 * local, -1 in any slot (padding rows, experts of other ranks), the routed scaling factor in
 * the weights. Each forward on them must give the same bits as mj_experts_create's handle of
 * the same layer run on the same routing (compacted, global ids, mj_route_dispatch_ref), and
 * be near mj_experts_ref. Also: in place allocates only the workspace (bytes measured at
 * mj_mem_alloc), copy mode leaves the engine's bytes alone, release gives them back byte for
 * byte, a reload is packed again, and every refused call leaves the engine's tensors as they
 * were (the bad value put in the last expert, so a check made while packing would be late).
 */
#include "experts.h"
#include "mem.h"
#include "ref/ref.h"
#include "test.h"
#include "weights/layer.h"

#define H0 256
#define I0 256
#define K0 4
#define EL 8 /* experts a rank holds */

static uint64_t g_seed;
static const char *g_cache;
static mj_context_t g_ctx;

/* ---- an engine's tensors ---------------------------------------------------------------------- */

typedef struct engine {
    int E, H, I, Eg, e0;
    unsigned flags;
    uint8_t *w13, *s13, *w2, *s2;
    int64_t b_w13, b_s13, b_w2, b_s2; /* one expert's bytes */
    float *ws13, *ws2, *in13, *in2;   /* [E, 2], [E], [Eg, 2], [Eg] */
    mj_adopt_tensors t;
} engine;

static int64_t rup(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static void *zalloc_aligned(int64_t n) {
    void *p = aligned_alloc(256, (size_t)rup(n, 256));
    memset(p, 0, (size_t)rup(n, 256));
    return p;
}

/* SGLang's swizzle_blockscale for one expert: pad to [Mp, Kp], reshape (Mp/128, 4, 32, Kp/4,
 * 4), permute (0, 3, 2, 1, 4) -> (m1, k1, m32, m4, k4), contiguous. */
static void swizzle_like_sglang(const uint8_t *lin, int64_t M, int64_t K, uint8_t *out) {
    const int64_t Mp = rup(M, 128), Kp = rup(K, 4);
    int64_t o = 0;
    for (int64_t m1 = 0; m1 < Mp / 128; m1++)
        for (int64_t k1 = 0; k1 < Kp / 4; k1++)
            for (int64_t m32 = 0; m32 < 32; m32++)
                for (int64_t m4 = 0; m4 < 4; m4++)
                    for (int64_t k4 = 0; k4 < 4; k4++) {
                        const int64_t m = m1 * 128 + m4 * 32 + m32, k = k1 * 4 + k4;
                        out[o++] = m < M && k < K ? lin[m * K + k] : 0;
                    }
}

/* Layer L's experts (a rank's: L->expert_begin .. + n_local of Eg) as an engine holds them. */
static void engine_make(mj_layer_t L, int Eg, unsigned flags, engine *g) {
    memset(g, 0, sizeof *g);
    const int E = L->n_local, H = L->cfg.hidden, I = L->i_local, swz = (flags & MJ_ADOPT_SCALES_SWIZZLED) != 0;
    g->E = E, g->H = H, g->I = I, g->Eg = Eg, g->e0 = L->expert_begin, g->flags = flags;
    g->b_w13 = (int64_t)2 * I * H / 2, g->b_w2 = (int64_t)H * I / 2;
    g->b_s13 = swz ? rup(2 * I, 128) * rup(H / 16, 4) : (int64_t)2 * I * H / 16;
    g->b_s2 = swz ? rup(H, 128) * rup(I / 16, 4) : (int64_t)H * I / 16;
    g->w13 = zalloc_aligned(E * g->b_w13), g->s13 = zalloc_aligned(E * g->b_s13);
    g->w2 = zalloc_aligned(E * g->b_w2), g->s2 = zalloc_aligned(E * g->b_s2);
    g->ws13 = malloc(sizeof(float) * 2 * E), g->ws2 = malloc(sizeof(float) * E);
    g->in13 = malloc(sizeof(float) * 2 * Eg), g->in2 = malloc(sizeof(float) * Eg);
    const int rw = (flags & MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2) != 0, ri = (flags & MJ_ADOPT_RECIPROCAL_INPUT_SCALE) != 0;
    for (int e = 0; e < Eg; e++) /* other ranks' rows: far off, so a wrong row shows */
        g->in13[2 * e] = g->in13[2 * e + 1] = g->in2[e] = ri ? 1e-3f : 1e3f;
    const int64_t half = (int64_t)I * H / 2, shalf = (int64_t)I * H / 16;
    uint8_t *lin = malloc((size_t)(2 * I * H / 16));
    for (int x = 0; x < E; x++) {
        const mj_nvfp4_linear *a = &L->w13[x], *b = &L->w2[x];
        const int up_first = (flags & MJ_ADOPT_UP_FIRST) != 0;
        memcpy(g->w13 + x * g->b_w13, a->weight + (up_first ? half : 0), (size_t)half);
        memcpy(g->w13 + x * g->b_w13 + half, a->weight + (up_first ? 0 : half), (size_t)half);
        memcpy(lin, a->weight_scale + (up_first ? shalf : 0), (size_t)shalf);
        memcpy(lin + shalf, a->weight_scale + (up_first ? 0 : shalf), (size_t)shalf);
        if (swz) swizzle_like_sglang(lin, 2 * I, H / 16, g->s13 + x * g->b_s13);
        else memcpy(g->s13 + x * g->b_s13, lin, (size_t)(2 * shalf));
        memcpy(g->w2 + x * g->b_w2, b->weight, (size_t)g->b_w2);
        if (swz) swizzle_like_sglang(b->weight_scale, H, I / 16, g->s2 + x * g->b_s2);
        else memcpy(g->s2 + x * g->b_s2, b->weight_scale, (size_t)g->b_s2);
        g->ws13[2 * x] = g->ws13[2 * x + 1] = rw ? 1.0f / a->weight_scale_2 : a->weight_scale_2;
        g->ws2[x] = rw ? 1.0f / b->weight_scale_2 : b->weight_scale_2;
        const int r = g->e0 + x;
        g->in13[2 * r] = g->in13[2 * r + 1] = ri ? 1.0f / a->input_scale : a->input_scale;
        g->in2[r] = ri ? 1.0f / b->input_scale : b->input_scale;
    }
    free(lin);
    mj_adopt_tensors t = MJ_ADOPT_TENSORS_INIT;
    t.n_experts = E, t.hidden = H, t.intermediate = I, t.topk = L->cfg.topk;
    t.w13_weight = g->w13, t.w13_weight_scale = g->s13, t.w2_weight = g->w2, t.w2_weight_scale = g->s2;
    t.w13_weight_scale_2 = (mj_adopt_scale){g->ws13, E, 2};
    t.w2_weight_scale_2 = (mj_adopt_scale){g->ws2, E, 1};
    t.w13_input_scale = (mj_adopt_scale){g->in13, Eg, 2};
    t.w2_input_scale = (mj_adopt_scale){g->in2, Eg, 1};
    t.expert_begin = g->e0, t.flags = flags;
    g->t = t;
}

static void engine_free(engine *g) {
    free(g->w13), free(g->s13), free(g->w2), free(g->s2);
    free(g->ws13), free(g->ws2), free(g->in13), free(g->in2);
}

/* A copy of every byte the engine holds, and the check that nothing changed. */
typedef struct snapshot {
    uint8_t *b[8];
    int64_t n[8];
} snapshot;

static void snap(const engine *g, snapshot *s) {
    const void *p[8] = {g->w13, g->s13, g->w2, g->s2, g->ws13, g->ws2, g->in13, g->in2};
    const int64_t n[8] = {g->E * g->b_w13, g->E * g->b_s13, g->E * g->b_w2, g->E * g->b_s2,
                          8LL * g->E, 4LL * g->E, 8LL * g->Eg, 4LL * g->Eg};
    for (int i = 0; i < 8; i++) s->n[i] = n[i], s->b[i] = malloc((size_t)n[i]), memcpy(s->b[i], p[i], (size_t)n[i]);
}

/* Tensors [from, to) of the snapshot's order (w13, s13, w2, s2, then the scalars) as they were. */
static int unchanged_in(const engine *g, const snapshot *s, int from, int to) {
    const void *p[8] = {g->w13, g->s13, g->w2, g->s2, g->ws13, g->ws2, g->in13, g->in2};
    int same = 1;
    for (int i = from; i < to; i++) same &= !memcmp(p[i], s->b[i], (size_t)s->n[i]);
    return same;
}

static int unchanged(const engine *g, const snapshot *s, int first_n) { return unchanged_in(g, s, 0, first_n); }

static void snap_free(snapshot *s) {
    for (int i = 0; i < 8; i++) free(s->b[i]);
}

/* ---- a routing as an engine passes it -------------------------------------------------------- */

typedef struct topk {
    int B, nv, K;
    int32_t *ids, *ids_c, *nsel; /* engine's (local, -1 anywhere); compacted global; counts */
    float *w, *w_c;
} topk;

/* Each valid token picks 0..K distinct local experts into random slots (the rest -1); the
 * weights carry rsf; padding rows are all -1 with weights that are not 0. */
static void topk_make(int B, int nv, int K, int E, int e0, uint64_t *rng, topk *r) {
    r->B = B, r->nv = nv, r->K = K;
    size_t n = (size_t)B * K;
    r->ids = malloc(4 * n), r->ids_c = malloc(4 * n), r->w = malloc(4 * n), r->w_c = malloc(4 * n);
    r->nsel = malloc(4 * (size_t)B);
    for (int b = 0; b < B; b++) {
        int used[64] = {0}, c = 0;
        for (int j = 0; j < K; j++) {
            int32_t id = -1;
            if (b < nv && mj_rng_next(rng) % 4 != 0) {
                int e = (int)(mj_rng_next(rng) % (uint64_t)E);
                if (!used[e]) used[e] = 1, id = e;
            }
            r->ids[b * K + j] = id;
            r->w[b * K + j] = 2.5f * (float)(0.05 + mj_rng_uniform(rng));
            if (id >= 0) r->ids_c[b * K + c] = id + e0, r->w_c[b * K + c] = r->w[b * K + j], c++;
        }
        r->nsel[b] = c;
        for (int j = c; j < K; j++) r->ids_c[b * K + j] = -1, r->w_c[b * K + j] = 0.0f;
    }
}

static void topk_free(topk *r) { free(r->ids), free(r->ids_c), free(r->w), free(r->w_c), free(r->nsel); }

/* mj_experts_create's handle of L run on the compacted routing: the bits to match. */
static void forward_created(mj_layer_t L, mj_weight_mode mode, const uint16_t *hidden, const topk *r, float *out) {
    mj_experts_t ex = NULL;
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = r->B;
    CHECK_OK(mj_experts_create(g_ctx, L, &eo, &ex));
    if (!ex) return;
    const int E = L->cfg.n_experts, n = r->B * r->K;
    int32_t *cnt = malloc(4 * (size_t)E), *off = malloc(4 * (size_t)(E + 1)), *act = malloc(4 * (size_t)E);
    int32_t *perm = malloc(4 * (size_t)n), *rix = malloc(4 * (size_t)n), na = 0;
    CHECK_OK(mj_route_dispatch_ref(r->ids_c, r->nsel, r->B, r->K, E, cnt, off, act, &na, perm, rix));
    mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
    ro.ids = r->ids_c, ro.weights = r->w_c, ro.n_sel = r->nsel, ro.expert_counts = cnt, ro.expert_offsets = off;
    ro.active_experts = act, ro.n_active = &na, ro.permutation = perm, ro.row_index = rix;
    CHECK_OK(mj_experts_forward(g_ctx, ex, mode, hidden, &ro, r->B, NULL, out, NULL));
    free(cnt), free(off), free(act), free(perm), free(rix);
    mj_experts_free(ex);
}

/* The adopted handle's forward on the engine's routing against the created handle's (same
 * bits) and the reference (relative L2), padding rows 0; bf16 output = f32's rounded. */
static void check_forward(const char *what, mj_experts_t ex, mj_layer_t L, mj_weight_mode mode, const topk *r,
                          uint64_t *rng) {
    const int H = L->cfg.hidden, B = r->B;
    uint16_t *hidden = malloc(2 * (size_t)B * H), *o16 = malloc(2 * (size_t)B * H);
    float *got = malloc(4 * (size_t)B * H), *same = malloc(4 * (size_t)B * H), *want = malloc(4 * (size_t)B * H);
    test_random_hidden(hidden, (size_t)B * H, rng);
    CHECK_OK(mj_experts_forward_topk(g_ctx, ex, mode, hidden, B, r->ids, r->w, NULL, got, MJ_OUT_F32, NULL));
    forward_created(L, mode, hidden, r, same);
    CHECK(!memcmp(got, same, 4 * (size_t)B * H), "%s: the adopted experts' output differs from mj_experts_create's "
          "(first: %g vs %g)", what, got[0], same[0]);
    CHECK_OK(mj_experts_ref(L, mode, hidden, B, B, r->ids_c, r->w_c, r->nsel, want));
    const double e = test_rel_l2(got, want, (size_t)B * H);
    CHECK(e <= (mode == MJ_MODE_W4A16 ? 2e-3 : 5e-2), "%s: vs mj_experts_ref: relative L2 %.3g", what, e);
    int pad = 0, bf = 0;
    for (int64_t i = (int64_t)r->nv * H; i < (int64_t)B * H; i++) pad += got[i] != 0.0f;
    CHECK(pad == 0, "%s: %d outputs of padding rows (ids -1) are not 0", what, pad);
    CHECK_OK(mj_experts_forward_topk(g_ctx, ex, mode, hidden, B, r->ids, r->w, NULL, o16, MJ_OUT_BF16, NULL));
    for (int64_t i = 0; i < (int64_t)B * H; i++) bf += o16[i] != mj_f32_to_bf16(got[i]);
    CHECK(bf == 0, "%s: %d bf16 outputs are not the f32 ones rounded", what, bf);
    free(hidden), free(o16), free(got), free(same), free(want);
}

static mj_layer_t random_layer(int H, int I, int E, int K, uint64_t seed) {
    mj_moe_config c = test_moe_cfg(H, I, E, K, 0);
    mj_layer_t L = NULL;
    CHECK_OK(mj_layer_create_random(&c, seed, &L));
    return L;
}

static mj_experts_t adopt(const engine *g, int max_batch) {
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = max_batch;
    mj_experts_t ex = NULL;
    CHECK_OK(mj_experts_adopt(g_ctx, &g->t, &eo, &ex));
    return ex;
}

/* ---- cases -------------------------------------------------------------------------------------- */

/* Both gate/up orders, linear and swizzled scales, both modes; released, the engine's bytes
 * come back exactly. */
static void case_layouts(void) {
    uint64_t rng = g_seed + 1;
    mj_layer_t L = random_layer(H0, I0, EL, K0, g_seed);
    if (!L) return;
    for (unsigned f = 0; f < 4; f++) {
        const unsigned flags = (f & 1 ? MJ_ADOPT_UP_FIRST : 0) | (f & 2 ? MJ_ADOPT_SCALES_SWIZZLED : 0);
        engine g;
        engine_make(L, EL, flags, &g);
        snapshot s;
        snap(&g, &s);
        mj_experts_t ex = adopt(&g, 8);
        if (ex) {
            mj_adopt_info info = MJ_ADOPT_INFO_INIT;
            CHECK_OK(mj_experts_adopt_info(ex, &info));
            CHECK(info.adopted && info.in_place && info.scales_in_place, "flags 0x%x: in place, scales too", flags);
            /* (w2's linear scales at I = 256 are their own packing: 16 rows of 16 bytes a tile) */
            CHECK(!unchanged_in(&g, &s, 0, 1) && !unchanged_in(&g, &s, 1, 2) && !unchanged_in(&g, &s, 2, 3),
                  "flags 0x%x: in place, the engine's w13, its scales and w2 hold the packed layout", flags);
            CHECK(unchanged_in(&g, &s, 4, 8), "flags 0x%x: the scalar tensors are only read", flags);
            for (int m = 0; m < 2; m++) {
                topk r;
                topk_make(m ? 5 : 7, m ? 5 : 6, K0, EL, 0, &rng, &r);
                char what[64];
                snprintf(what, sizeof what, "flags 0x%x %s", flags, m ? "w4a4" : "w4a16");
                check_forward(what, ex, L, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, &r, &rng);
                topk_free(&r);
            }
            CHECK_OK(mj_experts_release(ex));
            CHECK(unchanged(&g, &s, 8), "flags 0x%x: released, the engine's bytes are back exactly", flags);
            CHECK_OK(mj_experts_adopt_info(ex, &info));
            CHECK(info.released == 1, "released");
        }
        mj_experts_free(ex);
        snap_free(&s);
        engine_free(&g);
    }
    mj_layer_free(L);
}

/* EP: rank 1 of 2 holds experts 8..15; input scales of all 16 with its rows at 8, the
 * scalars as reciprocals (CompressedTensors), w2's input scale one for every expert. */
static void case_ep(void) {
    uint64_t rng = g_seed + 2;
    mj_layer_t full = random_layer(H0, I0, 2 * EL, K0, g_seed + 20), L = NULL;
    if (!full) return;
    /* Powers of two, whose reciprocals are exact: the bits can match mj_experts_create's. */
    for (int e = 0; e < 2 * EL; e++) {
        mj_nvfp4_linear *l[2] = {&full->w13[e], &full->w2[e]};
        for (int i = 0; i < 2; i++) {
            l[i]->weight_scale_2 = exp2f(roundf(log2f(l[i]->weight_scale_2)));
            l[i]->input_scale = exp2f(roundf(log2f(l[i]->input_scale)));
        }
        full->w2[e].input_scale = 0.0078125f; /* one for every expert */
    }
    CHECK_OK(mj_layer_shard(full, MJ_PAR_EP, 1, 2, &L));
    if (L) {
        engine g;
        engine_make(L, 2 * EL, MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2 | MJ_ADOPT_RECIPROCAL_INPUT_SCALE, &g);
        float one = 128.0f; /* 1 / 0.0078125 */
        g.t.w2_input_scale = (mj_adopt_scale){&one, 1, 1};
        mj_experts_t ex = adopt(&g, 8);
        if (ex) {
            topk r;
            topk_make(8, 6, K0, EL, EL, &rng, &r);
            check_forward("EP rank 1, reciprocals", ex, L, MJ_MODE_W4A16, &r, &rng);
            topk_free(&r);
        }
        mj_experts_free(ex);
        /* The same with the wrong offset reads rank 0's input scales (1e-3 here): W4A4's
         * quantization of x goes wrong, which the reference check must see. */
        g.t.expert_begin = 0;
        mj_experts_t bad = adopt(&g, 8);
        if (bad) {
            topk r;
            topk_make(4, 4, K0, EL, EL, &rng, &r);
            uint16_t *h = malloc(2 * 4 * H0);
            float *o = malloc(4 * 4 * H0), *w = malloc(4 * 4 * H0);
            test_random_hidden(h, 4 * H0, &rng);
            CHECK_OK(mj_experts_forward_topk(g_ctx, bad, MJ_MODE_W4A4, h, 4, r.ids, r.w, NULL, o, MJ_OUT_F32, NULL));
            CHECK_OK(mj_experts_ref(L, MJ_MODE_W4A4, h, 4, 4, r.ids_c, r.w_c, r.nsel, w));
            CHECK(test_rel_l2(o, w, 4 * H0) > 0.1, "expert_begin matters: the wrong rows of input scales give "
                  "another output (relative L2 %.3g)", test_rel_l2(o, w, 4 * H0));
            free(h), free(o), free(w);
            topk_free(&r);
        }
        mj_experts_free(bad);
        engine_free(&g);
    }
    mj_layer_free(L);
    mj_layer_free(full);
}

/* Gate and up with different weight_scale_2: the up half's block scales halved and its
 * weight_scale_2 doubled holds the same weights; adopted, the output is the layer's. */
static void case_gate_up_scales(void) {
    uint64_t rng = g_seed + 3;
    mj_layer_t L = random_layer(H0, I0, EL, K0, g_seed + 30);
    if (!L) return;
    engine g;
    engine_make(L, EL, 0, &g);
    const int64_t shalf = (int64_t)I0 * H0 / 16;
    int exact = 1;
    for (int x = 0; x < EL; x++) {
        uint8_t *up = g.s13 + x * g.b_s13 + shalf;
        for (int64_t i = 0; i < shalf; i++) {
            float v = mj_e4m3_decode(up[i]) * 0.5f;
            up[i] = mj_e4m3_encode(v);
            exact &= mj_e4m3_decode(up[i]) == v;
        }
        g.ws13[2 * x + 1] *= 2.0f;
    }
    mj_experts_t ex = adopt(&g, 8);
    if (ex && exact) {
        topk r;
        topk_make(6, 6, K0, EL, 0, &rng, &r);
        check_forward("gate/up weight_scale_2 2x apart", ex, L, MJ_MODE_W4A16, &r, &rng);
        topk_free(&r);
    }
    CHECK(exact, "the test's halving is exact in e4m3 for seed %llu", (unsigned long long)g_seed);
    mj_experts_free(ex);
    engine_free(&g);
    mj_layer_free(L);
}

/* In place the handle allocates its workspace and nothing like the weights (measured at
 * mj_mem_alloc); copy mode allocates the packed weights and leaves the engine's bytes alone;
 * sizes off the 256 grid keep the codes in place and pack the scales apart. */
static void case_memory(void) {
    uint64_t rng = g_seed + 4;
    struct { int H, I; unsigned flags; int scales_in_place; } v[] = {
        {H0, I0, 0, 1}, {H0, I0, MJ_ADOPT_COPY, 0}, {320, 192, MJ_ADOPT_SCALES_SWIZZLED, 0}};
    for (int c = 0; c < 3; c++) {
        mj_layer_t L = random_layer(v[c].H, v[c].I, EL, K0, g_seed + 40 + (uint64_t)c);
        if (!L) continue;
        engine g;
        engine_make(L, EL, v[c].flags, &g);
        snapshot s;
        snap(&g, &s);
        const long long before = mj_mem_bytes();
        mj_experts_t ex = adopt(&g, 8);
        const long long grew = mj_mem_bytes() - before;
        if (ex) {
            mj_adopt_info info = MJ_ADOPT_INFO_INIT;
            CHECK_OK(mj_experts_adopt_info(ex, &info));
            const int64_t codes = (int64_t)EL * (g.b_w13 + g.b_w2);
            CHECK(grew == info.bytes_allocated, "case %d: measured %lld bytes allocated, info says %lld", c, grew,
                  (long long)info.bytes_allocated);
            CHECK(info.scales_in_place == v[c].scales_in_place, "case %d: scales in place %d", c, info.scales_in_place);
            mj_experts_view vw;
            mj_experts_view_get(ex, &vw);
            if (v[c].flags & MJ_ADOPT_COPY) {
                CHECK(!info.in_place && grew >= info.bytes_weights, "copy: its own weights (%lld >= %lld)", grew,
                      (long long)info.bytes_weights);
                CHECK(unchanged(&g, &s, 8), "copy mode: the engine's tensors are only read");
            } else {
                CHECK(info.in_place && vw.w13 == g.w13 && vw.w2 == g.w2, "in place: the kernels read the engine's "
                      "codes where they are");
                /* the workspace alone: the activations between the GEMMs and up's STREAM piece
                 * sums (here 2 pieces x 32 rows x 16 tiles x 128 bytes), not a copy of the codes */
                CHECK(grew < codes / 2, "in place: %lld bytes allocated, no second copy of the %lld bytes of codes",
                      grew, (long long)codes);
                const int64_t scales = (int64_t)EL * (vw.bytes_s13 + vw.bytes_s2);
                if (!v[c].scales_in_place)
                    CHECK(grew >= scales && vw.s13 != g.s13, "scales off the grid packed apart (%lld bytes)",
                          (long long)scales);
                else CHECK(vw.s13 == g.s13 && vw.s2 == g.s2, "scales in place");
            }
            topk r;
            topk_make(6, 5, K0, EL, 0, &rng, &r);
            char what[48];
            snprintf(what, sizeof what, "memory case %d", c);
            check_forward(what, ex, L, MJ_MODE_W4A16, &r, &rng);
            topk_free(&r);
            CHECK_OK(mj_experts_release(ex));
            CHECK(unchanged(&g, &s, 8), "case %d: after release the engine's bytes are as loaded", c);
        }
        mj_experts_free(ex);
        snap_free(&s);
        engine_free(&g);
        mj_layer_free(L);
    }
}

/* The engine reloads new weights into the same storage: readopt packs them; one that did not
 * reload is refused; after a release forwards are refused until a readopt. Copy mode reads the
 * new tensors wherever they are. */
static void case_readopt(void) {
    uint64_t rng = g_seed + 5;
    mj_layer_t L1 = random_layer(H0, I0, EL, K0, g_seed + 50), L2 = random_layer(H0, I0, EL, K0, g_seed + 51);
    if (!L1 || !L2) return;
    engine g, g2;
    engine_make(L1, EL, MJ_ADOPT_SCALES_SWIZZLED, &g);
    engine_make(L2, EL, MJ_ADOPT_SCALES_SWIZZLED, &g2);
    mj_experts_t ex = adopt(&g, 8);
    if (ex) {
        CHECK_STATUS(mj_experts_readopt(ex, &g.t), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "still hold") != NULL, "no reload: %s", mj_last_error());
        /* the reload: L2's bytes into the same tensors, its scalars too */
        memcpy(g.w13, g2.w13, (size_t)(EL * g.b_w13)), memcpy(g.s13, g2.s13, (size_t)(EL * g.b_s13));
        memcpy(g.w2, g2.w2, (size_t)(EL * g.b_w2)), memcpy(g.s2, g2.s2, (size_t)(EL * g.b_s2));
        memcpy(g.ws13, g2.ws13, 8 * EL), memcpy(g.ws2, g2.ws2, 4 * EL);
        memcpy(g.in13, g2.in13, 8 * EL), memcpy(g.in2, g2.in2, 4 * EL);
        CHECK_OK(mj_experts_readopt(ex, &g.t));
        topk r;
        topk_make(7, 7, K0, EL, 0, &rng, &r);
        check_forward("after a reload", ex, L2, MJ_MODE_W4A16, &r, &rng);
        CHECK_OK(mj_experts_release(ex));
        uint16_t h[H0] = {0};
        float o[H0];
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 1, r.ids, r.w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "given back") != NULL, "released: %s", mj_last_error());
        CHECK_OK(mj_experts_readopt(ex, &g.t)); /* given back, then packed again */
        check_forward("released and readopted", ex, L2, MJ_MODE_W4A16, &r, &rng);
        topk_free(&r);
    }
    mj_experts_free(ex);
    engine g3;
    engine_make(L1, EL, MJ_ADOPT_COPY, &g3);
    mj_experts_t cp = adopt(&g3, 8);
    if (cp) {
        engine g4;
        engine_make(L2, EL, MJ_ADOPT_COPY, &g4); /* new storage */
        CHECK_OK(mj_experts_readopt(cp, &g4.t));
        topk r;
        topk_make(5, 5, K0, EL, 0, &rng, &r);
        check_forward("copy mode, new storage", cp, L2, MJ_MODE_W4A16, &r, &rng);
        topk_free(&r);
        engine_free(&g4);
    }
    mj_experts_free(cp);
    engine_free(&g3);
    engine_free(&g2);
    engine_free(&g);
    mj_layer_free(L1);
    mj_layer_free(L2);
}

/* Every refusal names the problem and leaves the engine's tensors as they were. */
static void case_refusals(void) {
    mj_layer_t L = random_layer(H0, I0, EL, K0, g_seed + 60);
    if (!L) return;
    engine g;
    engine_make(L, EL, MJ_ADOPT_SCALES_SWIZZLED, &g);
    snapshot s;
    snap(&g, &s);
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = 8;
    float nan_ = NAN, neg = -1.0f;
    const int64_t last13 = (EL - 1) * g.b_s13 + 5, last2 = (EL - 1) * g.b_s2 + 3;
    for (int c = 0; c < 15; c++) {
        mj_adopt_tensors t = g.t;
        mj_status want = MJ_ERR_INVALID_ARG;
        const char *says = "";
        uint8_t keep13 = g.s13[last13], keep2 = g.s2[last2];
        float keep_ws = g.ws2[EL - 1], keep_in = g.in13[2 * (EL - 1) + 1];
        switch (c) {
        case 0: t.w2_weight = NULL, says = "w2_weight is NULL"; break;
        case 1: t.w13_weight = g.w13 + 8, says = "16-byte aligned"; break;
        case 2: t.flags |= 1u << 9, says = "unknown flags"; break;
        case 3: t.hidden = 200, want = MJ_ERR_UNSUPPORTED, says = "multiple of 64"; break;
        case 4: t.topk = 17, want = MJ_ERR_UNSUPPORTED, says = "top-k 17"; break;
        case 5: t.w13_weight_scale_2.rows = 3, says = "w13_weight_scale_2 has 3 rows"; break;
        case 6: t.w2_weight_scale_2.cols = 2, says = "w2_weight_scale_2 has 2 columns"; break;
        case 7: t.expert_begin = 1, says = "at least expert_begin + n_experts"; break;
        case 8: g.s13[last13] = 0x7F, want = MJ_ERR_NONFINITE, says = "NaN"; break;
        case 9: g.s2[last2] = 0x81, says = "negative"; break;
        case 10: g.ws2[EL - 1] = neg, says = "positive and finite"; break;
        case 11: g.in13[2 * (EL - 1) + 1] = nan_, want = MJ_ERR_NONFINITE, says = "w13_input_scale"; break;
        case 12: t.n_experts = 0, says = "n_experts 0"; break;
        case 13: t.struct_size = 12, says = "MJ_ADOPT_TENSORS_INIT"; break;
        case 14: t.w13_input_scale.data = NULL, says = "w13_input_scale is NULL"; break;
        }
        mj_experts_t ex = (mj_experts_t)&g; /* must come back NULL */
        CHECK_STATUS(mj_experts_adopt(g_ctx, &t, &eo, &ex), want);
        CHECK(strstr(mj_last_error(), says) != NULL, "case %d: '%s' in: %s", c, says, mj_last_error());
        CHECK(ex == NULL, "case %d: no handle", c);
        g.s13[last13] = keep13, g.s2[last2] = keep2, g.ws2[EL - 1] = keep_ws, g.in13[2 * (EL - 1) + 1] = keep_in;
        CHECK(unchanged(&g, &s, 8), "case %d: refused, the engine's tensors are untouched", c);
    }
    eo.max_batch = 0;
    mj_experts_t ex = NULL;
    CHECK_STATUS(mj_experts_adopt(g_ctx, &g.t, &eo, &ex), MJ_ERR_INVALID_ARG);
    CHECK(unchanged(&g, &s, 8), "max_batch 0 refused, nothing changed");

    /* the forward's refusals */
    ex = adopt(&g, 4);
    if (ex) {
        uint16_t h[2 * H0] = {0};
        float o[2 * H0], w[2 * K0] = {1, 1, 1, 1, 1, 1, 1, 1};
        int32_t ids[2 * K0] = {0, 1, -1, 2, 3, EL, -1, -1};
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 2, ids, w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "topk_ids[1, 1] = 8") != NULL, "an id past the local experts: %s",
              mj_last_error());
        ids[5] = -2;
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 2, ids, w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        ids[5] = 1;
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 5, ids, w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "0..4 tokens") != NULL, "B past max_batch: %s", mj_last_error());
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 2, ids, w, NULL, o, (mj_out_type)7, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 2, NULL, w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK_OK(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, 0, NULL, NULL, NULL, NULL, MJ_OUT_F32, NULL));
        mj_adopt_tensors t = g.t;
        t.intermediate = 128;
        CHECK_STATUS(mj_experts_readopt(ex, &t), MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "differ") != NULL, "readopt of another shape: %s", mj_last_error());
    }
    mj_experts_free(ex);
    /* a handle mj_experts_create made has no engine to adopt from */
    mj_experts_t made = NULL;
    CHECK_OK(mj_experts_create(g_ctx, L, NULL, &made));
    if (made) {
        float o[H0];
        uint16_t h[H0] = {0};
        int32_t ids[K0] = {0, -1, -1, -1};
        float w[K0] = {1, 0, 0, 0};
        CHECK_STATUS(mj_experts_forward_topk(g_ctx, made, MJ_MODE_W4A16, h, 1, ids, w, NULL, o, MJ_OUT_F32, NULL),
                     MJ_ERR_INVALID_ARG);
        CHECK(strstr(mj_last_error(), "mj_experts_create") != NULL, "not adopted: %s", mj_last_error());
        CHECK_STATUS(mj_experts_release(made), MJ_ERR_INVALID_ARG);
        mj_adopt_info info = MJ_ADOPT_INFO_INIT;
        CHECK_OK(mj_experts_adopt_info(made, &info));
        CHECK(info.adopted == 0, "not adopted");
    }
    mj_experts_free(made);
    snap_free(&s);
    engine_free(&g);
    mj_layer_free(L);
}

/* After prepare, forwards of every batch size up to the workspace's allocate nothing and
 * compile nothing (what a CUDA graph capture needs). */
static void case_prepared(void) {
    uint64_t rng = g_seed + 7;
    mj_layer_t L = random_layer(H0, I0, EL, K0, g_seed + 70);
    if (!L) return;
    engine g;
    engine_make(L, EL, 0, &g);
    mj_experts_t ex = adopt(&g, 8);
    if (ex) {
        CHECK_OK(mj_experts_prepare(g_ctx, ex, MJ_MODE_W4A16, 8));
        mj_jit_stats a, b;
        CHECK_OK(mj_context_stats(g_ctx, &a));
        const long long allocs = mj_mem_allocs();
        uint16_t *h = malloc(2 * 8 * H0);
        float *o = malloc(4 * 8 * H0);
        test_random_hidden(h, 8 * H0, &rng);
        for (int B = 1; B <= 8; B++) {
            topk r;
            topk_make(B, B, K0, EL, 0, &rng, &r);
            CHECK_OK(mj_experts_forward_topk(g_ctx, ex, MJ_MODE_W4A16, h, B, r.ids, r.w, NULL, o, MJ_OUT_F32, NULL));
            topk_free(&r);
        }
        CHECK_OK(mj_context_stats(g_ctx, &b));
        CHECK(mj_mem_allocs() == allocs, "prepared forwards allocated %lld times", mj_mem_allocs() - allocs);
        CHECK(b.compiles == a.compiles && b.mem_misses == a.mem_misses, "prepared forwards compiled %lld, missed %lld",
              (long long)(b.compiles - a.compiles), (long long)(b.mem_misses - a.mem_misses));
        free(h), free(o);
    }
    mj_experts_free(ex);
    engine_free(&g);
    mj_layer_free(L);
}

/* On sm_90a (no FP4 MMA) the packed code words are bit-placed for W4A16 (runtime/weights/
 * pack.c): adopted in place, the engine's w13 and w2 hold placed words, the forward is the
 * created handle's bit for bit and near the reference, and release gives the engine's bytes
 * back exactly (the placement undone). */
static void case_placed(void) {
    uint64_t rng = g_seed + 9;
    mj_context_t c90 = test_new_context(g_cache, MJ_BACKEND_SIM, "sm_90a", 0), keep = g_ctx;
    mj_layer_t L = random_layer(H0, I0, EL, K0, g_seed + 90);
    if (!c90 || !L) {
        mj_context_destroy(c90), mj_layer_free(L);
        return;
    }
    g_ctx = c90; /* check_forward's and forward_created's context */
    engine g;
    engine_make(L, EL, MJ_ADOPT_SCALES_SWIZZLED | MJ_ADOPT_UP_FIRST, &g);
    snapshot s;
    snap(&g, &s);
    mj_experts_t ex = adopt(&g, 8);
    if (ex) {
        mj_experts_view v;
        mj_experts_view_get(ex, &v);
        CHECK(v.placed == 1, "sm_90a: the code words are bit-placed");
        /* expert 0's w2, tile 0, step 0, lane 0, word a0: row 0, natural bytes 0..3 (w2 is
         * [E, H, I/2] in the engine, packed in place) */
        uint32_t nat, got;
        memcpy(&nat, s.b[2], 4), memcpy(&got, g.w2, 4);
        CHECK(got == mj_pack_place_word(nat), "the engine's w2 word 0 holds the placed codes: 0x%08X, want 0x%08X",
              got, mj_pack_place_word(nat));
        for (int B = 1; B <= 8; B += 7) {
            topk r;
            topk_make(B, B, K0, EL, 0, &rng, &r);
            char what[64];
            snprintf(what, sizeof what, "sm_90a placed, B %d", B);
            check_forward(what, ex, L, MJ_MODE_W4A16, &r, &rng);
            topk_free(&r);
        }
        CHECK_OK(mj_experts_release(ex));
        CHECK(unchanged(&g, &s, 8), "sm_90a: released, the engine's bytes are back exactly");
    }
    mj_experts_free(ex);
    g_ctx = keep;
    snap_free(&s);
    engine_free(&g);
    mj_layer_free(L);
    mj_context_destroy(c90);
}

static int setup(void) {
    g_seed = test_seed(2027);
    g_cache = test_shared_cache();
    g_ctx = test_new_context(g_cache, MJ_BACKEND_SIM, "sm_120a", 0);
    return g_ctx ? 0 : test_finish();
}

static void teardown(void) { mj_context_destroy(g_ctx); }

static const test_case cases[] = {
    TEST_CASE("layouts", case_layouts),
    TEST_CASE("ep", case_ep),
    TEST_CASE("gate_up_scales", case_gate_up_scales),
    TEST_CASE("memory", case_memory),
    TEST_CASE("readopt", case_readopt),
    TEST_CASE("refusals", case_refusals),
    TEST_CASE("prepared", case_prepared),
    TEST_CASE("placed", case_placed),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
