/* sim.c — the CPU interpreter: CUDA's execution model on host threads and fibers.
 *
 * A kernel for the sim is the same generated source NVRTC compiles, built by the host C
 * compiler against templates/prelude_sim.h (see sim_so.c). This file runs it.
 *
 * The model
 * ---------
 * A launch is a grid of blocks; a block is up to 1024 CUDA threads that can wait for each
 * other (__syncthreads) and share memory; its threads come in warps of 32 that can also
 * exchange registers (__shfl_sync and friends) and vote (__ballot_sync ...).
 *
 *   blocks   are independent, so they are spread over worker threads ($MOEJIT_SIM_THREADS,
 *            default the CPUs we may use): each worker takes the next block number from an
 *            atomic counter and runs the whole block before taking another. The launching
 *            thread is worker 0; a one-block launch creates no thread at all.
 *   threads  of a block all live on their worker as fibers: each has its own stack (64 KiB
 *            by default, a guard page under it) and runs the kernel function from the top.
 *            A fiber runs until it blocks, at a barrier or a warp collective, or returns;
 *            then the worker switches to the next one. Nothing is preempted, so within a
 *            block there are no data races, only the interleavings CUDA allows at barriers.
 *   shared memory  is `static __thread` in the kernel object: every fiber of a block runs
 *            on the one worker, so they all see the same variable, and no other block runs
 *            on that worker meanwhile. The next block on the worker sees what the last one
 *            left there: CUDA's "shared memory starts uninitialized" (dynamic shared memory,
 *            a per-worker buffer of the launch's smem bytes, starts as 0xA5 bytes).
 *
 * The scheduler, per block
 * ------------------------
 *   repeat:
 *     for each warp: run its runnable lanes, then release every warp collective whose
 *       lanes have all arrived (all lanes named in the mask, at the same kind of
 *       collective with the same mask; the call site may differ) and every lane at
 *       __activemask() (it gets the mask of the lanes waiting there); until the warp has
 *       nothing left to run or release;
 *     all threads returned: done;
 *     all live threads at one __syncthreads (same file:line), none returned: release them;
 *     otherwise nothing can ever move again: report why and stop the launch.
 * A mask that names an exited lane, a lane the block does not have, or not the caller's
 * own lane is reported as soon as it is seen. Reports name the kernel, the block and the
 * thread: "fixture_x (sim), block (3,0,0), thread (0,0,0): waits at __syncthreads()
 * (tests/fixtures/x.cu:12), but thread (1,0,0) has exited without reaching it ...". Errors
 * are MJ_ERR_KERNEL; of several failing blocks the lowest-numbered one is reported. After a
 * failure no new block starts; the fibers of the failed block are simply dropped (they own
 * nothing but their stacks, which go with the launch).
 *
 * Warp collectives compute what the PTX instruction does (shfl.sync's segment arithmetic,
 * with width w: up/down/xor/idx stay inside w-lane segments; an out-of-segment source
 * returns the caller's own value). Reading a lane outside the mask, or a width that is not
 * a power of two in 1..32, is reported: CUDA leaves both undefined.
 *
 * Switching fibers
 * ----------------
 * On x86-64 a 20-line assembly switch (push the callee-saved registers, swap stack
 * pointers, pop, return) does it in a few nanoseconds; elsewhere, under CET shadow stacks,
 * or with MOEJIT_SIM_UCONTEXT=1 it is ucontext's swapcontext (a system call each: slower,
 * same results). The x86-64 switch keeps MXCSR and the x87 control word as they are:
 * kernels do not change rounding modes. Under AddressSanitizer every switch is announced
 * with __sanitizer_start/finish_switch_fiber so ASan knows which stack is live, and fiber
 * stacks default to 256 KiB (ASan frames are bigger).
 *
 * What the sim does not model: warp divergence and independent thread scheduling beyond
 * the above (a spin-wait on memory another thread of the block writes never ends), memory
 * spaces (every pointer is a host pointer), performance.
 */
#include "sim/sim.h"
#include "ref/ref.h"

#define MJ_SIM_ABI_ONLY
#include "prelude_sim.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if MJ_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MJ_NO_ASAN __attribute__((no_sanitize_address))
#else
#define MJ_NO_ASAN
#endif

#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2))
#define MJ_SIM_X86_SWITCH 1
#else
#define MJ_SIM_X86_SWITCH 0
#endif

/* ---- the x86-64 context switch --------------------------------------------------------- */
#if MJ_SIM_X86_SWITCH
/* void mj_sim_ctx_switch(void **save_sp, void *new_sp): save the callee-saved registers on
 * this stack and its stack pointer in *save_sp, then load new_sp, pop that stack's
 * registers and return into it. A new fiber's stack is prepared so that the return lands
 * in mj_sim_ctx_start, which calls r12(rbx) = fiber_main(fiber). */
__asm__(".text\n"
        ".globl mj_sim_ctx_switch\n"
        ".hidden mj_sim_ctx_switch\n"
        ".type mj_sim_ctx_switch,@function\n"
        ".p2align 4\n"
        "mj_sim_ctx_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size mj_sim_ctx_switch,.-mj_sim_ctx_switch\n"
        ".globl mj_sim_ctx_start\n"
        ".hidden mj_sim_ctx_start\n"
        ".type mj_sim_ctx_start,@function\n"
        "mj_sim_ctx_start:\n"
        "    movq %rbx, %rdi\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size mj_sim_ctx_start,.-mj_sim_ctx_start\n");
