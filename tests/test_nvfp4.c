/* test_nvfp4.c — the NVFP4 formats and quantizers against independent references.
 *
 * The decoders are checked against tables and formulas written here; the encoders against a
 * brute-force "nearest value, ties to the even code" search over the decoded values, at every
 * rounding boundary and on a sweep of ordinary floats; the quantizers against a 2x32 example
 * worked out by hand, against the error bound the format promises, and on their failure paths
 * (which must leave the outputs untouched). */
#include "base.h"
#include "test.h"
#include "ref/ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * References written independently of runtime/nvfp4.c
 * ------------------------------------------------------------------------------------- */

static const float k_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E4M3FN by the textbook formula: (m/8) 2^-6 when e == 0, else (1 + m/8) 2^(e-7). */
static double ref_e4m3(int b) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

/* Nearest of `n` sorted magnitudes vals[0..n-1] (codes 0..n-1) to a >= 0; a tie goes to the
 * even code; anything past the last value saturates to it. */
static int ref_nearest(const double *vals, int n, double a) {
    int best = 0;
    for (int c = 1; c < n; c++) {
        double d_best = fabs(a - vals[best]), d = fabs(a - vals[c]);
        if (d < d_best || (d == d_best && (c & 1) == 0)) best = c;
    }
    return best;
}

static double g_e4m3_mag[127]; /* magnitudes of bytes 0x00..0x7E */
static double g_e2m1_mag[8];

static void init_refs(void) {
    for (int c = 0; c < 127; c++) g_e4m3_mag[c] = ref_e4m3(c);
    for (int c = 0; c < 8; c++) g_e2m1_mag[c] = k_e2m1[c];
}

static uint8_t ref_e4m3_encode(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    return (uint8_t)(sign | ref_nearest(g_e4m3_mag, 127, fabs((double)x)));
}

static uint8_t ref_e2m1_encode(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    return (uint8_t)(sign | ref_nearest(g_e2m1_mag, 8, fabs((double)x)));
}

/* Half the distance between E2M1 neighbours around magnitude v (the largest rounding error
 * of a value that lands there; past 6, saturation, still within 1 as long as v <= 7). */
static double e2m1_half_step(double v) { return v < 2.0 ? 0.25 : v < 4.0 ? 0.5 : 1.0; }

static int nibble(const uint8_t *packed, int64_t i) {
    uint8_t b = packed[i / 2];
    return (i & 1) ? b >> 4 : b & 15;
}

/* ---------------------------------------------------------------------------------------
 * Decoders
 * ------------------------------------------------------------------------------------- */

static void test_e2m1_decode(void) {
    for (int c = 0; c < 16; c++) {
        float v = mj_e2m1_decode((uint8_t)c);
        CHECK(v == k_e2m1[c] && !!signbit(v) == !!signbit(k_e2m1[c]), "e2m1 code %d -> %g", c,
              (double)v);
    }
    /* Only the low nibble counts. */
    CHECK(mj_e2m1_decode(0xF7) == 6.0f, "high nibble ignored");
}

static void test_e4m3_decode(void) {
    for (int b = 0; b < 256; b++) {
        float v = mj_e4m3_decode((uint8_t)b);
        double want = ref_e4m3(b);
        if (isnan(want))
            CHECK(isnan(v), "e4m3 0x%02X should be NaN, got %g", b, (double)v);
        else
            CHECK((double)v == want && !!signbit(v) == !!signbit(want),
                  "e4m3 0x%02X -> %.9g want %.9g", b, (double)v, want);
    }
    CHECK(mj_e4m3_decode(0x7E) == 448.0f, "max");
    CHECK(mj_e4m3_decode(0x38) == 1.0f, "one");
    CHECK(mj_e4m3_decode(0x01) == 0x1p-9f, "smallest subnormal");
    CHECK(mj_e4m3_decode(0x08) == 0x1p-6f, "smallest normal");
    CHECK(mj_e4m3_decode(0xFE) == -448.0f, "-max");
}

/* ---------------------------------------------------------------------------------------
 * E2M1 encode
 * ------------------------------------------------------------------------------------- */

static void test_e2m1_encode(void) {
    /* Each midpoint between magnitude codes c and c+1, and the code a tie goes to (even). */
    static const struct { float mid; int lo, tie; } k_mids[7] = {
        {0.25f, 0, 0}, {0.75f, 1, 2}, {1.25f, 2, 2}, {1.75f, 3, 4},
        {2.5f, 4, 4},  {3.5f, 5, 6},  {5.0f, 6, 6},
    };
    for (int i = 0; i < 7; i++) {
        float mid = k_mids[i].mid;
        int lo = k_mids[i].lo, tie = k_mids[i].tie;
        CHECK(mj_e2m1_encode(mid) == tie, "e2m1(%g) = %d want %d", (double)mid,
              mj_e2m1_encode(mid), tie);
        CHECK(mj_e2m1_encode(nextafterf(mid, 0.0f)) == lo, "just below %g", (double)mid);
        CHECK(mj_e2m1_encode(nextafterf(mid, INFINITY)) == lo + 1, "just above %g", (double)mid);
        CHECK(mj_e2m1_encode(-mid) == (8 | tie), "e2m1(-%g)", (double)mid);
        CHECK(mj_e2m1_encode(-nextafterf(mid, 0.0f)) == (8 | lo), "just above -%g", (double)mid);
        CHECK(mj_e2m1_encode(-nextafterf(mid, INFINITY)) == (8 | (lo + 1)), "just below -%g",
              (double)mid);
    }
    /* Every value encodes to its own code. */
    for (int c = 0; c < 16; c++) CHECK(mj_e2m1_encode(k_e2m1[c]) == c, "exact value of code %d", c);
    /* Saturation. */
    CHECK(mj_e2m1_encode(7.0f) == 7, "7 -> 6");
    CHECK(mj_e2m1_encode(6.5f) == 7, "6.5 -> 6");
    CHECK(mj_e2m1_encode(1e30f) == 7, "1e30 -> 6");
    CHECK(mj_e2m1_encode(FLT_MAX) == 7, "FLT_MAX -> 6");
    CHECK(mj_e2m1_encode(INFINITY) == 7, "Inf -> 6");
    CHECK(mj_e2m1_encode(-7.0f) == 15, "-7 -> -6");
    CHECK(mj_e2m1_encode(-INFINITY) == 15, "-Inf -> -6");
    /* Signs of zero: the code's sign bit is x's (cvt.rn.satfinite; templates/prelude_fp.h). */
    CHECK(mj_e2m1_encode(0.0f) == 0, "+0");
    CHECK(mj_e2m1_encode(-0.0f) == 8, "-0.0 -> code 8");
    CHECK(mj_e2m1_encode(-0.1f) == 8, "-0.1 -> code 8");
    CHECK(mj_e2m1_encode(-1e-30f) == 8, "tiny negative -> code 8");
    CHECK(mj_e2m1_encode(-FLT_TRUE_MIN) == 8, "smallest negative -> code 8");
    CHECK(mj_e2m1_encode(-0.25f) == 8, "-0.25 tie -> code 8");
    CHECK(mj_e2m1_encode(FLT_TRUE_MIN) == 0, "smallest positive -> 0");

    /* A sweep against the brute-force reference: every float bit pattern in [0, 8) with a
     * stride, both signs. */
    int bad = 0;
    const uint32_t top = mj_f32_bits(8.0f);
    for (uint32_t u = 0; u < top; u += 4093) {
        const float x = mj_f32_from_bits(u);
        if (mj_e2m1_encode(x) != ref_e2m1_encode(x)) bad++;
        if (mj_e2m1_encode(-x) != ref_e2m1_encode(-x)) bad++;
    }
    CHECK(bad == 0, "%d sweep values disagree with the reference", bad);
}

