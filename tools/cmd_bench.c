/* cmd_bench.c — `moejit bench`: what a model's MoE layer costs, measured where it can be.
 *
 * Without a GPU (always):
 *   plan        the specializations mj_moe_prepare compiles for the settings (the planner of
 *               runtime/plan.c), each one's cold NVRTC compile (a fresh temporary cache; the
 *               median of --reps), its load from the disk cache and its in-memory lookup;
 *   launch      the host time of one forward's launch path: mj_moe_forward on the interpreter
 *               with its launches recorded instead of run (mj_sim_capture_begin/end), so
 *               what is timed is the host work a forward does, not the kernels';
 *   bytes       the weight bytes one forward reads (the interpreter counts them) against the
 *               floor (the router's gate, each active expert and the shared expert once), for
 *               each B x k0, at the model's routing (its router at full size) with experts of
 *               --sim-intermediate rows; the same active experts at the rank's real expert
 *               size give the model's bytes, and those over each named GPU's bandwidth its
 *               floor time.
 * With a GPU (device 0), also, timed with CUDA events after a warm-up, the median of --iters,
 * rotating several input sets, with the L2 flushed before each call (a write of twice its size
 * enqueued before the first event: the weights are the same every call) so it serves nothing:
 *   copy        device-to-device copy bandwidth (bytes read + written), the yardstick;
 *   routing     the router GEMM + mj_route;
 *   experts     mj_experts_forward at the rank's shapes (W4A16; W4A4 where the target has it);
 *   layer       mj_moe_forward, eager and replayed from a CUDA graph;
 * each row with the weight bytes read, the GB/s they make and that over the copy bandwidth,
 * and the goals checked (experts at B <= 16 at >= 80% of the copy bandwidth; OEA k0 = 4
 * making the layer >= 1.4x faster than k0 = 8 at B = 32). */
#include "tools.h"

#include "moejit_private.h"
#include "predict.h"

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
    {.name = "copy-mb", .id = OPT_COPY, .has_arg = 1, .arg = "N", .help = "the copy-bandwidth buffer, MiB (default 512)"},
    {.name = "no-compile", .id = OPT_NOCOMPILE, .help = "list the plan without compiling it"},
    {.name = "no-gpu", .id = OPT_NOGPU, .help = "skip the GPU measurements even with a GPU"},
    {.name = "no-sim", .id = OPT_NOSIM, .help = "skip the interpreter's measurements (launch path, bytes)"},
    {.name = "predict", .id = OPT_PREDICT, .has_arg = 1, .arg = "GPU",
     .help = "also the performance model (no GPU needed): each kernel of a forward\n"
             "compiled for GPU's target (unless --arch), its SASS's hot loop, its\n"
             "launch and occupancy, predicted us with its bound (memory, issue,\n"
             "latency, waves), and the layer against its floor, for each B x k0\n"
             "(GPU: {gpus})"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, "of the interpreter and GPU runs (cold compiles use temporary ones)"),
    {.name = "json", .id = OPT_JSON, .help = "one JSON object on stdout (progress on stderr)"},
    TOOL_SHARED(TOOL_OPT_QUIET, NULL),
    {0}};

#define NSETS 4       /* input sets rotated through on the GPU                                 */
#define MAX_LIST 64

typedef struct bench_args {
    const char *config, *quant, *checkpoint, *batch, *k0_policy, *mode, *arch, *cache_dir;
    int32_t bb[MAX_LIST], n_bb;   /* --bench-batch                                            */
    int32_t k0s[MAX_LIST], n_k0;  /* --k0                                                     */
    int hidden, intermediate, experts, topk;
    mj_parallel par;
    int n_ranks, split_given;
    int reps, iters, sim_I, copy_mb, json, no_gpu, no_compile, no_sim, quiet;
    const tool_gpu *predict;      /* --predict                                                */
} bench_args;

