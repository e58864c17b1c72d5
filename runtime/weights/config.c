/* config.c — the MoE layer's shape, read from a Hugging Face checkpoint's JSON.
 *
 * A checkpoint directory carries the model's shape in config.json and, for ModelOpt NVFP4
 * exports, the quantization in hf_quant_config.json (older exports) or in a
 * `quantization_config` object inside config.json (newer ones). We only need the fields
 * that decide the MoE layer: sizes (hidden_size, moe_intermediate_size), the expert count
 * and top-k, the routing recipe (scoring_func, n_group/topk_group, routed_scaling_factor,
 * norm_topk_prob, topk_method) and the activation, under the names and with the defaults of
 * the model's family (k_families below: Mixtral's num_local_experts and intermediate_size, a
 * router that always renormalizes, ...). Everything else is ignored.
 *
 * Three rules shape the code:
 *   1. Be strict about types. A size written as "6144", 6144.5, true or -1 is a broken
 *      config, not something to guess at; the error names the file, the field and what
 *      was expected, so the user can fix the file.
 *   2. Fill a local struct and copy it to the caller only when everything — parsing and
 *      mj_moe_config_validate — has succeeded, so *cfg is never half-written.
 *   3. "Quantized with something else" is not "unquantized": a config whose
 *      quantization_config says FP8 fails with MJ_ERR_UNSUPPORTED instead of being read
 *      as a bf16 model.
 */
#include "base.h"
#include "file.h"
#include "weights/family.h"

#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* The NVFP4 path's one-line requirement, repeated in several messages. */
#define MJ_NVFP4_WHAT "moejit runs NVFP4 (ModelOpt) checkpoints"

/* A config.json is a few kilobytes; refuse to slurp something that clearly is not one. */
#define MJ_CONFIG_MAX_BYTES (64u << 20)

/* ---------------------------------------------------------------------------------------
 * Error helpers
 * ------------------------------------------------------------------------------------- */

/* Record "label: message" (or just the message when label is NULL) and return s. */
static mj_status fail(mj_status s, const char *label, const char *fmt, ...) MJ_PRINTF(3, 4);
static mj_status fail(mj_status s, const char *label, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (label) return mj_set_error(s, "%s: %s", label, msg);
    return mj_set_error(s, "%s", msg);
}

/* A short description of a JSON value for "got ..." in messages. */
static void describe(const json_t *v, char *buf, size_t n) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: snprintf(buf, n, "an object"); break;
    case JSON_ARRAY: snprintf(buf, n, "an array"); break;
    case JSON_STRING: snprintf(buf, n, "the string \"%.40s\"", json_string_value(v)); break;
    case JSON_INTEGER: snprintf(buf, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, n, "%.10g", json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, n, "true"); break;
    case JSON_FALSE: snprintf(buf, n, "false"); break;
    case JSON_NULL: snprintf(buf, n, "null"); break;
    default: snprintf(buf, n, "an unknown JSON value"); break;
    }
}

/* ASCII case-insensitive equality ("NVFP4" == "nvfp4"). */
static int str_ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char ca = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
        char cb = (*b >= 'A' && *b <= 'Z') ? (char)(*b - 'A' + 'a') : *b;
        if (ca != cb) return 0;
    }
    return *a == *b;
}

/* ---------------------------------------------------------------------------------------
 * Typed field readers. `label` names the file, `field` the key as the user would write it
 * (possibly dotted, "quantization_config.group_size"). Absent or null optional fields take
 * their default; a required field that is absent is "missing".
 * ------------------------------------------------------------------------------------- */

enum { OPTIONAL = 0, REQUIRED = 1 };

/* An integer >= min (min is 0 or 1) that fits int32. */
static mj_status get_int(const json_t *obj, const char *key, const char *field, int required,
                         int32_t min, int32_t dflt, const char *label, int32_t *out) {
    const json_t *v = json_object_get(obj, key);
    const char *kind = min > 0 ? "a positive integer" : "a non-negative integer";
    char got[96];
    if (!v || (json_is_null(v) && !required)) {
        if (required) return fail(MJ_ERR_CONFIG, label, "missing field '%s' (integer)", field);
        *out = dflt;
        return MJ_OK;
    }
    if (!json_is_integer(v)) {
        describe(v, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label, "field '%s' must be %s, got %s", field, kind, got);
    }
    json_int_t x = json_integer_value(v);
    if (x > INT32_MAX)
        return fail(MJ_ERR_CONFIG, label,
                    "field '%s' must be %s, got %" JSON_INTEGER_FORMAT
                    ", which does not fit a 32-bit integer",
                    field, kind, x);
    if (x < min)
        return fail(MJ_ERR_CONFIG, label, "field '%s' must be %s, got %" JSON_INTEGER_FORMAT,
                    field, kind, x);
    *out = (int32_t)x;
    return MJ_OK;
}

/* A string, or dflt when absent/null. The pointer lives as long as the JSON document. */
static mj_status get_string(const json_t *obj, const char *key, const char *field,
                            const char *dflt, const char *label, const char **out) {
    const json_t *v = json_object_get(obj, key);
    char got[96];
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MJ_OK;
    }
    if (!json_is_string(v)) {
        describe(v, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label, "field '%s' must be a string, got %s", field, got);
    }
    *out = json_string_value(v);
    return MJ_OK;
}

/* true/false, or dflt when absent/null. */
static mj_status get_bool(const json_t *obj, const char *key, const char *field, int dflt,
                          const char *label, int32_t *out) {
    const json_t *v = json_object_get(obj, key);
    char got[96];
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MJ_OK;
    }
    if (!json_is_boolean(v)) {
        describe(v, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label, "field '%s' must be true or false, got %s", field,
                    got);
    }
    *out = json_is_true(v) ? 1 : 0;
    return MJ_OK;
}

