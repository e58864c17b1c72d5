/* bench_jit.c — how long the JIT takes: median cold compile of each template for sm_120a
 * (its first specialization: every knob at its lowest), of the product specializations the
 * launchers pick for GLM-5 (what a server compiles on its first call; timed round-robin beside
 * a minimal kernel, with a count of those at or under 150 ms), a warm (disk hit)
 * load, the in-memory lookup a hot launch pays, and what a first forward waits for its
 * expert kernels (compiled side by side), what a prepare of the whole plan waits for (one at a
 * time, and through mj_jit_get_many's pool). Prints numbers; it is a benchmark
 * target (make bench_jit), not a test. `bench_jit [REPS] [TEMPLATE]`: TEMPLATE limits the
 * cold compiles to one template. */
#include "cache.h"
#include "jit.h"
#include "plan.h"
#include "test.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


static void die(const char *what, mj_status s) {
    fprintf(stderr, "bench_jit: %s: %s: %s\n", what, mj_status_string(s), mj_last_error());
    exit(1);
}

/* A compile-only sm_120a context on a fresh cache directory (dir: a mkdtemp template; the
 * directory's path on return). */
static mj_context_t fresh_context(char *dir) {
    if (!mkdtemp(dir)) {
        perror("bench_jit: mkdtemp");
        exit(1);
    }
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_CUDA, o.target = "sm_120a", o.cache_dir = dir;
    mj_context_t c;
    mj_status st = mj_context_create(&o, &c);
    if (st != MJ_OK) die("context", st);
    return c;
}

static mj_spec first_spec(int32_t tpl, mj_target t) {
    mj_spec s;
    memset(&s, 0, sizeof s);
    s.tpl = tpl, s.target = t, s.backend = MJ_BACKEND_CUDA;
    const mj_template_desc *d = mj_template_at(tpl);
    for (int32_t i = 0; i < d->n_knobs; i++)
        s.knobs[i] = d->knobs[i].kind == MJ_KNOB_KIND_RANGE ? d->knobs[i].lo : d->knobs[i].values[0];
    return s;
}

/* "E=256 K=8 ..." for s. */
static void knobs_text(const mj_spec *s, char *buf, size_t len) {
    const mj_template_desc *d = mj_template_at(s->tpl);
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < d->n_knobs && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s=%d", i ? " " : "", d->knobs[i].name, s->knobs[i]);
}

/* One cold compile (render + NVRTC to a cubin) of s, in ms. */
static double cold_once(const mj_spec *s) {
    mj_status st;
    double t0 = test_now_ms();
    char *src;
    if ((st = mj_render(s, &src, NULL)) != MJ_OK) die("render", st);
    mj_compile_result cr;
    if ((st = mj_nvrtc_compile(src, mj_template_at(s->tpl)->name, s->target, &cr)) != MJ_OK) die("compile", st);
    double t = test_now_ms() - t0;
    mj_compile_result_free(&cr);
    free(src);
    return t;
}

/* Median cold compile of s over reps runs, into t[]. */
static double cold(const mj_spec *s, int reps, double *t) {
    for (int r = 0; r < reps; r++) t[r] = cold_once(s);
    return median(t, reps);
}

/* The product specializations, timed round-robin (rep r of every one, then rep r + 1), so
 * that a machine whose speed drifts during the run slows them all alike; the first entry is
 * the reference, a minimal kernel (saxpy: what any compile costs). */
typedef struct prod {
    mj_spec s;
    char what[200];
} prod;

static void prod_add(prod *ps, int *np, const mj_spec *s, const char *arch) {
    char kn[160];
    knobs_text(s, kn, sizeof kn);
    ps[*np].s = *s;
    snprintf(ps[*np].what, sizeof ps[*np].what, "%s %s%s%s", mj_template_at(s->tpl)->name, kn, arch ? " " : "",
             arch ? arch : "");
    (*np)++;
}

