/* adopt.c — experts made from the tensors a serving engine already holds (SGLang's and vLLM's
 * ModelOpt NVFP4 MoE layers), and their forward on the engine's own top-k.
 *
 * An engine keeps each expert as ModelOpt wrote it: codes [rows, K/2] and block scales
 * [rows, K/16], for w13 ([gate; up] or [up; gate]) and w2, the scales linear or swizzled
 * into CUTLASS's 128x4 layout. Adopting repacks every expert, one at a time through a host
 * buffer, into the layout the expert kernels stream (runtime/weights/pack.c, the same code
 * mj_experts_create uses) and, in place, writes it back where the engine's bytes were: the
 * packed codes take exactly their bytes; the packed block scales too when H and I are
 * multiples of 256 (runs of 4 k-steps), else they go into a buffer of the handle's own.
 *
 *   adopt:    check everything (shapes, flags, pointers, every scalar, every block scale)
 *             -> allocate what the handle owns -> pack expert 0, 1, ... in place
 *             (an error midway unpacks the experts done, so the engine gets its bytes back)
 *   forward:  the engine's topk_ids -> the route kernel's dispatch alone (grouped by expert,
 *             into the handle's workspace) -> mj_experts_forward with the engine's weights
 *   release:  unpack every expert back into the engine's layout
 *
 * The engine's ids are local (0..E_loc-1, -1 for none), so the handle's experts are
 * 0..E_loc-1 with expert_begin 0; the input scales alone are indexed from expert_begin.
 */
#include "experts.h"
#include "mem.h"
#include "plan.h"
#include "ref/ref.h"
#include "weights/pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FINGERPRINT 64 /* bytes of each sample that tells packed buffers from reloaded ones */

struct mj_adoption {
    mj_adopt_tensors t;          /* as adopted: pointers, shapes, flags                     */
    int device;
    int32_t E_d;                 /* experts of the dispatch kernel (E_loc, at least 8 and k) */
    int in_place, s13_in_place, s2_in_place, released;
    int placed;                  /* the codes bit-placed for W4A16 (mj_experts_view.placed)  */
    int64_t bytes_allocated;     /* the dispatch metadata's; the handle adds its own        */
    int32_t *counts, *offsets, *active, *n_active, *perm, *row_index; /* the dispatch's    */
    uint8_t fp[2][FINGERPRINT];  /* expert 0's packed w13 and w2, as written                */
};

/* ---- the engine's layout ---------------------------------------------------------------- */

