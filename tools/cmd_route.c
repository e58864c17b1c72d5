/* cmd_route.c — `moejit route`: noaux_tc / OEA routing of logits from a .npy file. */
#include "tools.h"

#include "moejit_private.h"

#include <inttypes.h>
#include <stdint.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "usage: moejit route [options] LOGITS.npy\n"
    "\n"
    "Route tokens with the noaux_tc router (DeepSeek-V3 / GLM-5) and OEA. LOGITS.npy is\n"
    "float32 [B, E] (or [E] for one token), C order: E 8..1024 (1..65536 with --backend ref),\n"
    "B at most 16777216 and B*E at most 2147483647. Prints JSON on stdout: for each token\n"
    "the chosen expert ids and weights (in ranking order, only the chosen ones), the number of\n"
    "experts it got, and for the batch the unique experts before/after OEA, the mean experts\n"
    "per token, the retained routing mass and the count of NaN logits.\n"
    "\n"
    "options:\n";

enum { OPT_BIAS = 256, OPT_CONFIG, OPT_TOPK, OPT_K0, OPT_RSF, OPT_NORENORM, OPT_SCORING,
       OPT_NGROUP, OPT_TOPKGROUP, OPT_GSCORE, OPT_VALID, OPT_BACKEND };

static const tool_opt k_opts[] = {
    {.name = "bias", .id = OPT_BIAS, .has_arg = 1, .arg = "FILE",
     .help = "e_score_correction_bias, float32 [E] (selection only)"},
    {.name = "config", .id = OPT_CONFIG, .has_arg = 1, .arg = "FILE",
     .help = "a model's config.json: top-k, scaling factor, renorm, scoring,\n"
             "groups and the group score (from topk_method) come from it\n"
             "(flags below override)"},
    {.name = "topk", .id = OPT_TOPK, .has_arg = 1, .arg = "K", .help = "experts per token (default 8, or the model's)"},
    {.name = "k0", .id = OPT_K0, .has_arg = 1, .arg = "K0",
     .help = "OEA phase-1 experts, 1..K (default K: plain top-k)"},
    {.name = "rsf", .id = OPT_RSF, .has_arg = 1, .arg = "X",
     .help = "routed scaling factor, a positive number (default 1.0, or the\n"
             "model's)"},
    {.name = "no-renorm", .id = OPT_NORENORM, .help = "do not renormalize the chosen weights to sum 1"},
    {.name = "scoring", .id = OPT_SCORING, .has_arg = 1, .arg = "S", .help = "sigmoid (default) or softmax"},
    {.name = "n-group", .id = OPT_NGROUP, .has_arg = 1, .arg = "G",
     .help = "expert groups for group-limited routing (default 1)"},
    {.name = "topk-group", .id = OPT_TOPKGROUP, .has_arg = 1, .arg = "G", .help = "groups kept per token (default 1)"},
    {.name = "group-score", .id = OPT_GSCORE, .has_arg = 1, .arg = "R",
     .help = "how a group is scored when --n-group > 1: top2-sum, the sum of\n"
             "its two best selection scores (noaux_tc: DeepSeek-V3, GLM-5), or\n"
             "max, its best one (group_limited_greedy: DeepSeek-V2); default\n"
             "top2-sum, or what the model's topk_method says"},
    {.name = "valid", .id = OPT_VALID, .has_arg = 1, .arg = "N",
     .help = "only the first N rows are real tokens; the rest are padding that\n"
             "gets no experts and does not join OEA's shared set (default B)"},
    TOOL_SHARED(TOOL_OPT_K0_POLICY, "the batch size is the valid tokens' (--valid); instead of --k0"),
    {.name = "backend", .id = OPT_BACKEND, .has_arg = 1, .arg = "B",
     .help = "ref (the CPU reference), sim (the generated kernels on the CPU\n"
             "interpreter) or cuda (on GPU 0); default sim, cuda with a GPU"},
    {0}};

/* What the command routes in one call, checked on the file's int64 shape before narrowing
 * to int. The route kernel (sim and cuda backends) takes 8..1024 experts (runtime/route.c);
 * the CPU reference any number from 1, bounded here to what a model could have. */
#define ROUTE_KERNEL_MIN_EXPERTS 8
#define ROUTE_KERNEL_MAX_EXPERTS 1024
#define ROUTE_REF_MAX_EXPERTS 65536
#define ROUTE_MAX_TOKENS (1 << 24)

