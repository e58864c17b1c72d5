/* cmd_make_checkpoint.c — `moejit make-checkpoint`: a ModelOpt-layout NVFP4 checkpoint of
 * random MoE layers, for trying the loader (and engines) without downloading a model. */
#include "tools.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "usage: moejit make-checkpoint --config CONFIG.json --out DIR --seed N [options]\n"
    "\n"
    "Write a Hugging Face checkpoint directory in the layout of a ModelOpt NVFP4 export of the\n"
    "config's MoE model, holding random MoE layers: config.json (CONFIG.json's keys with the\n"
    "overrides below applied), hf_quant_config.json, and the safetensors shards, with\n"
    "model.safetensors.index.json when there is more than one shard. Only the MoE layers' tensors\n"
    "are written: per layer the router (mlp.gate.weight, bf16 [E, H]; with topk_method noaux_tc\n"
    "also mlp.gate.e_score_correction_bias, f32 [E]), and for each routed expert and the shared\n"
    "expert gate_proj, up_proj and down_proj as weight (u8, two FP4 codes a byte), weight_scale\n"
    "(F8_E4M3, one per 16 elements), weight_scale_2 and input_scale (f32 scalars). Mixtral and\n"
    "MiniMax-M2 configs (model_type mixtral, minimax_m2) get their own names: block_sparse_moe.\n"
    "for mlp., experts.E.w1 / w3 / w2 for gate_proj / up_proj / down_proj, MiniMax's bias as\n"
    "block_sparse_moe.e_score_correction_bias ('moejit models' lists each family's).\n"
    "\n"
    "Layer L holds the tensors of mj_layer_create_random(config, mj_checkpoint_layer_seed(N, L)),\n"
    "so a test can rebuild them. The planned size is printed first; a checkpoint that will not fit\n"
    "the file system's free space is refused. Files are written into a new directory beside DIR,\n"
    "which is renamed to DIR when complete: on an error nothing is left behind. DIR must not\n"
    "exist, or be an empty directory. Load the result with mj_checkpoint_open and mj_layer_load\n"
    "(docs/checkpoints.md).\n"
    "\n"
    "options:\n";

enum { OPT_CONFIG = 256, OPT_QUANT, OPT_OUT, OPT_SEED, OPT_LAYERS, OPT_HIDDEN, OPT_INTER, OPT_EXPERTS, OPT_TOPK,
       OPT_SHARD };

/* --config and --quant name the source's files (to copy), not the shared model options, whose
 * config must already be NVFP4-quantized. */
static const tool_opt k_opts[] = {
    {.name = "config", .id = OPT_CONFIG, .has_arg = 1, .arg = "FILE",
     .help = "the source config.json (required); a quantization_config in it must be NVFP4"},
    {.name = "quant", .id = OPT_QUANT, .has_arg = 1, .arg = "FILE",
     .help = "an NVFP4 hf_quant_config.json to copy (default: one written by moejit,\n"
             "NVFP4 with group size 16)"},
    {.name = "out", .id = OPT_OUT, .has_arg = 1, .arg = "DIR", .help = "the checkpoint directory to create (required)"},
    {.name = "seed", .id = OPT_SEED, .has_arg = 1, .arg = "N",
     .help = "the seed of the random layers (required; 0..2^64-1)"},
    {.name = "layers", .id = OPT_LAYERS, .has_arg = 1, .arg = "A-B",
     .help = "the MoE layers A..B to write, dense ones between skipped (or one layer: A;\n"
             "default: the first MoE layer, from first_k_dense_replace and moe_layer_freq);\n"
             "the multi-token-prediction layers after the last (num_nextn_predict_layers:\n"
             "DeepSeek-V3's 61) are MoE layers too"},
    {.name = "hidden", .id = OPT_HIDDEN, .has_arg = 1, .arg = "H", .help = "override hidden_size (a multiple of 64)"},
    {.name = "intermediate", .id = OPT_INTER, .has_arg = 1, .arg = "I",
     .help = "override moe_intermediate_size (a multiple of 64; intermediate_size in\n"
             "Mixtral and MiniMax-M2 configs)"},
    {.name = "experts", .id = OPT_EXPERTS, .has_arg = 1, .arg = "E",
     .help = "override n_routed_experts (num_experts in Qwen-style configs,\n"
             "num_local_experts in Mixtral and MiniMax-M2 ones)"},
    {.name = "topk", .id = OPT_TOPK, .has_arg = 1, .arg = "K", .help = "override num_experts_per_tok"},
    {.name = "shard-mb", .id = OPT_SHARD, .has_arg = 1, .arg = "M",
     .help = "tensor data per shard, in MB of 10^6 bytes, fractions allowed (default 5000,\n"
             "Hugging Face's \"5GB\"); a larger tensor gets a shard of its own"},
    {0}};