static int64_t rup(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Bytes of one expert's block scales of an M x K (K in 16-element groups) matrix, as the
 * engine holds them. */
static int64_t scale_bytes(int64_t M, int64_t K, int swizzled) { return swizzled ? rup(M, 128) * rup(K, 4) : M * K; }

/* The byte of (m, k) in the 128x4 layout of a matrix of K (padded to Kp) groups. */
static int64_t swz_off(int64_t m, int64_t k, int64_t Kp) {
    return ((m / 128) * (Kp / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + k % 4;
}

/* Swizzled <-> linear, one expert; to swizzled writes zeros in the padding. */
static void swizzle(uint8_t *lin, uint8_t *swz, int64_t M, int64_t K, int to_linear) {
    const int64_t Kp = rup(K, 4);
    if (!to_linear) memset(swz, 0, (size_t)scale_bytes(M, K, 1));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            if (to_linear) lin[m * K + k] = swz[swz_off(m, k, Kp)];
            else swz[swz_off(m, k, Kp)] = lin[m * K + k];
        }
}

/* Swap the first and second halves of rows of a [2n, row] matrix ([up; gate] <-> [gate; up]). */
static void swap_halves(uint8_t *a, int64_t n_rows, int64_t row, uint8_t *tmp) {
    const size_t half = (size_t)(n_rows / 2 * row);
    memcpy(tmp, a, half);
    memmove(a, a + half, half);
    memcpy(a + half, tmp, half);
}

/* ---- one expert through the host --------------------------------------------------------- */

/* The host buffers of one expert: natural (linear scales, [gate; up]), raw scale bytes as the
 * engine holds them, and packed. */
typedef struct stage {
    uint8_t *w13, *s13, *w2, *s2;         /* natural                                   */
    uint8_t *raw13, *raw2, *tmp;          /* engine's scale bytes; a half for swaps    */
    uint8_t *p13, *q13, *p2, *q2;         /* packed                                    */
    uint8_t *mem;
} stage;

typedef struct dims {
    int64_t H, I, E;
    int64_t w13, s13, w2, s2;             /* engine bytes of one expert                */
    int64_t pw13, ps13, pw2, ps2;         /* packed bytes of one expert                */
    int swz, up_first;
} dims;

static void dims_of(const mj_adopt_tensors *t, dims *d) {
    d->H = t->hidden, d->I = t->intermediate, d->E = t->n_experts;
    d->swz = (t->flags & MJ_ADOPT_SCALES_SWIZZLED) != 0, d->up_first = (t->flags & MJ_ADOPT_UP_FIRST) != 0;
    d->w13 = 2 * d->I * d->H / 2, d->w2 = d->H * d->I / 2;
    d->s13 = scale_bytes(2 * d->I, d->H / 16, d->swz), d->s2 = scale_bytes(d->H, d->I / 16, d->swz);
    d->pw13 = mj_pack_w13_bytes((int32_t)d->H, (int32_t)d->I), d->ps13 = mj_pack_s13_bytes((int32_t)d->H, (int32_t)d->I);
    d->pw2 = mj_pack_w2_bytes((int32_t)d->H, (int32_t)d->I), d->ps2 = mj_pack_s2_bytes((int32_t)d->H, (int32_t)d->I);
}

static mj_status stage_alloc(const dims *d, stage *s) {
    const int64_t nat = d->w13 + 2 * d->I * d->H / 16 + d->w2 + d->H * d->I / 16;
    const int64_t tmp = d->w13 / 2 > d->s13 ? d->w13 / 2 : d->s13;
    const int64_t total = nat + d->s13 + d->s2 + tmp + d->pw13 + d->ps13 + d->pw2 + d->ps2;
    memset(s, 0, sizeof *s);
    s->mem = malloc((size_t)total);
    if (!s->mem)
        return mj_set_error(MJ_ERR_NOMEM, "mj_experts_adopt: out of host memory (%lld bytes for one expert)",
                            (long long)total);
    uint8_t *p = s->mem;
    s->w13 = p, p += d->w13;
    s->s13 = p, p += 2 * d->I * d->H / 16;
    s->w2 = p, p += d->w2;
    s->s2 = p, p += d->H * d->I / 16;
    s->raw13 = p, p += d->s13;
    s->raw2 = p, p += d->s2;
    s->tmp = p, p += tmp;
    s->p13 = p, p += d->pw13;
    s->q13 = p, p += d->ps13;
    s->p2 = p, p += d->pw2;
    s->q2 = p;
    return MJ_OK;
}

/* Expert x's block scales from the engine into s->s13 / s->s2 (linear, the engine's row order). */
static mj_status read_scales(int device, const mj_adopt_tensors *t, const dims *d, int64_t x, stage *s) {
    MJ_CHECK(mj_mem_get(device, s->raw13, t->w13_weight_scale + x * d->s13, (size_t)d->s13));
    MJ_CHECK(mj_mem_get(device, s->raw2, t->w2_weight_scale + x * d->s2, (size_t)d->s2));
    if (d->swz) {
        swizzle(s->s13, s->raw13, 2 * d->I, d->H / 16, 1);
        swizzle(s->s2, s->raw2, d->H, d->I / 16, 1);
    } else {
        memcpy(s->s13, s->raw13, (size_t)d->s13);
        memcpy(s->s2, s->raw2, (size_t)d->s2);
    }
    return MJ_OK;
}

/* NaN or negative block scales are refused (as the checkpoint loader refuses them). */
static mj_status check_scales(const uint8_t *sf, int64_t rows, int64_t k16, const char *name, int64_t x) {
    const int64_t i = mj_nvfp4_scale_bad(sf, rows * k16);
    if (i < 0) return MJ_OK;
    const uint8_t b = sf[i];
    return mj_set_error((b & 0x7F) == 0x7F ? MJ_ERR_NONFINITE : MJ_ERR_INVALID_ARG,
                        "mj_experts_adopt: %s of local expert %lld: block scale [%lld, %lld] is %s (e4m3 0x%02X); "
                        "NVFP4 block scales are finite and unsigned. Nothing was changed",
                        name, (long long)x, (long long)(i / k16), (long long)(i % k16),
                        (b & 0x7F) == 0x7F ? "NaN" : "negative", b);
}

/* ---- the per-tensor scales ---------------------------------------------------------------- */

/* What an expert's scalars are, read once from the engine's tensors. */
typedef struct scalars {
    float *ws13_g, *ws13_u, *ws2, *in13, *in2; /* [E_loc] each                               */
    float *mem;
} scalars;

static mj_status scale_desc_check(const char *name, const mj_adopt_scale *s, int32_t rows_per_expert_min,
                                  int32_t max_cols, int input) {
    if (!s->data) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_adopt: %s is NULL", name);
    if (s->cols < 1 || s->cols > max_cols)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_adopt: %s has %d columns; it takes 1%s", name, s->cols,
                            max_cols == 2 ? " or 2 (gate and up)" : "");
    if (s->rows != 1 && s->rows < rows_per_expert_min)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_experts_adopt: %s has %d rows; it takes 1 (one for every expert) or %s%d", name,
                            s->rows, input ? "at least expert_begin + n_experts = " : "n_experts = ",
                            rows_per_expert_min);
    if (!input && s->rows != 1 && s->rows != rows_per_expert_min)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_adopt: %s has %d rows; it takes 1 or n_experts = %d",
                            name, s->rows, rows_per_expert_min);
    return MJ_OK;
}

