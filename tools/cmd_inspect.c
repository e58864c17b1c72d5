/* cmd_inspect.c — `moejit inspect`: what is in the kernel cache, and why. */
#include "tools.h"

#include "moejit_private.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char k_usage[] =
    "usage: moejit inspect [options] list\n"
    "       moejit inspect [options] show KEY|PREFIX [--source|--ptx|--sass|--log|--json]\n"
    "                                                [--roofline GPU]\n"
    "       moejit inspect [options] templates\n"
    "       moejit inspect [options] gc [--max-bytes N]\n"
    "       moejit inspect [options] verify\n"
    "       moejit inspect [options] --stats\n"
    "\n"
    "  list       every cache entry: key, template, knobs, arch, size, registers, spills,\n"
    "             last used\n"
    "  show       one entry (a unique key prefix is enough): its metadata and ptxas report,\n"
    "             or with --source the generated source, --ptx the PTX, --sass the SASS\n"
    "             (through nvdisasm or cuobjdump from PATH or /usr/local/cuda/bin), --log\n"
    "             the compile log, --json the metadata as JSON. For an expert GEMM\n"
    "             (moe_experts) it says the bytes a forward reads per active expert, and with\n"
    "             --roofline GPU the floor that puts on a forward's time on that GPU\n"
    "             ({gpus})\n"
    "  templates  the kernel templates built into moejit, their knobs and targets\n"
    "  gc         evict least-recently-used entries down to the size cap (or --max-bytes)\n"
    "  verify     check every entry's checksum and format; move bad ones to quarantine\n"
    "             (on a cache it cannot write it says they were left in place)\n"
    "  --stats    entries, bytes, cap and quarantined files of the cache directory, and the\n"
    "             JIT counters (memory/disk hits and misses, compiles, compile ms,\n"
    "             quarantines, lock waits, evictions, strict misses, store failures)\n"
    "             summed over every process that used it (one process's live counters:\n"
    "             mj_context_stats())\n"
    "\n"
    "inspect creates nothing: a cache directory that does not exist is an error, and list,\n"
    "show and --stats write nothing (not even last-used stamps).\n"
    "\n"
    "options:\n";

enum { OPT_STATS = 256, OPT_SOURCE, OPT_PTX, OPT_SASS, OPT_LOG, OPT_JSON, OPT_MAX, OPT_ROOF };

/* The subcommands' own options are described with them, above. */
static const tool_opt k_opts[] = {
    {.name = "stats", .id = OPT_STATS},
    {.name = "source", .id = OPT_SOURCE},
    {.name = "ptx", .id = OPT_PTX},
    {.name = "sass", .id = OPT_SASS},
    {.name = "log", .id = OPT_LOG},
    {.name = "json", .id = OPT_JSON},
    {.name = "max-bytes", .id = OPT_MAX, .has_arg = 1, .arg = "N"},
    {.name = "roofline", .id = OPT_ROOF, .has_arg = 1, .arg = "GPU"},
    TOOL_SHARED(TOOL_OPT_CACHE_DIR, NULL),
    {0}};

static const char *ago(int64_t ns, char *buf, size_t len) {
    double s = (double)time(NULL) - (double)ns / 1e9;
    if (s < 0) s = 0;
    if (s < 120) snprintf(buf, len, "%.0fs ago", s);
    else if (s < 7200) snprintf(buf, len, "%.0fm ago", s / 60);
    else if (s < 172800) snprintf(buf, len, "%.0fh ago", s / 3600);
    else snprintf(buf, len, "%.0fd ago", s / 86400);
    return buf;
}

/* inspect never creates a cache: list, show and --stats open a read-only view (nothing is
 * written, not even a last-used stamp); verify and gc, which move and delete entries, open it
 * for writing, without creating it either. */
static int open_cache(const char *dir, unsigned flags, mj_cache **c) {
    mj_status st = mj_cache_open_flags(dir, 0, MJ_CACHE_NO_CREATE | flags, c);
    if (st != MJ_OK) return tool_fail_status("opening the cache", st);
    if (!mj_cache_readable(*c)) {
        int rc = tool_fail("%s: nothing to inspect (check --cache-dir, $MOEJIT_CACHE_DIR)",
                           mj_cache_problem(*c));
        mj_cache_close(*c);
        return rc;
    }
    return 0;
}

