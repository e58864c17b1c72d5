/* test_config.c — reading a model's MoE shape from Hugging Face JSON.
 *
 * The happy paths: GLM-5's config.json with the ModelOpt hf_quant_config.json (tests/data/model)
 * gives exactly mj_moe_config_glm5; the newer layout with quantization_config inside
 * config.json, a Qwen-style config (num_experts alias, softmax defaults), a multimodal
 * one (text_config) and DeepSeek-V2's (group_limited_greedy: groups scored by their max) read
 * as they should; each topk_method sets the bias and the group score, an unknown one is
 * refused. The error paths: every malformed, missing,
 * mistyped or impossible field fails with the right status, a message naming the field,
 * and the output struct left byte-for-byte untouched.
 */
#include "base.h"
#include "test.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>

#ifndef MJ_SOURCE_DIR
#error "build with -DMJ_SOURCE_DIR=\"/path/to/repo\""
#endif

#define MODEL_DATA MJ_SOURCE_DIR "/tests/data/model/"
#define FIXTURES MJ_SOURCE_DIR "/tests/data/config/"

#define NAME "inline.json"

/* A GLM-5-like base for the inline cases (no quantization: MJ_QUANT_NONE). */
static const char k_base[] =
    "{\"hidden_size\": 6144, \"moe_intermediate_size\": 2048, \"n_routed_experts\": 256,"
    " \"num_experts_per_tok\": 8, \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1,"
    " \"topk_method\": \"noaux_tc\", \"scoring_func\": \"sigmoid\","
    " \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true, \"hidden_act\": \"silu\"}";

static const char k_quant_nvfp4[] =
    "{\"producer\": {\"name\": \"modelopt\"},"
    " \"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16}}";

/* ---- helpers -------------------------------------------------------------------------- */

/* k_base with `key` set to `val` (a JSON value stolen), or removed when val is NULL.
 * Extra pairs may follow: (key2, val2), ..., NULL. Returns malloc'd text. */
static char *with_fields(const char *key, json_t *val, ...) {
    json_error_t err;
    json_t *root = json_loads(k_base, 0, &err);
    va_list ap;
    va_start(ap, val);
    while (key) {
        if (val) json_object_set_new(root, key, val);
        else json_object_del(root, key);
        key = va_arg(ap, const char *);
        if (key) val = va_arg(ap, json_t *);
    }
    va_end(ap);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

static void fill_ab(mj_moe_config *c) { memset(c, 0xAB, sizeof *c); }

static int is_untouched(const mj_moe_config *c) {
    mj_moe_config ab;
    fill_ab(&ab);
    return memcmp(c, &ab, sizeof ab) == 0;
}

static int mentions(const char *needle) { return strstr(mj_last_error(), needle) != NULL; }

/* Parse must fail with `want`, a message naming `needle` (and the file), *cfg untouched. */
static void expect_parse_fail(const char *what, const char *cfg_json, const char *quant_json,
                              mj_status want, const char *needle) {
    mj_moe_config c;
    fill_ab(&c);
    mj_clear_error();
    mj_status s = mj_moe_config_parse(cfg_json, quant_json, NAME, &c);
    CHECK(s == want, "%s: got %s, want %s: %s", what, mj_status_string(s),
          mj_status_string(want), mj_last_error());
    CHECK(mentions(needle), "%s: error does not mention '%s': %s", what, needle,
          mj_last_error());
    CHECK(mentions(NAME), "%s: error does not name the file: %s", what, mj_last_error());
    CHECK(is_untouched(&c), "%s: output struct was written on failure", what);
}

/* Same, the text built by with_fields (freed here). */
static void expect_field_fail(const char *what, char *cfg_json, mj_status want,
                              const char *needle) {
    expect_parse_fail(what, cfg_json, NULL, want, needle);
    free(cfg_json);
}

static void expect_read_fail(const char *what, const char *cfg_path, const char *quant_path,
                             mj_status want, const char *needle) {
    mj_moe_config c;
    fill_ab(&c);
    mj_clear_error();
    mj_status s = mj_moe_config_read(cfg_path, quant_path, &c);
    CHECK(s == want, "%s: got %s, want %s: %s", what, mj_status_string(s),
          mj_status_string(want), mj_last_error());
    CHECK(mentions(needle), "%s: error does not mention '%s': %s", what, needle,
          mj_last_error());
    CHECK(is_untouched(&c), "%s: output struct was written on failure", what);
}

static void expect_validate_fail(const char *what, const mj_moe_config *c, int require,
                                 mj_status want, const char *needle) {
    mj_clear_error();
    mj_status s = mj_moe_config_validate(c, require);
    CHECK(s == want, "%s: got %s, want %s: %s", what, mj_status_string(s),
          mj_status_string(want), mj_last_error());
    CHECK(mentions(needle), "%s: error does not mention '%s': %s", what, needle,
          mj_last_error());
}

/* Every field compared, then the bytes (both structs were zeroed before filling). */
static void check_same(const char *what, const mj_moe_config *a, const mj_moe_config *b) {
    CHECK(a->hidden == b->hidden, "%s: hidden %d vs %d", what, a->hidden, b->hidden);
    CHECK(a->intermediate == b->intermediate, "%s: intermediate %d vs %d", what,
          a->intermediate, b->intermediate);
    CHECK(a->n_experts == b->n_experts, "%s: n_experts %d vs %d", what, a->n_experts,
          b->n_experts);
    CHECK(a->topk == b->topk, "%s: topk %d vs %d", what, a->topk, b->topk);
    CHECK(a->n_shared == b->n_shared, "%s: n_shared %d vs %d", what, a->n_shared, b->n_shared);
    CHECK(a->n_group == b->n_group, "%s: n_group %d vs %d", what, a->n_group, b->n_group);
    CHECK(a->topk_group == b->topk_group, "%s: topk_group %d vs %d", what, a->topk_group,
          b->topk_group);
    CHECK(a->scoring == b->scoring, "%s: scoring %d vs %d", what, a->scoring, b->scoring);
    CHECK(a->routed_scaling_factor == b->routed_scaling_factor, "%s: rsf %g vs %g", what,
          a->routed_scaling_factor, b->routed_scaling_factor);
    CHECK(a->norm_topk_prob == b->norm_topk_prob, "%s: norm_topk_prob %d vs %d", what,
          a->norm_topk_prob, b->norm_topk_prob);
    CHECK(a->has_correction_bias == b->has_correction_bias, "%s: correction bias %d vs %d",
          what, a->has_correction_bias, b->has_correction_bias);
    CHECK(a->activation == b->activation, "%s: activation %d vs %d", what, a->activation,
          b->activation);
    CHECK(a->quant == b->quant, "%s: quant %d vs %d", what, a->quant, b->quant);
    CHECK(a->quant_group_size == b->quant_group_size, "%s: group size %d vs %d", what,
          a->quant_group_size, b->quant_group_size);
    CHECK(a->shared_gate == b->shared_gate, "%s: shared_gate %d vs %d", what, a->shared_gate, b->shared_gate);
    CHECK(a->group_score == b->group_score, "%s: group_score %d vs %d", what,
          (int)a->group_score, (int)b->group_score);
    CHECK(memcmp(a, b, sizeof *a) == 0, "%s: bytes differ", what);
}

/* ---- happy paths ---------------------------------------------------------------------- */

static void test_glm5(void) {
    mj_moe_config want, got;
    memset(&want, 0, sizeof want);
    CHECK_OK(mj_moe_config_glm5(&want));
    CHECK(want.hidden == 6144 && want.intermediate == 2048 && want.n_experts == 256 &&
              want.topk == 8 && want.n_shared == 1 && want.routed_scaling_factor == 2.5f &&
              want.quant == MJ_QUANT_NVFP4 && want.quant_group_size == 16 &&
              want.has_correction_bias == 1 && want.group_score == MJ_GROUP_SCORE_TOP2_SUM,
          "mj_moe_config_glm5 values");
    CHECK_OK(mj_moe_config_validate(&want, 1));

    /* tests/data/model: config.json + hf_quant_config.json (the struct starts zeroed on both
     * sides; then 0xAB, to see every byte written). */
    memset(&got, 0, sizeof got);
    CHECK_OK(mj_moe_config_read(MODEL_DATA "glm5_moe_config.json",
                                MODEL_DATA "hf_quant_config.example.json", &got));
    check_same("shared glm5 + hf_quant_config", &got, &want);
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(MODEL_DATA "glm5_moe_config.json",
                                MODEL_DATA "hf_quant_config.example.json", &got));
    check_same("shared glm5 over 0xAB", &got, &want);

    /* Without a quantization file: the same layer, unquantized. */
    mj_moe_config none = want;
    none.quant = MJ_QUANT_NONE;
    none.quant_group_size = 0;
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(MODEL_DATA "glm5_moe_config.json", NULL, &got));
    check_same("shared glm5, no quant file", &got, &none);

    /* quantization_config inside config.json, flat (quant_method modelopt) and nested. */
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(FIXTURES "glm5_inline_quant.json", NULL, &got));
    check_same("inline quantization_config", &got, &want);
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(FIXTURES "glm5_nested_quant.json", NULL, &got));
    check_same("nested quantization_config.quantization", &got, &want);

    /* An explicit quantization file wins over what config.json says. */
    fill_ab(&got);
    CHECK_STATUS(mj_moe_config_read(FIXTURES "glm5_inline_quant.json",
                                    FIXTURES "hf_quant_fp8.json", &got),
                 MJ_ERR_UNSUPPORTED);
    CHECK(is_untouched(&got), "quant file FP8 over inline NVFP4: struct written");

    /* Inline text: the same as the files. */
    fill_ab(&got);
    CHECK_OK(mj_moe_config_parse(k_base, k_quant_nvfp4, NAME, &got));
    check_same("inline base + NVFP4", &got, &want);
    fill_ab(&got);
    CHECK_OK(mj_moe_config_parse(k_base, k_quant_nvfp4, NULL, &got)); /* name NULL is fine */
    check_same("inline base, name NULL", &got, &want);
}