/* A positive number (integer or real) that a float can hold, or dflt when absent/null. */
static mj_status get_pos_float(const json_t *obj, const char *key, const char *field,
                               float dflt, const char *label, float *out) {
    const json_t *v = json_object_get(obj, key);
    char got[96];
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MJ_OK;
    }
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x > 0.0 && x <= FLT_MAX)) { /* also rejects non-numbers (NAN above) */
        describe(v, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label, "field '%s' must be a positive finite number, got %s",
                    field, got);
    }
    *out = (float)x;
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * The MoE fields of config.json
 * ------------------------------------------------------------------------------------- */

/* Multimodal checkpoints nest the language model's config in "text_config". */
static const json_t *model_section(const json_t *root) {
    const json_t *text = json_object_get(root, "text_config");
    if (!json_object_get(root, "hidden_size") && json_is_object(text)) return text;
    return root;
}

/* ---------------------------------------------------------------------------------------
 * Model families
 *
 * What a family's modeling code assumes for the routing keys its config.json leaves out, how
 * its checkpoint names the MoE tensors, and the families moejit cannot run, with why. The
 * rules are read from transformers 5.25 (models/<family>/modeling_<family>.py and
 * configuration_<family>.py, the classes named in `source`) and, for DeepSeek and Kimi, from
 * the modeling_deepseek.py their config.json's auto_map names; docs/checkpoints.md cites each.
 * A model_type not listed reads with the generic defaults (softmax, greedy, no
 * renormalization, DeepSeek's tensor names): the keys decide.
 * ------------------------------------------------------------------------------------- */
const mj_ck_names mj_ck_names_default = {"mlp", {"gate_proj", "up_proj", "down_proj"}, "gate.e_score_correction_bias",
                                          "shared_experts", NULL};
static const mj_ck_names k_names_mixtral = {"block_sparse_moe", {"w1", "w3", "w2"}, "e_score_correction_bias",
                                            "shared_experts", NULL};
/* Qwen2-MoE's and Qwen3-Next's block: one shared expert, in the singular, and its gate. */
static const mj_ck_names k_names_qwen_gated = {"mlp", {"gate_proj", "up_proj", "down_proj"},
                                               "gate.e_score_correction_bias", "shared_expert", "shared_expert_gate"};

#define MJ_QWEN_GATED_ROUTING                                                                              \
    "softmax top-k, renormalized when norm_topk_prob (any top_k); the shared expert (shared_expert_intermediate_size " \
    "wide) scaled by sigmoid(x . shared_expert_gate)"
/* Llama-4's model_type at the top of its config, and its language model's in text_config. */
#define MJ_LLAMA4_REFUSED                                                                                  \
    "its router scales each token's input by the expert's score before the expert (top-1, sigmoid), "      \
    "where moejit's experts weight their outputs"
#define MJ_DEEPSEEK_ROUTING                                                                                \
    "sigmoid, e_score_correction_bias for selection, groups by their top-2 sum, renormalized when top_k > 1, " \
    "x routed_scaling_factor"
#define MJ_GLM_ROUTING                                                                                     \
    "sigmoid, e_score_correction_bias for selection, groups by their top-2 sum, renormalized (any top_k), " \
    "x routed_scaling_factor"

/* Each row: the defaults its configuration_*.py gives the routing keys, its router's rules, its
 * keys and tensor names where they are not DeepSeek's, and where the rules come from. */
