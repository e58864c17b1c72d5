/* predict.h — a static performance model of our kernels (`moejit bench --predict`): no GPU.
 *
 * Two halves. predict.c is the model itself, pure and testable: it reads a kernel's SASS text
 * (what nvdisasm prints) into counts of its hot loop, and turns those counts, a launch and a
 * GPU's figures into a predicted time, a floor and the bound that sets the time.
 * predict_plan.c is the glue bench calls: the plan's kernels compiled (no GPU needed), their
 * cubins disassembled, their launches as runtime/experts.c and runtime/route.c make them.
 *
 * Every assumption is a field of pm_assume (printed with --predict, listed in docs/performance.md). */
#ifndef MJ_PREDICT_H
#define MJ_PREDICT_H

#include "tools.h"

#include <stdint.h>

/* ---- the SASS of one kernel ----------------------------------------------------------- */

/* Instruction classes, by the opcode's name before its first '.' (NOPs are not counted). */
enum {
    PM_MEM,    /* LDG LDGSTS LDS STS STG LDSM ATOM(S) RED LDL STL: the load/store unit        */
    PM_TENSOR, /* HMMA OMMA QMMA IMMA MMA HGMMA ...                                          */
    PM_FP32,   /* FFMA FMUL FADD FMNMX FSETP FSEL FCHK                                       */
    PM_INT,    /* IMAD IADD3 LOP3 SHF PRMT ISETP LEA SEL VIADD IMNMX ...: integer (the ALU,
                  and IMAD the FMA pipe where the integer rate is half: see pm_predict)      */
    PM_HALF,   /* HMUL2 HFMA2 HADD2 HMNMX2 HSETP2                                            */
    PM_OTHER,  /* the rest: MOV S2R BRA BAR SHFL MUFU F2F I2F LDC DEPBAR ...                 */
    PM_NCLASS
};
extern const char *const pm_class_names[PM_NCLASS]; /* "mem", "tensor", "fp32", "int", "half", "other" */

typedef struct pm_sass {
    int n_insts;                 /* the function's instructions (no NOPs)                     */
    int n_loops;                 /* backward branches                                         */
    int found;                   /* a hot loop: the innermost loop that copies global memory
                                    to shared (LDGSTS), else the innermost with a global load */
    int first, last;             /* its instructions: indices first..last (the branch)        */
    double iter[PM_NCLASS];      /* warp-instructions one iteration issues, by class; a loop
                                    nested inside counts its body times its trip count       */
    double iter_total;
    double iter_imad;            /* of iter[PM_INT], the IMADs (IMAD.SHL, IMAD.MOV, ...): before
                                    Blackwell the FMA pipe issues them, not the ALU            */
    double piece[PM_NCLASS];     /* of iter, what a forward branch inside the hot loop skips
                                    where the skipped code stores to global memory (STG): a
                                    persistent launch's piece end (a piece's sums stored and
                                    added), which runs once every stream_spp iterations      */
    double piece_total, piece_imad;
    int ldgsts, ldg;             /* global loads in its body (static)                         */
    int chain;                   /* the longest chain of dependent global loads in one
                                    iteration: a load whose address comes from another's data */
    int pre_chain;               /* the same in the code before the hot loop (a work item's
                                    start: its metadata, then its rows)                       */
    int outside;                 /* the function's instructions outside the hot loop, but the
                                    rare subroutines                                          */
    int rare;                    /* subroutines a warp does not run in the common case, left
                                    out of outside: a division's slow path, a helper named
                                    *_once (one block of a launch runs it) or *_few (its
                                    first threads: up's prefetch, a line a thread)            */
    /* The tail loop: the innermost loop outside the hot one (and the rare subroutines) with
     * the most global loads (LDG), a reduction of what other warps stored (experts_up STREAM's
     * fold of a split tile, router_gemm's parts). What one iteration loads is what a lane has
     * in flight before it waits for L2 (0: no such loop). */
    int tail_ldg;                /* its global loads (static)                                 */
    int tail_bytes;              /* bytes a lane loads in one iteration                       */
    int tail_insts;              /* its instructions                                          */
    int tail_first, tail_last;   /* its instructions: indices (when tail_ldg > 0)             */
    int finish;                  /* the finisher: what the outermost guarded forward branch
                                    after the hot loop that skips over the tail loop skips,
                                    but the tail loop and rare code (STREAM up's `if (last)`:
                                    the fold's passes, the SwiGLU epilogue): the warp that
                                    completes a unit runs it, once a unit, not once a segment */
} pm_sass;