/* ---------------------------------------------------------------------------------------
 * E4M3 encode
 * ------------------------------------------------------------------------------------- */

static void test_e4m3_roundtrip(void) {
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F) continue; /* NaN */
        uint8_t back = mj_e4m3_encode(mj_e4m3_decode((uint8_t)b));
        if (back != b) {
            bad++;
            fprintf(stderr, "e4m3 0x%02X -> %g -> 0x%02X\n", b, (double)mj_e4m3_decode((uint8_t)b),
                    back);
        }
    }
    /* 254 finite bytes; -0 (0x80) round-trips too because the encoder takes the sign bit of
     * the float (a -0.0 input gives 0x80), as a float -> float8 cast does. */
    CHECK(bad == 0, "%d of 254 finite bytes do not round-trip", bad);
    CHECK(mj_e4m3_encode(-0.0f) == 0x80, "-0.0 -> 0x80");
    CHECK(mj_e4m3_encode(0.0f) == 0x00, "+0.0 -> 0x00");
}

static void test_e4m3_midpoints(void) {
    int bad = 0;
    for (int c = 0; c < 126; c++) {
        /* Adjacent values have at most 4 significant bits, so the midpoint is exact. */
        float lo = (float)g_e4m3_mag[c], hi = (float)g_e4m3_mag[c + 1];
        float mid = (lo + hi) * 0.5f;
        CHECK((double)mid == (g_e4m3_mag[c] + g_e4m3_mag[c + 1]) / 2, "midpoint exact");
        int tie = (c & 1) ? c + 1 : c;
        uint8_t got = mj_e4m3_encode(mid);
        if (got != tie) {
            bad++;
            fprintf(stderr, "e4m3(%.9g) tie = 0x%02X want 0x%02X\n", (double)mid, got, tie);
        }
        if (mj_e4m3_encode(nextafterf(mid, 0.0f)) != c) bad++;
        if (mj_e4m3_encode(nextafterf(mid, INFINITY)) != c + 1) bad++;
        if (mj_e4m3_encode(-mid) != (0x80 | tie)) bad++;
        if (mj_e4m3_encode(-nextafterf(mid, 0.0f)) != (0x80 | c)) bad++;
        if (mj_e4m3_encode(-nextafterf(mid, INFINITY)) != (0x80 | (c + 1))) bad++;
        /* Values themselves, and one ulp either side of them. */
        if (mj_e4m3_encode(hi) != c + 1) bad++;
        if (mj_e4m3_encode(nextafterf(hi, 0.0f)) != c + 1) bad++;
        if (mj_e4m3_encode(nextafterf(hi, INFINITY)) != c + 1) bad++;
    }
    CHECK(bad == 0, "%d midpoint / neighbour cases wrong", bad);
    /* A few ties written out: 1.0625 between 1.0 (0x38) and 1.125 (0x39) goes to 0x38;
     * 1.1875 between 0x39 and 0x3A goes to 0x3A; 1.9375 between 1.875 (0x3F) and 2.0 (0x40)
     * carries into the exponent. */
    CHECK(mj_e4m3_encode(1.0625f) == 0x38, "1.0625");
    CHECK(mj_e4m3_encode(1.1875f) == 0x3A, "1.1875");
    CHECK(mj_e4m3_encode(1.9375f) == 0x40, "1.9375");
    CHECK(mj_e4m3_encode(0.3f) == 0x2A, "0.3 -> 0.3125 (0x2A)"); /* 0.3 = 1.2*2^-2 -> 1.25*2^-2 */
}

static void test_e4m3_saturation_and_subnormals(void) {
    CHECK(mj_e4m3_encode(448.0f) == 0x7E, "448");
    CHECK(mj_e4m3_encode(449.0f) == 0x7E, "449");
    CHECK(mj_e4m3_encode(464.0f) == 0x7E, "464 (tie with the NaN slot)");
    CHECK(mj_e4m3_encode(480.0f) == 0x7E, "480");
    CHECK(mj_e4m3_encode(1e9f) == 0x7E, "1e9");
    CHECK(mj_e4m3_encode(FLT_MAX) == 0x7E, "FLT_MAX");
    CHECK(mj_e4m3_encode(INFINITY) == 0x7E, "Inf");
    CHECK(mj_e4m3_encode(-449.0f) == 0xFE, "-449");
    CHECK(mj_e4m3_encode(-INFINITY) == 0xFE, "-Inf");
    CHECK(mj_e4m3_encode(400.0f) == 0x7C, "400 (tie 384/416 -> even 0x7C)");
    CHECK(mj_e4m3_encode(416.0f) == 0x7D, "416 exact (0x7D)");
    CHECK(mj_e4m3_encode(432.0f) == 0x7E, "432 (tie 416/448 -> even 0x7E)");

    CHECK(mj_e4m3_encode(0x1p-9f) == 0x01, "2^-9");
    CHECK(mj_e4m3_encode(0x1p-10f) == 0x00, "2^-10 tie -> 0");
    CHECK(mj_e4m3_encode(nextafterf(0x1p-10f, 1.0f)) == 0x01, "just above 2^-10 -> 2^-9");
    CHECK(mj_e4m3_encode(0x1.8p-10f) == 0x01, "1.5 * 2^-10 -> 2^-9");
    CHECK(mj_e4m3_encode(0x1.8p-9f) == 0x02, "1.5 * 2^-9 (tie 1/2) -> 2");
    CHECK(mj_e4m3_encode(0x1.4p-8f) == 0x02, "2.5 * 2^-9 (tie 2/3) -> 2");
    CHECK(mj_e4m3_encode(0x1.ep-7f) == 0x08, "7.5 * 2^-9 (tie 7/8) -> 8 = 2^-6");
    CHECK(mj_e4m3_encode(1e-30f) == 0x00, "tiny -> 0");
    CHECK(mj_e4m3_encode(FLT_TRUE_MIN) == 0x00, "float subnormal -> 0");
    CHECK(mj_e4m3_encode(-1e-30f) == 0x80, "tiny negative -> -0");
    CHECK(mj_e4m3_encode(-0x1p-9f) == 0x81, "-2^-9");
    CHECK(mj_e4m3_encode(-1.0f) == 0xB8, "-1");
    CHECK(mj_e4m3_encode(-3.0f) == 0xC4, "-3");

    /* A sweep of float bit patterns in [2^-20, 512) against the brute-force reference. */
    int bad = 0;
    const uint32_t u0 = mj_f32_bits(0x1p-20f), u1 = mj_f32_bits(512.0f);
    for (uint32_t u = u0; u < u1; u += 1021) {
        const float x = mj_f32_from_bits(u);
        if (mj_e4m3_encode(x) != ref_e4m3_encode(x)) {
            if (bad++ < 5)
                fprintf(stderr, "e4m3(%.9g) = 0x%02X want 0x%02X\n", (double)x,
                        mj_e4m3_encode(x), ref_e4m3_encode(x));
        }
        if (mj_e4m3_encode(-x) != ref_e4m3_encode(-x)) bad++;
    }
    CHECK(bad == 0, "%d sweep values disagree with the reference", bad);
}