__attribute__((visibility("hidden"))) void mj_sim_ctx_switch(void **save_sp, void *new_sp);
__attribute__((visibility("hidden"))) void mj_sim_ctx_start(void);
#endif

/* ---- state ---------------------------------------------------------------------------- */

enum { ST_RUN, ST_BARRIER, ST_WARP, ST_DONE, ST_TRAP };
/* cp.async copies one CUDA thread may have pending (queued, not yet waited for). */
#define MJ_SIM_CP_MAX 32
#define MJ_SIM_STR_(x) #x
#define MJ_SIM_STR(x) MJ_SIM_STR_(x)

typedef struct worker worker;

typedef struct fiber {
    mj_sim_thread pub;          /* what the kernel reads: indices, lane, dynamic smem     */
    worker *w;
    int state;
    unsigned tid;               /* linear index in the block                              */
    const char *file;           /* where it waits (or trapped)                             */
    int line;
    int op, arg, width;         /* the warp collective it waits at                         */
    unsigned mask;
    uint64_t value, result;
    void *sp;                   /* x86-64 switch: the saved stack pointer                  */
    ucontext_t *uc;             /* ucontext switch                                          */
    char *stack;                /* lowest address of the stack                              */
    void *asan_fake;
    /* cp.async copies not yet performed, in issue order; group: the commit count at issue */
    struct { void *dst; const void *src; int n; unsigned group; } cp[MJ_SIM_CP_MAX];
    int cp_n;
    unsigned cp_groups;          /* groups committed so far                                 */
    const char *trap_why;        /* what a trap means, when not the kernel's __trap()       */
} fiber;

typedef struct launch {
    const char *kernel;
    mj_sim_entry entry;
    void **args;
    uint32_t grid[3], block[3], smem;
    unsigned n_threads;
    uint64_t n_blocks;
    size_t stack_size;
    int use_uc;
    atomic_uint_fast64_t next;  /* the next block to start                                  */
    atomic_int abort;
    pthread_mutex_t mu;         /* guards the error below                                   */
    mj_status st;
    uint64_t err_block;
    char err[3072];
} launch;

/* Fiber stacks: one mapping of `cap` slots, each a guard page then the stack. Arenas are
 * kept in a small process-wide pool between launches (mapping, guarding and first-touching
 * hundreds of stacks costs more than a small launch). */
typedef struct arena {
    struct arena *next;
    char *base;
    size_t len, slot, stack_size;
    unsigned cap;
} arena;

struct worker {
    launch *L;
    fiber *fibers;
    ucontext_t *ucs;
    arena *stacks;
    int dirty;                  /* a block was dropped mid-kernel                            */
    void *dyn_smem;
    unsigned n_done;
    int trapped;
    uint64_t block;
    void *sched_sp;             /* the scheduler's own context                               */
    ucontext_t sched_uc;
    const void *sched_bottom;
    size_t sched_size;
    void *sched_fake;
    pthread_t th;
    int started;
    unsigned long long stream_bytes; /* mj_ld_stream and cp.async bytes of this worker's blocks */
    unsigned long long prefetch[3];  /* mj_prefetch_l2: calls, the sums of their lines' indices
                                      * and of their squares                                     */
};

/* The fiber running on this thread (NULL in the scheduler). */
static _Thread_local fiber *tls_cur;

static const char *const k_op_names[MJ_SIM_OP_COUNT] = {
    [MJ_SIM_OP_SYNCWARP] = "__syncwarp",       [MJ_SIM_OP_SHFL_IDX] = "__shfl_sync",
    [MJ_SIM_OP_SHFL_UP] = "__shfl_up_sync",    [MJ_SIM_OP_SHFL_DOWN] = "__shfl_down_sync",
    [MJ_SIM_OP_SHFL_XOR] = "__shfl_xor_sync",  [MJ_SIM_OP_BALLOT] = "__ballot_sync",
    [MJ_SIM_OP_ANY] = "__any_sync",            [MJ_SIM_OP_ALL] = "__all_sync",
    [MJ_SIM_OP_ACTIVEMASK] = "__activemask",  [MJ_SIM_OP_MMA] = "mma.sync",
    [MJ_SIM_OP_REDUX_UMAX] = "__reduce_max_sync", [MJ_SIM_OP_REDUX_UMIN] = "__reduce_min_sync",
};

static const char *op_name(int op) {
    return op >= 0 && op < MJ_SIM_OP_COUNT ? k_op_names[op] : "a warp collective";
}

/* ---- switching ------------------------------------------------------------------------- */

MJ_NO_ASAN static void switch_to_fiber(worker *w, fiber *f) {
    tls_cur = f;
#if MJ_SIM_ASAN
    __sanitizer_start_switch_fiber(&w->sched_fake, f->stack, w->L->stack_size);
#endif
    if (w->L->use_uc) swapcontext(&w->sched_uc, f->uc);
#if MJ_SIM_X86_SWITCH
    else mj_sim_ctx_switch(&w->sched_sp, f->sp);
#endif
#if MJ_SIM_ASAN
    __sanitizer_finish_switch_fiber(w->sched_fake, NULL, NULL);
#endif
    tls_cur = NULL;
}

