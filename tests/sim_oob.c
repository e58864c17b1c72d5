/* sim_oob.c — under AddressSanitizer, an out-of-bounds write in a kernel run on the sim is
 * caught: kernel objects are built with -fsanitize=address when libmoejit is. This program
 * must die with ASan's heap-buffer-overflow report (ctest checks the output); it is built
 * only with MJ_SANITIZE. */
#include "jit.h"
#include "mj_test_registry.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sim_oob CACHE_DIR\n");
        return 2;
    }
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = argv[1];
    o.device = MJ_DEVICE_NONE;
    o.backend = MJ_BACKEND_SIM;
    mj_context_t c = NULL;
    mj_spec s;
    const mj_function *f = NULL;
    if (mj_context_create(&o, &c) || mj_context_spec(c, "fixture_sim_deadlock", NULL, &s) ||
        mj_jit_get(c, &s, &f)) {
        fprintf(stderr, "sim_oob: %s\n", mj_last_error());
        return 2;
    }
    int *out = malloc(63 * 64 * sizeof *out); /* one block short */
    mj_launch_dims d = {{64, 1, 1}, {64, 1, 1}, 0, NULL};
    mj_status st = mj_launch_fixture_sim_trap(f, d, out, -1, -1);
    fprintf(stderr, "sim_oob: the out-of-bounds write was not caught (%s)\n", mj_status_string(st));
    return 1;
}
