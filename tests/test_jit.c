/* test_jit.c — the JIT pipeline without a GPU: registry, rendering, keys, every template
 * compiled for every target it declares (0 spills), memory / disk / strict / record paths,
 * concurrent requests in one process, and launches refused in a compile-only context. */
#include "cache.h"
#include "jit.h"
#include "mj_test_registry.h"
#include "test.h"

#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* The first allowed value of every knob, with BLOCK-dependent knobs kept consistent. */
static mj_spec default_spec(int32_t tpl, mj_target t) {
    mj_spec s;
    memset(&s, 0, sizeof s);
    s.tpl = tpl;
    s.target = t;
    s.backend = MJ_BACKEND_CUDA;
    const mj_template_desc *d = mj_template_at(tpl);
    for (int32_t i = 0; i < d->n_knobs; i++)
        s.knobs[i] = d->knobs[i].kind == MJ_KNOB_KIND_RANGE ? d->knobs[i].lo : d->knobs[i].values[0];
    return s;
}

static mj_spec saxpy_spec(int block, int vec, mj_target t) {
    int32_t tpl = -1;
    CHECK(mj_template_find("fixture_saxpy", &tpl) != NULL, "fixture_saxpy not in the registry");
    mj_spec s = default_spec(tpl < 0 ? 0 : tpl, t);
    s.knobs[0] = block;
    s.knobs[1] = vec;
    return s;
}

typedef struct thr_arg {
    mj_context_t ctx;
    mj_spec spec;
    mj_status st;
    const mj_function *fn;
} thr_arg;

static void *thr_get(void *p) {
    thr_arg *a = p;
    a->st = mj_jit_get(a->ctx, &a->spec, &a->fn);
    return NULL;
}

/* What the cases share (setup): no driver; the kernel cache in dir, and a second one in dir2
 * (fresh directories: the compiles are this run's own); MOEJIT_RECORD in record. Made on
 * first use: ctx on dir (jit_ctx), s = fixture_saxpy BLOCK 256 VEC 4 for sm_120a with its
 * source src1 of l1 bytes (saxpy_256), and s compiled in ctx, f1 (saxpy_fn). */
static char *dir, *dir2;
static char record[4200];
static mj_context_t ctx;
static mj_spec s;
static char *src1;
static size_t l1;
static const mj_function *g_f1;
static int g_n_compiled; /* the template x target builds of compile_all */

