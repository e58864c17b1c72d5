/* fuzz_config.c — the model config reader, mj_moe_config_parse (runtime/weights/config.c).
 *
 * Input: config.json's text, optionally a NUL byte and hf_quant_config.json's text (no NUL:
 * no quantization file, the quantization comes from config.json itself).
 *
 * Invariants:
 *   - failure: a parse/config/unsupported status (or out of memory), a message, and *cfg
 *     untouched;
 *   - success: the config passes mj_moe_config_validate; quantization is NVFP4 with group 16
 *     or none with group 0, and always NVFP4 when a quantization file was given;
 *   - the same text parses to the same bytes again (no state between calls);
 *   - a config the reader accepts is one the CPU reference router accepts: routing two
 *     tokens (plain top-k) succeeds with k distinct experts each and finite weights, which
 *     sum to routed_scaling_factor when norm_topk_prob.
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>

#define ROUTE_MAX_E 512 /* route only configs this small: the reference allocates O(E) */

static void check_routes(const mj_moe_config *c, const uint8_t *data, size_t size) {
    mj_route_params p;
    FUZZ_CHECK(mj_route_params_from_config(c, &p) == MJ_OK, "route params from a valid config");
    if (c->n_experts > ROUTE_MAX_E) return;
    enum { B = 2 };
    const int32_t E = c->n_experts, k = c->topk;
    float *logits = malloc(sizeof(float) * B * (size_t)E), *bias = malloc(sizeof(float) * (size_t)E);
    float *w = malloc(sizeof(float) * B * (size_t)k);
    int32_t *ids = malloc(sizeof(int32_t) * B * (size_t)k), nsel[B];
    if (!logits || !bias || !w || !ids) abort();
    /* Logits from the input's bytes (small, finite), so different inputs route differently. */
    for (int32_t i = 0; i < B * E; i++)
        logits[i] = size ? (float)(int8_t)data[(size_t)i % size] / 16.0f : 0.0f;
    for (int32_t e = 0; e < E; e++) bias[e] = (float)(e % 7) / 64.0f;
    mj_status st = mj_route_ref(&p, logits, c->has_correction_bias ? bias : NULL, B, B, ids, w, nsel, NULL);
    FUZZ_CHECK(st == MJ_OK, "the reference router refuses a config the reader accepted (E=%d k=%d "
               "n_group=%d topk_group=%d)", E, k, c->n_group, c->topk_group);
    for (int b = 0; b < B; b++) {
        FUZZ_CHECK(nsel[b] == k, "token %d got %d experts, top-k is %d", b, nsel[b], k);
        double sum = 0;
        for (int32_t j = 0; j < k; j++) {
            int32_t id = ids[b * k + j];
            FUZZ_CHECK(id >= 0 && id < E, "expert id %d of %d", id, E);
            for (int32_t j2 = 0; j2 < j; j2++) FUZZ_CHECK(ids[b * k + j2] != id, "expert %d twice", id);
            float wt = w[b * k + j];
            FUZZ_CHECK(isfinite(wt) && wt >= 0.0f, "weight %g", (double)wt);
            sum += wt;
        }
        if (c->norm_topk_prob) {
            double rsf = c->routed_scaling_factor;
            /* Relative, plus each weight's rounding where they are subnormal (a tiny rsf). */
            FUZZ_CHECK(fabs(sum - rsf) <= 1e-4 * rsf + k * (double)FLT_TRUE_MIN,
                       "renormalized weights sum to %g, not %g", sum, rsf);
        }
    }
    free(logits), free(bias), free(w), free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    size_t cfg_len = strlen(text);
    const char *quant = cfg_len < size ? text + cfg_len + 1 : NULL;

    mj_moe_config c, again;
    memset(&c, 0xA5, sizeof c);
    mj_clear_error();
    mj_status st = mj_moe_config_parse(text, quant, "fuzz/config.json", &c);
    if (st != MJ_OK) {
        FUZZ_CHECK(st == MJ_ERR_PARSE || st == MJ_ERR_CONFIG || st == MJ_ERR_UNSUPPORTED || st == MJ_ERR_NOMEM,
                   "failed with %s", mj_status_string(st));
        FUZZ_CHECK(mj_last_error()[0] != '\0', "failure without a message");
        FUZZ_CHECK(fuzz_all_bytes(&c, sizeof c, 0xA5), "failure wrote to *cfg");
        memset(&again, 0xA5, sizeof again);
        FUZZ_CHECK(mj_moe_config_parse(text, quant, "fuzz/config.json", &again) == st, "not deterministic");
        free(text);
        return 0;
    }
    FUZZ_CHECK(mj_moe_config_validate(&c, 0) == MJ_OK, "accepted an invalid config: %s", mj_last_error());
    FUZZ_CHECK(c.quant == MJ_QUANT_NVFP4 || c.quant == MJ_QUANT_NONE, "quant %d", (int)c.quant);
    FUZZ_CHECK(c.quant_group_size == (c.quant == MJ_QUANT_NVFP4 ? MJ_NVFP4_GROUP : 0), "group size %d for quant %d",
               (int)c.quant_group_size, (int)c.quant);
    FUZZ_CHECK(!quant || c.quant == MJ_QUANT_NVFP4, "a quantization file that is not NVFP4 was accepted");
    FUZZ_CHECK(c.topk >= 1 && c.topk <= c.n_experts, "topk %d of %d", (int)c.topk, (int)c.n_experts);
    memset(&again, 0x5A, sizeof again);
    FUZZ_CHECK(mj_moe_config_parse(text, quant, "fuzz/config.json", &again) == MJ_OK, "not deterministic");
    FUZZ_CHECK(memcmp(&c, &again, sizeof c) == 0, "two parses of one text differ");
    check_routes(&c, data, size);
    free(text);
    return 0;
}