static void test_other_models(void) {
    mj_moe_config c, want;

    /* Qwen3-MoE: num_experts, no scoring_func (softmax), no shared experts, no groups. */
    want = (mj_moe_config){.hidden = 2048, .intermediate = 768, .n_experts = 128, .topk = 8,
                           .n_shared = 0, .n_group = 1, .topk_group = 1,
                           .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 1, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .quant = MJ_QUANT_NONE, .quant_group_size = 0};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FIXTURES "qwen3_moe.json", NULL, &c));
    check_same("qwen3_moe", &c, &want);
    CHECK_STATUS(mj_moe_config_validate(&c, 1), MJ_ERR_UNSUPPORTED);
    CHECK(mentions("NVFP4"), "require_nvfp4 message: %s", mj_last_error());

    /* Multimodal: the MoE fields under text_config, quantization_config at the top with
     * no group_size (default 16). */
    want = (mj_moe_config){.hidden = 4096, .intermediate = 1536, .n_experts = 64, .topk = 6,
                           .n_shared = 2, .n_group = 8, .topk_group = 3,
                           .scoring = MJ_SCORING_SIGMOID, .routed_scaling_factor = 1.5f,
                           .norm_topk_prob = 0, .has_correction_bias = 1, .activation = MJ_ACT_SILU,
                           .quant = MJ_QUANT_NVFP4, .quant_group_size = 16};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FIXTURES "text_config_nvfp4.json", NULL, &c));
    check_same("text_config", &c, &want);

    /* DeepSeek-V2: group_limited_greedy, softmax, 8 groups keep 3, no bias: a group scores
     * its max. */
    want = (mj_moe_config){.hidden = 5120, .intermediate = 1536, .n_experts = 160, .topk = 6,
                           .n_shared = 2, .n_group = 8, .topk_group = 3,
                           .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 16.0f,
                           .norm_topk_prob = 0, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .quant = MJ_QUANT_NONE, .quant_group_size = 0,
                           .group_score = MJ_GROUP_SCORE_MAX};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FIXTURES "deepseek_v2.json", NULL, &c));
    check_same("deepseek_v2", &c, &want);
    mj_route_params p;
    CHECK_OK(mj_route_params_from_config(&c, &p));
    CHECK(p.group_score == MJ_GROUP_SCORE_MAX && p.n_group == 8 && p.topk_group == 3,
          "deepseek_v2 route params: group_score %d, groups %d/%d", (int)p.group_score,
          p.n_group, p.topk_group);
}

