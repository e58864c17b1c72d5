/* bench.h — what the parts of `moejit bench` share:
 *   cmd_bench.c   the command: options, the model and its split, the report's header, and
 *                 the helpers below;
 *   bench_plan.c  the plan: specializations and their compile, load and lookup times;
 *   bench_sim.c   the interpreter: the launch path's host time, and the bytes a forward reads;
 *   bench_gpu.c   the GPU: copy bandwidth, routing, the experts and the layer, timed;
 *   predict_plan.c  the performance model (--predict). */
#ifndef MJ_TOOLS_BENCH_H
#define MJ_TOOLS_BENCH_H

#include "tools.h"

#include <jansson.h>

#define BENCH_MAX_LIST 64 /* values of --bench-batch and --k0                                */

typedef struct bench_args {
    const char *config, *quant, *checkpoint, *batch, *k0_policy, *mode, *arch, *cache_dir;
    int k0_policy_default;        /* --k0-policy not given: k0_policy is bench's default,     */
    char k0_policy_buf[32];       /* lowered to top-k here when the model's is below 8        */
    int32_t bb[BENCH_MAX_LIST], n_bb; /* --bench-batch                                        */
    int32_t k0s[BENCH_MAX_LIST], n_k0; /* --k0, largest first                                 */
    int hidden, intermediate, experts, topk;
    mj_parallel par;
    int n_ranks, split_given;
    int reps, iters, sim_I, copy_mb, json, no_gpu, no_compile, no_sim, quiet;
    const tool_gpu *predict;      /* --predict                                                */
    int predict_auto;             /* --predict auto: the GPU found (tool_gpu_for_device)      */
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
    double active[BENCH_MAX_LIST * BENCH_MAX_LIST]; /* [k0][B]: active experts the           */
    int have_active;              /* interpreter saw (1), or the GPU's routing (2: the mean of
                                     its sets, which --predict then takes)                    */
} bench;

/* The sections, in the order they run; each 0, or the exit code after the error line. */
int bench_plan(bench *b, const char *arch);
int bench_sim(bench *b, const char *arch);
int bench_gpu(bench *b);

/* ---- shared by the sections (cmd_bench.c) ---- */
double bench_now_ms(void);
/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);
/* A progress line on stderr ("bench: ..."), unless -q. */
void bench_progress(const bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Text output (nothing with --json). */
void bench_txt(const bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A note: in root["notes"], and a "note: " line of the text. */
void bench_note(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* n random bf16 values (standard normal) from seed. */
void bench_random_bf16(uint16_t *x, size_t n, uint64_t seed);
/* Rank 0's layer for a run: from the checkpoint (its slice; the one loaded up front is handed
 * over), or random with rank 0's shapes and `rows` expert rows (the rank's own, or the
 * interpreter's smaller ones). */
mj_status bench_rank_layer(bench *b, int32_t rows, int from_ck, mj_layer_t *out);
/* The moe handle on one rank's layer, with --mode's policy; prepared for the tables' batch
 * sizes with k0 policy k0p and --mode. */
mj_status bench_moe_make(mj_context_t ctx, mj_layer_t L, const bench *b, mj_moe_t *moe);
mj_status bench_moe_prepare(mj_moe_t moe, const bench *b, const char *k0p);
const char *bench_mode_name(mj_weight_mode m); /* "W4A16", "W4A4" */

/* call, with what it does in `step` (a section's const char * field) for the error line if
 * it fails: the sections' STEP. */
#define BENCH_STEP(step, what, call)                                                       \
    do {                                                                                   \
        (step) = (what);                                                                   \
        mj_status bench_step_st_ = (call);                                                 \
        if (bench_step_st_ != MJ_OK) return bench_step_st_;                                \
    } while (0)

#endif