#define DS_DEFAULTS .scoring = "sigmoid", .method = "noaux_tc", .norm = 1, .rsf = 2.5f, .n_group = 8, .topk_group = 4
#define GLM_DEFAULTS .scoring = "sigmoid", .method = "noaux_tc", .norm = 1, .n_group = 1, .topk_group = 1
#define SOFTMAX_DEFAULTS .scoring = "softmax", .method = "greedy", .rsf = 1.0f, .n_group = 1, .topk_group = 1
#define REFUSED_DEFAULTS .rsf = 1.0f, .n_group = 1, .topk_group = 1
static const mj_family k_families[] = {
    {.model_type = "deepseek_v3", .models = "DeepSeek-V3, DeepSeek-R1", DS_DEFAULTS, .norm_rule = MJ_NORM_KEY_TOPK_GT1,
     .routing = MJ_DEEPSEEK_ROUTING,
     .source = "DeepSeek-V3's modeling_deepseek.py MoEGate (its config.json's auto_map); transformers deepseek_v3 "
               "DeepseekV3TopkRouter, DeepseekV3Config",
     .verified = "DeepSeek-V3.json"},
    {.model_type = "kimi_k2", .models = "Kimi-K2", DS_DEFAULTS, .norm_rule = MJ_NORM_KEY_TOPK_GT1,
     .routing = MJ_DEEPSEEK_ROUTING,
     .source = "Kimi-K2's modeling_deepseek.py (DeepSeek-V3's, its auto_map); transformers kimi_k25 reads kimi_k2 as "
               "deepseek_v3",
     .verified = "Kimi-K2-Instruct.json"},
    {.model_type = "glm4_moe", .models = "GLM-4.5, GLM-4.5-Air, GLM-4.6", GLM_DEFAULTS, .rsf = 1.0f,
     .norm_rule = MJ_NORM_KEY, .routing = MJ_GLM_ROUTING,
     .source = "transformers glm4_moe Glm4MoeTopkRouter, Glm4MoeMoE, Glm4MoeConfig", .verified = "GLM-4.5-Air.json"},
    {.model_type = "glm_moe_dsa", .models = "GLM-5", GLM_DEFAULTS, .rsf = 2.5f, .norm_rule = MJ_NORM_KEY,
     .routing = MJ_GLM_ROUTING,
     .source = "transformers glm_moe_dsa GlmMoeDsaTopkRouter, GlmMoeDsaMoE, GlmMoeDsaConfig",
     .verified = "GLM-5.abridged.json"},
    {.model_type = "deepseek_v2", .models = "DeepSeek-V2, DeepSeek-V2-Lite", SOFTMAX_DEFAULTS,
     .norm_rule = MJ_NORM_KEY_TOPK_GT1,
     .routing = "softmax; greedy top-k, or group_limited_greedy (groups by their max); x routed_scaling_factor; "
                "norm_topk_prob must be false",
     .source = "transformers deepseek_v2 DeepseekV2TopkRouter, DeepseekV2Config; DeepSeek-V2's modeling_deepseek.py",
     .verified = "DeepSeek-V2-Lite.json"},
    {.model_type = "qwen3_moe", .models = "Qwen3-30B-A3B, Qwen3-235B-A22B", SOFTMAX_DEFAULTS, .norm_rule = MJ_NORM_KEY,
     .experts_key = "num_experts", .no_shared = 1,
     .routing = "softmax top-k, renormalized when norm_topk_prob (any top_k); no shared expert",
     .source = "transformers qwen3_moe Qwen3MoeTopKRouter, Qwen3MoeSparseMoeBlock, Qwen3MoeConfig",
     .verified = "Qwen3-30B-A3B.json"},
    {.model_type = "qwen2_moe", .models = "Qwen1.5-MoE, Qwen2-MoE", SOFTMAX_DEFAULTS, .norm_rule = MJ_NORM_KEY,
     .experts_key = "num_experts", .shared_key = "shared_expert_intermediate_size", .shared_width = 5632,
     .names = &k_names_qwen_gated, .routing = MJ_QWEN_GATED_ROUTING,
     .source = "transformers qwen2_moe Qwen2MoeTopKRouter, Qwen2MoeSparseMoeBlock, Qwen2MoeConfig",
     .verified = "Qwen2-57B-A14B.json"},
    {.model_type = "mixtral", .models = "Mixtral-8x7B, Mixtral-8x22B", SOFTMAX_DEFAULTS, .norm = 1,
     .norm_rule = MJ_NORM_ALWAYS, .fixed = 1, .experts_key = "num_local_experts", .width_key = "intermediate_size",
     .names = &k_names_mixtral, .routing = "softmax over all experts, top-k, always renormalized; no shared expert",
     .source = "transformers mixtral MixtralTopKRouter, MixtralSparseMoeBlock, MixtralConfig",
     .verified = "Mixtral-8x7B-v0.1.json"},
    {.model_type = "minimax_m2", .models = "MiniMax-M2, MiniMax-M2.5", .scoring = "sigmoid", .method = "noaux_tc",
     .norm = 1, .rsf = 1.0f, .n_group = 1, .topk_group = 1, .norm_rule = MJ_NORM_ALWAYS, .fixed = 1,
     .experts_key = "num_local_experts", .width_key = "intermediate_size", .bias_key = "use_routing_bias",
     .names = &k_names_mixtral,
     .routing = "sigmoid, block_sparse_moe.e_score_correction_bias for selection, the unbiased scores renormalized; "
                "no shared expert",
     .source = "transformers minimax_m2 MiniMaxM2TopKRouter, MiniMaxM2SparseMoeBlock, MiniMaxM2Config",
     .verified = "MiniMax-M2.5.abridged.json"},
    /* Qwen3NextSparseMoeBlock is Qwen2MoeSparseMoeBlock's: moejit runs the MoE layers (their
     * attention, hybrid or not, is not its concern). */
    {.model_type = "qwen3_next", .models = "Qwen3-Next-80B-A3B, its MoE layers", SOFTMAX_DEFAULTS, .norm = 1,
     .norm_rule = MJ_NORM_KEY, .experts_key = "num_experts", .shared_key = "shared_expert_intermediate_size",
     .shared_width = 512, .names = &k_names_qwen_gated, .routing = MJ_QWEN_GATED_ROUTING,
     .source = "transformers qwen3_next Qwen3NextTopKRouter, Qwen3NextSparseMoeBlock, Qwen3NextConfig",
     .verified = "Qwen3-Next-80B-A3B-Thinking.json"},
    {.model_type = "llama4", .models = "Llama-4", REFUSED_DEFAULTS,
     .source = "transformers llama4 Llama4Router, Llama4TextMoe",
     .verified = "Llama-4-Scout-17B-16E-Instruct.abridged.json", .refused = MJ_LLAMA4_REFUSED},
    {.model_type = "llama4_text", .models = "Llama-4", REFUSED_DEFAULTS,
     .source = "transformers llama4 Llama4Router, Llama4TextMoe", .verified = "", .refused = MJ_LLAMA4_REFUSED},
    {.model_type = "gpt_oss", .models = "gpt-oss", REFUSED_DEFAULTS,
     .source = "transformers gpt_oss GptOssTopKRouter, GptOssExperts", .verified = "gpt-oss-20b.json",
     .refused = "its experts have biases, a clamped SwiGLU (gate * sigmoid(1.702 gate) * (up + 1)) and MXFP4 "
                "weights; moejit's are bias-free SwiGLU in NVFP4"},
};
#undef DS_DEFAULTS
#undef GLM_DEFAULTS
#undef SOFTMAX_DEFAULTS
#undef REFUSED_DEFAULTS

const mj_family *mj_families(size_t *n) {
    *n = sizeof k_families / sizeof k_families[0];
    return k_families;
}

/* The family of a config (its model_type, or the language model's in text_config), or NULL;
 * a family moejit cannot run is refused here, before any field is read, naming the reason. */