/* The whole tensor to the host, then value v of local expert x, column c. */
static mj_status scale_read(int device, const mj_adopt_scale *s, float **host) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    *host = malloc(n * sizeof(float));
    if (!*host) return mj_set_error(MJ_ERR_NOMEM, "mj_experts_adopt: out of host memory");
    mj_status st = mj_mem_get(device, *host, s->data, n * sizeof(float));
    if (st != MJ_OK) free(*host), *host = NULL;
    return st;
}

static mj_status scalar_ok(const char *name, float v, int64_t x, int recip, float *out) {
    float u = recip ? 1.0f / v : v;
    if (!(u > 0.0f) || !isfinite(u) || !isfinite(v))
        return mj_set_error(isfinite(v) ? MJ_ERR_INVALID_ARG : MJ_ERR_NONFINITE,
                            "mj_experts_adopt: %s of local expert %lld is %g%s; a scale must be positive and finite "
                            "(%s). Nothing was changed",
                            name, (long long)x, (double)v, recip ? " (held as its reciprocal)" : "",
                            recip ? "without MJ_ADOPT_RECIPROCAL_* it is read as the scale itself"
                                  : "a CompressedTensors *_global_scale is its reciprocal: MJ_ADOPT_RECIPROCAL_*");
    *out = u;
    return MJ_OK;
}

static mj_status scalars_read(int device, const mj_adopt_tensors *t, scalars *sc) {
    const int64_t E = t->n_experts;
    const int rw = (t->flags & MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2) != 0;
    const int ri = (t->flags & MJ_ADOPT_RECIPROCAL_INPUT_SCALE) != 0;
    const mj_adopt_scale *d[4] = {&t->w13_weight_scale_2, &t->w2_weight_scale_2, &t->w13_input_scale,
                                  &t->w2_input_scale};
    const char *names[4] = {"w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"};
    float *h[4] = {NULL, NULL, NULL, NULL};
    mj_status st = MJ_OK;
    memset(sc, 0, sizeof *sc);
    sc->mem = malloc((size_t)(5 * E) * sizeof(float));
    if (!sc->mem) return mj_set_error(MJ_ERR_NOMEM, "mj_experts_adopt: out of host memory");
    sc->ws13_g = sc->mem, sc->ws13_u = sc->mem + E, sc->ws2 = sc->mem + 2 * E, sc->in13 = sc->mem + 3 * E;
    sc->in2 = sc->mem + 4 * E;
    for (int i = 0; i < 4; i++) MJ_CHECK_GOTO(scale_read(device, d[i], &h[i]), st, done);
    for (int64_t x = 0; x < E; x++) {
        /* rows 1: every expert's; weight scales row x; input scales row expert_begin + x */
        for (int i = 0; i < 4; i++) {
            const int64_t row = d[i]->rows == 1 ? 0 : i < 2 ? x : t->expert_begin + x;
            const float *v = h[i] + row * d[i]->cols;
            const int recip = i < 2 ? rw : ri;
            float a, b;
            MJ_CHECK_GOTO(scalar_ok(names[i], v[0], x, recip, &a), st, done);
            b = a;
            if (d[i]->cols == 2) MJ_CHECK_GOTO(scalar_ok(names[i], v[1], x, recip, &b), st, done);
            if (i == 0) sc->ws13_g[x] = a, sc->ws13_u[x] = b;
            if (i == 1) sc->ws2[x] = a;
            if (i == 2) sc->in13[x] = a > b ? a : b; /* one quantization of x serves both */
            if (i == 3) sc->in2[x] = a;
        }
    }
done:
    for (int i = 0; i < 4; i++) free(h[i]);
    if (st != MJ_OK) free(sc->mem), sc->mem = NULL;
    return st;
}

/* ---- packing and unpacking one expert ------------------------------------------------------ */

