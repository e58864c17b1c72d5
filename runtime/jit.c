/* jit.c — the context: specialization -> function, through memory, disk and NVRTC.
 *
 *   mj_jit_get(spec)
 *     1. memory: hash the spec's integers, look in the table under a read lock. Done.
 *     2. otherwise one thread builds it (others wanting the same spec wait for it):
 *        render -> key text -> SHA-256 -> disk lookup (verified) -> hit: done.
 *        miss: strict mode? error naming the key. Else take the key's file lock, look again
 *        (another process may have just written it), compile with NVRTC, store, unlock.
 *     3. with a device, load the cubin and look up each kernel of the template.
 * A failure that the same inputs would repeat (a compile error, a target NVRTC lacks) is
 * remembered, so a bad spec is not recompiled on every call. Anything else — a strict-mode
 * miss (the cache may be prewarmed meanwhile), a missing library, an I/O or driver error,
 * out of memory — is not: the next call tries again.
 *
 * The sim backend (runtime/sim/) goes the same way with the host C compiler in place of
 * NVRTC and a shared object in place of the cubin; a sim function is always loaded (no
 * device needed) and its launches run on the CPU, synchronously, on host pointers.
 */
#include "jit.h"

#include "cache.h"
#include "sim/sim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { FN_BUILDING = 0, FN_READY = 1, FN_FAILED = 2, FN_RETRY = 3 };

struct mj_function {
    mj_spec spec;
    mj_context_t ctx;                 /* the context that owns it                            */
    _Atomic int state;
    mj_status fail_status;
    char *fail_message;
    char key_hex[MJ_KEY_HEX_LEN + 1];
    mj_cache_entry entry;             /* binary, ptx, log, source, meta                    */
    mj_ptxas_report report;
    int from_disk;
    mj_cuda_module *module;           /* NULL in a compile-only context                    */
    mj_sim_module *sim;               /* the loaded object of a sim function               */
    mj_cuda_function fns[MJ_MAX_KERNELS]; /* per kernel of the template                    */
    _Atomic uint32_t smem_max[MJ_MAX_KERNELS]; /* dynamic shared memory allowed so far (bytes) */
    int n_fns;
    int pdl;                          /* launched as programmatic dependents (set at load:
                                         an MJ_PDL template, sm_90+, the context allows it)  */
};

/* The in-memory table is read without locks: a table is an array of slots published
 * through an atomic pointer; a slot's fn pointer is written once (release) after the slot's
 * hash. Growing copies into a new table and publishes it; old tables are retired, not freed,
 * until the context goes (a reader may still be probing one). Writers hold build_mu. */
typedef struct slot {
    uint64_t hash;
    _Atomic(mj_function *) fn;        /* NULL: empty                                        */
} slot;

typedef struct table {
    size_t n_slots;                   /* a power of two                                     */
    struct table *retired;            /* the table this one replaced                        */
    slot slots[];
} table;

struct mj_context {
    mj_cache *cache;
    int strict;
    int device;                       /* ordinal or MJ_DEVICE_NONE                          */
    int32_t max_blocks;               /* grid cap of grid-stride kernels                    */
    int compile_threads;              /* builds mj_jit_get_many runs at once                */
    int pdl;                          /* MJ_PDL templates launch as programmatic dependents
                                         (sm_90+; MOEJIT_PDL=0 turns it off)                 */
    _Atomic int pool_busy, pool_peak; /* its workers building now, and the most at once     */
    mj_device_info dev;
    mj_backend backend;               /* what mj_context_spec fills in                      */
    mj_target target;
    char *record_path;
    _Atomic(table *) table;
    size_t n_used;
    pthread_mutex_t build_mu;
    pthread_cond_t build_cv;
    mj_sim_graph *capture;            /* sim launches being recorded instead of run          */
    _Atomic int64_t mem_hits, mem_misses, compiles, compile_failures, strict_misses;
    _Atomic int64_t compile_us;
};

/* ---- the in-memory table: open addressing over a hash of the spec's integers -------- */