static int setup(void) {
    /* No driver, whatever the machine: the compile-only and no-device paths are tested here
     * (a GPU machine runs the GPU tests). */
    setenv("MOEJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    dir = test_tmpdir("jit");
    CHECK(dir != NULL, "mkdtemp failed");
    if (!dir) return test_finish();
    dir2 = test_tmpdir("jit");
    snprintf(record, sizeof record, "%s.record.jsonl", dir);
    unlink(record);
    setenv("MOEJIT_RECORD", record, 1);
    return 0;
}

static void teardown(void) {
    mj_context_destroy(ctx);
    free(src1);
    test_rm_rf(dir), test_rm_rf(dir2);
    unlink(record);
    free(dir), free(dir2);
}

static mj_context_t jit_ctx(void) {
    if (!ctx) ctx = test_new_context(dir, MJ_BACKEND_AUTO, NULL, 0);
    return ctx;
}
static void saxpy_256(void) {
    if (src1) return;
    s = saxpy_spec(256, 4, MJ_TARGET_SM120A);
    CHECK_OK(mj_render(&s, &src1, &l1));
}
static const mj_function *saxpy_fn(void) {
    saxpy_256();
    if (!g_f1 && jit_ctx()) CHECK_OK(mj_jit_get(ctx, &s, &g_f1));
    return g_f1;
}

static void test_registry(void) {
    /* 1. The registry holds the fixtures as reflected from their files. */
    int32_t isax = -1, isum = -1;
    const mj_template_desc *sax = mj_template_find("fixture_saxpy", &isax);
    const mj_template_desc *sum = mj_template_find("fixture_block_sum", &isum);
    CHECK(sax && sum, "fixtures missing from the registry (%d templates)", mj_registry_count());
    if (!sax || !sum) return;
    CHECK(sax->n_knobs == 2 && !strcmp(sax->knobs[0].name, "BLOCK") && sax->knobs[0].lo == 32 &&
          sax->knobs[0].hi == 1024 && sax->knobs[1].kind == MJ_KNOB_KIND_SET && sax->knobs[1].n_values == 3 &&
          sax->knobs[1].values[2] == 4, "saxpy knobs");
    CHECK(sax->n_kernels == 1 && sax->kernels[0].n_params == 4 && !strcmp(sax->kernels[0].params[2].name, "x"),
          "saxpy kernel signature");
    CHECK(sum->n_kernels == 2 && !strcmp(sum->kernels[1].name, "fixture_block_sum_final"), "block_sum kernels");
    CHECK(sax->targets == (1u << MJ_TARGET_COUNT) - 1, "saxpy declares all targets: %#x", sax->targets);
    CHECK(strstr(sax->body, "MJ_KERNEL void fixture_saxpy") != NULL, "body embedded");
}

static void test_render(void) {
    /* 2. Rendering is deterministic and says what it is. */
    saxpy_256();
    char *src2 = NULL;
    size_t l2 = 0;
    CHECK_OK(mj_render(&s, &src2, &l2));
    CHECK(src1 && src2 && l1 == l2 && !memcmp(src1, src2, l1), "render not deterministic");
    CHECK(src1 && strstr(src1, "#define BLOCK 256\n") && strstr(src1, "#define VEC 4\n") &&
          strstr(src1, "fixture_saxpy for sm_120a") && strstr(src1, "threads per block"),
          "rendered header: %.300s", src1 ? src1 : "");
    CHECK(src1 && !strstr(src1, MJ_SOURCE_DIR), "rendered source holds an absolute path");
    mj_spec s2 = saxpy_spec(128, 4, MJ_TARGET_SM120A);
    char *src3 = NULL;
    CHECK_OK(mj_render(&s2, &src3, NULL));
    CHECK(src3 && strcmp(src1, src3) != 0, "a knob change must change the source");
    free(src3);
    free(src2);
}

static void test_knob_refusals(void) {
    /* 3. Knobs out of range are refused before anything is rendered. */
    char *bad_src = NULL;
    mj_spec b = saxpy_spec(16, 4, MJ_TARGET_SM120A);
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "BLOCK") && strstr(mj_last_error(), "32..1024"), "msg: %s", mj_last_error());
    b = saxpy_spec(1025, 4, MJ_TARGET_SM120A);
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    b = saxpy_spec(256, 3, MJ_TARGET_SM120A);
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "one of 1 2 4") != NULL, "msg: %s", mj_last_error());
    b = saxpy_spec(256, 4, MJ_TARGET_SM120A);
    b.knobs[5] = 7;
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    b = saxpy_spec(256, 4, MJ_TARGET_SM120A);
    b.tpl = 999;
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    b = saxpy_spec(256, 4, (mj_target)42);
    CHECK_STATUS(mj_render(&b, &bad_src, NULL), MJ_ERR_INVALID_ARG);
    CHECK(bad_src == NULL, "refused render wrote output");
}