/* Where expert x's packed parts go: the engine's tensors (in place) or the handle's own. */
typedef struct dest {
    uint8_t *w13, *s13, *w2, *s2;
} dest;

static dest dest_of(mj_experts_t ex) {
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    return (dest){v.w13, v.s13, v.w2, v.s2};
}

/* Read expert x in the engine's layout, pack it, write it to dst; its scalars into scal. */
static mj_status pack_one(int device, const mj_adopt_tensors *t, const dims *d, const scalars *sc, const dest *dst,
                          int placed, int64_t x, stage *s, float *scal) {
    MJ_CHECK(mj_mem_get(device, s->w13, t->w13_weight + x * d->w13, (size_t)d->w13));
    MJ_CHECK(mj_mem_get(device, s->w2, t->w2_weight + x * d->w2, (size_t)d->w2));
    MJ_CHECK(read_scales(device, t, d, x, s));
    const int64_t half_scales = d->I * (d->H / 16);
    uint8_t *gate_sf = s->s13 + (d->up_first ? half_scales : 0), *up_sf = s->s13 + (d->up_first ? 0 : half_scales);
    float g = sc->ws13_g[x], u = sc->ws13_u[x];
    if (g != u) { /* one weight_scale_2 for w13: the larger; the other half's scales re-rounded */
        if (g < u) mj_nvfp4_scales_reexpress(gate_sf, half_scales, g / u);
        else mj_nvfp4_scales_reexpress(up_sf, half_scales, u / g);
    }
    const float ws13 = g > u ? g : u;
    mj_nvfp4_linear w13 = {(int32_t)(2 * d->I), (int32_t)d->H, s->w13, s->s13, ws13, sc->in13[x]};
    mj_nvfp4_linear w2 = {(int32_t)d->H, (int32_t)d->I, s->w2, s->s2, sc->ws2[x], sc->in2[x]};
    const int32_t I = (int32_t)d->I, gate0 = d->up_first ? I : 0, up0 = d->up_first ? 0 : I;
    MJ_CHECK(mj_pack_expert(&w13, gate0, up0, I, &w2, 0, placed, s->p13, s->q13, s->p2, s->q2));
    MJ_CHECK(mj_mem_put(device, dst->w13 + x * d->pw13, s->p13, (size_t)d->pw13));
    MJ_CHECK(mj_mem_put(device, dst->s13 + x * d->ps13, s->q13, (size_t)d->ps13));
    MJ_CHECK(mj_mem_put(device, dst->w2 + x * d->pw2, s->p2, (size_t)d->pw2));
    MJ_CHECK(mj_mem_put(device, dst->s2 + x * d->ps2, s->q2, (size_t)d->ps2));
    mj_experts_scal_fill(scal + x * MJ_EXPERTS_SCAL, ws13, sc->in13[x], sc->ws2[x], sc->in2[x]);
    return MJ_OK;
}

/* Expert x back into the engine's layout, into the engine's tensors: the parts that were
 * packed in place (codes; scales when they fitted). */
static mj_status unpack_one(int device, const mj_adoption *a, const dims *d, const dest *src, int64_t x, stage *s) {
    const mj_adopt_tensors *t = &a->t;
    MJ_CHECK(mj_mem_get(device, s->p13, src->w13 + x * d->pw13, (size_t)d->pw13));
    MJ_CHECK(mj_mem_get(device, s->q13, src->s13 + x * d->ps13, (size_t)d->ps13));
    MJ_CHECK(mj_mem_get(device, s->p2, src->w2 + x * d->pw2, (size_t)d->pw2));
    MJ_CHECK(mj_mem_get(device, s->q2, src->s2 + x * d->ps2, (size_t)d->ps2));
    mj_nvfp4_linear w13 = {(int32_t)(2 * d->I), (int32_t)d->H, s->w13, s->s13, 0.0f, 0.0f};
    mj_nvfp4_linear w2 = {(int32_t)d->H, (int32_t)d->I, s->w2, s->s2, 0.0f, 0.0f};
    MJ_CHECK(mj_unpack_expert(s->p13, s->q13, s->p2, s->q2, (int32_t)d->H, (int32_t)d->I, a->placed, &w13, &w2));
    if (d->up_first) { /* unpacked as [gate; up] */
        swap_halves(s->w13, 2 * d->I, d->H / 2, s->tmp);
        swap_halves(s->s13, 2 * d->I, d->H / 16, s->tmp);
    }
    MJ_CHECK(mj_mem_put(device, t->w13_weight + x * d->w13, s->w13, (size_t)d->w13));
    MJ_CHECK(mj_mem_put(device, t->w2_weight + x * d->w2, s->w2, (size_t)d->w2));
    if (a->s13_in_place) {
        if (d->swz) swizzle(s->s13, s->raw13, 2 * d->I, d->H / 16, 0);
        MJ_CHECK(mj_mem_put(device, t->w13_weight_scale + x * d->s13, d->swz ? s->raw13 : s->s13, (size_t)d->s13));
    }
    if (a->s2_in_place) {
        if (d->swz) swizzle(s->s2, s->raw2, d->H, d->I / 16, 0);
        MJ_CHECK(mj_mem_put(device, t->w2_weight_scale + x * d->s2, d->swz ? s->raw2 : s->s2, (size_t)d->s2));
    }
    return MJ_OK;
}