/* From a fiber back to its worker's scheduler; `final`: the fiber will not be resumed. */
MJ_NO_ASAN static void switch_to_scheduler(fiber *f, int final) {
    worker *w = f->w;
#if MJ_SIM_ASAN
    __sanitizer_start_switch_fiber(final ? NULL : &f->asan_fake, w->sched_bottom, w->sched_size);
#else
    (void)final;
#endif
    if (w->L->use_uc) swapcontext(f->uc, &w->sched_uc);
#if MJ_SIM_X86_SWITCH
    else mj_sim_ctx_switch(&f->sp, w->sched_sp);
#endif
#if MJ_SIM_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, NULL, NULL);
#endif
}

/* A fiber's whole life: the kernel, then one last switch away. */
MJ_NO_ASAN static void fiber_main(fiber *f) {
    worker *w = f->w;
#if MJ_SIM_ASAN
    __sanitizer_finish_switch_fiber(NULL, &w->sched_bottom, &w->sched_size);
#endif
    f->cp_n = 0, f->cp_groups = 0, f->trap_why = NULL; /* a new CUDA thread: nothing pending */
    w->L->entry(w->L->args);
    f->state = ST_DONE;
    w->n_done++;
    switch_to_scheduler(f, 1);
    abort(); /* never resumed */
}

static void fiber_main_uc(void) { fiber_main(tls_cur); }

static void fiber_start(worker *w, fiber *f) {
    size_t size = w->L->stack_size;
    if (w->L->use_uc) {
        getcontext(f->uc);
        f->uc->uc_stack.ss_sp = f->stack;
        f->uc->uc_stack.ss_size = size;
        f->uc->uc_link = NULL;
        makecontext(f->uc, fiber_main_uc, 0);
        return;
    }
#if MJ_SIM_X86_SWITCH
    /* The frame mj_sim_ctx_switch pops: r15 r14 r13 r12 rbx rbp, then the return address;
     * after it rsp is 16-byte aligned, as a call instruction wants it. */
    uintptr_t top = ((uintptr_t)f->stack + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 72);
    for (int i = 0; i < 9; i++) sp[i] = NULL;
    sp[3] = (void *)fiber_main;
    sp[4] = f;
    sp[6] = (void *)mj_sim_ctx_start;
    f->sp = sp;
#endif
}

/* ---- what the kernel object calls --------------------------------------------------------- */

static fiber *current(void) {
    fiber *f = tls_cur;
    if (!f) {
        fputs("moejit sim: a kernel function was called outside a sim launch\n", stderr);
        abort();
    }
    return f;
}

static const mj_sim_thread *api_self(void) { return &current()->pub; }

static void api_syncthreads(const char *file, int line) {
    fiber *f = current();
    f->state = ST_BARRIER;
    f->file = file;
    f->line = line;
    switch_to_scheduler(f, 0);
}

static unsigned long long api_warp(int op, unsigned mask, unsigned long long value, int arg,
                                   int width, const char *file, int line) {
    fiber *f = current();
    f->state = ST_WARP;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;
    switch_to_scheduler(f, 0);
    return f->result;
}

static void api_trap(const char *file, int line) {
    fiber *f = current();
    f->state = ST_TRAP;
    f->file = file;
    f->line = line;
    f->w->trapped = 1;
    switch_to_scheduler(f, 1);
    abort(); /* never resumed */
}

/* cp.async: on a GPU the bytes land at some time between the copy and the wait that covers
 * its group. The sim takes both ends: from the copy until that wait the destination reads
 * as poison (0xFF bytes: NaN scales, -6 codes), at the wait the data lands. So a kernel
 * that reads before waiting, or refills a buffer a read still needs, reads poison and
 * fails its test. */
static void api_cp_async(int op, void *dst, const void *src, int n, const char *file, int line) {
    fiber *f = current();
    if (op == MJ_SIM_CP_COPY || op == MJ_SIM_CP_COPY_INDEX) {
        if (f->cp_n == MJ_SIM_CP_MAX) {
            f->trap_why = "queued more than " MJ_SIM_STR(MJ_SIM_CP_MAX) " cp.async copies without a wait";
            api_trap(file, line);
        }
        memset(dst, 0xFF, (size_t)n);
        f->cp[f->cp_n].dst = dst, f->cp[f->cp_n].src = src, f->cp[f->cp_n].n = n;
        f->cp[f->cp_n++].group = f->cp_groups;
        if (op == MJ_SIM_CP_COPY) f->w->stream_bytes += (unsigned long long)n; /* weight bytes alone */
    } else if (op == MJ_SIM_CP_COMMIT) {
        f->cp_groups++;
    } else { /* wait: groups older than the newest n complete; uncommitted copies stay */
        const unsigned keep = n < 0 ? 0u : (unsigned)n;
        int k = 0;
        for (int i = 0; i < f->cp_n; i++) {
            if (f->cp[i].group + keep < f->cp_groups) memcpy(f->cp[i].dst, f->cp[i].src, (size_t)f->cp[i].n);
            else f->cp[k++] = f->cp[i];
        }
        f->cp_n = k;
        /* A copy still pending may have landed already: its bytes stay poison even where an
         * older copy to them just landed (a slot refilled too early reads poison). */
        for (int i = 0; i < k; i++) memset(f->cp[i].dst, 0xFF, (size_t)f->cp[i].n);
    }
}

static const struct mj_sim_api k_api = {
    .abi_version = MJ_SIM_ABI_VERSION,
    .self = api_self,
    .syncthreads = api_syncthreads,
    .warp = api_warp,
    .trap = api_trap,
    .cp_async = api_cp_async,
};

const void *mj_sim_api_table(void) { return &k_api; }