static uint64_t spec_hash(const mj_spec *s) {
    /* FNV-1a over the fields, then a final mix; integers only. */
    uint64_t h = 0xcbf29ce484222325ull;
    const int32_t head[3] = {s->tpl, (int32_t)s->target, (int32_t)s->backend};
    for (int i = 0; i < 3; i++) h = (h ^ (uint32_t)head[i]) * 0x100000001b3ull;
    for (int i = 0; i < MJ_MAX_KNOBS; i++) h = (h ^ (uint32_t)s->knobs[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* Lock-free: any thread, any time. */
static mj_function *table_find(const mj_context_t c, const mj_spec *s, uint64_t h) {
    table *t = atomic_load_explicit(&c->table, memory_order_acquire);
    if (!t) return NULL;
    for (size_t i = h & (t->n_slots - 1);; i = (i + 1) & (t->n_slots - 1)) {
        mj_function *f = atomic_load_explicit(&t->slots[i].fn, memory_order_acquire);
        if (!f) return NULL;
        if (t->slots[i].hash == h && mj_spec_equal(&f->spec, s)) return f;
    }
}

/* The launch path's lookup: the function when it is built and ready, else NULL. */
static mj_function *find_ready(const mj_context_t c, const mj_spec *s, uint64_t h) {
    mj_function *f = table_find(c, s, h);
    return f && atomic_load_explicit(&f->state, memory_order_acquire) == FN_READY ? f : NULL;
}

static table *table_new(size_t n) {
    table *t = calloc(1, sizeof *t + n * sizeof(slot));
    if (t) t->n_slots = n;
    return t;
}

static void table_put(table *t, mj_function *fn, uint64_t h) {
    size_t j = h & (t->n_slots - 1);
    while (atomic_load_explicit(&t->slots[j].fn, memory_order_relaxed)) j = (j + 1) & (t->n_slots - 1);
    t->slots[j].hash = h;
    atomic_store_explicit(&t->slots[j].fn, fn, memory_order_release);
}

/* Caller holds build_mu (the one writer). */
static mj_status table_insert(mj_context_t c, mj_function *fn, uint64_t h) {
    table *t = atomic_load_explicit(&c->table, memory_order_relaxed);
    if (!t || (c->n_used + 1) * 2 > t->n_slots) {
        table *g = table_new(t ? t->n_slots * 2 : 256);
        if (!g) return mj_set_error(MJ_ERR_NOMEM, "out of memory growing the kernel table");
        for (size_t i = 0; t && i < t->n_slots; i++) {
            mj_function *f = atomic_load_explicit(&t->slots[i].fn, memory_order_relaxed);
            if (f) table_put(g, f, t->slots[i].hash);
        }
        g->retired = t;
        atomic_store_explicit(&c->table, g, memory_order_release);
        t = g;
    }
    table_put(t, fn, h);
    c->n_used++;
    return MJ_OK;
}

/* ---- context ------------------------------------------------------------------------- */

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

mj_status mj_context_create(const mj_context_options *opts, mj_context_t *out) {
    mj_context_options def = MJ_CONTEXT_OPTIONS_INIT;
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_context_create: NULL output");
    if (!opts) opts = &def;
    if (opts->struct_size != sizeof(mj_context_options))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_context_options.struct_size is %u, expected %zu: initialize it "
                            "with MJ_CONTEXT_OPTIONS_INIT",
                            opts->struct_size, sizeof(mj_context_options));
    if (opts->backend != MJ_BACKEND_AUTO && opts->backend != MJ_BACKEND_CUDA &&
        opts->backend != MJ_BACKEND_SIM)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_context_options.backend is %d: use MJ_BACKEND_CUDA, MJ_BACKEND_SIM "
                            "or MJ_BACKEND_AUTO", opts->backend);
    mj_target want_target = MJ_DEFAULT_TARGET;
    if (opts->target) {
        mj_status ts = mj_target_parse(opts->target, &want_target);
        if (ts != MJ_OK) return mj_error_prefix(ts, "mj_context_options.target");
    }
    mj_context_t c = calloc(1, sizeof *c);
    if (!c) return mj_set_error(MJ_ERR_NOMEM, "out of memory creating a context");
    mj_status st = MJ_OK;
    pthread_mutex_init(&c->build_mu, NULL);
    pthread_cond_init(&c->build_cv, NULL);
    c->strict = opts->strict < 0 ? env_flag("MOEJIT_STRICT") : opts->strict != 0;
    int bad_threads = 0;
    c->compile_threads = (int)mj_env_long("MOEJIT_COMPILE_THREADS", 1, 256, mj_cpu_count(), &bad_threads);
    if (c->compile_threads > 256) c->compile_threads = 256;
    if (bad_threads)
        mj_warn("MOEJIT_COMPILE_THREADS=\"%.64s\" is not a thread count (1..256): compiling %d at a time "
                "(the CPUs this process may use)",
                getenv("MOEJIT_COMPILE_THREADS"), c->compile_threads);
    int bad_pdl = 0;
    c->pdl = (int)mj_env_long("MOEJIT_PDL", 0, 1, 1, &bad_pdl);
    if (bad_pdl)
        mj_warn("MOEJIT_PDL=\"%.64s\" is neither 0 nor 1: programmatic dependent launch stays on (sm_90+)",
                getenv("MOEJIT_PDL"));
    c->device = MJ_DEVICE_NONE;
    const char *rec = getenv("MOEJIT_RECORD");
    if (rec && *rec && !(c->record_path = strdup(rec))) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory");
        goto fail;
    }
    MJ_CHECK_GOTO(mj_cache_open(opts->cache_dir, opts->cache_max_bytes, &c->cache), st, fail);
    /* A sim context looks for a GPU only when one is asked for by ordinal. */
    if (opts->device >= 0 || (opts->device == MJ_DEVICE_AUTO && opts->backend != MJ_BACKEND_SIM)) {
        int ordinal = opts->device >= 0 ? opts->device : 0;
        mj_status ds = mj_cuda_load();
        if (ds == MJ_OK) ds = mj_cuda_device_info(ordinal, &c->dev);
        if (ds == MJ_OK) c->device = ordinal;
        else if (opts->device >= 0) {
            st = ds;
            goto fail;
        }
        mj_clear_error();
    }
    c->backend = opts->backend == MJ_BACKEND_AUTO
                     ? (c->device != MJ_DEVICE_NONE ? MJ_BACKEND_CUDA : MJ_BACKEND_SIM)
                     : (mj_backend)opts->backend;
    c->target = opts->target ? want_target : c->device != MJ_DEVICE_NONE ? c->dev.target : MJ_DEFAULT_TARGET;
    /* Grid-stride kernels: enough blocks to fill the GPU several times over; on the
     * interpreter, a few per worker (each block costs a fiber set-up). */
    c->max_blocks = c->backend == MJ_BACKEND_SIM ? 64
                    : c->device != MJ_DEVICE_NONE ? 8 * (c->dev.sm_count > 0 ? c->dev.sm_count : 16)
                                                  : 65535;
    *out = c;
    return MJ_OK;
fail:
    mj_context_destroy(c);
    return st;
}