/* A grouped softmax route (E = 384, 8 groups: not GLM-5's, the other scoring path); GLM-5's
 * own routes and router GEMMs come from the plan below, as the launchers pick them. */
static const char *const k_product[] = {
    "{\"template\": \"oea_route\", \"knobs\": {\"E\": 384, \"K\": 8, \"K0\": 3, \"NG\": 8, \"TG\": 4, \"GSCORE\": 0, "
    "\"SCORING\": 1, \"RENORM\": 1, \"NWARPS\": 4}, \"arch\": \"sm_120a\"}",
};

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    const char *only = argc > 2 ? argv[2] : NULL;
    if (reps < 1) reps = 1;
    mj_status st = mj_nvrtc_load();
    if (st != MJ_OK) die("loading NVRTC", st);
    int vmaj, vmin;
    mj_nvrtc_version(&vmaj, &vmin);
    printf("NVRTC %d.%d, %d repetitions, target sm_120a\n\n", vmaj, vmin, reps);

    /* Cold compile: render + NVRTC (source to cubin, with the ptxas report). */
    printf("%-24s %12s %12s %12s\n", "template", "median ms", "min ms", "max ms");
    double *t = malloc(sizeof *t * (size_t)reps);
    for (int32_t i = 0; i < mj_registry_count(); i++) {
        if (only && strcmp(only, mj_template_at(i)->name)) continue;
        mj_spec s = first_spec(i, MJ_TARGET_SM120A);
        double med = cold(&s, reps, t);
        printf("%-24s %12.1f %12.1f %12.1f\n", mj_template_at(i)->name, med, t[0], t[reps - 1]);
    }
    /* The product specializations: the grouped softmax route above, then GLM-5's decode plan
     * at TP 8 with k0 "1-3:8,4-:4" (what the planner lists for batch sizes 1-256): the routes
     * and router GEMMs (sm_120a), and the expert GEMMs: on sm_120a W4A16 at 1-8 tokens, W4A4
     * above; on sm_90a W4A16 everywhere. Timed round-robin after the reference. */
    prod ps[96];
    int np = 0;
    for (int32_t i = 0; i < mj_registry_count(); i++)
        if (!strcmp(mj_template_at(i)->name, "fixture_saxpy")) {
            mj_spec s = first_spec(i, MJ_TARGET_SM120A);
            prod_add(ps, &np, &s, NULL);
        }
    const int n_ref = np; /* 1 where the fixtures are linked in */
    for (size_t i = 0; i < sizeof k_product / sizeof k_product[0]; i++) {
        mj_spec s;
        if ((st = mj_spec_from_json(k_product[i], "bench_jit", &s)) != MJ_OK) die("product spec", st);
        if (only && strcmp(only, mj_template_at(s.tpl)->name)) continue;
        prod_add(ps, &np, &s, NULL);
    }
    {
        mj_moe_config glm5;
        mj_moe_config_glm5(&glm5);
        int32_t bs[256];
        for (int i = 0; i < 256; i++) bs[i] = i + 1;
        for (int m = 0; m < 2; m++) {
            mj_context_options po = MJ_CONTEXT_OPTIONS_INIT;
            po.device = MJ_DEVICE_NONE, po.backend = MJ_BACKEND_CUDA, po.target = m ? "sm_90a" : "sm_120a";
            char pdir[] = "/tmp/mj-bench-plan-XXXXXX";
            if (!mkdtemp(pdir)) return 1;
            po.cache_dir = pdir;
            mj_context_t pctx;
            if ((st = mj_context_create(&po, &pctx)) != MJ_OK) die("context", st);
            mj_k0_policy k0s;
            if ((st = mj_k0_policy_parse("1-3:8,4-:4", glm5.topk, &k0s)) != MJ_OK) die("k0 policy", st);
            mj_plan plan;
            mj_plan_request req = {&glm5, MJ_PAR_TP, 8, 0, bs, 256, &k0s, MJ_MODE_AUTO, NULL, 1};
            if ((st = mj_plan_build(pctx, &req, &plan)) != MJ_OK) die("plan", st);
            for (int32_t i = 0; i < plan.n; i++) {
                mj_spec s = plan.e[i].spec;
                if (m && s.tpl != MJ_TPL_moe_experts) continue; /* sm_90a: the expert GEMMs */
                if (only && strcmp(only, mj_template_at(s.tpl)->name)) continue;
                if (np == (int)(sizeof ps / sizeof ps[0])) {
                    fprintf(stderr, "bench_jit: more than %d product specializations: raise ps[]\n", np);
                    return 1;
                }
                prod_add(ps, &np, &s, m ? "sm_90a" : "sm_120a");
            }
            mj_plan_free(&plan);
            mj_context_destroy(pctx);
            test_rm_rf(pdir);
        }
    }
    double *pt = malloc(sizeof *pt * (size_t)np * (size_t)reps);
    if (!pt) return 1;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < np; i++) pt[(size_t)i * (size_t)reps + (size_t)r] = cold_once(&ps[i].s);
    /* "x minimal": the median over the minimal kernel's, a figure that moves less with the
     * machine's speed than milliseconds do (compare runs of different days by it). */
    printf("\nproduct specializations, round-robin (rep r of each, then rep r + 1)%s\n%-60s %9s %9s %9s %9s\n",
           n_ref ? ", after a minimal kernel (the cost of any compile)" : "", "template and knobs",
           "median ms", "min ms", "max ms", "x minimal");
    int at_goal = 0;
    double worst = 0.0, ref_med = n_ref ? median(pt, reps) : 0.0;
    for (int i = 0; i < np; i++) {
        double *v = pt + (size_t)i * (size_t)reps, med = median(v, reps);
        printf("%-60s %9.1f %9.1f %9.1f", ps[i].what, med, v[0], v[reps - 1]);
        if (ref_med > 0.0) printf(" %9.2f", med / ref_med);
        printf("\n");
        if (i >= n_ref) at_goal += med <= 150.0, worst = med > worst ? med : worst;
    }
    if (np > n_ref)
        printf("%d of %d product specializations at or under 150 ms median; the slowest %.1f ms\n", at_goal,
               np - n_ref, worst);
    free(pt);

    /* What mj_moe_prepare waits for on a cold cache: the sm_120a plan above (routes, router
     * GEMMs, expert GEMMs) fetched one at a time, as prepare did, and through
     * mj_jit_get_many's pool (what it does now), each into a fresh cache. */
    if (!only) {
        int n120 = 0;
        mj_spec plan_specs[96];
        for (int i = n_ref; i < np; i++)
            if (ps[i].s.target == MJ_TARGET_SM120A && strstr(ps[i].what, " sm_120a")) plan_specs[n120++] = ps[i].s;
        const int preps = reps < 3 ? reps : 3;
        double ser[3], par[3];
        int threads = 0;
        for (int r = 0; r < preps; r++)
            for (int pool = 0; pool < 2; pool++) {
                char fdir[] = "/tmp/mj-bench-prep-XXXXXX";
                mj_context_t fctx = fresh_context(fdir);
                threads = mj_jit_compile_threads(fctx);
                const mj_function *fs[96];
                double t0 = test_now_ms();
                if (pool) {
                    if ((st = mj_jit_get_many(fctx, plan_specs, n120, fs)) != MJ_OK) die("get_many", st);
                } else
                    for (int i = 0; i < n120; i++)
                        if ((st = mj_jit_get(fctx, &plan_specs[i], &fs[i])) != MJ_OK) die("get", st);
                (pool ? par : ser)[r] = test_now_ms() - t0;
                mj_context_destroy(fctx);
                test_rm_rf(fdir);
            }
        double ms = median(ser, preps), mp = median(par, preps);
        printf("\nprepare's compiles, GLM-5 TP 8 sm_120a plan (%d kernels, cold cache), median of %d:\n"
               "  one at a time %9.1f ms;  mj_jit_get_many (%d compile threads) %9.1f ms  (%.2fx)\n",
               n120, preps, ms, threads, mp, ms / mp);
    }

    /* A first forward's wait for its expert kernels: what mj_experts_specs lists for the
     * decode plan's knobs, fetched with mj_jit_get_many into a fresh cache (the kernels
     * compile side by side, mj_jit_get_many's pool). */
    if (!only || !strcmp(only, "moe_experts")) {
        printf("\nfirst forward's expert kernels, compiled side by side (mj_jit_get_many, cold cache)\n");
        for (int m = 0; m < 2; m++)
            for (int tpe = 8; tpe <= 64; tpe *= 2) {
                if (m == 0 && tpe > 8) continue; /* the plan: W4A16 at 1-8 tokens, W4A4 above (and TPE 8 W4A4) */
                mj_knobs_moe_experts k;
                mj_target tg;
                if (mj_target_parse("sm_120a", &tg) != MJ_OK) return 1;
                mj_experts_knobs(6144, 256, 8, 1, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, tpe, tg, &k);
                int32_t n = 0; /* kernels a forward fetches */
                for (int r = 0; r < reps; r++) {
                    char fdir[] = "/tmp/mj-bench-fwd-XXXXXX";
                    mj_context_t fctx = fresh_context(fdir);
                    mj_spec sp[3];
                    const mj_function *fs[3];
                    n = mj_experts_specs(fctx, &k, sp);
                    double t0 = test_now_ms();
                    if ((st = mj_jit_get_many(fctx, sp, n, fs)) != MJ_OK) die("get_many", st);
                    t[r] = test_now_ms() - t0;
                    mj_context_destroy(fctx);
                    test_rm_rf(fdir);
                }
                double med = median(t, reps);
                printf("moe_experts %-5s TPE=%-2d (%d kernels)%24s %9.1f %9.1f %9.1f\n", m ? "W4A4" : "W4A16", k.TPE,
                       (int)n, "", med, t[0], t[reps - 1]);
            }
    }

    /* Warm load: a fresh context finds the entry on disk (open, read, verify checksum). */
    char dir[] = "/tmp/mj-bench-jit-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = dir;
    o.device = MJ_DEVICE_NONE;
    mj_context_t ctx;
    if ((st = mj_context_create(&o, &ctx)) != MJ_OK) die("context", st);
    mj_spec hot = first_spec(0, MJ_TARGET_SM120A);
    const mj_function *f;
    if ((st = mj_jit_get(ctx, &hot, &f)) != MJ_OK) die("get", st);
    int warm_n = reps * 3;
    double *w = malloc(sizeof *w * (size_t)warm_n);
    for (int r = 0; r < warm_n; r++) {
        mj_context_t c2;
        if ((st = mj_context_create(&o, &c2)) != MJ_OK) die("context", st);
        double t0 = test_now_ms();
        if ((st = mj_jit_get(c2, &hot, &f)) != MJ_OK) die("warm get", st);
        w[r] = test_now_ms() - t0;
        mj_context_destroy(c2);
    }
    printf("\nwarm load (disk hit: render, key, read, verify), %s: median %.3f ms\n",
           mj_template_at(0)->name, median(w, warm_n));

    /* Hot lookup: the in-memory table, as a launch pays it. */
    const long n = 2000000;
    double t0 = test_now_ms();
    for (long i = 0; i < n; i++)
        if (mj_jit_get(ctx, &hot, &f) != MJ_OK) die("hot get", MJ_ERR_INTERNAL);
    double ns = (test_now_ms() - t0) * 1e6 / (double)n;
    printf("in-memory lookup (one spec, %ld calls): %.1f ns per call\n", n, ns);

    mj_context_destroy(ctx);
    test_rm_rf(dir);
    free(t), free(w);
    return 0;
}