static void entry_path(mj_cache *c, const char *hex, char *buf, size_t len) {
    snprintf(buf, len, "%s/v%d/entries/%s.mjc", mj_cache_dir(c), MJ_CACHE_FORMAT, hex);
}

static void knobs_text(json_t *meta, char *buf, size_t len) {
    json_t *k = json_object_get(meta, "knobs");
    const char *name;
    json_t *v;
    size_t n = 0;
    buf[0] = '\0';
    json_object_foreach(k, name, v) {
        if (n < len) n += (size_t)snprintf(buf + n, len - n, "%s%s=%lld", n ? " " : "", name,
                                           (long long)json_integer_value(v));
    }
}

static int cmd_list(mj_cache *c) {
    mj_cache_item *items = NULL;
    int n = 0;
    mj_status st = mj_cache_list(c, &items, &n);
    if (st != MJ_OK) return tool_fail_status("listing the cache", st);
    printf("%-12s  %-24s %-28s %-8s %9s %5s %7s  %s\n", "KEY", "TEMPLATE", "KNOBS", "ARCH", "BYTES",
           "REGS", "SPILLS", "LAST USED");
    for (int i = 0; i < n; i++) {
        char path[4096], kn[256], when[32];
        entry_path(c, items[i].key_hex, path, sizeof path);
        mj_cache_entry e;
        if (mj_cache_read_file(path, &e) != MJ_OK) {
            printf("%.12s  (does not verify: run 'moejit inspect verify')\n", items[i].key_hex);
            continue;
        }
        json_t *m = json_loads(e.meta_json, 0, NULL), *p = json_object_get(m, "ptxas");
        knobs_text(m, kn, sizeof kn);
        const char *be = json_string_value(json_object_get(m, "backend"));
        char arch[64];
        snprintf(arch, sizeof arch, "%s%s", json_string_value(json_object_get(m, "arch")),
                 be && !strcmp(be, "sim") ? "/sim" : "");
        printf("%.12s  %-24s %-28s %-8s %9lld %5lld %7lld  %s\n", items[i].key_hex,
               json_string_value(json_object_get(m, "template")), kn, arch, (long long)items[i].bytes,
               (long long)json_integer_value(json_object_get(p, "registers")),
               (long long)(json_integer_value(json_object_get(p, "spill_stores")) +
                           json_integer_value(json_object_get(p, "spill_loads"))),
               ago(items[i].last_used_ns, when, sizeof when));
        json_decref(m);
        mj_cache_entry_free(&e);
    }
    printf("%d entries\n", n);
    free(items);
    return 0;
}

/* Find the one entry whose key starts with prefix. */
static int find_entry(mj_cache *c, const char *prefix, char hex[MJ_KEY_HEX_LEN + 1]) {
    size_t pl = strlen(prefix);
    if (pl == 0 || pl > MJ_KEY_HEX_LEN || strspn(prefix, "0123456789abcdef") != pl)
        return tool_fail("'%s' is not a key or key prefix (lowercase hex; see 'moejit inspect list')", prefix);
    mj_cache_item *items = NULL;
    int n = 0, found = 0;
    if (mj_cache_list(c, &items, &n) != MJ_OK) return tool_fail("cannot list the cache: %s", mj_last_error());
    for (int i = 0; i < n; i++)
        if (!strncmp(items[i].key_hex, prefix, pl)) {
            if (found++) break;
            memcpy(hex, items[i].key_hex, MJ_KEY_HEX_LEN + 1);
        }
    free(items);
    if (found == 0) return tool_fail("no cache entry starts with '%s' (see 'moejit inspect list')", prefix);
    if (found > 1) return tool_fail("'%s' matches more than one entry: give more of the key", prefix);
    return 0;
}

/* SASS through nvdisasm or cuobjdump (tools/sass.c). */
static int show_sass(const mj_cache_entry *e) {
    char *text = NULL;
    if (tool_sass_text(e->binary, e->binary_len, &text)) return 1;
    fputs(text, stdout);
    free(text);
    return 0;
}

