/* nvfp4.c — NVFP4 on the host: the two tiny float formats, and ModelOpt's quantizer.
 *
 * NVFP4 stores a weight as three things (as ModelOpt exports it):
 *   - a 4-bit E2M1 code per element: sign, 2 exponent bits, 1 mantissa bit, which can say
 *     only 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and their negatives);
 *   - an 8-bit E4M3FN scale per block of 16 consecutive elements along K;
 *   - one float per tensor, weight_scale_2 = amax(W) / (6 * 448), which moves the tensor
 *     into the range where the block scales have the most precision: after dividing by it
 *     the largest element is 6 * 448, i.e. the largest E2M1 times the largest E4M3.
 * So W = e2m1(code) * e4m3(block scale) * weight_scale_2.
 *
 * The two encoders are the kernels' own, templates/prelude_fp.h (included below), and follow
 * the GPU's `cvt.rn.satfinite`: nearest with ties to even, saturating instead of
 * overflowing, the code's sign bit that of x (-0.0 gives -0; see there). The tests check
 * them against a brute-force nearest search, so the two are independent. ModelOpt's weight
 * export differs on one point, the sign of a zero quotient (see pack_block).
 *
 * Activations (the W4A4 path of sm_120) use the same element and block formats, but the
 * tensor scale is the checkpoint's calibrated input_scale: gs = 1 / input_scale,
 *   SF = e4m3(gs * blockmax / 6),  q = e2m1((x * gs) / SF),
 * and the way back is x = (e2m1(q) * SF) * input_scale (multiplying by input_scale, not
 * dividing by the rounded gs; the two differ by at most one rounding of gs).
 *
 * Every public function checks its arguments and scans its input for NaN and Inf before it
 * writes anything, so a failure leaves the outputs untouched.
 */
#include "ref/ref.h"

#include <math.h>
#include <stdint.h>

/* mj_e4m3_enc_c, mj_e2m1_enc_c and mj_e4m3_dec_c: the one copy, which the kernels' preludes
 * embed too (it needs MJ_DEVICE, uint32_t and base.h's mj_f32_bits / mj_f32_from_bits). */
#define MJ_DEVICE static inline
#include "prelude_fp.h"
#undef MJ_DEVICE

/* ---------------------------------------------------------------------------------------
 * E2M1
 * ------------------------------------------------------------------------------------- */

static const float k_e2m1_value[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float mj_e2m1_decode(uint8_t code) {
    float v = k_e2m1_value[code & 7u];
    return (code & 8u) ? -v : v;
}

uint8_t mj_e2m1_encode(float x) { return (uint8_t)mj_e2m1_enc_c(x); }

/* ---------------------------------------------------------------------------------------
 * E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; 0x7F / 0xFF are NaN,
 * so the largest finite value is 0x7E = 1.75 * 2^8 = 448. Exponent 0 is subnormal:
 * (m/8) * 2^-6, the smallest step being 2^-9.
 * ------------------------------------------------------------------------------------- */

float mj_e4m3_decode(uint8_t b) { return (b & 0x7Fu) == 0x7Fu ? NAN : mj_e4m3_dec_c(b); }

uint8_t mj_e4m3_encode(float x) { return (uint8_t)mj_e4m3_enc_c(x); }

/* ---------------------------------------------------------------------------------------
 * Argument checks and the NaN scan shared by the four public calls
 * ------------------------------------------------------------------------------------- */

static const char *label(const char *name) { return name ? name : "(unnamed)"; }

/* rows, k > 0, k a multiple of 16, rows * k fits. `what` names the sizes in the message. */
static mj_status check_shape(const char *fn, int64_t rows, int64_t k, const char *what) {
    if (rows <= 0 || k <= 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: %s = [%lld, %lld]: both must be > 0", fn,
                            what, (long long)rows, (long long)k);
    if (k % MJ_NVFP4_GROUP != 0)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: k = %lld is not a multiple of %d (the NVFP4 block size); pad K",
                            fn, (long long)k, MJ_NVFP4_GROUP);
    if (rows > INT64_MAX / k || (uint64_t)(rows * k) > SIZE_MAX / sizeof(float))
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: %s = [%lld, %lld] is too large", fn, what,
                            (long long)rows, (long long)k);
    return MJ_OK;
}

