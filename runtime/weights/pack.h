/* pack.h — expert weights in the layout the expert kernels stream (runtime/weights/pack.c;
 * the picture is in templates/moe_experts.cu). Not public. */
#ifndef MJ_PACK_H
#define MJ_PACK_H

#include "base.h"

/* Bytes of one packed expert of hidden H and intermediate I: w13 codes, w13 scales, w2
 * codes, w2 scales. */
int64_t mj_pack_w13_bytes(int32_t H, int32_t I);
int64_t mj_pack_s13_bytes(int32_t H, int32_t I);
int64_t mj_pack_w2_bytes(int32_t H, int32_t I);
int64_t mj_pack_s2_bytes(int32_t H, int32_t I);
/* The four together: what a forward reads of one active expert. */
int64_t mj_pack_expert_bytes(int32_t H, int32_t I);

/* Pack one expert: gate rows [gate0, gate0 + I) and up rows [up0, up0 + I) of w13 (a
 * [rows, H] linear), columns [col0, col0 + I) of w2 ([H, cols]). A routed expert is
 * (0, I, I, 0); sub-expert j of a shared expert of I_s rows is (jI, I_s + jI, I, jI). */
/* placed: the code words bit-placed for W4A16 (a target without the FP4 MMA: see
 * mj_experts_view.placed), else as the FP4 MMA reads them. */
mj_status mj_pack_expert(const mj_nvfp4_linear *w13, int32_t gate0, int32_t up0, int32_t I,
                         const mj_nvfp4_linear *w2, int32_t col0, int placed, uint8_t *w13p, uint8_t *s13p,
                         uint8_t *w2p, uint8_t *s2p);

/* The inverse, into a [2I, H] w13 and a [H, I] w2 (allocated by the caller). */
mj_status mj_unpack_expert(const uint8_t *w13p, const uint8_t *s13p, const uint8_t *w2p, const uint8_t *s2p,
                           int32_t H, int32_t I, int placed, mj_nvfp4_linear *w13, mj_nvfp4_linear *w2);

/* One packed code word (eight E2M1 codes, code j in nibble j) bit-placed for W4A16's
 * dequantization (pack.c has the map), and back. */
uint32_t mj_pack_place_word(uint32_t w);
uint32_t mj_pack_unplace_word(uint32_t w);

#endif
