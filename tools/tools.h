/* tools.h — what the subcommands of `moejit` share. */
#ifndef MJ_TOOLS_H
#define MJ_TOOLS_H

#include "moejit.h"
#include "npy.h"

#include <stdio.h>

/* Each subcommand: argc/argv start at the subcommand's name. Returns the exit code. */
int cmd_route(int argc, char **argv);
int cmd_nvfp4(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_prewarm(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* One layer forward on n_ranks ranks (threads), for run and demo (tools/moe_run.c). */
typedef struct tool_moe_job {
    mj_checkpoint_t ck;          /* each rank loads its slice of the layer from here        */
    int32_t layer;
    mj_parallel par;
    int n_ranks;
    int backend;                 /* MJ_BACKEND_SIM (loopback ranks) or MJ_BACKEND_CUDA     */
    const char *sim_target;      /* the interpreter's target ("sm_120a")                   */
    const char *cache_dir;
    const char *k0_policy;       /* NULL: plain top-k                                      */
    mj_weight_mode mode;
    const char *mode_policy;
    const uint16_t *hidden;      /* [B, H] bf16, host                                      */
    int32_t B, num_valid;
    float *out;                  /* [B, H], host: rank 0's output                          */
    /* results */
    mj_jit_stats stats;          /* compiles, hits: summed over the ranks                  */
    unsigned long long bytes;    /* weight bytes streamed, all ranks (the interpreter)      */
    unsigned long long max_rank_bytes; /* the busiest rank's                              */
    int32_t n_active, k0;
    mj_weight_mode mode_used;
    double prepare_ms, forward_ms; /* the slowest rank's                                  */
} tool_moe_job;
int tool_moe_run(tool_moe_job *j); /* 0, or 1 after printing the error                    */
int cmd_make_checkpoint(int argc, char **argv);

/* One line on stderr, "moejit: ...", and the exit code 1 (or 2 for usage errors). */
int tool_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tool_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A failed library call: the status and mj_last_error(). */
int tool_fail_status(const char *what, mj_status s);

/* GPUs by name, for floors and the performance model (tools/gpus.c; sources there). */
typedef struct tool_gpu {
    const char *name;          /* "rtx-pro-6000"                                           */
    const char *desc;
    double gbps;               /* peak DRAM bandwidth, GB/s (vendor)                       */
    const char *arch;          /* the target its kernels are built for ("sm_120a")         */
    int sms;
    double clock_mhz;          /* boost clock                                              */
    double copy_gbps;          /* a measured device-to-device copy (read + written), 0: none */
    double int_rate;           /* integer-pipe warp-instructions a scheduler issues a cycle */
    double lat_ns;             /* assumed DRAM latency of a dependent load, loaded GPU      */
    int regs_sm, smem_sm;      /* registers and shared memory (bytes) for blocks, per SM   */
    int warps_sm, blocks_sm;   /* resident warps and blocks per SM at most                 */
} tool_gpu;
const tool_gpu *tool_gpu_find(const char *name);
const char *tool_gpu_names(void);
int tool_gpu_count(void);
const tool_gpu *tool_gpu_at(int i);

/* The SASS of a cubin (nvdisasm or cuobjdump from $MOEJIT_NVDISASM, PATH or
 * /usr/local/cuda/bin; tools/sass.c) into *text (malloc'd). 0, or 1 after the error line. */
int tool_sass_text(const void *bin, size_t len, char **text);

/* The plan bench and prewarm list (tools/options.c): --batch, --k0-policy (NULL: plain top-k)
 * and --mode (NULL: the target's default policy) parsed for subcommand cmd, then every rank's
 * specializations on ctx's target. 0 with *plan to mj_plan_free and *n_batches (may be NULL)
 * the number of batch sizes, or the exit code after the error line, which names config
 * (NULL: only ctx's target). */
struct mj_plan;
int tool_plan_build(const char *cmd, mj_context_t ctx, const mj_moe_config *cfg, mj_parallel par, int n_ranks,
                    int shared, const char *batch, const char *k0_policy, const char *mode_text,
                    const char *config, struct mj_plan *plan, int32_t *n_batches);
/* A model's config.json (its MoE part) with its NVFP4 quantization: quant, else the
 * hf_quant_config.json beside config (when there is one). 0, or the exit code after the
 * error line (no NVFP4 quantization, or what mj_moe_config_read refused). */
int tool_config_read(const char *config, const char *quant, mj_moe_config *cfg);

/* Parse a whole integer / positive finite float argument or fail with a usage line. */
int tool_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, int *out);
int tool_parse_positive_float(const char *cmd, const char *opt, const char *text, float *out);

/* --tp N or --ep N (tp: which) for subcommand cmd: one split only (already: one was given),
 * N in 1..MJ_MAX_RANKS. 0, or nonzero after the usage line. */
int tool_parse_split(const char *cmd, int tp, const char *text, int already, mj_parallel *par, int *n_ranks);
/* --mode's text: "w4a16" and "w4a4" fix the mode; anything else is a mode policy (MJ_MODE_AUTO,
 * *policy = text). NULL: MJ_MODE_AUTO and *policy NULL. */
mj_weight_mode tool_mode_parse(const char *text, const char **policy);

#endif
