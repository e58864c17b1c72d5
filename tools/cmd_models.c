/* cmd_models.c — `moejit models`: the model families moejit reads, from the family table
 * (k_families in runtime/weights/config.c): how each routes, the defaults it gives keys a
 * config leaves out, its keys and tensor names, the upstream code the rules come from, the
 * published config the tests run it on, and the families refused with why. */
#include "tools.h"
#include "moejit_private.h"

#include <jansson.h>
#include <string.h>

static const char k_usage[] =
    "usage: moejit models [--json]\n"
    "\n"
    "The model families moejit reads, by config.json's model_type (or text_config's): how each\n"
    "routes (scoring, selection bias, groups, renormalization, scaling), the defaults its\n"
    "configuration class gives the routing keys a config leaves out, the keys of its expert\n"
    "count and width, its shared expert (its width's key, and the sigmoid gate Qwen2-MoE and\n"
    "Qwen3-Next scale it by), its checkpoint's tensor names, the upstream code the rules are read\n"
    "from, and the published config.json the tests run it on (tests/data/config/families/). Families\n"
    "moejit cannot run are listed with the reason their configs are refused. A model_type not\n"
    "listed is read by its keys alone (softmax, plain top-k, no renormalization when absent).\n"
    "\n"
    "options:\n";

enum { OPT_JSON = 256 };

static const tool_opt k_opts[] = {
    {.name = "json", .id = OPT_JSON, .help = "one JSON object: {\"families\": [...]}, a field per line above"},
    {0}};

static const char *renorm_text(const mj_family *f) {
    switch (f->norm_rule) {
    case MJ_NORM_ALWAYS: return "always";
    case MJ_NORM_KEY_TOPK_GT1: return "norm_topk_prob, when top_k > 1";
    default: return "norm_topk_prob";
    }
}

/* "model.layers.L.mlp.experts.E.{gate_proj,up_proj,down_proj}" and the others. */
static void tensor_texts(const mj_family *f, char *router, char *bias, char *experts, size_t n) {
    const mj_ck_names *nm = mj_family_names(f);
    snprintf(router, n, "model.layers.L.%s.gate.weight", nm->block);
    /* The selection bias: read with topk_method noaux_tc; a fixed router has it or not. */
    int has = f->method && !strcmp(f->method, "noaux_tc");
    if (f->fixed && !has) snprintf(bias, n, "%s", "");
    else snprintf(bias, n, "model.layers.L.%s.%s%s", nm->block, nm->bias,
                  f->fixed ? (f->bias_key ? " (unless use_routing_bias is false)" : "") : " (with topk_method noaux_tc)");
    snprintf(experts, n, "model.layers.L.%s.experts.E.{%s,%s,%s}", nm->block, nm->proj[0], nm->proj[1], nm->proj[2]);
}

/* Its shared expert: how wide (which key), gated or not, and its tensors' names ("" for none:
 * Mixtral's and MiniMax-M2's routers refuse one). */
static void shared_texts(const mj_family *f, char *what, char *tensors, char *gate, size_t n) {
    const mj_ck_names *nm = mj_family_names(f);
    gate[0] = '\0';
    if (f->fixed) {
        snprintf(what, n, "none"), tensors[0] = '\0';
        return;
    }
    if (f->shared_key)
        snprintf(what, n, "%s wide (%d when absent; 0: none), its output x sigmoid(x . %s)", f->shared_key,
                 (int)f->shared_width, nm->shared_gate);
    else
        snprintf(what, n, "n_shared_experts x the expert width (0 when absent), weight 1");
    snprintf(tensors, n, "model.layers.L.%s.%s.{%s,%s,%s}", nm->block, nm->shared, nm->proj[0], nm->proj[1],
             nm->proj[2]);
    if (nm->shared_gate) snprintf(gate, n, "model.layers.L.%s.%s.weight (bf16 [1, H])", nm->block, nm->shared_gate);
}