/* Whether a failed build would fail the same way again (then it is remembered). */
static int failure_is_final(mj_status st) {
    return st == MJ_ERR_COMPILE || st == MJ_ERR_INVALID_ARG || st == MJ_ERR_UNSUPPORTED;
}

/* Drop what a failed build left in f, so the next try starts clean. */
static void function_reset(mj_function *f) {
    if (f->module) mj_cuda_module_unload(f->module);
    mj_sim_module_unload(f->sim);
    mj_cache_entry_free(&f->entry);
    memset(&f->entry, 0, sizeof f->entry);
    f->module = NULL, f->sim = NULL, f->n_fns = 0, f->from_disk = 0, f->pdl = 0;
    memset(f->fns, 0, sizeof f->fns);
    memset(&f->report, 0, sizeof f->report);
}

static void function_free(mj_function *f) {
    if (!f) return;
    if (f->module) mj_cuda_module_unload(f->module);
    mj_sim_module_unload(f->sim);
    mj_cache_entry_free(&f->entry);
    free(f->fail_message);
    free(f);
}

/* Add this context's counters to the cache directory's running totals (best effort). */
static void stats_persist(mj_context_t c) {
    mj_jit_stats s;
    if (!c->cache || mj_context_stats(c, &s) != MJ_OK) return;
    const double v[MJ_CACHE_N_TOTALS] = {
        (double)s.mem_hits, (double)s.mem_misses, (double)s.disk_hits, (double)s.disk_misses,
        (double)s.compiles, (double)s.compile_failures, s.compile_ms, (double)s.quarantined,
        (double)s.lock_waits, (double)s.evicted, (double)s.strict_misses, (double)s.refused_unsafe,
        (double)s.store_failures};
    mj_cache_add_totals(c->cache, v);
}

mj_status mj_context_destroy(mj_context_t c) {
    if (!c) return MJ_OK;
    stats_persist(c);
    table *t = atomic_load(&c->table);
    for (size_t i = 0; t && i < t->n_slots; i++) function_free(atomic_load(&t->slots[i].fn));
    while (t) {
        table *r = t->retired;
        free(t);
        t = r;
    }
    mj_cache_close(c->cache);
    mj_sim_graph_free(c->capture);
    free(c->record_path);
    pthread_mutex_destroy(&c->build_mu);
    pthread_cond_destroy(&c->build_cv);
    free(c);
    return MJ_OK;
}