static void test_keys(void) {
    /* 4. Every key input changes the key. */
    saxpy_256();
    const char *opts = mj_nvrtc_options(MJ_TARGET_SM120A);
    char *k0 = NULL, *k1 = NULL;
    char h0[MJ_KEY_HEX_LEN + 1], h1[MJ_KEY_HEX_LEN + 1];
    CHECK_OK(mj_key_text(&s, src1, l1, "nvrtc 13.0", opts, &k0));
    mj_key_hash(k0, h0);
    CHECK(k0 && strstr(k0, "format 1\n") && strstr(k0, "target sm_120a\n") && strstr(k0, "source-sha256 ") &&
              strstr(k0, "template fixture_saxpy\n"),
          "key text: %s", k0 ? k0 : "");
    CHECK(strstr(k0, MJ_SOURCE_DIR) == NULL, "key text holds an absolute path");
    {
        char *mod = strdup(src1);
        mod[l1 - 2] ^= 1; /* one source byte */
        CHECK_OK(mj_key_text(&s, mod, l1, "nvrtc 13.0", opts, &k1));
        mj_key_hash(k1, h1);
        CHECK(strcmp(h0, h1) != 0, "source byte did not change the key");
        free(k1), free(mod);
        CHECK_OK(mj_key_text(&s, src1, l1, "nvrtc 13.0", "-arch=sm_120a -O2", &k1));
        mj_key_hash(k1, h1);
        CHECK(strcmp(h0, h1) != 0, "options did not change the key");
        free(k1);
        CHECK_OK(mj_key_text(&s, src1, l1, "nvrtc 13.1", opts, &k1));
        mj_key_hash(k1, h1);
        CHECK(strcmp(h0, h1) != 0, "compiler version did not change the key");
        free(k1);
        mj_spec s90 = s;
        s90.target = MJ_TARGET_SM121A;
        CHECK_OK(mj_key_text(&s90, src1, l1, "nvrtc 13.0", opts, &k1));
        mj_key_hash(k1, h1);
        CHECK(strcmp(h0, h1) != 0, "arch did not change the key");
        free(k1);
        /* The format version is a line of the key text: changing it changes the hash. */
        char *fmt = strdup(k0);
        char *p = strstr(fmt, "format 1\n");
        if (p) p[7] = '2';
        mj_key_hash(fmt, h1);
        CHECK(p && strcmp(h0, h1) != 0, "format version line did not change the key");
        free(fmt);
    }
    CHECK(strcmp(mj_nvrtc_options(MJ_TARGET_SM120A), mj_nvrtc_options(MJ_TARGET_SM90A)) != 0,
          "options must name the target");
    free(k0);
}

static void test_compile_all(void) {
    /* 5. Every template compiles for every target it declares, with 0 spills. */
    if (!jit_ctx()) return;
    int n_compiled = 0;
    for (int32_t t = 0; t < mj_registry_count(); t++)
        for (int a = 0; a < MJ_TARGET_COUNT; a++) {
            if (!(mj_template_at(t)->targets & (1u << a))) continue;
            mj_spec ds = default_spec(t, (mj_target)a);
            const mj_function *f = NULL;
            CHECK_OK(mj_jit_get(ctx, &ds, &f));
            if (!f) continue;
            const mj_ptxas_report *r = mj_function_report(f);
            CHECK(r->registers > 0 && r->spill_stores == 0 && r->spill_loads == 0,
                  "%s on %s: %d registers, %d/%d spill bytes", mj_template_at(t)->name,
                  mj_target_name((mj_target)a), r->registers, r->spill_stores, r->spill_loads);
            n_compiled++;
        }
    printf("compiled %d template x target combinations\n", n_compiled);
    CHECK(n_compiled >= 2 * MJ_TARGET_COUNT, "only %d compiled", n_compiled);
    g_n_compiled = n_compiled;
    /* A bigger specialization of each fixture too. */
    mj_spec big = saxpy_spec(1024, 4, MJ_TARGET_SM120A);
    const mj_function *fbig = NULL;
    CHECK_OK(mj_jit_get(ctx, &big, &fbig));
    int32_t isum = -1;
    mj_template_find("fixture_block_sum", &isum);
    mj_spec bs = default_spec(isum < 0 ? 0 : isum, MJ_TARGET_SM120A);
    bs.knobs[0] = 512, bs.knobs[1] = 8, bs.knobs[2] = 4096;
    const mj_function *fsum = NULL;
    CHECK_OK(mj_jit_get(ctx, &bs, &fsum));
    if (fsum) CHECK(mj_function_report(fsum)->smem_static == 4096 * 4, "static smem %d", mj_function_report(fsum)->smem_static);
}