static json_t *family_json(const mj_family *f) {
    char router[160], bias[160], experts[200];
    tensor_texts(f, router, bias, experts, sizeof router);
    json_t *o = json_object();
    json_object_set_new(o, "model_type", json_string(f->model_type));
    json_object_set_new(o, "models", json_string(f->models));
    json_object_set_new(o, "supported", json_boolean(!f->refused));
    json_object_set_new(o, "source", json_string(f->source));
    json_object_set_new(o, "verified", json_string(f->verified));
    if (f->refused) {
        json_object_set_new(o, "refused", json_string(f->refused));
        return o;
    }
    json_t *d = json_object();
    json_object_set_new(d, "scoring_func", json_string(f->scoring));
    json_object_set_new(d, "topk_method", json_string(f->method));
    json_object_set_new(d, "norm_topk_prob", json_boolean(f->norm));
    json_object_set_new(d, "routed_scaling_factor", json_real(f->rsf));
    json_object_set_new(d, "n_group", json_integer(f->n_group));
    json_object_set_new(d, "topk_group", json_integer(f->topk_group));
    json_object_set_new(o, "routing", json_string(f->routing));
    json_object_set_new(o, "defaults", d);
    json_object_set_new(o, "renormalize", json_string(renorm_text(f)));
    json_object_set_new(o, "routing_keys_read", json_boolean(!f->fixed));
    json_object_set_new(o, "experts_key", json_string(f->experts_key ? f->experts_key : "n_routed_experts"));
    json_object_set_new(o, "width_key", json_string(f->width_key ? f->width_key : "moe_intermediate_size"));
    json_t *t = json_object();
    json_object_set_new(t, "router", json_string(router));
    json_object_set_new(t, "bias", bias[0] ? json_string(bias) : json_null());
    json_object_set_new(t, "experts", json_string(experts));
    char what[200], shared[200], gate[200];
    shared_texts(f, what, shared, gate, sizeof what);
    json_object_set_new(t, "shared_expert", shared[0] ? json_string(shared) : json_null());
    json_object_set_new(t, "shared_expert_gate", gate[0] ? json_string(gate) : json_null());
    json_object_set_new(o, "tensors", t);
    json_t *se = json_object();
    json_object_set_new(se, "width_key",
                        f->fixed ? json_null() : json_string(f->shared_key ? f->shared_key : "n_shared_experts"));
    json_object_set_new(se, "default", json_integer(f->shared_key ? f->shared_width : 0));
    json_object_set_new(se, "gate", f->shared_key ? json_string("sigmoid") : json_null());
    json_object_set_new(se, "allowed", json_boolean(!f->fixed));
    json_object_set_new(o, "shared_expert", se);
    return o;
}

static void family_text(const mj_family *f) {
    char router[160], bias[160], experts[200];
    printf("%s (%s): %s\n", f->model_type, f->models, f->refused ? "refused" : "supported");
    if (f->refused) {
        printf("  why:      %s\n", f->refused);
    } else {
        tensor_texts(f, router, bias, experts, sizeof router);
        printf("  routing:  %s\n", f->routing);
        printf("  defaults: scoring_func %s, topk_method %s, norm_topk_prob %s, routed_scaling_factor %g, n_group %d, "
               "topk_group %d%s\n",
               f->scoring, f->method, f->norm ? "true" : "false", (double)f->rsf, f->n_group, f->topk_group,
               f->fixed ? " (its router reads none of these keys: a config that says otherwise is refused)" : "");
        printf("  renormalize: %s\n", renorm_text(f));
        printf("  keys:     %s, %s\n", f->experts_key ? f->experts_key : "n_routed_experts",
               f->width_key ? f->width_key : "moe_intermediate_size");
        printf("  tensors:  %s, %s%s%s\n", router, experts, bias[0] ? ", " : "", bias);
        char what[200], shared[200], gate[200];
        shared_texts(f, what, shared, gate, sizeof what);
        printf("  shared expert: %s%s%s%s%s\n", what, shared[0] ? "; " : "", shared, gate[0] ? ", " : "", gate);
    }
    printf("  source:   %s\n", f->source);
    if (f->verified && f->verified[0]) printf("  tested on: tests/data/config/families/%s\n", f->verified);
}

int cmd_models(int argc, char **argv) {
    int c, cli_rc, as_json = 0;
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "models", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        if (c == TOOL_CLI_EXIT) return cli_rc;
        if (c == OPT_JSON) as_json = 1;
    }
    if (optind != argc) return tool_usage("models", "takes no operands, got '%s'", argv[optind]);
    size_t n;
    const mj_family *f = mj_families(&n);
    if (!as_json) {
        for (size_t i = 0; i < n; i++) family_text(&f[i]);
        return 0;
    }
    json_t *root = json_object(), *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, family_json(&f[i]));
    json_object_set_new(root, "families", arr);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(root);
    if (!text) return tool_fail("out of memory");
    puts(text);
    free(text);
    return 0;
}