static mj_status parse_family(const json_t *root, const json_t *m, const char *label, const mj_family **out) {
    *out = NULL;
    const json_t *types[2] = {json_object_get(root, "model_type"), json_object_get(m, "model_type")};
    for (int t = 0; t < 2; t++) {
        const char *mt = json_string_value(types[t]);
        if (!mt) continue;
        for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++) {
            const mj_family *f = &k_families[i];
            if (strcmp(mt, f->model_type) != 0) continue;
            if (f->refused)
                return fail(MJ_ERR_UNSUPPORTED, label, "model_type '%s' (%s) is not supported: %s", mt, f->models,
                            f->refused);
            if (!*out) *out = f;
        }
    }
    return MJ_OK;
}

static const json_t *model_section(const json_t *root);
static json_t *load_object(const char *text, size_t n, const char *label, mj_status *st);

mj_status mj_family_of(const char *config_text, const char *label, const mj_family **out) {
    mj_status st;
    *out = NULL;
    json_t *root = load_object(config_text, strlen(config_text), label, &st);
    if (!root) return st;
    st = parse_family(root, model_section(root), label, out);
    json_decref(root);
    return st;
}

/* Qwen2-MoE's and Qwen3-Next's shared expert: one MLP of shared_expert_intermediate_size rows
 * (the configuration class's default when the key is absent; 0: none), its output scaled by
 * sigmoid(x . shared_expert_gate) (Qwen2MoeSparseMoeBlock, Qwen3NextSparseMoeBlock). moejit
 * runs it as n_shared sub-experts of the routed experts' width, so the width must be a
 * multiple of it. Their block reads no n_shared_experts: a config that sets one contradicts
 * its model_type. */
static mj_status gated_shared(const json_t *m, const mj_family *fam, const char *label, mj_moe_config *c) {
    int32_t width = 0;
    if (c->n_shared != 0)
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "model_type '%s' (%s): field 'n_shared_experts' asks for what its MoE block does not do: it sizes "
                    "its one shared expert by '%s' and reads no such key (%s); the file contradicts its model_type",
                    fam->model_type, fam->models, fam->shared_key, fam->source);
    MJ_CHECK(get_int(m, fam->shared_key, fam->shared_key, OPTIONAL, 0, fam->shared_width, label, &width));
    if (width % c->intermediate != 0)
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "%s %d is not a multiple of moe_intermediate_size %d: moejit runs the shared expert as "
                    "sub-experts of the routed experts' width",
                    fam->shared_key, (int)width, (int)c->intermediate);
    c->n_shared = width / c->intermediate;
    c->shared_gate = width > 0;
    return MJ_OK;
}

static mj_status parse_sizes(const json_t *m, const mj_family *fam, const char *label, mj_moe_config *c) {
    /* DeepSeek/GLM call the expert count n_routed_experts, Qwen-MoE num_experts, Mixtral and
     * MiniMax num_local_experts (whose expert width is intermediate_size). */
    const char *ekey = fam && fam->experts_key ? fam->experts_key : "n_routed_experts";
    if (!fam && !json_object_get(m, ekey) && json_object_get(m, "num_experts")) ekey = "num_experts";
    const char *ikey = fam && fam->width_key ? fam->width_key : "moe_intermediate_size";
    const struct {
        const char *key;
        int required;
        int32_t min, dflt;
        int32_t *out;
    } f[] = {
        {"hidden_size", REQUIRED, 1, 0, &c->hidden},
        {ikey, REQUIRED, 1, 0, &c->intermediate},
        {ekey, REQUIRED, 1, 0, &c->n_experts},
        {"num_experts_per_tok", REQUIRED, 1, 0, &c->topk},
        {"n_shared_experts", OPTIONAL, 0, 0, &c->n_shared},
        {"n_group", OPTIONAL, 1, fam ? fam->n_group : 1, &c->n_group},
        {"topk_group", OPTIONAL, 1, fam ? fam->topk_group : 1, &c->topk_group},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        MJ_CHECK(get_int(m, f[i].key, f[i].key, f[i].required, f[i].min, f[i].dflt, label,
                         f[i].out));
    return fam && fam->shared_key ? gated_shared(m, fam, label, c) : MJ_OK;
}

/* What the family's router code does beyond the keys (c holds what the keys said):
 *   - a router that reads no routing key (Mixtral's, MiniMax-M2's) refuses a config whose keys
 *     say otherwise: following the keys would route unlike the model, ignoring them would
 *     hide a file that contradicts its model_type;
 *   - MiniMax-M2's use_routing_bias false: no selection bias;
 *   - renormalization: always (Mixtral, MiniMax-M2), or, DeepSeek-style, only when top_k > 1:
 *     at top_k 1 the one weight stays the unnormalized score. */
static mj_status family_rules(const json_t *m, const mj_family *fam, const char *label, mj_moe_config *c) {
    if (!fam) return MJ_OK;
    if (fam->fixed) {
        const int want_sigmoid = !strcmp(fam->scoring, "sigmoid"), want_bias = !strcmp(fam->method, "noaux_tc");
        int32_t shared_is = 0;
        MJ_CHECK(get_int(m, "shared_intermediate_size", "shared_intermediate_size", OPTIONAL, 0, 0, label,
                         &shared_is));
        const struct {
            int bad;
            const char *key, *does;
        } k[] = {
            {(c->scoring == MJ_SCORING_SIGMOID) != want_sigmoid, "scoring_func", want_sigmoid ? "scores with a sigmoid" : "scores with a softmax"},
            {c->has_correction_bias != want_bias, "topk_method", want_bias ? "selects with a bias (noaux_tc)" : "selects plain top-k (greedy)"},
            {!c->norm_topk_prob, "norm_topk_prob", "always renormalizes the chosen weights"},
            {c->routed_scaling_factor != 1.0f, "routed_scaling_factor", "scales the weights by nothing"},
            {c->n_group != 1, "n_group", "has no expert groups"},
            {c->n_shared != 0, "n_shared_experts", "has no shared expert"},
            {shared_is != 0, "shared_intermediate_size", "has no shared expert"},
        };
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
            if (k[i].bad)
                return fail(MJ_ERR_UNSUPPORTED, label,
                            "model_type '%s' (%s): field '%s' asks for what its router does not do: %s %s and reads "
                            "no such key; the file contradicts its model_type",
                            fam->model_type, fam->models, k[i].key, fam->source, k[i].does);
    }
    if (fam->no_shared) {
        int32_t sei = 0;
        MJ_CHECK(get_int(m, "shared_expert_intermediate_size", "shared_expert_intermediate_size", OPTIONAL, 0, 0, label,
                         &sei));
        const char *key = c->n_shared ? "n_shared_experts" : sei ? "shared_expert_intermediate_size" : NULL;
        if (key)
            return fail(MJ_ERR_UNSUPPORTED, label,
                        "model_type '%s' (%s): field '%s' sizes a shared expert, and its MoE block (%s) has no "
                        "shared expert; the file contradicts its model_type",
                        fam->model_type, fam->models, key, fam->source);
    }
    if (fam->bias_key && c->has_correction_bias) MJ_CHECK(get_bool(m, fam->bias_key, fam->bias_key, 1, label, &c->has_correction_bias));
    if (fam->norm_rule == MJ_NORM_ALWAYS) c->norm_topk_prob = 1;
    if (fam->norm_rule == MJ_NORM_KEY_TOPK_GT1 && c->topk == 1) c->norm_topk_prob = 0;
    /* DeepSeek-V2's two routers disagree on norm_topk_prob: transformers' DeepseekV2TopkRouter
     * ignores it (never renormalizes), DeepSeek's modeling_deepseek.py renormalizes. Its
     * published configs all say false, where the two agree. */
    if (!strcmp(fam->model_type, "deepseek_v2") && c->norm_topk_prob)
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "model_type 'deepseek_v2' with norm_topk_prob true is not supported: transformers' "
                    "DeepseekV2TopkRouter never renormalizes while DeepSeek's modeling_deepseek.py does (top_k > 1), "
                    "so the model's routing depends on which code runs it; DeepSeek-V2's published configs say false");
    return MJ_OK;
}

