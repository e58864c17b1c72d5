/* cmd_run.c — `moejit run`: one MoE layer of a checkpoint on a batch from a .npy file,
 * through the JIT kernels (a GPU, or the interpreter) or the CPU reference. */
#include "tools.h"

#include "compare.h"
#include "moejit_private.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "usage: moejit run --checkpoint DIR --input X.npy --output Y.npy [options]\n"
    "\n"
    "Run one MoE layer of a ModelOpt NVFP4 checkpoint on a batch: X is float32 [B, H] (rounded\n"
    "to bf16 on the way in, as a model's hidden states are), Y the layer's output, float32\n"
    "[B, H], written atomically. The layer runs through the generated kernels on the ranks\n"
    "asked for (--tp/--ep), or through the CPU reference (--backend ref).\n"
    "\n"
    "options:\n";

enum { OPT_CK = 256, OPT_LAYER, OPT_IN, OPT_OUT, OPT_NV, OPT_BACKEND, OPT_K0, OPT_CHECK };

static const tool_opt k_opts[] = {
    {.name = "checkpoint", .id = OPT_CK, .has_arg = 1, .arg = "DIR",
     .help = "the checkpoint (config.json, hf_quant_config.json, safetensors)"},
    {.name = "layer", .id = OPT_LAYER, .has_arg = 1, .arg = "L",
     .help = "the MoE layer (default: the first the checkpoint holds)"},
    {.name = "input", .id = OPT_IN, .has_arg = 1, .arg = "X.npy", .help = "float32 [B, H]"},
    {.name = "output", .id = OPT_OUT, .has_arg = 1, .arg = "Y.npy", .help = "float32 [B, H]"},
    {.name = "num-valid", .id = OPT_NV, .has_arg = 1, .arg = "N",
     .help = "rows past N are padding (output 0); default B"},
    {.name = "backend", .id = OPT_BACKEND, .has_arg = 1, .arg = "B",
     .help = "cuda (GPUs), sim (the CPU interpreter running the same kernels), ref\n"
             "(the CPU reference) or auto (default: cuda when there are GPUs for\n"
             "every rank, else sim, whose ranks are loopback threads)"},
    TOOL_SHARED(TOOL_OPT_TP, "default: one rank; on cuda rank r runs on GPU r, summed by NCCL"),
    TOOL_SHARED(TOOL_OPT_EP, NULL),
    {.name = "k0", .id = OPT_K0, .has_arg = 1, .arg = "K", .help = "OEA with k0 = K (default: plain top-k)"},
    TOOL_SHARED(TOOL_OPT_K0_POLICY, "instead of --k0"),
    TOOL_SHARED(TOOL_OPT_MODE, "the reference takes w4a16 (default) or w4a4"),
    TOOL_SHARED(TOOL_OPT_ARCH, "the interpreter's (default {target}; a GPU builds for its own)"),
    {.name = "check", .id = OPT_CHECK,
     .help = "also run the CPU reference and print the relative error; exit 1 if\n"
             "it is above the kernels' tolerance (2e-3 W4A16, 5e-2 W4A4)"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, NULL),
    {0}};