static mj_status check_ptr(const char *fn, const void *p, const char *arg) {
    if (!p) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: %s is NULL", fn, arg);
    return MJ_OK;
}

/* The first NaN or Inf of x [rows, k] in memory order, reported with its [row, col];
 * `hint` says where to look. */
static mj_status check_finite(const float *x, int64_t rows, int64_t k, const char *name,
                              const char *hint) {
    int64_t count = rows * k;
    for (int64_t i = 0; i < count; i++) {
        if (isfinite(x[i])) continue;
        const char *what = isnan(x[i]) ? "NaN" : (x[i] > 0 ? "+Inf" : "-Inf");
        return mj_set_error(MJ_ERR_NONFINITE,
                            "tensor '%s' has %s at index [%lld, %lld] (flat %lld): "
                            "quantization needs finite values; check %s",
                            label(name), what, (long long)(i / k), (long long)(i % k),
                            (long long)i, hint);
    }
    return MJ_OK;
}

/* Block scales from a checkpoint are ue4m3 on the GPU: bit 7 must be 0, and 0x7F (NaN) is
 * corrupt data. Refusing both keeps the CPU reference and the kernels in agreement. */
static mj_status check_scales(const char *fn, const uint8_t *sf, int64_t rows, int64_t k,
                              const char *arg) {
    int64_t kb = k / MJ_NVFP4_GROUP, count = rows * kb;
    for (int64_t i = 0; i < count; i++) {
        if ((sf[i] & 0x7Fu) == 0x7Fu)
            return mj_set_error(MJ_ERR_NONFINITE,
                                "%s: %s[%lld, %lld] = 0x%02X, an E4M3 NaN: the block scales "
                                "are corrupt",
                                fn, arg, (long long)(i / kb), (long long)(i % kb), sf[i]);
        if (sf[i] & 0x80u)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "%s: %s[%lld, %lld] = 0x%02X has the sign bit set: block "
                                "scales must be non-negative (ue4m3)",
                                fn, arg, (long long)(i / kb), (long long)(i % kb), sf[i]);
    }
    return MJ_OK;
}

/* input_scale is amax(x) / (6*448): finite, > 0, and large enough that gs = 1/input_scale
 * is finite too. */
static mj_status check_input_scale(const char *fn, float input_scale) {
    if (!isfinite(input_scale) || !(input_scale > 0.0f) || !isfinite(1.0f / input_scale))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: input_scale = %g must be finite and > 0, with 1/input_scale "
                            "finite (it is amax(x) / (6*448))",
                            fn, (double)input_scale);
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * Blocks of 16: the one loop body that weights and activations share
 * ------------------------------------------------------------------------------------- */

static float block_amax(const float *x) {
    float m = 0.0f;
    for (int j = 0; j < MJ_NVFP4_GROUP; j++) m = fmaxf(m, fabsf(x[j]));
    return m;
}

/* Encode 16 elements as the codes of (x * mul) / denom and pack them, element 2i in the low
 * nibble. Weights pass mul = 1 (x * 1 is x exactly) and modelopt = 1: ModelOpt takes a
 * code's sign as (x / denom) < 0, so a quotient of -0.0 (x = -0.0, or a tiny negative that
 * underflows) is written +0 there, where the encoder, as the GPU's cvt, gives -0 (code 8).
 * Activations pass mul = gs and modelopt = 0: the kernels' codes, -0.0 giving code 8. */
static void pack_block(const float *x, float mul, float denom, int modelopt, uint8_t *out) {
    for (int j = 0; j < MJ_NVFP4_GROUP; j += 2) {
        float a = (x[j] * mul) / denom, b = (x[j + 1] * mul) / denom;
        if (modelopt && a == 0.0f) a = 0.0f;
        if (modelopt && b == 0.0f) b = 0.0f;
        out[j / 2] = (uint8_t)(mj_e2m1_encode(a) | (mj_e2m1_encode(b) << 4));
    }
}

