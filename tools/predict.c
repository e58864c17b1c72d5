/* predict.c — the performance model of `moejit bench --predict` (see predict.h): a kernel's
 * SASS read into its hot loop's counts, and a launch turned into time on a named GPU.
 *
 * The model in one place. A kernel's time is a fixed launch cost plus the largest of:
 *   memory   its DRAM bytes over the copy bandwidth (the floor);
 *   latency  Little's law on the busiest SM (its bytes over the bytes its warps keep in
 *            flight per DRAM latency), or a chain of dependent global loads that each
 *            iteration of a warp waits for in turn (chain x latency an iteration);
 *   issue    the busiest SM's schedulers: each warp's instructions (hot loop x iterations,
 *            plus what runs outside it, but for subroutines a warp does not run in the
 *            common case: a division's slow path, helpers named *_once or *_few), each pipe at its rate (the integer ALU at half a
 *            warp-instruction a cycle before Blackwell, IMAD then on the FMA pipes with
 *            FP32 and packed half), or one warp's own dependent issue
 *            (warp_cpi cycles an instruction) when too few warps share a scheduler;
 *   waves    not a term of its own: a per-SM bound (latency, issue) is called "waves" when
 *            the busiest SM holds clearly more blocks than the average one, or when the
 *            grid leaves most SMs idle: the time is the busiest SM's.
 * What a kernel moves and how many iterations its warps run come from the launch
 * (predict_plan.c); what an iteration costs comes from the SASS. */
#include "predict.h"

#include "moejit_private.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const pm_class_names[PM_NCLASS] = {"mem", "tensor", "fp32", "int", "half", "other"};
const char *const pm_bound_names[4] = {"memory", "issue", "latency", "waves"};

void pm_assume_default(pm_assume *a) {
    /* Calibrated against the H200 run of 2026-12-04 (bench/results/2026-12-04-h200-predict/
     * docs/performance.md says how): a kernel's fixed cost and one warp's issue interval; the
     * rates are the CUDA guide's throughput table per scheduler. */
    a->launch_us = 2.5;
    a->pdl_launch_us = 1.0; /* assumed, not yet measured: the next GPU run calibrates it      */
    a->warp_cpi = 6.0;
    a->copy_fraction = 0.87;
    a->tensor_rate = 0.125; /* an m16n8k16 bf16 MMA every 8 cycles a scheduler (mma.sync)   */
    a->mem_rate = 0.25;     /* 32 lanes of LSU an SM: a warp-instruction a cycle, 4 schedulers */
    a->half_rate = 1.0;     /* packed half: 2 x 16 lanes a scheduler                         */
    a->l2_lat_cycles = 400; /* assumed: an L40's L2 hits measure 222 to 339 cycles by SM
                             * (arXiv 2606.22588); Hopper's and Blackwell's two partitions
                             * add a hop for the far one's lines */
    a->tail_cpi = 2.0;      /* assumed: a fold's loads issue back to back, its adds wait on
                             * each other two at a time */
    a->waves_imbalance = 1.25;
}

double pm_copy_gbps(const tool_gpu *gpu, const pm_assume *a) {
    return gpu->copy_gbps > 0 ? gpu->copy_gbps : a->copy_fraction * gpu->gbps;
}

void pm_assume_print(FILE *f, const pm_assume *a, const tool_gpu *g) {
    fprintf(f, "model assumptions (tools/predict.c, tools/gpus.c):\n");
    fprintf(f, "  %s: %d SMs at %.0f MHz, %.0f GB/s peak, copy %.0f GB/s (%s), DRAM latency %.0f ns (assumed),\n"
               "    integer pipe %.2f warp-instructions a scheduler a cycle%s, %d registers / %d KiB shared memory /\n"
               "    %d warps / %d blocks an SM\n",
            g->name, g->sms, g->clock_mhz, g->gbps, pm_copy_gbps(g, a), g->copy_gbps > 0 ? "measured" : "assumed",
            g->lat_ns, g->int_rate, g->int_rate < 1.0 ? " (the ALU; IMAD on the FMA pipes)" : "", g->regs_sm,
            g->smem_sm / 1024, g->warps_sm, g->blocks_sm);
    fprintf(f, "  launch %.1f us a kernel, %.1f launched as a programmatic dependent (sm_90+: the kernels\n"
               "    after the router GEMM; assumed); one warp alone issues every %.1f cycles; per scheduler a cycle:\n"
               "    tensor %.3f, load/store %.2f, half2 %.2f, fp32 and the rest 1; a dependent global-load chain\n"
               "    of 2 or more costs chain x latency an iteration (a chain of 1 is prefetched by the rings);\n"
               "    oea_route's instructions a warp from its SASS's pieces (token, pick, dispatch) times the\n"
               "    launch's tokens and picks (the dispatch on 8 warps up to 256 experts: the SM's issue counts\n"
               "    the others at its barriers); \"waves\" past %.2fx the average SM's blocks; a persistent\n"
               "    launch's fold after its runs: trips to L2 (%.0f cycles each, assumed) by the bytes its tail\n"
               "    loop has in flight, its instructions at %.1f cycles\n",
            a->launch_us, a->pdl_launch_us, a->warp_cpi, a->tensor_rate, a->mem_rate, a->half_rate,
            a->waves_imbalance, a->l2_lat_cycles, a->tail_cpi);
}

/* ---- SASS --------------------------------------------------------------------------------- */

typedef struct inst {
    char op[48];       /* the opcode with its modifiers: "LDG.E.128"                          */
    char args[192];    /* the operands, up to the ';'                                          */
    int cls;
    int pred, pred_neg;/* the guard predicate P0..P6 (-1: none)                                */
    int target;        /* a branch's target instruction, -1: none or unknown                  */
} inst;