/* ---- checks ----------------------------------------------------------------------------------- */

static mj_status load_tensors(const mj_adopt_tensors *in, const char *who, mj_adopt_tensors *t) {
    const mj_adopt_tensors init = MJ_ADOPT_TENSORS_INIT;
    *t = init;
    if (!in) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL tensors", who);
    mj_status st = mj_struct_load(in, sizeof *t, sizeof *t, t, "mj_adopt_tensors", "MJ_ADOPT_TENSORS_INIT");
    return st == MJ_OK ? MJ_OK : mj_error_prefix(st, "%s", who);
}

static mj_status check_tensors(const mj_adopt_tensors *t, const char *who) {
    if (t->flags & ~MJ_ADOPT_FLAGS_ALL)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: unknown flags 0x%x (MJ_ADOPT_* are 0x%x)", who,
                            t->flags & ~MJ_ADOPT_FLAGS_ALL, MJ_ADOPT_FLAGS_ALL);
    if (t->n_experts < 1 || t->n_experts > MJ_KNOB_oea_route_E_MAX)
        return mj_set_error(t->n_experts < 1 ? MJ_ERR_INVALID_ARG : MJ_ERR_UNSUPPORTED,
                            "%s: n_experts %d; the experts held here must be 1..%d", who, t->n_experts,
                            MJ_KNOB_oea_route_E_MAX);
    if (t->hidden < 1 || t->intermediate < 1 || t->topk < 1)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: hidden %d, intermediate %d and topk %d must be positive", who,
                            t->hidden, t->intermediate, t->topk);
    if (t->expert_begin < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: expert_begin %d must not be negative", who, t->expert_begin);
    const struct { const char *name; const void *p; } ptrs[] = {
        {"w13_weight", t->w13_weight}, {"w13_weight_scale", t->w13_weight_scale},
        {"w2_weight", t->w2_weight}, {"w2_weight_scale", t->w2_weight_scale}};
    for (int i = 0; i < 4; i++) {
        if (!ptrs[i].p) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: %s is NULL", who, ptrs[i].name);
        if ((uintptr_t)ptrs[i].p % 16)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "%s: %s at %p is not 16-byte aligned (the kernels load 16 bytes at a time): pass the "
                                "tensor itself, not a view at an odd offset",
                                who, ptrs[i].name, ptrs[i].p);
    }
    const int32_t E = t->n_experts, in_rows = t->expert_begin + E;
    MJ_CHECK(scale_desc_check("w13_weight_scale_2", &t->w13_weight_scale_2, E, 2, 0));
    MJ_CHECK(scale_desc_check("w2_weight_scale_2", &t->w2_weight_scale_2, E, 1, 0));
    MJ_CHECK(scale_desc_check("w13_input_scale", &t->w13_input_scale, in_rows, 2, 1));
    MJ_CHECK(scale_desc_check("w2_input_scale", &t->w2_input_scale, in_rows, 1, 1));
    return MJ_OK;
}

/* The tensors of a readopt against the adoption's. */
static mj_status check_same(const mj_adoption *a, const mj_adopt_tensors *t) {
    const mj_adopt_tensors *o = &a->t;
    if (t->n_experts != o->n_experts || t->hidden != o->hidden || t->intermediate != o->intermediate ||
        t->topk != o->topk || t->flags != o->flags || t->expert_begin != o->expert_begin)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_experts_readopt: the tensors' shapes or flags differ from the adoption's (E %d H %d I "
                            "%d topk %d flags 0x%x, then E %d H %d I %d topk %d flags 0x%x): adopt them anew",
                            o->n_experts, o->hidden, o->intermediate, o->topk, o->flags, t->n_experts, t->hidden,
                            t->intermediate, t->topk, t->flags);
    if (a->in_place && (t->w13_weight != o->w13_weight || t->w2_weight != o->w2_weight ||
                        t->w13_weight_scale != o->w13_weight_scale || t->w2_weight_scale != o->w2_weight_scale))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_experts_readopt: an in-place adoption is packed into its own tensors; these are "
                            "other tensors (the engine reloaded into new storage?): adopt them anew");
    return MJ_OK;
}

