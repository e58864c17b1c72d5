/* test_predict.c — the performance model of `moejit bench --predict` (tools/predict.c): a
 * hand-written SASS fixture read into the counts one makes by hand, a launch worked out by
 * hand, and kernels made slow on purpose (a dependent chain of loads; too few blocks for the
 * SMs; too little in flight) predicted slow with the bound that makes them so. */
#include "test.h"

#include "predict.h"

#include <stdlib.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *t = malloc((size_t)n + 1);
    if (t) t[fread(t, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return t;
}

/* A GPU small enough to count by hand. */
static const tool_gpu k_toy = {"toy", "a toy GPU", 1000.0, "sm_90a", 4, 1000.0, 1000.0, 0.5, 1000.0, 65536,
                               64 * 1024, 64, 32, 64, "toy"};

/* tests/data/sass/toy.sass, read once: toy's counts (NULL when the fixture cannot be read). */
static pm_sass g_toy;
static int g_toy_read; /* 1 read, -1 failed */

static const pm_sass *toy(void) {
    if (!g_toy_read) {
        char *text = slurp(MJ_SOURCE_DIR "/tests/data/sass/toy.sass");
        CHECK(text != NULL, "the fixture tests/data/sass/toy.sass");
        g_toy_read = -1;
        if (text) {
            CHECK(pm_sass_analyze(text, "missing", &g_toy) == -1, "no such function");
            CHECK(pm_sass_analyze(text, "toy", &g_toy) == 0, "toy found");
            g_toy_read = 1;
            free(text);
        }
    }
    return g_toy_read > 0 ? &g_toy : NULL;
}

/* The SASS read into the counts one makes by hand. */
static void test_toy_sass(void) {
    if (!toy()) return;
    const pm_sass s = *toy();
    /* By hand: 17 instructions (the NOP and the never-run @!PT LDS are not counted; the
     * trailing self-branch at .L_x_3 is toy's), 3 backward branches (.L_x_2, .L_x_1, .L_x_3). The hot loop .L_x_1 (it loads global memory and
     * holds the MMA): LDG, IMAD.WIDE, LDG, LDGSTS, FFMA, HMMA, LOP3, HFMA2, then the inner
     * loop (IADD3, ISETP, BRA) 3 times, ISETP, BRA. */
    CHECK(s.n_insts == 17, "instructions %d, want 17", s.n_insts);
    CHECK(s.n_loops == 3, "loops %d, want 3", s.n_loops);
    CHECK(s.found && s.first == 2 && s.last == 14, "hot loop %d..%d, want 2..14", s.first, s.last);
    CHECK_NEAR(s.iter[PM_MEM], 3, 0);
    CHECK_NEAR(s.iter[PM_TENSOR], 1, 0);
    CHECK_NEAR(s.iter[PM_FP32], 1, 0);
    CHECK_NEAR(s.iter[PM_INT], 3 + 2 * 3, 0); /* IMAD, LOP3, ISETP; IADD3 and ISETP x 3 */
    CHECK_NEAR(s.iter[PM_HALF], 1, 0);
    CHECK_NEAR(s.iter[PM_OTHER], 1 + 3, 0); /* the BRAs */
    CHECK_NEAR(s.iter_total, 19, 0);
    CHECK_NEAR(s.iter_imad, 1, 0); /* the IMAD.WIDE */
    CHECK(s.ldg == 2 && s.ldgsts == 1, "loads %d + %d", s.ldg, s.ldgsts);
    CHECK(s.chain == 2, "chain %d, want 2 (R4's load feeds R6.64's)", s.chain);
    CHECK(s.outside == 17 - 13, "outside %d", s.outside);
}

/* Function fn of the fixture tests/data/sass/toy.sass, read into s; 0 when it was not. */
static int toy_function(const char *fn, pm_sass *s) {
    char *text = slurp(MJ_SOURCE_DIR "/tests/data/sass/toy.sass");
    CHECK(text != NULL, "the fixture tests/data/sass/toy.sass");
    if (!text) return 0;
    const int ok = pm_sass_analyze(text, fn, s) == 0 && s->found;
    CHECK(ok, "%s found", fn);
    free(text);
    return ok;
}

/* A chain through a shuffle: the value a lane loaded, broadcast to the warp, is the address
 * of the next load (SHFL writes its register after the predicate: "SHFL.IDX PT, R5, ..."). */
static void test_shuffled_chain(void) {
    pm_sass s;
    if (!toy_function("shuffled", &s)) return;
    CHECK(s.chain == 2, "chain %d, want 2 (R4's load, shuffled into R5, feeds R10's)", s.chain);
}

/* Two exclusive paths (an if, whose end jumps past its else): each loads an index, then the
 * value it points at (a chain of 2). In program order the else's address register pair
 * (R12.64) holds R13, which the if's path loaded: followed blindly, that reads as a chain of
 * 3 that no execution has. After the join, R14 (either path's second load) feeds an address
 * but no load. */
static void test_exclusive_paths(void) {
    pm_sass s;
    if (!toy_function("exclusive", &s)) return;
    CHECK(s.chain == 2, "chain %d, want 2 (each path: index, then value; not the if's R13 in the else's R12.64)",
          s.chain);
    CHECK(s.ldg == 4, "loads %d, want 4", s.ldg);
}

/* Subroutines a warp does not run in the common case, counted apart from its instructions.
 * By hand, 17 instructions: S2R, ISETP, CALL; the hot loop .L_x_30 (LDG, FADD, ISETP, BRA);
 * FCHK, CALL, EXIT; a helper named *_once (4: one block of a launch runs it) and a division's
 * slow path (3). Outside the loop 13, of which the two subroutines' 7 are rare: 6 left. */
static void test_rare_subroutines(void) {
    pm_sass s;
    if (!toy_function("rare", &s)) return;
    CHECK(s.n_insts == 17, "instructions %d, want 17", s.n_insts);
    CHECK(s.first == 3 && s.last == 6, "hot loop %d..%d, want 3..6", s.first, s.last);
    CHECK(s.rare == 4 + 3, "rare %d, want 7 (the _once helper's 4, the slow path's 3)", s.rare);
    CHECK(s.outside == 17 - 4 - 7, "outside %d, want 6 (3 before the loop, 3 after)", s.outside);
    /* A subroutine's kind is its own name's, not its kernel's: warm_once's helper runs every
     * iteration (S2R, EXIT and the helper's 2 outside its loop of 4). */
    if (!toy_function("warm_once", &s)) return;
    CHECK(s.rare == 0 && s.outside == 4, "warm_once: rare %d, outside %d, want 0 and 4", s.rare, s.outside);
}

/* The hand-worked launch, with its dependent chain of loads and without. */
static void test_launch(void) {
    if (!toy()) return;
    const pm_sass s = *toy();
    pm_assume a;
    pm_assume_default(&a);
    /* The hand-worked launch: 8 blocks of 4 warps, 32 registers: 16 blocks fit an SM (by
     * warps and registers); the busiest SM holds 2 (1 round), 2 x 4 x 4 KiB in flight. */
    pm_launch l = {"toy", 8, 128, 32, 0, 8e6, 100, 0, 4096, 0, 0, 0, 0, 0, 0, 0, 0};
    pm_result r;
    pm_predict(&k_toy, &a, &s, &l, &r);
    CHECK(r.blocks_per_sm == 16 && r.busiest_blocks == 2 && r.rounds == 1, "occupancy %d %d %d", r.blocks_per_sm,
          r.busiest_blocks, r.rounds);
    CHECK_NEAR(r.floor_us, 8.0, 1e-9);                          /* 8 MB at 1000 GB/s       */
    CHECK_NEAR(r.t_little, 2e6 * 1000e-3 / 32768.0, 1e-9);      /* 2 MB x 1 us / 32 KiB    */
    CHECK_NEAR(r.t_chain, 100 * 2 * 1.0, 1e-9);                 /* 100 x a chain of 2 x 1 us */
    /* issue: 1900 instructions a warp, 2 warps a scheduler; one warp's own 6 cycles each: 11400 cycles */
    CHECK_NEAR(r.insts_warp, 1900, 1e-9);
    CHECK_NEAR(r.t_issue, 11.4, 1e-9);
    CHECK(r.bound == PM_BOUND_LATENCY, "a dependent chain: %s", pm_bound_names[r.bound]);
    CHECK_NEAR(r.predicted_us, a.launch_us + 200.0, 1e-9);

    /* The same without the chain (a SASS whose loads are independent) and enough warps:
     * the time is the issue or the memory, far less. */
    pm_sass flat = s;
    flat.chain = 1;
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK(r.t_chain == 0 && r.bound == PM_BOUND_LATENCY && r.predicted_us < 70, "no chain: %s %.1f",
          pm_bound_names[r.bound], r.predicted_us); /* Little: 61 us, 2 blocks an SM keep too little in flight */
    l.inflight = 64 * 1024, l.iters = 10; /* a deep ring, less work a warp: the memory sets the time */
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK(r.bound == PM_BOUND_MEMORY && r.predicted_us == a.launch_us + 8.0, "memory: %s %.2f",
          pm_bound_names[r.bound], r.predicted_us);
    /* Launched as a programmatic dependent: the fixed cost is pdl_launch_us, the rest as before. */
    l.pdl = 1;
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK(a.pdl_launch_us > 0 && a.pdl_launch_us < a.launch_us && r.predicted_us == a.pdl_launch_us + 8.0,
          "pdl: %.2f (launch %.2f, pdl %.2f)", r.predicted_us, a.launch_us, a.pdl_launch_us);
    /* 2 of the 8 MB prefetched into L2 while the kernel before ran: 6 MB from DRAM (6 us), the
     * floor still the 8 MB; the busiest SM's share for Little's law 1.5 MB. */
    l.prefetched = 2e6;
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK_NEAR(r.floor_us, 8.0, 1e-9);
    CHECK_NEAR(r.t_memory, 6.0, 1e-9);
    CHECK_NEAR(r.t_little, 1.5e6 * 1000e-3 / (2 * 4 * 64 * 1024.0), 1e-9);
    CHECK(r.bound == PM_BOUND_MEMORY && r.predicted_us == a.pdl_launch_us + 6.0, "prefetched: %s %.2f",
          pm_bound_names[r.bound], r.predicted_us);
    /* more than it reads: nothing from DRAM; and without PDL the grid starts after the one
     * before has ended, so nothing was prefetched under it */
    l.prefetched = 9e6;
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK(r.t_memory == 0 && r.floor_us == 8.0, "all prefetched: memory %.2f floor %.2f", r.t_memory, r.floor_us);
    l.pdl = 0, l.prefetched = 2e6;
    pm_predict(&k_toy, &a, &flat, &l, &r);
    CHECK(r.t_memory == 8.0 && r.predicted_us == a.launch_us + 8.0, "no PDL, no prefetch: %.2f", r.t_memory);
}

/* Too few blocks for the SMs, and an uneven grid. */
static void test_waves(void) {
    pm_assume a;
    pm_assume_default(&a);
    pm_result r;
    /* Too few blocks for the SMs: one block of one warp on 4 SMs, 100000 instructions. */
    pm_launch one = {"lonely", 1, 32, 32, 0, 1e3, 0, 100000, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pm_predict(&k_toy, &a, NULL, &one, &r);
    CHECK(r.bound == PM_BOUND_WAVES, "one block: %s", pm_bound_names[r.bound]);
    CHECK_NEAR(r.t_issue, 100000 * a.warp_cpi / 1000.0, 1e-9);
    /* An uneven grid: 5 blocks on 4 SMs, one resident at a time (the shared memory): the
     * busiest SM runs 2 rounds, so twice as long as 4 blocks. */
    pm_launch five = {"uneven", 5, 32, 32, 60 * 1024, 1e3, 0, 10000, 0, 0, 0, 0, 0, 0, 0, 0, 0}, four = five;
    four.blocks = 4;
    pm_result r4;
    pm_predict(&k_toy, &a, NULL, &five, &r);
    pm_predict(&k_toy, &a, NULL, &four, &r4);
    CHECK(r.blocks_per_sm == 1 && r.rounds == 2 && r.bound == PM_BOUND_WAVES, "5 on 4: %d %d %s", r.blocks_per_sm,
          r.rounds, pm_bound_names[r.bound]);
    CHECK_NEAR(r.t_issue, 2 * r4.t_issue, 1e-9);
    CHECK(r4.bound == PM_BOUND_ISSUE, "4 on 4: %s", pm_bound_names[r4.bound]);
}

/* The pipes of a scheduler where the integer rate is half (the toy, like Hopper): the ALU
 * takes the integer instructions but IMAD at half a warp-instruction a cycle; IMAD goes to
 * the FMA pipes (heavy alone, 16 lanes), which packed half occupies both of for a cycle, and
 * which FP32 shares. One block of 32 warps an SM (8 a scheduler), 100 iterations, worked out
 * by hand: the busiest scheduler's cycles are 8 x the largest of a warp's instructions, its
 * ALU cycles and its FMA cycles. */
static void test_pipes(void) {
    pm_assume a;
    pm_assume_default(&a);
    const pm_launch l = {"pipes", 4, 1024, 32, 0, 1e3, 100, 0, 1e6, 0, 0, 0, 0, 0, 0, 0, 0};
    static const struct { double alu, imad, fp32, half, cycles; const char *why; } c[] = {
        {10, 10, 0, 0, 20, "10 ALU + 10 IMAD: 20 cycles on each pipe, 20 instructions"},
        {20, 0, 0, 0, 40, "20 ALU: 40 cycles"},
        {0, 20, 0, 0, 40, "20 IMAD: the heavy FMA pipe alone, 40 cycles"},
        {0, 10, 0, 10, 30, "10 IMAD + 10 half: 20 + 10 cycles of the heavy pipe"},
        {0, 10, 20, 10, 40, "10 IMAD + 20 FP32 + 10 half: the two FMA pipes share 60 lane-cycles, 30 + 10"},
        {16, 0, 8, 16, 40, "16 ALU + 8 FP32 + 16 half: 40 instructions, each pipe under"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        pm_sass s;
        memset(&s, 0, sizeof s);
        s.found = 1, s.chain = 1;
        s.iter[PM_INT] = c[i].alu + c[i].imad, s.iter_imad = c[i].imad;
        s.iter[PM_FP32] = c[i].fp32, s.iter[PM_HALF] = c[i].half;
        s.iter_total = c[i].alu + c[i].imad + c[i].fp32 + c[i].half;
        pm_result r;
        pm_predict(&k_toy, &a, &s, &l, &r);
        CHECK_NEAR(r.t_issue, 8 * 100 * c[i].cycles / 1000.0, 1e-9);
        if (fabs(r.t_issue - 8 * 100 * c[i].cycles / 1000.0) > 1e-9) fprintf(stderr, "  %s\n", c[i].why);
    }
}

/* The busiest warp's experts (experts_down deals them by id): by hand for small cases, and
 * against dealing random ids (a seeded simulation, 40000 deals) for GLM-5's at TP 8. */
static void test_busiest(void) {
    CHECK_NEAR(pm_busiest_share(7, 1, 2), 9, 1e-12);         /* one warp takes them all */
    CHECK_NEAR(pm_busiest_share(0, 4, 6), 2, 1e-12);         /* shared only: 2, 2, 1, 1 */
    CHECK_NEAR(pm_busiest_share(2, 2, 0), 1.5, 1e-12);       /* 2 or 1, even odds */
    CHECK_NEAR(pm_busiest_share(1, 2, 1), 1.5, 1e-12);       /* warp 0 has the shared one */
    CHECK_NEAR(pm_busiest_share(3, 3, 0), 51.0 / 27, 1e-12); /* 6 of 27 deals 1, 18 deal 2, 3 deal 3 */
    uint64_t rng = test_seed(77);
    static const struct { int n, w, s; } c[] = {{8, 4, 1}, {8, 8, 1}, {50, 4, 1}, {50, 8, 1}, {103, 8, 1}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        double sum = 0;
        const int deals = 40000;
        for (int d = 0; d < deals; d++) {
            int cnt[8] = {0}, mx = 0;
            for (int j = 0; j < c[i].s; j++) cnt[j % c[i].w]++;
            for (int j = 0; j < c[i].n; j++) cnt[mj_rng_next(&rng) % (uint64_t)c[i].w]++;
            for (int q = 0; q < c[i].w; q++) mx = cnt[q] > mx ? cnt[q] : mx;
            sum += mx;
        }
        const double sim = sum / deals, got = pm_busiest_share(c[i].n, c[i].w, c[i].s);
        CHECK(fabs(got - sim) <= 0.02 * sim, "%d experts on %d warps (+%d shared): %.3f, dealt %.3f", c[i].n, c[i].w,
              c[i].s, got, sim);
    }
    /* the even split the model used before is well below it where it matters */
    CHECK(pm_busiest_share(50, 8, 1) > 1.4 * (51.0 / 8), "B 8's busiest down warp: %.2f experts",
          pm_busiest_share(50, 8, 1));
}

/* The routing kernel read into its pieces (tests/data/sass/route_toy.sass), counted by hand,
 * and a warp's instructions for the launches the runtime makes. */
static void test_route(void) {
    char *text = slurp(MJ_SOURCE_DIR "/tests/data/sass/route_toy.sass");
    CHECK(text != NULL, "the fixture tests/data/sass/route_toy.sass");
    if (!text) return;
    pm_route_sass r;
    CHECK(pm_sass_route(text, "missing", &r) == -1, "no such function");
    CHECK(pm_sass_route(text, "oea_route", &r) == 0 && r.found && r.pick_loops == 1, "read: found %d, pick loops %d",
          r.found, r.pick_loops);
    free(text);
    /* By hand. token: CALL, LDS, UMOV, the score loop's 5 instructions x 4 (its trip count on
     * UP0's compare with 0x4), STG, ISETP, BRA = 26 (the score loop loads global memory but
     * holds no pick: not the token loop). pick: REDUX x 2, IADD3, ISETP, BRA = 5
     * (once: a pick is one trip). outside: S2R, MOV, BAR, CALL x 2, EXIT = 6 (not the
     * diverged shuffle's path past the EXIT). dispatch: MOV, BAR,
     * the loop's 4 x 4 (0x400 / 0x100), RET = 19, one barrier; the short dispatch: SHFL, STS, RET = 3; the
     * block's scoring: a trip of its loop 6 (LDS, MUFU, STS, VIADD, ISETP, BRA), the rest 4
     * (S2R, LDG, STS, RET); the slow path is not counted. */
    CHECK_NEAR(r.token, 26, 0);
    CHECK_NEAR(r.pick, 5, 0);
    CHECK_NEAR(r.outside, 6, 0);
    CHECK_NEAR(r.dispatch, 19, 0);
    CHECK_NEAR(r.dispatch_bars, 1, 0);
    CHECK_NEAR(r.dispatch_small, 3, 0);
    CHECK_NEAR(r.score, 6, 0);
    CHECK_NEAR(r.score_once, 4, 0);
    /* A warp's instructions: 6 + the dispatch (3 for B x k <= 32, else 19) + tokens x
     * (scorings x 26 + picks x 5) + scorings x each round's block scoring, 4 + its busiest
     * thread's pairs (ceil(n E / threads) of the round's n tokens) x 6. */
    CHECK_NEAR(pm_route_insts(&r, 1, 8, 256, 8, 8), 9 + 26 + 8 * 5 + 4 + 6, 0); /* one token: a pair a thread */
    CHECK_NEAR(pm_route_insts(&r, 1, 8, 1024, 8, 8), 9 + 26 + 8 * 5 + 4 + 4 * 6, 0); /* E 1024: 4 */
    CHECK_NEAR(pm_route_insts(&r, 4, 8, 256, 8, 8), 9 + 26 + 8 * 5 + 4 + 4 * 6, 0); /* 32 entries: the short one */
    CHECK_NEAR(pm_route_insts(&r, 5, 8, 256, 8, 8), 25 + 26 + 8 * 5 + 4 + 5 * 6, 0); /* 40: the whole dispatch */
    CHECK_NEAR(pm_route_insts(&r, 32, 32, 256, 8, 4), 25 + 26 + 8 * 5 + 4 + 8 * 6, 0); /* OEA, a token a warp: scored once */
    CHECK_NEAR(pm_route_insts(&r, 32, 16, 256, 8, 4), 25 + 2 * (2 * 26 + 12 * 5) + 2 * 2 * (4 + 8 * 6),
               0); /* 2 a warp: phase 1 again, each phase 2 rounds of 16 tokens */
    CHECK_NEAR(pm_route_insts(&r, 32, 8, 256, 8, 8), 25 + 4 * (26 + 8 * 5) + 4 * (4 + 8 * 6), 0); /* plain, 4 a warp */
    CHECK_NEAR(pm_route_insts(&r, 12, 8, 256, 8, 8), 25 + 2 * (26 + 8 * 5) + (4 + 8 * 6) + (4 + 4 * 6),
               0); /* a full round, then 4 tokens */
    /* The warps on average (the SM's issue): the dispatch is 8 warps' of 32 (19 each), the
     * other 24 issue its one barrier, its guard and branch (3); the short dispatch and a
     * block of no more warps than the dispatch's: every warp the same. */
    const double all32 = pm_route_insts(&r, 32, 32, 256, 8, 4);
    CHECK_NEAR(pm_route_insts_avg(&r, 32, 32, 8, 256, 8, 4), all32 - 19 + (8 * 19 + 24 * 3) / 32.0, 1e-9);
    CHECK_NEAR(pm_route_insts_avg(&r, 32, 8, 8, 256, 8, 4), pm_route_insts(&r, 32, 8, 256, 8, 4), 0);
    CHECK_NEAR(pm_route_insts_avg(&r, 4, 16, 8, 256, 8, 8), pm_route_insts(&r, 4, 16, 256, 8, 8), 0);
    {   /* the SM's schedulers issue the average (8 warps each: 8 x 131), a warp alone its own
         * chain (143 x 6 cycles, below it) */
        pm_assume a0;
        pm_assume_default(&a0);
        pm_launch even = {"oea_route", 1, 32 * 32, 40, 0, 1e3, 0, all32, 0, 1, 0, 0, 0, 0, 0, 0, 0}, some = even;
        some.extra_sm = pm_route_insts_avg(&r, 32, 32, 8, 256, 8, 4);
        pm_result re, rs;
        pm_predict(&k_toy, &a0, NULL, &even, &re);
        pm_predict(&k_toy, &a0, NULL, &some, &rs);
        CHECK_NEAR(all32, 143, 0);
        CHECK_NEAR(rs.insts_sm, 131, 1e-9);
        CHECK_NEAR(re.insts_sm, 143, 0);
        CHECK_NEAR(re.t_issue * k_toy.clock_mhz, 8 * 143, 1e-6);
        CHECK_NEAR(rs.t_issue * k_toy.clock_mhz, 8 * 131, 1e-6);
        CHECK(rs.insts_warp == 143 && 143 * a0.warp_cpi < 8 * 131, "the busiest warp's own %.0f", rs.insts_warp);
    }
    /* Made slow on purpose: the batch on 8 warps in place of 32 (4 tokens a warp, each scored
     * twice under OEA) is predicted slower on one block, though its warps share schedulers less. */
    pm_assume a;
    pm_assume_default(&a);
    pm_launch w32 = {"oea_route", 1, 32 * 32, 40, 0, 4.0 * 32 * 256, 0, pm_route_insts(&r, 32, 32, 256, 8, 4), 0, 1, 0, 0, 0, 0, 0, 0, 0};
    pm_launch w8 = {"oea_route", 1, 8 * 32, 40, 0, 4.0 * 32 * 256, 0, pm_route_insts(&r, 32, 8, 256, 8, 4), 0, 1, 0, 0, 0, 0, 0, 0, 0};
    pm_result r32, r8;
    pm_predict(&k_toy, &a, NULL, &w32, &r32);
    pm_predict(&k_toy, &a, NULL, &w8, &r8);
    CHECK(r8.predicted_us > 2 * r32.predicted_us, "8 warps %.2f us, 32 warps %.2f", r8.predicted_us, r32.predicted_us);
    CHECK(r32.bound == PM_BOUND_WAVES, "one block on 4 SMs: %s", pm_bound_names[r32.bound]);
}

/* A persistent launch (experts_up's STREAM), worked by hand on the toy (4 SMs): blocks of 2
 * warps, 64 registers (16 an SM by registers), 12 KiB of shared memory (4 an SM of 64 KiB): 16
 * blocks, 32 warps, each a run of ceil(1000 / 32) = 32 pieces of 2 steps, and the 100
 * instructions outside the loop 1 + 31 / 48 times. Against the same pieces as 21 blocks of a
 * tile each (48 pieces, 24 a warp): the busiest SM runs 2 rounds of them. */
static void test_stream(void) {
    if (!toy()) return;
    const pm_sass s = *toy();
    pm_assume a;
    pm_assume_default(&a);
    pm_launch l = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, 100, 4096, 0, 1000, 48, 2, 0, 0, 0, 0};
    pm_stream_launch(&k_toy, &s, &l);
    CHECK(l.blocks == 16, "blocks %lld", (long long)l.blocks);
    CHECK_NEAR(l.iters, 64, 0);
    CHECK_NEAR(l.extra, 100 * (1 + 31.0 / 48), 1e-9);
    pm_result r, rt;
    pm_predict(&k_toy, &a, &s, &l, &r);
    CHECK(r.rounds == 1 && r.blocks_per_sm == 4, "stream: %d rounds of %d", r.rounds, r.blocks_per_sm);
    pm_launch tiles = {"up", 21, 64, 64, 12 * 1024, 1e3, 48, 100, 4096, 0, 0, 0, 0, 0, 0, 0, 0}, keep = tiles;
    pm_stream_launch(&k_toy, &s, &tiles); /* not persistent: left as it is */
    CHECK(tiles.blocks == keep.blocks && tiles.iters == keep.iters && tiles.extra == keep.extra, "a plain launch kept");
    pm_predict(&k_toy, &a, &s, &tiles, &rt);
    CHECK(rt.rounds == 2, "tiles: %d rounds", rt.rounds);
    CHECK(r.t_issue < 0.8 * rt.t_issue, "stream %.3f us, tiles %.3f us", r.t_issue, rt.t_issue);
}

/* The tail: the fold after a persistent launch's runs (experts_up STREAM's split tiles), read
 * from the SASS and worked by hand. fold_serial's fold loop loads one piece's two floats (8
 * bytes a lane) and adds them before the next trip: 7 instructions. fold_batched's has four
 * pieces' float pairs in flight (32 bytes): 4 LDG.64, 8 FADD, IADD3, ISETP, BRA, 15; its
 * other loops do not count (a load before the loop; a loop of 5 LDG.128 that holds a loop is
 * not innermost). A lane folding 48 pieces of 8 bytes waits on L2 48 times serial, 12
 * batched: on the toy (1000 MHz) 48 x (400 + 7 x 2) cycles = 19.872 us, 12 x (400 + 15 x
 * 2) = 5.16 us, after the largest term. */
static void test_tail(void) {
    pm_sass ser, bat;
    if (!toy_function("fold_serial", &ser) || !toy_function("fold_batched", &bat)) return;
    CHECK(ser.first == 1 && ser.last == 4, "serial: hot loop %d..%d", ser.first, ser.last);
    CHECK(ser.tail_ldg == 2 && ser.tail_bytes == 8 && ser.tail_insts == 7, "serial tail: %d loads, %d bytes, %d insts",
          ser.tail_ldg, ser.tail_bytes, ser.tail_insts);
    CHECK(bat.tail_ldg == 4 && bat.tail_bytes == 32 && bat.tail_insts == 15, "batched tail: %d loads, %d bytes, %d insts",
          bat.tail_ldg, bat.tail_bytes, bat.tail_insts);
    if (toy()) CHECK(toy()->tail_ldg == 0 && toy()->tail_bytes == 0, "toy: no tail (%d)", toy()->tail_ldg);
    pm_assume a;
    pm_assume_default(&a);
    CHECK_NEAR(a.l2_lat_cycles, 400, 0);
    CHECK_NEAR(a.tail_cpi, 2, 0);
    pm_launch l = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, 100, 4096, 0, 1000, 48, 2, 48 * 8.0, 1, 0, 0}, l2 = l;
    pm_result rs, rb;
    pm_stream_launch(&k_toy, &ser, &l);
    pm_predict(&k_toy, &a, &ser, &l, &rs);
    pm_stream_launch(&k_toy, &bat, &l2);
    pm_predict(&k_toy, &a, &bat, &l2, &rb);
    CHECK_NEAR(rs.tail_trips, 48, 0);
    CHECK_NEAR(rs.t_tail, 48 * (400 + 7 * 2) / 1000.0, 1e-9);
    CHECK_NEAR(rb.tail_trips, 12, 0);
    CHECK_NEAR(rb.t_tail, 12 * (400 + 15 * 2) / 1000.0, 1e-9);
    double big = rs.t_memory; /* the largest term, which the tail follows */
    if (rs.t_little > big) big = rs.t_little;
    if (rs.t_chain > big) big = rs.t_chain;
    if (rs.t_issue > big) big = rs.t_issue;
    CHECK_NEAR(rs.predicted_us, a.launch_us + big + rs.t_tail, 1e-9);
    CHECK(rs.predicted_us > rb.predicted_us + 10, "serial %.2f us, batched %.2f", rs.predicted_us, rb.predicted_us);
    /* The unit's token pairs are passes of their own, each its trips: 4 pairs of 40 pieces
     * (320 bytes a lane a pass) take 4 x ceil(320 / 32) = 40 trips batched, 4 x 40 serial
     * (not ceil(4 x 320 / 32)). */
    pm_launch lp = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, 100, 4096, 0, 1000, 48, 2, 40 * 8.0, 4, 0, 0}, lp2 = lp;
    pm_stream_launch(&k_toy, &bat, &lp);
    pm_predict(&k_toy, &a, &bat, &lp, &rb);
    CHECK_NEAR(rb.tail_trips, 40, 0);
    pm_stream_launch(&k_toy, &ser, &lp2);
    pm_predict(&k_toy, &a, &ser, &lp2, &rs);
    CHECK_NEAR(rs.tail_trips, 160, 0);
    /* The SASS's outside count (extra < 0) leaves the fold's loop out of a segment's: the
     * finishing warp's alone, counted by the tail. 16 blocks of 2 warps, runs of 32 pieces. */
    pm_launch lo = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, -1, 4096, 0, 1000, 48, 2, 48 * 8.0, 1, 0, 0};
    pm_stream_launch(&k_toy, &bat, &lo);
    CHECK(bat.outside > bat.tail_insts, "outside %d, tail %d", bat.outside, bat.tail_insts);
    CHECK_NEAR(lo.extra, (bat.outside - bat.tail_insts) * (1 + 31.0 / 48), 1e-9);
    /* a plain launch has no fold */
    pm_launch plain = {"up", 21, 64, 64, 12 * 1024, 1e3, 48, 100, 4096, 0, 0, 0, 0, 0, 0, 0, 0};
    pm_predict(&k_toy, &a, &ser, &plain, &rs);
    CHECK(rs.t_tail == 0 && rs.tail_trips == 0, "plain: tail %.3f", rs.t_tail);
}