static void test_memory_hits(void) {
    /* 6. Memory hits: same pointer, no compile. */
    if (!jit_ctx()) return;
    saxpy_256();
    mj_jit_stats st0, st1;
    CHECK_OK(mj_context_stats(ctx, &st0));
    const mj_function *f1 = NULL, *f2 = NULL;
    CHECK_OK(mj_jit_get(ctx, &s, &f1));
    CHECK_OK(mj_jit_get(ctx, &s, &f2));
    CHECK_OK(mj_context_stats(ctx, &st1));
    CHECK(f1 && f1 == f2, "memory hit returned another function");
    CHECK(st1.compiles == st0.compiles + 1 && st1.mem_hits == st0.mem_hits + 1, "compiles %lld->%lld hits %lld->%lld",
          (long long)st0.compiles, (long long)st1.compiles, (long long)st0.mem_hits, (long long)st1.mem_hits);
    if (f1) CHECK(strcmp(mj_function_source(f1), src1) == 0, "stored source is the rendered one");
    g_f1 = f1;
}

static void test_launch_refused(void) {
    /* 7. A launch in a compile-only context is refused through the typed wrapper. */
    const mj_function *f1 = saxpy_fn();
    mj_launch_dims d = {{1, 1, 1}, {256, 1, 1}, 0, NULL};
    CHECK_STATUS(mj_launch_fixture_saxpy(f1, d, 16, 2.0f, NULL, NULL), MJ_ERR_NO_DEVICE);
    CHECK_STATUS(mj_launch_fixture_block_sum(f1, d, NULL, 16, NULL), MJ_ERR_INVALID_ARG);
}

static void test_disk_hits(void) {
    /* 8. A second context on the same directory loads from disk and compiles nothing. */
    const mj_function *f1 = saxpy_fn(); /* s on disk in dir */
    mj_context_t ctx2 = test_new_context(dir, MJ_BACKEND_AUTO, NULL, 0);
    const mj_function *g = NULL;
    CHECK_OK(mj_jit_get(ctx2, &s, &g));
    mj_jit_stats st2;
    CHECK_OK(mj_context_stats(ctx2, &st2));
    CHECK(st2.disk_hits == 1 && st2.compiles == 0, "disk hits %lld compiles %lld", (long long)st2.disk_hits,
          (long long)st2.compiles);
    if (g && f1) CHECK(!strcmp(mj_function_key(g), mj_function_key(f1)), "same key across contexts");
    if (g && f1) CHECK(mj_function_report(g)->registers == mj_function_report(f1)->registers, "report restored from metadata");
    mj_context_destroy(ctx2);
}

static void test_strict(void) {
    /* 9. Strict mode: a miss is an error naming the key; a hit is fine. */
    saxpy_fn(); /* s in dir, for MOEJIT_STRICT below */
    mj_context_t strict = test_new_context(dir2, MJ_BACKEND_AUTO, NULL, 1);
    const mj_function *h = NULL;
    CHECK_STATUS(mj_jit_get(strict, &s, &h), MJ_ERR_CACHE_MISS);
    CHECK(strstr(mj_last_error(), "fixture_saxpy BLOCK=256 VEC=4 sm_120a") && strstr(mj_last_error(), "prewarm"),
          "strict message: %s", mj_last_error());
    CHECK_STATUS(mj_jit_get(strict, &s, &h), MJ_ERR_CACHE_MISS); /* looked up again, same answer */
    mj_jit_stats sst;
    CHECK_OK(mj_context_stats(strict, &sst));
    CHECK(sst.compiles == 0 && sst.strict_misses == 2, "strict: %lld compiles, %lld misses (a miss must not "
          "be remembered)", (long long)sst.compiles, (long long)sst.strict_misses);
    /* The operator prewarms the cache meanwhile: the same strict context now finds it. */
    mj_context_t warm = test_new_context(dir2, MJ_BACKEND_AUTO, NULL, 0);
    const mj_function *hw = NULL;
    CHECK_OK(mj_jit_get(warm, &s, &hw));
    mj_context_destroy(warm);
    CHECK_OK(mj_jit_get(strict, &s, &h));
    CHECK(h != NULL, "strict context after prewarm");
    CHECK_OK(mj_jit_get(strict, &s, &h)); /* and from memory from then on */
    CHECK_OK(mj_context_stats(strict, &sst));
    CHECK(sst.compiles == 0 && sst.disk_hits == 1 && sst.mem_hits == 1, "strict after prewarm: %lld compiles, "
          "%lld disk hits, %lld mem hits", (long long)sst.compiles, (long long)sst.disk_hits, (long long)sst.mem_hits);
    mj_context_destroy(strict);
    setenv("MOEJIT_STRICT", "1", 1);
    strict = test_new_context(dir, MJ_BACKEND_AUTO, NULL, -1); /* from the environment */
    CHECK_OK(mj_jit_get(strict, &s, &h));
    mj_spec unseen = saxpy_spec(96, 2, MJ_TARGET_SM89);
    CHECK_STATUS(mj_jit_get(strict, &unseen, &h), MJ_ERR_CACHE_MISS);
    mj_context_destroy(strict);
    unsetenv("MOEJIT_STRICT");
}