/* ---------------------------------------------------------------------------------------
 * Signs of zero and saturation: the GPU's rule (cvt.rn.satfinite; templates/prelude_fp.h)
 * ------------------------------------------------------------------------------------- */

/* Both encoders: a code's sign bit is x's, so +0.0 gives +0 and -0.0 or any negative that
 * rounds to zero gives -0 (E4M3 0x80, E2M1 8); past the largest finite value, Inf included,
 * comes that value with x's sign. Then the quantizers: activations as the kernels write
 * them (gs 1: -0.0 and -0.2 give code 8; gs 2688: gs * amax / 6 saturates the scale at 448,
 * x * gs / 448 = 6x the codes of +-6 at +-6, and -0.0 stays code 8), weights as ModelOpt
 * writes them (its sign is x < 0: -0.0 gives code 0, -0.2 code 8). */
static void test_zero_signs_and_saturation(void) {
    const test_cvt_case *k = test_cvt_cases;
    for (int i = 0; i < TEST_CVT_N; i++) {
        CHECK(mj_e4m3_encode(k[i].x) == k[i].e4m3, "e4m3(%g) = 0x%02X want 0x%02X", (double)k[i].x,
              mj_e4m3_encode(k[i].x), k[i].e4m3);
        CHECK(mj_e2m1_encode(k[i].x) == k[i].e2m1, "e2m1(%g) = %d want %d", (double)k[i].x, mj_e2m1_encode(k[i].x),
              k[i].e2m1);
    }
    float x[16] = {6.0f, -0.0f, 0.0f, -0.2f, 0.2f, -6.0f};
    uint8_t q[8], sf;
    CHECK_OK(mj_nvfp4_quantize_act(x, 1, 16, 1.0f, "signs", q, &sf));
    CHECK(sf == 0x38 && q[0] == 0x87 && q[1] == 0x80 && q[2] == 0xF0 && q[3] == 0,
          "activations, gs 1: scale 0x%02X codes %02X %02X %02X %02X, want 38: 87 80 F0 00", sf, q[0], q[1], q[2],
          q[3]);
    CHECK_OK(mj_nvfp4_quantize_act(x, 1, 16, 1.0f / 2688.0f, "saturating", q, &sf));
    CHECK(sf == 0x7E && q[0] == 0x87 && q[1] == 0xA0 && q[2] == 0xF2 && q[3] == 0,
          "activations, gs 2688: scale 0x%02X codes %02X %02X %02X %02X, want 7E: 87 A0 F2 00", sf, q[0], q[1], q[2],
          q[3]);
    uint8_t w[8], wsf;
    float ws2;
    CHECK_OK(mj_nvfp4_quantize(x, 1, 16, "signs", w, &wsf, &ws2));
    CHECK(wsf == 0x7E && w[0] == 0x07 && w[1] == 0x80 && w[2] == 0xF0 && w[3] == 0,
          "weights (ModelOpt): scale 0x%02X codes %02X %02X %02X %02X, want 7E: 07 80 F0 00", wsf, w[0], w[1], w[2],
          w[3]);
}

/* ---------------------------------------------------------------------------------------
 * Weight quantization
 * ------------------------------------------------------------------------------------- */

/* A 2x32 example (two blocks a row), worked out by hand.
 *
 * amax = 2688 = 6 * 448, so weight_scale_2 = 2688 / 2688 = 1 exactly.
 *
 * Row 0, block 0: amax 2688 -> scale 2688 / 6 = 448 -> byte 0x7E; codes of W / 448:
 *    2688 -> 6 (7)    -1344 -> -3 (D)     672 -> 1.5 (3)    224 -> 0.5 (1)
 *     112 -> 0.25, tie between 0 and 0.5 -> 0 (0)           336 -> 0.75, tie -> 1.0 (2)
 *    -896 -> -2 (C)    1792 -> 4 (6)     1000 -> 2.23 -> 2 (4)   -2000 -> -4.46 -> -4 (E)
 *    2240 -> 5, tie between 4 and 6 -> 4 (6)                 2300 -> 5.13 -> 6 (7)
 *       0 -> 0 (0)     -0.0 -> 0 (0)       10 -> 0.02 -> 0 (0)     -10 -> -0 (8)
 *    bytes (low nibble first): D7 13 20 6C E4 76 00 80
 * Row 0, block 1: amax 6 -> scale 1 -> byte 0x38; codes of W itself:
 *    6 (7) 5->4 (6) -0.1->-0 (8) 1.25->1 (2) 1.75->2 (4) 2.5->2 (4) 3.5->4 (6) -6 (F)
 *    0.5 (1) 1 (2) 1.5 (3) 2 (4) 3 (5) 4 (6) -0.75->-1 (A) 0.25->0 (0)
 *    bytes: 67 28 44 F6 21 43 65 0A
 * Row 1, block 0: all zero -> scale 0 replaced by 1.0 (0x38), codes 0.
 * Row 1, block 1: amax 0.06 -> scale 0.01 -> E4M3 subnormal 0.01 * 512 = 5.12 -> 5, byte 0x05
 *    (5/512 = 0.009765625); codes of W / 0.009765625:
 *    0.06 -> 6.144 -> saturates to 6 (7)   -0.03 -> -3.07 -> -3 (D)   0.01 -> 1.02 -> 1 (2)
 *    bytes: D7 02 00 00 00 00 00 00
 */
