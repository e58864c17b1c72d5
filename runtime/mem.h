/* mem.h — memory where kernels run: device memory on a GPU (device >= 0), host memory for
 * the interpreter (MJ_DEVICE_NONE). Not public. */
#ifndef MJ_MEM_H
#define MJ_MEM_H

#include "base.h"

#include <stddef.h>

/* Zeroed on the interpreter; uninitialized on a GPU. `what` labels the error. */
mj_status mj_mem_alloc(int device, size_t bytes, const char *what, void **out);
/* Returns when the bytes are on the device (synchronized), so work on any stream sees them. */
mj_status mj_mem_put(int device, void *dst, const void *src, size_t bytes);
mj_status mj_mem_get(int device, void *dst, const void *src, size_t bytes);
/* bytes of zeros at dst, synchronized as mj_mem_put (counters a kernel leaves at 0 again). */
mj_status mj_mem_zero(int device, void *dst, size_t bytes);
void mj_mem_free(int device, void *p);
/* Allocations made by mj_mem_alloc so far in this process (successful ones): tests prove
 * with it that a forward after prepare allocates nothing. */
long long mj_mem_allocs(void);
/* Their bytes, added up (frees not subtracted): tests measure what a call allocated. */
long long mj_mem_bytes(void);

#endif /* MJ_MEM_H */