int cmd_run(int argc, char **argv) {
    const char *ck_dir = NULL, *in_path = NULL, *out_path = NULL, *backend = "auto";
    int layer = -1, nv = -1, k0 = 0, check = 0, c, cli_rc;
    char k0_text[16];
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "run", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_CK: ck_dir = optarg; break;
        case OPT_LAYER: if (tool_parse_int("run", "--layer", optarg, 0, 100000, &layer)) return 2; break;
        case OPT_IN: in_path = optarg; break;
        case OPT_OUT: out_path = optarg; break;
        case OPT_NV: if (tool_parse_int("run", "--num-valid", optarg, 0, MJ_MAX_BATCH, &nv)) return 2; break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cuda") && strcmp(optarg, "sim") && strcmp(optarg, "ref") && strcmp(optarg, "auto"))
                return tool_usage("run", "--backend wants cuda, sim, ref or auto, got '%s'", optarg);
            backend = optarg;
            break;
        case OPT_K0: if (tool_parse_int("run", "--k0", optarg, 1, 64, &k0)) return 2; break;
        case OPT_CHECK: check = 1; break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    const mj_parallel par = so.par;
    const int n_ranks = so.n_ranks;
    const char *k0_policy = so.k0_policy, *mode_text = so.mode, *cache_dir = so.cache_dir;
    /* The interpreter's target: the last --arch (checked as it was parsed), else the default. */
    const char *arch = so.n_arch ? so.arch[so.n_arch - 1] : mj_target_name(MJ_DEFAULT_TARGET);
    if (optind != argc) return tool_usage("run", "unexpected argument '%s'", argv[optind]);
    if (!ck_dir || !in_path || !out_path) return tool_usage("run", "--checkpoint, --input and --output are required");
    if (k0 && k0_policy) return tool_usage("run", "give --k0 or --k0-policy, not both");
    if (k0) snprintf(k0_text, sizeof k0_text, "%d", k0), k0_policy = k0_text;
    const int ref = !strcmp(backend, "ref");
    if (ref && par != MJ_PAR_NONE) return tool_usage("run", "the reference runs the whole layer: no --tp/--ep");
    if (ref && check)
        return tool_usage("run", "--check compares the kernels' output with the reference; with --backend ref there "
                                 "are no kernels to check: drop --check or use --backend sim/cuda");
    const char *mode_policy;
    const mj_weight_mode mode = tool_mode_parse(mode_text, &mode_policy);
    if (ref && mode_policy) return tool_usage("run", "the reference takes --mode w4a16 or w4a4");

    /* The backend: cuda needs a GPU per rank. */
    int backend_id = MJ_BACKEND_SIM, gpus = 0;
    if (!ref && strcmp(backend, "sim")) {
        gpus = tool_gpus_present();
        if (gpus >= n_ranks) {
            backend_id = MJ_BACKEND_CUDA;
        } else if (!strcmp(backend, "cuda")) {
            return tool_fail("--backend cuda: %d rank%s, %d GPU%s found (each rank runs on its own GPU): use fewer "
                             "ranks or --backend sim",
                             n_ranks, n_ranks > 1 ? "s" : "", gpus, gpus == 1 ? "" : "s");
        } else if (gpus > 0) {
            fprintf(stderr, "moejit: %d ranks but %d GPUs: all ranks run as loopback ranks on the interpreter\n",
                    n_ranks, gpus);
        }
    }

    char err[512];
    if (npy_check_output(out_path, err, sizeof err)) return tool_fail("%s", err);

    mj_checkpoint_t ck = NULL;
    mj_status st = mj_checkpoint_open(ck_dir, &ck);
    if (st != MJ_OK) return tool_fail_status(ck_dir, st);
    int rc = 1;
    npy_array x = {0};
    float *y = NULL, *want = NULL;
    uint16_t *hidden = NULL;
    mj_layer_t full = NULL;
    mj_moe_config cfg;
    if ((st = mj_checkpoint_config(ck, &cfg)) != MJ_OK) {
        tool_fail_status(ck_dir, st);
        goto done;
    }
    if (layer < 0) {
        int32_t first, n;
        if ((st = mj_checkpoint_moe_layers(ck, &first, 1, &n)) != MJ_OK || n < 1) {
            if (st == MJ_OK) tool_fail("%s holds no MoE layer", ck_dir);
            else tool_fail_status(ck_dir, st);
            goto done;
        }
        layer = first;
    }
    if (npy_load(in_path, "<f4", &x, err, sizeof err)) {
        tool_fail("%s", err);
        goto done;
    }
    char shape[64];
    if (x.ndim != 2 || x.shape[1] != cfg.hidden || x.shape[0] < 1 || x.shape[0] > MJ_MAX_BATCH) {
        tool_fail("%s: shape %s; the layer takes [B, %d] with B in 1..%d", in_path, npy_shape_str(&x, shape, sizeof shape),
                  cfg.hidden, MJ_MAX_BATCH);
        goto done;
    }
    const int32_t B = (int32_t)x.shape[0];
    const size_t n = (size_t)B * (size_t)cfg.hidden;
    if (nv < 0) nv = B;
    if (nv > B) {
        tool_usage("run", "--num-valid %d exceeds the batch's %d rows", nv, B);
        rc = 2;
        goto done;
    }
    hidden = malloc(n * 2), y = malloc(n * 4);
    if (!hidden || !y) {
        tool_fail("out of memory");
        goto done;
    }
    const float *xf = x.data;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(xf[i])) {
            tool_fail("%s: element %zu (row %zu) is not finite", in_path, i, i / (size_t)cfg.hidden);
            goto done;
        }
        hidden[i] = mj_f32_to_bf16(xf[i]);
        /* Finite in float32 but past bf16's largest (3.3895e38, rounded): an infinity. */
        if ((hidden[i] & 0x7F80u) == 0x7F80u) {
            tool_fail("%s: element %zu (row %zu) is %g, which rounds to infinity in bf16 (the largest bf16 is "
                      "3.3895e38); scale the input",
                      in_path, i, i / (size_t)cfg.hidden, (double)xf[i]);
            goto done;
        }
    }
    int32_t k0_ref = cfg.topk;
    if (k0_policy) {
        mj_k0_policy p;
        if ((st = mj_k0_policy_parse(k0_policy, cfg.topk, &p)) != MJ_OK ||
            (st = mj_k0_policy_resolve(&p, B, &k0_ref)) != MJ_OK) {
            tool_usage("run", "%s: %s", k0 ? "--k0" : "--k0-policy", mj_last_error());
            rc = 2;
            goto done;
        }
    }
    mj_weight_mode ref_mode = mode == MJ_MODE_W4A4 ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
    if (ref) {
        if ((st = mj_layer_load(ck, layer, MJ_PAR_NONE, 0, 1, &full)) != MJ_OK) {
            tool_fail_status("loading the layer", st);
            goto done;
        }
        mj_route_stats rs = MJ_ROUTE_STATS_INIT;
        if ((st = mj_moe_forward_ref(full, ref_mode, hidden, B, nv, k0_ref, y, &rs)) != MJ_OK) {
            tool_fail_status("the reference forward", st);
            goto done;
        }
        fprintf(stderr, "layer %d, B %d (%d valid), reference %s, k0 %d: %d active experts\n", layer, B, nv,
                ref_mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", k0_ref, rs.unique_after);
    } else {
        tool_moe_job j;
        memset(&j, 0, sizeof j);
        j.ck = ck, j.layer = layer, j.par = par, j.n_ranks = n_ranks, j.backend = backend_id;
        j.sim_target = arch, j.cache_dir = cache_dir, j.k0_policy = k0_policy, j.mode = mode;
        j.mode_policy = mode_policy, j.hidden = hidden, j.B = B, j.num_valid = nv, j.out = y;
        if (tool_moe_run(&j)) goto done;
        ref_mode = j.mode_used;
        fprintf(stderr,
                "layer %d, B %d (%d valid), %s on %d rank%s (%s), %s, k0 %d: %d active experts; %lld kernels "
                "compiled, prepare %.0f ms, forward %.1f ms\n",
                layer, B, nv, backend_id == MJ_BACKEND_CUDA ? "cuda" : "interpreter", n_ranks, n_ranks > 1 ? "s" : "",
                par == MJ_PAR_TP ? "TP" : par == MJ_PAR_EP ? "EP" : "whole layer",
                j.mode_used == MJ_MODE_W4A4 ? "W4A4" : "W4A16", j.k0, j.n_active, (long long)j.stats.compiles,
                j.prepare_ms, j.forward_ms);
    }
    int64_t shp[2] = {B, cfg.hidden};
    if (npy_save(out_path, "<f4", 4, 2, shp, y, err, sizeof err)) {
        tool_fail("%s", err);
        goto done;
    }
    rc = 0;
    if (check && !ref) {
        if (!full && (st = mj_layer_load(ck, layer, MJ_PAR_NONE, 0, 1, &full)) != MJ_OK) {
            rc = tool_fail_status("loading the layer for --check", st);
            goto done;
        }
        want = malloc(n * 4);
        if (!want || (st = mj_moe_forward_ref(full, ref_mode, hidden, B, nv, k0_ref, want, NULL)) != MJ_OK) {
            rc = want ? tool_fail_status("the reference forward", st) : tool_fail("out of memory");
            goto done;
        }
        tool_cmp cmp;
        if (tool_compare(y, want, n, &cmp)) {
            /* No error to measure: say which side is not finite instead of printing a NaN. */
            char msg[768];
            tool_compare_describe(&cmp, (size_t)cfg.hidden, "the kernels' output", "the CPU reference", msg,
                                  sizeof msg);
            rc = tool_fail("--check: %s", msg);
            goto done;
        }
        const double tol = ref_mode == MJ_MODE_W4A4 ? 5e-2 : 2e-3;
        printf("check: relative L2 %.3e, max |diff| %.3e vs the CPU reference (%s; tolerance %.0e)\n", cmp.rel_l2,
               cmp.max_abs, ref_mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16", tol);
        if (!(cmp.rel_l2 <= tol)) rc = tool_fail("the output is further from the reference than the kernels' tolerance");
    }
done:
    npy_free(&x);
    free(hidden), free(y), free(want);
    mj_layer_free(full);
    mj_checkpoint_close(ck);
    return rc;
}