/* ---- errors ---------------------------------------------------------------------------- */

static void record_error(launch *L, uint64_t block, mj_status st, const char *msg) {
    pthread_mutex_lock(&L->mu);
    if (L->st == MJ_OK || block < L->err_block) {
        L->st = st;
        L->err_block = block;
        snprintf(L->err, sizeof L->err, "%s", msg);
    }
    pthread_mutex_unlock(&L->mu);
    atomic_store(&L->abort, 1);
}

static const char *thr(const fiber *f, char *buf, size_t len) {
    snprintf(buf, len, "(%u,%u,%u)", f->pub.thread_idx.x, f->pub.thread_idx.y, f->pub.thread_idx.z);
    return buf;
}

/* Report what is wrong with fiber f's block; returns -1 (the block failed). */
MJ_PRINTF(3, 4) static int fail(worker *w, const fiber *f, const char *fmt, ...) {
    char what[2048], msg[3072], t[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "%s (sim), block (%u,%u,%u), thread %s: %s", w->L->kernel,
             f->pub.block_idx.x, f->pub.block_idx.y, f->pub.block_idx.z, thr(f, t, sizeof t), what);
    record_error(w->L, w->block, MJ_ERR_KERNEL, msg);
    return -1;
}

/* ---- warp collectives ------------------------------------------------------------------ */

/* ---- the MMAs ---------------------------------------------------------------------------
 * What mma.sync computes, from the fragments each lane passed (PTX ISA fragment layouts;
 * g = lane >> 2, p = lane & 3):
 *
 *   m16n8k16 bf16:  a0 = A[g][2p, 2p+1]     a1 = A[g+8][2p, 2p+1]
 *                   a2 = A[g][2p+8, 2p+9]   a3 = A[g+8][2p+8, 2p+9]   (low half first)
 *                   b0 = B[2p, 2p+1][g]     b1 = B[2p+8, 2p+9][g]
 *   m16n8k64 e2m1:  a0 = A[g][8p+j]  a1 = A[g+8][8p+j]  a2 = A[g][32+8p+j]  a3 = A[g+8][32+8p+j]
 *                   b0 = B[8p+j][g]  b1 = B[32+8p+j][g]           (nibble j = k offset j)
 *                   scales: byte q of lane (g, 0)'s sfa is A row g's for k in [16q, 16q+16),
 *                   lane (g, 1)'s is row g+8's; byte q of lane (g, 0)'s sfb is B column g's
 *   both:           d0 = D[g][2p]  d1 = D[g][2p+1]  d2 = D[g+8][2p]  d3 = D[g+8][2p+1]
 *
 * Products are exact and summed in double, then C is added and the sum rounded once to
 * float: the most accurate answer, which a GPU's tensor cores approach within a few ulps. */
static float bf16_lo(unsigned w) {
    union { unsigned u; float f; } v = {w << 16};
    return v.f;
}
static float bf16_hi(unsigned w) {
    union { unsigned u; float f; } v = {w & 0xFFFF0000u};
    return v.f;
}

static const float k_e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

static void mma_compute(int kind, mj_sim_mma *const *f) {
    /* Operands as floats (every product of them is exact in double), A by rows, B by
     * columns, so the dot products walk memory in order. */
    float A[16][64], Bt[8][64];
    const int K = kind == MJ_SIM_MMA_BF16_M16N8K16 ? 16 : 64;
    if (K == 16) {
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, p = l & 3;
            const mj_sim_mma *m = f[l];
            for (int h = 0; h < 2; h++) {
                int k0 = 2 * p + 8 * h;
                A[g][k0] = bf16_lo(m->a[2 * h]), A[g][k0 + 1] = bf16_hi(m->a[2 * h]);
                A[g + 8][k0] = bf16_lo(m->a[2 * h + 1]), A[g + 8][k0 + 1] = bf16_hi(m->a[2 * h + 1]);
                Bt[g][k0] = bf16_lo(m->b[h]), Bt[g][k0 + 1] = bf16_hi(m->b[h]);
            }
        }
    } else {
        /* Each element times its block's scale (of its row / column and k / 16): the scales
         * come from lanes (g, 0) (rows g, columns g) and (g, 1) (rows g + 8). */
        float sa[16][4], sb[8][4];
        for (int g = 0; g < 8; g++)
            for (int q = 0; q < 4; q++) {
                sa[g][q] = mj_e4m3_decode((uint8_t)(f[g * 4 + 0]->sfa >> (8 * q)));
                sa[g + 8][q] = mj_e4m3_decode((uint8_t)(f[g * 4 + 1]->sfa >> (8 * q)));
                sb[g][q] = mj_e4m3_decode((uint8_t)(f[g * 4 + 0]->sfb >> (8 * q)));
            }
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, p = l & 3;
            const mj_sim_mma *m = f[l];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 8; j++) {
                    int k = 8 * p + j + 32 * h, q = k / 16;
                    /* e2m1 * e4m3: at most 6 significant bits, exact in float */
                    A[g][k] = k_e2m1[(m->a[2 * h] >> (4 * j)) & 15] * sa[g][q];
                    A[g + 8][k] = k_e2m1[(m->a[2 * h + 1] >> (4 * j)) & 15] * sa[g + 8][q];
                    Bt[g][k] = k_e2m1[(m->b[h] >> (4 * j)) & 15] * sb[g][q];
                }
        }
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, p = l & 3;
        mj_sim_mma *m = f[l];
        for (int i = 0; i < 4; i++) {
            const float *a = A[g + 8 * (i >> 1)], *b = Bt[2 * p + (i & 1)];
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += (double)a[k] * (double)b[k];
            m->d[i] = (float)(acc + (double)m->c[i]);
        }
    }
}