static mj_status parse_routing(const json_t *m, const mj_family *fam, const char *label, mj_moe_config *c) {
    const char *scoring, *method, *act;
    MJ_CHECK(get_string(m, "scoring_func", "scoring_func", fam && fam->scoring ? fam->scoring : "softmax", label,
                        &scoring));
    if (strcmp(scoring, "sigmoid") == 0) {
        c->scoring = MJ_SCORING_SIGMOID;
    } else if (strcmp(scoring, "softmax") == 0) {
        c->scoring = MJ_SCORING_SOFTMAX;
    } else {
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "scoring_func '%.64s' is not supported (moejit routes with 'sigmoid' or "
                    "'softmax')",
                    scoring);
    }
    MJ_CHECK(get_pos_float(m, "routed_scaling_factor", "routed_scaling_factor", fam ? fam->rsf : 1.0f, label,
                           &c->routed_scaling_factor));
    MJ_CHECK(get_bool(m, "norm_topk_prob", "norm_topk_prob", fam ? fam->norm : 0, label, &c->norm_topk_prob));
    /* topk_method decides the bias and, with n_group > 1, how a group is scored:
     *   noaux_tc             (DeepSeek-V3, GLM-5) e_score_correction_bias added to the scores
     *                        for selection; a group scores the sum of its top-2;
     *   group_limited_greedy (DeepSeek-V2) no bias; a group scores its max;
     *   greedy               (DeepSeek-V2-Lite, and the default when absent, as Qwen-MoE
     *                        configs are) no bias, no groups: plain top-k.
     * Anything else is a router we do not know: routing it as one of these would pick other
     * experts than the model was trained with, so it is refused. */
    MJ_CHECK(get_string(m, "topk_method", "topk_method", fam && fam->method ? fam->method : "greedy", label,
                        &method));
    if (strcmp(method, "noaux_tc") == 0) {
        c->has_correction_bias = 1;
        c->group_score = MJ_GROUP_SCORE_TOP2_SUM;
    } else if (strcmp(method, "group_limited_greedy") == 0) {
        c->has_correction_bias = 0;
        c->group_score = MJ_GROUP_SCORE_MAX;
    } else if (strcmp(method, "greedy") == 0) {
        /* HF's DeepSeek-V2 greedy ignores n_group; engines that apply the groups anyway
         * would route differently, so a greedy config that limits groups is ambiguous. */
        if (c->n_group > 1 && c->topk_group < c->n_group)
            return fail(MJ_ERR_UNSUPPORTED, label,
                        "topk_method 'greedy' with n_group %d and topk_group %d: greedy routing "
                        "has no group limit; set topk_method to 'group_limited_greedy' (group "
                        "score: its max) or 'noaux_tc' (sum of its top-2) to route with groups, "
                        "or topk_group to n_group",
                        (int)c->n_group, (int)c->topk_group);
        c->has_correction_bias = 0;
        c->group_score = MJ_GROUP_SCORE_TOP2_SUM; /* decides nothing without groups */
    } else {
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "topk_method '%.64s' is not supported; moejit routes with 'noaux_tc' "
                    "(DeepSeek-V3, GLM-5), 'group_limited_greedy' (DeepSeek-V2) or 'greedy' "
                    "(plain top-k, the default when the field is absent)",
                    method);
    }
    MJ_CHECK(family_rules(m, fam, label, c));
    MJ_CHECK(get_string(m, "hidden_act", "hidden_act", "silu", label, &act));
    if (strcmp(act, "silu") != 0)
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "hidden_act '%.64s' is not supported (moejit's experts are SwiGLU: 'silu')",
                    act);
    c->activation = MJ_ACT_SILU;
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * Quantization
 *
 * `desc` is the object holding quant_algo and group_size; `where` is its dotted path for
 * messages ("quantization", "quantization_config", "quantization_config.quantization"),
 * NULL when the keys sit at the top of the file.
 * ------------------------------------------------------------------------------------- */