/* What every section needs: the model, the rank's shapes, where results go. */
typedef struct bench {
    const bench_args *a;
    mj_moe_config cfg;
    mj_checkpoint_t ck;
    int32_t ck_layer;
    mj_layer_t ck_L;              /* rank 0's slice of it, loaded up front (validated), for   */
                                  /* the GPU's run; NULL once handed over or without a GPU   */
    int32_t i_local, nsub;        /* rank 0's expert rows and shared sub-experts              */
    int64_t per_expert;           /* packed bytes of one expert at (H, i_local)               */
    int64_t gate_bytes;           /* the router's weight, E x H bf16                          */
    json_t *root;
    FILE *txt;                    /* stdout, or NULL with --json                              */
    int32_t active[MAX_LIST * MAX_LIST]; /* [k0][B]: active experts the interpreter saw       */
    int have_active;
} bench;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void progress(const bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(const bench *b, const char *fmt, ...) {
    if (b->a->quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void txt(const bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void txt(const bench *b, const char *fmt, ...) {
    if (!b->txt) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(b->txt, fmt, ap);
    va_end(ap);
}

static void note(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(bench *b, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    json_array_append_new(json_object_get(b->root, "notes"), json_string(line));
    txt(b, "note: %s\n", line);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    remove(p);
    return 0;
}
static void rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A new empty directory under $TMPDIR (or /tmp), malloc'd. */
static char *temp_dir(void) {
    const char *t = getenv("TMPDIR");
    char *d = malloc(4096);
    if (!d) return NULL;
    snprintf(d, 4096, "%s/moejit-bench-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(d)) {
        free(d);
        return NULL;
    }
    return d;
}

/* ---- the plan: specializations and their compile, load and lookup times ------------------ */

static int bench_plan(bench *b, const char *arch) {
    const bench_args *a = b->a;
    json_t *jp = json_object(), *rows = json_array();
    json_object_set_new(b->root, "plan", jp);
    json_object_set_new(jp, "target", json_string(arch));
    json_object_set_new(jp, "batch", json_string(a->batch));
    json_object_set_new(jp, "k0_policy", a->k0_policy ? json_string(a->k0_policy) : json_null());
    json_object_set_new(jp, "specializations", rows);
    char *dir = temp_dir();
    if (!dir) return tool_fail("cannot create a temporary directory in $TMPDIR or /tmp: set TMPDIR to a writable one");
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_CUDA, o.target = arch, o.strict = 0;
    mj_context_t ctx = NULL;
    int rc = 0;
    mj_plan plan = {0, NULL};
    mj_status st;
    if ((st = mj_context_create(&o, &ctx)) != MJ_OK) {
        rc = tool_fail_status("creating the JIT context", st);
        goto out;
    }
    if ((rc = tool_plan_build("bench", ctx, &b->cfg, a->par, a->n_ranks, 1, a->batch, a->k0_policy, a->mode, NULL,
                              &plan, NULL)))
        goto out;
    mj_context_destroy(ctx), ctx = NULL;
    txt(b, "plan for %s: %d specializations (batch %s, k0 %s)%s\n", arch, (int)plan.n, a->batch,
        a->k0_policy ? a->k0_policy : "= top-k", a->no_compile ? "" : "; cold compile (median), disk load, memory lookup");
    double total = 0;
    int failed = 0;
    size_t first_failed = 0;
    for (int32_t i = 0; i < plan.n; i++) {
        char desc[512];
        mj_spec_describe(&plan.e[i].spec, desc, sizeof desc);
        json_t *r = json_object();
        json_object_set_new(r, "what", json_string(plan.e[i].what));
        json_object_set_new(r, "spec", json_string(desc));
        json_object_set_new(r, "b_lo", json_integer(plan.e[i].b_lo));
        json_object_set_new(r, "b_hi", json_integer(plan.e[i].b_hi));
        json_array_append_new(rows, r);
        if (a->no_compile) {
            txt(b, "  %-12s B %3d-%-3d %s\n", plan.e[i].what, (int)plan.e[i].b_lo, (int)plan.e[i].b_hi, desc);
            continue;
        }
        progress(b, "compiling %d/%d: %s", (int)i + 1, (int)plan.n, desc);
        double cold[64], disk[64], mem[64];
        int reps = a->reps, ok = 1;
        for (int rep = 0; rep < reps && ok; rep++) {
            char *d = temp_dir();
            if (!d) {
                rc = tool_fail("cannot create a temporary directory");
                goto out;
            }
            mj_context_options co = o;
            co.cache_dir = d;
            mj_context_t c1 = NULL, c2 = NULL;
            const mj_function *f = NULL;
            double t0 = now_ms();
            st = mj_context_create(&co, &c1);
            if (st == MJ_OK) st = mj_jit_get(c1, &plan.e[i].spec, &f);
            cold[rep] = now_ms() - t0;
            if (st == MJ_OK) { /* a new context: the entry from disk, then from memory */
                st = mj_context_create(&co, &c2);
                double t1 = now_ms();
                if (st == MJ_OK) st = mj_jit_get(c2, &plan.e[i].spec, &f);
                disk[rep] = now_ms() - t1;
                const int n = 2000;
                t1 = now_ms();
                for (int k = 0; k < n && st == MJ_OK; k++) st = mj_jit_get(c2, &plan.e[i].spec, &f);
                mem[rep] = 1e3 * (now_ms() - t1) / n;
            }
            if (st != MJ_OK) {
                ok = 0;
                json_object_set_new(r, "error", json_string(mj_last_error()));
                txt(b, "  %-12s B %3d-%-3d %s: failed: %s\n", plan.e[i].what, (int)plan.e[i].b_lo,
                    (int)plan.e[i].b_hi, desc, mj_last_error());
                if (!failed++) first_failed = (size_t)i;
            }
            mj_context_destroy(c2);
            mj_context_destroy(c1);
            rm_rf(d);
            free(d);
        }
        if (!ok) continue;
        double cm = median(cold, reps), dm = median(disk, reps), mm = median(mem, reps);
        total += cm;
        json_object_set_new(r, "cold_ms", json_real(cm));
        json_object_set_new(r, "disk_ms", json_real(dm));
        json_object_set_new(r, "mem_us", json_real(mm));
        txt(b, "  %-12s B %3d-%-3d %9.1f ms %8.2f ms %8.3f us  %s\n", plan.e[i].what, (int)plan.e[i].b_lo,
            (int)plan.e[i].b_hi, cm, dm, mm, desc);
    }
    if (!a->no_compile) {
        json_object_set_new(jp, "cold_total_ms", json_real(total));
        json_object_set_new(jp, "failed", json_integer(failed));
        txt(b, "  total cold compile: %.0f ms (one thread)%s\n", total, failed ? "; some failed (see above)" : "");
        if (failed) { /* a plan that does not compile is no measurement: say why and fail */
            const char *why = json_string_value(json_object_get(json_array_get(rows, first_failed), "error"));
            rc = tool_fail("%d of %d specializations did not compile for %s, the first: %s (--no-compile lists "
                           "the plan without compiling it)", failed, (int)plan.n, arch, why ? why : "?");
        }
    }
out:
    mj_plan_free(&plan);
    mj_context_destroy(ctx);
    rm_rf(dir);
    free(dir);
    return rc;
}

/* ---- the layer of a rank -------------------------------------------------------------- */

static void random_bf16(uint16_t *x, size_t n, uint64_t seed) {
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
}

/* Rank 0's layer for a run: from the checkpoint (its slice), or random with rank 0's shapes
 * and `rows` expert rows (the rank's own, or the interpreter's smaller ones). */
static mj_status rank_layer(bench *b, int32_t rows, int from_ck, mj_layer_t *out) {
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
    return mj_layer_create_random(&c, 1, out);
}

/* The moe handle on one rank's layer, with --mode's policy (moe_prepare prepares it). */
static mj_status moe_make(mj_context_t ctx, mj_layer_t L, const bench *b, mj_moe_t *moe) {
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    tool_mode_parse(b->a->mode, &o.mode_policy);
    return mj_moe_create(ctx, L, &o, moe);
}

static mj_status moe_prepare(mj_moe_t moe, const bench *b, const char *k0p) {
    mj_moe_prepare_options p = MJ_MOE_PREPARE_OPTIONS_INIT;
    const char *policy;
    p.batches = b->a->bb, p.n_batches = b->a->n_bb, p.k0_policy = k0p;
    p.mode = tool_mode_parse(b->a->mode, &policy);
    return mj_moe_prepare(moe, &p);
}

static const char *mode_name(mj_weight_mode m) { return m == MJ_MODE_W4A4 ? "W4A4" : "W4A16"; }

/* The floor of `bytes` on each named GPU, µs, into a JSON object. */
static json_t *floors(double bytes) {
    json_t *o = json_object();
    for (int g = 0; g < tool_gpu_count(); g++)
        json_object_set_new(o, tool_gpu_at(g)->name, json_real(bytes / (tool_gpu_at(g)->gbps * 1e3)));
    return o;
}

/* ---- the interpreter: the launch path's host time, and bytes read -------------------- */

static int bench_sim(bench *b, const char *arch) {
    const bench_args *a = b->a;
    const int32_t H = b->cfg.hidden, E = b->cfg.n_experts;
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = a->cache_dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_SIM, o.target = arch, o.strict = 0;
    mj_context_t ctx = NULL;
    mj_layer_t L = NULL;
    mj_moe_t moe = NULL;
    int32_t maxB = a->bb[a->n_bb - 1];
    uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)maxB * (size_t)H);
    float *out = malloc(sizeof(float) * (size_t)maxB * (size_t)H);
    double *v = malloc(sizeof(double) * (size_t)a->iters);
    json_t *lp = json_array(), *by = json_array();
    json_object_set_new(b->root, "launch_path", lp);
    json_object_set_new(b->root, "bytes", by);
    int rc = 0;
    mj_status st;
    const char *step = "";
#define TRY(what, call)                                                                  \
    do {                                                                                 \
        step = what;                                                                     \
        if ((st = (call)) != MJ_OK) goto fail;                                           \
    } while (0)
    if (!hidden || !out || !v) {
        st = MJ_ERR_NOMEM, step = "allocating";
        goto fail;
    }
    progress(b, "the interpreter's layer: H %d, E %d, %d expert rows, %d shared sub-expert(s)", H, E, a->sim_I, b->nsub);
    double t0 = now_ms();
    TRY("creating the interpreter's layer", rank_layer(b, a->sim_I, 0, &L));
    progress(b, "layer made in %.0f ms", now_ms() - t0);
    TRY("the interpreter's context", mj_context_create(&o, &ctx));
    TRY("the interpreter's layer", moe_make(ctx, L, b, &moe));
    const int64_t per_sim = mj_pack_expert_bytes(H, a->sim_I);

    /* The launch path: the host work of one forward, its launches recorded, not run. */
    progress(b, "preparing the interpreter's kernels (k0 %s)", a->k0_policy ? a->k0_policy : "= top-k");
    TRY("preparing", moe_prepare(moe, b, a->k0_policy));
    txt(b, "\nhost time of one forward's launch path (the interpreter, launches recorded not run; median of %d)\n",
        a->iters);
    txt(b, "  %4s %3s %-6s %8s %10s\n", "B", "k0", "mode", "launches", "host us");
    for (int i = 0; i < a->n_bb; i++) {
        const int32_t B = a->bb[i];
        int32_t k0;
        mj_weight_mode m;
        random_bf16(hidden, (size_t)B * (size_t)H, 100 + (uint64_t)B);
        TRY("the batch plan", mj_moe_batch_plan(moe, B, &k0, &m));
        TRY("a forward", mj_moe_forward(moe, hidden, B, NULL, out, NULL)); /* warm */
        int launches = 0;
        for (int it = 0; it < a->iters; it++) {
            mj_sim_graph *g = NULL;
            double t = now_ms();
            TRY("recording a forward", mj_sim_capture_begin(ctx));
            st = mj_moe_forward(moe, hidden, B, NULL, out, NULL);
            mj_status st2 = mj_sim_capture_end(ctx, &g);
            v[it] = 1e3 * (now_ms() - t);
            if (st == MJ_OK) st = st2;
            if (g) launches = mj_sim_graph_launches(g);
            mj_sim_graph_free(g);
            if (st != MJ_OK) goto fail;
        }
        double us = median(v, a->iters);
        json_t *r = json_object();
        json_object_set_new(r, "B", json_integer(B));
        json_object_set_new(r, "k0", json_integer(k0));
        json_object_set_new(r, "mode", json_string(mode_name(m)));
        json_object_set_new(r, "launches", json_integer(launches));
        json_object_set_new(r, "host_us", json_real(us));
        json_array_append_new(lp, r);
        txt(b, "  %4d %3d %-6s %8d %10.2f\n", (int)B, (int)k0, mode_name(m), launches, us);
    }

    /* Bytes per forward, B x k0. */
    txt(b, "\nweight bytes of one forward (rank 0), counted by the interpreter (experts of %d rows) against the\n"
           "floor (gate + active experts + shared, each once); at the rank's expert size (H %d, I %d): bytes and\n"
           "their floor time\n", a->sim_I, H, b->i_local);
    txt(b, "  %4s %3s %6s %12s %12s %6s %12s %9s %9s %9s\n", "B", "k0", "active", "read here", "floor here", "ratio",
        "model MB", "rtx-pro us", "h200 us", "b200 us");
    for (int ki = 0; ki < a->n_k0; ki++) {
        char k0p[16];
        snprintf(k0p, sizeof k0p, "%d", (int)a->k0s[ki]);
        progress(b, "bytes at k0 %s", k0p);
        TRY("preparing", moe_prepare(moe, b, k0p));
        for (int i = 0; i < a->n_bb; i++) {
            const int32_t B = a->bb[i];
            random_bf16(hidden, (size_t)B * (size_t)H, 200 + (uint64_t)B);
            mj_sim_stream_bytes_take();
            TRY("a forward", mj_moe_forward(moe, hidden, B, NULL, out, NULL));
            unsigned long long got = mj_sim_stream_bytes_take();
            mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
            TRY("the routing", mj_moe_route_outputs(moe, &ro));
            const int32_t na = *ro.n_active;
            b->active[ki * a->n_bb + i] = na;
            const double floor_here = (double)b->gate_bytes + (double)(na + b->nsub) * (double)per_sim;
            const double model = (double)b->gate_bytes + (double)(na + b->nsub) * (double)b->per_expert;
            json_t *r = json_object();
            json_object_set_new(r, "B", json_integer(B));
            json_object_set_new(r, "k0", json_integer(a->k0s[ki]));
            json_object_set_new(r, "active", json_integer(na));
            json_object_set_new(r, "read", json_integer((json_int_t)got));
            json_object_set_new(r, "floor", json_integer((json_int_t)floor_here));
            json_object_set_new(r, "ratio", json_real((double)got / floor_here));
            json_object_set_new(r, "model_bytes", json_integer((json_int_t)model));
            json_object_set_new(r, "floor_us", floors(model));
            json_array_append_new(by, r);
            const tool_gpu *rp = tool_gpu_find("rtx-pro-6000"), *h2 = tool_gpu_find("h200"), *b2 = tool_gpu_find("b200");
            txt(b, "  %4d %3d %6d %12llu %12.0f %6.3f %12.2f %9.1f %9.1f %9.1f\n", (int)B, (int)a->k0s[ki], (int)na,
                got, floor_here, (double)got / floor_here, model / 1e6, model / (rp->gbps * 1e3),
                model / (h2->gbps * 1e3), model / (b2->gbps * 1e3));
        }
    }
    b->have_active = 1;
    goto out;
fail:
    rc = tool_fail("the interpreter: %s: %s: %s", step, mj_status_string(st), mj_last_error());
out:
#undef TRY
    mj_moe_free(moe);
    mj_layer_free(L);
    mj_context_destroy(ctx);
    free(hidden), free(out), free(v);
    return rc;
}

/* ---- the GPU ------------------------------------------------------------------------ */

typedef struct routebuf {
    int32_t *ids, *nsel, *cnt, *off, *act, *na, *perm, *rix;
    float *w;
    mj_route_outputs o;
} routebuf;

typedef struct gpu {
    bench *b;
    mj_context_t ctx;
    void *stream, *e0, *e1;
    int32_t H, E, K, maxB;
    uint16_t *hidden[NSETS], *gate;
    float *bias, *logits, *out;
    routebuf rb[NSETS];
    mj_experts_t ex;
    mj_moe_t moe;
    void *exec[NSETS];
    uint64_t ca, cb;
    size_t copy_bytes;
    uint64_t flush;               /* written before each timed call: the L2 evicted           */
    size_t flush_bytes;
    uint8_t flush_value;
    mj_route_params rp;
    double copy_gbps;
} gpu;

enum { OP_COPY, OP_ROUTE, OP_EXPERTS, OP_LAYER, OP_GRAPH };
typedef struct op {
    int kind;
    int32_t B;
    mj_weight_mode mode;
} op;

static mj_status run_op(gpu *g, const op *o, int set) {
    switch (o->kind) {
    case OP_COPY: return mj_cuda_memcpy_dtod_async(g->cb, g->ca, g->copy_bytes, g->stream);
    case OP_ROUTE:
        MJ_CHECK(mj_router_gemm(g->ctx, g->hidden[set], g->gate, o->B, g->H, g->E, g->logits, g->stream));
        return mj_route(g->ctx, &g->rp, g->logits, g->bias, o->B, NULL, &g->rb[set].o, g->stream);
    case OP_EXPERTS:
        return mj_experts_forward(g->ctx, g->ex, o->mode, g->hidden[set], &g->rb[set].o, o->B, NULL, g->out, g->stream);
    case OP_LAYER: return mj_moe_forward(g->moe, g->hidden[set], o->B, NULL, g->out, g->stream);
    default: return mj_cuda_graph_launch(g->exec[set], g->stream);
    }
}

/* Median µs of op over iters calls, each between two events, after a warm-up; before each
 * call (outside its events) a write of twice the L2 evicts what the last call left there. */
static mj_status time_op(gpu *g, const op *o, double *us) {
    const int iters = g->b->a->iters;
    double *v = malloc(sizeof(double) * (size_t)iters);
    if (!v) return mj_set_error(MJ_ERR_NOMEM, "bench: out of memory");
    /* What was written with pageable copies (the default stream) lands before the stream reads it. */
    mj_status st = mj_cuda_synchronize();
    for (int i = 0; i < 3 && st == MJ_OK; i++) st = run_op(g, o, i % NSETS);
    if (st == MJ_OK) st = mj_cuda_stream_synchronize(g->stream);
    for (int i = 0; i < iters && st == MJ_OK; i++) {
        float ms = 0;
        /* Cold L2: the weights are the same every call, so without this they would come from
         * the L2 after the first; the write is enqueued before e0, outside the timed window. */
        if ((st = mj_cuda_memset_async(g->flush, ++g->flush_value, g->flush_bytes, g->stream)) != MJ_OK) break;
        if ((st = mj_cuda_event_record(g->e0, g->stream)) != MJ_OK) break;
        if ((st = run_op(g, o, i % NSETS)) != MJ_OK) break;
        if ((st = mj_cuda_event_record(g->e1, g->stream)) != MJ_OK) break;
        if ((st = mj_cuda_event_synchronize(g->e1)) != MJ_OK) break;
        if ((st = mj_cuda_event_elapsed(g->e0, g->e1, &ms)) != MJ_OK) break;
        v[i] = 1e3 * (double)ms;
    }
    *us = st == MJ_OK ? median(v, iters) : 0;
    free(v);
    return st;
}

static mj_status routebuf_alloc(routebuf *r, int32_t B, int32_t K, int32_t E) {
    const size_t bk = 4 * (size_t)B * (size_t)K;
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->ids));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->w));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)B, "bench", (void **)&r->nsel));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)E, "bench", (void **)&r->cnt));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)(E + 1), "bench", (void **)&r->off));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)E, "bench", (void **)&r->act));
    MJ_CHECK(mj_mem_alloc(0, 4, "bench", (void **)&r->na));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->perm));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->rix));
    mj_route_outputs o = MJ_ROUTE_OUTPUTS_INIT;
    o.ids = r->ids, o.weights = r->w, o.n_sel = r->nsel, o.expert_counts = r->cnt, o.expert_offsets = r->off;
    o.active_experts = r->act, o.n_active = r->na, o.permutation = r->perm, o.row_index = r->rix;
    r->o = o;
    return MJ_OK;
}