mj_status mj_context_stats(mj_context_t c, mj_jit_stats *out) {
    if (!c || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_context_stats: NULL argument");
    mj_cache_stats cs;
    mj_cache_get_stats(c->cache, &cs);
    memset(out, 0, sizeof *out);
    out->mem_hits = c->mem_hits;
    out->mem_misses = c->mem_misses;
    out->disk_hits = cs.disk_hits;
    out->disk_misses = cs.disk_misses;
    out->compiles = c->compiles;
    out->compile_failures = c->compile_failures;
    out->compile_ms = (double)c->compile_us / 1000.0;
    out->quarantined = cs.quarantined;
    out->lock_waits = cs.lock_waits;
    out->evicted = cs.evicted;
    out->strict_misses = c->strict_misses;
    out->refused_unsafe = cs.refused_unsafe;
    out->store_failures = cs.store_failures;
    return MJ_OK;
}

mj_cache *mj_context_cache(mj_context_t c) { return c ? c->cache : NULL; }

/* ---- the disk key ------------------------------------------------------------------- */

static const char *backend_name(mj_backend b) { return b == MJ_BACKEND_SIM ? "sim" : "cuda"; }

mj_status mj_key_text(const mj_spec *s, const char *source, size_t len, const char *compiler,
                      const char *options, char **text) {
    if (!s || !source || !compiler || !options || !text || !mj_template_at(s->tpl))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_key_text: NULL or invalid argument");
    (void)len;
    char src_hash[MJ_KEY_HEX_LEN + 1];
    mj_key_hash(source, src_hash);
    char *b = NULL;
    if (asprintf(&b, "moejit cache key\nformat %d\nbackend %s\ntarget %s\ncompiler %s\noptions %s\n"
                     "template %s\nsource-sha256 %s\n",
                 MJ_CACHE_FORMAT, backend_name(s->backend), mj_target_name(s->target), compiler, options,
                 mj_template_at(s->tpl)->name, src_hash) < 0)
        return mj_set_error(MJ_ERR_NOMEM, "out of memory building a key");
    *text = b;
    return MJ_OK;
}

/* ---- building one function ------------------------------------------------------------ */

static char *meta_json(const mj_spec *s, const char *compiler, const char *options,
                       const mj_compile_result *r) {
    const mj_template_desc *t = mj_template_at(s->tpl);
    json_t *o = json_object(), *k = json_object(), *p = json_object(), *ks = json_array();
    json_object_set_new(o, "template", json_string(t->name));
    for (int32_t i = 0; i < t->n_knobs; i++) json_object_set_new(k, t->knobs[i].name, json_integer(s->knobs[i]));
    json_object_set_new(o, "knobs", k);
    json_object_set_new(o, "arch", json_string(mj_target_name(s->target)));
    json_object_set_new(o, "backend", json_string(s->backend == MJ_BACKEND_SIM ? "sim" : "cuda"));
    json_object_set_new(o, "compiler", json_string(compiler));
    json_object_set_new(o, "options", json_string(options));
    json_object_set_new(o, "moejit", json_string(MJ_VERSION_STRING));
    json_object_set_new(o, "compile_ms", json_real(r->compile_ms));
    json_object_set_new(o, "created_unix", json_integer((json_int_t)time(NULL)));
    json_object_set_new(p, "registers", json_integer(r->report.registers));
    json_object_set_new(p, "spill_stores", json_integer(r->report.spill_stores));
    json_object_set_new(p, "spill_loads", json_integer(r->report.spill_loads));
    json_object_set_new(p, "stack_frame", json_integer(r->report.stack_frame));
    json_object_set_new(p, "smem_static", json_integer(r->report.smem_static));
    json_object_set_new(p, "cmem0", json_integer(r->report.cmem0));
    json_object_set_new(p, "functions", json_integer(r->report.n_functions));
    json_object_set_new(o, "ptxas", p);
    for (int32_t i = 0; i < t->n_kernels; i++) json_array_append_new(ks, json_string(t->kernels[i].name));
    json_object_set_new(o, "kernels", ks);
    char *txt = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    return txt;
}

/* The ptxas numbers back from an entry's metadata (a disk hit). */
static void report_from_meta(const char *meta, mj_ptxas_report *r) {
    memset(r, 0, sizeof *r);
    json_t *o = json_loads(meta, 0, NULL), *p = o ? json_object_get(o, "ptxas") : NULL;
    if (p) {
        r->registers = (int32_t)json_integer_value(json_object_get(p, "registers"));
        r->spill_stores = (int32_t)json_integer_value(json_object_get(p, "spill_stores"));
        r->spill_loads = (int32_t)json_integer_value(json_object_get(p, "spill_loads"));
        r->stack_frame = (int32_t)json_integer_value(json_object_get(p, "stack_frame"));
        r->smem_static = (int32_t)json_integer_value(json_object_get(p, "smem_static"));
        r->cmem0 = (int32_t)json_integer_value(json_object_get(p, "cmem0"));
        r->n_functions = (int32_t)json_integer_value(json_object_get(p, "functions"));
    }
    json_decref(o);
}

/* Append the spec to $MOEJIT_RECORD as one manifest line (one write: atomic with O_APPEND). */
static void record_miss(mj_context_t c, const mj_spec *s) {
    if (!c->record_path) return;
    char *line = NULL;
    if (mj_spec_to_json(s, &line) != MJ_OK) return;
    size_t n = strlen(line);
    char *buf = malloc(n + 2);
    if (buf) {
        memcpy(buf, line, n);
        buf[n] = '\n';
        int fd = open(c->record_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, buf, n + 1);
            (void)w;
            close(fd);
        }
    }
    free(buf);
    free(line);
}

