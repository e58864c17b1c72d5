/* tools.h — what the subcommands of `moejit` share. */
#ifndef MJ_TOOLS_H
#define MJ_TOOLS_H

#include "moejit.h"
#include "npy.h"

#include <getopt.h>
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
    const char *sim_target;      /* the interpreter's target (NULL: MJ_DEFAULT_TARGET)      */
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
int cmd_models(int argc, char **argv);

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
    double l2_mib;             /* L2 cache, MiB (as cudaDevAttrL2CacheSize reports it)     */
    const char *device;        /* what the CUDA driver's name of it holds ("H200")         */
} tool_gpu;
const tool_gpu *tool_gpu_find(const char *name);
/* The GPU whose `device` the CUDA driver's device name holds, NULL for none. */
const tool_gpu *tool_gpu_for_device(const char *device_name);
const char *tool_gpu_names(void);
int tool_gpu_count(void);
const tool_gpu *tool_gpu_at(int i);

/* The SASS of a cubin (nvdisasm or cuobjdump from $MOEJIT_NVDISASM, PATH or
 * /usr/local/cuda/bin; tools/sass.c) into *text (malloc'd). 0, or 1 after the error line. */
int tool_sass_text(const void *bin, size_t len, char **text);

/* ---- options (tools/options.c) ------------------------------------------------------------
 * A subcommand's options are one table, tool_opt entries: its own options and the shared
 * ones it takes. One loop parses them (tool_cli_next) and one function prints them for
 * --help (tool_cli_help), so a shared option's name, argument, parsing and help text are
 * written once, in options.c; a subcommand adds at most a note to its help (its default,
 * say). */

/* The shared options, by group: their ids (a short option's id is its letter). */
enum {
    TOOL_OPT_HELP = 'h',          /* -h, --help: the subcommand's help, exit 0 (every one)       */
    TOOL_OPT_VERSION = 'V',       /* -V, --version (every one)                                   */
    TOOL_OPT_QUIET = 'q',         /* -q, --quiet: progress                                      */
    TOOL_OPT_CACHE_DIR = 0x1000,  /* --cache-dir D: the kernel cache                            */
    TOOL_OPT_CONFIG,              /* --config F, --quant F: the model                           */
    TOOL_OPT_QUANT,
    TOOL_OPT_TP,                  /* --tp N, --ep N: the split                                  */
    TOOL_OPT_EP,
    TOOL_OPT_BATCH,               /* --batch B, --k0-policy P, --mode M: the plan               */
    TOOL_OPT_K0_POLICY,
    TOOL_OPT_MODE,
    TOOL_OPT_ARCH,                /* --arch A: the target (repeatable)                          */
};

/* One entry of a subcommand's table: an option of its own, a shared one (TOOL_SHARED), or a
 * heading in --help (TOOL_HEADING); {0} ends the table. */
typedef struct tool_opt {
    const char *name;             /* the long name ("cache-dir"), or NULL: a short one only     */
    int id;                       /* what tool_cli_next returns: the short letter, or >= 256     */
    int has_arg;
    const char *arg;              /* the argument's name in --help ("D")                         */
    const char *help;             /* --help's text, lines split by '\n'; NULL: not listed (said
                                     with another option, or in the text above). Of a shared
                                     option: the subcommand's note, after the group's text      */
    const char *synopsis;         /* --help's left column, when not "-x, --name ARG"             */
    int shared;                   /* a shared option's id: the rest comes from its group         */
} tool_opt;
#define TOOL_SHARED(id_, note) {.shared = (id_), .help = (note)}
#define TOOL_HEADING(text) {.help = (text)}

