/* pack.c — an expert's NVFP4 weights, from the ModelOpt layout (codes [N, K/2],
 * element 2i in the low nibble; scales [N, K/16]) to the layout the expert kernels stream
 * (templates/moe_experts.cu has the picture), and back.
 *
 * The kernels read a 16-row tile of a weight matrix one k-step (64 of K) at a time, one
 * 16-byte load per lane, 512 contiguous bytes per warp; lane L = 4g + p gets the four u32s
 * of its m16n8k64 A fragment:
 *
 *     a0 = row g,   natural bytes 32s + 4p .. +3      (codes of k 64s + 8p .. +7)
 *     a1 = row g+8, the same bytes
 *     a2 = row g,   natural bytes 32s + 16 + 4p .. +3 (k 64s + 32 + 8p .. +7)
 *     a3 = row g+8, the same bytes
 *
 * Scales go by runs of 4 k-steps: per tile and run, each of the 16 rows' 16 scale bytes
 * (k-groups 16m .. 16m+15; zeros past the row's end). w13's tiles interleave gate and up
 * (the up kernel computes 16 gate and 16 up rows together, for SwiGLU), w2's are plain.
 * Packing moves bits only (bytes, and below sm_120 the bits within a code word, below): no
 * value changes, so unpacking gives the input back exactly.
 */
#include "weights/pack.h"

#include <stdlib.h>
#include <string.h>

static int64_t runs_of(int64_t k) { return (k / 64 + 3) / 4; }

int64_t mj_pack_w13_bytes(int32_t H, int32_t I) { return (int64_t)I * H; }
int64_t mj_pack_s13_bytes(int32_t H, int32_t I) { return (int64_t)(I / 16) * runs_of(H) * 512; }
int64_t mj_pack_w2_bytes(int32_t H, int32_t I) { return (int64_t)H * I / 2; }
int64_t mj_pack_s2_bytes(int32_t H, int32_t I) { return (int64_t)(H / 16) * runs_of(I) * 256; }
int64_t mj_pack_expert_bytes(int32_t H, int32_t I) {
    return mj_pack_w13_bytes(H, I) + mj_pack_s13_bytes(H, I) + mj_pack_w2_bytes(H, I) + mj_pack_s2_bytes(H, I);
}

/* The natural byte of (row, byte b) <-> its place in the packed fragment of step s. Both
 * directions walk the same loops, so they cannot disagree. */
static void frag_walk(uint8_t *nat, int64_t row_bytes, int64_t row0, int32_t ks, uint8_t *packed, int pack) {
    for (int32_t s = 0; s < ks; s++)
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, p = lane & 3;
            for (int word = 0; word < 4; word++) {
                int64_t row = row0 + g + 8 * (word & 1);
                int64_t b = 32 * (int64_t)s + 16 * (word >> 1) + 4 * p;
                uint8_t *n = nat + row * row_bytes + b, *q = packed + (int64_t)s * 512 + lane * 16 + word * 4;
                if (pack) memcpy(q, n, 4);
                else memcpy(n, q, 4);
            }
        }
}

/* The bits of E2M1 code c (s e1 e0 m, bit 3 .. 0) at positions m, e0, e1 and s. */
static uint32_t code_at(uint32_t c, int m, int e0, int e1, int s) {
    return (c & 1u) << m | (c >> 1 & 1u) << e0 | (c >> 2 & 1u) << e1 | (c >> 3 & 1u) << s;
}
static uint32_t code_from(uint32_t w, int m, int e0, int e1, int s) {
    return (w >> m & 1u) | (w >> e0 & 1u) << 1 | (w >> e1 & 1u) << 2 | (w >> s & 1u) << 3;
}

/* Where the bits (m, e0, e1, s) of code 2q of a word go (code 2q + 1's: 16 higher), pair q
 * by pair q. templates/moe_experts.cu's placed e2m1x8_bf16 reads pair q of the bf16 pairs
 * (code 2q low, 2q + 1 high; a code's e1 e0 m at bits 8 7 6 of its half, s at 15) as
 *   q 0: (w << 6) & 0x81C081C0        q 1: (w << 3) & 0x81C081C0
 *   q 2: w & 0x81C081C0               q 3: (((w >> 7) & 0x00D800D8) * 0x821) & 0x81C081C0
 * (q 3: the three copies of the masked bits, by 1, 2^5 and 2^11, share no bit, so the
 * product is their OR). The four can't all be one shift and a mask: three such pairs leave
 * no run of three bits for the fourth's e1 e0 m. */
