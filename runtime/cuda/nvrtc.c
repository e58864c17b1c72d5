/* nvrtc.c — NVRTC, dlopen'd at run time (never linked): compile generated CUDA source
 * straight to a cubin, keeping the PTX and ptxas's resource report.
 *
 * The library is loaded once per process (base/dl.c) and never unloaded. NVRTC itself
 * is thread-safe as long as a program object is not shared, and each compile here makes
 * and destroys its own program, so mj_nvrtc_compile may run on many threads at once. */
#include "cuda/cudalibs.h"
#include "dl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* ---- the few NVRTC types used (nvrtc.h, not included) --------------------------------- */
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
};

static struct {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*GetNumSupportedArchs)(int *);
    nvrtcResult (*GetSupportedArchs)(int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv;

static const mj_dl_sym k_syms[] = {
#define SYM(f) {"nvrtc" #f, offsetof(__typeof__(nv), f)}
    SYM(GetErrorString), SYM(Version),       SYM(GetNumSupportedArchs), SYM(GetSupportedArchs),
    SYM(CreateProgram),  SYM(DestroyProgram), SYM(CompileProgram),      SYM(GetPTXSize),
    SYM(GetPTX),         SYM(GetCUBINSize),  SYM(GetCUBIN),             SYM(GetProgramLogSize),
    SYM(GetProgramLog),
#undef SYM
};

#define MJ_NVRTC_HINT                                                                      \
    "install the CUDA toolkit's NVRTC (libnvrtc.so.13) or set MOEJIT_NVRTC=/path/to/libnvrtc.so"

static int g_major, g_minor;
static int g_archs[64];
static int g_n_archs;

/* Once the symbols resolve: the version, and the architectures it compiles for. */
static mj_status nvrtc_init(mj_dl_lib *lib, void *handle, char *err, size_t err_len) {
    (void)handle;
    nvrtcResult r = nv.Version(&g_major, &g_minor);
    int n = 0;
    if (r == NVRTC_SUCCESS) r = nv.GetNumSupportedArchs(&n);
    if (r == NVRTC_SUCCESS && (n < 0 || n > (int)(sizeof g_archs / sizeof g_archs[0]))) {
        snprintf(err, err_len, "NVRTC %s reports %d supported architectures (more than moejit expects)",
                 lib->path, n);
        return MJ_ERR_LIBRARY;
    }
    if (r == NVRTC_SUCCESS) r = nv.GetSupportedArchs(g_archs);
    if (r != NVRTC_SUCCESS) {
        snprintf(err, err_len, "NVRTC %s does not work: %s", lib->path, nv.GetErrorString(r));
        return MJ_ERR_LIBRARY;
    }
    g_n_archs = n;
    return MJ_OK;
}

static const char *const k_candidates[] = {
    "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "$CUDA_HOME/lib64/libnvrtc.so",
    "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so", NULL,
};

static mj_dl_lib g_lib = {
    .env = "MOEJIT_NVRTC",
    .what = "NVRTC",
    .hint = MJ_NVRTC_HINT,
    .candidates = k_candidates,
    .syms = k_syms,
    .n_syms = sizeof k_syms / sizeof k_syms[0],
    .table = &nv,
    .table_size = sizeof nv,
    .init = nvrtc_init,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

mj_status mj_nvrtc_load(void) { return mj_dl_load_once(&g_lib); }

mj_status mj_nvrtc_version(int *major, int *minor) {
    MJ_CHECK(mj_nvrtc_load());
    if (major) *major = g_major;
    if (minor) *minor = g_minor;
    return MJ_OK;
}

mj_status mj_nvrtc_supports(mj_target t, int *supported) {
    if (!supported) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_nvrtc_supports: supported is NULL");
    if ((int)t < 0 || t >= MJ_TARGET_COUNT)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_nvrtc_supports: invalid target %d", (int)t);
    *supported = 0;
    MJ_CHECK(mj_nvrtc_load());
    /* NVRTC lists base numbers (120); the "a" variant of a listed base is compilable too. */
    int sm = mj_target_sm(t);
    for (int i = 0; i < g_n_archs; i++)
        if (g_archs[i] == sm) *supported = 1;
    return MJ_OK;
}

/* ---- options ---------------------------------------------------------------------------
 * -arch=sm_XX        a real architecture: NVRTC emits the cubin (SASS) and, with NVRTC 12+,
 *                    still hands out the PTX it went through (nvrtcGetPTX works).
 * -std=c++17         NVRTC 13's default, spelled out so the key does not move with it.
 * -default-device    unannotated helper functions are device functions (there is no host
 *                    code in a generated kernel).
 * --ptxas-options=-v ptxas's per-function resource report in the program log.
 * -minimal          (NVRTC 12.4 and later) leaves out of NVRTC's built-in header what no
 *                    kernel here uses (textures, the device runtime, the runtime's types):
 *                    about 9 ms less front end on every compile, the same code.
 * No -lineinfo: compile time is the same but the cubin grows by ~45%; no include paths:
 * kernels include nothing, the source carries its own prelude. The string is stable for a
 * given NVRTC: it is part of the cache key (with the NVRTC version). */
#define MJ_NVRTC_COMMON_OPTIONS " -std=c++17 -default-device --ptxas-options=-v"
static const char *const k_options[MJ_TARGET_COUNT] = {
#define OPTIONS_(e, name, sm, smem) "-arch=" name MJ_NVRTC_COMMON_OPTIONS,
    MJ_TARGET_TABLE(OPTIONS_)
#undef OPTIONS_
};
static const char *const k_options_minimal[MJ_TARGET_COUNT] = {
#define OPTIONS_(e, name, sm, smem) "-arch=" name MJ_NVRTC_COMMON_OPTIONS " -minimal",
    MJ_TARGET_TABLE(OPTIONS_)
#undef OPTIONS_
};

/* Whether the loaded NVRTC takes -minimal (12.4 and later). */
static int nvrtc_has_minimal(void) {
    return mj_dl_status(&g_lib) == MJ_OK && (g_major > 12 || (g_major == 12 && g_minor >= 4));
}

const char *mj_nvrtc_options(mj_target t) {
    if ((int)t < 0 || t >= MJ_TARGET_COUNT) return "";
    return nvrtc_has_minimal() ? k_options_minimal[t] : k_options[t];
}

/* ---- compile ---------------------------------------------------------------------------- */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* FNV-1a 64: names the dumped source. */
static uint64_t source_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Save source as $TMPDIR/moejit-failed-<hash>.cu (via a temporary file and rename, so a
 * concurrent writer of the same source never leaves a torn file). path gets the name; on
 * failure why gets the reason and 0 is returned. */
static int dump_source(const char *source, char *path, size_t path_len, char *why, size_t why_len) {
    static atomic_uint counter;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(path, path_len, "%s/moejit-failed-%016" PRIx64 ".cu", dir, source_hash(source));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(),
             atomic_fetch_add(&counter, 1u));
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(why, why_len, "%s", strerror(errno));
        return 0;
    }
    size_t n = strlen(source);
    int ok = fwrite(source, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        snprintf(why, why_len, "%s", strerror(errno));
        remove(tmp);
        return 0;
    }
    return 1;
}

