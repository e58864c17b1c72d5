/* error.c — status strings and the thread-local last-error detail. */
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char g_last_error[4096];

static const char *const k_status_text[MJ_STATUS_COUNT] = {
    [MJ_OK] = "ok",
    [MJ_ERR_INVALID_ARG] = "invalid argument",
    [MJ_ERR_CONFIG] = "invalid model configuration",
    [MJ_ERR_UNSUPPORTED] = "unsupported",
    [MJ_ERR_PARSE] = "malformed input file",
    [MJ_ERR_IO] = "input/output error",
    [MJ_ERR_NONFINITE] = "NaN or Inf in input",
    [MJ_ERR_NOMEM] = "out of memory",
    [MJ_ERR_NO_DEVICE] = "no CUDA device",
    [MJ_ERR_LIBRARY] = "required shared library missing",
    [MJ_ERR_COMPILE] = "kernel compilation failed",
    [MJ_ERR_CACHE_MISS] = "kernel not in cache (strict mode)",
    [MJ_ERR_CUDA] = "CUDA driver error",
    [MJ_ERR_INTERNAL] = "internal error",
    [MJ_ERR_KERNEL] = "kernel failed as it ran",
    [MJ_ERR_COMM] = "collective communication failed",
};

const char *mj_status_string(mj_status s) {
    if ((int)s < 0 || s >= MJ_STATUS_COUNT || !k_status_text[s]) return "unknown status";
    return k_status_text[s];
}

const char *mj_last_error(void) { return g_last_error; }

mj_status mj_set_error(mj_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return s;
}

mj_status mj_error_prefix(mj_status s, const char *fmt, ...) {
    /* Both pieces are copied out first: the thread's buffer is then written once, and an
     * argument that points into it (mj_last_error()) is read before it changes. */
    char prefix[1024], detail[sizeof g_last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(detail, g_last_error, sizeof detail);
    size_t n = strlen(prefix); /* < sizeof prefix, so it and ": " fit */
    memcpy(g_last_error, prefix, n);
    if (detail[0]) {
        memcpy(g_last_error + n, ": ", 2);
        n += 2;
        size_t d = strlen(detail);
        if (d > sizeof g_last_error - 1 - n) d = sizeof g_last_error - 1 - n; /* cut at the end */
        memcpy(g_last_error + n, detail, d);
        n += d;
    }
    g_last_error[n] = '\0';
    return s;
}

void mj_clear_error(void) { g_last_error[0] = '\0'; }

mj_status mj_version(int *major, int *minor, int *patch, const char **text) {
    if (major) *major = MJ_VERSION_MAJOR;
    if (minor) *minor = MJ_VERSION_MINOR;
    if (patch) *patch = MJ_VERSION_PATCH;
    if (text) *text = MJ_VERSION_STRING;
    return MJ_OK;
}

void mj_warn(const char *fmt, ...) {
    const char *q = getenv("MOEJIT_QUIET");
    if (q && *q && strcmp(q, "0") != 0) return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moejit: warning: %s\n", line); /* one call: lines do not interleave */
}

const char *mj_printable(const char *s, char *buf, size_t len) {
    if (!buf || len == 0) return "";
    size_t n = 0;
    buf[0] = '\0';
    if (!s) return buf;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char piece[8];
        if (c >= 0x20 && c < 0x7f) piece[0] = (char)c, piece[1] = '\0';
        else snprintf(piece, sizeof piece, "\\x%02x", c);
        size_t p = strlen(piece);
        if (n + p + 4 > len) { /* room for "..." and the NUL */
            if (len >= 4) snprintf(buf + (n < len - 4 ? n : len - 4), 4, "...");
            return buf;
        }
        memcpy(buf + n, piece, p + 1);
        n += p;
    }
    return buf;
}

mj_status mj_struct_load(const void *in, size_t v1_size, size_t size, void *out, const char *type,
                         const char *init) {
    if (!in) return mj_set_error(MJ_ERR_INVALID_ARG, "%s is NULL", type);
    uint32_t n;
    memcpy(&n, in, sizeof n);
    if (n < v1_size || n > size)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%s.struct_size is %u, expected %zu: initialize it with %s", type, n, size, init);
    memcpy(out, in, n);
    return MJ_OK;
}

void mj_struct_store(void *caller, const void *result, size_t size) {
    uint32_t n;
    memcpy(&n, caller, sizeof n);
    if (n > size) n = (uint32_t)size;
    memcpy((char *)caller + sizeof n, (const char *)result + sizeof n, n > sizeof n ? n - sizeof n : 0);
}