static void test_defaults_and_aliases(void) {
    mj_moe_config c;
    const char *minimal = "{\"hidden_size\": 512, \"moe_intermediate_size\": 256,"
                          " \"n_routed_experts\": 16, \"num_experts_per_tok\": 2}";
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(minimal, NULL, NAME, &c));
    CHECK(c.hidden == 512 && c.intermediate == 256 && c.n_experts == 16 && c.topk == 2,
          "minimal sizes");
    CHECK(c.n_shared == 0 && c.n_group == 1 && c.topk_group == 1, "minimal: group defaults");
    CHECK(c.scoring == MJ_SCORING_SOFTMAX && c.routed_scaling_factor == 1.0f &&
              c.norm_topk_prob == 0 && c.has_correction_bias == 0 &&
              c.group_score == MJ_GROUP_SCORE_TOP2_SUM && c.activation == MJ_ACT_SILU,
          "minimal: routing defaults");
    CHECK(c.quant == MJ_QUANT_NONE && c.quant_group_size == 0, "minimal: no quantization");

    char *t;
    /* null n_group/topk_group mean 1; so does null n_shared_experts mean 0. */
    t = with_fields("n_group", json_null(), "topk_group", json_null(), "n_shared_experts",
                    json_null(), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.n_group == 1 && c.topk_group == 1 && c.n_shared == 0, "nulls -> defaults");
    free(t);

    /* num_experts alias; n_routed_experts wins when both are present. */
    t = with_fields("n_routed_experts", NULL, "num_experts", json_integer(64), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.n_experts == 64, "num_experts alias: %d", c.n_experts);
    free(t);
    t = with_fields("num_experts", json_integer(64), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.n_experts == 256, "n_routed_experts over num_experts: %d", c.n_experts);
    free(t);

    /* routed_scaling_factor as an integer. */
    t = with_fields("routed_scaling_factor", json_integer(2), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.routed_scaling_factor == 2.0f, "integer rsf: %g", c.routed_scaling_factor);
    free(t);

    /* topk_method: only noaux_tc means a correction bias; it also says how a group is
     * scored (noaux_tc the top-2 sum, group_limited_greedy the max; greedy has no groups and
     * gets the default). With and without groups (8 of 32 experts, keep 4). */
    static const struct {
        const char *method; /* NULL: the field absent (greedy) */
        int bias;
        mj_group_score gs;
    } methods[] = {{"noaux_tc", 1, MJ_GROUP_SCORE_TOP2_SUM},
                   {"group_limited_greedy", 0, MJ_GROUP_SCORE_MAX},
                   {"greedy", 0, MJ_GROUP_SCORE_TOP2_SUM},
                   {NULL, 0, MJ_GROUP_SCORE_TOP2_SUM}};
    for (int i = 0; i < 4; i++)
        for (int grouped = 0; grouped < 2; grouped++) {
            const char *name = methods[i].method ? methods[i].method : "(absent)";
            json_t *m = methods[i].method ? json_string(methods[i].method) : NULL;
            /* greedy keeps every group (topk_group = n_group): its groups limit nothing */
            int greedy = i >= 2;
            t = grouped ? with_fields("topk_method", m, "n_group", json_integer(8), "topk_group",
                                      json_integer(greedy ? 8 : 4), NULL)
                        : with_fields("topk_method", m, NULL);
            fill_ab(&c);
            CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
            CHECK(c.has_correction_bias == methods[i].bias && c.group_score == methods[i].gs,
                  "topk_method %s (groups %d): bias %d group_score %d, want %d / %d", name,
                  c.n_group, c.has_correction_bias, (int)c.group_score, methods[i].bias,
                  (int)methods[i].gs);
            CHECK(c.n_group == (grouped ? 8 : 1), "topk_method %s: n_group %d", name, c.n_group);
            free(t);
        }

    /* A topk_method we do not know is refused, naming it and the ones we route with (it
     * used to be read as "no bias", routing whatever it is as top-2-sum groups). "gready" is
     * the misspelt default of HF's DeepseekV2Config class, which HF's router rejects too. */
    static const char *const unknown[] = {"something_else", "gready", "NOAUX_TC", ""};
    for (int i = 0; i < 4; i++) {
        char what[96];
        snprintf(what, sizeof what, "topk_method '%s'", unknown[i]);
        mj_moe_config u;
        fill_ab(&u);
        t = with_fields("topk_method", json_string(unknown[i]), NULL);
        mj_clear_error();
        CHECK_STATUS(mj_moe_config_parse(t, NULL, NAME, &u), MJ_ERR_UNSUPPORTED);
        char quoted[80];
        snprintf(quoted, sizeof quoted, "'%s'", unknown[i]);
        CHECK(mentions(quoted) && mentions("'noaux_tc'") && mentions("'group_limited_greedy'") &&
                  mentions("'greedy'") && mentions(NAME),
              "%s: %s", what, mj_last_error());
        CHECK(is_untouched(&u), "%s: output struct was written on failure", what);
        free(t);
    }
    /* greedy routing has no group limit: a greedy config that limits groups is ambiguous
     * (HF ignores the groups, engines apply them) and refused, saying what to set. */
    expect_field_fail("greedy with a group limit",
                      with_fields("topk_method", json_string("greedy"), "n_group", json_integer(8),
                                  "topk_group", json_integer(4), NULL),
                      MJ_ERR_UNSUPPORTED, "group_limited_greedy");
    expect_field_fail("absent topk_method (greedy) with a group limit",
                      with_fields("topk_method", NULL, "n_group", json_integer(8), "topk_group",
                                  json_integer(4), NULL),
                      MJ_ERR_UNSUPPORTED, "'greedy' with n_group 8 and topk_group 4");

    /* softmax, norm_topk_prob false, n_shared_experts 0. */
    t = with_fields("scoring_func", json_string("softmax"), "norm_topk_prob", json_false(),
                    "n_shared_experts", json_integer(0), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.scoring == MJ_SCORING_SOFTMAX && c.norm_topk_prob == 0 && c.n_shared == 0,
          "softmax / false / 0");
    free(t);

    /* Quantization spellings: lower-case algo, flat hf_quant file, inline default group. */
    const char *quants[] = {
        "{\"quantization\": {\"quant_algo\": \"nvfp4\", \"group_size\": 16}}",
        "{\"quant_algo\": \"NVFP4\", \"group_size\": 16}",
        "{\"quantization\": {\"quant_algo\": \"NVFP4\"}}",
    };
    for (int i = 0; i < 3; i++) {
        fill_ab(&c);
        CHECK_OK(mj_moe_config_parse(k_base, quants[i], NAME, &c));
        CHECK(c.quant == MJ_QUANT_NVFP4 && c.quant_group_size == 16, "quant spelling %d", i);
    }
    t = with_fields("quantization_config",
                    json_pack("{s:s, s:s}", "quant_method", "modelopt", "quant_algo", "NVFP4"),
                    NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.quant == MJ_QUANT_NVFP4 && c.quant_group_size == 16, "inline default group");
    free(t);
    t = with_fields("quantization_config", json_null(), NULL);
    fill_ab(&c);
    CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
    CHECK(c.quant == MJ_QUANT_NONE && c.quant_group_size == 0, "quantization_config null");
    free(t);
}

/* ---- error paths ---------------------------------------------------------------------- */

static void test_malformed(void) {
    expect_parse_fail("truncated", "{\"hidden_size\": 6144, \"moe_inter", NULL, MJ_ERR_PARSE,
                      "line 1");
    expect_parse_fail("trailing comma", "{\n  \"hidden_size\": 6144,\n}\n", NULL, MJ_ERR_PARSE,
                      "line 3");
    expect_parse_fail("trailing comma: column", "{\"hidden_size\": 6144,}", NULL, MJ_ERR_PARSE,
                      "column");
    expect_parse_fail("empty", "", NULL, MJ_ERR_PARSE, "malformed JSON");
    expect_parse_fail("top-level array", "[1, 2]", NULL, MJ_ERR_CONFIG, "object");
    expect_parse_fail("quant file malformed", k_base, "{\"quantization\": {", MJ_ERR_PARSE,
                      "quantization JSON");
    expect_parse_fail("quant file not an object", k_base, "[\"NVFP4\"]", MJ_ERR_CONFIG,
                      "object");
    expect_read_fail("truncated file", FIXTURES "truncated.json", NULL, MJ_ERR_PARSE,
                     "truncated.json");
    expect_read_fail("truncated file: line", FIXTURES "truncated.json", NULL, MJ_ERR_PARSE,
                     "line 5");
}

static void test_missing(void) {
    const char *required[] = {"hidden_size", "moe_intermediate_size", "n_routed_experts",
                              "num_experts_per_tok"};
    char what[128], needle[128];
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "missing %s", required[i]);
        snprintf(needle, sizeof needle, "missing field '%s'", required[i]);
        expect_field_fail(what, with_fields(required[i], NULL, NULL), MJ_ERR_CONFIG, needle);
    }
    /* A null required field is a type error, not a default. */
    expect_field_fail("null hidden_size", with_fields("hidden_size", json_null(), NULL),
                      MJ_ERR_CONFIG, "'hidden_size'");
    /* text_config present but without the fields: still "missing". */
    expect_parse_fail("empty text_config", "{\"text_config\": {}}", NULL, MJ_ERR_CONFIG,
                      "missing field 'hidden_size'");
}

