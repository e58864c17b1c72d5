/* bench_plan.c — `moejit bench`'s plan: the specializations mj_moe_prepare compiles for the
 * settings (the planner of runtime/plan.c), each one's cold NVRTC compile (a fresh temporary
 * cache; the median of --reps), its load from the disk cache and its in-memory lookup; then the
 * whole plan cold at once, as mj_moe_prepare and prewarm build it (mj_jit_get_many's pool). */
#include "bench.h"

#include "moejit_private.h"

#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* One rep of spec's timings with the options o, in the empty cache directory dir: a cold
 * compile (a context made, the kernel built and stored), then, by a second context, its load
 * from that cache and its in-memory lookup (the mean of 2000): ms, ms and µs. */
static mj_status time_spec(const mj_context_options *o, const char *dir, const mj_spec *spec, double *cold,
                           double *disk, double *mem) {
    mj_context_options co = *o;
    co.cache_dir = dir;
    mj_context_t c1 = NULL, c2 = NULL;
    const mj_function *f = NULL;
    double t0 = bench_now_ms();
    mj_status st = mj_context_create(&co, &c1);
    if (st == MJ_OK) st = mj_jit_get(c1, spec, &f);
    *cold = bench_now_ms() - t0;
    if (st == MJ_OK) { /* a new context: the entry from disk, then from memory */
        st = mj_context_create(&co, &c2);
        double t1 = bench_now_ms();
        if (st == MJ_OK) st = mj_jit_get(c2, spec, &f);
        *disk = bench_now_ms() - t1;
        const int n = 2000;
        t1 = bench_now_ms();
        for (int k = 0; k < n && st == MJ_OK; k++) st = mj_jit_get(c2, spec, &f);
        *mem = 1e3 * (bench_now_ms() - t1) / n;
    }
    mj_context_destroy(c2);
    mj_context_destroy(c1);
    return st;
}

/* The whole plan compiled cold at once, reps times, each into a fresh cache: what mj_moe_prepare
 * and prewarm wait for on a cold cache (mj_jit_get_many's pool of compile threads), ms into
 * ms[]; the pool's threads into *threads. Returns 0, else tool_fail's status. */
static int time_plan(const mj_context_options *o, const mj_plan *plan, int reps, double *ms, int *threads) {
    int rc = 0;
    for (int rep = 0; !rc && rep < reps; rep++) {
        char *d = temp_dir();
        if (!d) {
            rc = tool_fail("cannot create a temporary directory in $TMPDIR or /tmp: set TMPDIR to a writable one");
            break;
        }
        mj_context_options co = *o;
        co.cache_dir = d;
        mj_context_t c = NULL;
        const double t0 = bench_now_ms();
        mj_status st = mj_context_create(&co, &c);
        if (st == MJ_OK) *threads = mj_jit_compile_threads(c), st = mj_plan_get_all(c, plan, "bench");
        ms[rep] = bench_now_ms() - t0;
        if (st != MJ_OK) rc = tool_fail_status("compiling the plan side by side", st);
        mj_context_destroy(c);
        rm_rf(d);
        free(d);
    }
    return rc;
}

int bench_plan(bench *b, const char *arch) {
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
    bench_txt(b, "plan for %s: %d specializations (batch %s, k0 %s)%s\n", arch, (int)plan.n, a->batch,
              a->k0_policy ? a->k0_policy : "= top-k",
              a->no_compile ? "" : "; cold compile (median), disk load, memory lookup");
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
            bench_txt(b, "  %-12s B %3d-%-3d %s\n", plan.e[i].what, (int)plan.e[i].b_lo, (int)plan.e[i].b_hi,
                      desc);
            continue;
        }
        bench_progress(b, "compiling %d/%d: %s", (int)i + 1, (int)plan.n, desc);
        double cold[64], disk[64], mem[64];
        int reps = a->reps, ok = 1;
        for (int rep = 0; rep < reps && ok; rep++) {
            char *d = temp_dir();
            if (!d) {
                rc = tool_fail("cannot create a temporary directory");
                goto out;
            }
            st = time_spec(&o, d, &plan.e[i].spec, &cold[rep], &disk[rep], &mem[rep]);
            if (st != MJ_OK) {
                ok = 0;
                json_object_set_new(r, "error", json_string(mj_last_error()));
                bench_txt(b, "  %-12s B %3d-%-3d %s: failed: %s\n", plan.e[i].what, (int)plan.e[i].b_lo,
                          (int)plan.e[i].b_hi, desc, mj_last_error());
                if (!failed++) first_failed = (size_t)i;
            }
            rm_rf(d);
            free(d);
        }
        if (!ok) continue;
        double cm = bench_median(cold, reps), dm = bench_median(disk, reps), mm = bench_median(mem, reps);
        total += cm;
        json_object_set_new(r, "cold_ms", json_real(cm));
        json_object_set_new(r, "disk_ms", json_real(dm));
        json_object_set_new(r, "mem_us", json_real(mm));
        bench_txt(b, "  %-12s B %3d-%-3d %9.1f ms %8.2f ms %8.3f us  %s\n", plan.e[i].what, (int)plan.e[i].b_lo,
                  (int)plan.e[i].b_hi, cm, dm, mm, desc);
    }
    if (!a->no_compile) {
        json_object_set_new(jp, "cold_total_ms", json_real(total));
        json_object_set_new(jp, "failed", json_integer(failed));
        bench_txt(b, "  total cold compile: %.0f ms (one thread)%s\n", total,
                  failed ? "; some failed (see above)" : "");
        if (!failed && plan.n > 0) { /* what a prepare or a prewarm waits for: the plan at once */
            double side[64];
            int threads = 0;
            if ((rc = time_plan(&o, &plan, a->reps, side, &threads))) goto out;
            const double sm = bench_median(side, a->reps);
            json_object_set_new(jp, "cold_plan_ms", json_real(sm));
            json_object_set_new(jp, "compile_threads", json_integer(threads));
            bench_txt(b, "  the plan cold, side by side: %.0f ms (median of %d; %d compile thread%s, as "
                         "mj_moe_prepare and prewarm; $MOEJIT_COMPILE_THREADS sets them)\n",
                      sm, a->reps, threads, threads == 1 ? "" : "s");
        }
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

