/* cmd_demo.c — `moejit demo`: what OEA does to one MoE layer, on the CPU reference. */
#include "tools.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static const char k_help[] =
    "usage: moejit demo [options]\n"
    "\n"
    "Build a small GLM-5-shaped MoE layer from a seed (GLM-5's routing: 256 experts, top-8,\n"
    "sigmoid noaux_tc with correction bias, scaling 2.5, one shared expert; smaller hidden and\n"
    "intermediate sizes so it runs in seconds), quantize it to NVFP4, and run the CPU reference\n"
    "forward on a random batch with plain top-k and with OEA. Prints unique experts, mean\n"
    "experts per token, retained routing mass, and how far the OEA output is from plain.\n"
    "\n"
    "options:\n"
    "  --seed N          seed of the layer and the batch (default 1)\n"
    "  --batch B         tokens in the batch (default 16)\n"
    "  --k0 K0           OEA phase-1 experts (default 4)\n"
    "  --hidden H        hidden size, a multiple of 64 (default 512)\n"
    "  --intermediate I  expert intermediate size, a multiple of 64 (default 256)\n"
    "  --experts E       routed experts (default 256)\n"
    "  --topk K          experts per token (default 8)\n"
    "  --mode M          w4a16 (default) or w4a4 (activations in NVFP4, as on sm_120)\n"
    "  -h, --help        this text\n"
    "  -V, --version     print the version\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { OPT_SEED = 256, OPT_BATCH, OPT_K0, OPT_HIDDEN, OPT_INTER, OPT_EXPERTS, OPT_TOPK, OPT_MODE };

int cmd_demo(int argc, char **argv) {
    static const struct option opts[] = {
        {"seed", required_argument, 0, OPT_SEED},     {"batch", required_argument, 0, OPT_BATCH},
        {"k0", required_argument, 0, OPT_K0},         {"hidden", required_argument, 0, OPT_HIDDEN},
        {"intermediate", required_argument, 0, OPT_INTER}, {"experts", required_argument, 0, OPT_EXPERTS},
        {"topk", required_argument, 0, OPT_TOPK},     {"mode", required_argument, 0, OPT_MODE},
        {"help", no_argument, 0, 'h'},                {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    int seed = 1, batch = 16, k0 = 4, c;
    mj_weight_mode mode = MJ_MODE_W4A16;
    mj_moe_config cfg;
    mj_moe_config_glm5(&cfg);
    cfg.hidden = 512;
    cfg.intermediate = 256;
    optind = 1;
    opterr = 0; /* we report bad options ourselves, in one line */
    while ((c = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
        switch (c) {
        case OPT_SEED: if (tool_parse_int("demo", "--seed", optarg, 0, 2147483647L, &seed)) return 2; break;
        case OPT_BATCH: if (tool_parse_int("demo", "--batch", optarg, 1, 4096, &batch)) return 2; break;
        case OPT_K0: if (tool_parse_int("demo", "--k0", optarg, 1, 1024, &k0)) return 2; break;
        case OPT_HIDDEN: if (tool_parse_int("demo", "--hidden", optarg, 1, 16384, &cfg.hidden)) return 2; break;
        case OPT_INTER: if (tool_parse_int("demo", "--intermediate", optarg, 1, 16384, &cfg.intermediate)) return 2; break;
        case OPT_EXPERTS: if (tool_parse_int("demo", "--experts", optarg, 1, 4096, &cfg.n_experts)) return 2; break;
        case OPT_TOPK: if (tool_parse_int("demo", "--topk", optarg, 1, 1024, &cfg.topk)) return 2; break;
        case OPT_MODE:
            if (!strcmp(optarg, "w4a16")) mode = MJ_MODE_W4A16;
            else if (!strcmp(optarg, "w4a4")) mode = MJ_MODE_W4A4;
            else return tool_usage("demo", "--mode wants w4a16 or w4a4, got '%s'", optarg);
            break;
        case 'h': fputs(k_help, stdout); return 0;
        case 'V': printf("moejit %s\n", MJ_VERSION_STRING); return 0;
        default: return tool_usage("demo", "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc) return tool_usage("demo", "unexpected argument '%s'", argv[optind]);
    if (k0 > cfg.topk) return tool_usage("demo", "--k0 %d exceeds --topk %d", k0, cfg.topk);
    mj_status s = mj_moe_config_validate(&cfg, 1);
    if (s != MJ_OK) return tool_fail_status("demo config", s);

    printf("layer: hidden %d, intermediate %d, %d experts, top-%d, %d shared, rsf %.2f, %s, seed %d\n",
           cfg.hidden, cfg.intermediate, cfg.n_experts, cfg.topk, cfg.n_shared,
           cfg.routed_scaling_factor, mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", seed);
    double t0 = now_s();
    mj_layer_t layer;
    s = mj_layer_create_random(&cfg, (uint64_t)seed, &layer);
    if (s != MJ_OK) return tool_fail_status("creating the layer", s);
    double t1 = now_s();
    printf("built and quantized in %.2f s\n", t1 - t0);

    int rc = 1;
    size_t n = (size_t)batch * (size_t)cfg.hidden;
    uint16_t *hidden = malloc(n * sizeof *hidden);
    float *y_plain = malloc(n * sizeof(float)), *y_oea = malloc(n * sizeof(float));
    if (!hidden || !y_plain || !y_oea) {
        tool_fail("out of memory");
        goto done;
    }
    uint64_t rng = (uint64_t)seed ^ 0xD1B54A32D192ED03ull;
    for (size_t i = 0; i < n; i++) hidden[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));

    mj_route_stats st_plain = MJ_ROUTE_STATS_INIT, st_oea = MJ_ROUTE_STATS_INIT;
    t0 = now_s();
    s = mj_moe_forward_ref(layer, mode, hidden, batch, batch, cfg.topk, y_plain, &st_plain);
    t1 = now_s();
    if (s != MJ_OK) {
        tool_fail_status("forward (plain top-k)", s);
        goto done;
    }
    double t2 = now_s();
    s = mj_moe_forward_ref(layer, mode, hidden, batch, batch, k0, y_oea, &st_oea);
    double t3 = now_s();
    if (s != MJ_OK) {
        tool_fail_status("forward (OEA)", s);
        goto done;
    }
    double d2 = 0, r2 = 0, dmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y_oea[i] - (double)y_plain[i];
        d2 += d * d;
        r2 += (double)y_plain[i] * y_plain[i];
        if (fabs(d) > dmax) dmax = fabs(d);
    }
    printf("batch %d tokens\n", batch);
    printf("  plain top-%d: unique experts %3d, experts/token %.2f, forward %.1f ms\n", cfg.topk,
           st_plain.unique_after, st_plain.mean_experts, 1e3 * (t1 - t0));
    printf("  OEA k0=%d:    unique experts %3d, experts/token %.2f, forward %.1f ms\n", k0,
           st_oea.unique_after, st_oea.mean_experts, 1e3 * (t3 - t2));
    printf("  expert weights read: %.1f%% of plain top-k\n",
           st_plain.unique_after ? 100.0 * st_oea.unique_after / st_plain.unique_after : 100.0);
    printf("  retained routing mass %.4f\n", st_oea.retained_mass);
    printf("  output difference OEA vs plain: relative L2 %.4f, max |diff| %.4g\n",
           r2 > 0 ? sqrt(d2 / r2) : 0.0, dmax);
    rc = 0;
done:
    free(hidden), free(y_plain), free(y_oea);
    mj_layer_free(layer);
    return rc;
}