static json_t *route_json(const mj_route_params *p, int B, int V, const int32_t *ids,
                          const float *w, const int32_t *nsel, const mj_route_stats *st) {
    json_t *root = json_object(), *jids = json_array(), *jw = json_array(), *jn = json_array();
    for (int b = 0; b < B; b++) {
        json_t *ri = json_array(), *rw = json_array();
        for (int j = 0; j < nsel[b]; j++) {
            json_array_append_new(ri, json_integer(ids[(size_t)b * p->topk + j]));
            json_array_append_new(rw, json_real(w[(size_t)b * p->topk + j]));
        }
        json_array_append_new(jids, ri);
        json_array_append_new(jw, rw);
        json_array_append_new(jn, json_integer(nsel[b]));
    }
    json_object_set_new(root, "tokens", json_integer(B));
    json_object_set_new(root, "valid", json_integer(V));
    json_object_set_new(root, "experts", json_integer(p->n_experts));
    json_object_set_new(root, "topk", json_integer(p->topk));
    json_object_set_new(root, "k0", json_integer(p->k0));
    json_object_set_new(root, "ids", jids);
    json_object_set_new(root, "weights", jw);
    json_object_set_new(root, "experts_per_token", jn);
    json_object_set_new(root, "unique_experts_before", json_integer(st->unique_before));
    json_object_set_new(root, "unique_experts_after", json_integer(st->unique_after));
    json_object_set_new(root, "mean_experts_per_token", json_real(st->mean_experts));
    json_object_set_new(root, "retained_mass", json_real(st->retained_mass));
    json_object_set_new(root, "nan_logits", json_integer(st->nan_logits));
    return root;
}

/* Run mj_route on the sim (host memory) or on GPU 0 (device copies). */
static mj_status route_on_backend(const char *backend, const mj_route_params *p, const float *x,
                                  const float *bias, int B, int V, int32_t *ids, float *w, int32_t *nsel) {
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    int cuda = backend && !strcmp(backend, "cuda");
    o.backend = cuda ? MJ_BACKEND_CUDA : (backend ? MJ_BACKEND_SIM : MJ_BACKEND_AUTO);
    o.device = cuda ? 0 : (backend ? MJ_DEVICE_NONE : MJ_DEVICE_AUTO);
    mj_context_t ctx;
    mj_status s = mj_context_create(&o, &ctx);
    if (s != MJ_OK) return s;
    mj_backend used;
    const char *target;
    mj_context_backend(ctx, &used, &target);
    size_t nx = sizeof(float) * (size_t)B * (size_t)p->n_experts, nk = (size_t)B * (size_t)p->topk;
    mj_route_outputs out = MJ_ROUTE_OUTPUTS_INIT;
    if (used == MJ_BACKEND_SIM) {
        out.ids = ids, out.weights = w, out.n_sel = nsel;
        int32_t nv = V;
        s = mj_route(ctx, p, x, bias, B, &nv, &out, NULL);
    } else {
        uint64_t dx = 0, db = 0, di = 0, dw = 0, dn = 0, dv = 0;
        int32_t nv = V;
        /* Device memory lives in a context: make the device's current on this thread first. */
        s = mj_cuda_bind(0);
        if (s == MJ_OK) s = mj_cuda_malloc(nx, &dx);
        if (s == MJ_OK && bias) s = mj_cuda_malloc(sizeof(float) * (size_t)p->n_experts, &db);
        if (s == MJ_OK) s = mj_cuda_malloc(4 * nk, &di);
        if (s == MJ_OK) s = mj_cuda_malloc(4 * nk, &dw);
        if (s == MJ_OK) s = mj_cuda_malloc(4 * (size_t)B, &dn);
        if (s == MJ_OK) s = mj_cuda_malloc(4, &dv);
        if (s == MJ_OK) s = mj_cuda_memcpy_htod(dv, &nv, 4);
        if (s == MJ_OK) s = mj_cuda_memcpy_htod(dx, x, nx);
        if (s == MJ_OK && bias) s = mj_cuda_memcpy_htod(db, bias, sizeof(float) * (size_t)p->n_experts);
        if (s == MJ_OK) {
            out.ids = (int32_t *)(uintptr_t)di, out.weights = (float *)(uintptr_t)dw;
            out.n_sel = (int32_t *)(uintptr_t)dn;
            s = mj_route(ctx, p, (const float *)(uintptr_t)dx, bias ? (const float *)(uintptr_t)db : NULL, B,
                         (const int32_t *)(uintptr_t)dv, &out, NULL);
        }
        if (s == MJ_OK) s = mj_cuda_synchronize();
        if (s == MJ_OK) s = mj_cuda_memcpy_dtoh(ids, di, 4 * nk);
        if (s == MJ_OK) s = mj_cuda_memcpy_dtoh(w, dw, 4 * nk);
        if (s == MJ_OK) s = mj_cuda_memcpy_dtoh(nsel, dn, 4 * (size_t)B);
        uint64_t all[6] = {dx, db, di, dw, dn, dv};
        for (int i = 0; i < 6; i++)
            if (all[i]) mj_cuda_free(all[i]);
    }
    mj_context_destroy(ctx);
    return s;
}

