/* cmd_prewarm.c — `moejit prewarm`: compile a list of specializations into the cache, so
 * that no request ever waits for a compile. The list is a manifest, or the plan of a model
 * config (--config): exactly what mj_moe_prepare asks for, from the same planner
 * (runtime/plan.c). Works with no GPU: NVRTC needs none. */
#include "tools.h"

#include "moejit_private.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char k_usage[] =
    "usage: moejit prewarm [options] MANIFEST...\n"
    "       moejit prewarm [options] --config CONFIG.json [--quant HF_QUANT.json] [--arch A]\n"
    "                      [--tp N | --ep N] [--batch B] [--k0-policy P] [--mode M]\n"
    "                      [--no-shared-expert] [--backend cuda|sim] [--dry-run]\n"
    "\n"
    "Compile specializations into the kernel cache, so that no request waits for a compile.\n"
    "No GPU is needed. Exit status 1 if any specialization failed or could not be stored.\n"
    "\n"
    "A manifest has one JSON object a line: {\"template\": \"router_gemm\", \"knobs\": {\"H\": 6144,\n"
    "\"E\": 256, \"ROWS\": 8, \"NWARPS\": 4}, \"arch\": \"sm_120a\"} (blank lines and lines starting\n"
    "with # are skipped). A server run with MOEJIT_RECORD=path writes such a manifest of every\n"
    "kernel it had to compile.\n"
    "\n"
    "With --config, the list is what mj_moe_prepare asks for on every rank of that model and\n"
    "split, for those batch sizes, k0 policy and mode: the same planner serves both, so a\n"
    "server that prepares with the same settings (in strict mode, even) compiles nothing.\n";

enum { OPT_NOSHARED = 256, OPT_DRY, OPT_BACKEND };

static const tool_opt k_opts[] = {
    TOOL_SHARED(TOOL_OPT_CONFIG, NULL),
    TOOL_SHARED(TOOL_OPT_QUANT, NULL),
    TOOL_SHARED(TOOL_OPT_TP, "default: one rank holds the layer"),
    TOOL_SHARED(TOOL_OPT_EP, NULL),
    TOOL_SHARED(TOOL_OPT_BATCH, "default 1-256"),
    TOOL_SHARED(TOOL_OPT_K0_POLICY, "default: k0 = top-k (plain top-k); above 256 tokens k0 must be top-k"),
    TOOL_SHARED(TOOL_OPT_MODE, NULL),
    {.name = "no-shared-expert", .id = OPT_NOSHARED, .help = "the engine runs the shared expert itself"},
    {.name = "backend", .id = OPT_BACKEND, .has_arg = 1, .arg = "B",
     .help = "cuda: GPU kernels (default); sim: the interpreter's objects, what\n"
             "'moejit run --backend sim' and the demo use"},
    {.name = "dry-run", .id = OPT_DRY, .help = "print the plan as manifest lines on stdout; compile nothing"},
    TOOL_HEADING("\noptions:"),
    TOOL_SHARED(TOOL_OPT_ARCH, "repeatable: with --config, the plan for each (default {target});\n"
                               "with manifests, each line compiled for each instead of its own \"arch\""),
    {.id = 'j', .has_arg = 1, .arg = "N",
     .help = "parallel compiles (default: $MOEJIT_COMPILE_THREADS, else the CPUs\n"
             "this process may run on)"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, NULL),
    TOOL_SHARED(TOOL_OPT_QUIET, "(failures and the summary still print)"),
    {0}};

typedef struct job {
    char *line;         /* the manifest line, arch set                                   */
    char where[300];    /* file:line                                                     */
} job;

typedef struct work {
    job *jobs;
    int n;
    _Atomic int next, done, compiled, cached, failed;
    mj_context_t ctx;
    int tty, quiet;
    pthread_mutex_t out_mu;
    double t0;
} work;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void progress(work *w, const char *what, const char *desc, double ms, const char *err) {
    pthread_mutex_lock(&w->out_mu);
    int done = w->done;
    if (err) {
        if (w->tty) fprintf(stderr, "\r\033[K");
        fprintf(stderr, "failed   %s\n  %s\n", desc, err);
    } else if (!w->quiet) {
        if (w->tty) {
            int width = 30, fill = w->n ? done * width / w->n : width;
            fprintf(stderr, "\r\033[K[%.*s%*s] %d/%d %s", fill, "##############################",
                    width - fill, "", done, w->n, desc);
        } else {
            fprintf(stderr, "%-8s %s (%.0f ms)\n", what, desc, ms);
        }
    }
    pthread_mutex_unlock(&w->out_mu);
}

