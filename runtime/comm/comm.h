/* comm.h — communicators behind one interface: what the layer runtime calls to sum the
 * ranks' partial outputs, whichever kind of group it was handed (loopback threads or NCCL).
 * Not installed, not public.
 *
 * Every handle starts with struct mj_comm: its ops table (the kind, the all-reduce, abort,
 * free), its rank and the group's size. The public mj_comm_* calls check the handle and
 * dispatch through the table, so a new kind is one more table. */
#ifndef MJ_COMM_H
#define MJ_COMM_H

#include "base.h"

typedef enum mj_comm_backend {
    MJ_COMM_NONE = 0,       /* not a communicator (NULL)                                   */
    MJ_COMM_LOOPBACK = 1,   /* threads of this process; host buffers                       */
    MJ_COMM_NCCL = 2,       /* libnccl; device buffers, asynchronous on a stream           */
} mj_comm_backend;

typedef struct mj_comm_ops {
    mj_comm_backend kind;
    const char *name;                           /* "loopback", "nccl": for messages         */
    mj_status (*all_reduce_f32)(mj_comm_t c, const float *send, float *recv, int64_t count,
                                void *stream);
    mj_status (*abort)(mj_comm_t c, const char *why);   /* NULL: the kind cannot abort      */
    mj_status (*free)(mj_comm_t c);                     /* frees c itself too               */
} mj_comm_ops;

struct mj_comm {
    const mj_comm_ops *ops;
    int32_t rank, n_ranks;
};

/* Which kind c is (MJ_COMM_NONE for NULL): the layer runtime refuses a loopback comm with
 * device buffers and an NCCL comm with the interpreter's host buffers. */
mj_comm_backend mj_comm_kind(mj_comm_t c);

/* Abort c's group: every rank waiting in a collective, and every later call on any of the
 * group's handles, returns MJ_ERR_COMM with `why` (the first reason sticks). For a rank
 * whose own part failed before its collective, so the others need not wait for the
 * timeout. Loopback only (MJ_ERR_UNSUPPORTED for NCCL: abort the engine's comm there). */
mj_status mj_comm_abort(mj_comm_t c, const char *why);

/* ---- loopback (loopback.c) ---- */
/* The seconds a rank waits at a barrier for the others before aborting the group
 * (default MJ_COMM_LOOPBACK_TIMEOUT_S); for the whole group of c. Tests shorten it. */
#define MJ_COMM_LOOPBACK_TIMEOUT_S 300.0
mj_status mj_comm_loopback_set_timeout(mj_comm_t c, double seconds);

/* ---- NCCL (nccl.c) ---- */
/* Load libnccl once per process ($MOEJIT_NCCL, else the search): MJ_OK or MJ_ERR_LIBRARY
 * saying what to install. */
mj_status mj_nccl_load(void);
/* The loaded library's version (ncclGetVersion's code, e.g. 22809 for 2.28.9) and path;
 * either may be NULL. Loads it first. */
mj_status mj_nccl_version(int *code, const char **path);

#endif /* MJ_COMM_H */
