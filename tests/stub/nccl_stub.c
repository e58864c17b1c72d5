/* nccl_stub.c — a stand-in for libnccl.so.2 that tests load through MOEJIT_NCCL, so the
 * host side of the NCCL communicator (loading, ids, init, the all-reduce's arguments, error
 * text, who destroys what) is exercised without NCCL or a GPU.
 *
 * Every call appends a line to $MJ_STUB_LOG (the same log as cuda_stub.c's). Communicators
 * are plain heap objects; ncclAllReduce of a one-rank communicator copies send to recv
 * (host memory stands in for device memory), of more ranks only logs. Knobs:
 *   MJ_STUB_NCCL_FAIL=ncclAllReduce:5   that call returns code 5 (ncclInvalidUsage), and
 *                                       ncclGetLastError says so;
 *   MJ_STUB_NCCL_VERSION=N              ncclGetVersion's code (default 22703: 2.27.3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub_log.h"

typedef int ncclResult_t;
typedef struct ncclComm {
    unsigned magic;
    int nranks, rank, dev;
} *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;

#define STUB_MAGIC 0x4e43434cu /* "NCCL" */

static char g_last_error[256];
static int g_ids;

/* The code MJ_STUB_NCCL_FAIL asks `call` to fail with, else 0. */
static ncclResult_t injected(const char *call) {
    const char *f = getenv("MJ_STUB_NCCL_FAIL");
    size_t n = strlen(call);
    if (!f || strncmp(f, call, n) != 0 || f[n] != ':') return 0;
    snprintf(g_last_error, sizeof g_last_error, "stub: %s failed on purpose (MJ_STUB_NCCL_FAIL)", call);
    logf_("%s fails with %d", call, atoi(f + n + 1));
    return atoi(f + n + 1);
}

static int valid(ncclComm_t c) { return c && c->magic == STUB_MAGIC; }

ncclResult_t ncclGetVersion(int *version) {
    const char *v = getenv("MJ_STUB_NCCL_VERSION");
    if (!version) return 4;
    *version = v && *v ? atoi(v) : 22703;
    return 0;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case 0: return "no error";
    case 1: return "unhandled cuda error (stub)";
    case 2: return "unhandled system error (stub)";
    case 3: return "internal error (stub)";
    case 4: return "invalid argument (stub)";
    case 5: return "invalid usage (stub)";
    case 6: return "remote process exited or there was a network error (stub)";
    case 7: return "NCCL operation in progress (stub)";
    default: return "unknown result code (stub)";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return g_last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    ncclResult_t r = injected("ncclGetUniqueId");
    if (r) return r;
    if (!id) return 4;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "stub-id-%d", ++g_ids);
    logf_("ncclGetUniqueId %s", id->internal);
    return 0;
}

static ncclComm_t make(int nranks, int rank, int dev) {
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = STUB_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->dev = dev;
    return c;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    ncclResult_t r = injected("ncclCommInitRank");
    if (r) return r;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return 4;
    *comm = make(nranks, rank, 0);
    if (!*comm) return 2;
    logf_("ncclCommInitRank comm=%p nranks=%d rank=%d id=%.*s", (void *)*comm, nranks, rank,
          (int)sizeof id.internal, id.internal);
    return 0;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    ncclResult_t r = injected("ncclCommInitAll");
    if (r) return r;
    if (!comms || ndev < 1) return 4;
    for (int i = 0; i < ndev; i++) {
        comms[i] = make(ndev, i, devlist ? devlist[i] : i);
        if (!comms[i]) return 2;
        logf_("ncclCommInitAll comm=%p rank=%d of %d dev=%d", (void *)comms[i], i, ndev, comms[i]->dev);
    }
    return 0;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t r = injected("ncclCommCount");
    if (r) return r;
    if (!valid(comm) || !count) return 4;
    *count = comm->nranks;
    return 0;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!valid(comm) || !rank) return 4;
    *rank = comm->rank;
    return 0;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                           ncclComm_t comm, void *stream) {
    ncclResult_t r = injected("ncclAllReduce");
    if (r) return r;
    if (!valid(comm)) return 4;
    logf_("ncclAllReduce send=%p recv=%p count=%zu datatype=%d op=%d comm=%p stream=%p", send, recv,
          count, datatype, op, (void *)comm, stream);
    if (comm->nranks == 1 && datatype == 7 && send != recv) memmove(recv, send, count * 4);
    return 0;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    ncclResult_t r = injected("ncclCommDestroy");
    if (r) return r;
    if (!valid(comm)) return 4;
    logf_("ncclCommDestroy comm=%p", (void *)comm);
    comm->magic = 0;
    free(comm);
    return 0;
}