/* An expert GEMM specialization: what a forward must read per active expert, and the floor. */
static void show_experts_bytes(json_t *m, const tool_gpu *gpu) {
    json_t *k = json_object_get(m, "knobs");
    int32_t H = (int32_t)json_integer_value(json_object_get(k, "H")), I = (int32_t)json_integer_value(json_object_get(k, "I"));
    int32_t nsub = (int32_t)json_integer_value(json_object_get(k, "NSUB"));
    if (H < 64 || I < 64) return;
    int64_t w13 = mj_pack_w13_bytes(H, I), s13 = mj_pack_s13_bytes(H, I), w2 = mj_pack_w2_bytes(H, I),
            s2 = mj_pack_s2_bytes(H, I), per = w13 + s13 + w2 + s2;
    printf("moves      %lld bytes per active expert (w13 %lld + scales %lld, w2 %lld + scales %lld), each\n"
           "           byte once for B <= 64; the %d shared sub-expert%s always\n",
           (long long)per, (long long)w13, (long long)s13, (long long)w2, (long long)s2, nsub, nsub == 1 ? "" : "s");
    /* On a GPU each kernel is an entry of its own (PART): say which share is this one's. */
    int32_t part = (int32_t)json_integer_value(json_object_get(k, "PART"));
    if (part == 1) printf("           (this entry is experts_quant: it reads the activations, no weights)\n");
    if (part == 2) printf("           (this entry is experts_up: w13 and its scales, %lld bytes)\n", (long long)(w13 + s13));
    if (part == 3) printf("           (this entry is experts_down: w2 and its scales, %lld bytes)\n", (long long)(w2 + s2));
    if (!gpu) return;
    double us = (double)per / (gpu->gbps * 1e3);
    printf("roofline   %.2f us per active expert on %s at %.0f GB/s (%s);\n"
           "           a token with top-8 and the shared expert reads %d experts: %.1f us\n",
           us, gpu->name, gpu->gbps, gpu->desc, 8 + nsub, us * (8 + nsub));
}