static mj_status compile_entry(mj_context_t c, const mj_spec *s, char *source, char *key_text,
                               const char *compiler, const char *options, mj_function *f) {
    mj_compile_result r;
    memset(&r, 0, sizeof r);
    char desc[512];
    mj_spec_describe(s, desc, sizeof desc);
    mj_status st = s->backend == MJ_BACKEND_SIM ? mj_sim_compile(source, desc, &r)
                                                : mj_nvrtc_compile(source, desc, s->target, &r);
    if (st != MJ_OK) {
        c->compile_failures++;
        mj_compile_result_free(&r);
        return st;
    }
    c->compiles++;
    c->compile_us += (int64_t)(r.compile_ms * 1000.0);
    f->report = r.report;
    f->entry.key_text = key_text;
    f->entry.meta_json = meta_json(s, compiler, options, &r);
    f->entry.binary = r.cubin, f->entry.binary_len = r.cubin_len;
    f->entry.ptx = r.ptx, f->entry.ptx_len = r.ptx_len;
    f->entry.log = r.log;
    f->entry.source = source;
    if (!f->entry.meta_json) return mj_set_error(MJ_ERR_NOMEM, "out of memory writing metadata");
    /* A store that fails (disk full...) still leaves a usable kernel in memory; the cache
     * counts it (mj_jit_stats.store_failures) and warns once. */
    if (mj_cache_store(c->cache, f->key_hex, &f->entry) != MJ_OK) mj_clear_error();
    return MJ_OK;
}

static mj_status build(mj_context_t c, mj_function *f) {
    const mj_spec *s = &f->spec;
    char *source = NULL, *key_text = NULL;
    int lock_fd = -1, waited = 0, found = 0;
    mj_status st;
    MJ_CHECK_GOTO(mj_render(s, &source, NULL), st, exit);
    char compiler[640];
    const char *options;
    if (s->backend == MJ_BACKEND_SIM) {
        const char *version;
        MJ_CHECK_GOTO(mj_sim_compiler(&version), st, exit);
        snprintf(compiler, sizeof compiler, "%s", version);
        options = mj_sim_options();
    } else {
        MJ_CHECK_GOTO(mj_nvrtc_load(), st, exit);
        int vmaj, vmin;
        MJ_CHECK_GOTO(mj_nvrtc_version(&vmaj, &vmin), st, exit);
        int supported = 0;
        MJ_CHECK_GOTO(mj_nvrtc_supports(s->target, &supported), st, exit);
        if (!supported) {
            st = mj_set_error(MJ_ERR_UNSUPPORTED,
                              "NVRTC %d.%d cannot compile for %s (not in nvrtcGetSupportedArchs); use a "
                              "CUDA toolkit that supports it, or another --arch",
                              vmaj, vmin, mj_target_name(s->target));
            goto exit;
        }
        snprintf(compiler, sizeof compiler, "nvrtc %d.%d", vmaj, vmin);
        options = mj_nvrtc_options(s->target);
    }
    MJ_CHECK_GOTO(mj_key_text(s, source, strlen(source), compiler, options, &key_text), st, exit);
    mj_key_hash(key_text, f->key_hex);

    MJ_CHECK_GOTO(mj_cache_lookup(c->cache, f->key_hex, key_text, &f->entry, &found), st, exit);
    if (!found && c->strict) {
        char desc[512];
        mj_spec_describe(s, desc, sizeof desc);
        c->strict_misses++;
        record_miss(c, s);
        st = mj_set_error(MJ_ERR_CACHE_MISS,
                          "strict mode: %s (key %.16s) is not in the cache %s; run 'moejit prewarm' "
                          "for it, or unset MOEJIT_STRICT",
                          desc, f->key_hex, mj_cache_dir(c->cache));
        goto exit;
    }
    if (!found) {
        MJ_CHECK_GOTO(mj_cache_lock(c->cache, f->key_hex, &lock_fd, &waited), st, exit);
        /* Someone may have compiled it while we waited for the lock. */
        MJ_CHECK_GOTO(mj_cache_lookup(c->cache, f->key_hex, key_text, &f->entry, &found), st, exit);
    }
    if (found) {
        f->from_disk = 1;
        report_from_meta(f->entry.meta_json, &f->report);
    } else {
        record_miss(c, s);
        st = compile_entry(c, s, source, key_text, compiler, options, f);
        if (st == MJ_OK) source = key_text = NULL; /* owned by f->entry now */
        if (st != MJ_OK) goto exit;
    }
    if (s->backend == MJ_BACKEND_SIM) {
        MJ_CHECK_GOTO(mj_sim_module_load(f->entry.binary, f->entry.binary_len, mj_template_at(s->tpl),
                                         &f->sim), st, exit);
    } else if (c->device != MJ_DEVICE_NONE) {
        const mj_template_desc *t = mj_template_at(s->tpl);
        MJ_CHECK_GOTO(mj_cuda_module_load(c->device, f->entry.binary, f->entry.binary_len, &f->module),
                      st, exit);
        f->n_fns = t->n_kernels;
        /* A template whose kernels all wait on the grid before them (MJ_PDL, checked by
         * gen/reflect) launches as a programmatic dependent on sm_90+: its blocks are
         * scheduled while the kernel before it finishes, instead of after. */
        f->pdl = c->pdl && t->pdl && mj_target_sm(s->target) >= 90;
        for (int i = 0; i < f->n_fns; i++)
            MJ_CHECK_GOTO(mj_cuda_module_function(f->module, t->kernels[i].name, &f->fns[i]), st, exit);
    }
    st = MJ_OK;
exit:
    if (lock_fd >= 0) mj_cache_unlock(lock_fd);
    free(source);
    free(key_text);
    return st;
}