static const int8_t k_place[4][4] = {{0, 1, 2, 9}, {3, 4, 5, 12}, {6, 7, 8, 15}, {13, 14, 10, 11}};

uint32_t mj_pack_place_word(uint32_t w) {
    uint32_t r = 0;
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            const int8_t *a = k_place[q];
            r |= code_at(w >> (4 * (2 * q + h)) & 15u, a[0] + 16 * h, a[1] + 16 * h, a[2] + 16 * h, a[3] + 16 * h);
        }
    return r;
}

uint32_t mj_pack_unplace_word(uint32_t w) {
    uint32_t r = 0;
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            const int8_t *a = k_place[q];
            r |= code_from(w, a[0] + 16 * h, a[1] + 16 * h, a[2] + 16 * h, a[3] + 16 * h) << (4 * (2 * q + h));
        }
    return r;
}

/* Every code word of n bytes, placed (dir 1) or back (dir 0). */
static void place_all(uint8_t *p, int64_t n, int dir) {
    for (int64_t i = 0; i + 4 <= n; i += 4) {
        uint32_t w;
        memcpy(&w, p + i, 4);
        w = dir ? mj_pack_place_word(w) : mj_pack_unplace_word(w);
        memcpy(p + i, &w, 4);
    }
}

static void scale_walk(uint8_t *nat, int64_t row_groups, int64_t row0, int32_t runs, uint8_t *packed,
                       int64_t run_stride, int pack) {
    for (int32_t m = 0; m < runs; m++)
        for (int r = 0; r < 16; r++)
            for (int j = 0; j < 16; j++) {
                int64_t grp = 16 * (int64_t)m + j;
                uint8_t *q = packed + m * run_stride + r * 16 + j;
                if (grp >= row_groups) { /* past the row: padding */
                    if (pack) *q = 0;
                    continue;
                }
                uint8_t *n = nat + (row0 + r) * row_groups + grp;
                if (pack) *q = *n;
                else *n = *q;
            }
}

static mj_status check_expert(const mj_nvfp4_linear *w13, int32_t gate0, int32_t up0, int32_t I,
                              const mj_nvfp4_linear *w2, int32_t col0) {
    if (!w13 || !w2 || !w13->weight || !w13->weight_scale || !w2->weight || !w2->weight_scale)
        return mj_set_error(MJ_ERR_INVALID_ARG, "pack: an expert's tensors are missing");
    const int32_t H = w13->k_in;
    if (H % 64 || I % 64 || I < 64)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "pack: hidden %d and intermediate %d must be multiples of 64 (one k-step of the FP4 MMA)",
                            H, I);
    if (gate0 < 0 || up0 < 0 || gate0 + I > w13->n_out || up0 + I > w13->n_out || w2->n_out != H ||
        col0 < 0 || col0 % 64 || col0 + I > w2->k_in)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "pack: rows [%d, %d) and [%d, %d) of a [%d, %d] w13 and columns [%d, %d) of a "
                            "[%d, %d] w2 do not make an expert of hidden %d",
                            gate0, gate0 + I, up0, up0 + I, w13->n_out, H, col0, col0 + I, w2->n_out, w2->k_in, H);
    return MJ_OK;
}

