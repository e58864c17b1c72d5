/* sass.c — a cubin's SASS through nvdisasm or cuobjdump, which ship with the CUDA toolkit:
 * for `moejit inspect show --sass` and for the performance model (bench --predict). */
#include "tools.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int tool_sass_text(const void *bin, size_t len, char **text) {
    static const char *const tools_[] = {"nvdisasm", "cuobjdump"};
    char tool[4096] = "";
    const char *path = getenv("PATH"), *env = getenv("MOEJIT_NVDISASM");
    *text = NULL;
    if (env && *env) {
        if (access(env, X_OK) != 0) return tool_fail("MOEJIT_NVDISASM=%s is not an executable file", env);
        snprintf(tool, sizeof tool, "%s", env);
    }
    for (int t = 0; t < 2 && !tool[0]; t++) {
        char *dirs = strdup(path ? path : ""), *save = NULL;
        for (char *d = strtok_r(dirs, ":", &save); d && !tool[0]; d = strtok_r(NULL, ":", &save)) {
            char cand[4096];
            snprintf(cand, sizeof cand, "%s/%s", d, tools_[t]);
            if (access(cand, X_OK) == 0) snprintf(tool, sizeof tool, "%s", cand);
        }
        free(dirs);
        char cand[4096];
        snprintf(cand, sizeof cand, "/usr/local/cuda/bin/%s", tools_[t]);
        if (!tool[0] && access(cand, X_OK) == 0) snprintf(tool, sizeof tool, "%s", cand);
    }
    if (!tool[0])
        return tool_fail("no nvdisasm or cuobjdump found on PATH or in /usr/local/cuda/bin: install one "
                         "(pip install nvidia-cuda-nvdisasm, or the CUDA toolkit's cuda-nvdisasm "
                         "package) and put it on PATH or name it in MOEJIT_NVDISASM");
    /* A private directory (mkdtemp: ours, mode 0700) for the cubin and the listing, so no
     * name in a shared TMPDIR is opened by a guessable path (no planted link or FIFO). */
    const char *td = getenv("TMPDIR");
    char dir[4096], tmp[4200], out[4200];
    snprintf(dir, sizeof dir, "%s/moejit-sass-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(dir)) return tool_fail("cannot create a temporary directory in %s: %s", td && *td ? td : "/tmp",
                                        strerror(errno));
    snprintf(tmp, sizeof tmp, "%s/k.cubin", dir);
    snprintf(out, sizeof out, "%s/k.sass", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), ok = fd >= 0;
    for (size_t done = 0; ok && done < len;) {
        ssize_t w = write(fd, (const char *)bin + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) ok = 0;
        else done += (size_t)w;
    }
    if (fd >= 0) close(fd);
    int ofd = ok ? open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
    if (ofd < 0) {
        unlink(tmp), rmdir(dir);
        return tool_fail("cannot write a temporary file in %s", dir);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(ofd, 1);
        if (strstr(tool, "nvdisasm")) execl(tool, tool, "-c", tmp, (char *)NULL);
        else execl(tool, tool, "-sass", tmp, (char *)NULL);
        _exit(127);
    }
    close(ofd);
    int status = 0;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    unlink(tmp);
    FILE *f = fopen(out, "rb");
    char *buf = NULL;
    size_t n = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        rewind(f);
        buf = malloc(sz > 0 ? (size_t)sz + 1 : 1);
        if (buf) n = fread(buf, 1, sz > 0 ? (size_t)sz : 0, f), buf[n] = '\0';
        fclose(f);
    }
    unlink(out), rmdir(dir);
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) || !buf) {
        free(buf);
        return tool_fail("%s failed on the cubin", tool);
    }
    *text = buf;
    return 0;
}