static const float k_hand_w[2][32] = {
    {2688, -1344, 672, 224, 112, 336, -896, 1792, 1000, -2000, 2240, 2300, 0, -0.0f, 10, -10,
     6, 5, -0.1f, 1.25f, 1.75f, 2.5f, 3.5f, -6, 0.5f, 1, 1.5f, 2, 3, 4, -0.75f, 0.25f},
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     0.06f, -0.03f, 0.01f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const uint8_t k_hand_q[2][16] = {
    {0xD7, 0x13, 0x20, 0x6C, 0xE4, 0x76, 0x00, 0x80, /* block 0 */
     0x67, 0x28, 0x44, 0xF6, 0x21, 0x43, 0x65, 0x0A}, /* block 1 */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* block 0 */
     0xD7, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* block 1 */
};
static const uint8_t k_hand_sf[2][2] = {{0x7E, 0x38}, {0x38, 0x05}};

static void test_quantize_hand(void) {
    uint8_t q[2][16], sf[2][2];
    float ws2 = -1, deq[2][32];
    CHECK_OK(mj_nvfp4_quantize(&k_hand_w[0][0], 2, 32, "hand", &q[0][0], &sf[0][0], &ws2));
    CHECK(ws2 == 1.0f, "ws2 = %.9g want 1", (double)ws2);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 16; i++)
            CHECK(q[r][i] == k_hand_q[r][i], "weight[%d][%d] = 0x%02X want 0x%02X", r, i, q[r][i],
                  k_hand_q[r][i]);
        for (int b = 0; b < 2; b++)
            CHECK(sf[r][b] == k_hand_sf[r][b], "scale[%d][%d] = 0x%02X want 0x%02X", r, b,
                  sf[r][b], k_hand_sf[r][b]);
    }
    /* Back: e2m1 * scale * ws2, e.g. row 0 col 1 = -3 * 448 = -1344, col 8 = 2 * 448 = 896,
     * row 1 col 16 = 6 * 5/512. */
    CHECK_OK(mj_nvfp4_dequantize(&q[0][0], &sf[0][0], ws2, 2, 32, &deq[0][0]));
    CHECK(deq[0][0] == 2688.0f && deq[0][1] == -1344.0f && deq[0][8] == 896.0f, "row 0 block 0");
    CHECK(deq[0][10] == 1792.0f && deq[0][11] == 2688.0f && deq[0][4] == 0.0f, "row 0 ties");
    CHECK(deq[0][17] == 4.0f && deq[0][30] == -1.0f, "row 0 block 1");
    CHECK(deq[0][18] == 0.0f && signbit(deq[0][18]), "code 8 decodes to -0");
    CHECK(deq[1][16] == 6.0f * 0.009765625f && deq[1][17] == -3.0f * 0.009765625f,
          "row 1 block 1");
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 32; c++) {
            float want = mj_e2m1_decode((uint8_t)nibble(&q[r][0], c)) *
                         mj_e4m3_decode(sf[r][c / 16]) * ws2;
            CHECK(deq[r][c] == want, "deq[%d][%d] = %g want %g", r, c, (double)deq[r][c],
                  (double)want);
        }
}

static void test_quantize_zero(void) {
    float w[3 * 48] = {0};
    uint8_t q[3 * 24], sf[3 * 3];
    float ws2 = -1, back[3 * 48];
    memset(q, 0xAB, sizeof q);
    memset(sf, 0xAB, sizeof sf);
    CHECK_OK(mj_nvfp4_quantize(w, 3, 48, "zeros", q, sf, &ws2));
    CHECK(ws2 == 1.0f, "all-zero tensor: ws2 = %g want 1", (double)ws2);
    int bad = 0;
    for (size_t i = 0; i < sizeof q; i++) bad += q[i] != 0;
    for (size_t i = 0; i < sizeof sf; i++) bad += sf[i] != 0x38;
    CHECK(bad == 0, "zero tensor: codes 0 and scales 0x38");
    CHECK_OK(mj_nvfp4_dequantize(q, sf, ws2, 3, 48, back));
    bad = 0;
    for (int i = 0; i < 3 * 48; i++) bad += back[i] != 0.0f;
    CHECK(bad == 0, "zero tensor dequantizes to zeros");

    /* One nonzero block among zero blocks, and a block too small for E4M3 (its scale is
     * clamped to the smallest subnormal, 0x01, as ModelOpt does; this one's codes are 0). */
    w[16 + 3] = -5.0f; /* row 0, block 1 */
    w[48 + 0] = 1e-7f; /* row 1, block 0: 1e-7 / (6 * 5/2688) ~ 9e-6 < 2^-10 */
    CHECK_OK(mj_nvfp4_quantize(w, 3, 48, "sparse", q, sf, &ws2));
    CHECK(ws2 == 5.0f / 2688.0f, "ws2 = %.9g", (double)ws2);
    CHECK(sf[0] == 0x38 && sf[2] == 0x38 && sf[1] == 0x7E, "zero blocks keep 0x38, max 0x7E");
    CHECK(sf[3] == 0x01 && q[24] == 0x00, "underflowing block -> 0x01 and code 0: 0x%02X", sf[3]);
    CHECK(q[8 + 1] == 0xF0, "-5 at block 1 col 3 -> -6 in the high nibble: 0x%02X", q[9]);
}

/* Blocks whose scale block_amax / (6 * ws2) falls below E4M3's smallest subnormal, worked
 * out by hand as ModelOpt 0.45+ writes them: the scale is clamped to 2^-9 (byte 0x01) and
 * the codes are those of W / 2^-9 (ModelOpt <= 0.44, and moejit before, wrote the block as
 * scale 1.0 with all-zero codes, losing it). ws2 = 2688 / 2688 = 1 exactly.
 *   block 0: 2688 -> scale 448 (0x7E), code of 6: 0x07
 *   block 1: amax 2e-3 -> scale 3.3e-4 < 2^-9 -> 0x01; x * 512: 0.512 -> 0.5 (1),
 *            -1.024 -> -1 (0xA), 0.256 -> 0.5 (1), 0, -0.0 -> +0 (0), 0.6144 -> 0.5 (1)
 *   block 2: amax 5.4e-3 -> scale 9e-4 (would round to 0x00) -> 0x01; 2.7648 -> 3 (5),
 *            -2.7648 -> -3 (0xD)
 *   block 3: amax 0.017578125 -> scale 3 * 2^-10, a tie between 0x01 and 0x02 -> 0x02 (even,
 *            no clamp); x * 256 = 4.5 -> 4 (6) */