static void *worker(void *arg) {
    work *w = arg;
    for (;;) {
        int i = w->next++;
        if (i >= w->n) break;
        mj_spec s;
        char desc[512];
        double t = now_s();
        mj_status st = mj_spec_from_json(w->jobs[i].line, w->jobs[i].where, &s);
        int cached = 0;
        if (st == MJ_OK) {
            mj_spec_describe(&s, desc, sizeof desc);
            st = mj_prewarm_json(w->ctx, w->jobs[i].line, &cached);
        } else {
            snprintf(desc, sizeof desc, "%s", w->jobs[i].where);
        }
        w->done++;
        if (st != MJ_OK) {
            w->failed++;
            char err[1024];
            snprintf(err, sizeof err, "%s: %s", mj_status_string(st), mj_last_error());
            progress(w, "failed", desc, 0, err);
        } else {
            if (cached) w->cached++;
            else w->compiled++;
            progress(w, cached ? "cached" : "compiled", desc, 1e3 * (now_s() - t), NULL);
        }
    }
    return NULL;
}

/* Test hook, for tests/driver.sh only: MOEJIT_TEST_FAIL_THREADS=N makes starting worker
 * thread N and later ones fail with EAGAIN, as a thread limit would (ulimit -u does not
 * bind root, so a test cannot produce the real failure). Unset, it changes nothing. */
static int start_worker(pthread_t *th, int index, work *w) {
    const char *limit = getenv("MOEJIT_TEST_FAIL_THREADS");
    if (limit && *limit && index >= atoi(limit)) return EAGAIN;
    return pthread_create(th, NULL, worker, w);
}

/* Read a manifest's lines into jobs, one per --arch (or one with the line's own arch). */
static int read_manifest(const char *path, const char **archs, int n_archs, job **jobs, int *n, int *cap) {
    FILE *fp = fopen(path, "r");
    if (!fp) return tool_fail("%s: cannot open: %s", path, strerror(errno));
    /* fopen takes a directory, and reading it then fails (EISDIR) as if it were empty. A
     * pipe is fine (prewarm <(cmd)); any read error is an error, not the end of the list. */
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(fp);
        return tool_fail("%s: is a directory: give a manifest file (JSON lines)", path);
    }
    char *line = NULL;
    size_t len = 0;
    int lineno = 0, rc = 0;
    while (getline(&line, &len, fp) >= 0) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || *p == '\0' || *p == '#') continue;
        json_error_t je;
        json_t *o = json_loads(p, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(o)) {
            rc = tool_fail("%s:%d: not a JSON object: %s", path, lineno, o ? "wrong type" : je.text);
            json_decref(o);
            break;
        }
        for (int a = 0; a < (n_archs ? n_archs : 1); a++) {
            if (n_archs) json_object_set_new(o, "arch", json_string(archs[a]));
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 64;
                *jobs = realloc(*jobs, sizeof **jobs * (size_t)*cap);
            }
            job *j = &(*jobs)[(*n)++];
            j->line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            snprintf(j->where, sizeof j->where, "%s:%d", path, lineno);
        }
        json_decref(o);
    }
    if (!rc && ferror(fp)) rc = tool_fail("%s: cannot read: %s", path, strerror(errno));
    free(line);
    fclose(fp);
    return rc;
}

/* The settings of --config. */
typedef struct plan_args {
    const char *config, *quant, *batch, *k0, *mode;
    mj_parallel par;
    int n_ranks, shared, dry_run;
    mj_backend backend; /* cuda (cubins, the default) or sim (the interpreter's objects) */
} plan_args;

