/* test_families.c — every supported model family end to end, on its published config.json
 * (tests/data/config/families/): the config read by mj_moe_config_parse, scaled down (hidden
 * 128, experts 64 wide, 8 to 32 of them, the family's top-k and shared experts), a random layer
 * of it routed and run on the interpreter (mj_moe_forward), at the family's top-k and at top-1.
 *
 * The reference does not go through the config reader: it reads the file's raw keys and applies
 * the family's rules as its modeling code has them, written out below from the upstream source
 * (transformers 5.25 models/<family>/modeling_<family>.py and configuration_<family>.py, and
 * DeepSeek's modeling_deepseek.py for deepseek_v2/v3 and kimi_k2):
 *   scoring        sigmoid or softmax over all experts;
 *   bias           e_score_correction_bias added for selection only;
 *   groups         n_group / topk_group, a group scored by the sum of its top-2 biased scores
 *                  (noaux_tc) or its max (group_limited_greedy);
 *   renormalize    by norm_topk_prob (any top-k), by norm_topk_prob only when top_k > 1
 *                  (DeepSeek-style), or always (Mixtral, MiniMax-M2);
 *   scaling        routed_scaling_factor;
 *   shared gate    Qwen2-MoE's and Qwen3-Next's one shared expert (shared_expert_intermediate_size
 *                  wide, the configuration class's default when absent) scaled per token by
 *                  sigmoid(x . shared_expert_gate) (Qwen2MoeSparseMoeBlock,
 *                  Qwen3NextSparseMoeBlock);
 *   defaults       what the family's configuration class gives a key the file leaves out.
 * The interpreter's routing (mj_moe_route_outputs) must equal the reference's ids and weights,
 * and its output the CPU experts (mj_experts_ref) on the reference's routing: for a gated shared
 * expert, the routed experts alone plus the gate's weight (computed here) times the shared
 * expert alone. */
#include "base.h"
#include "test.h"
#include "ref/ref.h"
#include "weights/layer.h"

#include <jansson.h>
#include <math.h>

#define FAMILIES MJ_SOURCE_DIR "/tests/data/config/families/"
enum { H = 128, I = 64, B = 8 };

static const char k_quant[] = "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16}}";

typedef enum { RN_KEY, RN_KEY_GT1, RN_ALWAYS } renorm_rule;

/* One family's routing, written from its modeling code (not from runtime/weights/config.c). */
typedef struct family_rule {
    const char *file;
    int sigmoid;               /* scores: sigmoid (else softmax over all experts)             */
    int bias;                  /* a selection bias (unless use_routing_bias says false)       */
    renorm_rule renorm;
    const char *experts_key, *width_key;
    /* the configuration class's defaults for keys the file may leave out */
    const char *method;        /* topk_method                                                */
    int norm;                  /* norm_topk_prob                                             */
    double rsf;                /* routed_scaling_factor                                       */
    int n_group, topk_group;
    int gated_width;           /* not 0: the shared expert is shared_expert_intermediate_size
                                  wide (this when absent), scaled by its sigmoid gate; 0:
                                  n_shared_experts wide, weight 1                              */
} family_rule;