static void routebuf_free(routebuf *r) {
    void *p[] = {r->ids, r->w, r->nsel, r->cnt, r->off, r->act, r->na, r->perm, r->rix};
    for (int i = 0; i < 9; i++) mj_mem_free(0, p[i]);
    memset(r, 0, sizeof *r);
}

/* Active experts of a device routing, clamped to 0..E (a stand-in driver runs no kernel). */
static mj_status read_active(gpu *g, const int32_t *na_dev, int32_t *na) {
    MJ_CHECK(mj_mem_get(0, na, na_dev, 4));
    if (*na < 0 || *na > g->E) *na = 0;
    return MJ_OK;
}

/* A result row appended to arr and printed as a text line (label: its name there); returned
 * for more fields. */
static json_t *emit(bench *b, json_t *arr, const char *label, const char *what, int32_t B, int32_t k0,
                    const char *mode, double us, double bytes, double copy) {
    const double gbps = us > 0 ? bytes / (us * 1e3) : 0, of_copy = copy > 0 ? gbps / copy : 0;
    json_t *r = json_object();
    json_object_set_new(r, "what", json_string(what));
    json_object_set_new(r, "B", json_integer(B));
    json_object_set_new(r, "k0", json_integer(k0));
    if (mode) json_object_set_new(r, "mode", json_string(mode));
    json_object_set_new(r, "us", json_real(us));
    json_object_set_new(r, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(r, "gbps", json_real(gbps));
    json_object_set_new(r, "of_copy", json_real(of_copy));
    json_array_append_new(arr, r);
    txt(b, "  %-11s %4d %3d %-6s %10.2f %12.3f %9.1f %7.3f\n", label, (int)B, (int)k0, mode ? mode : "", us,
        bytes / 1e6, gbps, of_copy);
    return r;
}

static int bench_gpu(bench *b) {
    const bench_args *a = b->a;
    gpu G;
    memset(&G, 0, sizeof G);
    G.b = b;
    gpu *g = &G;
    mj_layer_t L = NULL;
    mj_status st = MJ_OK;
    const char *step = "";
    int rc = 0;
    json_t *jg = json_object(), *jr = json_array(), *je = json_array(), *jl = json_array();
    json_object_set_new(b->root, "gpu", jg);
#define TRY(what, call)                                                                  \
    do {                                                                                 \
        step = what;                                                                     \
        if ((st = (call)) != MJ_OK) goto fail;                                           \
    } while (0)
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = a->cache_dir, o.device = 0, o.backend = MJ_BACKEND_CUDA; /* strict: $MOEJIT_STRICT */
    TRY("binding GPU 0", mj_cuda_bind(0));
    TRY("the GPU's context", mj_context_create(&o, &g->ctx));
    mj_device_info di;
    mj_context_device(g->ctx, &di);
    const mj_target tgt = mj_context_target(g->ctx);
    int drv = 0;
    mj_cuda_driver_version(&drv);
    json_object_set_new(jg, "device", json_string(di.name));
    json_object_set_new(jg, "cc", json_integer(di.cc_major * 10 + di.cc_minor));
    json_object_set_new(jg, "target", json_string(mj_target_name(tgt)));
    json_object_set_new(jg, "sms", json_integer(di.sm_count));
    json_object_set_new(jg, "driver", json_integer(drv));
    json_object_set_new(jg, "routing", jr);
    json_object_set_new(jg, "experts", je);
    json_object_set_new(jg, "layer", jl);
    /* Cold L2: twice its size written before each timed call (256 MiB where it is unknown). */
    g->flush_bytes = di.l2_bytes > 0 ? 2 * (size_t)di.l2_bytes : (size_t)256 << 20;
    if (di.l2_bytes <= 0) note(b, "the driver does not say the L2's size: the flush before each timed call writes 256 MiB");
    json_object_set_new(jg, "l2_bytes", json_integer(di.l2_bytes));
    json_object_set_new(jg, "flush_bytes", json_integer((json_int_t)g->flush_bytes));
    json_object_set_new(jg, "cold_l2", json_true());
    txt(b, "\nGPU 0: %s (sm_%d%d, %d SMs, %d MiB L2), driver %d; CUDA events, median of %d after a warm-up, %d input "
           "sets; cold L2: %zu MiB written before each timed call, outside its events\n",
        di.name, di.cc_major, di.cc_minor, di.sm_count, di.l2_bytes >> 20, drv, a->iters, NSETS, g->flush_bytes >> 20);
    TRY("a stream", mj_cuda_stream_create(&g->stream));
    TRY("the L2 flush buffer", mj_cuda_malloc(g->flush_bytes, &g->flush));
    TRY("events", mj_cuda_event_create(&g->e0));
    TRY("events", mj_cuda_event_create(&g->e1));

    /* Copy bandwidth: bytes read + written. */
    g->copy_bytes = (size_t)a->copy_mb << 20;
    TRY("allocating the copy buffers", mj_cuda_malloc(g->copy_bytes, &g->ca));
    TRY("allocating the copy buffers", mj_cuda_malloc(g->copy_bytes, &g->cb));
    {
        uint8_t fill[4096];
        for (int i = 0; i < 4096; i++) fill[i] = (uint8_t)(i * 37 + 11);
        for (size_t off = 0; off < g->copy_bytes; off += (size_t)64 << 20) /* non-zero data */
            TRY("filling the copy buffer", mj_cuda_memcpy_htod(g->ca + off, fill, 4096));
    }
    op oc = {OP_COPY, 0, MJ_MODE_W4A16};
    double us;
    TRY("timing the copy", time_op(g, &oc, &us));
    g->copy_gbps = us > 0 ? 2.0 * (double)g->copy_bytes / (us * 1e3) : 0;
    json_t *jc = json_object();
    json_object_set_new(jc, "bytes", json_integer((json_int_t)(2 * g->copy_bytes)));
    json_object_set_new(jc, "us", json_real(us));
    json_object_set_new(jc, "gbps", json_real(g->copy_gbps));
    json_object_set_new(jg, "copy", jc);
    txt(b, "device-to-device copy of %d MiB: %.1f us, %.1f GB/s (read + written)\n", a->copy_mb, us, g->copy_gbps);
    mj_cuda_free(g->ca), mj_cuda_free(g->cb), g->ca = g->cb = 0;

    /* The layer on the device. */
    if (a->par == MJ_PAR_EP) {
        note(b, "the GPU measurements model a TP rank or a whole layer: with --ep only the copy is measured");
        goto out;
    }
    progress(b, "the GPU's layer: H %d, E %d, %d expert rows, %d shared sub-expert(s)%s", b->cfg.hidden,
             b->cfg.n_experts, b->i_local, b->nsub, b->ck ? " (from the checkpoint)" : " (random)");
    double t0 = now_ms();
    TRY("making the layer", rank_layer(b, b->i_local, 1, &L));
    progress(b, "layer made in %.0f ms", now_ms() - t0);
    g->H = b->cfg.hidden, g->E = b->cfg.n_experts, g->K = b->cfg.topk, g->maxB = a->bb[a->n_bb - 1];
    {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)g->maxB * (size_t)g->H);
        if (!h) TRY("allocating", mj_set_error(MJ_ERR_NOMEM, "out of memory"));
        for (int s = 0; s < NSETS && st == MJ_OK; s++) {
            random_bf16(h, (size_t)g->maxB * (size_t)g->H, 300 + (uint64_t)s);
            st = mj_mem_alloc(0, sizeof(uint16_t) * (size_t)g->maxB * (size_t)g->H, "bench", (void **)&g->hidden[s]);
            if (st == MJ_OK) st = mj_mem_put(0, g->hidden[s], h, sizeof(uint16_t) * (size_t)g->maxB * (size_t)g->H);
            if (st == MJ_OK) st = routebuf_alloc(&g->rb[s], g->maxB, g->K, g->E);
        }
        free(h);
        TRY("the input sets", st);
    }
    const uint16_t *gate;
    const float *bias;
    TRY("the router", mj_layer_router(L, &gate, &bias));
    TRY("the router", mj_mem_alloc(0, 2 * (size_t)g->E * (size_t)g->H, "bench", (void **)&g->gate));
    TRY("the router", mj_mem_put(0, g->gate, gate, 2 * (size_t)g->E * (size_t)g->H));
    if (bias) {
        TRY("the router", mj_mem_alloc(0, 4 * (size_t)g->E, "bench", (void **)&g->bias));
        TRY("the router", mj_mem_put(0, g->bias, bias, 4 * (size_t)g->E));
    }
    TRY("the logits", mj_mem_alloc(0, 4 * (size_t)g->maxB * (size_t)g->E, "bench", (void **)&g->logits));
    TRY("the output", mj_mem_alloc(0, 4 * (size_t)g->maxB * (size_t)g->H, "bench", (void **)&g->out));
    TRY("the routing parameters", mj_route_params_from_config(&b->cfg, &g->rp));

    /* Routing: router GEMM + mj_route. */
    txt(b, "\n  %-11s %4s %3s %-6s %10s %12s %9s %7s\n", "what", "B", "k0", "mode", "us", "weight MB", "GB/s", "of copy");
    for (int ki = 0; ki < a->n_k0; ki++)
        for (int i = 0; i < a->n_bb; i++) {
            op r = {OP_ROUTE, a->bb[i], MJ_MODE_W4A16};
            g->rp.k0 = a->k0s[ki];
            TRY("timing the routing", time_op(g, &r, &us));
            emit(b, jr, "routing", "routing", r.B, g->rp.k0, NULL, us, (double)b->gate_bytes, g->copy_gbps);
        }

    /* The experts, on each set's routing. */
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = g->maxB;
    TRY("packing the experts", mj_experts_create(g->ctx, L, &eo, &g->ex));
    mj_weight_mode resolved;
    const int w4a4_ok = mj_experts_mode(g->ex, MJ_MODE_W4A4, 1, &resolved) == MJ_OK; /* the policy's own check */
    if (!w4a4_ok) note(b, "W4A4 needs sm_120a/sm_121a: the experts are timed in W4A16 only on %s", mj_target_name(tgt));
    for (int m = 0; m < (w4a4_ok ? 2 : 1); m++) {
        const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        progress(b, "preparing the experts (%s)", mode_name(mode));
        TRY("preparing the experts", mj_experts_prepare(g->ctx, g->ex, mode, g->maxB));
        for (int ki = 0; ki < a->n_k0; ki++)
            for (int i = 0; i < a->n_bb; i++) {
                const int32_t B = a->bb[i];
                op ro = {OP_ROUTE, B, mode}, oe = {OP_EXPERTS, B, mode};
                g->rp.k0 = a->k0s[ki];
                double act = 0;
                for (int s = 0; s < NSETS; s++) {
                    int32_t na;
                    TRY("routing a set", run_op(g, &ro, s));
                    TRY("routing a set", mj_cuda_stream_synchronize(g->stream));
                    TRY("routing a set", read_active(g, g->rb[s].na, &na));
                    act += na;
                }
                act /= NSETS;
                const double bytes = (act + b->nsub) * (double)b->per_expert;
                TRY("timing the experts", time_op(g, &oe, &us));
                json_t *r = emit(b, je, "experts", "experts", B, g->rp.k0, mode_name(mode), us, bytes, g->copy_gbps);
                json_object_set_new(r, "active", json_real(act));
            }
    }
    mj_experts_free(g->ex), g->ex = NULL;

    /* The whole layer: eager, then replayed from a CUDA graph (one per input set). */
    TRY("the layer", moe_make(g->ctx, L, b, &g->moe));
    for (int ki = 0; ki < a->n_k0; ki++) {
        char k0p[16];
        snprintf(k0p, sizeof k0p, "%d", (int)a->k0s[ki]);
        progress(b, "preparing the layer (k0 %s)", k0p);
        TRY("preparing the layer", moe_prepare(g->moe, b, k0p));
        for (int i = 0; i < a->n_bb; i++) {
            const int32_t B = a->bb[i];
            int32_t k0;
            mj_weight_mode mode;
            TRY("the batch plan", mj_moe_batch_plan(g->moe, B, &k0, &mode));
            op ol = {OP_LAYER, B, mode}, og = {OP_GRAPH, B, mode};
            double act = 0;
            for (int s = 0; s < NSETS; s++) {
                int32_t na;
                mj_route_outputs rout = MJ_ROUTE_OUTPUTS_INIT;
                TRY("a forward", run_op(g, &ol, s));
                TRY("a forward", mj_cuda_stream_synchronize(g->stream));
                TRY("a forward", mj_moe_route_outputs(g->moe, &rout));
                TRY("a forward", read_active(g, rout.n_active, &na));
                act += na;
            }
            act /= NSETS;
            const double bytes = (double)b->gate_bytes + (act + b->nsub) * (double)b->per_expert;
            double us_g;
            TRY("timing the layer", time_op(g, &ol, &us));
            for (int s = 0; s < NSETS; s++) {
                void *graph = NULL;
                TRY("capturing the layer", mj_cuda_graph_capture_begin(g->stream));
                st = run_op(g, &ol, s);
                mj_status st2 = mj_cuda_graph_capture_end(g->stream, &graph);
                if (st != MJ_OK && graph) mj_cuda_graph_destroy(graph), graph = NULL; /* a failed forward's graph */
                TRY("capturing the layer", st != MJ_OK ? st : st2);
                st = mj_cuda_graph_instantiate(graph, &g->exec[s]);
                mj_cuda_graph_destroy(graph);
                TRY("instantiating the graph", st);
            }
            TRY("timing the graph replays", time_op(g, &og, &us_g));
            for (int s = 0; s < NSETS; s++) mj_cuda_graph_exec_destroy(g->exec[s]), g->exec[s] = NULL;
            for (int gr = 0; gr < 2; gr++) {
                const double t = gr ? us_g : us;
                json_t *r = emit(b, jl, gr ? "layer+graph" : "layer", gr ? "layer_graph" : "layer", B, k0,
                                 mode_name(mode), t, bytes, g->copy_gbps);
                json_object_set_new(r, "active", json_real(act));
            }
        }
    }

    /* The goals. */
    {
        json_t *goals = json_object();
        double worst = -1;
        size_t i;
        json_t *r;
        json_array_foreach(je, i, r) {
            if (strcmp(json_string_value(json_object_get(r, "mode")), "W4A16") ||
                json_integer_value(json_object_get(r, "B")) > 16)
                continue;
            double f = json_real_value(json_object_get(r, "of_copy"));
            if (worst < 0 || f < worst) worst = f;
        }
        json_t *g1 = json_object();
        json_object_set_new(g1, "goal", json_string("experts W4A16 at B <= 16: >= 0.80 of the copy bandwidth"));
        json_object_set_new(g1, "worst", worst < 0 ? json_null() : json_real(worst));
        json_object_set_new(g1, "met", json_boolean(worst >= 0.8));
        json_object_set_new(goals, "experts_bandwidth", g1);
        double t8 = 0, t4 = 0;
        json_array_foreach(jl, i, r) {
            if (strcmp(json_string_value(json_object_get(r, "what")), "layer_graph") ||
                json_integer_value(json_object_get(r, "B")) != 32)
                continue;
            json_int_t k0 = json_integer_value(json_object_get(r, "k0"));
            if (k0 == 8) t8 = json_real_value(json_object_get(r, "us"));
            if (k0 == 4) t4 = json_real_value(json_object_get(r, "us"));
        }
        const int both = t8 > 0 && t4 > 0, oea_met = both && t8 / t4 >= 1.4;
        json_t *g2 = json_object();
        json_object_set_new(g2, "goal", json_string("layer (graph) at B = 32: k0 4 >= 1.4x faster than k0 8"));
        json_object_set_new(g2, "speedup", both ? json_real(t8 / t4) : json_null());
        json_object_set_new(g2, "met", json_boolean(oea_met));
        json_object_set_new(goals, "oea_speedup", g2);
        json_object_set_new(jg, "goals", goals);
        txt(b, "\ngoals: experts W4A16 at B <= 16 >= 0.80 of copy: %s (worst %.3f); layer k0 4 vs 8 at B 32 >= 1.4x: %s",
            worst >= 0.8 ? "met" : "NOT met", worst, oea_met ? "met" : "NOT met");
        if (both) txt(b, " (%.2fx)\n", t8 / t4);
        else txt(b, " (B 32 with k0 8 and 4 not both measured)\n");
    }
    goto out;