static void test_concurrent(void) {
    /* 10. Concurrent requests for one spec in one process: compiled once. */
    mj_context_t cc = test_new_context(dir2, MJ_BACKEND_AUTO, NULL, 0);
    thr_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].ctx = cc;
        args[i].spec = saxpy_spec(64, 1, MJ_TARGET_SM80);
        pthread_create(&th[i], NULL, thr_get, &args[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    mj_jit_stats cst;
    CHECK_OK(mj_context_stats(cc, &cst));
    for (int i = 0; i < 4; i++) CHECK(args[i].st == MJ_OK && args[i].fn == args[0].fn, "thread %d", i);
    CHECK(cst.compiles == 1, "4 threads compiled %lld times", (long long)cst.compiles);
    mj_context_destroy(cc);
}

static void test_pool(void) {
    /* 10b. Many specs at once (mj_jit_get_many, what mj_moe_prepare fetches a plan with): a
     * pool of $MOEJIT_COMPILE_THREADS workers, never more at once; every spec tried, the first
     * failure in order reported, a spec listed twice built once; a bad setting is the CPU
     * count. */
    {
        setenv("MOEJIT_COMPILE_THREADS", "2", 1);
        char *dir3 = test_tmpdir("jit-pool");
        mj_context_t pc = dir3 ? test_new_context(dir3, MJ_BACKEND_CUDA, NULL, 0) : NULL;
        if (pc) {
            CHECK(mj_jit_compile_threads(pc) == 2, "MOEJIT_COMPILE_THREADS=2 gave %d", mj_jit_compile_threads(pc));
            static const int blocks[] = {32, 64, 96, 128, 160};
            /* good specs 0 1 3 5 7, 8 the same as 1; bad ones in the middle (2: VEC 3) and
             * after (6: BLOCK 2000), with different errors: the first is reported, and every
             * good spec after it is built all the same */
            mj_spec ms[9];
            static const int good[] = {0, 1, 3, 5, 7};
            for (int i = 0; i < 5; i++) ms[good[i]] = saxpy_spec(blocks[i], 1, MJ_TARGET_SM80);
            ms[2] = saxpy_spec(32, 1, MJ_TARGET_SM80);
            ms[2].knobs[1] = 3;    /* VEC 3: not one of 1 2 4 */
            ms[6] = saxpy_spec(32, 1, MJ_TARGET_SM80);
            ms[6].knobs[0] = 2000; /* BLOCK 2000: above 1024 */
            ms[8] = ms[1];         /* listed twice */
            const mj_function *mf[9];
            mj_status pst = mj_jit_get_many(pc, ms, 9, mf);
            CHECK(pst == MJ_ERR_INVALID_ARG && strstr(mj_last_error(), "VEC") && !strstr(mj_last_error(), "BLOCK"),
                  "pool with two bad specs: the first's error, got %s: %s", mj_status_string(pst), mj_last_error());
            CHECK(mf[2] == NULL && mf[6] == NULL, "the bad specs have no function");
            mj_jit_stats pst2;
            CHECK_OK(mj_context_stats(pc, &pst2));
            CHECK(pst2.compiles == 5, "5 distinct good specs, %lld compiles", (long long)pst2.compiles);
            /* The bound (that 2 workers did overlap is likely, not certain, so not checked). */
            CHECK(mj_jit_pool_peak(pc) >= 1 && mj_jit_pool_peak(pc) <= 2, "2 compile threads, %d builds at once",
                  mj_jit_pool_peak(pc));
            for (int gi = 0; gi < 5; gi++) {
                const int i = good[gi];
                const mj_function *one = NULL;
                CHECK_OK(mj_jit_get(pc, &ms[i], &one));
                CHECK(mf[i] && mf[i] == one, "pool spec %d: not what mj_jit_get has", i);
            }
            CHECK(mf[8] == mf[1], "a spec listed twice is one function");
            /* All in memory: nothing built, every one a memory hit. */
            mj_spec okspecs[6] = {ms[0], ms[1], ms[3], ms[5], ms[7], ms[8]};
            const mj_function *of[6];
            CHECK_OK(mj_context_stats(pc, &pst2));
            const long long hits0 = (long long)pst2.mem_hits;
            CHECK_OK(mj_jit_get_many(pc, okspecs, 6, of));
            CHECK_OK(mj_context_stats(pc, &pst2));
            CHECK(pst2.compiles == 5 && (long long)pst2.mem_hits == hits0 + 6, "again: %lld compiles, %lld hits",
                  (long long)pst2.compiles, (long long)pst2.mem_hits - hits0);
            /* Some in memory, one not: the ones in memory count as hits too. */
            mj_spec mixed[3] = {ms[0], saxpy_spec(192, 1, MJ_TARGET_SM80), ms[1]};
            const mj_function *xf[3];
            CHECK_OK(mj_jit_get_many(pc, mixed, 3, xf));
            CHECK_OK(mj_context_stats(pc, &pst2));
            CHECK(pst2.compiles == 6 && (long long)pst2.mem_hits == hits0 + 8, "mixed: %lld compiles, %lld hits",
                  (long long)pst2.compiles, (long long)pst2.mem_hits - hits0);
            mj_context_destroy(pc);
        }
        static const char *const bad_threads[] = {"0", "abc", "257", "-3", "2x"};
        for (size_t i = 0; i < sizeof bad_threads / sizeof *bad_threads; i++) {
            setenv("MOEJIT_COMPILE_THREADS", bad_threads[i], 1);
            pc = dir3 ? test_new_context(dir3, MJ_BACKEND_CUDA, NULL, 0) : NULL;
            int want = mj_cpu_count() > 256 ? 256 : mj_cpu_count();
            CHECK(pc && mj_jit_compile_threads(pc) == want, "MOEJIT_COMPILE_THREADS=%s: %d threads, want %d",
                  bad_threads[i], pc ? mj_jit_compile_threads(pc) : -1, want);
            if (pc) mj_context_destroy(pc);
        }
        unsetenv("MOEJIT_COMPILE_THREADS");
        if (dir3) test_rm_rf(dir3), free(dir3);
    }
}

static void test_manifest(void) {
    /* 11. Manifest lines: round trip and refusals. */
    saxpy_256();
    char *line = NULL;
    CHECK_OK(mj_spec_to_json(&s, &line));
    CHECK(line && !strcmp(line, "{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":4},\"arch\":\"sm_120a\"}"),
          "line %s", line ? line : "");
    mj_spec back;
    CHECK_OK(mj_spec_from_json(line, "t", &back));
    CHECK(!memcmp(&back, &s, sizeof s), "manifest round trip");
    free(line);
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"nope\",\"knobs\":{},\"arch\":\"sm_80\"}", "m:1", &back), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "m:1") && strstr(mj_last_error(), "nope"), "msg %s", mj_last_error());
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256},\"arch\":\"sm_80\"}", "m:2", &back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":4,\"X\":1},\"arch\":\"sm_80\"}", "m:3", &back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":4},\"arch\":\"sm_75\"}", "m:4", &back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":\"x\",\"VEC\":4},\"arch\":\"sm_80\"}", "m:5", &back), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_spec_from_json("{\"template\":", "m:6", &back), MJ_ERR_PARSE);
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":2000,\"VEC\":4},\"arch\":\"sm_80\"}", "m:7", &back), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "m:7") && strstr(mj_last_error(), "BLOCK"), "msg %s", mj_last_error());
    /* A boolean for an int knob, and a knob given twice, are mistakes, not 1 and "the last". */
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":true},\"arch\":\"sm_80\"}", "m:8", &back), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "VEC") && strstr(mj_last_error(), "integer"), "msg %s", mj_last_error());
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":4,\"VEC\":2},\"arch\":\"sm_80\"}", "m:9", &back), MJ_ERR_PARSE);
    CHECK(strstr(mj_last_error(), "m:9") && strstr(mj_last_error(), "duplicate"), "msg %s", mj_last_error());
    /* A template name is quoted safely: no control characters reach the message. */
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"evil\\n\\u001b[31mred\",\"knobs\":{},\"arch\":\"sm_80\"}", "m:10", &back), MJ_ERR_INVALID_ARG);
    CHECK(!strchr(mj_last_error(), '\n') && !strchr(mj_last_error(), 0x1b) && strstr(mj_last_error(), "evil\\x0a\\x1b[31mred"),
          "unsafe name in message: %s", mj_last_error());
}