static const family_rule k_rules[] = {
    /* GlmMoeDsaTopkRouter: sigmoid + bias, groups by top-2 sum, `if self.norm_topk_prob`, x rsf;
     * GlmMoeDsaConfig: n_group 1, topk_group 1, rsf 2.5, norm True. */
    {"GLM-5.abridged.json", 1, 1, RN_KEY, "n_routed_experts", "moe_intermediate_size", "noaux_tc", 1, 2.5, 1, 1, 0},
    /* Glm4MoeTopkRouter: the same; Glm4MoeConfig: rsf 1.0. */
    {"GLM-4.5-Air.json", 1, 1, RN_KEY, "n_routed_experts", "moe_intermediate_size", "noaux_tc", 1, 1.0, 1, 1, 0},
    /* modeling_deepseek.py MoEGate (noaux_tc): `if self.top_k > 1 and self.norm_topk_prob`;
     * DeepseekV3Config: n_group 8, topk_group 4, rsf 2.5, norm True. */
    {"DeepSeek-V3.json", 1, 1, RN_KEY_GT1, "n_routed_experts", "moe_intermediate_size", "noaux_tc", 1, 2.5, 8, 4, 0},
    {"Kimi-K2-Instruct.json", 1, 1, RN_KEY_GT1, "n_routed_experts", "moe_intermediate_size", "noaux_tc", 1, 2.5, 8, 4, 0},
    /* DeepseekV2TopkRouter: softmax, greedy or group_limited_greedy (group max), x rsf; its
     * published configs do not renormalize. */
    {"DeepSeek-V2-Lite.json", 0, 0, RN_KEY_GT1, "n_routed_experts", "moe_intermediate_size", "greedy", 0, 1.0, 1, 1, 0},
    /* Qwen3MoeTopKRouter: softmax over all, top-k, `if self.norm_topk_prob`. */
    {"Qwen3-30B-A3B.json", 0, 0, RN_KEY, "num_experts", "moe_intermediate_size", "greedy", 0, 1.0, 1, 1, 0},
    /* Qwen2MoeTopKRouter: Qwen3MoeTopKRouter's; Qwen2MoeSparseMoeBlock: + sigmoid(x .
     * shared_expert_gate) * shared_expert(x); Qwen2MoeConfig: shared_expert_intermediate_size 5632. */
    {"Qwen2-57B-A14B.json", 0, 0, RN_KEY, "num_experts", "moe_intermediate_size", "greedy", 0, 1.0, 1, 1, 5632},
    /* Qwen3NextTopKRouter and Qwen3NextSparseMoeBlock: Qwen2-MoE's; Qwen3NextConfig: norm True,
     * shared_expert_intermediate_size 512. */
    {"Qwen3-Next-80B-A3B-Thinking.json", 0, 0, RN_KEY, "num_experts", "moe_intermediate_size", "greedy", 1, 1.0, 1, 1,
     512},
    /* MixtralTopKRouter: softmax over all, top-k, always `/= sum`. */
    {"Mixtral-8x7B-v0.1.json", 0, 0, RN_ALWAYS, "num_local_experts", "intermediate_size", "greedy", 1, 1.0, 1, 1, 0},
    /* MiniMaxM2TopKRouter: sigmoid, + e_score_correction_bias to choose, the unbiased scores
     * always `/= sum`. */
    {"MiniMax-M2.5.abridged.json", 1, 1, RN_ALWAYS, "num_local_experts", "intermediate_size", "noaux_tc", 1, 1.0, 1, 1, 0},
};

/* What the reference routes with: the raw keys, or the class's defaults. */
typedef struct keys {
    int topk, n_group, topk_group, norm, bias, group_max;
    double rsf;
} keys;

static int key_int(const json_t *m, const char *k, int d) {
    const json_t *v = json_object_get(m, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : d;
}

static keys read_keys(const json_t *m, const family_rule *r) {
    keys k;
    const json_t *v;
    k.topk = key_int(m, "num_experts_per_tok", 0);
    k.n_group = key_int(m, "n_group", r->n_group);
    k.topk_group = key_int(m, "topk_group", r->topk_group);
    k.norm = (v = json_object_get(m, "norm_topk_prob")) && json_is_boolean(v) ? json_is_true(v) : r->norm;
    k.rsf = (v = json_object_get(m, "routed_scaling_factor")) && json_is_number(v) ? json_number_value(v) : r->rsf;
    k.bias = r->bias && !json_is_false(json_object_get(m, "use_routing_bias"));
    const char *method = json_string_value(json_object_get(m, "topk_method"));
    k.group_max = !strcmp(method ? method : r->method, "group_limited_greedy");
    if (!strcmp(method ? method : r->method, "greedy")) k.n_group = k.topk_group = 1; /* greedy: no groups */
    return k;
}

/* The family's routing of one token: ids in ranking order (biased score descending, ties to
 * the lower id), weights as its router computes them. */
static void route_token(const family_rule *r, const keys *k, const float *logit, const float *bias, int E, int32_t *ids,
                        float *w, int flip) {
    double s[64], c[64], mx = -INFINITY, sum = 0;
    int eligible[64];
    for (int e = 0; e < E; e++) mx = fmax(mx, logit[e]);
    for (int e = 0; e < E; e++) {
        s[e] = r->sigmoid ? 1.0 / (1.0 + exp(-(double)logit[e])) : exp((double)logit[e] - mx);
        sum += s[e];
    }
    for (int e = 0; e < E; e++) {
        if (!r->sigmoid) s[e] /= sum;
        c[e] = s[e] + (k->bias ? bias[e] : 0.0);
        eligible[e] = 1;
    }
    if (k->n_group > 1) { /* keep the topk_group best groups */
        int per = E / k->n_group, kept[64] = {0};
        double gs[64];
        for (int g = 0; g < k->n_group; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int j = 0; j < per; j++) {
                double x = k->group_max ? s[g * per + j] : c[g * per + j];
                if (x > a) b = a, a = x;
                else if (x > b) b = x;
            }
            gs[g] = k->group_max ? a : a + b;
        }
        for (int t = 0; t < k->topk_group; t++) {
            int best = -1;
            for (int g = 0; g < k->n_group; g++)
                if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
            kept[best] = 1;
        }
        for (int e = 0; e < E; e++) eligible[e] = kept[e / per];
    }
    double wsum = 0;
    for (int t = 0; t < k->topk; t++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (eligible[e] && (best < 0 || c[e] > c[best])) best = e;
        eligible[best] = 0;
        ids[t] = best;
        wsum += s[best];
    }
    int renorm = (r->renorm == RN_ALWAYS || (k->norm && (r->renorm == RN_KEY || k->topk > 1))) != flip;
    for (int t = 0; t < k->topk; t++) w[t] = (float)((renorm ? s[ids[t]] / wsum : s[ids[t]]) * k->rsf);
}

