/* tools.h — what the subcommands of `moejit` share. */
#ifndef MJ_TOOLS_H
#define MJ_TOOLS_H

#include "moejit.h"
#include "npy.h"

#include <stdio.h>

/* Each subcommand: argc/argv start at the subcommand's name. Returns the exit code. */
int cmd_route(int argc, char **argv);
int cmd_nvfp4(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_prewarm(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_make_checkpoint(int argc, char **argv);

/* One line on stderr, "moejit: ...", and the exit code 1 (or 2 for usage errors). */
int tool_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tool_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A failed library call: the status and mj_last_error(). */
int tool_fail_status(const char *what, mj_status s);

/* GPUs by name, for floors: peak DRAM bandwidth in GB/s (tools/gpus.c). */
typedef struct tool_gpu {
    const char *name;          /* "rtx-pro-6000"                                           */
    const char *desc;
    double gbps;
} tool_gpu;
const tool_gpu *tool_gpu_find(const char *name);
const char *tool_gpu_names(void);
int tool_gpu_count(void);
const tool_gpu *tool_gpu_at(int i);

/* Parse a whole integer / positive finite float argument or fail with a usage line. */
int tool_parse_int(const char *cmd, const char *opt, const char *text, long lo, long hi, int *out);
int tool_parse_positive_float(const char *cmd, const char *opt, const char *text, float *out);

#endif