typedef struct label {
    char name[32];
    int at;            /* the instruction that follows it                                     */
    int sub;           /* a subroutine's start ("$name:"): 1, 2 a libdevice slow path, 3 the
                          route kernel's dispatch, 4 its short dispatch, 5 a helper named
                          *_once or *_few, 6 the route kernel's block_scores; 0 a branch
                          label                                                              */
} label;

static int op_is(const char *op, const char *base) {
    size_t n = strlen(base);
    return !strncmp(op, base, n) && (op[n] == '\0' || op[n] == '.');
}

static int classify(const char *op) {
    static const char *const mem[] = {"LDG", "LDGSTS", "LDS", "STS", "STG", "LDSM", "ATOM", "ATOMS", "ATOMG",
                                      "RED", "LDL", "STL", "LD", "ST", NULL};
    static const char *const ten[] = {"HMMA", "OMMA", "QMMA", "IMMA", "MMA", "HGMMA", "IGMMA", "QGMMA", "DMMA",
                                      "UTCHMMA", "UTCQMMA", "UTCOMMA", NULL};
    static const char *const f32[] = {"FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "FCHK", "FSET", "FFMA2",
                                      "FMUL2", "FADD2", NULL};
    static const char *const in[] = {"IMAD", "IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "PRMT", "ISETP",
                                     "LEA", "SEL", "VIADD", "IMNMX", "VIMNMX", "IABS", "POPC", "FLO", "BMSK",
                                     "BREV", "IMUL", "ISCADD", "BFE", "BFI", "LEA.HI", "PLOP3", NULL};
    static const char *const hf[] = {"HMUL2", "HFMA2", "HADD2", "HMNMX2", "HSETP2", "HSET2", NULL};
    static const char *const *const sets[] = {mem, ten, f32, in, hf};
    for (int c = 0; c < 5; c++)
        for (const char *const *p = sets[c]; *p; p++)
            if (op_is(op, *p)) return c;
    return PM_OTHER;
}

/* The function's instructions and labels, from its ".text.NAME:" line to the next section. */
static int parse_function(const char *text, const char *fn, inst **out, int *n_out, label **lab_out, int *nl_out) {
    char want[160];
    snprintf(want, sizeof want, ".text.%s:", fn);
    const char *p = text, *start = NULL;
    while (p && *p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *q = p;
        while (q < p + len && isspace((unsigned char)*q)) q++;
        if ((size_t)(p + len - q) >= strlen(want) && !strncmp(q, want, strlen(want))) {
            start = e ? e + 1 : p + len;
            break;
        }
        p = e ? e + 1 : NULL;
    }
    if (!start) return -1;
    int cap = 256, n = 0, lcap = 64, nl = 0;
    inst *v = malloc(sizeof *v * (size_t)cap);
    label *lab = malloc(sizeof *lab * (size_t)lcap);
    char (*want_target)[32] = malloc(sizeof *want_target * (size_t)cap);
    if (!v || !lab || !want_target) abort();
    for (p = start; p && *p;) {
        const char *e = strchr(p, '\n');
        char line[512];
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len >= sizeof line) len = sizeof line - 1;
        memcpy(line, p, len);
        line[len] = '\0';
        p = e ? e + 1 : NULL;
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        if (!strncmp(s, "//---", 5) || !strncmp(s, ".section", 8)) break;
        if ((s[0] == '.' && s[1] == 'L') || s[0] == '$') { /* a label, or a subroutine's start */
            char *c = strrchr(s, ':');
            if (!c) continue;
            *c = '\0';
            if (nl == lcap && !(lab = realloc(lab, sizeof *lab * (size_t)(lcap *= 2)))) abort();
            snprintf(lab[nl].name, sizeof lab[nl].name, "%.31s", s);
            /* a subroutine's kind by its own name: what follows the label's last '$' (the
             * kernel's name before it could hold any of these words) */
            const char *sn = s[0] == '$' ? strrchr(s, '$') + 1 : s;
            lab[nl].sub = s[0] != '$'                   ? 0
                          : strstr(sn, "slowpath")       ? 2
                          : strstr(sn, "_once") || strstr(sn, "_few") ? 5
                          : strstr(sn, "dispatch_small") ? 4
                          : strstr(sn, "dispatch")       ? 3
                          : strstr(sn, "block_scores")   ? 6
                                                         : 1;
            lab[nl++].at = n;
            continue;
        }
        if (strncmp(s, "/*", 2)) continue;
        char *c = strstr(s, "*/");
        if (!c) continue;
        s = c + 2;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '/') continue;
        inst in;
        memset(&in, 0, sizeof in);
        in.pred = -1, in.target = -1;
        if (*s == '@') { /* the guard */
            s++;
            if (*s == '!') in.pred_neg = 1, s++;
            if (s[0] == 'P' && s[1] == 'T') in.pred = 7;
            else if (s[0] == 'P' && isdigit((unsigned char)s[1])) in.pred = s[1] - '0';
            while (*s && !isspace((unsigned char)*s)) s++;
            while (isspace((unsigned char)*s)) s++;
        }
        if (in.pred == 7 && in.pred_neg) continue; /* @!PT: never runs */
        if (in.pred == 7) in.pred = -1;
        size_t k = 0;
        while (*s && !isspace((unsigned char)*s) && *s != ';' && k + 1 < sizeof in.op) in.op[k++] = *s++;
        in.op[k] = '\0';
        if (!k || op_is(in.op, "NOP")) continue;
        while (isspace((unsigned char)*s)) s++;
        k = 0;
        while (*s && *s != ';' && k + 1 < sizeof in.args) in.args[k++] = *s++;
        in.args[k] = '\0';
        in.cls = classify(in.op);
        if (n == cap) {
            cap *= 2;
            if (!(v = realloc(v, sizeof *v * (size_t)cap)) ||
                !(want_target = realloc(want_target, sizeof *want_target * (size_t)cap)))
                abort();
        }
        want_target[n][0] = '\0';
        if (op_is(in.op, "BRA") && in.pred < 0) { /* BRA.U UP0, `(.L_x_7): a uniform predicate */
            const char *u = in.args[0] == '!' ? in.args + 1 : in.args;
            if (u[0] == 'U' && u[1] == 'P' && isdigit((unsigned char)u[2])) in.pred = 10 + (u[2] - '0'), in.pred_neg = in.args[0] == '!';
        }
        if (op_is(in.op, "BRA")) { /* BRA `(.L_x_17) */
            char *l = strstr(in.args, ".L");
            if (l) {
                size_t m = 0;
                while (l[m] && l[m] != ')' && !isspace((unsigned char)l[m]) && m + 1 < 32) m++;
                memcpy(want_target[n], l, m);
                want_target[n][m] = '\0';
            }
        }
        v[n++] = in;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; want_target[i][0] && j < nl; j++)
            if (!strcmp(lab[j].name, want_target[i])) v[i].target = lab[j].at;
    free(want_target);
    *out = v, *n_out = n, *lab_out = lab, *nl_out = nl;
    return 0;
}