/* Unpack 16 codes and write (e2m1 * sf) * tensor_scale. */
static void unpack_block(const uint8_t *in, float sf, float tensor_scale, float *x) {
    for (int j = 0; j < MJ_NVFP4_GROUP; j += 2) {
        uint8_t byte = in[j / 2];
        x[j] = (mj_e2m1_decode(byte & 0xFu) * sf) * tensor_scale;
        x[j + 1] = (mj_e2m1_decode(byte >> 4) * sf) * tensor_scale;
    }
}

/* ---------------------------------------------------------------------------------------
 * Weights (ModelOpt's NVFP4QTensor, in float32 as PyTorch computes it)
 * ------------------------------------------------------------------------------------- */

static float tensor_amax(const float *w, int64_t count) {
    float m = 0.0f;
    for (int64_t i = 0; i < count; i++) m = fmaxf(m, fabsf(w[i]));
    return m;
}

/* The block's E4M3 scale byte, as ModelOpt (0.45 and later) computes it in float32:
 * block_amax / (6 * ws2); an all-zero block's 0 becomes 1.0 (its codes are all 0); then
 * anything below the smallest E4M3 subnormal, 2^-9, is clamped up to it, so a tiny non-zero
 * block (block_amax below about 2.2e-6 of the tensor's amax) gets byte 0x01 and keeps its
 * codes instead of flushing to 0 (ModelOpt 0.44 and earlier wrote 0x00 there). */
static uint8_t weight_block_scale(float amax_block, float ws2) {
    float scale = amax_block / (6.0f * ws2);
    if (scale == 0.0f) scale = 1.0f;
    if (scale < 0x1p-9f) scale = 0x1p-9f;
    return mj_e4m3_encode(scale);
}

mj_status mj_nvfp4_quantize(const float *w, int64_t n, int64_t k, const char *name,
                            uint8_t *weight, uint8_t *weight_scale, float *weight_scale_2) {
    static const char fn[] = "mj_nvfp4_quantize";
    MJ_CHECK(check_ptr(fn, w, "w"));
    MJ_CHECK(check_ptr(fn, weight, "weight"));
    MJ_CHECK(check_ptr(fn, weight_scale, "weight_scale"));
    MJ_CHECK(check_ptr(fn, weight_scale_2, "weight_scale_2"));
    MJ_CHECK(check_shape(fn, n, k, "w [n, k]"));
    MJ_CHECK(check_finite(w, n, k, name, "the checkpoint"));

    float amax = tensor_amax(w, n * k);
    float ws2 = amax / (6.0f * MJ_E4M3_MAX);
    /* An all-zero tensor (or one so tiny that ws2 underflows) gets ws2 = 1: every block is
     * then zero-or-underflowing, scale 1.0, all codes 0. */
    if (!(ws2 > 0.0f)) ws2 = 1.0f;
    int64_t kb = k / MJ_NVFP4_GROUP;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < kb; b++) {
            const float *blk = w + r * k + b * MJ_NVFP4_GROUP;
            uint8_t byte = weight_block_scale(block_amax(blk), ws2);
            weight_scale[r * kb + b] = byte;
            pack_block(blk, 1.0f, mj_e4m3_decode(byte) * ws2, 1, weight + r * (k / 2) + b * 8);
        }
    }
    *weight_scale_2 = ws2;
    return MJ_OK;
}