static void test_quantize_underflow(void) {
    float w[64] = {0};
    w[0] = 2688.0f;
    w[16] = 1e-3f, w[17] = -2e-3f, w[18] = 5e-4f, w[19] = 0.0f, w[20] = -0.0f, w[21] = 1.2e-3f;
    w[32] = 5.4e-3f, w[33] = -5.4e-3f;
    w[48] = 0.017578125f;
    uint8_t q[32], sf[4];
    float ws2 = 0;
    CHECK_OK(mj_nvfp4_quantize(w, 1, 64, "underflow", q, sf, &ws2));
    static const uint8_t want_sf[4] = {0x7E, 0x01, 0x01, 0x02};
    static const uint8_t want_q[32] = {0x07, 0, 0, 0, 0, 0, 0, 0, 0xA1, 0x01, 0x10, 0, 0, 0, 0, 0,
                                       0xD5, 0, 0, 0, 0, 0, 0, 0, 0x06, 0, 0, 0, 0, 0, 0, 0};
    CHECK(ws2 == 1.0f, "ws2 = %.9g", (double)ws2);
    for (int b = 0; b < 4; b++) CHECK(sf[b] == want_sf[b], "block %d scale 0x%02X, want 0x%02X", b, sf[b], want_sf[b]);
    for (int i = 0; i < 32; i++) CHECK(q[i] == want_q[i], "byte %d: 0x%02X, want 0x%02X", i, q[i], want_q[i]);
    /* And back: the tiny block is kept, not flushed. */
    float back[64];
    CHECK_OK(mj_nvfp4_dequantize(q, sf, ws2, 1, 64, back));
    CHECK(back[16] == 0x1p-10f && back[17] == -0x1p-9f && back[32] == 3.0f * 0x1p-9f,
          "dequantized tiny blocks: %g %g %g", (double)back[16], (double)back[17], (double)back[32]);
}

static void test_quantize_errors(void) {
    float w[2 * 32];
    for (int i = 0; i < 64; i++) w[i] = (float)i - 20.0f;
    uint8_t q[32], sf[4];
    float ws2 = 123.0f;

    w[32 + 5] = NAN; /* row 1, col 5, flat 37 */
    memset(q, 0x5A, sizeof q);
    memset(sf, 0x5A, sizeof sf);
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "layers.3.w13", q, sf, &ws2), MJ_ERR_NONFINITE);
    const char *msg = mj_last_error();
    CHECK(strstr(msg, "layers.3.w13") && strstr(msg, "NaN") && strstr(msg, "[1, 5]") &&
              strstr(msg, "37"),
          "message names tensor and index: %s", msg);
    int touched = ws2 != 123.0f;
    for (int i = 0; i < 32; i++) touched += q[i] != 0x5A;
    for (int i = 0; i < 4; i++) touched += sf[i] != 0x5A;
    CHECK(touched == 0, "outputs untouched after NaN");

    w[32 + 5] = 0.0f;
    w[17] = -INFINITY; /* row 0, col 17 */
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "expert.7", q, sf, &ws2), MJ_ERR_NONFINITE);
    msg = mj_last_error();
    CHECK(strstr(msg, "expert.7") && strstr(msg, "Inf") && strstr(msg, "[0, 17]"),
          "Inf message: %s", msg);
    touched = ws2 != 123.0f;
    for (int i = 0; i < 32; i++) touched += q[i] != 0x5A;
    for (int i = 0; i < 4; i++) touched += sf[i] != 0x5A;
    CHECK(touched == 0, "outputs untouched after Inf");
    w[17] = 0.0f;

    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 24, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "16") != NULL, "k %% 16 message: %s", mj_last_error());
    CHECK_STATUS(mj_nvfp4_quantize(w, 0, 32, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 0, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(w, -1, 32, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(NULL, 2, 32, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "w is NULL") != NULL, "NULL message: %s", mj_last_error());
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "w", NULL, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "w", q, NULL, &ws2), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "w", q, sf, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize(w, INT64_MAX / 16, 32, "w", q, sf, &ws2), MJ_ERR_INVALID_ARG);
    CHECK(ws2 == 123.0f, "ws2 untouched by refused calls");
    /* A NULL name is allowed; the message says so. */
    w[3] = NAN;
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, NULL, q, sf, &ws2), MJ_ERR_NONFINITE);
    CHECK(strstr(mj_last_error(), "(unnamed)") != NULL, "%s", mj_last_error());
    w[3] = 0.0f;
    w[63] = NAN; /* the very last element is scanned too */
    CHECK_STATUS(mj_nvfp4_quantize(w, 2, 32, "last", q, sf, &ws2), MJ_ERR_NONFINITE);
    CHECK(strstr(mj_last_error(), "[1, 31]") != NULL, "%s", mj_last_error());
    w[63] = 0.0f;
    CHECK_OK(mj_nvfp4_quantize(w, 2, 32, "w", q, sf, &ws2));

    /* Dequantize's checks. */
    float out[64];
    for (int i = 0; i < 64; i++) out[i] = 7.0f;
    CHECK_STATUS(mj_nvfp4_dequantize(NULL, sf, ws2, 2, 32, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, NULL, ws2, 2, 32, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, ws2, 2, 32, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, ws2, 2, 40, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, ws2, 0, 32, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, NAN, 2, 32, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, INFINITY, 2, 32, out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize(q, sf, -1.0f, 2, 32, out), MJ_ERR_INVALID_ARG);
    uint8_t bad_sf[4];
    memcpy(bad_sf, sf, 4);
    bad_sf[3] = 0x7F; /* NaN scale: row 1, block 1 */
    CHECK_STATUS(mj_nvfp4_dequantize(q, bad_sf, ws2, 2, 32, out), MJ_ERR_NONFINITE);
    CHECK(strstr(mj_last_error(), "[1, 1]") != NULL, "%s", mj_last_error());
    bad_sf[3] = 0xB8; /* -1.0: not a ue4m3 */
    CHECK_STATUS(mj_nvfp4_dequantize(q, bad_sf, ws2, 2, 32, out), MJ_ERR_INVALID_ARG);
    touched = 0;
    for (int i = 0; i < 64; i++) touched += out[i] != 7.0f;
    CHECK(touched == 0, "dequantize output untouched on failure");
}

/* `s` ulps away from x (toward +Inf when s > 0). */
static float ulps_away(float x, int s) {
    for (; s > 0; s--) x = nextafterf(x, INFINITY);
    for (; s < 0; s++) x = nextafterf(x, -INFINITY);
    return x;
}

static const float k_e2m1_mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

/* The order of the float operations decides ties: W / (scale * ws2) is not always
 * W / scale / ws2 or W * (1/ws2) / scale. I search for values within a few ulps of a rounding
 * boundary where the orders disagree, and check the quantizer takes ModelOpt's. */