/* The compare that sets the guard of the loop closed by branch b (first..b): the last
 * "ISETP... Pn, PT, Rx, imm, ..." before b writing b's predicate (with uniform, also
 * "UISETP... UPn, UPT, URx, imm, ..." for a BRA.U on UPn). 1 when found, with its register
 * in reg ("R5" of "R5.reuse"; "" when not a register) and its immediate in *bound (-1 when
 * not one); 0 when none. */
static int guard_compare(const inst *v, int first, int b, int uniform, char reg[16], long *bound) {
    reg[0] = '\0', *bound = -1;
    if (v[b].pred < 0 || (v[b].pred >= 10 && !uniform)) return 0;
    const int uni = v[b].pred >= 10, pn = v[b].pred % 10; /* UPn (uniform) or Pn */
    for (int i = b - 1; i >= first; i--) {
        if (strncmp(v[i].op, uni ? "UISETP" : "ISETP", uni ? 6 : 5)) continue;
        const char *a0 = v[i].args + uni;
        if ((uni && v[i].args[0] != 'U') || a0[0] != 'P' || a0[1] - '0' != pn) continue;
        /* the operands: Pd, Pq, Ra, imm, Pc */
        char tmp[192];
        snprintf(tmp, sizeof tmp, "%s", v[i].args);
        int field = 0;
        for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save), field++) {
            while (isspace((unsigned char)*t)) t++;
            if (field == 2 && (t[0] == 'R' || (t[0] == 'U' && t[1] == 'R')) && isdigit((unsigned char)t[t[0] == 'U' ? 2 : 1]))
                snprintf(reg, 16, "%.15s", t);
            if (field == 3 && isdigit((unsigned char)t[0])) *bound = strtol(t, NULL, 0);
        }
        for (char *d = reg; *d; d++) /* "R5.reuse": R5 */
            if (isspace((unsigned char)*d) || *d == '.') *d = '\0';
        return 1;
    }
    return 0;
}

/* The trip count of the loop closed by branch b (first..b): the immediate its guard's
 * predicate was last compared with ("ISETP.GE.U32.AND P1, PT, R37, 0x2, PT": 2) when that is
 * 2..256, else 1 (unknown: counted once). */
static int trip_count(const inst *v, int first, int b) {
    char reg[16];
    long im;
    if (!guard_compare(v, first, b, 0, reg, &im)) return 1;
    return im >= 2 && im <= 256 ? (int)im : 1;
}

/* Registers named in s ("R12", "R10.64": R10 and R11), not UR or SR_ ones: up to 8. */
static int regs_in(const char *s, int *r, int max) {
    int n = 0;
    for (const char *p = s; *p && n < max; p++) {
        if (*p != 'R' || !isdigit((unsigned char)p[1])) continue;
        if (p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) continue;
        char *end;
        long x = strtol(p + 1, &end, 10);
        if (x < 0 || x > 255) continue;
        r[n++] = (int)x;
        if (!strncmp(end, ".64", 3) && n < max && x < 255) r[n++] = (int)x + 1;
        p = end - 1;
    }
    return n;
}

/* Registers an instruction writes: its first operand when that is a register, widened by
 * the opcode (.128: 4, .64 / .WIDE: 2). */
static int dest_width(const char *op) {
    if (strstr(op, ".128")) return 4;
    if (strstr(op, ".64") || strstr(op, ".WIDE")) return 2;
    return 1;
}

/* The longest chain of dependent global loads in v[first..last] (one iteration: the back edge
 * not followed): each register carries the depth of global loads its value waited for, one
 * pass in program order that follows the forward branches. A branch's target takes the
 * deepest of what reaches it (falling through, or from each branch to it); after a branch
 * that is always taken (no guard, not BRA.DIV) nothing falls through, so two exclusive paths
 * (an if and its else) do not chain into each other. */