/* A gated shared expert's output, as Qwen2MoeSparseMoeBlock adds it: the routed experts alone
 * (mj_experts_ref without the shared expert) + sigmoid(x . shared_expert_gate) (in double, here)
 * times the shared expert alone (mj_experts_ref with no routed slot and no gate). gate: the
 * layer's, or another [H] to apply in its place. */
static void gated_want(mj_layer_t layer, const uint16_t *hidden, const int32_t *ids, const float *w,
                       const int32_t *nsel, float *want, const uint16_t *gate) {
    static float routed[B * H], shared[B * H];
    const int32_t none[B] = {0};
    struct mj_layer r = *layer, sh = *layer;
    r.has_shared = 0, r.is_local = 0, r.shared_gate = NULL;
    sh.shared_gate = NULL;
    CHECK_OK(mj_experts_ref(&r, MJ_MODE_W4A16, hidden, B, B, ids, w, nsel, routed));
    CHECK_OK(mj_experts_ref(&sh, MJ_MODE_W4A16, hidden, B, B, ids, w, none, shared));
    if (!gate) gate = layer->shared_gate;
    for (int b = 0; b < B; b++) {
        double dot = 0;
        for (int h = 0; h < H; h++) dot += (double)mj_bf16_to_f32(hidden[b * H + h]) * mj_bf16_to_f32(gate[h]);
        const double g = 1.0 / (1.0 + exp(-dot));
        for (int h = 0; h < H; h++) want[b * H + h] = (float)(routed[b * H + h] + g * shared[b * H + h]);
    }
}

/* The family's config scaled down to E experts of width I, hidden H, top-k topk. */
static json_t *scaled(const char *file, const family_rule *r, int topk) {
    char path[512];
    json_error_t err;
    snprintf(path, sizeof path, "%s%s", FAMILIES, file);
    json_t *root = json_load_file(path, 0, &err);
    if (!root) return NULL;
    json_object_del(root, "quantization_config"); /* FP8 as published; the NVFP4 export's replaces it */
    int n_group = key_int(root, "n_group", r->n_group);
    int E = n_group > 1 ? 32 : 16, e_pub = key_int(root, r->experts_key, E);
    if (e_pub < E) E = e_pub;
    json_object_set_new(root, "hidden_size", json_integer(H));
    if (r->gated_width) { /* the shared expert keeps its multiple of the expert width */
        const int width = key_int(root, "shared_expert_intermediate_size", r->gated_width);
        json_object_set_new(root, "shared_expert_intermediate_size",
                            json_integer(width / key_int(root, r->width_key, 1) * I));
    }
    json_object_set_new(root, r->width_key, json_integer(I));
    json_object_set_new(root, r->experts_key, json_integer(E));
    if (topk) json_object_set_new(root, "num_experts_per_tok", json_integer(topk));
    return root;
}