fail:
    rc = tool_fail("the GPU: %s: %s: %s", step, mj_status_string(st), mj_last_error());
out:
#undef TRY
    for (int s = 0; s < NSETS; s++) {
        mj_cuda_graph_exec_destroy(g->exec[s]);
        mj_mem_free(0, g->hidden[s]);
        routebuf_free(&g->rb[s]);
    }
    mj_mem_free(0, g->gate), mj_mem_free(0, g->bias), mj_mem_free(0, g->logits), mj_mem_free(0, g->out);
    if (g->ca) mj_cuda_free(g->ca);
    if (g->cb) mj_cuda_free(g->cb);
    if (g->flush) mj_cuda_free(g->flush);
    mj_experts_free(g->ex);
    mj_moe_free(g->moe);
    mj_layer_free(L);
    mj_cuda_event_destroy(g->e0), mj_cuda_event_destroy(g->e1);
    mj_cuda_stream_destroy(g->stream);
    mj_context_destroy(g->ctx);
    return rc;
}

/* ---- the command ------------------------------------------------------------------- */

/* "1,2,4" or ranges ("1-8,16") into a list of at most MAX_LIST values in lo..hi. */
static int parse_list(const char *opt, const char *text, int lo, int hi, int32_t *out, int *n) {
    int32_t *v = NULL, nv = 0;
    if (mj_batches_parse(text, &v, &nv) != MJ_OK) return tool_usage("bench", "%s: %s", opt, mj_last_error());
    if (nv > MAX_LIST) {
        free(v);
        return tool_usage("bench", "%s: at most %d values, got %d", opt, MAX_LIST, (int)nv);
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

int cmd_bench(int argc, char **argv) {
    bench_args a;
    memset(&a, 0, sizeof a);
    a.reps = 3, a.iters = 50, a.sim_I = 64, a.copy_mb = 512;
    static const int32_t dbb[] = {1, 2, 4, 8, 16, 32, 64}, dk0[] = {8, 6, 4, 3};
    memcpy(a.bb, dbb, sizeof dbb), a.n_bb = 7;
    memcpy(a.k0s, dk0, sizeof dk0), a.n_k0 = 4;
    int c, cli_rc;
    char k0p_default[32];
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "bench", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_CK: a.checkpoint = optarg; break;
        case OPT_HIDDEN: if (tool_parse_int("bench", "--hidden", optarg, 64, 1 << 16, &a.hidden)) return 2; break;
        case OPT_INTER: if (tool_parse_int("bench", "--intermediate", optarg, 64, 1 << 16, &a.intermediate)) return 2; break;
        case OPT_EXPERTS: if (tool_parse_int("bench", "--experts", optarg, 1, 4096, &a.experts)) return 2; break;
        case OPT_TOPK: if (tool_parse_int("bench", "--topk", optarg, 1, 64, &a.topk)) return 2; break;
        case OPT_BB: if (parse_list("--bench-batch", optarg, 1, 256, a.bb, &a.n_bb)) return 2; break;
        case OPT_K0:
            if (parse_list("--k0", optarg, 1, 64, a.k0s, &a.n_k0)) return 2;
            for (int i = 0; i < a.n_k0 / 2; i++) { /* largest first: plain top-k, then OEA */
                int32_t t = a.k0s[i];
                a.k0s[i] = a.k0s[a.n_k0 - 1 - i], a.k0s[a.n_k0 - 1 - i] = t;
            }
            break;
        case OPT_REPS: if (tool_parse_int("bench", "--reps", optarg, 1, 64, &a.reps)) return 2; break;
        case OPT_ITERS: if (tool_parse_int("bench", "--iters", optarg, 1, 100000, &a.iters)) return 2; break;
        case OPT_SIMI: if (tool_parse_int("bench", "--sim-intermediate", optarg, 64, 1 << 16, &a.sim_I)) return 2; break;
        case OPT_COPY: if (tool_parse_int("bench", "--copy-mb", optarg, 1, 1 << 16, &a.copy_mb)) return 2; break;
        case OPT_NOCOMPILE: a.no_compile = 1; break;
        case OPT_NOGPU: a.no_gpu = 1; break;
        case OPT_NOSIM: a.no_sim = 1; break;
        case OPT_PREDICT:
            if (!(a.predict = tool_gpu_find(optarg)))
                return tool_usage("bench", "--predict: unknown GPU '%s' (known: %s)", optarg, tool_gpu_names());
            break;
        case OPT_JSON: a.json = 1; break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    /* The shared options, with bench's defaults: TP 8 (one rank with a checkpoint), batch sizes
     * 1-256, k0 "1-3:8,4-:4" ("none": plain top-k). */
    a.config = so.config, a.quant = so.quant, a.mode = so.mode, a.cache_dir = so.cache_dir, a.quiet = so.quiet;
    a.arch = so.n_arch ? so.arch[so.n_arch - 1] : NULL;
    a.batch = so.batch ? so.batch : "1-256";
    const int k0p_given = so.k0_policy != NULL;
    a.k0_policy = !k0p_given ? "1-3:8,4-:4" : strcmp(so.k0_policy, "none") ? so.k0_policy : NULL;
    a.split_given = so.split_given;
    a.par = so.split_given ? so.par : MJ_PAR_TP, a.n_ranks = so.split_given ? so.n_ranks : 8;
    if (optind < argc) return tool_usage("bench", "unexpected argument '%s'", argv[optind]);
    if (a.checkpoint && !a.split_given) a.par = MJ_PAR_NONE, a.n_ranks = 1;
    if (a.n_ranks == 1) a.par = MJ_PAR_NONE;
    if (a.sim_I % MJ_DIM_ALIGN) return tool_usage("bench", "--sim-intermediate must be a multiple of %d", MJ_DIM_ALIGN);

    bench b;
    memset(&b, 0, sizeof b);
    b.a = &a;
    b.txt = a.json ? NULL : stdout;
    b.root = json_object();
    json_object_set_new(b.root, "notes", json_array());
    int rc = read_config(&b);
    if (rc) goto out;
    if (!k0p_given && b.cfg.topk < 8) { /* the default policy's k0 at most top-k; a given one is checked */
        snprintf(k0p_default, sizeof k0p_default, "1-3:%d,4-:%d", (int)b.cfg.topk, b.cfg.topk < 4 ? (int)b.cfg.topk : 4);
        a.k0_policy = k0p_default;
    }
    mj_status st = mj_plan_rank_shape(&b.cfg, a.par, 0, a.n_ranks, 1, &b.i_local, &b.nsub);
    if (st != MJ_OK) {
        rc = tool_fail("the split: %s", mj_last_error());
        goto out;
    }
    /* k0 values above top-k are left out. */
    int nk = 0;
    for (int i = 0; i < a.n_k0; i++)
        if (a.k0s[i] <= b.cfg.topk) a.k0s[nk++] = a.k0s[i];
    if (nk < a.n_k0) note(&b, "k0 values above top-k (%d) left out", b.cfg.topk);
    a.n_k0 = nk;
    if (!a.n_k0) {
        rc = tool_usage("bench", "--k0: no value is within 1..top-k (%d)", b.cfg.topk);
        goto out;
    }
    const int32_t H = b.cfg.hidden;
    b.per_expert = mj_pack_expert_bytes(H, b.i_local);
    b.gate_bytes = 2 * (int64_t)b.cfg.n_experts * H;

    /* A GPU? */
    int have_gpu = 0;
    mj_device_info di;
    memset(&di, 0, sizeof di);
    int ndev = 0;
    if (!a.no_gpu) { /* no driver or no device: no GPU; a driver that fails otherwise: an error */
        st = mj_cuda_load();
        if (st == MJ_OK) st = mj_cuda_device_count(&ndev);
        if (st == MJ_OK && ndev > 0) st = mj_cuda_device_info(0, &di);
        if (st == MJ_OK && ndev > 0) {
            have_gpu = 1;
        } else if (st != MJ_OK && st != MJ_ERR_NO_DEVICE) {
            rc = tool_fail("the CUDA driver: %s", mj_last_error());
            goto out;
        }
    }
    /* The checkpoint's layer the measurements are of (rank 0's slice), loaded and so validated
     * before anything is measured, with a GPU or without: a checkpoint that does not load is
     * an error, not a bench of weights nobody read. Kept for the GPU's run, else freed. */
    if (b.ck) {
        progress(&b, "loading layer %d of %s (rank 0's slice)", b.ck_layer, a.checkpoint);
        if ((st = mj_layer_load(b.ck, b.ck_layer, a.par, 0, a.par == MJ_PAR_NONE ? 1 : a.n_ranks, &b.ck_L)) != MJ_OK) {
            char what[4200];
            snprintf(what, sizeof what, "%s: loading layer %d", a.checkpoint, b.ck_layer);
            rc = tool_fail_status(what, st);
            goto out;
        }
        if (!have_gpu || a.par == MJ_PAR_EP) mj_layer_free(b.ck_L), b.ck_L = NULL;
    }
    const char *arch = a.arch ? a.arch
                       : have_gpu ? mj_target_name(di.target)
                       : a.predict ? a.predict->arch
                       : mj_target_name(MJ_DEFAULT_TARGET);
    {
        const char *ver;
        mj_version(NULL, NULL, NULL, &ver);
        json_object_set_new(b.root, "moejit", json_string(ver));
        json_t *jc = json_object();
        json_object_set_new(jc, "hidden", json_integer(b.cfg.hidden));
        json_object_set_new(jc, "intermediate", json_integer(b.cfg.intermediate));
        json_object_set_new(jc, "experts", json_integer(b.cfg.n_experts));
        json_object_set_new(jc, "topk", json_integer(b.cfg.topk));
        json_object_set_new(jc, "n_shared", json_integer(b.cfg.n_shared));
        json_object_set_new(jc, "split", json_string(a.par == MJ_PAR_TP ? "tp" : a.par == MJ_PAR_EP ? "ep" : "none"));
        json_object_set_new(jc, "ranks", json_integer(a.n_ranks));
        json_object_set_new(jc, "i_local", json_integer(b.i_local));
        json_object_set_new(jc, "shared_sub_experts", json_integer(b.nsub));
        json_object_set_new(jc, "expert_bytes", json_integer(b.per_expert));
        json_object_set_new(jc, "gate_bytes", json_integer(b.gate_bytes));
        json_object_set_new(jc, "checkpoint", a.checkpoint ? json_string(a.checkpoint) : json_null());
        json_object_set_new(b.root, "config", jc);
        json_object_set_new(b.root, "target", json_string(arch));
        json_object_set_new(b.root, "gpu", json_null());
        txt(&b, "moejit %s bench: H %d, I %d, E %d, top-%d, %d shared; %s %d: rank 0 holds experts of %d rows "
                "(%lld bytes packed) and %d shared sub-expert(s); target %s%s\n",
            ver, b.cfg.hidden, b.cfg.intermediate, b.cfg.n_experts, b.cfg.topk, b.cfg.n_shared,
            a.par == MJ_PAR_TP ? "TP" : a.par == MJ_PAR_EP ? "EP" : "ranks", a.n_ranks, b.i_local,
            (long long)b.per_expert, b.nsub, arch, have_gpu ? "" : "; no GPU: the GPU measurements are skipped");
    }
    if (!have_gpu) note(&b, "no GPU%s: only what the interpreter and the compiler can tell", a.no_gpu ? " (--no-gpu)" : "");
    if ((rc = bench_plan(&b, arch))) goto out;
    if (a.no_sim) {
        json_object_set_new(b.root, "launch_path", json_null());
        json_object_set_new(b.root, "bytes", json_null());
    } else if (a.par == MJ_PAR_EP) {
        note(&b, "the interpreter's measurements model a TP rank or a whole layer: skipped with --ep");
    } else if ((rc = bench_sim(&b, arch))) {
        goto out;
    }
    if (a.predict) { /* the performance model (tools/predict_plan.c) */
        tool_predict_in pi = {&b.cfg, b.i_local, b.nsub, (double)b.per_expert, (double)b.gate_bytes, arch, a.predict,
                              a.cache_dir, a.mode, a.bb, a.k0s, a.n_bb, a.n_k0, b.have_active ? b.active : NULL};
        if ((rc = tool_predict_plan(&pi, b.root, b.txt))) goto out;
    }
    if (have_gpu && (rc = bench_gpu(&b))) goto out;
out:
    if (a.json && !rc) {
        char *s = json_dumps(b.root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
    }
    json_decref(b.root);
    mj_layer_free(b.ck_L);
    if (b.ck) mj_checkpoint_close(b.ck);
    return rc;
}