static void field_path(char *buf, size_t n, const char *where, const char *key) {
    if (where) snprintf(buf, n, "%s.%s", where, key);
    else snprintf(buf, n, "%s", key);
}

static mj_status parse_quant_desc(const json_t *desc, const char *where, const char *label,
                                  mj_moe_config *c) {
    char field[96];
    const char *algo;
    field_path(field, sizeof field, where, "quant_algo");
    MJ_CHECK(get_string(desc, "quant_algo", field, NULL, label, &algo));
    if (!algo) return fail(MJ_ERR_CONFIG, label, "missing field '%s' (string)", field);
    if (!str_ieq(algo, "NVFP4"))
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "quantization '%.64s' (field '%s') is not supported: " MJ_NVFP4_WHAT,
                    algo, field);
    field_path(field, sizeof field, where, "group_size");
    MJ_CHECK(get_int(desc, "group_size", field, OPTIONAL, 1, MJ_NVFP4_GROUP, label,
                     &c->quant_group_size));
    /* mj_moe_config_validate checks this too; here the message can name file and field. */
    if (c->quant_group_size != MJ_NVFP4_GROUP)
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "NVFP4 with group_size %d (field '%s') is not supported: NVFP4 has one "
                    "E4M3 scale per %d elements",
                    (int)c->quant_group_size, field, MJ_NVFP4_GROUP);
    c->quant = MJ_QUANT_NVFP4;
    return MJ_OK;
}

/* hf_quant_config.json: {"producer": {...}, "quantization": {"quant_algo": ...}}. A flat
 * file (quant_algo at the top) is accepted too. */
static mj_status parse_quant_file(const json_t *root, const char *label, mj_moe_config *c) {
    const json_t *q = json_object_get(root, "quantization");
    char got[96];
    if (q && !json_is_object(q)) {
        describe(q, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label, "field 'quantization' must be an object, got %s",
                    got);
    }
    if (!q && !json_object_get(root, "quant_algo"))
        return fail(MJ_ERR_CONFIG, label,
                    "missing field 'quantization' (object with quant_algo and group_size)");
    if (q) return parse_quant_desc(q, "quantization", label, c);
    return parse_quant_desc(root, NULL, label, c);
}

/* config.json's quantization_config, flat or with a "quantization" sub-object. Absent:
 * an unquantized model. Present without quant_algo: some other quantizer (quant_method
 * "fp8", "bitsandbytes", "compressed-tensors", ...), which we refuse by name. */
static mj_status parse_quant_inline(const json_t *root, const json_t *model, const char *label,
                                    mj_moe_config *c) {
    const json_t *qc = json_object_get(root, "quantization_config");
    const char *method;
    char got[96];
    if ((!qc || json_is_null(qc)) && model != root)
        qc = json_object_get(model, "quantization_config");
    if (!qc || json_is_null(qc)) {
        c->quant = MJ_QUANT_NONE;
        c->quant_group_size = 0;
        return MJ_OK;
    }
    if (!json_is_object(qc)) {
        describe(qc, got, sizeof got);
        return fail(MJ_ERR_CONFIG, label,
                    "field 'quantization_config' must be an object, got %s", got);
    }
    const json_t *sub = json_object_get(qc, "quantization");
    if (json_is_object(sub))
        return parse_quant_desc(sub, "quantization_config.quantization", label, c);
    MJ_CHECK(get_string(qc, "quant_method", "quantization_config.quant_method", NULL, label,
                        &method));
    if (!json_object_get(qc, "quant_algo") && method && !str_ieq(method, "modelopt"))
        return fail(MJ_ERR_UNSUPPORTED, label,
                    "quantization '%.64s' (field 'quantization_config.quant_method') is not "
                    "supported: " MJ_NVFP4_WHAT,
                    method);
    return parse_quant_desc(qc, "quantization_config", label, c);
}

/* A quantization file given beside a config.json that has a quantization_config of its own:
 * both describe the same tensors, so they must agree (NVFP4 with the same group size). A
 * checkpoint that says FP8 or MXFP4 inside config.json and NVFP4 in hf_quant_config.json
 * contradicts itself; which of the two its tensors follow cannot be told from the files, so
 * it is refused naming both, rather than one silently winning. (c: what the file said.) */
static mj_status quant_agree(const json_t *root, const json_t *model, const char *cfg_label, const char *quant_label,
                             const mj_moe_config *c) {
    mj_moe_config inl;
    memset(&inl, 0, sizeof inl);
    mj_status st = parse_quant_inline(root, model, cfg_label, &inl);
    if (st == MJ_OK && inl.quant == MJ_QUANT_NONE) return MJ_OK; /* none inline: the file alone */
    if (st == MJ_OK && inl.quant == c->quant && inl.quant_group_size == c->quant_group_size) return MJ_OK;
    char why[512];
    if (st == MJ_OK) snprintf(why, sizeof why, "it says NVFP4 with group size %d", (int)inl.quant_group_size);
    else snprintf(why, sizeof why, "%s", mj_last_error());
    return mj_set_error(MJ_ERR_CONFIG,
                        "%s: the quantization_config inside it disagrees with %s (NVFP4, group size %d): [%s]. "
                        "The two describe the same tensors; fix or remove the one that is wrong",
                        cfg_label, quant_label, (int)c->quant_group_size, why);
}

