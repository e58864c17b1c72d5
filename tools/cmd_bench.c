/* cmd_bench.c — `moejit bench`: what a model's MoE layer costs, measured where it can be.
 * This file is the command: its options, the model and rank 0's shapes, whether there is a
 * GPU, the report's head, then the sections in order, each in a file of its own (bench.h):
 *   plan        (bench_plan.c) the specializations mj_moe_prepare compiles and their cold
 *               compile, disk load and in-memory lookup times, no GPU needed;
 *   launch, bytes  (bench_sim.c) on the interpreter: the host time of one forward's launch
 *               path, and the weight bytes a forward reads against the floor;
 *   predict     (predict_plan.c) the performance model, with --predict;
 *   copy, routing, experts, layer  (bench_gpu.c) with a GPU (device 0): timed with CUDA
 *               events, cold L2, and the goals checked.
 * And what the sections share: timing, the report's text and notes, rank 0's layer. */
#include "bench.h"

#include "moejit_private.h"
#include "predict.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char k_usage[] =
    "usage: moejit bench [options]\n"
    "\n"
    "What a model's MoE layer costs, measured where it can be. Without a GPU: the kernel\n"
    "specializations of a plan with their cold compile, disk-cache load and in-memory lookup\n"
    "times; the host time of one forward's launch path (on the interpreter, launches recorded,\n"
    "not run); the weight bytes one forward reads against the floor, for each batch size and\n"
    "k0, and that floor on named GPUs. With a GPU (device 0), also timed with CUDA events:\n"
    "copy bandwidth, routing, the experts, and the whole layer eager and from a CUDA graph;\n"
    "the GPU timings are cold-L2 (before each timed call, outside its events, a write of\n"
    "twice the L2 evicts the weights the last call left there, so they come from DRAM).\n"
    "Plain text, or JSON with --json.\n"
    "\n";

enum { OPT_CK = 256, OPT_HIDDEN, OPT_INTER, OPT_EXPERTS, OPT_TOPK, OPT_BB, OPT_K0, OPT_REPS, OPT_ITERS, OPT_SIMI,
       OPT_COPY, OPT_NOCOMPILE, OPT_NOGPU, OPT_NOSIM, OPT_JSON, OPT_PREDICT };