int cmd_route(int argc, char **argv) {
    const char *bias_path = NULL, *config_path = NULL, *backend = NULL;
    int topk = -1, k0 = -1, no_renorm = 0, n_group = -1, topk_group = -1, valid = -1;
    int scoring = -1, gscore = -1;
    float rsf = 0.0f;
    int have_rsf = 0, c, cli_rc;
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "route", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_BIAS: bias_path = optarg; break;
        case OPT_CONFIG: config_path = optarg; break;
        case OPT_TOPK: if (tool_parse_int("route", "--topk", optarg, 1, 1 << 20, &topk)) return 2; break;
        case OPT_K0: if (tool_parse_int("route", "--k0", optarg, 1, 1 << 20, &k0)) return 2; break;
        case OPT_RSF: if (tool_parse_positive_float("route", "--rsf", optarg, &rsf)) return 2; have_rsf = 1; break;
        case OPT_NORENORM: no_renorm = 1; break;
        case OPT_SCORING:
            if (!strcmp(optarg, "sigmoid")) scoring = MJ_SCORING_SIGMOID;
            else if (!strcmp(optarg, "softmax")) scoring = MJ_SCORING_SOFTMAX;
            else return tool_usage("route", "--scoring wants sigmoid or softmax, got '%s'", optarg);
            break;
        case OPT_NGROUP: if (tool_parse_int("route", "--n-group", optarg, 1, 1 << 20, &n_group)) return 2; break;
        case OPT_TOPKGROUP: if (tool_parse_int("route", "--topk-group", optarg, 1, 1 << 20, &topk_group)) return 2; break;
        case OPT_GSCORE:
            if (!strcmp(optarg, "top2-sum")) gscore = MJ_GROUP_SCORE_TOP2_SUM;
            else if (!strcmp(optarg, "max")) gscore = MJ_GROUP_SCORE_MAX;
            else return tool_usage("route", "--group-score wants top2-sum or max, got '%s'", optarg);
            break;
        case OPT_VALID: if (tool_parse_int("route", "--valid", optarg, 0, 1 << 30, &valid)) return 2; break;
        case OPT_BACKEND:
            if (strcmp(optarg, "ref") && strcmp(optarg, "sim") && strcmp(optarg, "cuda"))
                return tool_usage("route", "--backend wants ref, sim or cuda, got '%s'", optarg);
            backend = optarg;
            break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    const char *policy = so.k0_policy;
    if (optind + 1 != argc) return tool_usage("route", "expected one LOGITS.npy file");

    mj_route_params p = MJ_ROUTE_PARAMS_INIT;
    p.topk = 8;
    mj_moe_config cfg;
    if (config_path) {
        mj_status s = mj_moe_config_read(config_path, NULL, &cfg);
        if (s != MJ_OK) return tool_fail_status("reading the model config", s);
        mj_route_params_from_config(&cfg, &p);
    }
    if (topk > 0) p.topk = topk;
    if (have_rsf) p.routed_scaling_factor = rsf;
    if (no_renorm) p.renormalize = 0;
    if (scoring >= 0) p.scoring = (mj_scoring)scoring;
    if (n_group > 0) p.n_group = n_group;
    if (topk_group > 0) p.topk_group = topk_group;
    if (gscore >= 0) p.group_score = (mj_group_score)gscore;
    p.k0 = k0 > 0 ? k0 : p.topk;
    if (policy && k0 > 0) return tool_usage("route", "give --k0 or --k0-policy, not both");

    char err[512], sh[128];
    npy_array lg, bias = {0};
    if (npy_load(argv[optind], "<f4", &lg, err, sizeof err)) return tool_fail("%s", err);
    int rc = 1;
    int32_t *ids = NULL, *nsel = NULL;
    float *w = NULL;
    if (lg.ndim != 1 && lg.ndim != 2) {
        tool_fail("%s: logits must be [B, E] or [E], got shape %s", argv[optind], npy_shape_str(&lg, sh, sizeof sh));
        goto done;
    }
    /* Check the file's int64 dimensions against what routing takes before narrowing them. */
    int64_t B64 = lg.ndim == 2 ? lg.shape[0] : 1, E64 = lg.shape[lg.ndim - 1];
    int kernel = !backend || strcmp(backend, "ref");
    int64_t e_lo = kernel ? ROUTE_KERNEL_MIN_EXPERTS : 1, e_hi = kernel ? ROUTE_KERNEL_MAX_EXPERTS : ROUTE_REF_MAX_EXPERTS;
    if (B64 > ROUTE_MAX_TOKENS) {
        tool_fail("%s: logits have %" PRId64 " tokens (shape %s); at most %d in one call: split the batch",
                  argv[optind], B64, npy_shape_str(&lg, sh, sizeof sh), ROUTE_MAX_TOKENS);
        goto done;
    }
    if (E64 < e_lo || E64 > e_hi) {
        tool_fail("%s: logits have %" PRId64 " experts (shape %s); the %s takes %" PRId64 "..%" PRId64, argv[optind],
                  E64, npy_shape_str(&lg, sh, sizeof sh),
                  kernel ? "route kernel (--backend sim, cuda)" : "CPU reference (--backend ref)", e_lo, e_hi);
        goto done;
    }
    if (B64 * E64 > INT32_MAX) {
        tool_fail("%s: logits [%" PRId64 ", %" PRId64 "] have more than %d values: split the batch", argv[optind],
                  B64, E64, INT32_MAX);
        goto done;
    }
    int B = (int)B64, E = (int)E64;
    if (config_path && E != p.n_experts) {
        tool_fail("%s: logits have %d experts but %s has n_routed_experts %d", argv[optind], E,
                  config_path, p.n_experts);
        goto done;
    }
    p.n_experts = E;
    if (bias_path) {
        if (npy_load(bias_path, "<f4", &bias, err, sizeof err)) {
            tool_fail("%s", err);
            goto done;
        }
        if (bias.ndim != 1 || bias.shape[0] != E) {
            tool_fail("%s: bias must be [%d] to match the logits, got shape %s", bias_path, E,
                      npy_shape_str(&bias, sh, sizeof sh));
            goto done;
        }
    }
    if (valid < 0) valid = B;
    if (valid > B) {
        tool_usage("route", "--valid %d exceeds the %d tokens in %s", valid, B, argv[optind]);
        rc = 2;
        goto done;
    }
    ids = malloc(sizeof *ids * (size_t)(B ? B : 1) * (size_t)p.topk);
    w = malloc(sizeof *w * (size_t)(B ? B : 1) * (size_t)p.topk);
    nsel = malloc(sizeof *nsel * (size_t)(B ? B : 1));
    if (!ids || !w || !nsel) {
        tool_fail("out of memory");
        goto done;
    }
    if (policy) {
        mj_k0_policy pol;
        mj_status ps = mj_k0_policy_parse(policy, p.topk, &pol);
        if (ps == MJ_OK) ps = mj_k0_policy_resolve(&pol, valid > 0 ? valid : 1, &p.k0);
        if (ps != MJ_OK) {
            tool_fail_status("--k0-policy", ps);
            goto done;
        }
    }
    /* The statistics always come from the reference; the ids and weights from the backend. */
    mj_route_stats st = MJ_ROUTE_STATS_INIT;
    mj_status s = mj_route_ref(&p, lg.data, bias_path ? bias.data : NULL, B, valid, ids, w, nsel, &st);
    if (s != MJ_OK) {
        tool_fail_status("routing", s);
        goto done;
    }
    if (!backend || strcmp(backend, "ref")) {
        s = route_on_backend(backend, &p, lg.data, bias_path ? bias.data : NULL, B, valid, ids, w, nsel);
        if (s != MJ_OK) {
            tool_fail_status(backend ? backend : "sim", s);
            goto done;
        }
    }
    json_t *root = route_json(&p, B, valid, ids, w, nsel, &st);
    json_dumpf(root, stdout, JSON_INDENT(0) | JSON_COMPACT | JSON_REAL_PRECISION(9));
    fputc('\n', stdout);
    json_decref(root);
    rc = 0;
done:
    free(ids), free(w), free(nsel);
    npy_free(&lg), npy_free(&bias);
    return rc;
}
