/* mem.c — memory where kernels run (see mem.h). */
#include "mem.h"
#include "cuda/cudalibs.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_llong g_allocs, g_bytes;

long long mj_mem_allocs(void) { return atomic_load(&g_allocs); }
long long mj_mem_bytes(void) { return atomic_load(&g_bytes); }

mj_status mj_mem_alloc(int device, size_t bytes, const char *what, void **out) {
    *out = NULL;
    if (device == MJ_DEVICE_NONE) {
        *out = calloc(1, bytes ? bytes : 1);
        if (*out) atomic_fetch_add(&g_allocs, 1), atomic_fetch_add(&g_bytes, (long long)bytes);
        return *out ? MJ_OK : mj_set_error(MJ_ERR_NOMEM, "%s: out of host memory (%zu bytes)", what, bytes);
    }
    uint64_t d = 0;
    MJ_CHECK(mj_cuda_bind(device));
    mj_status st = mj_cuda_malloc(bytes ? bytes : 1, &d);
    if (st != MJ_OK) return mj_error_prefix(st, "%s: %zu bytes of device memory", what, bytes);
    *out = (void *)(uintptr_t)d;
    atomic_fetch_add(&g_allocs, 1);
    atomic_fetch_add(&g_bytes, (long long)bytes);
    return MJ_OK;
}

mj_status mj_mem_put(int device, void *dst, const void *src, size_t bytes) {
    if (device == MJ_DEVICE_NONE) {
        if (bytes) memcpy(dst, src, bytes);
        return MJ_OK;
    }
    /* From pageable memory the copy returns once the bytes are staged: the DMA may still be
     * in flight, ordered only with the NULL stream. Wait for it, so that work on any stream
     * (the caller's non-blocking one) sees the bytes. */
    MJ_CHECK(mj_cuda_memcpy_htod((uint64_t)(uintptr_t)dst, src, bytes));
    return mj_cuda_synchronize();
}

mj_status mj_mem_zero(int device, void *dst, size_t bytes) {
    if (device == MJ_DEVICE_NONE) {
        if (bytes) memset(dst, 0, bytes);
        return MJ_OK;
    }
    void *zero = calloc(1, bytes ? bytes : 1);
    if (!zero) return mj_set_error(MJ_ERR_NOMEM, "out of host memory (%zu bytes of zeros)", bytes);
    const mj_status st = mj_mem_put(device, dst, zero, bytes);
    free(zero);
    return st;
}

mj_status mj_mem_get(int device, void *dst, const void *src, size_t bytes) {
    if (device == MJ_DEVICE_NONE) {
        if (bytes) memcpy(dst, src, bytes);
        return MJ_OK;
    }
    return mj_cuda_memcpy_dtoh(dst, (uint64_t)(uintptr_t)src, bytes);
}

void mj_mem_free(int device, void *p) {
    if (!p) return;
    if (device == MJ_DEVICE_NONE) free(p);
    else mj_cuda_free((uint64_t)(uintptr_t)p);
}
