/* options.c — the subcommands' options. Each subcommand has one table of them (its own and
 * the shared ones it takes); one parser and one --help printer work from it. The shared
 * option groups are defined, parsed and documented here, once. Then the parsers of values
 * (integers, --tp/--ep, --mode) and what bench and prewarm make of the shared model and plan
 * options: the model's config and the plan. */
#include "tools.h"
#include "moejit_private.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the shared option groups ------------------------------------------------------------ */

/* Name, argument and help text of every shared option; a subcommand lists the ones it takes
 * (TOOL_SHARED) and may add a note, printed after the text here. In help texts, {target} is
 * the default target, {targets} the targets moejit builds for, {gpus} the GPUs it knows. */
static const tool_opt k_shared[] = {
    /* every subcommand */
    {.name = "help", .id = TOOL_OPT_HELP, .help = "this text"},
    {.name = "version", .id = TOOL_OPT_VERSION, .help = "print the version"},
    /* progress */
    {.name = "quiet", .id = TOOL_OPT_QUIET, .help = "no progress on stderr"},
    /* the kernel cache */
    {.name = "cache-dir", .id = TOOL_OPT_CACHE_DIR, .has_arg = 1, .arg = "D",
     .help = "the kernel cache directory (default $MOEJIT_CACHE_DIR, else\n"
             "$XDG_CACHE_HOME/moejit, else ~/.cache/moejit)"},
    /* the model */
    {.name = "config", .id = TOOL_OPT_CONFIG, .has_arg = 1, .arg = "F",
     .help = "a Hugging Face config.json (its MoE part), NVFP4-quantized: a\n"
             "quantization_config inside it, or --quant"},
    {.name = "quant", .id = TOOL_OPT_QUANT, .has_arg = 1, .arg = "F",
     .help = "its hf_quant_config.json (default: the one beside config.json,\n"
             "if any); a quantization_config inside config.json must agree with it"},
    /* the split */
    {.name = "tp", .id = TOOL_OPT_TP, .has_arg = 1, .arg = "N", .synopsis = "--tp N, --ep N",
     .help = "split the layer over N ranks, tensor parallel (each rank a slice of\n"
             "every expert) or expert parallel (whole experts); one of the two, once"},
    {.name = "ep", .id = TOOL_OPT_EP, .has_arg = 1, .arg = "N"}, /* with --tp */
    /* the plan: batch sizes, k0, the weight mode */
    {.name = "batch", .id = TOOL_OPT_BATCH, .has_arg = 1, .arg = "B",
     .help = "batch sizes: \"1-256\", \"1,2,4,8\" or both (\"1-8,16,32\")"},
    {.name = "k0-policy", .id = TOOL_OPT_K0_POLICY, .has_arg = 1, .arg = "P",
     .help = "OEA's k0 by batch size: \"4\" (always 4), or rules such as \"1-3:8,4-:4\"\n"
             "(k0 8 for 1 to 3 tokens, 4 from 4 on); each k0 in 1..top-k"},
    {.name = "mode", .id = TOOL_OPT_MODE, .has_arg = 1, .arg = "M",
     .help = "w4a16, w4a4 (sm_120a, sm_121a), or a policy by batch size\n"
             "(\"1-8:w4a16,9-:w4a4\"); default: that policy where W4A4 exists,\n"
             "else w4a16"},
    /* the target */
    {.name = "arch", .id = TOOL_OPT_ARCH, .has_arg = 1, .arg = "A",
     .help = "the target the kernels are built for, one of\n"
             "{targets}"},
};
#define N_SHARED ((int)(sizeof k_shared / sizeof k_shared[0]))

_Static_assert(TOOL_MAX_ARCH == 4 * MJ_TARGET_COUNT, "--arch: four of each target at most");

static const tool_opt *shared_opt(int id) {
    for (int i = 0; i < N_SHARED; i++)
        if (k_shared[i].id == id) return &k_shared[i];
    return NULL;
}

