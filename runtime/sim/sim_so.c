/* sim_so.c — the sim's compiler and loader: rendered source -> the host C compiler -> a
 * shared object (the cache entry's binary) -> dlopen.
 *
 *   compile  the source goes to a private temp directory (mkdtemp); `$CC` (else cc; split
 *            on blanks as make does, run with fork/exec, no shell) builds kernel.so from it
 *            with the fixed options of mj_sim_options(), the paths and each option one
 *            argument (a blank in $TMPDIR is part of the path); its output is the log. The object's bytes
 *            are kept, the directory removed; after an error the source stays there.
 *   load     the bytes go to a private temp file, dlopen(RTLD_NOW | RTLD_LOCAL) maps it and
 *            the file is unlinked at once; mj_sim_bind hands the object the runtime's
 *            function table (so it needs no symbol of libmoejit), mj_sim_entry_<kernel> are
 *            the kernels' trampolines.
 */
#include "sim/sim.h"
#include "file.h"

#define MJ_SIM_ABI_ONLY
#include "prelude_sim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* -O2 for speed; hidden symbols but the trampolines (no interposition); C with CUDA's
 * habits: type punning through pointers, no FMA contraction (results as the host's C).
 * One argument each; mj_sim_options() is them joined by blanks (for keys and messages). */
#if MJ_SIM_ASAN
#define MJ_SIM_ASAN_WORDS "-fsanitize=address", "-fno-omit-frame-pointer",
#else
#define MJ_SIM_ASAN_WORDS
#endif
static const char *const k_sim_options[] = {"-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                                            "-fno-strict-aliasing", "-ffp-contract=off", "-w", MJ_SIM_ASAN_WORDS
                                            "-lm"};
#define N_SIM_OPTIONS ((int)(sizeof k_sim_options / sizeof *k_sim_options))

static pthread_once_t g_options_once = PTHREAD_ONCE_INIT;
static char g_options[256];

static void join_options(void) {
    size_t n = 0;
    for (int i = 0; i < N_SIM_OPTIONS; i++)
        n += (size_t)snprintf(g_options + n, sizeof g_options - n, "%s%s", i ? " " : "", k_sim_options[i]);
}

const char *mj_sim_options(void) {
    pthread_once(&g_options_once, join_options);
    return g_options;
}

/* Room the log gets in the 4 KiB thread-local error text. */
#define MJ_LOG_IN_ERROR 2800

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *tmp_dir(void) {
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/tmp";
}

/* ---- running the compiler ------------------------------------------------------------- */

#define MAX_ARGS 64
typedef struct argv_buf {
    char text[2048];
    char *argv[MAX_ARGS + 1];
    int argc;
} argv_buf;

/* Append s as one argument (a path: blanks and quotes are part of it). */
static int add_arg(argv_buf *a, size_t *used, const char *s) {
    size_t n = strlen(s);
    if (*used + n + 1 > sizeof a->text || a->argc == MAX_ARGS) return -1;
    char *p = a->text + *used;
    memcpy(p, s, n + 1);
    *used += n + 1;
    a->argv[a->argc++] = p;
    a->argv[a->argc] = NULL;
    return 0;
}

/* Append the blank-separated words of s: only $CC, which is a command line of the user's
 * ("ccache gcc", as make splits it); never a path or an option of ours. */
static int add_words(argv_buf *a, size_t *used, const char *s) {
    size_t n = strlen(s);
    if (*used + n + 1 > sizeof a->text) return -1;
    char *p = a->text + *used;
    memcpy(p, s, n + 1);
    *used += n + 1;
    for (char *save = NULL, *w = strtok_r(p, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        if (a->argc == MAX_ARGS) return -1;
        a->argv[a->argc++] = w;
    }
    a->argv[a->argc] = NULL;
    return 0;
}

static const char *cc_command(void) {
    const char *cc = getenv("CC");
    return cc && *cc ? cc : "cc";
}

/* Run argv (PATH search, no shell) with stdin from /dev/null and stdout + stderr into *out
 * (malloc'd, NUL-terminated). *status: the exit status, 128 + signal, or 127 when it could
 * not be started. */
static mj_status run_capture(char *const *argv, char **out, int *status) {
    *out = NULL;
    *status = -1;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return mj_set_error(MJ_ERR_IO, "sim: pipe failed: %s", strerror(errno));
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]), close(fds[1]);
        if (devnull >= 0) close(devnull);
        return mj_set_error(MJ_ERR_IO, "sim: fork failed: %s", strerror(e));
    }
    if (pid == 0) { /* the child: only async-signal-safe calls */
        if (devnull >= 0) dup2(devnull, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        execvp(argv[0], argv);
        static const char msg[] = "moejit: exec of the host C compiler failed\n";
        ssize_t r = write(2, msg, sizeof msg - 1);
        (void)r;
        _exit(127);
    }
    close(fds[1]);
    if (devnull >= 0) close(devnull);
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && len + 1024 > cap) {
            char *nb = cap < (8u << 20) ? realloc(buf, cap * 2) : NULL;
            if (nb) buf = nb, cap *= 2;
        }
        char sink[1024];
        int room = buf && len + 1024 <= cap;
        ssize_t r = read(fds[0], room ? buf + len : sink, room ? cap - len - 1 : sizeof sink);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (room) len += (size_t)r;
    }
    close(fds[0]);
    int ws = 0;
    pid_t w;
    while ((w = waitpid(pid, &ws, 0)) < 0 && errno == EINTR) {
    }
    if (w < 0) *status = 0; /* reaped elsewhere (SIGCHLD ignored): judge by the output file */
    else if (WIFEXITED(ws)) *status = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws)) *status = 128 + WTERMSIG(ws);
    if (!buf) return mj_set_error(MJ_ERR_NOMEM, "sim: out of memory reading the compiler's output");
    buf[len] = '\0';
    *out = buf;
    return MJ_OK;
}