static void add_job(job **jobs, int *n, int *cap, char *line, const char *where) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *jobs = realloc(*jobs, sizeof **jobs * (size_t)*cap);
    }
    job *j = &(*jobs)[(*n)++];
    j->line = line;
    snprintf(j->where, sizeof j->where, "%s", where);
}

/* The plan of a model config for one target, as jobs (manifest lines). */
static int plan_jobs(const plan_args *a, const char *arch, const char *cache_dir, job **jobs, int *n, int *cap) {
    mj_moe_config cfg;
    mj_status st;
    int32_t nb = 0, rc = tool_config_read(a->config, a->quant, &cfg);
    if (rc) return rc;
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = cache_dir, o.device = MJ_DEVICE_NONE, o.backend = a->backend, o.target = arch, o.strict = 0;
    mj_context_t ctx = NULL;
    if ((st = mj_context_create(&o, &ctx)) != MJ_OK) return tool_fail_status("creating the JIT context", st);
    mj_plan plan = {0, NULL};
    const mj_target t = mj_context_target(ctx);
    if ((rc = tool_plan_build("prewarm", ctx, &cfg, a->par, a->n_ranks, a->shared, a->batch, a->k0, a->mode, a->config,
                              &plan, &nb)))
        goto out;
    for (int32_t i = 0; i < plan.n; i++) {
        char *line = NULL, where[300];
        if ((st = mj_spec_to_json(&plan.e[i].spec, &line)) != MJ_OK) {
            rc = tool_fail_status("the plan", st);
            goto out;
        }
        snprintf(where, sizeof where, "%s: %s, batch %d..%d", a->config, plan.e[i].what, (int)plan.e[i].b_lo,
                 (int)plan.e[i].b_hi);
        if (a->dry_run) {
            printf("%s\n", line);
            free(line);
        } else {
            add_job(jobs, n, cap, line, where);
        }
    }
    fprintf(stderr, "plan for %s%s: H %d, E %d, top-%d, %s, %d batch sizes (%s), k0 %s, mode %s: %d specializations\n",
            arch, a->backend == MJ_BACKEND_SIM ? " (interpreter)" : "", cfg.hidden, cfg.n_experts, cfg.topk,
            a->par == MJ_PAR_TP ? "TP" : a->par == MJ_PAR_EP ? "EP" : "one rank", (int)nb, a->batch,
            a->k0 ? a->k0 : "= top-k", a->mode ? a->mode : mj_mode_policy_default(t), (int)plan.n);
out:
    mj_plan_free(&plan);
    mj_context_destroy(ctx);
    return rc;
}