/* What an entry of a subcommand's table is: the entry itself, or the shared option it names. */
static const tool_opt *resolve(const tool_opt *o) { return o->shared ? shared_opt(o->shared) : o; }
static int is_end(const tool_opt *o) { return !o->name && !o->id && !o->shared && !o->help; }
static int is_heading(const tool_opt *o) { return !o->name && !o->id && !o->shared && o->help; }
static int short_letter(int id) { return id > 0 && id < 256 && isalnum(id) ? id : 0; }

/* Every subcommand takes -h/--help and -V/--version, listed after its own table. */
static const tool_opt k_always[] = {TOOL_SHARED(TOOL_OPT_HELP, NULL), TOOL_SHARED(TOOL_OPT_VERSION, NULL)};

/* Entry i of cli's table, then the two above; NULL past them. */
static const tool_opt *entry(const tool_cli *cli, int i) {
    int n = 0;
    while (cli->opts && !is_end(&cli->opts[n])) n++;
    return i < n ? &cli->opts[i] : i < n + 2 ? &k_always[i - n] : NULL;
}

/* ---- parsing ---------------------------------------------------------------------------- */

/* getopt_long's tables from cli's. 0, or -1 for a table larger than tool_cli holds. */
static int cli_build(tool_cli *cli) {
    int nl = 0, ns = 0;
    const tool_opt *e;
    for (int i = 0; (e = entry(cli, i)); i++) {
        if (is_heading(e)) continue;
        const tool_opt *o = resolve(e);
        if (o->name) {
            if (nl == TOOL_CLI_MAX_OPTS) return -1;
            cli->longs[nl++] = (struct option){o->name, o->has_arg ? required_argument : no_argument, NULL, o->id};
        }
        if (short_letter(o->id)) {
            if (ns + 2 >= (int)sizeof cli->shorts) return -1;
            cli->shorts[ns++] = (char)o->id;
            if (o->has_arg) cli->shorts[ns++] = ':';
        }
    }
    cli->longs[nl] = (struct option){NULL, 0, NULL, 0};
    cli->shorts[ns] = '\0';
    cli->ready = 1;
    return 0;
}

void tool_print_version(void) {
    const char *v;
    mj_version(NULL, NULL, NULL, &v);
    printf("moejit %s\n", v);
}

/* A shared option: its value into cli->sh. 0, or the exit code after the usage line. */
static int parse_shared(tool_cli *cli, int id, const char *arg) {
    tool_shared *s = cli->sh;
    switch (id) {
    case TOOL_OPT_QUIET: s->quiet = 1; return 0;
    case TOOL_OPT_CACHE_DIR: s->cache_dir = arg; return 0;
    case TOOL_OPT_CONFIG: s->config = arg; return 0;
    case TOOL_OPT_QUANT: s->quant = arg; return 0;
    case TOOL_OPT_TP:
    case TOOL_OPT_EP:
        if (tool_parse_split(cli->cmd, id == TOOL_OPT_TP, arg, s->split_given, &s->par, &s->n_ranks)) return 2;
        s->split_given = 1;
        return 0;
    case TOOL_OPT_BATCH: s->batch = arg; return 0;
    case TOOL_OPT_K0_POLICY: s->k0_policy = arg; return 0;
    case TOOL_OPT_MODE: s->mode = arg; return 0;
    case TOOL_OPT_ARCH: {
        mj_target t;
        if (mj_target_parse(arg, &t) != MJ_OK) return tool_usage(cli->cmd, "--arch: %s", mj_last_error());
        if (s->n_arch == TOOL_MAX_ARCH) return tool_usage(cli->cmd, "too many --arch");
        s->arch[s->n_arch++] = mj_target_name(t);
        return 0;
    }
    }
    return 0;
}