static void test_mistyped(void) {
    const char *ints[] = {"hidden_size",      "moe_intermediate_size", "n_routed_experts",
                          "num_experts_per_tok", "n_shared_experts",    "n_group",
                          "topk_group"};
    char what[160], needle[128];
    for (int i = 0; i < 7; i++) {
        const char *k = ints[i];
        json_t *bad[] = {json_string("6144"), json_real(6144.5),     json_true(),
                         json_integer(-1),    json_integer(2147483648LL), json_pack("[i]", 8),
                         json_object()};
        const char *kinds[] = {"string", "float", "bool", "negative", "> int32", "array",
                               "object"};
        snprintf(needle, sizeof needle, "'%s'", k);
        for (int j = 0; j < 7; j++) {
            snprintf(what, sizeof what, "%s as %s", k, kinds[j]);
            expect_field_fail(what, with_fields(k, bad[j], NULL), MJ_ERR_CONFIG, needle);
        }
        /* Zero: fine for n_shared_experts, not for the others. */
        char *t = with_fields(k, json_integer(0), NULL);
        if (strcmp(k, "n_shared_experts") == 0) {
            mj_moe_config c;
            CHECK_OK(mj_moe_config_parse(t, NULL, NAME, &c));
            free(t);
        } else {
            snprintf(what, sizeof what, "%s zero", k);
            expect_field_fail(what, t, MJ_ERR_CONFIG, needle);
        }
    }
    /* The message says what was expected and what was found. */
    expect_field_fail("message wording", with_fields("hidden_size", json_real(6144.5), NULL),
                      MJ_ERR_CONFIG,
                      "field 'hidden_size' must be a positive integer, got 6144.5");
    expect_field_fail("int32 wording", with_fields("hidden_size", json_integer(2147483648LL),
                                                   NULL),
                      MJ_ERR_CONFIG, "32-bit");
    expect_field_fail("num_experts as string",
                      with_fields("n_routed_experts", NULL, "num_experts", json_string("64"),
                                  NULL),
                      MJ_ERR_CONFIG, "'num_experts'");

    /* routed_scaling_factor: a positive finite number. */
    json_t *bad_rsf[] = {json_string("2.5"), json_integer(0), json_real(-1.0), json_real(1e300),
                         json_true()};
    for (int j = 0; j < 5; j++)
        expect_field_fail("bad routed_scaling_factor",
                          with_fields("routed_scaling_factor", bad_rsf[j], NULL), MJ_ERR_CONFIG,
                          "'routed_scaling_factor'");
    /* Booleans and strings. */
    expect_field_fail("norm_topk_prob string",
                      with_fields("norm_topk_prob", json_string("true"), NULL), MJ_ERR_CONFIG,
                      "'norm_topk_prob'");
    expect_field_fail("norm_topk_prob int",
                      with_fields("norm_topk_prob", json_integer(1), NULL), MJ_ERR_CONFIG,
                      "'norm_topk_prob'");
    expect_field_fail("scoring_func int", with_fields("scoring_func", json_integer(1), NULL),
                      MJ_ERR_CONFIG, "'scoring_func'");
    expect_field_fail("topk_method int", with_fields("topk_method", json_integer(1), NULL),
                      MJ_ERR_CONFIG, "'topk_method'");
    expect_field_fail("hidden_act array", with_fields("hidden_act", json_pack("[s]", "silu"),
                                                      NULL),
                      MJ_ERR_CONFIG, "'hidden_act'");
    /* Unsupported values, named. */
    expect_field_fail("scoring tanh", with_fields("scoring_func", json_string("tanh"), NULL),
                      MJ_ERR_UNSUPPORTED, "scoring_func 'tanh'");
    expect_field_fail("hidden_act gelu", with_fields("hidden_act", json_string("gelu"), NULL),
                      MJ_ERR_UNSUPPORTED, "hidden_act 'gelu'");
}

static void test_impossible(void) {
    expect_field_fail("topk > experts",
                      with_fields("n_routed_experts", json_integer(8), "num_experts_per_tok",
                                  json_integer(9), NULL),
                      MJ_ERR_CONFIG, "num_experts_per_tok 9 exceeds n_routed_experts 8");
    expect_field_fail("experts % n_group", with_fields("n_group", json_integer(3), NULL),
                      MJ_ERR_CONFIG, "not divisible by n_group 3");
    expect_field_fail("topk_group > n_group",
                      with_fields("n_group", json_integer(8), "topk_group", json_integer(9),
                                  NULL),
                      MJ_ERR_CONFIG, "topk_group 9");
    expect_field_fail("topk_group leaves too few",
                      with_fields("n_group", json_integer(8), "topk_group", json_integer(1),
                                  "num_experts_per_tok", json_integer(40), NULL),
                      MJ_ERR_CONFIG, "topk_group 1");
    expect_field_fail("hidden 100", with_fields("hidden_size", json_integer(100), NULL),
                      MJ_ERR_CONFIG, "hidden_size 100 is not a multiple of 64");
    expect_field_fail("intermediate 1000",
                      with_fields("moe_intermediate_size", json_integer(1000), NULL),
                      MJ_ERR_CONFIG, "moe_intermediate_size 1000 is not a multiple of 64");
}

/* An hf_quant_config.json with a config.json that has a quantization_config of its own:
 * they must agree. An FP8 or MXFP4 config.json beside an NVFP4 file was read as NVFP4
 * without a word (the file silently won), in the loader, prewarm and bench alike, while
 * make-checkpoint refused the same pair. */
static void test_quant_agree(void) {
    mj_moe_config got;
    expect_read_fail("inline fp8 + NVFP4 file", FIXTURES "deepseek_fp8.json",
                     MODEL_DATA "hf_quant_config.example.json", MJ_ERR_CONFIG,
                     "the quantization_config inside it disagrees with");
    expect_read_fail("inline fp8 + NVFP4 file names the inline method", FIXTURES "deepseek_fp8.json",
                     MODEL_DATA "hf_quant_config.example.json", MJ_ERR_CONFIG, "quantization 'fp8'");
    expect_read_fail("inline fp8 + NVFP4 file names the file", FIXTURES "deepseek_fp8.json",
                     MODEL_DATA "hf_quant_config.example.json", MJ_ERR_CONFIG, "hf_quant_config.example.json");
    char *mx = with_fields("quantization_config", json_pack("{s:s}", "quant_method", "mxfp4"), NULL);
    expect_parse_fail("inline mxfp4 + NVFP4 text", mx, k_quant_nvfp4, MJ_ERR_CONFIG, "quantization 'mxfp4'");
    free(mx);
    char *fp8 = with_fields("quantization_config", json_pack("{s:s,s:i}", "quant_algo", "FP8", "group_size", 128), NULL);
    expect_parse_fail("inline quant_algo FP8 + NVFP4 text", fp8, k_quant_nvfp4, MJ_ERR_CONFIG, "disagrees");
    free(fp8);
    /* Both NVFP4 with group 16 (newer ModelOpt exports write both): fine, and the same as
     * either alone. */
    mj_moe_config want;
    CHECK_OK(mj_moe_config_read(FIXTURES "glm5_inline_quant.json", NULL, &want));
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(FIXTURES "glm5_inline_quant.json", MODEL_DATA "hf_quant_config.example.json", &got));
    check_same("inline NVFP4 + NVFP4 file", &got, &want);
    fill_ab(&got);
    CHECK_OK(mj_moe_config_read(FIXTURES "glm5_nested_quant.json", MODEL_DATA "hf_quant_config.example.json", &got));
    check_same("nested NVFP4 + NVFP4 file", &got, &want);
    /* No quantization_config inside: the file alone, as before. */
    fill_ab(&got);
    CHECK_OK(mj_moe_config_parse(k_base, k_quant_nvfp4, NAME, &got));
    CHECK(got.quant == MJ_QUANT_NVFP4 && got.quant_group_size == 16, "base + NVFP4 text: quant %d group %d",
          got.quant, got.quant_group_size);
}