/* Lanes m of a warp all wait at f0's collective with f0's mask: compute every result. */
static int collective(worker *w, fiber *lanes, const fiber *f0, unsigned m) {
    int op = f0->op;
    if (op == MJ_SIM_OP_MMA) {
        if (m != 0xFFFFFFFFu)
            return fail(w, f0, "mma.sync (%s:%d) reached by lanes 0x%08x: every lane of the warp must "
                        "execute it", f0->file, f0->line, m);
        mj_sim_mma *frags[32];
        for (unsigned j = 0; j < 32; j++) {
            if (lanes[j].arg != f0->arg)
                return fail(w, &lanes[j], "mma.sync (%s:%d) of kind %d while lane 0 runs kind %d (%s:%d)",
                            lanes[j].file, lanes[j].line, lanes[j].arg, f0->arg, f0->file, f0->line);
            frags[j] = (mj_sim_mma *)(size_t)lanes[j].value;
        }
        if (f0->arg != MJ_SIM_MMA_BF16_M16N8K16 && f0->arg != MJ_SIM_MMA_E2M1_M16N8K64)
            return fail(w, f0, "unknown mma kind %d (%s:%d)", f0->arg, f0->file, f0->line);
        mma_compute(f0->arg, frags);
        return 0;
    }
    if (op == MJ_SIM_OP_SYNCWARP || op == MJ_SIM_OP_BALLOT || op == MJ_SIM_OP_ANY || op == MJ_SIM_OP_ALL) {
        unsigned bits = 0;
        for (unsigned j = 0; j < 32; j++)
            if ((m >> j & 1) && lanes[j].value) bits |= 1u << j;
        uint64_t r = op == MJ_SIM_OP_BALLOT ? bits : op == MJ_SIM_OP_ANY ? bits != 0
                                                   : op == MJ_SIM_OP_ALL ? bits == m : 0;
        for (unsigned j = 0; j < 32; j++)
            if (m >> j & 1) lanes[j].result = r;
        return 0;
    }
    if (op == MJ_SIM_OP_REDUX_UMAX || op == MJ_SIM_OP_REDUX_UMIN) { /* over the mask's lanes */
        unsigned r = op == MJ_SIM_OP_REDUX_UMAX ? 0u : 0xFFFFFFFFu;
        for (unsigned j = 0; j < 32; j++) {
            if (!(m >> j & 1)) continue;
            const unsigned v = (unsigned)lanes[j].value;
            r = op == MJ_SIM_OP_REDUX_UMAX ? (v > r ? v : r) : (v < r ? v : r);
        }
        for (unsigned j = 0; j < 32; j++)
            if (m >> j & 1) lanes[j].result = r;
        return 0;
    }
    if (op < MJ_SIM_OP_SHFL_IDX || op > MJ_SIM_OP_SHFL_XOR)
        return fail(w, f0, "unknown warp operation %d (%s:%d)", op, f0->file, f0->line);
    for (unsigned j = 0; j < 32; j++) {
        if (!(m >> j & 1)) continue;
        fiber *g = &lanes[j];
        int width = g->width;
        if (width < 1 || width > 32 || (width & (width - 1)))
            return fail(w, g, "%s (%s:%d) with width %d: the width must be a power of two in 1..32",
                        op_name(op), g->file, g->line, width);
        /* shfl.sync: segmask = 32 - width; the segment is [lane & segmask, .. | width-1]. */
        int lane = (int)j, b = g->arg & 31, segmask = 32 - width;
        int lo = lane & segmask, hi = lo | (31 & ~segmask), src, ok;
        switch (op) {
        case MJ_SIM_OP_SHFL_UP: src = lane - b; ok = src >= lo; break;
        case MJ_SIM_OP_SHFL_DOWN: src = lane + b; ok = src <= hi; break;
        case MJ_SIM_OP_SHFL_XOR: src = lane ^ b; ok = src <= hi; break;
        default: src = lo | (b & ~segmask); ok = src <= hi; break;
        }
        if (!ok) src = lane;
        if (!(m >> src & 1)) {
            char t[48];
            return fail(w, g, "%s (%s:%d) with mask 0x%08x reads lane %d (thread %s), which is not "
                        "in the mask",
                        op_name(op), g->file, g->line, m, src,
                        src < 32 && lanes[src].w ? thr(&lanes[src], t, sizeof t) : "(none)");
        }
        g->result = lanes[src].value;
    }
    return 0;
}

/* Release the collectives of one warp whose lanes have all arrived. 1: something was
 * released, 0: nothing, -1: an error was reported. */