mj_status mj_jit_get(mj_context_t c, const mj_spec *s, const mj_function **out) {
    if (!c || !s || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_jit_get: NULL argument");
    uint64_t h = spec_hash(s);
    mj_function *f = find_ready(c, s, h);
    if (f) {
        atomic_fetch_add_explicit(&c->mem_hits, 1, memory_order_relaxed);
        *out = f;
        return MJ_OK;
    }
    MJ_CHECK(mj_spec_validate(s));

    /* Slow path: insert a placeholder so one thread builds and the others wait for it. */
    pthread_mutex_lock(&c->build_mu);
    f = table_find(c, s, h);
    int builder = 0;
    mj_status st = MJ_OK;
    if (!f) {
        f = calloc(1, sizeof *f);
        if (!f) st = mj_set_error(MJ_ERR_NOMEM, "out of memory");
        else {
            f->spec = *s;
            f->ctx = c;
            f->state = FN_BUILDING;
            if ((st = table_insert(c, f, h)) != MJ_OK) free(f), f = NULL;
            else builder = 1;
        }
    } else if (f->state == FN_RETRY) { /* the last try failed in a way worth trying again */
        f->state = FN_BUILDING;
        builder = 1;
    }
    if (st != MJ_OK) {
        pthread_mutex_unlock(&c->build_mu);
        return st;
    }
    c->mem_misses++;
    if (builder) {
        pthread_mutex_unlock(&c->build_mu);
        st = build(c, f);
        pthread_mutex_lock(&c->build_mu);
        if (st == MJ_OK) atomic_store_explicit(&f->state, FN_READY, memory_order_release);
        else {
            f->fail_status = st;
            free(f->fail_message);
            f->fail_message = strdup(mj_last_error());
            if (failure_is_final(st)) {
                f->state = FN_FAILED;
            } else {
                function_reset(f);
                f->state = FN_RETRY;
            }
        }
        pthread_cond_broadcast(&c->build_cv);
    }
    while (f->state == FN_BUILDING) pthread_cond_wait(&c->build_cv, &c->build_mu);
    int state = f->state;
    mj_status fail = f->fail_status;
    if (state != FN_READY && !builder)
        mj_set_error(fail, "%s", f->fail_message ? f->fail_message : "build failed");
    pthread_mutex_unlock(&c->build_mu);
    if (state != FN_READY) return fail;
    *out = f;
    return MJ_OK;
}

/* ---- several specializations at once ------------------------------------------------------
 * A forward that launches several kernels, or a prepare that fetches a whole plan, would
 * wait for their compiles one after the other; here the ones not yet in memory are built by
 * a pool of compile_threads workers (the caller's thread one of them) that take the next
 * spec in order until none is left. The bound is per call: two threads that call at once on
 * one context may each run a pool. mj_jit_get already lets many threads build distinct
 * specs (each NVRTC program its own) and makes a second asker of the same spec wait for the
 * first. */
typedef struct get_job {
    const mj_spec *s;
    const mj_function *f;
    mj_status st;
    char err[4096]; /* the thread's mj_last_error (all of it), handed back to the caller's thread */
} get_job;

typedef struct get_pool {
    mj_context_t c;
    get_job *jobs; /* the specs not in memory, in order */
    int n;
    atomic_int next;
} get_pool;

static void *get_pool_run(void *arg) {
    get_pool *p = arg;
    for (int k; (k = atomic_fetch_add(&p->next, 1)) < p->n;) {
        get_job *j = &p->jobs[k];
        int busy = atomic_fetch_add(&p->c->pool_busy, 1) + 1, peak = atomic_load(&p->c->pool_peak);
        while (busy > peak && !atomic_compare_exchange_weak(&p->c->pool_peak, &peak, busy)) {}
        j->st = mj_jit_get(p->c, j->s, &j->f);
        atomic_fetch_sub(&p->c->pool_busy, 1);
        if (j->st != MJ_OK) snprintf(j->err, sizeof j->err, "%s", mj_last_error());
    }
    return NULL;
}

int mj_jit_compile_threads(mj_context_t c) { return c ? c->compile_threads : 0; }
int mj_jit_pool_peak(mj_context_t c) { return c ? atomic_load(&c->pool_peak) : 0; }

mj_status mj_jit_get_many(mj_context_t c, const mj_spec *s, int n, const mj_function **out) {
    if (!c || n < 0 || (n > 0 && (!s || !out)))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_jit_get_many: NULL argument or %d specs", n);
    int missing = 0;
    for (int i = 0; i < n; i++) { /* the hot path: all in memory, no thread */
        out[i] = find_ready(c, &s[i], spec_hash(&s[i]));
        missing += !out[i];
    }
    atomic_fetch_add_explicit(&c->mem_hits, (unsigned)(n - missing), memory_order_relaxed);
    if (missing == 0) return MJ_OK;
    int n_threads = missing < c->compile_threads ? missing : c->compile_threads;
    get_pool pool = {c, calloc((size_t)missing, sizeof(get_job)), missing, 0};
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    if (!pool.jobs || !th) {
        free(pool.jobs), free(th);
        return mj_set_error(MJ_ERR_NOMEM, "mj_jit_get_many: out of memory for %d builds", missing);
    }
    for (int i = 0, k = 0; i < n; i++)
        if (!out[i]) pool.jobs[k++].s = &s[i];
    int started = 0; /* workers besides this thread; fewer than asked is fine */
    while (started < n_threads - 1 && pthread_create(&th[started], NULL, get_pool_run, &pool) == 0) started++;
    get_pool_run(&pool);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    mj_status st = MJ_OK;
    for (int i = 0, k = 0; i < n; i++) {
        if (out[i]) continue;
        const get_job *j = &pool.jobs[k++];
        if (j->st != MJ_OK && st == MJ_OK) st = mj_set_error(j->st, "%s", j->err); /* the first in order */
        out[i] = j->f;
    }
    free(pool.jobs), free(th);
    return st;
}

/* ---- recorded launches on the interpreter (what a CUDA graph is to a GPU) ---------------
 * A launch is kept as its entry point, its dimensions and a copy of its argument values
 * (pointers by value, as a graph keeps them), to be run again as often as wanted. */
typedef struct recorded_launch {
    mj_sim_entry entry;
    const char *kernel;
    mj_launch_dims dims;
    int n_args;
    unsigned char values[MJ_MAX_PARAMS][16];
} recorded_launch;

struct mj_sim_graph {
    recorded_launch *launches;
    int n, cap;
};

static mj_status capture_launch(mj_sim_graph *g, mj_sim_entry entry, const mj_kernel_desc *k, mj_launch_dims d,
                                void **args) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        recorded_launch *v = realloc(g->launches, sizeof *v * (size_t)cap);
        if (!v) return mj_set_error(MJ_ERR_NOMEM, "out of memory recording a launch");
        g->launches = v, g->cap = cap;
    }
    recorded_launch *r = &g->launches[g->n++];
    memset(r, 0, sizeof *r);
    r->entry = entry, r->kernel = k->name, r->dims = d, r->n_args = k->n_params;
    for (int i = 0; i < k->n_params; i++) memcpy(r->values[i], args[i], (size_t)k->params[i].size);
    return MJ_OK;
}