static void run_family(const family_rule *r, int topk) {
    char what[160];
    json_t *root = scaled(r->file, r, topk);
    CHECK(root != NULL, "%s: cannot read it", r->file);
    if (!root) return;
    char *text = json_dumps(root, JSON_COMPACT);
    keys k = read_keys(root, r);
    snprintf(what, sizeof what, "%s at top-%d", r->file, k.topk);
    mj_moe_config cfg;
    mj_status st = mj_moe_config_parse(text, k_quant, r->file, &cfg);
    CHECK(st == MJ_OK, "%s: %s: %s", what, mj_status_string(st), mj_last_error());
    free(text);
    json_decref(root);
    if (st != MJ_OK) return;
    const int E = cfg.n_experts, K = cfg.topk;
    CHECK(K == k.topk && E <= 64, "%s: top-%d of %d", what, K, E);

    uint64_t rng = test_seed(0xFA311E5) ^ (uint64_t)topk ^ (uint64_t)E << 8;
    mj_layer_t layer = NULL;
    CHECK_OK(mj_layer_create_random(&cfg, rng, &layer));
    if (!layer) return;
    CHECK(!!layer->bias == k.bias, "%s: the layer has %s selection bias, the family %s", what,
          layer->bias ? "a" : "no", k.bias ? "one" : "none");
    if (!!layer->bias != k.bias) {
        mj_layer_free(layer);
        return;
    }
    uint16_t hidden[B * H];
    test_random_hidden(hidden, (size_t)B * H, &rng);
    /* Router weights scaled so the logits are of order 1, as a trained router's are: scores
     * that saturate (softmax one-hot, sigmoid 1) would hide the renormalization rule. */
    float lg[B * 64];
    double ss = 0;
    CHECK_OK(mj_router_ref(layer, hidden, B, lg));
    for (int i = 0; i < B * E; i++) ss += (double)lg[i] * lg[i];
    const float scale = (float)(1.0 / sqrt(ss / (B * E) + 1e-30));
    for (int i = 0; i < E * H; i++) layer->gate[i] = mj_f32_to_bf16(mj_bf16_to_f32(layer->gate[i]) * scale);

    /* The interpreter. */
    mj_context_t ctx = test_new_context(test_shared_cache(), MJ_BACKEND_SIM, "sm_120a", 0);
    mj_moe_t moe = NULL;
    float out[B * H], want[B * H], logits[B * 64], wref[B * 64];
    int32_t ids[B * 64], nsel[B];
    CHECK_OK(mj_moe_create(ctx, layer, NULL, &moe));
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.max_batch = B, po.mode = MJ_MODE_W4A16;
    CHECK_OK(mj_moe_prepare(moe, &po));
    CHECK_OK(mj_moe_forward(moe, hidden, B, NULL, out, NULL));
    mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
    CHECK_OK(mj_moe_route_outputs(moe, &ro));

    /* The family's routing on the router's logits, and the experts on it. */
    CHECK_OK(mj_router_ref(layer, hidden, B, logits));
    double flip_diff = 0;
    for (int b = 0; b < B; b++) {
        float alt[64];
        route_token(r, &k, logits + b * E, layer->bias, E, ids + b * K, alt, 1);
        route_token(r, &k, logits + b * E, layer->bias, E, ids + b * K, wref + b * K, 0);
        for (int j = 0; j < K; j++) flip_diff = fmax(flip_diff, fabs((double)alt[j] / wref[b * K + j] - 1.0));
        nsel[b] = K;
    }
    /* The scores are not saturated: the other renormalization rule would give other weights. */
    CHECK(flip_diff > 1e-2, "%s: renormalizing or not changes the weights by %.3g only: the test cannot tell", what,
          flip_diff);
    int id_diff = 0;
    double w_err = 0, w_sum = 0;
    for (int i = 0; ro.ids && i < B * K; i++) {
        id_diff += ro.ids[i] != ids[i];
        w_err = fmax(w_err, fabs((double)ro.weights[i] - wref[i]) / fabs((double)wref[i]));
    }
    for (int i = 0; i < K; i++) w_sum += wref[i];
    CHECK(ro.ids && id_diff == 0, "%s: %d of %d slots routed to other experts than the family's rules choose", what,
          id_diff, B * K);
    CHECK(ro.ids && w_err < 1e-5, "%s: routing weights off the family's by %.3g (relative)", what, w_err);
    for (int b = 0; ro.n_sel && b < B; b++) CHECK(ro.n_sel[b] == K, "%s: token %d got %d experts", what, b, ro.n_sel[b]);
    CHECK(!!layer->shared_gate == !!r->gated_width, "%s: the layer has %s shared-expert gate, the family %s", what,
          layer->shared_gate ? "a" : "no", r->gated_width ? "one" : "none");
    if (r->gated_width) {
        gated_want(layer, hidden, ids, wref, nsel, want, NULL);
        double ungated = 0;
        float *plain = malloc(sizeof(float) * B * H);
        struct mj_layer nogate = *layer;
        nogate.shared_gate = NULL;
        CHECK_OK(mj_experts_ref(&nogate, MJ_MODE_W4A16, hidden, B, B, ids, wref, nsel, plain));
        ungated = test_rel_l2(out, plain, (size_t)B * H);
        free(plain);
        /* The gate is seen: the shared expert at weight 1 is far from the output. */
        CHECK(ungated > 5e-2, "%s: the output is within %.3g of the ungated layer's", what, ungated);
        CHECK(layer->is_local == cfg.n_shared * I && cfg.shared_gate == 1, "%s: a shared expert of %d rows, gate %d",
              what, layer->is_local, cfg.shared_gate);
    } else {
        CHECK_OK(mj_experts_ref(layer, MJ_MODE_W4A16, hidden, B, B, ids, wref, nsel, want));
    }
    double e = test_rel_l2(out, want, (size_t)B * H);
    CHECK(e <= 2e-3, "%s: relative L2 %.3g against the experts on the family's routing (bound 2e-3)", what, e);
    printf("%-32s top-%d of %2d, %d shared: token 0's weights sum to %.4f, relative L2 %.2g\n", r->file, K, E,
           cfg.n_shared, w_sum, e);
    mj_moe_free(moe);
    mj_context_destroy(ctx);
    mj_layer_free(layer);
}