/* ---- the compiler's version, once per process -------------------------------------------- */

static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;
static char g_version[600];
static char g_version_error[1200];

static void find_version(void) {
    argv_buf a = {.argc = 0};
    size_t used = 0;
    const char *cc = cc_command();
    if (add_words(&a, &used, cc) != 0 || a.argc == 0 || add_arg(&a, &used, "--version") != 0) {
        snprintf(g_version_error, sizeof g_version_error, "$CC is empty or too long: '%.200s'", cc);
        return;
    }
    char *out = NULL;
    int status;
    if (run_capture(a.argv, &out, &status) != MJ_OK) {
        snprintf(g_version_error, sizeof g_version_error, "%s", mj_last_error());
        return;
    }
    size_t n = strcspn(out, "\n");
    if (status != 0 || n == 0) {
        snprintf(g_version_error, sizeof g_version_error,
                 "the host C compiler '%.200s' could not be run (`%.200s --version`: exit status %d%s): "
                 "install gcc, or set $CC to a C compiler",
                 cc, cc, status, status == 127 ? ", not found" : "");
    } else {
        snprintf(g_version, sizeof g_version, "sim %.*s", (int)(n < 500 ? n : 500), out);
    }
    free(out);
}

mj_status mj_sim_compiler(const char **version) {
    pthread_once(&g_version_once, find_version);
    if (g_version_error[0]) return mj_set_error(MJ_ERR_COMPILE, "%s", g_version_error);
    if (version) *version = g_version;
    return MJ_OK;
}

/* ---- compiling --------------------------------------------------------------------------- */

static int write_file(const char *path, const void *data, size_t len, int mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w, len -= (size_t)w;
    }
    return close(fd);
}

/* The compiled kernel, from the temporary directory made for it: a regular file, never
 * through a symbolic link (base/file.c), not empty. */
#define MJ_SIM_SO_MAX (256u << 20)
static int read_file(const char *path, uint8_t **data, size_t *len) {
    char *text;
    if (mj_file_read(AT_FDCWD, path, NULL, MJ_SIM_SO_MAX, 0, &text, len) != MJ_OK) return -1;
    if (*len == 0) {
        free(text);
        mj_set_error(MJ_ERR_COMPILE, "%s is empty", path);
        return -1;
    }
    *data = (uint8_t *)text;
    return 0;
}