/* Room the log gets in the 4 KiB thread-local error text. */
#define MJ_LOG_IN_ERROR 3000

static mj_status compile_failed(mj_status s, const char *source, const char *name, mj_target t,
                                nvrtcResult r, const char *log) {
    char path[512], why[256];
    char where[800];
    if (dump_source(source, path, sizeof path, why, sizeof why))
        snprintf(where, sizeof where, "source saved to %s", path);
    else
        snprintf(where, sizeof where, "source could not be saved to %s (%s)", path, why);
    size_t n = strlen(log);
    int cut = n > MJ_LOG_IN_ERROR;
    size_t keep = n;
    if (cut) {
        keep = MJ_LOG_IN_ERROR;
        while (keep > MJ_LOG_IN_ERROR / 2 && log[keep - 1] != '\n') keep--;   /* a whole line */
    }
    const char *what = r == NVRTC_ERROR_COMPILATION ? "could not compile" : "failed on";
    char rname[96] = "";
    if (r != NVRTC_ERROR_COMPILATION) snprintf(rname, sizeof rname, " (%s)", nv.GetErrorString(r));
    return mj_set_error(s, "NVRTC %s %s for %s%s; %s; log:\n%.*s%s", what, name, mj_target_name(t),
                        rname, where, (int)keep, log,
                        cut ? "\n[... log truncated: the full log is in the compile result]" : "");
}