/* A persistent launch's piece end: in piece's hot loop (12 instructions) a guarded branch skips
 * a global store, an add and a move (3: mem, fp32, an IMAD), which run once a piece; the other
 * skipped block stores to shared memory only and runs every iteration. With 2 iterations a
 * piece, 10 iterations of a warp issue 10 x (12 - 3 / 2) = 105, not 120. */
static void test_piece_end(void) {
    pm_sass s;
    if (!toy_function("piece", &s)) return;
    CHECK(s.first == 1 && s.last == 12, "hot loop %d..%d", s.first, s.last);
    CHECK_NEAR(s.iter_total, 12, 0);
    CHECK_NEAR(s.piece_total, 3, 0);
    CHECK_NEAR(s.piece[PM_MEM], 1, 0);
    CHECK_NEAR(s.piece[PM_FP32], 1, 0);
    CHECK_NEAR(s.piece[PM_INT], 1, 0);
    CHECK_NEAR(s.piece_imad, 1, 0);
    if (toy()) CHECK(toy()->piece_total == 0, "toy: no piece end (%.0f)", toy()->piece_total);
    pm_assume a;
    pm_assume_default(&a);
    pm_launch l = {"up", 4, 32, 32, 0, 1e3, 10, 0, 4096, 0, 0, 0, 2, 0, 0, 0, 0}, plain = l;
    plain.stream_spp = 0;
    pm_result r, rp;
    pm_predict(&k_toy, &a, &s, &l, &r);
    pm_predict(&k_toy, &a, &s, &plain, &rp);
    CHECK_NEAR(r.insts_warp, 105, 1e-9);
    CHECK_NEAR(rp.insts_warp, 120, 1e-9);
}