/* Every block scale of every expert, before anything is written. */
static mj_status check_all_scales(int device, const mj_adopt_tensors *t, const dims *d, stage *s) {
    for (int64_t x = 0; x < d->E; x++) {
        MJ_CHECK(read_scales(device, t, d, x, s));
        MJ_CHECK(check_scales(s->s13, 2 * d->I, d->H / 16, "w13_weight_scale", x));
        MJ_CHECK(check_scales(s->s2, d->H, d->I / 16, "w2_weight_scale", x));
    }
    return MJ_OK;
}

static void fingerprint(int device, const dest *dst, const dims *d, uint8_t fp[2][FINGERPRINT]) {
    memset(fp, 0, 2 * FINGERPRINT);
    mj_mem_get(device, fp[0], dst->w13, (size_t)(d->pw13 < FINGERPRINT ? d->pw13 : FINGERPRINT));
    mj_mem_get(device, fp[1], dst->w2, (size_t)(d->pw2 < FINGERPRINT ? d->pw2 : FINGERPRINT));
}

/* ---- adopt, readopt, release ------------------------------------------------------------------ */

/* Pack every expert of t into the handle (its destinations set), refreshing the scalars. An
 * error midway gives the in-place experts done so far back. */
static mj_status pack_all(mj_experts_t ex, mj_adoption *a, const mj_adopt_tensors *t, const char *who) {
    const int device = a->device;
    dims d;
    dims_of(t, &d);
    stage s;
    scalars sc;
    float *scal = NULL;
    mj_status st;
    MJ_CHECK(stage_alloc(&d, &s));
    MJ_CHECK_GOTO(scalars_read(device, t, &sc), st, fail_stage);
    MJ_CHECK_GOTO(check_all_scales(device, t, &d, &s), st, fail_sc);
    scal = calloc((size_t)d.E * MJ_EXPERTS_SCAL, sizeof(float));
    if (!scal) {
        st = mj_set_error(MJ_ERR_NOMEM, "%s: out of host memory", who);
        goto fail_sc;
    }
    int mismatched = 0;
    for (int64_t x = 0; x < d.E; x++) mismatched += sc.ws13_g[x] != sc.ws13_u[x];
    const dest dst = dest_of(ex);
    int64_t x = 0;
    for (; x < d.E; x++) {
        st = pack_one(device, t, &d, &sc, &dst, a->placed, x, &s, scal);
        if (st != MJ_OK) break;
    }
    if (st == MJ_OK) {
        mj_experts_view v;
        mj_experts_view_get(ex, &v);
        st = mj_mem_put(device, v.scal, scal, (size_t)d.E * MJ_EXPERTS_SCAL * sizeof(float));
    }
    if (st != MJ_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", mj_last_error());
        if (a->in_place)
            for (int64_t y = 0; y < x; y++) unpack_one(device, a, &d, &dst, y, &s);
        st = mj_set_error(st, "%s%s", why, a->in_place ? " (the experts packed so far were given back)" : "");
        goto fail_sc;
    }
    if (mismatched)
        mj_warn("%s: w13_weight_scale_2 of gate and up differ in %d of %lld experts: the larger is used and the other "
                "half's block scales are re-rounded to e4m3 against it (lossy)",
                who, mismatched, (long long)d.E);
    if (a->in_place) fingerprint(device, &dst, &d, a->fp);
    a->t = *t;
    a->released = 0;
fail_sc:
    free(scal);
    free(sc.mem);
fail_stage:
    free(s.mem);
    /* In place, a failed pack leaves the tensors in the engine's layout (nothing was packed,
     * or what was is given back): no forward until a pack succeeds. */
    if (st != MJ_OK && a->in_place) a->released = 1;
    return st;
}

void mj_adoption_free(int device, mj_adoption *a) {
    if (!a) return;
    void *bufs[] = {a->counts, a->offsets, a->active, a->n_active, a->perm, a->row_index};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mj_mem_free(device, bufs[i]);
    free(a);
}

mj_status mj_adoption_prepare(mj_context_t ctx, mj_adoption *a) {
    mj_route_outputs none = MJ_ROUTE_OUTPUTS_INIT;
    return mj_route_dispatch(ctx, NULL, 0, a->t.topk, a->E_d, &none, NULL);
}