mj_status mj_nvfp4_dequantize(const uint8_t *weight, const uint8_t *weight_scale,
                              float weight_scale_2, int64_t n, int64_t k, float *w) {
    static const char fn[] = "mj_nvfp4_dequantize";
    MJ_CHECK(check_ptr(fn, weight, "weight"));
    MJ_CHECK(check_ptr(fn, weight_scale, "weight_scale"));
    MJ_CHECK(check_ptr(fn, w, "w"));
    MJ_CHECK(check_shape(fn, n, k, "w [n, k]"));
    if (!isfinite(weight_scale_2) || weight_scale_2 < 0.0f)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s: weight_scale_2 = %g must be finite and >= 0", fn,
                            (double)weight_scale_2);
    MJ_CHECK(check_scales(fn, weight_scale, n, k, "weight_scale"));

    int64_t kb = k / MJ_NVFP4_GROUP;
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < kb; b++)
            unpack_block(weight + r * (k / 2) + b * 8, mj_e4m3_decode(weight_scale[r * kb + b]),
                         weight_scale_2, w + r * k + b * MJ_NVFP4_GROUP);
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * Activations (FlashInfer / SGLang W4A4)
 * ------------------------------------------------------------------------------------- */

/* One block of one row. When the scale flushes to 0 (a zero block, or one far below
 * input_scale), every code is 0 and the byte stays 0: dividing by it would make NaN. */
static void quantize_act_block(const float *x, float gs, uint8_t *q, uint8_t *sf) {
    uint8_t byte = mj_e4m3_encode(gs * block_amax(x) / 6.0f);
    float scale = mj_e4m3_decode(byte);
    *sf = byte;
    if (scale == 0.0f) {
        memset(q, 0, MJ_NVFP4_GROUP / 2);
        return;
    }
    pack_block(x, gs, scale, 0, q);
}

mj_status mj_nvfp4_quantize_act(const float *x, int64_t rows, int64_t k, float input_scale,
                                const char *name, uint8_t *q, uint8_t *sf) {
    static const char fn[] = "mj_nvfp4_quantize_act";
    MJ_CHECK(check_ptr(fn, x, "x"));
    MJ_CHECK(check_ptr(fn, q, "q"));
    MJ_CHECK(check_ptr(fn, sf, "sf"));
    MJ_CHECK(check_shape(fn, rows, k, "x [rows, k]"));
    MJ_CHECK(check_input_scale(fn, input_scale));
    MJ_CHECK(check_finite(x, rows, k, name, "the layer's input"));

    float gs = 1.0f / input_scale;
    int64_t kb = k / MJ_NVFP4_GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < kb; b++)
            quantize_act_block(x + r * k + b * MJ_NVFP4_GROUP, gs, q + r * (k / 2) + b * 8,
                               sf + r * kb + b);
    return MJ_OK;
}

mj_status mj_nvfp4_dequantize_act(const uint8_t *q, const uint8_t *sf, int64_t rows, int64_t k,
                                  float input_scale, float *x) {
    static const char fn[] = "mj_nvfp4_dequantize_act";
    MJ_CHECK(check_ptr(fn, q, "q"));
    MJ_CHECK(check_ptr(fn, sf, "sf"));
    MJ_CHECK(check_ptr(fn, x, "x"));
    MJ_CHECK(check_shape(fn, rows, k, "x [rows, k]"));
    MJ_CHECK(check_input_scale(fn, input_scale));
    MJ_CHECK(check_scales(fn, sf, rows, k, "sf"));

    int64_t kb = k / MJ_NVFP4_GROUP;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < kb; b++)
            unpack_block(q + r * (k / 2) + b * 8, mj_e4m3_decode(sf[r * kb + b]), input_scale,
                         x + r * k + b * MJ_NVFP4_GROUP);
    return MJ_OK;
}

void mj_nvfp4_scales_reexpress(uint8_t *sf, int64_t n, float ratio) {
    for (int64_t i = 0; i < n; i++) {
        if (!sf[i]) continue;
        uint8_t b = mj_e4m3_encode(mj_e4m3_decode(sf[i]) * ratio);
        sf[i] = b ? b : 0x01;
    }
}

int64_t mj_nvfp4_scale_bad(const uint8_t *sf, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((sf[i] & 0x7F) == 0x7F || (sf[i] & 0x80)) return i;
    return -1;
}