/* Read nvdisasm's text of the function named `function` (its `.text.NAME:` section) into s.
 * 0, or -1 when the text has no such function. */
int pm_sass_analyze(const char *text, const char *function, pm_sass *s);

/* The routing kernel (templates/oea_route.cu) read from its SASS: its loops depend on the
 * data, so the counts are of the pieces a warp runs, which the launch multiplies (loops of a
 * known trip count inside a piece times that count, others once):
 *   token     the token loop (the innermost loop of the kernel's own code that loads global
 *             memory: a token's scores, its eligible set, its weights) without its picks;
 *   pick      one pick: the first innermost loop inside it holding a warp reduction (REDUX,
 *             or the butterfly shuffles of a warp max);
 *   outside   the kernel's own code outside the token loop (set-up, the phases' barriers);
 *   dispatch  the dispatch subroutine (counts, offsets, the permutation: once a warp);
 *   score     the block's scoring subroutine (block_scores: a round's sigmoid scores, every
 *             thread its share of the round's (token, expert) pairs): a trip of its loop
 *             (one pair's math), and score_once the rest (its loads, at most E / 32 a thread,
 *             all counted). 0 where the kernel has none (softmax scores in the token loop).
 * The token loop is the innermost loop of the kernel's own code (up to its last
 * unconditional EXIT) that loads global memory or calls block_scores and holds a pick loop. */
typedef struct pm_route_sass {
    int found;                   /* a token loop with a pick loop inside                      */
    int pick_loops;
    double token, pick, outside, dispatch;
    double dispatch_small;       /* the short dispatch of B x k <= 32 entries (0: the kernel
                                    has none: blocks of more than 8 warps)                    */
    double dispatch_bars;        /* the dispatch's barriers (BAR): what a warp that takes no
                                    part in it issues, 3 instructions each (the barrier, its
                                    guard and branch)                                         */
    double score, score_once;
} pm_route_sass;
int pm_sass_route(const char *text, const char *function, pm_route_sass *r);
/* A warp's instructions in the one-block launch of B tokens over nwarps warps of E experts
 * (top-k, OEA's k0): ceil(B / nwarps) tokens (rounds), each scored once (twice under OEA when
 * a warp has more than one: phase 1 scores it again) and picked k times (k0 + k in that
 * case); each scoring round's block_scores, whose busiest thread takes ceil(n E / (nwarps
 * 32)) pairs of the round's n tokens; the dispatch (the short one where B x k <= 32 and the
 * kernel has it) and the kernel's set-up once. */
double pm_route_insts(const pm_route_sass *r, int B, int nwarps, int E, int k, int k0);
/* The same launch's warps on average (the SM's issue): pm_route_insts's, with the whole
 * dispatch the part of dwarps of the nwarps (mj_route_dispatch_warps) and the others at its
 * barriers. */
double pm_route_insts_avg(const pm_route_sass *r, int B, int nwarps, int dwarps, int E, int k, int k0);

/* The experts the busiest of w warps takes when n routed experts are dealt by id modulo w
 * (ids at random: each warp equally likely) and s shared sub-experts j to warp j modulo w:
 * the expected largest share, exactly (the routed counts are multinomial). What experts_down's
 * warps each walk is the busiest one's: a block waits for it. */
double pm_busiest_share(int n, int w, int s);

/* ---- the model -------------------------------------------------------------------------- */