static void run_rule(int i) {
    run_family(&k_rules[i], 0); /* the family's own top-k */
    run_family(&k_rules[i], 1); /* top-1: where DeepSeek-style renormalization stops */
}

static void case_glm5(void) { run_rule(0); }
static void case_glm45_air(void) { run_rule(1); }
static void case_deepseek_v3(void) { run_rule(2); }
static void case_kimi_k2(void) { run_rule(3); }
static void case_deepseek_v2_lite(void) { run_rule(4); }
static void case_qwen3_moe(void) { run_rule(5); }
static void case_qwen2_moe(void) { run_rule(6); }
static void case_qwen3_next(void) { run_rule(7); }
static void case_mixtral(void) { run_rule(8); }
static void case_minimax_m2(void) { run_rule(9); }

/* One forward of `layer` on the interpreter (W4A16, plain top-k) into out. */
static int kernel_forward(mj_layer_t layer, const uint16_t *hidden, float *out) {
    mj_context_t ctx = test_new_context(test_shared_cache(), MJ_BACKEND_SIM, "sm_120a", 0);
    mj_moe_t moe = NULL;
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.max_batch = B, po.mode = MJ_MODE_W4A16;
    mj_status st = mj_moe_create(ctx, layer, NULL, &moe);
    if (st == MJ_OK) st = mj_moe_prepare(moe, &po);
    if (st == MJ_OK) st = mj_moe_forward(moe, hidden, B, NULL, out, NULL);
    CHECK(st == MJ_OK, "forward: %s: %s", mj_status_string(st), mj_last_error());
    mj_moe_free(moe);
    mj_context_destroy(ctx);
    return st == MJ_OK;
}

/* The gate's effect on Qwen2-57B-A14B's layer, on the interpreter: a gate of zeros weighs the
 * shared expert 0.5 for every token; a gate that makes x . gate -128 for every token (each
 * token's element 0 set to 8, the gate -16 there and 0 elsewhere) weighs it 0: the routed
 * experts alone. */