/* "A" or "A-B", each 0..INT32_MAX. */
static int parse_layers(const char *text, int32_t *a, int32_t *b) {
    char *end;
    errno = 0;
    long x = strtol(text, &end, 10), y;
    if (errno || end == text || x < 0 || x > INT32_MAX || (*end && *end != '-')) return -1;
    if (!*end) {
        *a = *b = (int32_t)x;
        return 0;
    }
    const char *t = end + 1;
    y = strtol(t, &end, 10);
    if (errno || end == t || *end || y < 0 || y > INT32_MAX || *t == '-' || *t == '+') return -1;
    *a = (int32_t)x;
    *b = (int32_t)y;
    return 0;
}

int cmd_make_checkpoint(int argc, char **argv) {
    const char *cmd = "make-checkpoint";
    mj_checkpoint_make_options o = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    int have_seed = 0, c, v, cli_rc;
    float mb;
    tool_cli cli = {.cmd = cmd, .usage = k_usage, .opts = k_opts};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_CONFIG: o.config_json = optarg; break;
        case OPT_QUANT: o.quant_json = optarg; break;
        case OPT_OUT: o.out_dir = optarg; break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' || optarg[0] == '+' || optarg[0] == ' ')
                return tool_usage(cmd, "--seed wants an integer in 0..18446744073709551615, got '%s'", optarg);
            o.seed = (uint64_t)s;
            have_seed = 1;
            break;
        }
        case OPT_LAYERS:
            if (parse_layers(optarg, &o.layer_first, &o.layer_last))
                return tool_usage(cmd, "--layers wants A or A-B (layer numbers, A <= B), got '%s'", optarg);
            if (o.layer_last < o.layer_first)
                return tool_usage(cmd, "--layers %d-%d: the last layer is before the first", o.layer_first,
                                  o.layer_last);
            break;
        case OPT_HIDDEN: if (tool_parse_int(cmd, "--hidden", optarg, 1, 1 << 20, &v)) return 2; o.hidden = v; break;
        case OPT_INTER: if (tool_parse_int(cmd, "--intermediate", optarg, 1, 1 << 20, &v)) return 2; o.intermediate = v; break;
        case OPT_EXPERTS: if (tool_parse_int(cmd, "--experts", optarg, 1, 1 << 16, &v)) return 2; o.n_experts = v; break;
        case OPT_TOPK: if (tool_parse_int(cmd, "--topk", optarg, 1, 1 << 16, &v)) return 2; o.topk = v; break;
        case OPT_SHARD:
            if (tool_parse_positive_float(cmd, "--shard-mb", optarg, &mb)) return 2;
            if ((double)mb * 1e6 < 1.0 || (double)mb > 9e12)
                return tool_usage(cmd, "--shard-mb wants at least one byte (1e-6) and at most 9e12, got '%s'", optarg);
            o.shard_bytes = (int64_t)((double)mb * 1e6);
            break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    if (optind != argc) return tool_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if (!o.config_json) return tool_usage(cmd, "--config is required");
    if (!o.out_dir) return tool_usage(cmd, "--out is required");
    if (!have_seed) return tool_usage(cmd, "--seed is required");

    mj_checkpoint_make_info info = MJ_CHECKPOINT_MAKE_INFO_INIT;
    mj_status s = mj_checkpoint_make_plan(&o, &info);
    if (s != MJ_OK) return tool_fail_status("make-checkpoint", s);
    const mj_moe_config *cfg = &info.cfg;
    printf("planned: MoE layer%s %d", info.n_layers > 1 ? "s" : "", info.layer_first);
    if (info.n_layers > 1) printf("..%d (%d layers)", info.layer_last, info.n_layers);
    printf(", hidden %d, intermediate %d, %d experts, top-%d, %d shared", cfg->hidden, cfg->intermediate,
           cfg->n_experts, cfg->topk, cfg->n_shared);
    if (cfg->shared_gate) printf(" (one expert %d wide, sigmoid-gated)", cfg->n_shared * cfg->intermediate);
    printf("; %d shard%s, %lld bytes (%.3f GB) in %s\n", info.n_shards, info.n_shards > 1 ? "s" : "",
           (long long)info.total_bytes, (double)info.total_bytes / 1e9, o.out_dir);
    /* Output that cannot be written (a full disk, a closed pipe): stop before the real work. */
    if (fflush(stdout) != 0 || ferror(stdout))
        return tool_fail("cannot write to standard output: nothing was written to %s", o.out_dir);
    s = mj_checkpoint_make(&o);
    if (s != MJ_OK) return tool_fail_status("make-checkpoint", s);
    printf("wrote %s\n", o.out_dir);
    return 0;
}