static void test_quant_errors(void) {
    /* Files. */
    expect_read_fail("hf_quant FP8", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "hf_quant_fp8.json", MJ_ERR_UNSUPPORTED, "quant_algo");
    expect_read_fail("hf_quant FP8 names it", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "hf_quant_fp8.json", MJ_ERR_UNSUPPORTED,
                     "quantization 'FP8' (field 'quantization.quant_algo') is not supported: "
                     "moejit runs NVFP4 (ModelOpt) checkpoints");
    expect_read_fail("hf_quant FP8 names the file", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "hf_quant_fp8.json", MJ_ERR_UNSUPPORTED, "hf_quant_fp8.json");
    expect_read_fail("NVFP4 group 32", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "hf_quant_group32.json", MJ_ERR_UNSUPPORTED, "group_size 32");
    expect_read_fail("NVFP4 group 32 names the file", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "hf_quant_group32.json", MJ_ERR_UNSUPPORTED,
                     "hf_quant_group32.json");
    expect_read_fail("DeepSeek fp8 quant_method", FIXTURES "deepseek_fp8.json", NULL,
                     MJ_ERR_UNSUPPORTED, "quantization 'fp8' (field 'quantization_config.");

    /* Inline quant JSON. */
    expect_parse_fail("quant FP8 inline", k_base,
                      "{\"quantization\": {\"quant_algo\": \"FP8\"}}", MJ_ERR_UNSUPPORTED,
                      "quant_algo");
    expect_parse_fail("quant group 32 inline", k_base,
                      "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 32}}",
                      MJ_ERR_UNSUPPORTED, "group_size");
    expect_parse_fail("quant group string", k_base,
                      "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": \"16\"}}",
                      MJ_ERR_CONFIG, "'quantization.group_size'");
    expect_parse_fail("quant group 0", k_base,
                      "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 0}}",
                      MJ_ERR_CONFIG, "'quantization.group_size'");
    expect_parse_fail("quant algo missing", k_base, "{\"quantization\": {\"group_size\": 16}}",
                      MJ_ERR_CONFIG, "missing field 'quantization.quant_algo'");
    expect_parse_fail("quant algo int", k_base, "{\"quantization\": {\"quant_algo\": 4}}",
                      MJ_ERR_CONFIG, "'quantization.quant_algo'");
    expect_parse_fail("quantization missing", k_base, "{\"producer\": {}}", MJ_ERR_CONFIG,
                      "missing field 'quantization'");
    expect_parse_fail("quantization not an object", k_base, "{\"quantization\": \"NVFP4\"}",
                      MJ_ERR_CONFIG, "'quantization'");

    /* quantization_config inside config.json. */
    expect_field_fail("quantization_config FP8",
                      with_fields("quantization_config",
                                  json_pack("{s:s, s:s}", "quant_method", "modelopt",
                                            "quant_algo", "FP8"),
                                  NULL),
                      MJ_ERR_UNSUPPORTED, "quantization_config.quant_algo");
    expect_field_fail("quantization_config nested group 32",
                      with_fields("quantization_config",
                                  json_pack("{s:{s:s, s:i}}", "quantization", "quant_algo",
                                            "NVFP4", "group_size", 32),
                                  NULL),
                      MJ_ERR_UNSUPPORTED, "group_size 32");
    expect_field_fail("quantization_config bitsandbytes",
                      with_fields("quantization_config",
                                  json_pack("{s:s}", "quant_method", "bitsandbytes"), NULL),
                      MJ_ERR_UNSUPPORTED, "'bitsandbytes'");
    expect_field_fail("quantization_config modelopt without algo",
                      with_fields("quantization_config",
                                  json_pack("{s:s}", "quant_method", "modelopt"), NULL),
                      MJ_ERR_CONFIG, "quantization_config.quant_algo");
    expect_field_fail("quantization_config empty",
                      with_fields("quantization_config", json_object(), NULL), MJ_ERR_CONFIG,
                      "quantization_config.quant_algo");
    expect_field_fail("quantization_config string",
                      with_fields("quantization_config", json_string("nvfp4"), NULL),
                      MJ_ERR_CONFIG, "'quantization_config'");
}

/* The files are read by base/file.c's rule. The paths are the caller's own, so a symbolic
 * link is followed: a Hugging Face cache snapshot (snapshots/REV/config.json a link into
 * blobs/) is read as it is. Never a FIFO: refused at once (a plain open would wait for a
 * writer forever; the watchdog fails the test then). A file over the 64 MiB cap is refused. */
static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    int ok = a && b;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b) != 0) ok = 0;
    return ok ? 0 : -1;
}

static void test_io_rule(void) {
    char *dir = test_tmpdir("config-io");
    CHECK(dir != NULL, "a temporary directory");
    if (!dir) return;
    char *blobs = test_path(dir, "blobs"), *snaps = test_path(dir, "snapshots"), *rev = test_path(dir, "snapshots/rev1");
    char *blob_cfg = test_path(dir, "blobs/1f0e"), *blob_q = test_path(dir, "blobs/9a7c");
    char *cfg = test_path(dir, "snapshots/rev1/config.json"), *q = test_path(dir, "snapshots/rev1/hf_quant_config.json");
    CHECK(mkdir(blobs, 0700) == 0 && mkdir(snaps, 0700) == 0 && mkdir(rev, 0700) == 0, "mkdir: %s",
          strerror(errno));
    CHECK(copy_file(MODEL_DATA "glm5_moe_config.json", blob_cfg) == 0 &&
              copy_file(MODEL_DATA "hf_quant_config.example.json", blob_q) == 0,
          "copying the GLM-5 config");
    CHECK(symlink("../../blobs/1f0e", cfg) == 0 && symlink("../../blobs/9a7c", q) == 0, "symlink: %s",
          strerror(errno));
    mj_moe_config want, got;
    CHECK_OK(mj_moe_config_read(MODEL_DATA "glm5_moe_config.json", MODEL_DATA "hf_quant_config.example.json", &want));
    CHECK_OK(mj_moe_config_read(cfg, q, &got));
    CHECK(!memcmp(&want, &got, sizeof want), "a Hugging Face snapshot's links read as the files");

    char *fifo = test_path(dir, "fifo.json"), *fifo_link = test_path(dir, "fifo_link.json"), *big = test_path(dir, "big.json");
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    CHECK(symlink(fifo, fifo_link) == 0, "symlink: %s", strerror(errno));
    test_watchdog(20, "test_config: reading a FIFO config");
    expect_read_fail("a FIFO as config.json", fifo, NULL, MJ_ERR_IO, "is not a regular file (a FIFO)");
    expect_read_fail("a link to a FIFO as config.json", fifo_link, NULL, MJ_ERR_IO, "fifo_link.json");
    expect_read_fail("a FIFO as the quantization file", cfg, fifo, MJ_ERR_IO, "is not a regular file (a FIFO)");
    test_watchdog(0, NULL);

    /* Over the cap (sparse: nothing is written, nothing is read). */
    FILE *f = fopen(big, "wb");
    CHECK(f && fclose(f) == 0 && truncate(big, (64 << 20) + 1) == 0, "a 64 MiB + 1 file: %s", strerror(errno));
    expect_read_fail("a config over the cap", big, NULL, MJ_ERR_IO, "more than the 64 MiB limit");

    test_rm_rf(dir);
    free(dir), free(blobs), free(snaps), free(rev), free(blob_cfg), free(blob_q), free(cfg), free(q);
    free(fifo), free(fifo_link), free(big);
}

