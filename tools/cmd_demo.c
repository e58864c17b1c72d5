/* cmd_demo.c — `moejit demo`: the whole pipeline on a small GLM-5-shaped checkpoint. */
#include "tools.h"

#include "compare.h"
#include "moejit_private.h"

#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char k_usage[] =
    "usage: moejit demo [options]\n"
    "\n"
    "The whole pipeline on a small GLM-5-shaped model: write a random ModelOpt NVFP4\n"
    "checkpoint (GLM-5's routing: 256 experts, top-8, sigmoid noaux_tc with correction bias,\n"
    "scaling 2.5, one shared expert; smaller hidden and intermediate sizes) into a temporary\n"
    "directory, load one MoE layer from it on 8 ranks (each rank reads only its slice), and\n"
    "run it through the generated kernels with tensor and with expert parallelism, with plain\n"
    "top-k and with OEA, each output checked against the CPU reference. The 8 ranks are\n"
    "loopback ranks on the interpreter (the kernels' CPU execution); on a machine with a GPU\n"
    "the whole layer also runs there. Prints the specializations compiled or found in the\n"
    "cache, unique experts, weight bytes read, and the time that read takes at the memory\n"
    "bandwidth of an RTX PRO 6000. Exit status 1 if any check fails.\n"
    "\n"
    "options:\n";

enum { OPT_SEED = 256, OPT_BATCH, OPT_K0, OPT_HIDDEN, OPT_INTER, OPT_EXPERTS, OPT_TOPK, OPT_MODE, OPT_KEEP };

static const tool_opt k_opts[] = {
    {.name = "seed", .id = OPT_SEED, .has_arg = 1, .arg = "N",
     .help = "seed of the checkpoint and the batch (default 1)"},
    {.name = "batch", .id = OPT_BATCH, .has_arg = 1, .arg = "B", .help = "tokens in the batch, 1..256 (default 16)"},
    {.name = "k0", .id = OPT_K0, .has_arg = 1, .arg = "K0", .help = "OEA phase-1 experts (default 4)"},
    {.name = "hidden", .id = OPT_HIDDEN, .has_arg = 1, .arg = "H",
     .help = "hidden size, a multiple of 64 (default 512)"},
    {.name = "intermediate", .id = OPT_INTER, .has_arg = 1, .arg = "I",
     .help = "expert intermediate size, a multiple of 512 so TP 8 splits it\n"
             "(default 512)"},
    {.name = "experts", .id = OPT_EXPERTS, .has_arg = 1, .arg = "E",
     .help = "routed experts, a multiple of 8 (default 256)"},
    {.name = "topk", .id = OPT_TOPK, .has_arg = 1, .arg = "K", .help = "experts per token (default 8)"},
    {.name = "mode", .id = OPT_MODE, .has_arg = 1, .arg = "M",
     .help = "w4a16 (default) or w4a4 (activations in NVFP4, as on sm_120)"},
    {.name = "keep", .id = OPT_KEEP, .has_arg = 1, .arg = "DIR",
     .help = "write the checkpoint to DIR (new) and keep it"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, NULL),
    {0}};

/* GLM-5's MoE configuration (config.json, the keys moejit reads). */
static const char k_glm5_config[] =
    "{\n"
    "  \"architectures\": [\"GlmMoeDsaForCausalLM\"],\n"
    "  \"model_type\": \"glm_moe_dsa\",\n"
    "  \"hidden_size\": 6144,\n"
    "  \"moe_intermediate_size\": 2048,\n"
    "  \"n_routed_experts\": 256,\n"
    "  \"num_experts_per_tok\": 8,\n"
    "  \"n_shared_experts\": 1,\n"
    "  \"n_group\": 1,\n"
    "  \"topk_group\": 1,\n"
    "  \"topk_method\": \"noaux_tc\",\n"
    "  \"scoring_func\": \"sigmoid\",\n"
    "  \"routed_scaling_factor\": 2.5,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"first_k_dense_replace\": 3,\n"
    "  \"num_hidden_layers\": 78,\n"
    "  \"hidden_act\": \"silu\"\n"
    "}\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* The temporary directory this command made (mkdtemp), without following links. */