/* ---------------------------------------------------------------------------------------
 * Parsing text
 * ------------------------------------------------------------------------------------- */

/* Parse JSON text of length n into an object; NULL (and the error set) on failure. */
static json_t *load_object(const char *text, size_t n, const char *label, mj_status *st) {
    json_error_t err;
    json_t *root = json_loadb(text, n, 0, &err);
    if (!root) {
        *st = fail(MJ_ERR_PARSE, label, "malformed JSON at line %d, column %d: %s", err.line,
                   err.column, err.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        char got[96];
        describe(root, got, sizeof got);
        json_decref(root);
        *st = fail(MJ_ERR_CONFIG, label, "the top level must be a JSON object, got %s", got);
        return NULL;
    }
    *st = MJ_OK;
    return root;
}

/* The common body of mj_moe_config_parse and mj_moe_config_read. quant_text may be NULL. */
static mj_status parse_texts(const char *cfg_text, size_t cfg_len, const char *cfg_label,
                             const char *quant_text, size_t quant_len, const char *quant_label,
                             mj_moe_config *out) {
    mj_moe_config c;
    mj_status st;
    json_t *quant_root = NULL;
    memset(&c, 0, sizeof c);

    json_t *root = load_object(cfg_text, cfg_len, cfg_label, &st);
    if (!root) return st;
    const json_t *model = model_section(root);
    const mj_family *fam;
    MJ_CHECK_GOTO(parse_family(root, model, cfg_label, &fam), st, done);
    MJ_CHECK_GOTO(parse_sizes(model, fam, cfg_label, &c), st, done);
    MJ_CHECK_GOTO(parse_routing(model, fam, cfg_label, &c), st, done);
    if (quant_text) {
        quant_root = load_object(quant_text, quant_len, quant_label, &st);
        if (!quant_root) goto done;
        MJ_CHECK_GOTO(parse_quant_file(quant_root, quant_label, &c), st, done);
        MJ_CHECK_GOTO(quant_agree(root, model, cfg_label, quant_label, &c), st, done);
    } else {
        MJ_CHECK_GOTO(parse_quant_inline(root, model, cfg_label, &c), st, done);
    }
    st = mj_moe_config_validate(&c, 0);
    if (st != MJ_OK) {
        if (cfg_label) mj_error_prefix(st, "%s", cfg_label);
        goto done;
    }
    *out = c;
done:
    json_decref(quant_root);
    json_decref(root);
    return st;
}

mj_status mj_moe_config_parse(const char *config_json, const char *quant_json,
                              const char *name, mj_moe_config *cfg) {
    char quant_label[512];
    if (!config_json || !cfg)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_config_parse: config_json and cfg must not be NULL");
    if (!name) name = "config.json";
    snprintf(quant_label, sizeof quant_label, "%s (quantization JSON)", name);
    return parse_texts(config_json, strlen(config_json), name, quant_json,
                       quant_json ? strlen(quant_json) : 0, quant_label, cfg);
}

/* ---------------------------------------------------------------------------------------
 * Reading files
 * ------------------------------------------------------------------------------------- */

mj_status mj_moe_config_read(const char *config_path, const char *quant_path,
                             mj_moe_config *cfg) {
    char *cfg_text = NULL, *quant_text = NULL;
    size_t cfg_len = 0, quant_len = 0;
    mj_status st;
    if (!config_path || !cfg)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_config_read: config_json_path and cfg must not be NULL");
    /* Paths the caller names: a link is followed (a Hugging Face cache snapshot's config.json
     * is one), to a regular file only (base/file.c). */
    MJ_CHECK(mj_file_read(AT_FDCWD, config_path, NULL, MJ_CONFIG_MAX_BYTES, MJ_FILE_FOLLOW, &cfg_text, &cfg_len));
    if (quant_path)
        MJ_CHECK_GOTO(mj_file_read(AT_FDCWD, quant_path, NULL, MJ_CONFIG_MAX_BYTES, MJ_FILE_FOLLOW, &quant_text,
                                   &quant_len),
                      st, done);
    st = parse_texts(cfg_text, cfg_len, config_path, quant_text, quant_len,
                     quant_path ? quant_path : "", cfg);
done:
    free(quant_text);
    free(cfg_text);
    return st;
}

/* ---------------------------------------------------------------------------------------
 * GLM-5 and validation
 * ------------------------------------------------------------------------------------- */

mj_status mj_moe_config_glm5(mj_moe_config *cfg) {
    if (!cfg) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_config_glm5: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    cfg->hidden = 6144;
    cfg->intermediate = 2048;
    cfg->n_experts = 256;
    cfg->topk = 8;
    cfg->n_shared = 1;
    cfg->n_group = 1;
    cfg->topk_group = 1;
    cfg->scoring = MJ_SCORING_SIGMOID;
    cfg->routed_scaling_factor = 2.5f;
    cfg->norm_topk_prob = 1;
    cfg->has_correction_bias = 1;
    cfg->group_score = MJ_GROUP_SCORE_TOP2_SUM; /* noaux_tc */
    cfg->activation = MJ_ACT_SILU;
    cfg->quant = MJ_QUANT_NVFP4;
    cfg->quant_group_size = MJ_NVFP4_GROUP;
    return MJ_OK;
}

/* Sizes and routing: is the layer possible at all? Messages use config.json's names. */
static mj_status validate_shape(const mj_moe_config *c) {
    const struct { const char *name; int32_t v; } pos[] = {
        {"hidden_size", c->hidden},
        {"moe_intermediate_size", c->intermediate},
        {"n_routed_experts", c->n_experts},
        {"num_experts_per_tok", c->topk},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return fail(MJ_ERR_CONFIG, NULL, "%s %d must be positive", pos[i].name,
                        (int)pos[i].v);
    if (c->n_shared < 0)
        return fail(MJ_ERR_CONFIG, NULL, "n_shared_experts %d must not be negative",
                    (int)c->n_shared);
    if (c->topk > c->n_experts)
        return fail(MJ_ERR_CONFIG, NULL, "num_experts_per_tok %d exceeds n_routed_experts %d",
                    (int)c->topk, (int)c->n_experts);
    if (c->n_group < 1)
        return fail(MJ_ERR_CONFIG, NULL, "n_group %d must be at least 1 (1: no group limit)",
                    (int)c->n_group);
    if (c->n_experts % c->n_group != 0)
        return fail(MJ_ERR_CONFIG, NULL, "n_routed_experts %d is not divisible by n_group %d",
                    (int)c->n_experts, (int)c->n_group);
    if (c->topk_group < 1 || c->topk_group > c->n_group)
        return fail(MJ_ERR_CONFIG, NULL, "topk_group %d must be between 1 and n_group %d",
                    (int)c->topk_group, (int)c->n_group);
    int64_t reachable = (int64_t)c->topk_group * (c->n_experts / c->n_group);
    if (reachable < c->topk)
        return fail(MJ_ERR_CONFIG, NULL,
                    "topk_group %d of n_group %d leaves %lld experts, fewer than "
                    "num_experts_per_tok %d",
                    (int)c->topk_group, (int)c->n_group, (long long)reachable, (int)c->topk);
    if (!isfinite(c->routed_scaling_factor) || !(c->routed_scaling_factor > 0.0f))
        return fail(MJ_ERR_CONFIG, NULL, "routed_scaling_factor %g must be finite and positive",
                    (double)c->routed_scaling_factor);
    return MJ_OK;
}

/* What the kernels need on top of a possible layer: aligned sizes, known enum values. */
static mj_status validate_kernel(const mj_moe_config *c) {
    if (c->hidden % MJ_DIM_ALIGN != 0)
        return fail(MJ_ERR_CONFIG, NULL,
                    "hidden_size %d is not a multiple of %d, which the FP4 MMA's K-step "
                    "(m16n8k64) needs",
                    (int)c->hidden, MJ_DIM_ALIGN);
    if (c->intermediate % MJ_DIM_ALIGN != 0)
        return fail(MJ_ERR_CONFIG, NULL,
                    "moe_intermediate_size %d is not a multiple of %d, which the FP4 MMA's "
                    "K-step (m16n8k64) needs",
                    (int)c->intermediate, MJ_DIM_ALIGN);
    if (c->scoring != MJ_SCORING_SIGMOID && c->scoring != MJ_SCORING_SOFTMAX)
        return fail(MJ_ERR_CONFIG, NULL, "scoring %d is not a valid mj_scoring (scoring_func)",
                    (int)c->scoring);
    if (c->activation != MJ_ACT_SILU)
        return fail(MJ_ERR_CONFIG, NULL,
                    "activation %d is not a valid mj_activation (hidden_act)",
                    (int)c->activation);
    if (c->norm_topk_prob != 0 && c->norm_topk_prob != 1)
        return fail(MJ_ERR_CONFIG, NULL, "norm_topk_prob %d must be 0 or 1",
                    (int)c->norm_topk_prob);
    if (c->has_correction_bias != 0 && c->has_correction_bias != 1)
        return fail(MJ_ERR_CONFIG, NULL, "has_correction_bias %d must be 0 or 1",
                    (int)c->has_correction_bias);
    if (c->shared_gate != 0 && c->shared_gate != 1)
        return fail(MJ_ERR_CONFIG, NULL, "shared_gate %d must be 0 or 1", (int)c->shared_gate);
    if (c->shared_gate && c->n_shared < 1)
        return fail(MJ_ERR_CONFIG, NULL,
                    "shared_gate 1 with n_shared %d: the gate scales the shared expert, and there is none",
                    (int)c->n_shared);
    if (c->group_score != MJ_GROUP_SCORE_TOP2_SUM && c->group_score != MJ_GROUP_SCORE_MAX)
        return fail(MJ_ERR_CONFIG, NULL,
                    "group_score %d is not a valid mj_group_score (topk_method)",
                    (int)c->group_score);
    return MJ_OK;
}

static mj_status validate_quant(const mj_moe_config *c, int require_nvfp4) {
    if (c->quant != MJ_QUANT_NONE && c->quant != MJ_QUANT_NVFP4)
        return fail(MJ_ERR_CONFIG, NULL, "quant %d is not a valid mj_quant", (int)c->quant);
    if (c->quant == MJ_QUANT_NVFP4 && c->quant_group_size != MJ_NVFP4_GROUP)
        return fail(MJ_ERR_UNSUPPORTED, NULL,
                    "NVFP4 group_size %d is not supported: NVFP4 has one E4M3 scale per %d "
                    "elements",
                    (int)c->quant_group_size, MJ_NVFP4_GROUP);
    if (require_nvfp4 && c->quant != MJ_QUANT_NVFP4)
        return fail(MJ_ERR_UNSUPPORTED, NULL,
                    "this path needs an NVFP4 checkpoint (ModelOpt quant_algo NVFP4, "
                    "group_size 16); the config has no NVFP4 quantization");
    return MJ_OK;
}

mj_status mj_moe_config_validate(const mj_moe_config *cfg, int require_nvfp4) {
    if (!cfg) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_config_validate: cfg is NULL");
    MJ_CHECK(validate_shape(cfg));
    MJ_CHECK(validate_kernel(cfg));
    return validate_quant(cfg, require_nvfp4);
}