static int load_chain(const inst *v, int first, int last) {
    const int n = last - first + 1;
    unsigned char depth[256] = {0}, (*in)[256] = calloc((size_t)n, 256), *has = calloc((size_t)n, 1);
    int chain = 0, live = 1;
    if (!in || !has) {
        free(in), free(has);
        return 0;
    }
    for (int i = first; i <= last; i++) {
        if (has[i - first]) { /* a branch's target: what the branches bring, with what falls through */
            for (int r = 0; r < 256; r++)
                if (!live || in[i - first][r] > depth[r]) depth[r] = in[i - first][r];
            live = 1;
        } else if (!live) { /* reached only from outside the span: nothing loaded yet */
            memset(depth, 0, sizeof depth);
            live = 1;
        }
        const inst *ins = &v[i];
        /* A shuffle writes its predicate first, then its register ("SHFL.IDX PT, R5, R4, ..."). */
        const char *args = ins->args;
        if (!strncmp(ins->op, "SHFL", 4) && args[0] == 'P' && strchr(args, ',')) {
            args = strchr(args, ',') + 1;
            while (isspace((unsigned char)*args)) args++;
        }
        const char *comma = strchr(args, ',');
        int first_is_reg = args[0] == 'R' && isdigit((unsigned char)args[1]);
        const int stores = ins->cls == PM_MEM && (op_is(ins->op, "STS") || op_is(ins->op, "STG") ||
                                                  op_is(ins->op, "LDGSTS") || op_is(ins->op, "ST") ||
                                                  op_is(ins->op, "STL") || op_is(ins->op, "RED"));
        int src[16], ns = regs_in(stores || !first_is_reg ? args : comma ? comma + 1 : "", src, 16);
        int d = 0;
        for (int k = 0; k < ns; k++)
            if (depth[src[k]] > d) d = depth[src[k]];
        const int global_load = op_is(ins->op, "LDG") || op_is(ins->op, "LDGSTS");
        if (global_load) {
            d++;
            if (d > chain) chain = d;
        }
        if (!stores && first_is_reg) {
            int r0 = atoi(args + 1), w = dest_width(ins->op);
            for (int k = 0; k < w && r0 + k < 256; k++) depth[r0 + k] = (unsigned char)(d < 255 ? d : 255);
        }
        if (op_is(ins->op, "BRA")) {
            const int t = ins->target;
            if (t > i && t <= last) { /* forward, inside the span: its target takes this state */
                for (int r = 0; r < 256; r++)
                    if (!has[t - first] || depth[r] > in[t - first][r]) in[t - first][r] = depth[r];
                has[t - first] = 1;
            }
            if (ins->pred < 0 && strncmp(ins->op, "BRA.DIV", 7)) live = 0; /* always taken */
        } else if ((op_is(ins->op, "EXIT") || op_is(ins->op, "RET")) && ins->pred < 0) {
            live = 0;
        }
    }
    free(in), free(has);
    return chain;
}

/* Bytes a lane's global load brings: by the opcode's width. */
static int load_bytes(const char *op) {
    if (strstr(op, ".128")) return 16;
    if (strstr(op, ".64")) return 8;
    if (strstr(op, ".U16") || strstr(op, ".S16")) return 2;
    if (strstr(op, ".U8") || strstr(op, ".S8")) return 1;
    return 4;
}

/* Whether instruction i lies in a rare subroutine (a division's slow path, a *_once or *_few helper:
 * labels of kind 2 and 5, each closed by the next subroutine or the function's end). */
static int in_rare(const label *lab, int nl, int n, int i) {
    for (int j = 0; j < nl; j++) {
        if ((lab[j].sub != 2 && lab[j].sub != 5) || i < lab[j].at) continue;
        int end = n;
        for (int q = 0; q < nl; q++)
            if (lab[q].sub && lab[q].at > lab[j].at && lab[q].at < end) end = lab[q].at;
        if (i < end) return 1;
    }
    return 0;
}