static void test_quantize_order(void) {
    enum { K = 32 };
    float w[2 * K] = {0};
    /* Row 0: the tensor amax, ws2 = 1013 / 2688. (1013 because with it the search below
     * finds values that each alternative order gets wrong; 1000 finds none.) */
    w[0] = 1013.0f;
    float ws2 = 1013.0f / 2688.0f, sf = 1.125f, den = sf * ws2;
    w[K] = 6.0f * den; /* row 1, block 0: scale 6*den / (6*ws2) ~ 1.125 -> byte 0x39 */
    int n = 1, beats_two_divs = 0, beats_recip = 0;
    for (int c = 0; c < 7 && n < 16; c++)
        for (int u = -24; u <= 24 && n < 16; u++) {
            float x = ulps_away(k_e2m1_mids[c] * den, u);
            uint8_t want = mj_e2m1_encode(x / den);
            int a = want != mj_e2m1_encode(x / sf / ws2);
            int b = want != mj_e2m1_encode(x * (1.0f / ws2) / sf);
            if (!a && !b) continue;
            beats_two_divs += a;
            beats_recip += b;
            w[K + n++] = x;
        }
    CHECK(beats_two_divs > 0 && beats_recip > 0, "found order-sensitive values (%d, %d)",
          beats_two_divs, beats_recip);
    uint8_t q[2 * K / 2], scales[4];
    float got_ws2 = 0;
    CHECK_OK(mj_nvfp4_quantize(w, 2, K, "order", q, scales, &got_ws2));
    CHECK(got_ws2 == ws2 && scales[2] == 0x39, "ws2 %.9g, scale 0x%02X", (double)got_ws2,
          scales[2]);
    int bad = 0;
    for (int j = 0; j < n; j++) bad += nibble(q, K + j) != mj_e2m1_encode(w[K + j] / den);
    CHECK(bad == 0, "%d of %d order-sensitive codes not W / (scale * ws2)", bad, n);
}

/* The same for activations: SF = e4m3((gs * blockmax) / 6), q = e2m1((x * gs) / SF). */
static void test_act_order(void) {
    enum { R = 9, K = 16 };
    const float input_scale = 0.3f, gs = 1.0f / input_scale;
    float x[R * K] = {0};
    /* Rows 1..8: one element each, the block max, near an E4M3 rounding boundary. */
    int rows = 1, sf_alt = 0;
    for (int c = 0x30; c < 0x48 && rows < R; c++) {
        float mid = (mj_e4m3_decode((uint8_t)c) + mj_e4m3_decode((uint8_t)(c + 1))) * 0.5f;
        for (int u = -24; u <= 24 && rows < R; u++) {
            float bmax = ulps_away(mid * 6.0f / gs, u);
            uint8_t want = mj_e4m3_encode(gs * bmax / 6.0f);
            if (want == mj_e4m3_encode(gs * (bmax / 6.0f)) &&
                want == mj_e4m3_encode(bmax / (6.0f * input_scale)))
                continue;
            sf_alt++;
            x[rows++ * K] = bmax;
        }
    }
    /* Row 0: SF = 1.125 (0x39), then values near E2M1 boundaries of (x * gs) / SF. */
    const float sf = 1.125f;
    x[0] = 6.0f * sf / gs;
    int n = 1, q_alt = 0;
    for (int c = 0; c < 7 && n < 16; c++)
        for (int u = -24; u <= 24 && n < 16; u++) {
            float v = ulps_away(k_e2m1_mids[c] * sf / gs, u);
            uint8_t want = mj_e2m1_encode((v * gs) / sf);
            if (want == mj_e2m1_encode(v * (gs / sf)) &&
                want == mj_e2m1_encode(v / (sf * input_scale)))
                continue;
            q_alt++;
            x[n++] = v;
        }
    CHECK(sf_alt > 0 && q_alt > 0, "found order-sensitive values (%d, %d)", sf_alt, q_alt);
    uint8_t q[R * K / 2], sfs[R];
    CHECK_OK(mj_nvfp4_quantize_act(x, R, K, input_scale, "order", q, sfs));
    CHECK(sfs[0] == 0x39, "row 0 scale 0x%02X", sfs[0]);
    int bad = 0;
    for (int r = 1; r < rows; r++) bad += sfs[r] != mj_e4m3_encode(gs * x[r * K] / 6.0f);
    for (int j = 0; j < n; j++) bad += nibble(q, j) != mj_e2m1_encode((x[j] * gs) / sf);
    CHECK(bad == 0, "%d order-sensitive scales / codes not as written", bad);
}

/* The error bound of the format on a random matrix: every element is within half an E2M1
 * step (at its magnitude) of its block's scale. Rows get different magnitudes so that the
 * block scales cover many E4M3 exponents. */
static void test_quantize_random(uint64_t seed) {
    enum { N = 64, K = 256, KB = K / 16 };
    float *w = malloc(sizeof(float) * N * K), *back = malloc(sizeof(float) * N * K);
    uint8_t *q = malloc(N * K / 2), *sf = malloc(N * KB);
    uint64_t st = seed;
    for (int r = 0; r < N; r++) {
        double row_scale = pow(10.0, (double)(r % 3) - 1.0); /* 0.1 .. 10 */
        for (int c = 0; c < K; c++) w[r * K + c] = (float)(mj_rng_normal(&st) * row_scale);
    }
    float ws2 = 0;
    CHECK_OK(mj_nvfp4_quantize(w, N, K, "random", q, sf, &ws2));
    CHECK_OK(mj_nvfp4_dequantize(q, sf, ws2, N, K, back));

    float amax = 0;
    for (int i = 0; i < N * K; i++) amax = fmaxf(amax, fabsf(w[i]));
    CHECK(ws2 == amax / 2688.0f, "ws2 = amax / 2688");

    int out_of_bound = 0, max_not_largest = 0, over = 0, max_scale = 0, not_as_written = 0;
    double err2 = 0, ref2 = 0;
    for (int r = 0; r < N; r++) {
        for (int b = 0; b < KB; b++) {
            const float *blk = w + r * K + b * 16;
            double unit = (double)mj_e4m3_decode(sf[r * KB + b]) * ws2; /* one E2M1 unit */
            int arg = 0;
            for (int j = 0; j < 16; j++)
                if (fabsf(blk[j]) > fabsf(blk[arg])) arg = j;
            if (sf[r * KB + b] == 0x7E) max_scale++;
            /* ModelOpt's float32 order: the byte is e4m3(amax_b / (6 * ws2)) ... */
            if (sf[r * KB + b] != mj_e4m3_encode(fabsf(blk[arg]) / (6.0f * ws2)))
                not_as_written++;
            /* The block max lands at most 6 / (1 - 2^-4) = 6.4 units (E4M3 rounds a normal
             * scale by at most 2^-4 relative): saturation costs < 1 unit. The row scales
             * above keep every block scale normal (>= 0x08). */
            if (sf[r * KB + b] < 0x08 || fabs(blk[arg]) / unit > 6.4 * (1 + 1e-6)) over++;
            int code_max = nibble(q, (int64_t)r * K + b * 16 + arg) & 7;
            for (int j = 0; j < 16; j++) {
                int64_t i = (int64_t)r * K + b * 16 + j;
                double x = w[i], y = back[i];
                double bound = e2m1_half_step(fabs(x) / unit) * unit + 1e-6 * (fabs(x) + unit);
                if (fabs(x - y) > bound && out_of_bound++ < 5)
                    fprintf(stderr, "w[%d][%d] = %.9g back %.9g bound %.3g\n", r, b * 16 + j, x, y,
                            bound);
                if ((nibble(q, i) & 7) > code_max) max_not_largest++;
                /* ... and the code is e2m1(W / (scale * ws2)), the denominator first. */
                float den = mj_e4m3_decode(sf[r * KB + b]) * ws2;
                if (nibble(q, i) != mj_e2m1_encode(w[i] / den)) not_as_written++;
                if (back[i] != (mj_e2m1_decode((uint8_t)nibble(q, i)) *
                                mj_e4m3_decode(sf[r * KB + b])) * ws2)
                    not_as_written++;
                err2 += (x - y) * (x - y);
                ref2 += x * x;
            }
        }
    }
    CHECK(out_of_bound == 0, "%d elements past the rounding bound", out_of_bound);
    CHECK(not_as_written == 0, "%d scales / codes / values differ from the formulas",
          not_as_written);
    CHECK(max_not_largest == 0, "%d elements with a larger code than their block max",
          max_not_largest);
    CHECK(over == 0, "%d blocks with a subnormal scale or a max past 6.4 units", over);
    CHECK(max_scale >= 1, "the tensor max's block has scale 448");
    double rel = sqrt(err2 / ref2);
    printf("weights %dx%d: relative L2 error %.4f\n", N, K, rel);
    CHECK(rel < 0.12, "relative L2 error %.4f >= 0.12 (NVFP4 on normal data is ~0.095)", rel);
    free(w);
    free(back);
    free(q);
    free(sf);
}