static const tool_opt k_opts[] = {
    TOOL_HEADING("the model and its split (as `moejit prewarm --config`):"),
    TOOL_SHARED(TOOL_OPT_CONFIG, "default: GLM-5's MoE layer"),
    TOOL_SHARED(TOOL_OPT_QUANT, NULL),
    {.name = "checkpoint", .id = OPT_CK, .has_arg = 1, .arg = "DIR",
     .help = "take the config and the layer's weights (its first MoE layer, or this\n"
             "rank's slice of it with --tp/--ep) from a ModelOpt NVFP4 checkpoint;\n"
             "rank 0's is loaded (validated) first, with or without a GPU"},
    {.name = "hidden", .id = OPT_HIDDEN, .has_arg = 1, .arg = "H",
     .synopsis = "--hidden H, --intermediate I, --experts E, --topk K",
     .help = "override the config's sizes (a small, quick run)"},
    {.name = "intermediate", .id = OPT_INTER, .has_arg = 1, .arg = "I"},
    {.name = "experts", .id = OPT_EXPERTS, .has_arg = 1, .arg = "E"},
    {.name = "topk", .id = OPT_TOPK, .has_arg = 1, .arg = "K"},
    TOOL_SHARED(TOOL_OPT_TP, "default --tp 8 (with --checkpoint, one rank holds the layer); the\n"
                             "measurements are of rank 0 (interpreter and GPU: TP or one rank)"),
    TOOL_SHARED(TOOL_OPT_EP, NULL),
    TOOL_SHARED(TOOL_OPT_BATCH, "the plan's (default 1-256)"),
    TOOL_SHARED(TOOL_OPT_K0_POLICY, "the plan's (default \"1-3:8,4-:4\", its k0 at most top-k; \"none\":\n"
                                    "plain top-k)"),
    TOOL_SHARED(TOOL_OPT_MODE, NULL),
    TOOL_SHARED(TOOL_OPT_ARCH, "the plan's (default: the GPU's, else --predict's GPU's, else {target})"),
    TOOL_HEADING("what to measure:"),
    {.name = "bench-batch", .id = OPT_BB, .has_arg = 1, .arg = "L",
     .help = "batch sizes of the measured tables (default 1,2,4,8,16,32,64; at most 256)"},
    {.name = "k0", .id = OPT_K0, .has_arg = 1, .arg = "L",
     .help = "k0 values of the tables (default 8,6,4,3; those above top-k are left out)"},
    {.name = "reps", .id = OPT_REPS, .has_arg = 1, .arg = "N",
     .help = "cold compiles per specialization, the median reported (default 3)"},
    {.name = "iters", .id = OPT_ITERS, .has_arg = 1, .arg = "N", .help = "timed calls per row (default 50)"},
    {.name = "sim-intermediate", .id = OPT_SIMI, .has_arg = 1, .arg = "N",
     .help = "expert rows on the interpreter (default 64)"},
    {.name = "copy-mb", .id = OPT_COPY, .has_arg = 1, .arg = "N",
     .help = "the copy-bandwidth buffer, MiB (default 512)"},
    {.name = "no-compile", .id = OPT_NOCOMPILE, .help = "list the plan without compiling it"},
    {.name = "no-gpu", .id = OPT_NOGPU, .help = "skip the GPU measurements even with a GPU"},
    {.name = "no-sim", .id = OPT_NOSIM, .help = "skip the interpreter's measurements (launch path, bytes)"},
    {.name = "predict", .id = OPT_PREDICT, .has_arg = 1, .arg = "GPU",
     .help = "also the performance model (no GPU needed): each kernel of a forward\n"
             "compiled for GPU's target (unless --arch), its SASS's hot loop, its\n"
             "launch and occupancy, predicted us with its bound (memory, issue,\n"
             "latency, waves), and the layer against its floor, for each B x k0,\n"
             "at the active experts the GPU's routing measured (with a GPU), else\n"
             "the interpreter's, else the expected number (GPU: {gpus});\n"
             "auto: the GPU this bench finds, by the driver's name of it, where\n"
             "the model knows it (else a note)"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, "of the interpreter and GPU runs (cold compiles use temporary ones)"),
    {.name = "json", .id = OPT_JSON, .help = "one JSON object on stdout (progress on stderr)"},
    TOOL_SHARED(TOOL_OPT_QUIET, NULL),
    {0}};

/* ---- what the sections share ---------------------------------------------------------- */