int pm_sass_analyze(const char *text, const char *function, pm_sass *s) {
    memset(s, 0, sizeof *s);
    inst *v = NULL;
    label *lab = NULL;
    int n = 0, nl = 0;
    if (!text || parse_function(text, function, &v, &n, &lab, &nl)) return -1;
    s->n_insts = n;
    /* loops: a branch back to an instruction at or before it. The hot one loads global
     * memory and holds the most MMAs (the k-loop of a GEMM), then copies to shared memory
     * (a weight ring), then is the innermost. */
    int best = -1, best_mma = -1, best_kind = 0, best_span = 0;
    for (int b = 0; b < n; b++) {
        if (v[b].target < 0 || v[b].target > b) continue;
        s->n_loops++;
        int kind = 0, mma = 0; /* kind 2: copies global to shared, 1: loads global */
        for (int i = v[b].target; i <= b; i++) {
            if (op_is(v[i].op, "LDGSTS")) kind = 2;
            else if (op_is(v[i].op, "LDG") && kind < 1) kind = 1;
            if (v[i].cls == PM_TENSOR) mma++;
        }
        if (!kind) continue;
        const int span = b - v[b].target;
        if (mma > best_mma || (mma == best_mma && (kind > best_kind || (kind == best_kind && span < best_span))))
            best = b, best_mma = mma, best_kind = kind, best_span = span;
    }
    if (best >= 0) {
        const int first = v[best].target, last = best;
        s->found = 1, s->first = first, s->last = last;
        /* The piece end: spans a guarded forward branch inside the loop skips that hold a
         * global store (the hot loop's other stores go to shared memory). */
        unsigned char *pe = calloc((size_t)(last - first + 1), 1);
        if (!pe) abort();
        for (int b = first; b < last; b++) {
            const int t = v[b].target;
            if (!op_is(v[b].op, "BRA") || v[b].pred < 0 || t <= b + 1 || t > last) continue;
            int st = 0;
            for (int i = b + 1; i < t; i++) st |= op_is(v[i].op, "STG");
            for (int i = b + 1; i < t && st; i++) pe[i - first] = 1;
        }
        for (int i = first; i <= last; i++) {
            double w = 1; /* the trips of the loops nested inside the hot one that hold i */
            for (int b = first; b < last; b++)
                if (v[b].target >= first && v[b].target <= i && i <= b && v[b].target <= b)
                    w *= trip_count(v, v[b].target, b);
            s->iter[v[i].cls] += w;
            s->iter_total += w;
            if (op_is(v[i].op, "IMAD") || op_is(v[i].op, "IMUL")) s->iter_imad += w;
            if (pe[i - first]) {
                s->piece[v[i].cls] += w, s->piece_total += w;
                if (op_is(v[i].op, "IMAD") || op_is(v[i].op, "IMUL")) s->piece_imad += w;
            }
            if (op_is(v[i].op, "LDGSTS")) s->ldgsts++;
            else if (op_is(v[i].op, "LDG")) s->ldg++;
        }
        free(pe);
        s->chain = load_chain(v, first, last);
        if (first > 0) s->pre_chain = load_chain(v, 0, first - 1);
        s->outside = n - (last - first + 1);
    } else {
        s->outside = n;
    }
    /* Subroutines a warp does not run in the common case: a division's slow path (operands
     * its fast path cannot take), a helper named *_once (one block of a launch runs it: the
     * shared expert's gate) or *_few (the launch's first threads: up's prefetch of the shared
     * experts, a line a thread). Counted apart, not in a warp's instructions. */
    for (int j = 0; j < nl; j++) {
        int dup = 0; /* two rare labels at one instruction: one span */
        for (int q = 0; q < j; q++) dup |= (lab[q].sub == 2 || lab[q].sub == 5) && lab[q].at == lab[j].at;
        if ((lab[j].sub != 2 && lab[j].sub != 5) || dup) continue;
        int end = n;
        for (int q = 0; q < nl; q++)
            if (lab[q].sub && lab[q].at > lab[j].at && lab[q].at < end) end = lab[q].at;
        int span = end - lab[j].at;
        if (s->found) { /* the hot loop's instructions are counted there, not here */
            const int lo = lab[j].at > s->first ? lab[j].at : s->first, hi = end - 1 < s->last ? end - 1 : s->last;
            if (hi >= lo) span -= hi - lo + 1;
        }
        s->rare += span;
    }
    s->outside = s->outside > s->rare ? s->outside - s->rare : 0;
    /* The tail loop: innermost, outside the hot loop and the rare subroutines, the most LDGs. */
    for (int b = 0; b < n; b++) {
        const int a0 = v[b].target;
        if (a0 < 0 || a0 > b || (s->found && b >= s->first && a0 <= s->last) || in_rare(lab, nl, n, a0)) continue;
        int inner = 0, ldg = 0, bytes = 0;
        for (int i = a0; i < b && !inner; i++) inner = v[i].target >= a0 && v[i].target <= i;
        for (int i = a0; i <= b && !inner; i++)
            if (op_is(v[i].op, "LDG")) ldg++, bytes += load_bytes(v[i].op);
        if (!inner && ldg > s->tail_ldg)
            s->tail_ldg = ldg, s->tail_bytes = bytes, s->tail_insts = b - a0 + 1, s->tail_first = a0, s->tail_last = b;
    }
    /* The finisher: the outermost span a guarded forward branch after the hot loop skips over
     * the tail loop, less that loop and rare code. */
    if (s->found && s->tail_ldg > 0) {
        int lo = -1, hi = -1;
        for (int b = s->last + 1; b < s->tail_first; b++) {
            const int t = v[b].target;
            if (!op_is(v[b].op, "BRA") || v[b].pred < 0 || t <= s->tail_last) continue;
            if (lo < 0 || t - 1 - (b + 1) > hi - lo) lo = b + 1, hi = t - 1;
        }
        for (int i = lo; lo >= 0 && i <= hi; i++)
            s->finish += (i < s->tail_first || i > s->tail_last) && !in_rare(lab, nl, n, i);
    }
    free(v);
    free(lab);
    return 0;
}

/* The trip count of the loop closed by branch b (first..b) for a loop that may step by more
 * than one: the guard's compare "ISETP... Pn, PT, Rx, imm, ..." and an add to Rx inside the
 * loop ("IADD3 Rx, PT, PT, Rx, step, RZ", "VIADD Rx, Rx, step") give ceil(imm / step): the
 * trips of a thread that starts below step (lane, thread or warp index: the busiest one). An
 * add of a register (a step the launch sets): unknown, once. No such add: trip_count's
 * reading. */
static int strided_trips(const inst *v, int first, int b) {
    char reg[16];
    long bound;
    if (!guard_compare(v, first, b, 1, reg, &bound)) return 1;
    if (bound < 1 || !reg[0]) return trip_count(v, first, b);
    const size_t rl = strlen(reg);
    int reg_step = 0;
    for (int j = first; j < b; j++) {
        const int viadd = op_is(v[j].op, "VIADD"),
                  iadd = op_is(v[j].op, "IADD3") || op_is(v[j].op, "UIADD3");
        if (!viadd && !iadd) continue;
        if (strncmp(v[j].args, reg, rl) || v[j].args[rl] != ',') continue; /* writes Rx */
        /* the operands after the destination: Rx and an immediate step */
        const char *q = v[j].args + rl + 1;
        if (iadd) {
            const char *pp = strstr(q, "PT, PT,"), *up = strstr(q, "UPT, UPT,");
            q = up ? up + 9 : pp ? pp + 7 : q;
        }
        while (isspace((unsigned char)*q)) q++;
        if (strncmp(q, reg, rl) || q[rl] != ',') continue;
        q += rl + 1;
        while (isspace((unsigned char)*q)) q++;
        if (!isdigit((unsigned char)*q) && *q != '-') { /* a step in a register (oea_route's
                                                         * dispatch: its threads): unknown, once */
            reg_step = 1;
            continue;
        }
        const long step = strtol(q, NULL, 0);
        if (step < 1) continue;
        const long trips = (bound + step - 1) / step;
        return trips < 1 ? 1 : trips > 4096 ? 4096 : (int)trips;
    }
    return reg_step ? 1 : trip_count(v, first, b);
}

/* Instructions of v[a..b) but those in the ranges skip[0..ns) (first, last), each counted
 * times the trips of the loops inside a..b that hold it (strided_trips: unknown counts
 * once), but the loop closed at self (the piece's own loop: -1 none). */