static void test_io(void) {
    expect_read_fail("missing config", FIXTURES "no_such_config.json", NULL, MJ_ERR_IO,
                     "no_such_config.json");
    expect_read_fail("missing config: strerror", FIXTURES "no_such_config.json", NULL,
                     MJ_ERR_IO, "No such file");
    expect_read_fail("missing quant file", MODEL_DATA "glm5_moe_config.json",
                     FIXTURES "no_such_quant.json", MJ_ERR_IO, "no_such_quant.json");
    expect_read_fail("directory", FIXTURES, NULL, MJ_ERR_IO, "tests/data/config");
    test_io_rule();
}

static void test_validate(void) {
    mj_moe_config g, c;
    memset(&g, 0, sizeof g);
    CHECK_OK(mj_moe_config_glm5(&g));
    CHECK_OK(mj_moe_config_validate(&g, 0));
    CHECK_OK(mj_moe_config_validate(&g, 1));

    c = g;
    c.quant = MJ_QUANT_NONE;
    c.quant_group_size = 0;
    CHECK_OK(mj_moe_config_validate(&c, 0));
    expect_validate_fail("require_nvfp4 on NONE", &c, 1, MJ_ERR_UNSUPPORTED,
                         "this path needs an NVFP4 checkpoint");

#define BAD(field, value, status, needle)                                                   \
    do {                                                                                    \
        c = g;                                                                              \
        c.field = (value);                                                                  \
        expect_validate_fail(#field " = " #value, &c, 0, (status), (needle));              \
    } while (0)
    BAD(hidden, 0, MJ_ERR_CONFIG, "hidden_size 0");
    BAD(hidden, -64, MJ_ERR_CONFIG, "hidden_size");
    BAD(intermediate, 0, MJ_ERR_CONFIG, "moe_intermediate_size");
    BAD(n_experts, 0, MJ_ERR_CONFIG, "n_routed_experts");
    BAD(topk, 0, MJ_ERR_CONFIG, "num_experts_per_tok");
    BAD(topk, 257, MJ_ERR_CONFIG, "num_experts_per_tok 257 exceeds n_routed_experts 256");
    BAD(n_shared, -1, MJ_ERR_CONFIG, "n_shared_experts");
    BAD(n_group, 0, MJ_ERR_CONFIG, "n_group");
    BAD(n_group, 3, MJ_ERR_CONFIG, "not divisible by n_group 3");
    BAD(topk_group, 0, MJ_ERR_CONFIG, "topk_group 0");
    BAD(topk_group, 2, MJ_ERR_CONFIG, "topk_group 2");
    BAD(routed_scaling_factor, 0.0f, MJ_ERR_CONFIG, "routed_scaling_factor");
    BAD(routed_scaling_factor, -2.5f, MJ_ERR_CONFIG, "routed_scaling_factor");
    BAD(routed_scaling_factor, NAN, MJ_ERR_CONFIG, "routed_scaling_factor");
    BAD(routed_scaling_factor, INFINITY, MJ_ERR_CONFIG, "routed_scaling_factor");
    BAD(hidden, 6144 + 32, MJ_ERR_CONFIG, "hidden_size 6176 is not a multiple of 64");
    BAD(intermediate, 2048 + 16, MJ_ERR_CONFIG, "moe_intermediate_size 2064");
    BAD(scoring, (mj_scoring)7, MJ_ERR_CONFIG, "scoring");
    BAD(activation, (mj_activation)3, MJ_ERR_CONFIG, "activation");
    BAD(quant, (mj_quant)5, MJ_ERR_CONFIG, "quant");
    BAD(norm_topk_prob, 2, MJ_ERR_CONFIG, "norm_topk_prob");
    BAD(has_correction_bias, -1, MJ_ERR_CONFIG, "has_correction_bias");
    BAD(group_score, (mj_group_score)2, MJ_ERR_CONFIG, "group_score 2");
    BAD(group_score, (mj_group_score)-1, MJ_ERR_CONFIG, "mj_group_score");
    BAD(quant_group_size, 32, MJ_ERR_UNSUPPORTED, "group_size 32");
    BAD(shared_gate, 2, MJ_ERR_CONFIG, "shared_gate 2 must be 0 or 1");
#undef BAD
    /* A gate scales the shared expert: none without one. */
    c = g;
    c.shared_gate = 1;
    CHECK_OK(mj_moe_config_validate(&c, 1));
    c.n_shared = 0;
    expect_validate_fail("shared_gate without a shared expert", &c, 0, MJ_ERR_CONFIG, "there is none");
    /* Groups: 256 experts in 8 groups of 32, keep 4 -> 128 reachable (DeepSeek-V3). */
    c = g;
    c.n_group = 8;
    c.topk_group = 4;
    CHECK_OK(mj_moe_config_validate(&c, 1));
    c.topk_group = 1;
    c.topk = 33;
    expect_validate_fail("1 group of 32 < topk 33", &c, 0, MJ_ERR_CONFIG, "leaves 32 experts");
}

static void test_null_args(void) {
    mj_moe_config c;
    CHECK_STATUS(mj_moe_config_glm5(NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_config_validate(NULL, 0), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_config_parse(NULL, NULL, NAME, &c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_config_parse(k_base, NULL, NAME, NULL), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_config_read(NULL, NULL, &c), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_moe_config_read(MODEL_DATA "glm5_moe_config.json", NULL, NULL),
                 MJ_ERR_INVALID_ARG);
}

/* Families read as their modeling code defines them (the table in runtime/weights/config.c),
 * on their published config.json (tests/data/config/families/). */
#define FAMILIES FIXTURES "families/"

/* A family file as text, its FP8 quantization_config taken out (an NVFP4 re-export replaces
 * it) and the given keys set (a JSON value stolen; NULL removes): (key, val), ..., NULL. */
static char *family_text(const char *file, ...) {
    char path[512];
    json_error_t err;
    snprintf(path, sizeof path, "%s%s", FAMILIES, file);
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "%s: %s", path, err.text);
    if (!root) return strdup("{}");
    json_object_del(root, "quantization_config");
    va_list ap;
    va_start(ap, file);
    for (const char *key; (key = va_arg(ap, const char *));) {
        json_t *val = va_arg(ap, json_t *);
        if (val) json_object_set_new(root, key, val);
        else json_object_del(root, key);
    }
    va_end(ap);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

static void family_ok(const char *what, char *text, mj_moe_config *c) {
    fill_ab(c);
    mj_status st = mj_moe_config_parse(text, NULL, NAME, c);
    CHECK(st == MJ_OK, "%s: %s: %s", what, mj_status_string(st), mj_last_error());
    free(text);
}

static void test_families(void) {
    mj_moe_config c, want;
    /* GLM-4.5-Air (glm4_moe) names neither scoring_func nor topk_method: HF's Glm4MoeTopkRouter
     * is sigmoid with e_score_correction_bias always, not the generic softmax top-k. */
    want = (mj_moe_config){.hidden = 4096, .intermediate = 1408, .n_experts = 128, .topk = 8,
                           .n_shared = 1, .n_group = 1, .topk_group = 1,
                           .scoring = MJ_SCORING_SIGMOID, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 1, .has_correction_bias = 1, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE, .quant_group_size = 0};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "GLM-4.5-Air.json", NULL, &c));
    check_same("GLM-4.5-Air", &c, &want);
    /* GLM-5 (glm_moe_dsa) as its abridged config has it, no routing key at all: the family
     * decides (GlmMoeDsaTopkRouter). Kimi-K2 (kimi_k2): DeepSeek-V3's router with its keys. */
    want.intermediate = 2048, want.n_experts = 256, want.hidden = 6144, want.routed_scaling_factor = 2.5f;
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "GLM-5.abridged.json", NULL, &c));
    check_same("GLM-5", &c, &want);
    want.hidden = 7168, want.n_experts = 384, want.routed_scaling_factor = 2.827f;
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "Kimi-K2-Instruct.json", NULL, &c));
    check_same("Kimi-K2", &c, &want);
    /* DeepSeek-V3: its keys, 8 groups keep 4. */
    want.n_experts = 256, want.routed_scaling_factor = 2.5f, want.n_group = 8, want.topk_group = 4;
    family_ok("DeepSeek-V3", family_text("DeepSeek-V3.json", NULL), &c);
    check_same("DeepSeek-V3", &c, &want);
    /* Routing keys left out take the family's configuration defaults: DeepseekV3Config's 8 groups
     * keep 4 and 2.5, GlmMoeDsaConfig's 2.5, Glm4MoeConfig's 1.0 (not the generic 1 group, 1.0). */
    family_ok("DeepSeek-V3 without groups", family_text("DeepSeek-V3.json", "n_group", NULL, "topk_group", NULL,
                                                        "routed_scaling_factor", NULL, NULL), &c);
    check_same("DeepSeek-V3 without groups", &c, &want);
    family_ok("GLM-5 without rsf", family_text("GLM-5.abridged.json", "routed_scaling_factor", NULL, NULL), &c);
    CHECK(c.routed_scaling_factor == 2.5f && c.n_group == 1, "GLM-5 without rsf: %g, %d groups",
          (double)c.routed_scaling_factor, c.n_group);
    family_ok("GLM-4.5-Air without rsf", family_text("GLM-4.5-Air.json", "routed_scaling_factor", NULL, NULL), &c);
    CHECK(c.routed_scaling_factor == 1.0f, "GLM-4.5-Air without rsf: %g", (double)c.routed_scaling_factor);
    /* DeepSeek-V2-Lite: softmax greedy top-6 of 64, two shared experts, not renormalized. */
    want = (mj_moe_config){.hidden = 2048, .intermediate = 1408, .n_experts = 64, .topk = 6, .n_shared = 2,
                           .n_group = 1, .topk_group = 1, .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 0, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "DeepSeek-V2-Lite.json", NULL, &c));
    check_same("DeepSeek-V2-Lite", &c, &want);
    /* Mixtral: num_local_experts, intermediate_size the expert's width, softmax top-2 always
     * renormalized (MixtralTopKRouter), no shared expert. */
    want = (mj_moe_config){.hidden = 4096, .intermediate = 14336, .n_experts = 8, .topk = 2, .n_shared = 0,
                           .n_group = 1, .topk_group = 1, .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 1, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "Mixtral-8x7B-v0.1.json", NULL, &c));
    check_same("Mixtral-8x7B", &c, &want);
    /* MiniMax-M2: sigmoid, the selection bias, the unbiased scores renormalized. */
    want = (mj_moe_config){.hidden = 3072, .intermediate = 1536, .n_experts = 256, .topk = 8, .n_shared = 0,
                           .n_group = 1, .topk_group = 1, .scoring = MJ_SCORING_SIGMOID, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 1, .has_correction_bias = 1, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE};
    family_ok("MiniMax-M2.5", family_text("MiniMax-M2.5.abridged.json", NULL), &c);
    check_same("MiniMax-M2.5", &c, &want);
    family_ok("MiniMax-M2.5 without its bias",
              family_text("MiniMax-M2.5.abridged.json", "use_routing_bias", json_false(), NULL), &c);
    CHECK(c.has_correction_bias == 0 && c.scoring == MJ_SCORING_SIGMOID, "use_routing_bias false: bias %d",
          c.has_correction_bias);
    /* The published Qwen3-30B-A3B: softmax top-8 of 128, renormalized, no bias. */
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "Qwen3-30B-A3B.json", NULL, &c));
    CHECK(c.scoring == MJ_SCORING_SOFTMAX && !c.has_correction_bias && c.norm_topk_prob == 1 && c.n_experts == 128 &&
              c.topk == 8 && c.intermediate == 768 && c.n_shared == 0,
          "Qwen3-30B-A3B: scoring %d bias %d norm %d E %d k %d I %d shared %d", (int)c.scoring, c.has_correction_bias,
          c.norm_topk_prob, c.n_experts, c.topk, c.intermediate, c.n_shared);
    /* Qwen3MoeSparseMoeBlock has no shared expert: a qwen3_moe config that asks for one (either
     * family's key) is refused, not run with a shared expert the model does not have. */
    {
        static const char *const keys[] = {"n_shared_experts", "shared_expert_intermediate_size"};
        for (int i = 0; i < 2; i++) {
            char *t = family_text("Qwen3-30B-A3B.json", keys[i], json_integer(i ? 768 : 1), NULL);
            fill_ab(&c);
            mj_status st = mj_moe_config_parse(t, NULL, NAME, &c);
            CHECK(st == MJ_ERR_UNSUPPORTED && strstr(mj_last_error(), keys[i]) &&
                      strstr(mj_last_error(), "no shared expert"),
                  "qwen3_moe with %s: %s: %s", keys[i], mj_status_string(st), mj_last_error());
            free(t);
        }
    }

    /* Qwen2-MoE (Qwen2-57B-A14B): softmax top-8 of 64, not renormalized, and one shared expert
     * of shared_expert_intermediate_size 20480 = 8 x 2560 rows, sigmoid-gated
     * (Qwen2MoeSparseMoeBlock); Qwen3-Next's block is the same (512 = 1 x 512), renormalized. */
    want = (mj_moe_config){.hidden = 3584, .intermediate = 2560, .n_experts = 64, .topk = 8, .n_shared = 8,
                           .n_group = 1, .topk_group = 1, .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 0, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE, .shared_gate = 1};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "Qwen2-57B-A14B.json", NULL, &c));
    check_same("Qwen2-57B-A14B", &c, &want);
    want = (mj_moe_config){.hidden = 2048, .intermediate = 512, .n_experts = 512, .topk = 10, .n_shared = 1,
                           .n_group = 1, .topk_group = 1, .scoring = MJ_SCORING_SOFTMAX, .routed_scaling_factor = 1.0f,
                           .norm_topk_prob = 1, .has_correction_bias = 0, .activation = MJ_ACT_SILU,
                           .group_score = MJ_GROUP_SCORE_TOP2_SUM, .quant = MJ_QUANT_NONE, .shared_gate = 1};
    fill_ab(&c);
    CHECK_OK(mj_moe_config_read(FAMILIES "Qwen3-Next-80B-A3B-Thinking.json", NULL, &c));
    check_same("Qwen3-Next-80B-A3B", &c, &want);
    /* The width left out: the configuration class's default (Qwen2MoeConfig 5632, Qwen1.5-MoE's
     * 4 x 1408; Qwen3NextConfig 512); 0: no shared expert and no gate. */
    family_ok("Qwen2-MoE without the shared width",
              family_text("Qwen2-57B-A14B.json", "shared_expert_intermediate_size", NULL, "moe_intermediate_size",
                          json_integer(1408), NULL), &c);
    CHECK(c.n_shared == 4 && c.shared_gate == 1, "Qwen2-MoE's default width 5632 over 1408: %d shared, gate %d",
          c.n_shared, c.shared_gate);
    family_ok("Qwen3-Next without the shared width",
              family_text("Qwen3-Next-80B-A3B-Thinking.json", "shared_expert_intermediate_size", NULL, NULL), &c);
    CHECK(c.n_shared == 1 && c.shared_gate == 1, "Qwen3-Next's default width 512: %d shared, gate %d", c.n_shared,
          c.shared_gate);
    family_ok("Qwen2-MoE with no shared expert",
              family_text("Qwen2-57B-A14B.json", "shared_expert_intermediate_size", json_integer(0), NULL), &c);
    CHECK(c.n_shared == 0 && c.shared_gate == 0, "shared_expert_intermediate_size 0: %d shared, gate %d", c.n_shared,
          c.shared_gate);
    /* The kernels run the shared expert as sub-experts of the expert width; the block reads no
     * n_shared_experts. */
    expect_field_fail("Qwen2-MoE with a shared width of 1.5 experts",
                      family_text("Qwen2-57B-A14B.json", "shared_expert_intermediate_size", json_integer(3840), NULL),
                      MJ_ERR_UNSUPPORTED, "shared_expert_intermediate_size 3840 is not a multiple of moe_intermediate_size 2560");
    expect_field_fail("Qwen2-MoE without the shared width, of an expert width 5632 is no multiple of",
                      family_text("Qwen2-57B-A14B.json", "shared_expert_intermediate_size", NULL, NULL),
                      MJ_ERR_UNSUPPORTED, "shared_expert_intermediate_size 5632 is not a multiple");
    expect_field_fail("Qwen3-Next with n_shared_experts",
                      family_text("Qwen3-Next-80B-A3B-Thinking.json", "n_shared_experts", json_integer(1), NULL),
                      MJ_ERR_UNSUPPORTED, "sizes its one shared expert by 'shared_expert_intermediate_size'");
    CHECK(mentions("contradicts its model_type"), "Qwen3-Next with n_shared_experts: %s", mj_last_error());

    /* Top-1 renormalization, by family: DeepSeek's modeling_deepseek.py renormalizes only when
     * top_k > 1 (one weight stays its score); GLM's, Qwen's, Mixtral's and MiniMax's at any
     * top_k (the one weight becomes 1); a config of no family as its norm_topk_prob says. */
    static const struct { const char *file; int norm, norm2; } top1[] = { /* at top_k 1, at 2 */
        {"DeepSeek-V3.json", 0, 1}, {"Kimi-K2-Instruct.json", 0, 1}, {"DeepSeek-V2-Lite.json", 0, 0},
        {"GLM-4.5-Air.json", 1, 1}, {"GLM-5.abridged.json", 1, 1}, {"Qwen3-30B-A3B.json", 1, 1},
        {"Qwen3-Next-80B-A3B-Thinking.json", 1, 1},
        {"Mixtral-8x7B-v0.1.json", 1, 1}, {"MiniMax-M2.5.abridged.json", 1, 1},
    };
    for (size_t i = 0; i < sizeof top1 / sizeof top1[0]; i++) {
        family_ok(top1[i].file, family_text(top1[i].file, "num_experts_per_tok", json_integer(1), NULL), &c);
        CHECK(c.topk == 1 && c.norm_topk_prob == top1[i].norm, "%s at top_k 1: norm_topk_prob %d, want %d",
              top1[i].file, c.norm_topk_prob, top1[i].norm);
        family_ok(top1[i].file, family_text(top1[i].file, "num_experts_per_tok", json_integer(2), NULL), &c);
        CHECK(c.norm_topk_prob == top1[i].norm2, "%s at top_k 2: norm_topk_prob %d, want %d", top1[i].file,
              c.norm_topk_prob, top1[i].norm2);
    }
    family_ok("no family, top-1", family_text("DeepSeek-V3.json", "model_type", json_string("custom_moe"),
                                              "num_experts_per_tok", json_integer(1), NULL), &c);
    CHECK(c.norm_topk_prob == 1, "a config of no family at top_k 1: norm_topk_prob %d", c.norm_topk_prob);

    /* Keys a hard-coded router does not read are refused when they ask for something else. */
    static const struct { const char *file, *key, *needle; json_t *val; } contra[] = {
        {"Mixtral-8x7B-v0.1.json", "norm_topk_prob", "MixtralTopKRouter", NULL},
        {"Mixtral-8x7B-v0.1.json", "scoring_func", "scores with a softmax", NULL},
        {"Mixtral-8x7B-v0.1.json", "n_shared_experts", "has no shared expert", NULL},
        {"MiniMax-M2.5.abridged.json", "scoring_func", "scores with a sigmoid", NULL},
        {"MiniMax-M2.5.abridged.json", "shared_intermediate_size", "has no shared expert", NULL},
        {"MiniMax-M2.5.abridged.json", "routed_scaling_factor", "scales the weights by nothing", NULL},
        {"MiniMax-M2.5.abridged.json", "topk_method", "selects with a bias", NULL},
    };
    json_t *vals[] = {json_false(), json_string("sigmoid"), json_integer(1), json_string("softmax"),
                      json_integer(512), json_real(2.5), json_string("greedy")};
    for (size_t i = 0; i < sizeof contra / sizeof contra[0]; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s with %s", contra[i].file, contra[i].key);
        expect_field_fail(what, family_text(contra[i].file, contra[i].key, vals[i], NULL), MJ_ERR_UNSUPPORTED,
                          contra[i].needle);
        CHECK(mentions(contra[i].key) && mentions("contradicts its model_type"), "%s: %s", what, mj_last_error());
    }
    /* DeepSeek-V2's two routers disagree on norm_topk_prob true (above top-1). */
    expect_field_fail("deepseek_v2 norm_topk_prob true",
                      family_text("DeepSeek-V2-Lite.json", "norm_topk_prob", json_true(), NULL), MJ_ERR_UNSUPPORTED,
                      "DeepseekV2TopkRouter never renormalizes");

    /* Refused with the reason, not with a missing field: routing that scales the input
     * (Llama-4), biases / clamped SwiGLU / MXFP4 (gpt-oss). */
    static const struct { const char *file, *needle; } refused[] = {
        {"Llama-4-Scout-17B-16E-Instruct.abridged.json", "scales each token's input"},
        {"gpt-oss-20b.json", "clamped SwiGLU"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s", FAMILIES, refused[i].file);
        expect_read_fail(refused[i].file, path, NULL, MJ_ERR_UNSUPPORTED, refused[i].needle);
        CHECK(!mentions("missing field"), "%s: refused for a missing field: %s", refused[i].file, mj_last_error());
    }
}

static const test_case cases[] = {
    TEST_CASE("glm5", test_glm5),
    TEST_CASE("other_models", test_other_models),
    TEST_CASE("families", test_families),
    TEST_CASE("defaults_and_aliases", test_defaults_and_aliases),
    TEST_CASE("malformed", test_malformed),
    TEST_CASE("missing", test_missing),
    TEST_CASE("mistyped", test_mistyped),
    TEST_CASE("impossible", test_impossible),
    TEST_CASE("quant_errors", test_quant_errors),
    TEST_CASE("quant_agree", test_quant_agree),
    TEST_CASE("io", test_io),
    TEST_CASE("validate", test_validate),
    TEST_CASE("null_args", test_null_args),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL); }