/* The shared options' values, as tool_cli_next parsed them. */
#define TOOL_MAX_ARCH 28          /* four times each target                                      */
typedef struct tool_shared {
    const char *cache_dir;        /* --cache-dir, or NULL: the library's default                 */
    const char *config, *quant;   /* --config, --quant, or NULL                                  */
    mj_parallel par;              /* --tp / --ep: MJ_PAR_TP or MJ_PAR_EP and N when given        */
    int n_ranks, split_given;     /* (TOOL_SHARED_INIT: MJ_PAR_NONE, one rank)                   */
    const char *batch, *k0_policy, *mode; /* --batch, --k0-policy, --mode as given, or NULL     */
    const char *arch[TOOL_MAX_ARCH]; /* --arch, each checked and named canonically ("sm_90a"),  */
    int n_arch;                   /* in the order given                                          */
    int quiet;                    /* -q                                                          */
} tool_shared;
#define TOOL_SHARED_INIT {.par = MJ_PAR_NONE, .n_ranks = 1}

#define TOOL_CLI_MAX_OPTS 48
typedef struct tool_cli {
    const char *cmd;              /* "bench": messages say "moejit bench: ..."                   */
    const char *usage;            /* --help's text before the options                            */
    const tool_opt *opts;         /* the table; -h/--help and -V/--version are added             */
    tool_shared *sh;              /* where the shared options go                                 */
    /* built by the first tool_cli_next */
    int ready;
    struct option longs[TOOL_CLI_MAX_OPTS + 1];
    char shorts[2 * TOOL_CLI_MAX_OPTS + 1];
} tool_cli;

/* The next option of argv that is the subcommand's own: its id, with optarg its value. 0 when
 * the options are over (optind is the first operand; getopt_long's order: operands may come
 * first). TOOL_CLI_EXIT when the subcommand returns *rc now: after --help or --version (0), or
 * after the usage line of an unknown option or a bad value of a shared one (2). Texts of help
 * and usage may say {target}, {targets} and {gpus}: the default target, every target and the
 * GPUs of tools/gpus.c. */
#define TOOL_CLI_EXIT (-1)
int tool_cli_next(tool_cli *cli, int argc, char **argv, int *rc);
/* The subcommand's --help on f. Returns 0. */
int tool_cli_help(const tool_cli *cli, FILE *f);
void tool_print_version(void);

/* Parse a whole integer / positive finite float argument or fail with a usage line. */
int tool_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, int *out);
int tool_parse_positive_float(const char *cmd, const char *opt, const char *text, float *out);
/* --tp N or --ep N (tp: which) for subcommand cmd: one split only (already: one was given),
 * N in 1..MJ_MAX_RANKS. 0, or nonzero after the usage line. */
int tool_parse_split(const char *cmd, int tp, const char *text, int already, mj_parallel *par, int *n_ranks);
/* --mode's text: "w4a16" and "w4a4" fix the mode; anything else is a mode policy (MJ_MODE_AUTO,
 * *policy = text). NULL: MJ_MODE_AUTO and *policy NULL. */
mj_weight_mode tool_mode_parse(const char *text, const char **policy);
/* GPUs there are (0 without a CUDA driver). */
int tool_gpus_present(void);

/* The plan bench and prewarm list: --batch, --k0-policy (NULL: plain top-k) and --mode (NULL:
 * the target's default policy) parsed for subcommand cmd, then every rank's specializations
 * on ctx's target. 0 with *plan to mj_plan_free and *n_batches (may be NULL) the number of
 * batch sizes, or the exit code after the error line, which names config (NULL: only ctx's
 * target). */
struct mj_plan;
int tool_plan_build(const char *cmd, mj_context_t ctx, const mj_moe_config *cfg, mj_parallel par, int n_ranks,
                    int shared, const char *batch, const char *k0_policy, const char *mode_text,
                    const char *config, struct mj_plan *plan, int32_t *n_batches);
/* A model's config.json (its MoE part) with its NVFP4 quantization: quant, else the
 * hf_quant_config.json beside config (when there is one). 0, or the exit code after the
 * error line (no NVFP4 quantization, or what mj_moe_config_read refused). */
int tool_config_read(const char *config, const char *quant, mj_moe_config *cfg);

#endif