/* ---------------------------------------------------------------------------------------
 * Activation quantization
 * ------------------------------------------------------------------------------------- */

/* input_scale = 0.5, so gs = 2.
 * Row 0, block 0: blockmax 3 -> SF = e4m3(2 * 3 / 6) = 1.0 (0x38); codes of 2x:
 *    3 -> 6 (7)  1.5 -> 3 (5)  0.25 -> 0.5 (1)  -0.5 -> -1 (A)  0.125 -> 0.25 tie -> 0 (0)
 *    1.25 -> 2.5 tie -> 2 (4)  -3 -> -6 (F)  0.375 -> 0.75 tie -> 1 (2)  then eight zeros
 *    bytes: 57 A1 40 2F 00 00 00 00
 * Row 0, block 1: blockmax 0.75 -> SF = e4m3(0.25) = 0x28; codes of 2x / 0.25 = 8x:
 *    0.75 -> 6 (7)  0.1875 -> 1.5 (3)  -0.375 -> -3 (D)  0.0625 -> 0.5 (1)
 *    bytes: 37 1D 00 00 00 00 00 00
 * Row 1: zeros -> SF 0x00 (kept), codes 0.
 * Row 2, block 0: 2000 > 6 * 448 * 0.5 = 1344 saturates: SF = e4m3(666.7) = 448 (0x7E) and
 *    2 * 2000 / 448 = 8.9 -> 6 (7); 448 -> 896 / 448 = 2 (4); bytes 47 00 ...
 * Row 2, block 1: 1e-4 -> SF = e4m3(3.3e-5) = 0 (below 2^-10): codes 0 though x is not.
 */
static void test_act_hand(void) {
    float x[3][32] = {{0}};
    const float r0[32] = {3, 1.5f, 0.25f, -0.5f, 0.125f, 1.25f, -3, 0.375f, 0, 0, 0, 0, 0, 0, 0, 0,
                          0.75f, 0.1875f, -0.375f, 0.0625f};
    memcpy(x[0], r0, sizeof r0);
    x[2][0] = 2000.0f;
    x[2][1] = 448.0f;
    x[2][16] = 1e-4f;
    x[2][20] = -1e-4f;
    static const uint8_t want_q[3][16] = {
        {0x57, 0xA1, 0x40, 0x2F, 0, 0, 0, 0, 0x37, 0x1D, 0, 0, 0, 0, 0, 0},
        {0},
        {0x47, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    static const uint8_t want_sf[3][2] = {{0x38, 0x28}, {0x00, 0x00}, {0x7E, 0x00}};
    uint8_t q[3][16], sf[3][2];
    memset(q, 0xEE, sizeof q);
    CHECK_OK(mj_nvfp4_quantize_act(&x[0][0], 3, 32, 0.5f, "act", &q[0][0], &sf[0][0]));
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 16; i++)
            CHECK(q[r][i] == want_q[r][i], "act q[%d][%d] = 0x%02X want 0x%02X", r, i, q[r][i],
                  want_q[r][i]);
        for (int b = 0; b < 2; b++)
            CHECK(sf[r][b] == want_sf[r][b], "act sf[%d][%d] = 0x%02X want 0x%02X", r, b,
                  sf[r][b], want_sf[r][b]);
    }
    float back[3][32];
    CHECK_OK(mj_nvfp4_dequantize_act(&q[0][0], &sf[0][0], 3, 32, 0.5f, &back[0][0]));
    /* (e2m1 * sf) * input_scale: 6 * 1 * 0.5 = 3, -1 * 0.5 = -0.5, 6 * 0.25 * 0.5 = 0.75. */
    CHECK(back[0][0] == 3.0f && back[0][3] == -0.5f && back[0][4] == 0.0f, "row 0 block 0");
    CHECK(back[0][5] == 1.0f && back[0][7] == 0.5f, "row 0 ties");
    CHECK(back[0][16] == 0.75f && back[0][18] == -0.375f, "row 0 block 1");
    CHECK(back[2][0] == 1344.0f, "saturated to 6 * 448 * input_scale: %g", (double)back[2][0]);
    CHECK(back[2][1] == 448.0f && back[2][16] == 0.0f, "row 2");
    int bad = 0;
    for (int c = 0; c < 32; c++) bad += back[1][c] != 0.0f;
    CHECK(bad == 0, "zero row back to zeros");
}