int cmd_prewarm(int argc, char **argv) {
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "prewarm", .usage = k_usage, .opts = k_opts, .sh = &so};
    plan_args pa = {NULL, NULL, "1-256", NULL, NULL, MJ_PAR_NONE, 1, 1, 0, MJ_BACKEND_CUDA};
    int backend_given = 0;
    int jobs_n = 0 /* -j not given: the context's compile threads */, c, cli_rc;
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case 'j': if (tool_parse_int("prewarm", "-j", optarg, 1, 256, &jobs_n)) return 2; break;
        case OPT_NOSHARED: pa.shared = 0; break;
        case OPT_DRY: pa.dry_run = 1; break;
        case OPT_BACKEND:
            if (!strcmp(optarg, "cuda")) pa.backend = MJ_BACKEND_CUDA;
            else if (!strcmp(optarg, "sim")) pa.backend = MJ_BACKEND_SIM;
            else return tool_usage("prewarm", "--backend: '%s': use cuda (GPU kernels, the default) or sim (the "
                                              "interpreter, for 'moejit run --backend sim')", optarg);
            backend_given = 1;
            break;
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    pa.config = so.config, pa.quant = so.quant, pa.par = so.par, pa.n_ranks = so.n_ranks;
    if (so.batch) pa.batch = so.batch;
    pa.k0 = so.k0_policy, pa.mode = so.mode;
    const char **archs = so.arch;
    int n_archs = so.n_arch;
    const int quiet = so.quiet;
    const char *cache_dir = so.cache_dir;
    if (pa.config && optind < argc)
        return tool_usage("prewarm", "give MANIFEST files or --config, not both");
    if (!pa.config && (pa.quant || pa.par != MJ_PAR_NONE || pa.k0 || pa.mode || !pa.shared || pa.dry_run ||
                       backend_given || strcmp(pa.batch, "1-256")))
        return tool_usage("prewarm", "--quant, --tp, --ep, --batch, --k0-policy, --mode, --no-shared-expert, "
                                     "--backend and --dry-run go with --config (a manifest line names its "
                                     "backend: \"backend\": \"sim\")");
    if (!pa.config && optind >= argc) return tool_usage("prewarm", "expected one or more MANIFEST files, or --config");

    work w;
    memset(&w, 0, sizeof w);
    int cap = 0, rc = 0;
    for (int i = optind; i < argc && !rc; i++) rc = read_manifest(argv[i], archs, n_archs, &w.jobs, &w.n, &cap);
    if (pa.config) {
        if (!n_archs) archs[n_archs++] = mj_target_name(MJ_DEFAULT_TARGET);
        for (int a = 0; a < n_archs && !rc; a++) rc = plan_jobs(&pa, archs[a], cache_dir, &w.jobs, &w.n, &cap);
        if (pa.dry_run) goto done;
    }
    if (rc) goto done;
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = cache_dir;
    o.device = MJ_DEVICE_NONE;
    o.strict = 0;
    mj_status st = mj_context_create(&o, &w.ctx);
    if (st != MJ_OK) {
        rc = tool_fail_status("creating the JIT context", st);
        goto done;
    }
    /* Filling the cache is the whole job: a cache that cannot be written (not a directory,
     * not creatable, unsafe, read-only) fails here, before anything is compiled. */
    mj_cache *cache = mj_context_cache(w.ctx);
    if (!mj_cache_writable(cache)) {
        rc = tool_fail("nothing was compiled: %s (prewarm needs a cache it can write: fix it or "
                       "pass another --cache-dir)", mj_cache_problem(cache));
        mj_context_destroy(w.ctx);
        goto done;
    }
    w.tty = isatty(2);
    w.quiet = quiet;
    pthread_mutex_init(&w.out_mu, NULL);
    w.t0 = now_s();
    if (jobs_n == 0) jobs_n = mj_jit_compile_threads(w.ctx);
    if (jobs_n > w.n) jobs_n = w.n ? w.n : 1;
    pthread_t th[256];
    int started = 0, err = 0;
    while (started < jobs_n && (err = start_worker(&th[started], started, &w)) == 0) started++;
    if (started < jobs_n) {
        /* Fewer threads than asked for (a thread limit): say so, and let this thread work
         * the queue too, so every job is still done. Only started threads are joined. */
        pthread_mutex_lock(&w.out_mu);
        fprintf(stderr, "moejit: warning: could start only %d of %d worker threads (%s); "
                "compiling on %d\n", started, jobs_n, strerror(err), started + 1);
        pthread_mutex_unlock(&w.out_mu);
        worker(&w);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (w.tty && !quiet) fprintf(stderr, "\r\033[K");
    /* A kernel compiled but not written to the disk (full disk, a directory that became
     * read-only...) is a failure here: filling the cache is what prewarm is for. */
    mj_jit_stats js;
    long long not_stored = mj_context_stats(w.ctx, &js) == MJ_OK ? (long long)js.store_failures : 0;
    printf("prewarm: %d specializations: %d compiled, %d already cached, %d failed, %lld not stored, "
           "%.1f s\n", w.n, (int)w.compiled, (int)w.cached, (int)w.failed, not_stored, now_s() - w.t0);
    fflush(stdout);
    rc = w.failed ? 1 : 0;
    if (not_stored)
        rc = tool_fail("%lld of the %d compiled kernels could not be stored in the cache %s (see the "
                       "warning above), so they would be compiled again at run time: make room or "
                       "fix the directory, then run prewarm again",
                       not_stored, (int)w.compiled, mj_cache_dir(cache));
    mj_context_destroy(w.ctx);
done:
    for (int i = 0; i < w.n; i++) free(w.jobs[i].line);
    free(w.jobs);
    return rc;
}