static int cmd_show(mj_cache *c, const char *prefix, const char *what, const tool_gpu *gpu) {
    char hex[MJ_KEY_HEX_LEN + 1], path[4096];
    if (find_entry(c, prefix, hex)) return 1;
    entry_path(c, hex, path, sizeof path);
    mj_cache_entry e;
    mj_status st = mj_cache_read_file(path, &e);
    if (st != MJ_OK) return tool_fail("entry %.16s does not verify (%s): run 'moejit inspect verify'", hex, mj_last_error());
    int rc = 0;
    if (!strcmp(what, "source")) {
        if (e.source) fputs(e.source, stdout);
        else rc = tool_fail("entry %.16s has no source stored", hex);
    } else if (!strcmp(what, "ptx")) {
        if (e.ptx) fwrite(e.ptx, 1, strlen(e.ptx), stdout);
        else rc = tool_fail("entry %.16s has no PTX stored", hex);
    } else if (!strcmp(what, "log")) {
        fputs(e.log ? e.log : "", stdout);
    } else if (!strcmp(what, "json")) {
        json_t *m = json_loads(e.meta_json, 0, NULL);
        json_object_set_new(m, "key", json_string(hex));
        json_object_set_new(m, "bytes", json_integer((json_int_t)e.binary_len));
        json_dumpf(m, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(m);
    } else if (!strcmp(what, "sass")) {
        json_t *m = json_loads(e.meta_json, 0, NULL);
        const char *be = json_string_value(json_object_get(m, "backend"));
        if (be && !strcmp(be, "sim"))
            rc = tool_fail("entry %.16s is for the sim backend: it holds a host shared object, not a "
                           "cubin (see --source)", hex);
        else
            rc = show_sass(&e);
        json_decref(m);
    } else {
        json_t *m = json_loads(e.meta_json, 0, NULL), *p = json_object_get(m, "ptxas");
        char kn[256];
        knobs_text(m, kn, sizeof kn);
        printf("key        %s\n", hex);
        printf("template   %s\n", json_string_value(json_object_get(m, "template")));
        printf("knobs      %s\n", kn);
        printf("arch       %s\n", json_string_value(json_object_get(m, "arch")));
        const char *be = json_string_value(json_object_get(m, "backend"));
        printf("backend    %s\n", be ? be : "cuda");
        printf("compiler   %s\n", json_string_value(json_object_get(m, "compiler")));
        printf("options    %s\n", json_string_value(json_object_get(m, "options")));
        printf("compile    %.1f ms\n", json_real_value(json_object_get(m, "compile_ms")));
        printf("%s %zu bytes\n", be && !strcmp(be, "sim") ? "object    " : "cubin     ", e.binary_len);
        printf("ptxas      %lld registers, %lld B spill stores, %lld B spill loads, %lld B stack, "
               "%lld B static smem\n",
               (long long)json_integer_value(json_object_get(p, "registers")),
               (long long)json_integer_value(json_object_get(p, "spill_stores")),
               (long long)json_integer_value(json_object_get(p, "spill_loads")),
               (long long)json_integer_value(json_object_get(p, "stack_frame")),
               (long long)json_integer_value(json_object_get(p, "smem_static")));
        const char *tn = json_string_value(json_object_get(m, "template"));
        if (tn && !strcmp(tn, "moe_experts")) show_experts_bytes(m, gpu);
        else if (gpu) printf("roofline   (only expert GEMM entries have one)\n");
        json_decref(m);
        printf("\nkey text:\n%s", e.key_text);
    }
    mj_cache_entry_free(&e);
    return rc;
}

static int cmd_templates(void) {
    for (int32_t i = 0; i < mj_registry_count(); i++) {
        const mj_template_desc *t = mj_template_at(i);
        printf("%s  (%s)\n  %s\n  targets:", t->name, t->file, t->doc);
        for (int a = 0; a < MJ_TARGET_COUNT; a++)
            if (t->targets & (1u << a)) printf(" %s", mj_target_name((mj_target)a));
        printf("\n");
        for (int32_t k = 0; k < t->n_knobs; k++) {
            const mj_knob_desc *kd = &t->knobs[k];
            printf("  knob %-12s %-8s ", kd->name, kd->ctype);
            if (kd->kind == MJ_KNOB_KIND_RANGE) printf("%d..%d", kd->lo, kd->hi);
            else
                for (int32_t v = 0; v < kd->n_values; v++) printf("%s%d", v ? "|" : "", kd->values[v]);
            printf("  %s\n", kd->doc);
        }
        for (int32_t k = 0; k < t->n_constraints; k++)
            printf("  constraint %s  (%s)\n", t->constraints[k].expr, t->constraints[k].doc);
        for (int32_t k = 0; k < t->n_kernels; k++) {
            printf("  kernel %s(", t->kernels[k].name);
            for (int32_t p = 0; p < t->kernels[k].n_params; p++)
                printf("%s%s %s", p ? ", " : "", t->kernels[k].params[p].ctype, t->kernels[k].params[p].name);
            printf(")\n");
        }
    }
    return 0;
}

static int cmd_stats(mj_cache *c) {
    mj_cache_item *items = NULL;
    int n = 0;
    if (mj_cache_list(c, &items, &n) != MJ_OK) return tool_fail("cannot list the cache: %s", mj_last_error());
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += items[i].bytes;
    free(items);
    char q[4096];
    snprintf(q, sizeof q, "%s/v%d/quarantine", mj_cache_dir(c), MJ_CACHE_FORMAT);
    int nq = 0;
    DIR *d = opendir(q);
    if (d) {
        for (struct dirent *de; (de = readdir(d));)
            if (de->d_name[0] != '.') nq++;
        closedir(d);
    }
    printf("cache       %s\n", mj_cache_dir(c));
    printf("entries     %d\n", n);
    printf("bytes       %lld\n", (long long)bytes);
    /* The cap the cache enforces, not the variable's text: a bad value is not in force. */
    printf("cap         %lld bytes (%s)\n", (long long)mj_cache_max_bytes(c), mj_cache_max_bytes_source(c));
    printf("quarantine  %d files\n", nq);
    printf("writable    %s\n", mj_cache_dir_writable(c) ? "yes" : "no");
    /* The counters every process using this cache added up when it finished. */
    double v[MJ_CACHE_N_TOTALS];
    int64_t procs = 0;
    int present = 0;
    mj_cache_totals(c, v, &procs, &present);
    if (present) {
        printf("totals over %lld processes:\n", (long long)procs);
        for (int i = 0; i < MJ_CACHE_N_TOTALS; i++) {
            if (!strcmp(mj_cache_total_names[i], "compile_ms")) printf("  %-16s %.1f\n", mj_cache_total_names[i], v[i]);
            else printf("  %-16s %lld\n", mj_cache_total_names[i], (long long)v[i]);
        }
    } else {
        printf("totals      none yet (no process has finished with this cache)\n");
    }
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    const char *what = "summary";
    const tool_gpu *gpu = NULL;
    int stats = 0, c, cli_rc;
    long long max_bytes = -1;
    tool_shared so = TOOL_SHARED_INIT;
    tool_cli cli = {.cmd = "inspect", .usage = k_usage, .opts = k_opts, .sh = &so};
    while ((c = tool_cli_next(&cli, argc, argv, &cli_rc)) != 0) {
        switch (c) {
        case OPT_STATS: stats = 1; break;
        case OPT_SOURCE: what = "source"; break;
        case OPT_PTX: what = "ptx"; break;
        case OPT_SASS: what = "sass"; break;
        case OPT_LOG: what = "log"; break;
        case OPT_JSON: what = "json"; break;
        case OPT_ROOF:
            if (!(gpu = tool_gpu_find(optarg)))
                return tool_usage("inspect", "--roofline: unknown GPU '%s' (known: %s)", optarg, tool_gpu_names());
            break;
        case OPT_MAX: {
            char *end;
            errno = 0;
            max_bytes = strtoll(optarg, &end, 10);
            if (errno || *end || max_bytes < 0) return tool_usage("inspect", "--max-bytes wants a byte count, got '%s'", optarg);
            break;
        }
        case TOOL_CLI_EXIT: return cli_rc;
        }
    }
    const char *dir = so.cache_dir;
    const char *sub = optind < argc ? argv[optind] : NULL;
    if (!sub && !stats) return tool_usage("inspect", "expected list, show, templates, gc, verify or --stats");
    if (sub && !strcmp(sub, "templates")) return cmd_templates();
    int writes = sub && (!strcmp(sub, "gc") || !strcmp(sub, "verify"));
    mj_cache *cache;
    if (open_cache(dir, writes ? 0 : MJ_CACHE_READ_ONLY, &cache)) return 1;
    int rc;
    if (!sub) rc = cmd_stats(cache);
    else if (!strcmp(sub, "list") && optind + 1 == argc) rc = cmd_list(cache);
    else if (!strcmp(sub, "show") && optind + 2 == argc) rc = cmd_show(cache, argv[optind + 1], what, gpu);
    else if (!strcmp(sub, "gc") && optind + 1 == argc) {
        int n = 0;
        mj_status st = MJ_OK;
        if (!mj_cache_writable(cache))
            rc = tool_fail("gc: %s: nothing can be evicted", mj_cache_problem(cache));
        else if ((st = mj_cache_gc(cache, max_bytes, &n)) != MJ_OK)
            rc = tool_fail_status("gc", st);
        else
            rc = (printf("gc: evicted %d entries\n", n), 0);
    } else if (!strcmp(sub, "verify") && optind + 1 == argc) {
        int ok = 0, bad = 0;
        mj_cache_stats before, after;
        mj_cache_get_stats(cache, &before);
        mj_status st = mj_cache_verify(cache, &ok, &bad);
        mj_cache_get_stats(cache, &after);
        /* Say what happened to the bad ones: on a cache we cannot write, nothing moved. */
        int moved = (int)(after.quarantined - before.quarantined);
        if (st != MJ_OK) rc = tool_fail_status("verify", st);
        else {
            if (!bad) printf("verify: %d entries ok, 0 bad\n", ok);
            else if (moved == bad) printf("verify: %d entries ok, %d bad (moved to quarantine)\n", ok, bad);
            else if (moved == 0 && !mj_cache_writable(cache))
                printf("verify: %d entries ok, %d bad (left in place: %s)\n", ok, bad, mj_cache_problem(cache));
            else
                printf("verify: %d entries ok, %d bad (%d moved to quarantine, %d left in place: "
                       "changed or removed while we looked)\n", ok, bad, moved, bad - moved);
            rc = bad ? 1 : 0;
        }
    } else {
        rc = tool_usage("inspect", "bad arguments for '%s'", sub);
    }
    if (!rc && stats && sub) rc = cmd_stats(cache);
    mj_cache_close(cache);
    return rc;
}