mj_status mj_adoption_usable(const mj_adoption *a, const char *who) {
    if (a->released)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: these experts' tensors were given back (mj_experts_release): mj_experts_readopt "
                            "them first",
                            who);
    return MJ_OK;
}

static mj_status dispatch_alloc(mj_adoption *a, int32_t mb) {
    const int64_t rows = (int64_t)mb * a->t.topk, E = a->E_d;
    int32_t **bufs[] = {&a->counts, &a->offsets, &a->active, &a->n_active, &a->perm, &a->row_index};
    const int64_t n[] = {E, E + 1, E, 1, rows, rows};
    for (int i = 0; i < 6; i++) {
        MJ_CHECK(mj_mem_alloc(a->device, (size_t)n[i] * sizeof(int32_t), "mj_experts_adopt", (void **)bufs[i]));
        a->bytes_allocated += n[i] * (int64_t)sizeof(int32_t);
    }
    return MJ_OK;
}

mj_status mj_experts_adopt(mj_context_t ctx, const mj_adopt_tensors *t_in, const mj_experts_options *opts,
                           mj_experts_t *out) {
    const char *who = "mj_experts_adopt";
    if (!ctx || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL context or output", who);
    *out = NULL;
    mj_adopt_tensors t;
    MJ_CHECK(load_tensors(t_in, who, &t));
    MJ_CHECK(check_tensors(&t, who));
    /* The routed experts only: an engine runs its shared expert (and a Qwen gate on it) itself. */
    const mj_experts_shape sh = {t.hidden, t.intermediate, t.topk, t.n_experts, t.n_experts, 0, 0, 0};
    mj_experts_t ex;
    MJ_CHECK(mj_experts_new(ctx, &sh, opts, who, &ex));
    mj_status st;
    dims d;
    dims_of(&t, &d);
    mj_adoption *a = calloc(1, sizeof *a);
    if (!a) {
        mj_experts_free(ex);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    }
    a->t = t;
    a->device = mj_experts_device(ex);
    a->E_d = t.n_experts < 8 ? 8 : t.n_experts;
    if (a->E_d < t.topk) a->E_d = t.topk;
    a->in_place = !(t.flags & MJ_ADOPT_COPY);
    a->s13_in_place = a->in_place && d.ps13 == d.s13;
    a->s2_in_place = a->in_place && d.ps2 == d.s2;
    mj_experts_bind(ex, NULL, NULL, NULL, NULL, a); /* freed with the handle from here on */
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    a->placed = v.placed;
    MJ_CHECK_GOTO(dispatch_alloc(a, v.mb), st, fail);
    const unsigned own = (a->in_place ? 0 : MJ_EXPERTS_OWN_W13 | MJ_EXPERTS_OWN_W2) |
                         (a->s13_in_place ? 0 : MJ_EXPERTS_OWN_S13) | (a->s2_in_place ? 0 : MJ_EXPERTS_OWN_S2);
    MJ_CHECK_GOTO(mj_experts_alloc_weights(ex, own), st, fail);
    mj_experts_bind(ex, t.w13_weight, t.w13_weight_scale, t.w2_weight, t.w2_weight_scale, a);
    MJ_CHECK_GOTO(pack_all(ex, a, &t, who), st, fail);
    *out = ex;
    return MJ_OK;
fail:
    mj_experts_free(ex);
    return st;
}

static mj_status adopted(mj_experts_t ex, const char *who, mj_adoption **a) {
    if (!ex) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL experts", who);
    *a = mj_experts_adoption(ex);
    if (!*a)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: these experts were made by mj_experts_create, not adopted from an engine's tensors "
                            "(mj_experts_adopt)",
                            who);
    return MJ_OK;
}

mj_status mj_experts_readopt(mj_experts_t ex, const mj_adopt_tensors *t_in) {
    const char *who = "mj_experts_readopt";
    mj_adoption *a;
    MJ_CHECK(adopted(ex, who, &a));
    mj_adopt_tensors t;
    MJ_CHECK(load_tensors(t_in, who, &t));
    MJ_CHECK(check_tensors(&t, who));
    MJ_CHECK(check_same(a, &t));
    if (a->in_place && !a->released) {
        dims d;
        dims_of(&t, &d);
        const dest dst = dest_of(ex);
        uint8_t now[2][FINGERPRINT];
        fingerprint(a->device, &dst, &d, now);
        if (!memcmp(now, a->fp, sizeof now))
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "%s: the tensors still hold the layout moejit packed them into (no reload since "
                                "the adoption); packing them again would scramble them. Reload every expert into "
                                "them first, or mj_experts_release them",
                                who);
    }
    if (!a->in_place) { /* the tensors may have moved: read them where they are now */
        mj_adopt_tensors keep = a->t;
        a->t = t;
        mj_status st = pack_all(ex, a, &t, who);
        if (st != MJ_OK) a->t = keep;
        return st;
    }
    return pack_all(ex, a, &t, who);
}