static void case_qwen2_moe_gate(void) {
    const family_rule *r = &k_rules[6];
    json_t *root = scaled(r->file, r, 0);
    CHECK(root != NULL, "%s: cannot read it", r->file);
    if (!root) return;
    char *text = json_dumps(root, JSON_COMPACT);
    const keys k = read_keys(root, r);
    json_decref(root);
    mj_moe_config cfg;
    mj_status st = mj_moe_config_parse(text, k_quant, r->file, &cfg);
    CHECK(st == MJ_OK, "%s: %s", r->file, mj_last_error());
    free(text);
    if (st != MJ_OK) return;
    uint64_t rng = test_seed(0x5A7E);
    mj_layer_t layer = NULL;
    CHECK_OK(mj_layer_create_random(&cfg, rng, &layer));
    if (!layer || !layer->shared_gate) return;
    const int E = cfg.n_experts, K = cfg.topk;
    uint16_t hidden[B * H], gate[H];
    float out[B * H], want[B * H], logits[B * 64], w[B * 64];
    int32_t ids[B * 64], nsel[B];
    test_random_hidden(hidden, (size_t)B * H, &rng);
    for (int b = 0; b < B; b++) hidden[b * H] = mj_f32_to_bf16(8.0f);
    CHECK(k.topk == K, "top-%d, the file's %d", K, k.topk);
    CHECK_OK(mj_router_ref(layer, hidden, B, logits));
    for (int b = 0; b < B; b++) route_token(r, &k, logits + b * E, NULL, E, ids + b * K, w + b * K, 0), nsel[b] = K;
    static const struct { const char *what; float g0; } gates[] = {{"zero gate: weight 0.5", 0.0f},
                                                                    {"gate -128: weight 0", -16.0f}};
    for (size_t i = 0; i < sizeof gates / sizeof gates[0]; i++) {
        for (int h = 0; h < H; h++) gate[h] = h ? 0 : mj_f32_to_bf16(gates[i].g0);
        memcpy(layer->shared_gate, gate, sizeof gate);
        if (!kernel_forward(layer, hidden, out)) break;
        gated_want(layer, hidden, ids, w, nsel, want, gate);
        double e = test_rel_l2(out, want, (size_t)B * H);
        CHECK(e <= 2e-3, "%s: relative L2 %.3g against routed + weight x shared (bound 2e-3)", gates[i].what, e);
        printf("%-24s relative L2 %.2g\n", gates[i].what, e);
    }
    /* The last one is the routed experts alone. */
    struct mj_layer routed = *layer;
    routed.has_shared = 0, routed.is_local = 0, routed.shared_gate = NULL;
    CHECK_OK(mj_experts_ref(&routed, MJ_MODE_W4A16, hidden, B, B, ids, w, nsel, want));
    double e = test_rel_l2(out, want, (size_t)B * H);
    CHECK(e <= 2e-3, "gate -128: relative L2 %.3g against the routed experts alone", e);
    mj_layer_free(layer);
}

/* Families read but not run, for the reason the error names. */
static void case_refused(void) {
    static const struct { const char *file, *why; } refused[] = {
        {"Llama-4-Scout-17B-16E-Instruct.abridged.json", "scales each token's input"},
        {"gpt-oss-20b.json", "MXFP4"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char path[512];
        mj_moe_config c;
        snprintf(path, sizeof path, "%s%s", FAMILIES, refused[i].file);
        CHECK_STATUS(mj_moe_config_read(path, NULL, &c), MJ_ERR_UNSUPPORTED);
        CHECK(strstr(mj_last_error(), refused[i].why) && strstr(mj_last_error(), "is not supported"), "%s: %s",
              refused[i].file, mj_last_error());
    }
}

static const test_case cases[] = {
    TEST_CASE("glm5", case_glm5),
    TEST_CASE("glm45_air", case_glm45_air),
    TEST_CASE("deepseek_v3", case_deepseek_v3),
    TEST_CASE("kimi_k2", case_kimi_k2),
    TEST_CASE("deepseek_v2_lite", case_deepseek_v2_lite),
    TEST_CASE("qwen3_moe", case_qwen3_moe),
    TEST_CASE("qwen2_moe", case_qwen2_moe),
    TEST_CASE("qwen3_next", case_qwen3_next),
    TEST_CASE("qwen2_moe_gate", case_qwen2_moe_gate),
    TEST_CASE("mixtral", case_mixtral),
    TEST_CASE("minimax_m2", case_minimax_m2),
    TEST_CASE("refused", case_refused),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL); }
