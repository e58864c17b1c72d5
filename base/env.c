/* env.c — numeric settings from the environment, and the CPUs this process may run on. */
#include "base.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

long mj_env_long(const char *name, long lo, long hi, long dflt, int *bad) {
    if (bad) *bad = 0;
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        if (bad) *bad = 1;
        return dflt;
    }
    return x;
}

int mj_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