mj_status mj_nvrtc_compile(const char *source, const char *name, mj_target t,
                           mj_compile_result *out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_nvrtc_compile: out is NULL");
    memset(out, 0, sizeof *out);
    if (!source || !name)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_nvrtc_compile: source or name is NULL");
    if ((int)t < 0 || t >= MJ_TARGET_COUNT)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_nvrtc_compile: invalid target %d", (int)t);
    MJ_CHECK(mj_nvrtc_load());

    /* Split the option string itself, so what is compiled is exactly what is keyed. */
    char optbuf[256];
    const char *opts[16];
    int n_opts = 0;
    snprintf(optbuf, sizeof optbuf, "%s", mj_nvrtc_options(t));
    for (char *save = NULL, *tok = strtok_r(optbuf, " ", &save); tok && n_opts < 16;
         tok = strtok_r(NULL, " ", &save))
        opts[n_opts++] = tok;

    char file[300];
    snprintf(file, sizeof file, "%s.cu", name);
    mj_status st = MJ_OK;
    nvrtcProgram prog = NULL;
    double t0 = now_ms();
    nvrtcResult r = nv.CreateProgram(&prog, source, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return mj_set_error(r == NVRTC_ERROR_OUT_OF_MEMORY ? MJ_ERR_NOMEM : MJ_ERR_INTERNAL,
                            "nvrtcCreateProgram for %s failed: %s", name, nv.GetErrorString(r));
    nvrtcResult rc = nv.CompileProgram(prog, n_opts, opts);
    double t1 = now_ms();

    size_t log_size = 0;
    r = nv.GetProgramLogSize(prog, &log_size);
    if (r != NVRTC_SUCCESS) {
        st = mj_set_error(MJ_ERR_INTERNAL, "nvrtcGetProgramLogSize: %s", nv.GetErrorString(r));
        goto done;
    }
    out->log = malloc(log_size + 1);
    if (!out->log) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory for a %zu-byte NVRTC log", log_size);
        goto done;
    }
    out->log[0] = '\0';
    if (log_size > 0) {
        r = nv.GetProgramLog(prog, out->log);
        if (r != NVRTC_SUCCESS) {
            st = mj_set_error(MJ_ERR_INTERNAL, "nvrtcGetProgramLog: %s", nv.GetErrorString(r));
            goto done;
        }
    }
    out->log[log_size] = '\0';

    if (rc != NVRTC_SUCCESS) {
        mj_status s = rc == NVRTC_ERROR_OUT_OF_MEMORY   ? MJ_ERR_NOMEM
                      : rc == NVRTC_ERROR_INVALID_OPTION ? MJ_ERR_UNSUPPORTED
                                                         : MJ_ERR_COMPILE;
        st = compile_failed(s, source, name, t, rc, out->log);
        goto done;
    }

    /* The PTX is kept for inspection only: an NVRTC that will not hand it out after a
     * real-arch compile (NVRTC 13 does) leaves it empty rather than failing the compile. */
    size_t ptx_size = 0, cubin_size = 0;
    if (nv.GetPTXSize(prog, &ptx_size) != NVRTC_SUCCESS) ptx_size = 0;
    r = nv.GetCUBINSize(prog, &cubin_size);
    if (r != NVRTC_SUCCESS) {
        st = mj_set_error(MJ_ERR_INTERNAL, "NVRTC compiled %s for %s but has no cubin size: %s",
                          name, mj_target_name(t), nv.GetErrorString(r));
        goto done;
    }
    if (cubin_size == 0) {
        st = mj_set_error(MJ_ERR_INTERNAL, "NVRTC compiled %s for %s but produced no cubin", name,
                          mj_target_name(t));
        goto done;
    }
    out->cubin = malloc(cubin_size);
    out->ptx = malloc(ptx_size + 1);
    if (!out->cubin || !out->ptx) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory for a %zu-byte cubin", cubin_size);
        goto done;
    }
    out->ptx[0] = '\0';
    r = nv.GetCUBIN(prog, (char *)out->cubin);
    if (r != NVRTC_SUCCESS) {
        st = mj_set_error(MJ_ERR_INTERNAL, "NVRTC compiled %s for %s but cannot hand out the cubin: %s",
                          name, mj_target_name(t), nv.GetErrorString(r));
        goto done;
    }
    if (ptx_size > 0 && nv.GetPTX(prog, out->ptx) != NVRTC_SUCCESS) ptx_size = 0;
    out->ptx[ptx_size] = '\0';
    out->cubin_len = cubin_size;
    out->ptx_len = strlen(out->ptx);
    out->compile_ms = t1 - t0;
    mj_ptxas_parse(out->log, &out->report);