static void rm_tree(const char *dir) { nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

int cmd_demo(int argc, char **argv) {
    int seed = 1, batch = 16, k0 = 4, hidden = 512, inter = 512, experts = 256, topk = 8, c, cli_rc;
    const char *keep = NULL;
    mj_weight_mode mode = MJ_MODE_W4A16;
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "demo", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_SEED: if (tool_parse_int("demo", "--seed", optarg, 0, 2147483647L, &seed)) return 2; break;
        case OPT_BATCH: if (tool_parse_int("demo", "--batch", optarg, 1, 256, &batch)) return 2; break;
        case OPT_K0: if (tool_parse_int("demo", "--k0", optarg, 1, 16, &k0)) return 2; break;
        case OPT_HIDDEN: if (tool_parse_int("demo", "--hidden", optarg, 64, 16384, &hidden)) return 2; break;
        case OPT_INTER: if (tool_parse_int("demo", "--intermediate", optarg, 512, 8192, &inter)) return 2; break;
        case OPT_EXPERTS: if (tool_parse_int("demo", "--experts", optarg, 8, 1024, &experts)) return 2; break;
        case OPT_TOPK: if (tool_parse_int("demo", "--topk", optarg, 1, 16, &topk)) return 2; break;
        case OPT_MODE:
            if (!strcmp(optarg, "w4a16")) mode = MJ_MODE_W4A16;
            else if (!strcmp(optarg, "w4a4")) mode = MJ_MODE_W4A4;
            else return tool_usage("demo", "--mode wants w4a16 or w4a4, got '%s'", optarg);
            break;
        case OPT_KEEP: keep = optarg; break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    const char *cache_dir = so.cache_dir;
    if (optind != argc) return tool_usage("demo", "unexpected argument '%s'", argv[optind]);
    if (k0 > topk) return tool_usage("demo", "--k0 %d exceeds --topk %d", k0, topk);
    if (hidden % 64) return tool_usage("demo", "--hidden %d is not a multiple of 64", hidden);
    if (inter % 512) return tool_usage("demo", "--intermediate %d is not a multiple of 512 (TP 8 x 64)", inter);
    if (experts % 8) return tool_usage("demo", "--experts %d is not a multiple of 8 (EP 8)", experts);
    if (topk > experts) return tool_usage("demo", "--topk %d exceeds --experts %d", topk, experts);

    int rc = 1, failed = 0;
    char why[768] = ""; /* the first run whose output or reference is not finite, said */
    char path[4096], ckdir[4096];
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/moejit-demo-XXXXXX", base && *base ? base : "/tmp");
    char *tdir = mkdtemp(tmpl);
    if (!tdir) return tool_fail("cannot make a temporary directory under %s", base && *base ? base : "/tmp");
    mj_checkpoint_t ck = NULL;
    mj_layer_t full = NULL;
    uint16_t *h = NULL;
    float *out = NULL, *want = NULL;
    snprintf(path, sizeof path, "%s/config.json", tdir);
    FILE *f = fopen(path, "wx");
    if (!f || fputs(k_glm5_config, f) < 0 || fclose(f)) {
        tool_fail("cannot write %s", path);
        goto done;
    }
    snprintf(ckdir, sizeof ckdir, "%s", keep ? keep : tdir);
    if (!keep) strncat(ckdir, "/checkpoint", sizeof ckdir - strlen(ckdir) - 1);

    /* 1. The checkpoint. */
    double t0 = now_s();
    mj_checkpoint_make_options mo = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    mo.config_json = path, mo.out_dir = ckdir, mo.seed = (uint64_t)seed;
    mo.hidden = hidden, mo.intermediate = inter, mo.n_experts = experts, mo.topk = topk;
    mo.shard_bytes = 16 << 20;
    mj_checkpoint_make_info info = MJ_CHECKPOINT_MAKE_INFO_INIT;
    mj_status st = mj_checkpoint_make_plan(&mo, &info);
    if (st == MJ_OK) st = mj_checkpoint_make(&mo);
    if (st != MJ_OK) {
        tool_fail_status("writing the checkpoint", st);
        goto done;
    }
    printf("checkpoint: layer %d of a GLM-5-shaped model (hidden %d, intermediate %d, %d experts, top-%d, 1 "
           "shared), %.1f MB in %d shards, %s (%.1f s)\n",
           info.layer_first, hidden, inter, experts, topk, info.total_bytes / 1e6, info.n_shards,
           keep ? ckdir : "a temporary directory", now_s() - t0);
    if ((st = mj_checkpoint_open(ckdir, &ck)) != MJ_OK || (st = mj_layer_load(ck, info.layer_first, MJ_PAR_NONE, 0, 1,
                                                                             &full)) != MJ_OK) {
        tool_fail_status("reading the checkpoint back", st);
        goto done;
    }
    const size_t n = (size_t)batch * (size_t)hidden;
    h = malloc(n * 2), out = malloc(n * 4), want = malloc(n * 4);
    if (!h || !out || !want) {
        tool_fail("out of memory");
        goto done;
    }
    uint64_t rng = (uint64_t)seed ^ 0xD1B54A32D192ED03ull;
    for (size_t i = 0; i < n; i++) h[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
    const tool_gpu *gpu = tool_gpu_find("rtx-pro-6000");
    const double glm5_expert = (double)mj_pack_expert_bytes(6144, 2048);
    const int gpus = tool_gpus_present();
    printf("batch: %d tokens, %s; kernels on the interpreter (8 loopback ranks)%s\n\n", batch,
           mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", gpus ? " and on GPU 0 (the whole layer)" : "; no GPU here");
    printf("%-22s %7s %9s %12s %13s %9s %s\n", "run", "experts", "compiled", "MB read/rank", "floor/rank us",
           "rel L2", "check");

    /* 2. The layer on 8 ranks, TP and EP, plain top-k and OEA; then the GPU. */
    int active[2] = {0, 0};
    for (int run = 0; run < 6; run++) {
        const int oea = run % 2, on_gpu = run >= 4;
        if (on_gpu && !gpus) break;
        const mj_parallel par = on_gpu ? MJ_PAR_NONE : run < 2 ? MJ_PAR_TP : MJ_PAR_EP;
        const int ranks = on_gpu ? 1 : 8, k = oea ? k0 : topk;
        char k0s[16], label[64];
        snprintf(k0s, sizeof k0s, "%d", k);
        snprintf(label, sizeof label, "%s %s", on_gpu ? "GPU 0" : par == MJ_PAR_TP ? "TP=8" : "EP=8",
                 oea ? "OEA" : "top-k");
        if (oea) snprintf(label + strlen(label), sizeof label - strlen(label), " k0=%d", k0);
        tool_moe_job j;
        memset(&j, 0, sizeof j);
        j.ck = ck, j.layer = info.layer_first, j.par = par, j.n_ranks = ranks;
        j.backend = on_gpu ? MJ_BACKEND_CUDA : MJ_BACKEND_SIM, j.sim_target = mj_target_name(MJ_DEFAULT_TARGET);
        j.cache_dir = cache_dir;
        j.k0_policy = k0s, j.mode = mode, j.hidden = h, j.B = batch, j.num_valid = batch, j.out = out;
        if (tool_moe_run(&j)) goto done;
        if ((st = mj_moe_forward_ref(full, mode, h, batch, batch, k, want, NULL)) != MJ_OK) {
            tool_fail_status("the reference forward", st);
            goto done;
        }
        tool_cmp cmp;
        const int nonfinite = tool_compare(out, want, n, &cmp);
        const double e = cmp.rel_l2, tol = mode == MJ_MODE_W4A4 ? 5e-2 : 2e-3;
        const int ok = !nonfinite && e <= tol;
        failed += !ok;
        if (nonfinite && !*why) {
            snprintf(why, sizeof why, "%s: ", label);
            tool_compare_describe(&cmp, (size_t)hidden, "the kernels' output", "the CPU reference", why + strlen(why),
                                  sizeof why - strlen(why));
        }
        char mb[32], fl[32];
        if (on_gpu) {
            snprintf(mb, sizeof mb, "%s", "-"), snprintf(fl, sizeof fl, "%s", "-");
        } else {
            snprintf(mb, sizeof mb, "%.2f", j.max_rank_bytes / 1e6);
            snprintf(fl, sizeof fl, "%.2f", gpu ? j.max_rank_bytes / (gpu->gbps * 1e3) : 0.0);
        }
        char es[32];
        if (nonfinite) snprintf(es, sizeof es, "%s", "non-finite");
        else snprintf(es, sizeof es, "%.2e", e);
        printf("%-22s %7d %9lld %12s %13s %9s %s\n", label, j.n_active, (long long)j.stats.compiles, mb, fl, es,
               ok ? "ok" : "FAILED");
        if (run < 2) active[run] = j.n_active;
    }
    if (gpu && active[0] && active[1])
        printf("\nAt GLM-5's size (hidden 6144, intermediate 2048) plain top-%d's %d experts are %.0f MB of weights, "
               "%.0f us at %.0f GB/s; OEA's %d are %.0f MB, %.0f us: %.2fx less to read.\n",
               topk, active[0], active[0] * glm5_expert / 1e6, active[0] * glm5_expert / (gpu->gbps * 1e3), gpu->gbps,
               active[1], active[1] * glm5_expert / 1e6, active[1] * glm5_expert / (gpu->gbps * 1e3),
               (double)active[0] / active[1]);
    printf("\n(experts: distinct experts the batch reads; compiled: kernels compiled by this run, the rest came "
           "from the cache; MB read/rank: weight bytes the busiest rank streamed, counted by the interpreter; "
           "floor: that read at %s's %.0f GB/s)\n",
           gpu ? gpu->desc : "the GPU", gpu ? gpu->gbps : 0.0);
    if (*why) {
        tool_fail("%s", why);
        goto done;
    }
    if (failed) {
        tool_fail("%d run%s further from the CPU reference than the kernels' tolerance", failed, failed > 1 ? "s" : "");
        goto done;
    }
    rc = 0;
done:
    free(h), free(out), free(want);
    mj_layer_free(full);
    mj_checkpoint_close(ck);
    rm_tree(tdir);
    return rc;
}