static int resolve_warp(worker *w, fiber *lanes, unsigned nl, unsigned wi) {
    unsigned exist = nl >= 32 ? 0xFFFFFFFFu : (1u << nl) - 1u, waiting = 0, done = 0;
    for (unsigned l = 0; l < nl; l++) {
        if (lanes[l].state == ST_WARP) waiting |= 1u << l;
        else if (lanes[l].state == ST_DONE) done |= 1u << l;
    }
    if (!waiting) return 0;
    unsigned handled = 0;
    int released = 0;
    /* __activemask: called when no lane of the warp can run; the lanes waiting there get
     * the mask of themselves. */
    unsigned act = 0;
    for (unsigned l = 0; l < nl; l++)
        if ((waiting >> l & 1) && lanes[l].op == MJ_SIM_OP_ACTIVEMASK) act |= 1u << l;
    for (unsigned l = 0; l < nl; l++)
        if (act >> l & 1) lanes[l].result = act, lanes[l].state = ST_RUN;
    handled |= act;
    released = act != 0;
    for (unsigned l = 0; l < nl; l++) {
        if (!(waiting >> l & 1) || (handled >> l & 1)) continue;
        fiber *f = &lanes[l];
        unsigned m = f->mask;
        char t[48];
        if (!(m >> l & 1))
            return fail(w, f, "%s (%s:%d) with mask 0x%08x, which does not name the caller's own "
                        "lane %u", op_name(f->op), f->file, f->line, m, l);
        if (m & ~exist) {
            const mj_sim_dim3 *bd = &f->pub.block_dim;
            return fail(w, f, "%s (%s:%d) with mask 0x%08x names lane %d, which does not exist: "
                        "warp %u of this block has %u threads (blockDim (%u,%u,%u))",
                        op_name(f->op), f->file, f->line, m, __builtin_ctz(m & ~exist), wi, nl,
                        bd->x, bd->y, bd->z);
        }
        if (m & done) {
            int j = __builtin_ctz(m & done);
            return fail(w, f, "%s (%s:%d) with mask 0x%08x names lane %d, thread %s, which has "
                        "exited: every lane of the mask must reach the collective",
                        op_name(f->op), f->file, f->line, m, j, thr(&lanes[j], t, sizeof t));
        }
        if ((m & waiting) != m) continue;
        int same = 1;
        for (unsigned j = 0; j < 32 && same; j++)
            if ((m >> j & 1) && (lanes[j].op != f->op || lanes[j].mask != m)) same = 0;
        if (!same) continue;
        if (collective(w, lanes, f, m) < 0) return -1;
        for (unsigned j = 0; j < 32; j++)
            if (m >> j & 1) lanes[j].state = ST_RUN;
        handled |= m;
        released = 1;
    }
    return released;
}

/* Nothing can move and some lane waits at a warp collective: say which lane it waits for. */
static int diagnose_warp(worker *w) {
    unsigned n = w->L->n_threads;
    for (unsigned i = 0; i < n; i++) {
        fiber *f = &w->fibers[i];
        if (f->state != ST_WARP) continue;
        fiber *lanes = w->fibers + (i / 32) * 32;
        char t[48];
        for (unsigned j = 0; j < 32; j++) {
            if (!(f->mask >> j & 1)) continue;
            const fiber *g = &lanes[j];
            const char *what = op_name(f->op);
            if (g->state == ST_BARRIER)
                return fail(w, f, "waits at %s (%s:%d) with mask 0x%08x, but lane %u, thread %s, "
                            "waits at __syncthreads() (%s:%d): every lane of the mask must reach "
                            "the collective", what, f->file, f->line, f->mask, j,
                            thr(g, t, sizeof t), g->file, g->line);
            if (g->state == ST_WARP && g->op != f->op)
                return fail(w, f, "waits at %s (%s:%d) with mask 0x%08x, but lane %u, thread %s, "
                            "waits at %s (%s:%d): every lane of the mask must reach the same kind "
                            "of collective", what, f->file, f->line, f->mask, j,
                            thr(g, t, sizeof t), op_name(g->op), g->file, g->line);
            if (g->state == ST_WARP && g->mask != f->mask)
                return fail(w, f, "waits at %s (%s:%d) with mask 0x%08x, but lane %u, thread %s, "
                            "is there with mask 0x%08x (%s:%d): the lanes of a collective must "
                            "pass the same mask", what, f->file, f->line, f->mask, j,
                            thr(g, t, sizeof t), g->mask, g->file, g->line);
        }
    }
    return fail(w, &w->fibers[0], "the block cannot make progress (no thread can run)");
}

static int same_site(const fiber *a, const fiber *b) {
    return a->line == b->line && (a->file == b->file || !strcmp(a->file, b->file));
}

/* Every warp is stuck: release the block barrier, or report why it cannot be released.
 * 1: released, -1: an error was reported. */
static int resolve_barrier(worker *w) {
    unsigned n = w->L->n_threads;
    fiber *bar = NULL, *done = NULL, *warp = NULL;
    for (unsigned i = 0; i < n; i++) {
        fiber *f = &w->fibers[i];
        if (f->state == ST_BARRIER && !bar) bar = f;
        else if (f->state == ST_DONE && !done) done = f;
        else if (f->state == ST_WARP && !warp) warp = f;
    }
    if (warp) return diagnose_warp(w);
    if (!bar) return fail(w, &w->fibers[0], "the block cannot make progress (no thread can run)");
    char t[48];
    if (done)
        return fail(w, bar, "waits at __syncthreads() (%s:%d), but thread %s has exited without "
                    "reaching it: every thread of the block must reach the same __syncthreads()",
                    bar->file, bar->line, thr(done, t, sizeof t));
    for (unsigned i = 0; i < n; i++)
        if (!same_site(&w->fibers[i], bar))
            return fail(w, bar, "waits at __syncthreads() (%s:%d) while thread %s waits at another "
                        "__syncthreads() (%s:%d): every thread of the block must reach the same "
                        "one (divergent barriers)", bar->file, bar->line,
                        thr(&w->fibers[i], t, sizeof t), w->fibers[i].file, w->fibers[i].line);
    for (unsigned i = 0; i < n; i++) w->fibers[i].state = ST_RUN;
    return 1;
}

