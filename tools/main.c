/* main.c — the `moejit` command: dispatch to subcommands, --help, --version. */
#include "tools.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char k_usage[] =
    "usage: moejit <command> [options]\n"
    "\n"
    "moejit generates, compiles and caches CUDA kernels for the Mixture-of-Experts layer of\n"
    "NVFP4-quantized models (GLM-5 and its kin), with OEA routing.\n"
    "\n"
    "commands:\n"
    "  route      route tokens from logits in a .npy file (plain top-k or OEA); prints JSON\n"
    "  nvfp4      quantize a float32 .npy matrix to NVFP4 (ModelOpt layout), or dequantize\n"
    "  demo       the whole pipeline on a small GLM-5-shaped checkpoint: the layer through\n"
    "             the kernels on 8 ranks (TP and EP), with and without OEA, checked\n"
    "  run        one MoE layer of a checkpoint on a batch from a .npy file\n"
    "  prewarm    compile the kernels a manifest or a model config needs into the cache (no\n"
    "             GPU needed)\n"
    "  inspect    the kernel cache: list, show (source, PTX, SASS, log), templates, gc,\n"
    "             verify, --stats\n"
    "  bench      what a model's MoE layer costs: compile times, the launch path, bytes read\n"
    "             against the floor; with a GPU, timed routing, experts and layer (graphs too)\n"
    "  make-checkpoint\n"
    "             write a Hugging Face checkpoint (ModelOpt NVFP4 layout) of random MoE layers\n"
    "  models     the model families moejit reads (by model_type): routing, keys, tensor\n"
    "             names, sources; those refused and why\n"
    "\n"
    "Run 'moejit <command> --help' for a command's options.\n"
    "  -h, --help       this text\n"
    "  -V, --version    print the version\n";

int tool_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("moejit: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int tool_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moejit %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'moejit %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int tool_fail_status(const char *what, mj_status s) {
    return tool_fail("%s: %s: %s", what, mj_status_string(s), mj_last_error());
}

static int run(int argc, char **argv) {
    if (argc < 2) {
        fputs(k_usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(k_usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
        tool_print_version();
        return 0;
    }
    if (!strcmp(cmd, "route")) return cmd_route(argc - 1, argv + 1);
    if (!strcmp(cmd, "nvfp4")) return cmd_nvfp4(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "prewarm")) return cmd_prewarm(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "make-checkpoint")) return cmd_make_checkpoint(argc - 1, argv + 1);
    if (!strcmp(cmd, "models")) return cmd_models(argc - 1, argv + 1);
    fprintf(stderr, "moejit: unknown command '%s' (see 'moejit --help')\n", cmd);
    return 2;
}

int main(int argc, char **argv) {
    int rc = run(argc, argv);
    /* Output that never reached its reader (a full disk, a closed pipe, /dev/full) means
     * the command did not do its job: say so once and exit 1. A command that already
     * failed has said why; its exit code stands. */
    int lost = ferror(stdout) != 0, err = 0;
    errno = 0;
    if (fflush(stdout) != 0) lost = 1, err = errno;
    if (fclose(stdout) != 0 && !err) lost = 1, err = errno;
    if (lost && rc == 0) {
        fprintf(stderr, "moejit: cannot write to standard output%s%s: the output is incomplete; "
                "check the disk or pipe it goes to\n", err ? ": " : "", err ? strerror(err) : "");
        rc = 1;
    }
    return rc;
}