/* A work item's start: prechain loads an index, then the entry it points at, then the value
 * that points at (3 dependent loads; a fourth load beside the first adds nothing) before its
 * hot loop, whose own chain is 1. toy's code before its loop loads nothing. */
static void test_pre_chain(void) {
    pm_sass s;
    if (!toy_function("prechain", &s)) return;
    CHECK(s.first == 6 && s.last == 9, "hot loop %d..%d", s.first, s.last);
    CHECK(s.pre_chain == 3 && s.chain == 1, "pre_chain %d (want 3), chain %d (want 1)", s.pre_chain, s.chain);
    if (toy()) CHECK(toy()->pre_chain == 0, "toy: pre_chain %d", toy()->pre_chain);
}

/* The finisher: what a guarded branch after the hot loop skips around the tail loop (STREAM
 * up's `if (last)`), counted once a unit, not once a segment, and after the fold in the tail.
 * The fixture by hand: 22 instructions, the hot loop 1..4, the tail loop 9..15 (7, two 8-byte
 * loads); the outer guard at 6 skips 7..19 (13), the inner one at 8 only the loop: 13 - 7 = 6. */
static void test_finisher(void) {
    pm_sass f, bat;
    if (!toy_function("finisher", &f) || !toy_function("fold_batched", &bat)) return;
    CHECK(f.found && f.first == 1 && f.last == 4 && f.n_insts == 22 && f.outside == 18, "hot loop %d..%d of %d, outside %d",
          f.first, f.last, f.n_insts, f.outside);
    CHECK(f.tail_ldg == 2 && f.tail_bytes == 16 && f.tail_insts == 7 && f.tail_first == 9 && f.tail_last == 15,
          "tail: %d loads, %d bytes, %d..%d", f.tail_ldg, f.tail_bytes, f.tail_first, f.tail_last);
    CHECK(f.finish == 6, "finish %d (want 6)", f.finish);
    CHECK(bat.finish == 0, "fold_batched: its tail loop is not behind a guard: finish %d", bat.finish);
    pm_assume a;
    pm_assume_default(&a);
    /* 16 blocks of 2 warps, runs of 32 of 1000 pieces (units of 48): a segment's outside is
     * 18 - 7 - 6 = 5, the finisher's 6 once a unit over the grid's 32 warps */
    pm_launch l = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, -1, 4096, 0, 1000, 48, 2, 48 * 8.0, 1, 0, 0};
    pm_stream_launch(&k_toy, &f, &l);
    CHECK(l.blocks == 16, "blocks %lld", (long long)l.blocks);
    CHECK_NEAR(l.extra, 5 * (1 + 31.0 / 48) + 6 * (1000.0 / 48 / 32), 1e-9);
    pm_result r;
    pm_predict(&k_toy, &a, &f, &l, &r);
    CHECK_NEAR(r.tail_trips, 24, 0);                                       /* 384 bytes, 16 a trip */
    CHECK_NEAR(r.t_tail, (24 * (400 + 7 * 2) + 6 * 2) / 1000.0, 1e-9);     /* then the epilogue */
    /* more tiles than warps (100 of 48 pieces over 32 warps: runs of 150): a warp completes
     * 100 / 32 of them on average, not at most one */
    pm_launch many = {"up", 0, 64, 64, 12 * 1024, 1e3, 0, -1, 4096, 0, 4800, 48, 2, 48 * 8.0, 1, 0, 0};
    pm_stream_launch(&k_toy, &f, &many);
    CHECK_NEAR(many.extra, 5 * (1 + 149.0 / 48) + 6 * (100.0 / 32), 1e-9);
    /* a launch's own count (extra >= 0) is taken as it is */
    pm_launch given = l;
    given.blocks = 0, given.extra = 100;
    pm_stream_launch(&k_toy, &f, &given);
    CHECK_NEAR(given.extra, 100 * (1 + 31.0 / 48), 1e-9);
}

static const test_case cases[] = {
    TEST_CASE("sass", test_toy_sass),
    TEST_CASE("shuffled", test_shuffled_chain),
    TEST_CASE("exclusive", test_exclusive_paths),
    TEST_CASE("rare", test_rare_subroutines),
    TEST_CASE("route", test_route),
    TEST_CASE("launch", test_launch),
    TEST_CASE("waves", test_waves),
    TEST_CASE("pipes", test_pipes),
    TEST_CASE("busiest", test_busiest),
    TEST_CASE("stream", test_stream),
    TEST_CASE("tail", test_tail),
    TEST_CASE("piece_end", test_piece_end),
    TEST_CASE("pre_chain", test_pre_chain),
    TEST_CASE("finisher", test_finisher),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), NULL, NULL); }
