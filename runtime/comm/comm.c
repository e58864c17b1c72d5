/* comm.c — the public mj_comm_* calls that every kind of communicator shares: check the
 * handle, then dispatch through its ops table (loopback.c, nccl.c). */
#include "comm/comm.h"

mj_comm_backend mj_comm_kind(mj_comm_t c) { return c && c->ops ? c->ops->kind : MJ_COMM_NONE; }

mj_status mj_comm_info(mj_comm_t c, int32_t *rank, int32_t *n_ranks) {
    if (!c) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_comm_info: the communicator is NULL");
    if (rank) *rank = c->rank;
    if (n_ranks) *n_ranks = c->n_ranks;
    return MJ_OK;
}

mj_status mj_comm_all_reduce_f32(mj_comm_t c, const float *send, float *recv, int64_t count,
                                 void *stream) {
    if (!c)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_all_reduce_f32: the communicator is NULL (create one with "
                            "mj_comm_loopback_create or mj_comm_nccl_*)");
    /* The rest (counts, buffers) is checked by the kind: a loopback group must agree on a
     * verdict collectively, or a rank that returned early would leave the others waiting. */
    return c->ops->all_reduce_f32(c, send, recv, count, stream);
}

mj_status mj_comm_abort(mj_comm_t c, const char *why) {
    if (!c) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_comm_abort: the communicator is NULL");
    if (!c->ops->abort)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "mj_comm_abort: a %s communicator cannot be aborted here (abort the "
                            "NCCL communicator itself with ncclCommAbort)",
                            c->ops->name);
    return c->ops->abort(c, why ? why : "aborted");
}

mj_status mj_comm_free(mj_comm_t c) {
    if (!c) return MJ_OK;
    return c->ops->free(c);
}