mj_status mj_pack_expert(const mj_nvfp4_linear *w13, int32_t gate0, int32_t up0, int32_t I,
                         const mj_nvfp4_linear *w2, int32_t col0, int placed, uint8_t *w13p, uint8_t *s13p,
                         uint8_t *w2p, uint8_t *s2p) {
    MJ_CHECK(check_expert(w13, gate0, up0, I, w2, col0));
    const int32_t H = w13->k_in, ks1 = H / 64, ks2 = I / 64;
    const int32_t r1 = (int32_t)runs_of(H), r2 = (int32_t)runs_of(I);
    for (int32_t t = 0; t < I / 16; t++) {
        uint8_t *wt = w13p + (int64_t)t * ks1 * 1024, *st = s13p + (int64_t)t * r1 * 512;
        /* gate and up interleave per step: pack each into a scratch step order, then merge */
        for (int half = 0; half < 2; half++) {
            int64_t row0 = (half ? up0 : gate0) + 16 * (int64_t)t;
            for (int32_t s = 0; s < ks1; s++)
                frag_walk(w13->weight + 32 * (int64_t)s, H / 2, row0, 1, wt + (int64_t)s * 1024 + half * 512, 1);
            scale_walk(w13->weight_scale, H / 16, row0, r1, st + half * 256, 512, 1);
        }
    }
    /* w2: columns col0 .. col0 + I of each of the H rows. */
    const int64_t w2_row = w2->k_in / 2, w2_groups = w2->k_in / 16;
    for (int32_t d = 0; d < H / 16; d++) {
        uint8_t *wt = w2p + (int64_t)d * ks2 * 512, *st = s2p + (int64_t)d * r2 * 256;
        frag_walk(w2->weight + col0 / 2, w2_row, 16 * (int64_t)d, ks2, wt, 1);
        /* the scale rows start at column group col0 / 16 of rows with w2_groups groups */
        for (int32_t m = 0; m < r2; m++)
            for (int r = 0; r < 16; r++)
                for (int j = 0; j < 16; j++) {
                    int64_t grp = 16 * (int64_t)m + j;
                    st[m * 256 + r * 16 + j] =
                        grp < I / 16 ? w2->weight_scale[(16 * (int64_t)d + r) * w2_groups + col0 / 16 + grp] : 0;
                }
    }
    if (placed) place_all(w13p, mj_pack_w13_bytes(H, I), 1), place_all(w2p, mj_pack_w2_bytes(H, I), 1);
    return MJ_OK;
}

mj_status mj_unpack_expert(const uint8_t *w13p, const uint8_t *s13p, const uint8_t *w2p, const uint8_t *s2p,
                           int32_t H, int32_t I, int placed, mj_nvfp4_linear *w13, mj_nvfp4_linear *w2) {
    if (!w13p || !s13p || !w2p || !s2p || !w13 || !w2 || !w13->weight || !w13->weight_scale || !w2->weight ||
        !w2->weight_scale || w13->n_out != 2 * I || w13->k_in != H || w2->n_out != H || w2->k_in != I ||
        H % 64 || I % 64)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_unpack_expert: bad arguments (H %d, I %d)", H, I);
    const int32_t ks1 = H / 64, ks2 = I / 64, r1 = (int32_t)runs_of(H), r2 = (int32_t)runs_of(I);
    for (int32_t t = 0; t < I / 16; t++)
        for (int half = 0; half < 2; half++) {
            int64_t row0 = half * (int64_t)I + 16 * (int64_t)t;
            for (int32_t s = 0; s < ks1; s++)
                frag_walk(w13->weight + 32 * (int64_t)s, H / 2, row0, 1,
                          (uint8_t *)w13p + (int64_t)t * ks1 * 1024 + (int64_t)s * 1024 + half * 512, 0);
            scale_walk(w13->weight_scale, H / 16, row0, r1, (uint8_t *)s13p + (int64_t)t * r1 * 512 + half * 256, 512, 0);
        }
    for (int32_t d = 0; d < H / 16; d++) {
        frag_walk(w2->weight, I / 2, 16 * (int64_t)d, ks2, (uint8_t *)w2p + (int64_t)d * ks2 * 512, 0);
        scale_walk(w2->weight_scale, I / 16, 16 * (int64_t)d, r2, (uint8_t *)s2p + (int64_t)d * r2 * 256, 256, 0);
    }
    /* the natural bytes are each a placed word's bytes, moved: unplace them where they are */
    if (placed) place_all(w13->weight, (int64_t)I * H, 0), place_all(w2->weight, (int64_t)H * I / 2, 0);
    return MJ_OK;
}