mj_status mj_sim_capture_begin(mj_context_t c) {
    if (!c || c->backend != MJ_BACKEND_SIM)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_capture_begin: a sim context is needed");
    if (c->capture) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_capture_begin: already capturing");
    if (!(c->capture = calloc(1, sizeof *c->capture))) return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    return MJ_OK;
}

mj_status mj_sim_capture_end(mj_context_t c, mj_sim_graph **out) {
    if (!c || !out || !c->capture) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_capture_end: not capturing");
    *out = c->capture;
    c->capture = NULL;
    return MJ_OK;
}

int mj_sim_graph_launches(const mj_sim_graph *g) { return g ? g->n : 0; }

mj_status mj_sim_graph_replay(const mj_sim_graph *g) {
    if (!g) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_graph_replay: NULL graph");
    for (int i = 0; i < g->n; i++) {
        const recorded_launch *r = &g->launches[i];
        void *args[MJ_MAX_PARAMS];
        unsigned char values[MJ_MAX_PARAMS][16];
        memcpy(values, r->values, sizeof values); /* the kernel may not change the recording */
        for (int a = 0; a < r->n_args; a++) args[a] = values[a];
        MJ_CHECK(mj_sim_run(r->entry, r->kernel, r->dims.grid, r->dims.block, r->dims.smem, args));
    }
    return MJ_OK;
}

void mj_sim_graph_free(mj_sim_graph *g) {
    if (!g) return;
    free(g->launches);
    free(g);
}

const char *mj_function_key(const mj_function *f) { return f->key_hex; }
const mj_ptxas_report *mj_function_report(const mj_function *f) { return &f->report; }
const char *mj_function_source(const mj_function *f) { return f->entry.source; }
const void *mj_function_binary(const mj_function *f, size_t *len) {
    if (len) *len = f->entry.binary_len;
    return f->entry.binary;
}