static double weighted(const inst *v, int a, int b, const int (*skip)[2], int ns, int self) {
    double sum = 0;
    for (int i = a; i < b; i++) {
        int skipped = 0;
        for (int k = 0; k < ns && !skipped; k++) skipped = i >= skip[k][0] && i <= skip[k][1];
        if (skipped) continue;
        double w = 1;
        for (int j = a; j < b; j++)
            if (j != self && v[j].target >= a && v[j].target <= i && i <= j) w *= strided_trips(v, v[j].target, j);
        sum += w;
    }
    return sum;
}

/* Whether v[i] is a warp-wide reduction step: REDUX, or a butterfly shuffle. */
static int warp_reduce(const inst *in) { return op_is(in->op, "REDUX") || !strncmp(in->op, "SHFL.BFLY", 9); }

/* The span [*at, *end) of the subroutine of kind `sub` (its label's; the next subroutine or
 * the function's end closes it): *at -1 when there is none. */
static void sub_span(const label *lab, int nl, int n, int sub, int *at, int *end) {
    *at = -1, *end = n;
    for (int j = 0; j < nl; j++)
        if (lab[j].sub == sub) *at = lab[j].at;
    for (int j = 0; j < nl && *at >= 0; j++)
        if (lab[j].sub && lab[j].at > *at && lab[j].at < *end) *end = lab[j].at;
}

int pm_sass_route(const char *text, const char *function, pm_route_sass *r) {
    memset(r, 0, sizeof *r);
    inst *v = NULL;
    label *lab = NULL;
    int n = 0, nl = 0;
    if (!text || parse_function(text, function, &v, &n, &lab, &nl)) return -1;
    /* The kernel's own code ends where its first subroutine starts. */
    int main_end = n, disp, disp_end, small, small_end, sc, sc_end;
    for (int j = 0; j < nl; j++)
        if (lab[j].sub && lab[j].at < main_end) main_end = lab[j].at;
    sub_span(lab, nl, n, 3, &disp, &disp_end);
    sub_span(lab, nl, n, 4, &small, &small_end);
    sub_span(lab, nl, n, 6, &sc, &sc_end);
    /* The token loop: the innermost loop of the kernel's code that loads global memory or
     * calls the block's scoring and holds a pick loop (softmax scores have loops of their own
     * that load, with no pick inside); its pick loops: the innermost loops inside it that hold
     * a warp reduction. */
    int tf = -1, tl = -1, picks[8][2], np = 0;
    /* The kernel's body ends at its last unconditional EXIT: past it ptxas places the paths
     * a warp takes only where it reaches a shuffle diverged (BRA.DIV's), whose branches back
     * into the body are not loops, and which the kernel's converged shuffles do not take. */
    int body_end = main_end;
    for (int i = main_end - 1; i >= 0; i--)
        if (op_is(v[i].op, "EXIT") && v[i].pred < 0) {
            body_end = i + 1;
            break;
        }
    for (int b = 0; b < body_end; b++) {
        if (v[b].target < 0 || v[b].target > b || (tf >= 0 && b - v[b].target >= tl - tf)) continue;
        int ldg = 0, lp[8][2], nlp = 0;
        for (int i = v[b].target; i <= b; i++)
            ldg |= op_is(v[i].op, "LDG") || (op_is(v[i].op, "CALL") && strstr(v[i].args, "block_scores"));
        for (int e = v[b].target; ldg && e < b && nlp < 8; e++) {
            if (v[e].target < v[b].target || v[e].target > e) continue;
            int red = 0, inner = 0;
            for (int i = v[e].target; i <= e; i++) {
                red |= warp_reduce(&v[i]);
                if (i < e && v[i].target >= v[e].target && v[i].target <= i) inner = 1;
            }
            if (red && !inner) lp[nlp][0] = v[e].target, lp[nlp][1] = e, nlp++;
        }
        if (!nlp) continue;
        tf = v[b].target, tl = b, np = nlp;
        memcpy(picks, lp, sizeof lp);
    }
    if (tf >= 0) {
        r->found = 1;
        r->pick_loops = np;
        r->pick = weighted(v, picks[0][0], picks[0][1] + 1, NULL, 0, picks[0][1]);
        r->token = weighted(v, tf, tl + 1, picks, np, tl);
        const int tok[1][2] = {{tf, tl}};
        r->outside = weighted(v, 0, body_end, tok, 1, -1);
    }
    if (disp >= 0) {
        r->dispatch = weighted(v, disp, disp_end, NULL, 0, -1);
        for (int i = disp; i < disp_end; i++) r->dispatch_bars += op_is(v[i].op, "BAR");
    }
    if (small >= 0) r->dispatch_small = weighted(v, small, small_end, NULL, 0, -1);
    if (sc >= 0) { /* its loop's trips depend on the round: a trip, and the rest once */
        int lf = -1, ll = -1; /* the pairs' loop: the one that holds the exponential */
        for (int b = sc; b < sc_end; b++) {
            if (v[b].target < sc || v[b].target > b || (lf >= 0 && b - v[b].target <= ll - lf)) continue;
            int ex = 0;
            for (int i = v[b].target; i <= b; i++) ex |= op_is(v[i].op, "MUFU.EX2");
            if (ex) lf = v[b].target, ll = b;
        }
        if (lf < 0) { /* a scoring whose loop is not read would be counted as free */
            r->found = 0;
        } else {
            const int loop[1][2] = {{lf, ll}};
            r->score = weighted(v, lf, ll + 1, NULL, 0, ll);
            r->score_once = weighted(v, sc, sc_end, loop, 1, -1);
        }
    }
    free(v);
    free(lab);
    return 0;
}

/* P(every warp i takes at most lim[i]): the routed counts as a chain of binomials (warp i
 * takes Binomial(left, 1 / (warps left)) of what the warps before it left), a distribution
 * over the experts not yet dealt. */
