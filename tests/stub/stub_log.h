/* stub_log.h — the log both stub drivers (cuda_stub.c, nccl_stub.c) append to: one line per
 * call to $MJ_STUB_LOG, opened and closed each time so the two libraries' lines interleave in
 * call order; nothing when the variable is unset or empty. */
#ifndef MJ_STUB_LOG_H
#define MJ_STUB_LOG_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void logf_(const char *fmt, ...) {
    const char *path = getenv("MJ_STUB_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

#endif