mj_status mj_function_launch(const mj_function *fn, int tpl, int kernel, mj_launch_dims d,
                             void **args, int nargs) {
    if (!fn) return mj_set_error(MJ_ERR_INVALID_ARG, "launch: NULL function");
    const mj_template_desc *t = mj_template_at(fn->spec.tpl);
    if (fn->spec.tpl != tpl || kernel < 0 || kernel >= t->n_kernels || t->kernels[kernel].n_params != nargs)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "launch: this function is template %s, not the one the wrapper was made for",
                            t->name);
    if (d.smem > (uint32_t)mj_target_smem_max(fn->spec.target))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "launch of %s: %u bytes of dynamic shared memory; %s allows at most %d a block",
                            t->kernels[kernel].name, d.smem, mj_target_name(fn->spec.target),
                            mj_target_smem_max(fn->spec.target));
    if (fn->sim) {
        mj_sim_entry entry = mj_sim_module_entry(fn->sim, kernel);
        if (fn->ctx->capture) return capture_launch(fn->ctx->capture, entry, &t->kernels[kernel], d, args);
        return mj_sim_run(entry, t->kernels[kernel].name, d.grid, d.block, d.smem, args);
    }
    if (!fn->module)
        return mj_set_error(MJ_ERR_NO_DEVICE,
                            "launch of %s: this context has no device (compile-only); create it "
                            "with a CUDA device to run kernels", t->kernels[kernel].name);
    if (kernel >= fn->n_fns) return mj_set_error(MJ_ERR_INTERNAL, "kernel index %d not loaded", kernel);
    /* Above 48 KiB of dynamic shared memory a kernel must opt in, once per size it grows to
     * (not a stream operation: fine during graph capture). */
    _Atomic uint32_t *allowed = &((mj_function *)fn)->smem_max[kernel];
    if (d.smem > MJ_SMEM_DEFAULT_LIMIT && d.smem > atomic_load_explicit(allowed, memory_order_relaxed)) {
        MJ_CHECK(mj_cuda_set_max_dynamic_smem(fn->fns[kernel], (int)d.smem));
        atomic_store_explicit(allowed, d.smem, memory_order_relaxed);
    }
    return mj_cuda_launch_ex(fn->fns[kernel], d.grid, d.block, d.smem, d.stream, args, fn->pdl);
}

mj_status mj_prewarm_json(mj_context_t c, const char *line, int *was_cached) {
    if (!c || !line) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_prewarm_json: NULL argument");
    mj_spec s;
    MJ_CHECK(mj_spec_from_json(line, "manifest", &s));
    const mj_function *f;
    MJ_CHECK(mj_jit_get(c, &s, &f));
    if (was_cached) *was_cached = f->from_disk;
    return MJ_OK;
}

int32_t mj_context_max_blocks(mj_context_t c) { return c->max_blocks; }
mj_target mj_context_target(mj_context_t c) { return c->target; }
int mj_context_device(mj_context_t c, mj_device_info *info) {
    if (info && c->device != MJ_DEVICE_NONE) *info = c->dev;
    return c->device;
}

mj_status mj_context_backend(mj_context_t c, mj_backend *backend, const char **target) {
    if (!c) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_context_backend: NULL context");
    if (backend) *backend = c->backend;
    if (target) *target = mj_target_name(c->target);
    return MJ_OK;
}

/* The launch-path form: template by index, no string work and no validation here (the
 * table holds only validated specs; mj_jit_get validates on a miss). */
void mj_context_spec_fill(mj_context_t c, int32_t tpl, const int32_t *knobs, int32_t n_knobs, mj_spec *out) {
    memset(out, 0, sizeof *out);
    out->tpl = tpl;
    out->target = c->target;
    out->backend = c->backend;
    for (int32_t i = 0; i < n_knobs && i < MJ_MAX_KNOBS; i++) out->knobs[i] = knobs[i];
}

mj_status mj_context_spec(mj_context_t c, const char *template_name, const int32_t *knobs, mj_spec *out) {
    if (!c || !template_name || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_context_spec: NULL argument");
    int32_t tpl = -1;
    const mj_template_desc *t = mj_template_find(template_name, &tpl);
    if (!t)
        return mj_set_error(MJ_ERR_INVALID_ARG, "unknown template '%s' (see 'moejit inspect templates')",
                            template_name);
    if (t->n_knobs && !knobs)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_context_spec: template %s has %d knobs and knobs is NULL",
                            t->name, t->n_knobs);
    mj_spec s;
    mj_context_spec_fill(c, tpl, knobs, t->n_knobs, &s);
    MJ_CHECK(mj_spec_validate(&s));
    *out = s;
    return MJ_OK;
}