double bench_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_progress(const bench *b, const char *fmt, ...) {
    if (b->a->quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void bench_txt(const bench *b, const char *fmt, ...) {
    if (!b->txt) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(b->txt, fmt, ap);
    va_end(ap);
}

void bench_note(bench *b, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    json_array_append_new(json_object_get(b->root, "notes"), json_string(line));
    bench_txt(b, "note: %s\n", line);
}

/* ---- the layer of a rank ---------------------------------------------------------------- */

void bench_random_bf16(uint16_t *x, size_t n, uint64_t seed) {
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
}

mj_status bench_rank_layer(bench *b, int32_t rows, int from_ck, mj_layer_t *out) {
    if (from_ck && b->ck && b->ck_L) { /* loaded up front: handed over */
        *out = b->ck_L, b->ck_L = NULL;
        return MJ_OK;
    }
    if (from_ck && b->ck) {
        mj_parallel par = b->a->par;
        return mj_layer_load(b->ck, b->ck_layer, par, 0, par == MJ_PAR_NONE ? 1 : b->a->n_ranks, out);
    }
    mj_moe_config c = b->cfg;
    c.intermediate = rows;
    c.n_shared = b->nsub; /* one rank's shared rows: nsub sub-experts of `rows` */
    c.shared_gate = c.shared_gate && c.n_shared > 0; /* its gate, where it runs */
    return mj_layer_create_random(&c, 1, out);
}

mj_status bench_moe_make(mj_context_t ctx, mj_layer_t L, const bench *b, mj_moe_t *moe) {
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    tool_mode_parse(b->a->mode, &o.mode_policy);
    return mj_moe_create(ctx, L, &o, moe);
}

mj_status bench_moe_prepare(mj_moe_t moe, const bench *b, const char *k0p) {
    mj_moe_prepare_options p = MJ_MOE_PREPARE_OPTIONS_INIT;
    const char *policy;
    p.batches = b->a->bb, p.n_batches = b->a->n_bb, p.k0_policy = k0p;
    p.mode = tool_mode_parse(b->a->mode, &policy);
    return mj_moe_prepare(moe, &p);
}

const char *bench_mode_name(mj_weight_mode m) { return m == MJ_MODE_W4A4 ? "W4A4" : "W4A16"; }


/* ---- the command ------------------------------------------------------------------- */

/* "1,2,4" or ranges ("1-8,16") into a list of at most BENCH_MAX_LIST values in lo..hi. */
static int parse_list(const char *opt, const char *text, int lo, int hi, int32_t *out, int *n) {
    int32_t *v = NULL, nv = 0;
    if (mj_batches_parse(text, &v, &nv) != MJ_OK) return tool_usage("bench", "%s: %s", opt, mj_last_error());
    if (nv > BENCH_MAX_LIST) {
        free(v);
        return tool_usage("bench", "%s: at most %d values, got %d", opt, BENCH_MAX_LIST, (int)nv);
    }
    for (int i = 0; i < nv; i++)
        if (v[i] < lo || v[i] > hi) {
            int bad = v[i];
            free(v);
            return tool_usage("bench", "%s: %d is out of %d..%d", opt, bad, lo, hi);
        }
    memcpy(out, v, sizeof *v * (size_t)nv);
    *n = nv;
    free(v);
    return 0;
}

static int read_config(bench *b) {
    const bench_args *a = b->a;
    mj_status st;
    if (a->checkpoint) {
        if (a->config) return tool_usage("bench", "give --config or --checkpoint, not both");
        if ((st = mj_checkpoint_open(a->checkpoint, &b->ck)) != MJ_OK) return tool_fail_status(a->checkpoint, st);
        if ((st = mj_checkpoint_config(b->ck, &b->cfg)) != MJ_OK) return tool_fail_status(a->checkpoint, st);
        int32_t n = 0;
        if ((st = mj_checkpoint_moe_layers(b->ck, &b->ck_layer, 1, &n)) != MJ_OK) return tool_fail_status(a->checkpoint, st);
        if (n < 1) return tool_fail("%s: holds no MoE layer", a->checkpoint);
        if (a->hidden || a->intermediate || a->experts || a->topk)
            return tool_usage("bench", "--hidden/--intermediate/--experts/--topk change a config: not with --checkpoint");
        return 0;
    }
    if (a->config) {
        int rc = tool_config_read(a->config, a->quant, &b->cfg);
        if (rc) return rc;
    } else {
        mj_moe_config_glm5(&b->cfg);
    }
    if (a->hidden) b->cfg.hidden = a->hidden;
    if (a->intermediate) b->cfg.intermediate = a->intermediate;
    if (a->experts) {
        b->cfg.n_experts = a->experts;
        if (b->cfg.n_group > 1 && a->experts % b->cfg.n_group) b->cfg.n_group = b->cfg.topk_group = 1;
    }
    if (a->topk) b->cfg.topk = a->topk;
    if ((st = mj_moe_config_validate(&b->cfg, 1)) != MJ_OK) return tool_fail("the config: %s", mj_last_error());
    return 0;
}

/* The options into *a, with bench's defaults. -1 to go on, else the exit code (after --help,
 * --version or a usage line). */
static int parse_args(int argc, char **argv, bench_args *a) {
    memset(a, 0, sizeof *a);
    a->reps = 3, a->iters = 50, a->sim_I = 64, a->copy_mb = 512;
    static const int32_t dbb[] = {1, 2, 4, 8, 16, 32, 64}, dk0[] = {8, 6, 4, 3};
    memcpy(a->bb, dbb, sizeof dbb), a->n_bb = 7;
    memcpy(a->k0s, dk0, sizeof dk0), a->n_k0 = 4;
    int c, cli_rc;
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "bench", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_CK: a->checkpoint = optarg; break;
        case OPT_HIDDEN: if (tool_parse_int("bench", "--hidden", optarg, 64, 1 << 16, &a->hidden)) return 2; break;
        case OPT_INTER:
            if (tool_parse_int("bench", "--intermediate", optarg, 64, 1 << 16, &a->intermediate)) return 2;
            break;
        case OPT_EXPERTS: if (tool_parse_int("bench", "--experts", optarg, 1, 4096, &a->experts)) return 2; break;
        case OPT_TOPK: if (tool_parse_int("bench", "--topk", optarg, 1, 64, &a->topk)) return 2; break;
        case OPT_BB: if (parse_list("--bench-batch", optarg, 1, 256, a->bb, &a->n_bb)) return 2; break;
        case OPT_K0:
            if (parse_list("--k0", optarg, 1, 64, a->k0s, &a->n_k0)) return 2;
            for (int i = 0; i < a->n_k0 / 2; i++) { /* largest first: plain top-k, then OEA */
                int32_t t = a->k0s[i];
                a->k0s[i] = a->k0s[a->n_k0 - 1 - i], a->k0s[a->n_k0 - 1 - i] = t;
            }
            break;
        case OPT_REPS: if (tool_parse_int("bench", "--reps", optarg, 1, 64, &a->reps)) return 2; break;
        case OPT_ITERS: if (tool_parse_int("bench", "--iters", optarg, 1, 100000, &a->iters)) return 2; break;
        case OPT_SIMI:
            if (tool_parse_int("bench", "--sim-intermediate", optarg, 64, 1 << 16, &a->sim_I)) return 2;
            break;
        case OPT_COPY: if (tool_parse_int("bench", "--copy-mb", optarg, 1, 1 << 16, &a->copy_mb)) return 2; break;
        case OPT_NOCOMPILE: a->no_compile = 1; break;
        case OPT_NOGPU: a->no_gpu = 1; break;
        case OPT_NOSIM: a->no_sim = 1; break;
        case OPT_PREDICT:
            if (!strcmp(optarg, "auto")) {
                a->predict = NULL, a->predict_auto = 1;
                break;
            }
            a->predict_auto = 0;
            if (!(a->predict = tool_gpu_find(optarg)))
                return tool_usage("bench", "--predict: unknown GPU '%s' (known: %s)", optarg, tool_gpu_names());
            break;
        case OPT_JSON: a->json = 1; break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    /* The shared options, with bench's defaults: TP 8 (one rank with a checkpoint), batch sizes
     * 1-256, k0 "1-3:8,4-:4" (read_config lowers it to top-k; "none": plain top-k). */
    a->config = so.config, a->quant = so.quant, a->mode = so.mode, a->cache_dir = so.cache_dir, a->quiet = so.quiet;
    a->arch = so.n_arch ? so.arch[so.n_arch - 1] : NULL;
    a->batch = so.batch ? so.batch : "1-256";
    a->k0_policy_default = !so.k0_policy;
    a->k0_policy = !so.k0_policy ? "1-3:8,4-:4" : strcmp(so.k0_policy, "none") ? so.k0_policy : NULL;
    a->split_given = so.split_given;
    a->par = so.split_given ? so.par : MJ_PAR_TP, a->n_ranks = so.split_given ? so.n_ranks : 8;
    if (optind < argc) return tool_usage("bench", "unexpected argument '%s'", argv[optind]);
    if (a->checkpoint && !a->split_given) a->par = MJ_PAR_NONE, a->n_ranks = 1;
    if (a->n_ranks == 1) a->par = MJ_PAR_NONE;
    if (a->sim_I % MJ_DIM_ALIGN) return tool_usage("bench", "--sim-intermediate must be a multiple of %d", MJ_DIM_ALIGN);
    return -1;
}

/* The model and rank 0's shapes (read_config, then the split); the default k0 policy at most
 * top-k; the tables' k0 values above top-k left out. 0, or the exit code after the error. */
static int setup(bench *b, bench_args *a) {
    int rc = read_config(b);
    if (rc) return rc;
    if (a->k0_policy_default && b->cfg.topk < 8) { /* a given policy is checked as it is */
        snprintf(a->k0_policy_buf, sizeof a->k0_policy_buf, "1-3:%d,4-:%d", (int)b->cfg.topk,
                 b->cfg.topk < 4 ? (int)b->cfg.topk : 4);
        a->k0_policy = a->k0_policy_buf;
    }
    if (mj_plan_rank_shape(&b->cfg, a->par, 0, a->n_ranks, 1, &b->i_local, &b->nsub) != MJ_OK)
        return tool_fail("the split: %s", mj_last_error());
    int nk = 0;
    for (int i = 0; i < a->n_k0; i++)
        if (a->k0s[i] <= b->cfg.topk) a->k0s[nk++] = a->k0s[i];
    if (nk < a->n_k0) bench_note(b, "k0 values above top-k (%d) left out", b->cfg.topk);
    a->n_k0 = nk;
    if (!a->n_k0) return tool_usage("bench", "--k0: no value is within 1..top-k (%d)", b->cfg.topk);
    b->per_expert = mj_pack_expert_bytes(b->cfg.hidden, b->i_local);
    b->gate_bytes = 2 * (int64_t)b->cfg.n_experts * b->cfg.hidden;
    return 0;
}

/* GPU 0, unless --no-gpu: *have_gpu and its description. No driver or no device is no GPU;
 * a driver that fails otherwise is an error (the exit code after its line). */
static int find_gpu(const bench_args *a, int *have_gpu, mj_device_info *di) {
    int ndev = 0;
    *have_gpu = 0;
    memset(di, 0, sizeof *di);
    if (a->no_gpu) return 0;
    mj_status st = mj_cuda_load();
    if (st == MJ_OK) st = mj_cuda_device_count(&ndev);
    if (st == MJ_OK && ndev > 0) st = mj_cuda_device_info(0, di);
    if (st == MJ_OK && ndev > 0) *have_gpu = 1;
    else if (st != MJ_OK && st != MJ_ERR_NO_DEVICE) return tool_fail("the CUDA driver: %s", mj_last_error());
    return 0;
}

/* The checkpoint's layer the measurements are of (rank 0's slice), loaded and so validated
 * before anything is measured, with a GPU or without: a checkpoint that does not load is an
 * error, not a bench of weights nobody read. Kept for the GPU's run, else freed. */
static int load_checkpoint_layer(bench *b, int have_gpu) {
    const bench_args *a = b->a;
    if (!b->ck) return 0;
    bench_progress(b, "loading layer %d of %s (rank 0's slice)", b->ck_layer, a->checkpoint);
    mj_status st = mj_layer_load(b->ck, b->ck_layer, a->par, 0, a->par == MJ_PAR_NONE ? 1 : a->n_ranks, &b->ck_L);
    if (st != MJ_OK) {
        char what[4200];
        snprintf(what, sizeof what, "%s: loading layer %d", a->checkpoint, b->ck_layer);
        return tool_fail_status(what, st);
    }
    if (!have_gpu || a->par == MJ_PAR_EP) mj_layer_free(b->ck_L), b->ck_L = NULL;
    return 0;
}

/* The report's head: the version, the model and its split, the target; JSON and a line. */
static void report_header(bench *b, const char *arch, int have_gpu) {
    const bench_args *a = b->a;
    const char *ver;
    mj_version(NULL, NULL, NULL, &ver);
    json_object_set_new(b->root, "moejit", json_string(ver));
    json_t *jc = json_object();
    json_object_set_new(jc, "hidden", json_integer(b->cfg.hidden));
    json_object_set_new(jc, "intermediate", json_integer(b->cfg.intermediate));
    json_object_set_new(jc, "experts", json_integer(b->cfg.n_experts));
    json_object_set_new(jc, "topk", json_integer(b->cfg.topk));
    json_object_set_new(jc, "n_shared", json_integer(b->cfg.n_shared));
    json_object_set_new(jc, "split", json_string(a->par == MJ_PAR_TP ? "tp" : a->par == MJ_PAR_EP ? "ep" : "none"));
    json_object_set_new(jc, "ranks", json_integer(a->n_ranks));
    json_object_set_new(jc, "i_local", json_integer(b->i_local));
    json_object_set_new(jc, "shared_sub_experts", json_integer(b->nsub));
    json_object_set_new(jc, "expert_bytes", json_integer(b->per_expert));
    json_object_set_new(jc, "gate_bytes", json_integer(b->gate_bytes));
    json_object_set_new(jc, "checkpoint", a->checkpoint ? json_string(a->checkpoint) : json_null());
    json_object_set_new(b->root, "config", jc);
    json_object_set_new(b->root, "target", json_string(arch));
    json_object_set_new(b->root, "gpu", json_null());
    bench_txt(b, "moejit %s bench: H %d, I %d, E %d, top-%d, %d shared; %s %d: rank 0 holds experts of %d rows "
                 "(%lld bytes packed) and %d shared sub-expert(s); target %s%s\n",
              ver, b->cfg.hidden, b->cfg.intermediate, b->cfg.n_experts, b->cfg.topk, b->cfg.n_shared,
              a->par == MJ_PAR_TP ? "TP" : a->par == MJ_PAR_EP ? "EP" : "ranks", a->n_ranks, b->i_local,
              (long long)b->per_expert, b->nsub, arch, have_gpu ? "" : "; no GPU: the GPU measurements are skipped");
    if (!have_gpu)
        bench_note(b, "no GPU%s: only what the interpreter and the compiler can tell", a->no_gpu ? " (--no-gpu)" : "");
}

int cmd_bench(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    bench b;
    memset(&b, 0, sizeof b);
    b.a = &a;
    b.txt = a.json ? NULL : stdout;
    b.root = json_object();
    json_object_set_new(b.root, "notes", json_array());
    int have_gpu, measured = 0; /* measured: the GPU's tables are in the JSON */
    mj_device_info di;
    if ((rc = setup(&b, &a)) || (rc = find_gpu(&a, &have_gpu, &di)) || (rc = load_checkpoint_layer(&b, have_gpu)))
        goto out;
    /* --predict auto: the GPU found, where the model knows it (else a note: the measurements
     * are the job); with no GPU there is nothing to find */
    if (a.predict_auto && !have_gpu) {
        rc = tool_fail("--predict auto: no GPU here (or --no-gpu): name the one to model (%s)", tool_gpu_names());
        goto out;
    }
    if (a.predict_auto && !(a.predict = tool_gpu_for_device(di.name)))
        bench_note(&b, "--predict auto: the model knows no GPU named like '%s' (known: %s): no prediction; --predict "
                       "GPU names one", di.name, tool_gpu_names());
    /* The plan's target: --arch, else the GPU's, else --predict's GPU's, else the default. */
    const char *arch = a.arch ? a.arch
                       : have_gpu ? mj_target_name(di.target)
                       : a.predict ? a.predict->arch
                       : mj_target_name(MJ_DEFAULT_TARGET);
    report_header(&b, arch, have_gpu);
    if ((rc = bench_plan(&b, arch))) goto out;
    if (a.no_sim) {
        json_object_set_new(b.root, "launch_path", json_null());
        json_object_set_new(b.root, "bytes", json_null());
    } else if (a.par == MJ_PAR_EP) {
        bench_note(&b, "the interpreter's measurements model a TP rank or a whole layer: skipped with --ep");
    } else if ((rc = bench_sim(&b, arch))) {
        goto out;
    }
    /* The GPU first, so that the performance model (tools/predict_plan.c) takes the active
     * experts its routing measured, and its rows stand beside those it predicts. */
    if (have_gpu && (rc = bench_gpu(&b))) goto out;
    measured = have_gpu;
    if (a.predict) {
        tool_predict_in pi = {&b.cfg, b.i_local, b.nsub, (double)b.per_expert, (double)b.gate_bytes, arch, a.predict,
                              a.cache_dir, a.mode, a.bb, a.k0s, a.n_bb, a.n_k0, b.have_active ? b.active : NULL,
                              b.have_active == 2 ? "gpu" : b.have_active ? "interpreter" : "expected"};
        if ((rc = tool_predict_plan(&pi, b.root, b.txt))) {
            /* the command failed (exit 1, said above), but a GPU's measurements are not lost;
             * no half of a model */
            json_object_del(b.root, "predict");
            if (measured) bench_note(&b, "--predict failed (see stderr): the GPU's measurements above stand alone");
            goto out;
        }
    }
out:
    if (a.json && (!rc || measured)) {
        char *s = json_dumps(b.root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
    }
    json_decref(b.root);
    mj_layer_free(b.ck_L);
    if (b.ck) mj_checkpoint_close(b.ck);
    return rc;
}
