/* cmd_prewarm.c — `moejit prewarm`: compile a list of specializations into the cache, so
 * that no request ever waits for a compile. Works with no GPU: NVRTC needs none. */
#include "tools.h"

#include "cache.h"
#include "jit.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char k_help[] =
    "usage: moejit prewarm [options] MANIFEST...\n"
    "\n"
    "Compile every specialization a manifest lists into the kernel cache. A manifest has one\n"
    "JSON object a line: {\"template\": \"router_gemm\", \"knobs\": {\"H\": 6144, \"E\": 256, \"ROWS\": 8, \"NWARPS\": 4},\n"
    "\"arch\": \"sm_120a\"} (blank lines and lines starting with # are skipped). A server run\n"
    "with MOEJIT_RECORD=path writes such a manifest of every kernel it had to compile. No GPU\n"
    "is needed. Exit status 1 if any specialization failed or could not be stored in the cache.\n"
    "\n"
    "options:\n"
    "  --arch A         compile each line for target A instead of its own \"arch\"\n"
    "                   (repeatable: sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a)\n"
    "  -j N             parallel compiles (default: the number of CPUs)\n"
    "  --cache-dir D    the cache directory (default $MOEJIT_CACHE_DIR, $XDG_CACHE_HOME/moejit,\n"
    "                   ~/.cache/moejit)\n"
    "  -q, --quiet      only the summary\n"
    "  -h, --help       this text\n"
    "  -V, --version    print the version\n";

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

int cmd_prewarm(int argc, char **argv) {
    enum { OPT_ARCH = 256, OPT_CACHE };
    static const struct option opts[] = {
        {"arch", required_argument, 0, OPT_ARCH}, {"cache-dir", required_argument, 0, OPT_CACHE},
        {"quiet", no_argument, 0, 'q'},           {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},         {0, 0, 0, 0}};
    const char *archs[MJ_TARGET_COUNT * 4];
    int n_archs = 0, jobs_n = (int)sysconf(_SC_NPROCESSORS_ONLN), quiet = 0, c;
    const char *cache_dir = NULL;
    if (jobs_n < 1) jobs_n = 1;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "j:qhV", opts, NULL)) != -1) {
        switch (c) {
        case OPT_ARCH: {
            mj_target t;
            if (mj_target_parse(optarg, &t) != MJ_OK)
                return tool_usage("prewarm", "--arch: %s", mj_last_error());
            if (n_archs == (int)(sizeof archs / sizeof *archs)) return tool_usage("prewarm", "too many --arch");
            archs[n_archs++] = mj_target_name(t);
            break;
        }
        case 'j': if (tool_parse_int("prewarm", "-j", optarg, 1, 256, &jobs_n)) return 2; break;
        case OPT_CACHE: cache_dir = optarg; break;
        case 'q': quiet = 1; break;
        case 'h': fputs(k_help, stdout); return 0;
        case 'V': printf("moejit %s\n", MJ_VERSION_STRING); return 0;
        default: return tool_usage("prewarm", "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) return tool_usage("prewarm", "expected one or more MANIFEST files");

    work w;
    memset(&w, 0, sizeof w);
    int cap = 0, rc = 0;
    for (int i = optind; i < argc && !rc; i++) rc = read_manifest(argv[i], archs, n_archs, &w.jobs, &w.n, &cap);
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