/* What the model assumes beyond a GPU's table row (tools/gpus.c). */
typedef struct pm_assume {
    double launch_us;            /* a kernel's fixed cost on a stream: launch, the first
                                    blocks' start, the last one's drain                       */
    double pdl_launch_us;        /* the same for a kernel launched as a programmatic dependent
                                    of the one before (sm_90+, MJ_PDL templates): its blocks
                                    are resident before that one ends, so what is left is the
                                    wait's release and its first dependent load (assumed)     */
    double warp_cpi;             /* cycles between two instructions of one warp when nothing
                                    else hides its dependences (ALU latency, shared memory)   */
    double copy_fraction;        /* achievable copy bandwidth / peak where none was measured  */
    double tensor_rate;          /* MMA warp-instructions a scheduler issues per cycle        */
    double mem_rate;             /* load/store warp-instructions a scheduler issues per cycle */
    double half_rate;            /* HMUL2/HFMA2 warp-instructions per scheduler per cycle     */
    double l2_lat_cycles;        /* an L2 hit's latency, cycles (a tail's round trip)          */
    double tail_cpi;             /* cycles an instruction of a tail loop's iteration (its loads
                                    independent, its adds two interleaved chains)             */
    double waves_imbalance;      /* the busiest SM with this many times the average SM's
                                    blocks (or a grid under half the SMs) makes a per-SM bound
                                    "waves"                                                   */
} pm_assume;
void pm_assume_default(pm_assume *a);

/* One launch of a kernel, as the model sees it. */
typedef struct pm_launch {
    const char *kernel;          /* "experts_up"                                              */
    int64_t blocks;              /* blocks that work (those that exit at once are free)       */
    int threads;                 /* per block                                                 */
    int regs;                    /* per thread (ptxas)                                        */
    int smem;                    /* per block, dynamic + static, bytes                        */
    double bytes;                /* DRAM bytes the kernel must read (weights; the floor's)    */
    double iters;                /* hot-loop iterations of one working warp                   */
    double extra;                /* warp-instructions of a warp outside the hot loop (<0: the
                                    SASS's count outside it, once)                            */
    double inflight;             /* bytes one warp keeps in flight (its ring)                 */
    int pdl;                     /* launched as a programmatic dependent of the kernel before */
    /* A persistent grid (experts_up's STREAM): stream_pieces > 0, the pieces of a list taken in
     * even runs by the warps of the blocks the GPU holds at once; pm_stream_launch sets blocks,
     * iters and extra from them. */
    double stream_pieces;        /* the list's pieces                                         */
    int stream_unit;             /* a unit's (tile's) pieces: a run's segments are units'     */
    int stream_spp;              /* hot-loop iterations (k-steps) a piece                     */
    double stream_fold_bytes;    /* what a lane of the warp that completes a split unit loads
                                    for one pass of its fold (a pair of the unit's tokens: the
                                    first warp's sum and every later piece's, at worst the
                                    whole unit's pieces): the SASS's tail loop takes it
                                    tail_bytes a trip to L2, after every run ends            */
    int stream_fold_passes;      /* the busiest unit's passes (its token pairs; 0 counts as 1) */
    double prefetched;           /* of bytes, those in L2 before the kernel reads them: brought
                                    there while the kernels before it ran (experts_up's
                                    prefetch of the shared sub-experts during the routing);
                                    the memory and latency terms leave them out where the
                                    kernel is a programmatic dependent (pdl), the floor not  */
    double extra_sm;             /* > 0: a warp's instructions on average over the launch's
                                    warps where they differ (oea_route: the dispatch is some
                                    warps'), which the SM's issue counts; extra stays the
                                    busiest warp's (its own dependent issue)                 */
} pm_launch;

typedef enum { PM_BOUND_MEMORY, PM_BOUND_ISSUE, PM_BOUND_LATENCY, PM_BOUND_WAVES } pm_bound;
extern const char *const pm_bound_names[4]; /* "memory", "issue", "latency", "waves" */