static void test_named_knobs(void) {
    /* 11b. Knobs by name: the generated struct maps each value to its knob whatever the
     * order they are written in (a launcher cannot swap two knobs by position). */
    {
        mj_knobs_fixture_saxpy kn = {.VEC = 4, .BLOCK = 128};
        mj_spec ns;
        char *nsrc = NULL;
        mj_spec_fixture_saxpy(jit_ctx(), &kn, &ns);
        CHECK_OK(mj_render(&ns, &nsrc, NULL));
        CHECK(nsrc && strstr(nsrc, "#define BLOCK 128\n") && strstr(nsrc, "#define VEC 4\n"), "named knobs rendered wrong");
        free(nsrc);
        CHECK(MJ_KNOB_fixture_saxpy_BLOCK_MIN == 32 && MJ_KNOB_fixture_saxpy_BLOCK_MAX == 1024 &&
                  MJ_KNOB_fixture_saxpy_VEC_MAX == 4, "knob limits from the registry");
    }
}

static void test_constraints(void) {
    /* 11c. The constraint evaluator: C's precedence and operators, and its refusals. */
    {
        const char *names[] = {"A", "B", "C"};
        const int32_t vals[] = {6, 4, 0};
        static const struct { const char *e; int64_t v; } ok_cases[] = {
            {"A + B * 2", 14}, {"(A + B) * 2", 20}, {"A - B - 1", 1}, {"A / B", 1}, {"A % B", 2},
            {"1 << B", 16}, {"A >> 1", 3}, {"A > B && B > C", 1}, {"A < B || C", 0}, {"!C", 1},
            {"-A + ~0", -7}, {"A & B | 1", 5}, {"A ^ B", 2}, {"A == 6 != 0", 1}, {"A <= 6 && A >= 6", 1},
            {"C && A / C", 0}, {"1 || A % C", 1}, {"  A*B  ", 24}};
        for (size_t i = 0; i < sizeof ok_cases / sizeof ok_cases[0]; i++) {
            int64_t v = -999;
            char err[256] = "";
            CHECK(mj_constraint_eval(ok_cases[i].e, names, vals, 3, &v, err, sizeof err) == 0 && v == ok_cases[i].v,
                  "\"%s\" = %lld (want %lld) %s", ok_cases[i].e, (long long)v, (long long)ok_cases[i].v, err);
        }
        static const struct { const char *e, *why; } bad_cases[] = {
            {"A / C", "division by zero"}, {"A % C", "division by zero"}, {"A +", "unexpected end"},
            {"(A", "expected ')'"}, {"D > 1", "unknown knob name"}, {"A B", "unexpected text"},
            {"A = B", "unexpected text"}, {"1 << 70", "shift out of range"}, {"99999999999999999999", "too large"}};
        for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
            int64_t v;
            char err[256] = "";
            CHECK(mj_constraint_eval(bad_cases[i].e, names, vals, 3, &v, err, sizeof err) != 0 &&
                      strstr(err, bad_cases[i].why),
                  "\"%s\": %s (want %s)", bad_cases[i].e, err, bad_cases[i].why);
        }
    }
}