static double all_within(int n, int w, const int *lim, double *dp, double *nx) {
    for (int r = 0; r <= n; r++) dp[r] = r == n;
    for (int i = 0; i < w; i++) {
        const int q = w - i; /* warps left, this one included */
        for (int r = 0; r <= n; r++) nx[r] = 0;
        for (int r = 0; r <= n; r++) {
            if (dp[r] == 0) continue;
            if (q == 1) { /* the last warp takes what is left */
                if (r <= lim[i]) nx[0] += dp[r];
                continue;
            }
            const double lp = log(1.0 / q), lq = log(1.0 - 1.0 / q);
            for (int c = 0; c <= r && c <= lim[i]; c++)
                nx[r - c] += dp[r] * exp(lgamma(r + 1.0) - lgamma(c + 1.0) - lgamma(r - c + 1.0) + c * lp + (r - c) * lq);
        }
        for (int r = 0; r <= n; r++) dp[r] = nx[r];
    }
    return dp[0];
}

double pm_busiest_share(int n, int w, int s) {
    if (n < 0) n = 0;
    if (s < 0) s = 0;
    if (w <= 1) return (double)n + s;
    double *dp = malloc(sizeof(double) * (size_t)(n + 1) * 2);
    int *lim = malloc(sizeof(int) * (size_t)w);
    if (!dp || !lim) abort();
    /* E[max] = sum over k >= 1 of P(max >= k) = 1 - P(every warp's total <= k - 1) */
    double e = 0;
    for (int k = 1; k <= n + s; k++) {
        for (int i = 0; i < w; i++) lim[i] = k - 1 - (s / w + (i < s % w));
        int none = 0;
        for (int i = 0; i < w; i++) none |= lim[i] < 0;
        const double p = none ? 0.0 : all_within(n, w, lim, dp, dp + n + 1);
        e += 1.0 - p;
        if (1.0 - p < 1e-12) break;
    }
    free(dp);
    free(lim);
    return e;
}

double pm_route_insts(const pm_route_sass *r, int B, int nwarps, int E, int k, int k0) {
    const int oea = k0 < k, keep = oea && B <= nwarps;
    const double tpw = nwarps > 0 ? ceil((double)B / nwarps) : B, scored = oea && !keep ? 2 : 1,
                 picks = oea && !keep ? k0 + k : k;
    const double dispatch = r->dispatch_small > 0 && (long long)B * k <= 32 ? r->dispatch_small : r->dispatch;
    double rounds = 0; /* the scoring rounds' block_scores: the busiest thread's pairs */
    if (nwarps > 0 && r->score > 0)
        for (int b0 = 0; b0 < B; b0 += nwarps) {
            const long long nb = B - b0 < nwarps ? B - b0 : nwarps, threads = 32LL * nwarps;
            rounds += r->score_once + (double)((nb * E + threads - 1) / threads) * r->score;
        }
    return r->outside + dispatch + tpw * (scored * r->token + picks * r->pick) + scored * rounds;
}

double pm_route_insts_avg(const pm_route_sass *r, int B, int nwarps, int dwarps, int E, int k, int k0) {
    const double all = pm_route_insts(r, B, nwarps, E, k, k0);
    if (r->dispatch_small > 0 && (long long)B * k <= 32) return all; /* every warp runs the short one */
    if (nwarps <= 0 || dwarps >= nwarps || dwarps <= 0) return all;
    const double idle = 3.0 * r->dispatch_bars; /* a warp past the dispatch's: its barriers */
    return all - r->dispatch + ((double)dwarps * r->dispatch + (double)(nwarps - dwarps) * idle) / nwarps;
}

/* ---- the model ------------------------------------------------------------------------------ */

static int resident_blocks(const tool_gpu *g, const pm_launch *l) {
    const int wpb = (l->threads + 31) / 32;
    const int regs_warp = ((l->regs > 0 ? l->regs : 32) * 32 + 255) / 256 * 256; /* allocated by 256 */
    int r = g->blocks_sm;
    const int by_regs = g->regs_sm / (regs_warp * wpb), by_warps = g->warps_sm / wpb;
    const int by_smem = l->smem > 0 ? g->smem_sm / (l->smem + 1024) : r; /* 1 KiB reserved a block */
    if (by_regs < r) r = by_regs;
    if (by_warps < r) r = by_warps;
    if (by_smem < r) r = by_smem;
    return r < 1 ? 1 : r;
}

void pm_stream_launch(const tool_gpu *g, const pm_sass *s, pm_launch *l) {
    if (l->stream_pieces <= 0) return;
    const int wpb = (l->threads + 31) / 32, unit = l->stream_unit > 0 ? l->stream_unit : 1;
    l->blocks = (int64_t)g->sms * mj_experts_stream_round(resident_blocks(g, l), wpb); /* the runtime's grid rule */
    const double run = ceil(l->stream_pieces / ((double)l->blocks * wpb));
    l->iters = run * (l->stream_spp > 0 ? l->stream_spp : 1);
    /* the fold's loop is the finishing warp's alone, after its run: pm_predict's tail; the rest
     * of the finisher once a unit (each unit's one finishing warp): the grid's units over its
     * warps, on average */
    const int fold = l->extra < 0 && l->stream_fold_bytes > 0 && s;
    const double outside = l->extra >= 0 ? l->extra
                           : s ? fmax(0.0, (double)s->outside - (fold ? s->tail_insts + s->finish : 0)) : 0;
    const double units = l->stream_pieces / unit, warps = (double)l->blocks * wpb;
    l->extra = outside * (1.0 + (run > 1 ? (run - 1) / unit : 0)) + (fold ? s->finish * units / warps : 0);
}