/* ---- one block ------------------------------------------------------------------------- */

static int run_block(worker *w, uint64_t b) {
    launch *L = w->L;
    unsigned n = L->n_threads;
    uint64_t gx = L->grid[0], gy = L->grid[1];
    mj_sim_dim3 bi = {(unsigned)(b % gx), (unsigned)((b / gx) % gy), (unsigned)(b / (gx * gy))};
    w->block = b;
    w->n_done = 0;
    w->trapped = 0;
    for (unsigned i = 0; i < n; i++) {
        fiber *f = &w->fibers[i];
        f->pub.block_idx = bi;
        f->state = ST_RUN;
        fiber_start(w, f);
    }
    unsigned n_warps = (n + 31) / 32;
    for (;;) {
        for (unsigned wi = 0; wi < n_warps; wi++) {
            fiber *lanes = w->fibers + wi * 32;
            unsigned nl = n - wi * 32 < 32 ? n - wi * 32 : 32;
            for (;;) {
                int ran = 0;
                for (unsigned l = 0; l < nl; l++) {
                    if (lanes[l].state != ST_RUN) continue;
                    switch_to_fiber(w, &lanes[l]);
                    ran = 1;
                    if (w->trapped)
                        return fail(w, &lanes[l], "%s (%s:%d)",
                                    lanes[l].trap_why ? lanes[l].trap_why : "called __trap()", lanes[l].file,
                                    lanes[l].line);
                }
                int rel = resolve_warp(w, lanes, nl, wi);
                if (rel < 0) return -1;
                if (!ran && !rel) break;
            }
        }
        if (w->n_done == n) return 0;
        if (resolve_barrier(w) < 0) return -1;
    }
}

/* ---- workers --------------------------------------------------------------------------- */

static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static arena *g_pool;
static unsigned g_pool_n;
enum { POOL_MAX = 32 };

static arena *arena_get(size_t stack_size, unsigned n) {
    pthread_mutex_lock(&g_pool_mu);
    arena **best = NULL;
    for (arena **p = &g_pool; *p; p = &(*p)->next)
        if ((*p)->stack_size == stack_size && (*p)->cap >= n && (!best || (*p)->cap < (*best)->cap)) best = p;
    arena *a = NULL;
    if (best) {
        a = *best;
        *best = a->next;
        g_pool_n--;
    }
    pthread_mutex_unlock(&g_pool_mu);
    if (a) return a;
    unsigned cap = 32;
    while (cap < n) cap *= 2;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->stack_size = stack_size;
    a->cap = cap;
    a->slot = stack_size + page;
    a->len = a->slot * cap;
    a->base = mmap(NULL, a->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (a->base == MAP_FAILED) {
        free(a);
        return NULL;
    }
    for (unsigned i = 0; i < cap; i++) /* the guard page under each stack; best effort */
        (void)mprotect(a->base + (size_t)i * a->slot, page, PROT_NONE);
    return a;
}

static void arena_put(arena *a, int dirty) {
    if (!a) return;
#if MJ_SIM_ASAN
    /* Fibers dropped mid-kernel leave their frames' redzones poisoned. (Fibers that returned
     * left their stacks clean: every instrumented frame unpoisons itself on return.) */
    if (dirty) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (unsigned i = 0; i < a->cap; i++)
            __asan_unpoison_memory_region(a->base + (size_t)i * a->slot + page, a->stack_size);
    }
#else
    (void)dirty;
#endif
    pthread_mutex_lock(&g_pool_mu);
    int keep = g_pool_n < POOL_MAX;
    if (keep) {
        a->next = g_pool;
        g_pool = a;
        g_pool_n++;
    }
    pthread_mutex_unlock(&g_pool_mu);
    if (!keep) {
        munmap(a->base, a->len);
        free(a);
    }
}

static int worker_setup(worker *w) {
    launch *L = w->L;
    unsigned n = L->n_threads;
    w->fibers = calloc(n, sizeof *w->fibers);
    if (L->use_uc) w->ucs = calloc(n, sizeof *w->ucs);
    w->stacks = arena_get(L->stack_size, n);
    if (L->smem) {
        size_t bytes = ((size_t)L->smem + 127) & ~(size_t)127;
        w->dyn_smem = aligned_alloc(128, bytes);
        if (w->dyn_smem) memset(w->dyn_smem, 0xA5, bytes);
    }
    if (!w->fibers || (L->use_uc && !w->ucs) || !w->stacks || (L->smem && !w->dyn_smem)) return -1;
    unsigned bx = L->block[0], by = L->block[1];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (unsigned i = 0; i < n; i++) {
        fiber *f = &w->fibers[i];
        f->w = w;
        f->tid = i;
        f->stack = w->stacks->base + (size_t)i * w->stacks->slot + page;
        f->uc = L->use_uc ? &w->ucs[i] : NULL;
        f->pub.thread_idx = (mj_sim_dim3){i % bx, (i / bx) % by, i / (bx * by)};
        f->pub.block_dim = (mj_sim_dim3){L->block[0], L->block[1], L->block[2]};
        f->pub.grid_dim = (mj_sim_dim3){L->grid[0], L->grid[1], L->grid[2]};
        f->pub.lane = i % 32;
        f->pub.warp = i / 32;
        f->pub.dyn_smem = w->dyn_smem;
        f->pub.stream_bytes = &w->stream_bytes;
        f->pub.prefetch = w->prefetch;
    }
    return 0;
}