static void test_record(void) {
    /* 12. MOEJIT_RECORD got one line per compile (and per strict miss), each replayable. */
    if (!g_n_compiled) { /* alone: a compile (unless s was) and two strict misses of its own */
        saxpy_fn();
        char *d = test_tmpdir("jit");
        mj_context_t sc = d ? test_new_context(d, MJ_BACKEND_AUTO, NULL, 1) : NULL;
        const mj_function *h = NULL;
        mj_spec a = saxpy_spec(64, 2, MJ_TARGET_SM80), b = saxpy_spec(64, 4, MJ_TARGET_SM80);
        if (sc) {
            CHECK_STATUS(mj_jit_get(sc, &a, &h), MJ_ERR_CACHE_MISS);
            CHECK_STATUS(mj_jit_get(sc, &b, &h), MJ_ERR_CACHE_MISS);
        }
        mj_context_destroy(sc);
        if (d) test_rm_rf(d), free(d);
    }
    const int n_compiled = g_n_compiled;
    FILE *fp = fopen(record, "r");
    CHECK(fp != NULL, "no record file %s", record);
    int n_lines = 0, n_ok = 0;
    char buf[1024];
    while (fp && fgets(buf, sizeof buf, fp)) {
        n_lines++;
        mj_spec r;
        if (mj_spec_from_json(buf, "record", &r) == MJ_OK) n_ok++;
    }
    if (fp) fclose(fp);
    CHECK(n_lines >= n_compiled + 3 && n_ok == n_lines, "record: %d lines, %d valid (compiled %d)", n_lines, n_ok, n_compiled);
}