double pm_launch_us(const pm_assume *a, const pm_launch *l) { return l->pdl ? a->pdl_launch_us : a->launch_us; }

void pm_predict(const tool_gpu *g, const pm_assume *a, const pm_sass *s, const pm_launch *l, pm_result *r) {
    memset(r, 0, sizeof *r);
    const double copy = pm_copy_gbps(g, a);
    const int64_t blocks = l->blocks > 0 ? l->blocks : 1;
    const int wpb = (l->threads + 31) / 32;
    r->floor_us = l->bytes / (copy * 1e3);
    /* what a programmatic dependent brought into L2 while the kernels before it ran is read
     * from there; without PDL a grid starts when the one before has ended: nothing overlaps */
    r->prefetched = l->pdl && l->prefetched > 0 ? fmin(l->prefetched, l->bytes) : 0;
    const double dram = l->bytes - r->prefetched;
    r->t_memory = dram / (copy * 1e3);
    r->blocks_per_sm = resident_blocks(g, l);
    r->busiest_blocks = (int)((blocks + g->sms - 1) / g->sms);
    r->rounds = (r->busiest_blocks + r->blocks_per_sm - 1) / r->blocks_per_sm;
    r->waves = (double)blocks / ((double)g->sms * r->blocks_per_sm);
    const int resident = r->busiest_blocks < r->blocks_per_sm ? r->busiest_blocks : r->blocks_per_sm;
    r->inflight_sm = (double)resident * wpb * l->inflight;
    const double sm_bytes = (double)r->busiest_blocks * dram / (double)blocks;
    if (r->inflight_sm > 0) r->t_little = sm_bytes * g->lat_ns * 1e-3 / r->inflight_sm;
    const int chain = s && s->found && s->chain >= 2 ? s->chain : 0;
    r->t_chain = r->rounds * l->iters * chain * g->lat_ns * 1e-3;
    /* one warp's instructions, and its cycles on each pipe */
    const double extra = l->extra >= 0 ? l->extra : s ? s->outside : 0;
    const double it = s && s->found ? l->iters : 0;
    double n = extra, pipe = 0;
    if (s && s->found) {
        /* an iteration's counts: a persistent launch's piece end once every stream_spp */
        const double skip = l->stream_spp > 1 ? 1.0 - 1.0 / l->stream_spp : 0.0;
        double iter[PM_NCLASS];
        for (int c = 0; c < PM_NCLASS; c++) iter[c] = s->iter[c] - skip * s->piece[c];
        const double iter_imad = s->iter_imad - skip * s->piece_imad;
        n += it * (s->iter_total - skip * s->piece_total);
        const double rate[PM_NCLASS] = {a->mem_rate, a->tensor_rate, 1.0, g->int_rate, a->half_rate, 1.0};
        for (int c = 0; c < PM_NCLASS; c++) {
            double cyc = it * iter[c] / rate[c];
            if (c == PM_INT && g->int_rate < 1.0) cyc = it * (iter[c] - iter_imad) / rate[c];
            if (cyc > pipe) pipe = cyc;
        }
        if (g->int_rate < 1.0) {
            /* A scheduler's ALU (16 lanes) takes the integer instructions but IMAD; its FMA
             * pipes, heavy (FP32, IMAD) and lite (FP32), 16 lanes each, take the rest, and a
             * packed-half instruction both for a cycle (GA10x, GH100, as NVIDIA describes
             * them: docs/performance.md, the model's assumptions). IMAD alone fills the heavy
             * one at the integer rate; with FP32 and half the two share the load. */
            const double imad = it * iter_imad, fp = it * iter[PM_FP32], hf = it * iter[PM_HALF] / a->half_rate;
            double fma = imad / g->int_rate + hf;
            const double both = (imad + fp) / (2.0 * g->int_rate) + hf;
            if (both > fma) fma = both;
            if (fma > pipe) pipe = fma;
        }
    }
    r->insts_warp = n;
    r->insts_sm = l->extra_sm > 0 ? n - extra + l->extra_sm : n; /* the warps' average, where they differ */
    const double w_sched = ceil((double)resident * wpb / 4.0); /* warps a scheduler holds */
    double cyc = w_sched * r->insts_sm;
    if (w_sched * pipe > cyc) cyc = w_sched * pipe;
    if (n * a->warp_cpi > cyc) cyc = n * a->warp_cpi;
    r->t_issue = r->rounds * cyc / g->clock_mhz;
    /* the largest term sets the time */
    double t = r->t_memory;
    r->bound = PM_BOUND_MEMORY;
    if (r->t_little > t) t = r->t_little, r->bound = PM_BOUND_LATENCY;
    if (r->t_chain > t) t = r->t_chain, r->bound = PM_BOUND_LATENCY;
    if (r->t_issue > t) t = r->t_issue, r->bound = PM_BOUND_ISSUE;
    if (r->bound != PM_BOUND_MEMORY) {
        const double avg = (double)blocks / g->sms;
        if (r->busiest_blocks > a->waves_imbalance * avg || 2 * blocks < g->sms) r->bound = PM_BOUND_WAVES;
    }
    /* A persistent launch's fold: after every run has ended (its runs end together), the warp
     * that completes the busiest unit adds the others' sums, tail_bytes a lane a trip to L2. */
    if (l->stream_fold_bytes > 0 && s && s->tail_bytes > 0) {
        r->tail_trips = (l->stream_fold_passes > 1 ? l->stream_fold_passes : 1) * ceil(l->stream_fold_bytes / s->tail_bytes);
        /* then its finisher's epilogue, after the fold */
        r->t_tail = (r->tail_trips * (a->l2_lat_cycles + s->tail_insts * a->tail_cpi) + s->finish * a->tail_cpi) /
                    g->clock_mhz;
    }
    r->predicted_us = pm_launch_us(a, l) + t + r->t_tail;
}