int tool_cli_next(tool_cli *cli, int argc, char **argv, int *rc) {
    if (!cli->ready) {
        if (cli_build(cli)) {
            *rc = tool_fail("%s: more options than TOOL_CLI_MAX_OPTS (tools/tools.h)", cli->cmd);
            return TOOL_CLI_EXIT;
        }
        optind = 1;
        opterr = 0; /* a bad option is reported here, in one line */
    }
    for (;;) {
        const int c = getopt_long(argc, argv, cli->shorts, cli->longs, NULL);
        if (c == -1) return 0;
        if (c == '?') {
            *rc = tool_usage(cli->cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
            return TOOL_CLI_EXIT;
        }
        if (c == TOOL_OPT_HELP) {
            *rc = tool_cli_help(cli, stdout);
            return TOOL_CLI_EXIT;
        }
        if (c == TOOL_OPT_VERSION) {
            tool_print_version();
            *rc = 0;
            return TOOL_CLI_EXIT;
        }
        /* A shared option is parsed here, into cli->sh; the subcommand's own go back to it. */
        int shared = 0;
        const tool_opt *e;
        for (int i = 0; (e = entry(cli, i)); i++) shared |= e->shared == c;
        if (!shared || !cli->sh) return c;
        if ((*rc = parse_shared(cli, c, optarg)) != 0) return TOOL_CLI_EXIT;
    }
}

/* ---- --help --------------------------------------------------------------------------- */

/* text with {target}, {targets} and {gpus} expanded, each line after the first indented by
 * indent spaces. */
static void put_text(FILE *f, const char *text, int indent) {
    for (const char *p = text; *p; p++) {
        if (*p == '{') {
            static const char *const names[] = {"{target}", "{targets}", "{gpus}"};
            const char *with[] = {mj_target_name(MJ_DEFAULT_TARGET), MJ_TARGET_LIST, tool_gpu_names()};
            int done = 0;
            for (int i = 0; i < 3 && !done; i++)
                if (!strncmp(p, names[i], strlen(names[i]))) {
                    fputs(with[i], f);
                    p += strlen(names[i]) - 1;
                    done = 1;
                }
            if (done) continue;
        }
        fputc(*p, f);
        if (*p == '\n' && p[1]) fprintf(f, "%*s", indent, "");
    }
}

/* --help's left column of an option: "-q, --quiet", "--cache-dir D", "-j N". */
static void synopsis(const tool_opt *o, char *buf, size_t len) {
    if (o->synopsis) {
        snprintf(buf, len, "%s", o->synopsis);
        return;
    }
    const int s = short_letter(o->id);
    size_t n = 0;
    if (s) n += (size_t)snprintf(buf + n, len - n, "-%c%s", s, o->name ? ", " : "");
    if (o->name && n < len) n += (size_t)snprintf(buf + n, len - n, "--%s", o->name);
    if (o->has_arg && o->arg && n < len) snprintf(buf + n, len - n, " %s", o->arg);
}

#define HELP_COL_MAX 18 /* a longer left column gets its text on the next line */

int tool_cli_help(const tool_cli *cli, FILE *f) {
    int width = 12;
    char left[128];
    const tool_opt *e;
    for (int i = 0; (e = entry(cli, i)); i++) {
        if (is_heading(e) || !resolve(e)->help) continue;
        synopsis(resolve(e), left, sizeof left);
        const int n = (int)strlen(left);
        if (n <= HELP_COL_MAX && n > width) width = n;
    }
    const int col = 2 + width + 2;
    put_text(f, cli->usage, 0);
    for (int i = 0; (e = entry(cli, i)); i++) {
        if (is_heading(e)) {
            put_text(f, e->help, 0);
            fputc('\n', f);
            continue;
        }
        const tool_opt *o = resolve(e);
        if (!o->help) continue; /* said elsewhere (with another option, or in the text above) */
        synopsis(o, left, sizeof left);
        if ((int)strlen(left) <= width) fprintf(f, "  %-*s  ", width, left);
        else fprintf(f, "  %s\n%*s", left, col, "");
        put_text(f, o->help, col);
        if (e->shared && e->help) { /* the subcommand's note */
            fprintf(f, "\n%*s", col, "");
            put_text(f, e->help, col);
        }
        fputc('\n', f);
    }
    return 0;
}

/* ---- values ------------------------------------------------------------------------------ */

int tool_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        tool_usage(cmd, "%s wants an integer in %ld..%ld, got '%s'", opt, lo, hi, text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int tool_parse_positive_float(const char *cmd, const char *opt, const char *text, float *out) {
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (errno || end == text || *end || !isfinite(v) || !(v > 0.0f)) {
        tool_usage(cmd, "%s wants a positive finite number, got '%s'", opt, text);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_parse_split(const char *cmd, int tp, const char *text, int already, mj_parallel *par, int *n_ranks) {
    if (already) return tool_usage(cmd, "give one of --tp and --ep, once");
    if (tool_parse_int(cmd, tp ? "--tp" : "--ep", text, 1, MJ_MAX_RANKS, n_ranks)) return 2;
    *par = tp ? MJ_PAR_TP : MJ_PAR_EP;
    return 0;
}

mj_weight_mode tool_mode_parse(const char *text, const char **policy) {
    *policy = NULL;
    if (text && !strcmp(text, "w4a16")) return MJ_MODE_W4A16;
    if (text && !strcmp(text, "w4a4")) return MJ_MODE_W4A4;
    *policy = text;
    return MJ_MODE_AUTO;
}

int tool_gpus_present(void) {
    int n = 0;
    if (mj_cuda_load() == MJ_OK) mj_cuda_device_count(&n);
    return n;
}

/* ---- the model and the plan (bench, prewarm) -------------------------------------------- */

int tool_config_read(const char *config, const char *quant, mj_moe_config *cfg) {
    /* Without --quant, hf_quant_config.json beside config.json (as a checkpoint has it); a
     * quantization_config inside config.json must agree with it (the config reader checks). */
    char beside[4096];
    if (!quant) {
        const char *slash = strrchr(config, '/');
        int dl = slash ? (int)(slash - config) + 1 : 0;
        snprintf(beside, sizeof beside, "%.*shf_quant_config.json", dl, config);
        struct stat sb;
        if (stat(beside, &sb) == 0 && S_ISREG(sb.st_mode)) quant = beside;
    }
    mj_status st = mj_moe_config_read(config, quant, cfg);
    if (st == MJ_OK && cfg->quant != MJ_QUANT_NVFP4)
        return tool_fail("%s: no NVFP4 quantization: moejit runs ModelOpt NVFP4 checkpoints; give the checkpoint's "
                         "hf_quant_config.json with --quant (or put it beside config.json)",
                         config);
    if (st != MJ_OK) return tool_fail_status(config, st);
    return 0;
}

int tool_plan_build(const char *cmd, mj_context_t ctx, const mj_moe_config *cfg, mj_parallel par, int n_ranks,
                    int shared, const char *batch, const char *k0_policy, const char *mode_text,
                    const char *config, mj_plan *plan, int32_t *n_batches) {
    int32_t *bs = NULL, nb = 0;
    int rc = 0;
    mj_k0_policy k0;
    mj_mode_policy modes;
    const char *policy;
    const mj_weight_mode mode = tool_mode_parse(mode_text, &policy);
    const mj_target t = mj_context_target(ctx);
    const char *arch = mj_target_name(t);
    plan->n = 0, plan->e = NULL;
    if (mj_batches_parse(batch, &bs, &nb) != MJ_OK) {
        rc = tool_usage(cmd, "--batch: %s", mj_last_error());
        goto out;
    }
    if (k0_policy && mj_k0_policy_parse(k0_policy, cfg->topk, &k0) != MJ_OK) {
        rc = tool_usage(cmd, "--k0-policy: %s", mj_last_error());
        goto out;
    }
    if (mj_mode_policy_parse(policy ? policy : mj_mode_policy_default(t), t, &modes) != MJ_OK) {
        rc = tool_fail("--mode for %s: %s", arch, mj_last_error());
        goto out;
    }
    mj_plan_request req = {cfg, par, n_ranks, -1, bs, nb, k0_policy ? &k0 : NULL, mode, &modes, shared};
    if (mj_plan_build(ctx, &req, plan) != MJ_OK) {
        rc = config ? tool_fail("the plan of %s for %s: %s", config, arch, mj_last_error())
                    : tool_fail("the plan for %s: %s", arch, mj_last_error());
        goto out;
    }
    if (n_batches) *n_batches = nb;
out:
    free(bs);
    return rc;
}