mj_status mj_experts_release(mj_experts_t ex) {
    const char *who = "mj_experts_release";
    mj_adoption *a;
    MJ_CHECK(adopted(ex, who, &a));
    if (!a->in_place || a->released) return MJ_OK;
    dims d;
    dims_of(&a->t, &d);
    stage s;
    MJ_CHECK(stage_alloc(&d, &s));
    const dest src = dest_of(ex);
    mj_status st = MJ_OK;
    for (int64_t x = 0; x < d.E && st == MJ_OK; x++) st = unpack_one(a->device, a, &d, &src, x, &s);
    free(s.mem);
    if (st != MJ_OK) return mj_error_prefix(st, "%s", who);
    a->released = 1;
    return MJ_OK;
}

mj_status mj_experts_adopt_info(mj_experts_t ex, mj_adopt_info *info) {
    if (!ex || !info) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_adopt_info: NULL argument");
    mj_adopt_info r = MJ_ADOPT_INFO_INIT;
    MJ_CHECK(mj_struct_load(info, sizeof r, sizeof r, &r, "mj_adopt_info", "MJ_ADOPT_INFO_INIT"));
    const mj_adoption *a = mj_experts_adoption(ex);
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    r.adopted = a != NULL;
    r.in_place = a ? a->in_place : 0;
    r.scales_in_place = a ? a->s13_in_place && a->s2_in_place : 0;
    r.released = a ? a->released : 0;
    r.bytes_allocated = mj_experts_bytes_allocated(ex) + (a ? a->bytes_allocated : 0);
    r.bytes_weights = (int64_t)(v.n_local + v.nsub) * (v.bytes_w13 + v.bytes_s13 + v.bytes_w2 + v.bytes_s2);
    mj_struct_store(info, &r, sizeof r);
    return MJ_OK;
}

/* ---- the forward on the engine's top-k ----------------------------------------------------- */

mj_status mj_experts_forward_topk(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode, const uint16_t *hidden,
                                  int32_t B, const int32_t *topk_ids, const float *topk_weights,
                                  const int32_t *num_valid, void *out, mj_out_type out_type, void *stream) {
    const char *who = "mj_experts_forward_topk";
    mj_adoption *a;
    if (!ctx) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL context", who);
    MJ_CHECK(adopted(ex, who, &a));
    MJ_CHECK(mj_adoption_usable(a, who));
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    if (B < 0 || B > v.mb)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: B = %d; these experts' workspace takes 0..%d tokens (adopt with a larger "
                            "mj_experts_options.max_batch)",
                            who, B, v.mb);
    if (out_type != MJ_OUT_F32 && out_type != MJ_OUT_BF16)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: unknown out_type %d: MJ_OUT_F32 or MJ_OUT_BF16", who,
                            (int)out_type);
    if (B == 0) return MJ_OK;
    if (!hidden || !topk_ids || !topk_weights || !out)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: NULL hidden, topk_ids, topk_weights or out", who);
    mj_weight_mode resolved; /* a mode the target lacks is refused before any launch */
    MJ_CHECK(mj_experts_mode(ex, mode, B, &resolved));
    if (a->device == MJ_DEVICE_NONE) /* host memory: the ids can be checked before any launch */
        for (int64_t i = 0; i < (int64_t)B * v.K; i++)
            if (topk_ids[i] < -1 || topk_ids[i] >= v.n_local)
                return mj_set_error(MJ_ERR_INVALID_ARG,
                                    "%s: topk_ids[%lld, %lld] = %d; the ids are local experts 0..%d, or -1 for none "
                                    "(under EP, map global ids to local ones first)",
                                    who, (long long)(i / v.K), (long long)(i % v.K), topk_ids[i], v.n_local - 1);
    mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
    r.ids = (int32_t *)topk_ids, r.weights = (float *)topk_weights;
    r.expert_counts = a->counts, r.expert_offsets = a->offsets, r.active_experts = a->active;
    r.n_active = a->n_active, r.permutation = a->perm, r.row_index = a->row_index;
    MJ_CHECK(mj_route_dispatch(ctx, topk_ids, B, v.K, a->E_d, &r, stream));
    return mj_experts_forward_out(ctx, ex, mode, hidden, &r, B, num_valid, out, out_type, stream);
}