mj_status mj_sim_compile(const char *source, const char *name, mj_compile_result *out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_compile: out is NULL");
    memset(out, 0, sizeof *out);
    if (!source || !name) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_compile: NULL argument");
    MJ_CHECK(mj_sim_compiler(NULL));
    char dir[512], src[600], so[600];
    snprintf(dir, sizeof dir, "%s/moejit-sim-XXXXXX", tmp_dir());
    if (!mkdtemp(dir))
        return mj_set_error(MJ_ERR_IO, "sim: cannot create a temp directory under %s: %s", tmp_dir(),
                            strerror(errno));
    snprintf(src, sizeof src, "%s/kernel.c", dir);
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    if (write_file(src, source, strlen(source), 0600) != 0) {
        mj_status st = mj_set_error(MJ_ERR_IO, "sim: cannot write %s: %s", src, strerror(errno));
        unlink(src), rmdir(dir);
        return st;
    }
    argv_buf a = {.argc = 0};
    size_t used = 0;
    int bad = add_words(&a, &used, cc_command()) || add_arg(&a, &used, "-o") || add_arg(&a, &used, so) ||
              add_arg(&a, &used, src);
    for (int i = 0; i < N_SIM_OPTIONS && !bad; i++) bad = add_arg(&a, &used, k_sim_options[i]);
    if (bad) {
        unlink(src), rmdir(dir);
        return mj_set_error(MJ_ERR_INVALID_ARG, "sim: the compiler command line is too long ($CC, $TMPDIR)");
    }
    double t0 = now_ms();
    char *log = NULL;
    int status = -1;
    mj_status st = run_capture(a.argv, &log, &status);
    out->compile_ms = now_ms() - t0;
    if (st != MJ_OK) {
        unlink(src), rmdir(dir);
        return st;
    }
    out->log = log;
    if (status == 0 && read_file(so, &out->cubin, &out->cubin_len) == 0) {
        unlink(so), unlink(src), rmdir(dir);
        return MJ_OK;
    }
    /* Exit status 0 with no usable output: say what is wrong with it. */
    char output[480] = "";
    if (status == 0) snprintf(output, sizeof output, ", but its output is not usable: %.400s", mj_last_error());
    unlink(so);
    size_t n = strlen(log), keep = n;
    int cut = n > MJ_LOG_IN_ERROR;
    if (cut) {
        keep = MJ_LOG_IN_ERROR;
        while (keep > MJ_LOG_IN_ERROR / 2 && log[keep - 1] != '\n') keep--;
    }
    return mj_set_error(MJ_ERR_COMPILE,
                        "the host C compiler (%s) could not compile %s (exit status %d%s%s); "
                        "source kept at %s; log:\n%.*s%s",
                        cc_command(), name, status, status == 127 ? ": compiler not found?" : "", output, src,
                        (int)keep, log, cut ? "\n[... log truncated: the full log is in the compile result]" : "");
}

/* ---- loading ----------------------------------------------------------------------------- */

struct mj_sim_module {
    void *dl;
    int n;
    mj_sim_entry entries[];
};

mj_status mj_sim_module_load(const void *so, size_t len, const mj_template_desc *t,
                             mj_sim_module **out) {
    if (!so || !len || !t || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_sim_module_load: NULL argument");
    *out = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/moejit-sim-XXXXXX.so", tmp_dir());
    int fd = mkstemps(path, 3);
    if (fd < 0)
        return mj_set_error(MJ_ERR_IO, "sim: cannot create a temp file under %s: %s", tmp_dir(), strerror(errno));
    close(fd);
    if (write_file(path, so, len, 0600) != 0) {
        mj_status st = mj_set_error(MJ_ERR_IO, "sim: cannot write %s: %s", path, strerror(errno));
        unlink(path);
        return st;
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    char why[1024] = "";
    if (!dl) snprintf(why, sizeof why, "%s", dlerror());
    unlink(path);
    if (!dl)
        return mj_set_error(MJ_ERR_LIBRARY, "sim: cannot load the kernel object of %s: %s (is %s "
                            "mounted noexec? set $TMPDIR)", t->name, why, tmp_dir());
    mj_sim_module *m = calloc(1, sizeof *m + sizeof(mj_sim_entry) * (size_t)t->n_kernels);
    if (!m) {
        dlclose(dl);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory loading %s", t->name);
    }
    m->dl = dl;
    m->n = t->n_kernels;
    int (*bind)(const struct mj_sim_api *) = (int (*)(const struct mj_sim_api *))dlsym(dl, "mj_sim_bind");
    int abi = bind ? bind(mj_sim_api_table()) : -1;
    if (abi != MJ_SIM_ABI_VERSION) {
        mj_sim_module_unload(m);
        return mj_set_error(MJ_ERR_INTERNAL, "sim: the kernel object of %s %s (this library speaks ABI %d)",
                            t->name, bind ? "was built for another sim ABI" : "has no mj_sim_bind",
                            MJ_SIM_ABI_VERSION);
    }
    for (int i = 0; i < t->n_kernels; i++) {
        char sym[300];
        snprintf(sym, sizeof sym, "mj_sim_entry_%s", t->kernels[i].name);
        m->entries[i] = (mj_sim_entry)dlsym(dl, sym);
        if (!m->entries[i]) {
            mj_sim_module_unload(m);
            return mj_set_error(MJ_ERR_INTERNAL, "sim: the kernel object of %s has no %s", t->name, sym);
        }
    }
    *out = m;
    return MJ_OK;
}

void mj_sim_module_unload(mj_sim_module *m) {
    if (!m) return;
    if (m->dl) dlclose(m->dl);
    free(m);
}

mj_sim_entry mj_sim_module_entry(const mj_sim_module *m, int kernel) {
    return m && kernel >= 0 && kernel < m->n ? m->entries[kernel] : NULL;
}
