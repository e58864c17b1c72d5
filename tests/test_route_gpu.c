/* test_route_gpu.c — the routing table of test_route_kernels.c on a real GPU, when one is
 * present (exit 77, reported by ctest as skipped, when none is). */
#define ROUTE_TEST_GPU 1
#include "test_route_kernels.c"