static void test_bad_context(void) {
    /* 13. Bad context options. */
    mj_context_options bo = MJ_CONTEXT_OPTIONS_INIT;
    bo.struct_size = 3;
    mj_context_t bc = NULL;
    CHECK_STATUS(mj_context_create(&bo, &bc), MJ_ERR_INVALID_ARG);
    bo = (mj_context_options)MJ_CONTEXT_OPTIONS_INIT;
    bo.device = 0; /* a device explicitly asked for, and no driver (main hid it) */
    bo.cache_dir = dir2;
    CHECK_STATUS(mj_context_create(&bo, &bc), MJ_ERR_NO_DEVICE);
    CHECK(strstr(mj_last_error(), "no CUDA driver") != NULL, "device 0 without a driver: %s", mj_last_error());
}

static const test_case cases[] = {
    TEST_CASE("registry", test_registry),
    TEST_CASE("render", test_render),
    TEST_CASE("knob_refusals", test_knob_refusals),
    TEST_CASE("keys", test_keys),
    TEST_CASE("compile_all", test_compile_all),
    TEST_CASE("memory_hits", test_memory_hits),
    TEST_CASE("launch_refused", test_launch_refused),
    TEST_CASE("disk_hits", test_disk_hits),
    TEST_CASE("strict", test_strict),
    TEST_CASE("concurrent", test_concurrent),
    TEST_CASE("pool", test_pool),
    TEST_CASE("manifest", test_manifest),
    TEST_CASE("named_knobs", test_named_knobs),
    TEST_CASE("constraints", test_constraints),
    TEST_CASE("record", test_record),
    TEST_CASE("bad_context", test_bad_context),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