static void test_act_roundtrip(uint64_t seed) {
    enum { R = 16, K = 512, KB = K / 16 };
    float *x = malloc(sizeof(float) * R * K), *back = malloc(sizeof(float) * R * K);
    uint8_t *q = malloc(R * K / 2), *sf = malloc(R * KB);
    uint64_t st = seed ^ 0x5EEDull;
    float amax = 0;
    for (int r = 0; r < R; r++) {
        double row_scale = pow(4.0, (double)(r % 4) - 1.0); /* 0.25 .. 16 */
        for (int c = 0; c < K; c++) {
            x[r * K + c] = (float)(mj_rng_normal(&st) * row_scale);
            amax = fmaxf(amax, fabsf(x[r * K + c]));
        }
    }
    float input_scale = amax / 2688.0f, gs = 1.0f / input_scale;
    CHECK_OK(mj_nvfp4_quantize_act(x, R, K, input_scale, "act", q, sf));
    CHECK_OK(mj_nvfp4_dequantize_act(q, sf, R, K, input_scale, back));
    int out_of_bound = 0, zero_bad = 0, not_as_written = 0;
    double err2 = 0, ref2 = 0;
    for (int r = 0; r < R; r++)
        for (int b = 0; b < KB; b++) {
            double s = mj_e4m3_decode(sf[r * KB + b]);
            float bmax = 0;
            for (int j = 0; j < 16; j++) bmax = fmaxf(bmax, fabsf(x[r * K + b * 16 + j]));
            /* SF = e4m3(gs * blockmax / 6), evaluated left to right in float. */
            if (sf[r * KB + b] != mj_e4m3_encode(gs * bmax / 6.0f)) not_as_written++;
            for (int j = 0; j < 16; j++) {
                int64_t i = (int64_t)r * K + b * 16 + j;
                double v = x[i], y = back[i];
                if (s == 0.0) { /* flushed block: only when gs * |x| / 6 <= 2^-10 */
                    zero_bad += y != 0.0 || fabs(v) * gs / 6.0 > 0x1p-10 * (1 + 1e-6);
                    continue;
                }
                /* q = e2m1((x * gs) / SF); back = (e2m1(q) * SF) * input_scale. */
                int code = nibble(q, i);
                if (code != mj_e2m1_encode((x[i] * gs) / (float)s)) not_as_written++;
                if (back[i] != (mj_e2m1_decode((uint8_t)code) * (float)s) * input_scale)
                    not_as_written++;
                double unit = s * input_scale;
                double bound = e2m1_half_step(fabs(v) * gs / s) * unit + 1e-6 * (fabs(v) + unit);
                if (fabs(v - y) > bound && out_of_bound++ < 5)
                    fprintf(stderr, "x[%d][%d] = %.9g back %.9g bound %.3g\n", r, b * 16 + j, v,
                            y, bound);
                err2 += (v - y) * (v - y);
                ref2 += v * v;
            }
        }
    CHECK(out_of_bound == 0, "%d activations past the rounding bound", out_of_bound);
    CHECK(not_as_written == 0, "%d scales / codes / values differ from the formulas",
          not_as_written);
    CHECK(zero_bad == 0, "%d flushed-block elements wrong", zero_bad);
    double rel = sqrt(err2 / ref2);
    printf("activations %dx%d: relative L2 error %.4f\n", R, K, rel);
    CHECK(rel < 0.12, "relative L2 error %.4f >= 0.12 (NVFP4 on normal data is ~0.095)", rel);
    free(x);
    free(back);
    free(q);
    free(sf);
}

static void test_act_errors(void) {
    float x[2 * 16] = {0};
    uint8_t q[16], sf[2];
    memset(q, 0x33, sizeof q);
    memset(sf, 0x33, sizeof sf);
    x[16 + 9] = NAN; /* row 1, col 9 */
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, 1.0f, "hidden_in", q, sf), MJ_ERR_NONFINITE);
    CHECK(strstr(mj_last_error(), "hidden_in") && strstr(mj_last_error(), "[1, 9]"), "%s",
          mj_last_error());
    x[16 + 9] = INFINITY;
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, 1.0f, "hidden_in", q, sf), MJ_ERR_NONFINITE);
    int touched = 0;
    for (int i = 0; i < 16; i++) touched += q[i] != 0x33;
    touched += sf[0] != 0x33 || sf[1] != 0x33;
    CHECK(touched == 0, "act outputs untouched on failure");
    x[16 + 9] = 0.0f;
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, 0.0f, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, -1.0f, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, NAN, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, INFINITY, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, FLT_TRUE_MIN, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 8, 1.0f, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 0, 16, 1.0f, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(NULL, 2, 16, 1.0f, "a", q, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, 1.0f, "a", NULL, sf), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_quantize_act(x, 2, 16, 1.0f, "a", q, NULL), MJ_ERR_INVALID_ARG);
    touched = 0;
    for (int i = 0; i < 16; i++) touched += q[i] != 0x33;
    CHECK(touched == 0, "act outputs untouched by refused calls");

    float back[32];
    CHECK_OK(mj_nvfp4_quantize_act(x, 2, 16, 1.0f, "a", q, sf));
    CHECK_STATUS(mj_nvfp4_dequantize_act(q, sf, 2, 16, 0.0f, back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize_act(q, sf, 2, 17, 1.0f, back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize_act(NULL, sf, 2, 16, 1.0f, back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize_act(q, NULL, 2, 16, 1.0f, back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_nvfp4_dequantize_act(q, sf, 2, 16, 1.0f, NULL), MJ_ERR_INVALID_ARG);
    sf[1] = 0xFF;
    CHECK_STATUS(mj_nvfp4_dequantize_act(q, sf, 2, 16, 1.0f, back), MJ_ERR_NONFINITE);
}

static uint64_t g_seed;

static int setup(void) {
    g_seed = test_seed(20240607);
    init_refs();
    return 0;
}

static void case_quantize_random(void) { test_quantize_random(g_seed); }
static void case_act_roundtrip(void) { test_act_roundtrip(g_seed); }

static const test_case cases[] = {
    TEST_CASE("e2m1_decode", test_e2m1_decode),
    TEST_CASE("e4m3_decode", test_e4m3_decode),
    TEST_CASE("e2m1_encode", test_e2m1_encode),
    TEST_CASE("e4m3_roundtrip", test_e4m3_roundtrip),
    TEST_CASE("e4m3_midpoints", test_e4m3_midpoints),
    TEST_CASE("e4m3_saturation_and_subnormals", test_e4m3_saturation_and_subnormals),
    TEST_CASE("zero_signs_and_saturation", test_zero_signs_and_saturation),
    TEST_CASE("quantize_hand", test_quantize_hand),
    TEST_CASE("quantize_zero", test_quantize_zero),
    TEST_CASE("quantize_underflow", test_quantize_underflow),
    TEST_CASE("quantize_errors", test_quantize_errors),
    TEST_CASE("quantize_order", test_quantize_order),
    TEST_CASE("quantize_random", case_quantize_random),
    TEST_CASE("act_hand", test_act_hand),
    TEST_CASE("act_roundtrip", case_act_roundtrip),
    TEST_CASE("act_order", test_act_order),
    TEST_CASE("act_errors", test_act_errors),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, NULL); }