typedef struct pm_result {
    double predicted_us;         /* launch_us (pdl_launch_us) + the largest of the terms below,
                                    + t_tail                                                  */
    double floor_us;             /* bytes / the copy bandwidth                                */
    pm_bound bound;
    /* the terms, µs */
    double prefetched;           /* of the launch's prefetched, what the memory term left out
                                    (a programmatic dependent's, at most its bytes)           */
    double t_memory;             /* (bytes - prefetched) / copy bandwidth                     */
    double t_little;             /* the busiest SM's bytes / (its bytes in flight / latency)  */
    double t_chain;              /* dependent global loads: rounds x iters x chain x latency  */
    double t_issue;              /* the busiest SM's schedulers: instructions by pipe, or one
                                    warp's dependent issue (warp_cpi)                         */
    double t_tail;               /* after the largest term, not in it: a persistent launch's
                                    fold, tail_trips x (L2 latency + the tail loop's
                                    instructions x tail_cpi)                                  */
    double tail_trips;
    /* how it got there */
    int blocks_per_sm;           /* resident, by registers, shared memory, threads, blocks    */
    int busiest_blocks;          /* blocks of the busiest SM, and its rounds of resident ones */
    int rounds;
    double waves;                /* blocks / (SMs x resident)                                 */
    double inflight_sm;          /* bytes in flight on the busiest SM                         */
    double insts_warp;           /* warp-instructions of one working warp                     */
    double insts_sm;             /* a warp's on average, for the SM's issue (insts_warp where
                                    the warps do the same)                                    */
} pm_result;

/* Predict launch l of the kernel whose SASS is s (NULL: no hot loop, only l->extra) on gpu. */
void pm_predict(const tool_gpu *gpu, const pm_assume *a, const pm_sass *s, const pm_launch *l, pm_result *r);
/* A persistent launch's shape on gpu (l->stream_pieces > 0; else nothing): blocks the SMs times
 * the blocks one holds (l's registers, shared memory, threads), a warp's run ceil(pieces /
 * (blocks x warps a block)), its iterations run x stream_spp, and the instructions outside the
 * loop (l->extra, < 0: the SASS's) once a segment: 1 + (run - 1) / stream_unit on average (a
 * run starting anywhere in a unit crosses that many units' ends). */
void pm_stream_launch(const tool_gpu *gpu, const pm_sass *s, pm_launch *l);
/* A launch's fixed cost: a programmatic dependent's, or a full one. */
double pm_launch_us(const pm_assume *a, const pm_launch *l);

/* The copy bandwidth the model uses for gpu, GB/s: measured, else copy_fraction x peak. */
double pm_copy_gbps(const tool_gpu *gpu, const pm_assume *a);

/* The assumptions as text lines (prefix before each) and as JSON, for --predict. */
void pm_assume_print(FILE *f, const pm_assume *a, const tool_gpu *gpu);

#endif

/* ---- a plan (predict_plan.c) ------------------------------------------------------------ */

struct json_t;
/* What bench knows of the plan: the model, rank 0's shapes, the tables' B and k0, and (from
 * the interpreter) how many experts are active at each (NULL: the expected number under
 * uniform routing, said in a note). */
typedef struct tool_predict_in {
    const mj_moe_config *cfg;
    int32_t i_local, nsub;
    double per_expert, gate_bytes; /* bytes of one packed expert, of the router's gate        */
    const char *arch;              /* the target whose kernels are compiled and read          */
    const tool_gpu *gpu;
    const char *cache_dir;         /* the kernel cache (NULL: the default one)                */
    const char *mode;              /* --mode's text, NULL: the target's policy                */
    const int32_t *bb, *k0s;       /* --bench-batch, --k0                                     */
    int n_bb, n_k0;
    const double *active;          /* [n_k0][n_bb], or NULL                                   */
    const char *active_from;       /* where active came from ("the interpreter", "the GPU")   */
} tool_predict_in;
/* The model of every (B, k0) into root["predict"] and, when txt is not NULL, a table. 0, or 1
 * after the error line (a kernel that does not compile, no nvdisasm). */
int tool_predict_plan(const tool_predict_in *in, struct json_t *root, FILE *txt);