static void worker_teardown(worker *w) {
    arena_put(w->stacks, w->dirty);
    free(w->fibers);
    free(w->ucs);
    free(w->dyn_smem);
}

static void worker_run(worker *w) {
    launch *L = w->L;
    if (worker_setup(w) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s (sim): out of memory for %u fiber stacks of %zu KiB", L->kernel,
                 L->n_threads, L->stack_size / 1024);
        record_error(L, 0, MJ_ERR_NOMEM, msg);
    } else {
        while (!atomic_load(&L->abort)) {
            uint64_t b = atomic_fetch_add(&L->next, 1);
            if (b >= L->n_blocks) break;
            if (run_block(w, b) < 0) {
                w->dirty = 1;
                break;
            }
        }
    }
    worker_teardown(w);
}

static void *worker_thread(void *p) {
    worker_run(p);
    return NULL;
}

/* ---- a launch -------------------------------------------------------------------------- */

/* Bytes the launches of this thread loaded through mj_ld_stream or cp.async, since the last take. */
static _Thread_local unsigned long long tls_stream_bytes;

unsigned long long mj_sim_stream_bytes_take(void) {
    unsigned long long n = tls_stream_bytes;
    tls_stream_bytes = 0;
    return n;
}

/* The same for mj_prefetch_l2: calls, and the sums of their lines' indices and squares. */
static _Thread_local unsigned long long tls_prefetch[3];

void mj_sim_prefetch_take(unsigned long long out[3]) {
    for (int i = 0; i < 3; i++) {
        if (out) out[i] = tls_prefetch[i];
        tls_prefetch[i] = 0;
    }
}

mj_status mj_sim_run(mj_sim_entry entry, const char *kernel, const uint32_t grid[3],
                     const uint32_t block[3], uint32_t smem, void **args) {
    if (!entry || !grid || !block) return mj_set_error(MJ_ERR_INVALID_ARG, "sim launch: NULL argument");
    if (!kernel) kernel = "kernel";
    uint64_t nt = (uint64_t)block[0] * block[1] * block[2];
    if (!block[0] || !block[1] || !block[2] || block[0] > 1024 || block[1] > 1024 || block[2] > 64 ||
        nt > 1024)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "launch of %s (sim): block (%u,%u,%u) is not a valid CUDA block (each "
                            "dimension >= 1, x and y <= 1024, z <= 64, at most 1024 threads)",
                            kernel, block[0], block[1], block[2]);
    if (!grid[0] || !grid[1] || !grid[2] || grid[0] > 2147483647u || grid[1] > 65535 || grid[2] > 65535)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "launch of %s (sim): grid (%u,%u,%u) is not a valid CUDA grid (each "
                            "dimension >= 1, x < 2^31, y and z <= 65535)",
                            kernel, grid[0], grid[1], grid[2]);
    if (smem > (64u << 20))
        return mj_set_error(MJ_ERR_INVALID_ARG, "launch of %s (sim): %u bytes of dynamic shared memory "
                            "(the sim allows up to 64 MiB)", kernel, smem);
    launch L;
    memset(&L, 0, sizeof L);
    L.kernel = kernel;
    L.entry = entry;
    L.args = args;
    memcpy(L.grid, grid, sizeof L.grid);
    memcpy(L.block, block, sizeof L.block);
    L.smem = smem;
    L.n_threads = (unsigned)nt;
    L.n_blocks = (uint64_t)grid[0] * grid[1] * grid[2];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    long kb = mj_env_long("MOEJIT_SIM_STACK_KB", 16, 1l << 20, MJ_SIM_ASAN ? 256 : 64, NULL);
    L.stack_size = (((size_t)kb << 10) + page - 1) & ~(page - 1);
    L.use_uc = !MJ_SIM_X86_SWITCH || mj_env_long("MOEJIT_SIM_UCONTEXT", 0, 1, 0, NULL) == 1;
    atomic_init(&L.next, 0);
    atomic_init(&L.abort, 0);
    pthread_mutex_init(&L.mu, NULL);

    unsigned n_workers = (unsigned)mj_env_long("MOEJIT_SIM_THREADS", 1, 1024, mj_cpu_count(), NULL);
    if (n_workers > L.n_blocks) n_workers = (unsigned)L.n_blocks;
    worker *ws = calloc(n_workers, sizeof *ws);
    if (!ws) {
        pthread_mutex_destroy(&L.mu);
        return mj_set_error(MJ_ERR_NOMEM, "launch of %s (sim): out of memory", kernel);
    }
    for (unsigned i = 0; i < n_workers; i++) ws[i].L = &L;
    for (unsigned i = 1; i < n_workers; i++)
        ws[i].started = pthread_create(&ws[i].th, NULL, worker_thread, &ws[i]) == 0; /* fewer is fine */
    worker_run(&ws[0]);
    for (unsigned i = 1; i < n_workers; i++)
        if (ws[i].started) pthread_join(ws[i].th, NULL);
    for (unsigned i = 0; i < n_workers; i++) {
        tls_stream_bytes += ws[i].stream_bytes;
        for (int k = 0; k < 3; k++) tls_prefetch[k] += ws[i].prefetch[k];
    }
    free(ws);
    pthread_mutex_destroy(&L.mu);
    if (L.st != MJ_OK) return mj_set_error(L.st, "%s", L.err);
    return MJ_OK;
}