done:
    nv.DestroyProgram(&prog);
    if (st != MJ_OK) {
        /* Keep the full log for the caller (it may be longer than mj_last_error holds). */
        char *log = out->log;
        out->log = NULL;
        mj_compile_result_free(out);
        out->log = log;
    }
    return st;
}

void mj_compile_result_free(mj_compile_result *r) {
    if (!r) return;
    free(r->cubin);
    free(r->ptx);
    free(r->log);
    memset(r, 0, sizeof *r);
}

/* ---- the ptxas report -----------------------------------------------------------------
 * ptxas -v (NVRTC 12/13) writes, per entry function:
 *   ptxas info    : Compiling entry function 'k' for 'sm_120a'
 *   ptxas info    : Function properties for k
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 376 bytes cmem[0]
 * and a "Function properties" block (stack/spill line only) for each non-inlined callee.
 * Spill bytes are summed over every block, callees included (a spilling callee spills
 * inside its callers); the stack frame is the largest block's. Registers, smem and cmem[0]
 * come from the "Used" lines (sm_90 and later do not report cmem[0] there). */

/* The number just before key in line ("1024 bytes smem" -> 1024), or -1. */
static int32_t num_before(const char *line, const char *line_end, const char *key) {
    const char *k = strstr(line, key);
    if (!k || k >= line_end) return -1;
    const char *p = k;
    while (p > line && p[-1] == ' ') p--;
    const char *e = p;
    while (p > line && p[-1] >= '0' && p[-1] <= '9') p--;
    if (p == e) return -1;
    long v = strtol(p, NULL, 10);
    return v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

static void max_into(int32_t *dst, int32_t v) {
    if (v > *dst) *dst = v;
}

static void add_into(int32_t *dst, int32_t v) {
    if (v > 0) *dst = (*dst > INT32_MAX - v) ? INT32_MAX : *dst + v;
}

void mj_ptxas_parse(const char *log, mj_ptxas_report *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!log) return;
    int32_t used_lines = 0;
    for (const char *line = log; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        /* Work on a NUL-terminated copy so strstr stays inside the line. */
        char buf[512];
        size_t n = (size_t)(end - line);
        if (n >= sizeof buf) n = sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        const char *bend = buf + n;
        if (strstr(buf, "ptxas") || strstr(buf, "bytes stack frame")) {
            if (strstr(buf, "Compiling entry function")) out->n_functions++;
            if (strstr(buf, "bytes stack frame")) {
                int32_t v;
                if ((v = num_before(buf, bend, "bytes stack frame")) >= 0) max_into(&out->stack_frame, v);
                if ((v = num_before(buf, bend, "bytes spill stores")) >= 0) add_into(&out->spill_stores, v);
                if ((v = num_before(buf, bend, "bytes spill loads")) >= 0) add_into(&out->spill_loads, v);
            }
            const char *used = strstr(buf, "Used ");
            if (used && strstr(used, "registers")) {
                used_lines++;
                int32_t v;
                if ((v = num_before(used, bend, "registers")) >= 0) max_into(&out->registers, v);
                if ((v = num_before(used, bend, "bytes smem")) >= 0) max_into(&out->smem_static, v);
                if ((v = num_before(used, bend, "bytes cmem[0]")) >= 0) max_into(&out->cmem0, v);
            }
        }
        line = *end ? end + 1 : end;
    }
    /* A log without "Compiling entry function" lines (an older ptxas): one "Used" line per
     * function. */
    if (out->n_functions == 0) out->n_functions = used_lines;
}
