/* nccl.c — the NCCL communicator: libnccl.so.2 dlopen'd at run time (never linked, so the
 * library works on machines without it), through the one loader in base/dl.c.
 *
 * The library is loaded once per process and never unloaded. $MOEJIT_NCCL
 * names the file to load instead of the search, with no fallback (as MOEJIT_NVRTC and
 * MOEJIT_LIBCUDA do). The types and constants used are spelled out in nccl_abi.h.
 *
 * Three ways to a handle: init_rank (one rank per process or thread, from an id made by
 * unique_id), init_all (every rank in this process, one per GPU) and wrap (an engine's own
 * communicator, not owned). The all-reduce is ncclAllReduce(float32, sum) on the caller's
 * stream: asynchronous, no allocation, no host sync, so it is captured in a CUDA graph as is.
 * Any NCCL failure is MJ_ERR_COMM with ncclGetErrorString's and ncclGetLastError's text. */
#include "comm/comm.h"
#include "cuda/cudalibs.h"
#include "comm/nccl_abi.h"
#include "dl.h"

#include <stdio.h>
#include <stdlib.h>

static mj_nccl_api nc;

static const mj_dl_sym k_syms[] = {
#define SYM(f) {"nccl" #f, offsetof(mj_nccl_api, f)}
    SYM(GetVersion),  SYM(GetUniqueId), SYM(CommInitRank),  SYM(CommInitAll),    SYM(AllReduce),
    SYM(CommDestroy), SYM(CommCount),   SYM(CommUserRank),  SYM(GetErrorString),
#undef SYM
};

#define MJ_NCCL_HINT                                                                        \
    "install NCCL 2 (Debian/Ubuntu: apt install libnccl2; pip: nvidia-nccl-cu13) or set "  \
    "MOEJIT_NCCL=/path/to/libnccl.so.2"

static int g_version; /* ncclGetVersion's code */

/* Once the symbols resolve: the optional last-error call, and NCCL 2's interface. */
static mj_status nccl_init(mj_dl_lib *lib, void *h, char *err, size_t err_len) {
    /* ncclGetLastError came with NCCL 2.13: without it, messages carry the error string only. */
    static const mj_dl_sym k_last = {"ncclGetLastError", 0};
    const char *(*last)(mj_nccl_comm) = NULL;
    if (!mj_dl_resolve(h, &k_last, 1, &last, sizeof last)) nc.GetLastError = last;

    mj_nccl_result r = nc.GetVersion(&g_version);
    /* The code is major*10000 + minor*100 + patch since 2.9, major*1000 + ... before. */
    int major = g_version >= 10000 ? g_version / 10000 : g_version / 1000;
    if (r == MJ_NCCL_SUCCESS && major == 2) return MJ_OK;
    if (r != MJ_NCCL_SUCCESS)
        snprintf(err, err_len, "NCCL library %s does not work: ncclGetVersion: %s", lib->path, nc.GetErrorString(r));
    else
        snprintf(err, err_len, "NCCL library %s is version code %d: moejit speaks NCCL 2's interface; " MJ_NCCL_HINT,
                 lib->path, g_version);
    memset(&nc, 0, sizeof nc);
    mj_dl_close(h);
    return MJ_ERR_LIBRARY;
}

static const char *const k_candidates[] = {
    "libnccl.so.2", "$CUDA_HOME/lib64/libnccl.so.2", "$CUDA_HOME/lib/libnccl.so.2",
    "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2", NULL,
};

static mj_dl_lib g_lib = {
    .env = "MOEJIT_NCCL",
    .what = "NCCL",
    .hint = MJ_NCCL_HINT,
    .candidates = k_candidates,
    .syms = k_syms,
    .n_syms = sizeof k_syms / sizeof k_syms[0],
    .table = &nc,
    .table_size = sizeof nc,
    .init = nccl_init,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

mj_status mj_nccl_load(void) { return mj_dl_load_once(&g_lib); }

mj_status mj_nccl_version(int *code, const char **path) {
    MJ_CHECK(mj_nccl_load());
    if (code) *code = g_version;
    if (path) *path = g_lib.path;
    return MJ_OK;
}

/* An NCCL failure: its string, the library's last error when it has one, what to do. */
static mj_status nccl_error(mj_nccl_result r, mj_nccl_comm comm, const char *what) {
    const char *text = nc.GetErrorString(r);
    const char *last = nc.GetLastError ? nc.GetLastError(comm) : NULL;
    const char *hint = r == MJ_NCCL_IN_PROGRESS
                           ? "; the communicator is non-blocking: moejit needs a blocking one "
                             "(NCCL's default)"
                           : "";
    return mj_set_error(MJ_ERR_COMM, "%s failed: NCCL error %d (%s)%s%s%s; run with NCCL_DEBUG=INFO for details",
                        what, (int)r, text ? text : "no description", last && *last ? ": " : "",
                        last && *last ? last : "", hint);
}

/* ---- the handle --------------------------------------------------------------------------- */
typedef struct nccl_comm {
    struct mj_comm base;
    mj_nccl_comm comm;
    int owned;                    /* destroyed with the handle (not for a wrapped comm) */
} nccl_comm;

static mj_status nc_all_reduce(mj_comm_t c, const float *send, float *recv, int64_t count,
                               void *stream) {
    const nccl_comm *h = (const nccl_comm *)c;
    if (count < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_all_reduce_f32 (nccl, rank %d of %d): count %lld is negative",
                            (int)c->rank, (int)c->n_ranks, (long long)count);
    if (count == 0) return MJ_OK; /* every rank has the same count: none of them enqueues */
    if (!send || !recv)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_comm_all_reduce_f32 (nccl, rank %d of %d): the %s buffer is NULL",
                            (int)c->rank, (int)c->n_ranks, send ? "recv" : "send");
    mj_nccl_result r =
        nc.AllReduce(send, recv, (size_t)count, MJ_NCCL_FLOAT32, MJ_NCCL_SUM, h->comm, stream);
    if (r != MJ_NCCL_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "ncclAllReduce of %lld floats (rank %d of %d)", (long long)count,
                 (int)c->rank, (int)c->n_ranks);
        return nccl_error(r, h->comm, what);
    }
    return MJ_OK;
}

static mj_status nc_free(mj_comm_t c) {
    nccl_comm *h = (nccl_comm *)c;
    mj_status s = MJ_OK;
    if (h->owned) {
        mj_nccl_result r = nc.CommDestroy(h->comm);
        if (r != MJ_NCCL_SUCCESS) s = nccl_error(r, h->comm, "ncclCommDestroy");
    }
    free(h);
    return s;
}

static const mj_comm_ops k_nccl_ops = {
    .kind = MJ_COMM_NCCL,
    .name = "nccl",
    .all_reduce_f32 = nc_all_reduce,
    .abort = NULL,
    .free = nc_free,
};

/* A handle over comm, its rank and size asked of NCCL. On failure comm is left as it was. */
static mj_status make_handle(mj_nccl_comm comm, int owned, mj_comm_t *out) {
    int n = 0, rank = -1;
    mj_nccl_result r = nc.CommCount(comm, &n);
    if (r != MJ_NCCL_SUCCESS) return nccl_error(r, comm, "ncclCommCount");
    r = nc.CommUserRank(comm, &rank);
    if (r != MJ_NCCL_SUCCESS) return nccl_error(r, comm, "ncclCommUserRank");
    if (n < 1 || n > MJ_COMM_MAX_RANKS || rank < 0 || rank >= n)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "NCCL communicator of %d ranks (this one rank %d): moejit runs on 1 to "
                            "%d ranks",
                            n, rank, MJ_COMM_MAX_RANKS);
    nccl_comm *h = calloc(1, sizeof *h);
    if (!h) return mj_set_error(MJ_ERR_NOMEM, "out of memory for a communicator handle");
    h->base = (struct mj_comm){&k_nccl_ops, rank, n};
    h->comm = comm;
    h->owned = owned;
    *out = &h->base;
    return MJ_OK;
}

/* NCCL needs a GPU: say so plainly rather than through NCCL's CUDA error. */
static mj_status need_device(const char *who, int *n_devices) {
    mj_status s = mj_cuda_load();
    if (s == MJ_OK) s = mj_cuda_device_count(n_devices);
    if (s == MJ_OK && *n_devices < 1) s = mj_set_error(MJ_ERR_NO_DEVICE, "no CUDA device");
    if (s != MJ_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mj_last_error());
        char *compile_hint = strstr(why, ": moejit can still compile"); /* true, but not here */
        if (compile_hint) *compile_hint = '\0';
        return mj_set_error(MJ_ERR_NO_DEVICE, "%s: NCCL needs a CUDA device: %s", who, why);
    }
    return MJ_OK;
}

static mj_status check_n_ranks(const char *who, int32_t n_ranks) {
    if (n_ranks < 1 || n_ranks > MJ_COMM_MAX_RANKS)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: n_ranks %d is out of range (1..%d)", who,
                            (int)n_ranks, MJ_COMM_MAX_RANKS);
    return MJ_OK;
}

mj_status mj_comm_nccl_unique_id(mj_comm_id *id) {
    if (!id) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_comm_nccl_unique_id: id is NULL");
    MJ_CHECK(mj_nccl_load());
    mj_nccl_unique_id u;
    memset(&u, 0, sizeof u);
    mj_nccl_result r = nc.GetUniqueId(&u);
    if (r != MJ_NCCL_SUCCESS) return nccl_error(r, NULL, "ncclGetUniqueId");
    _Static_assert(sizeof id->bytes == sizeof u.internal, "mj_comm_id is an ncclUniqueId");
    memcpy(id->bytes, u.internal, sizeof id->bytes);
    return MJ_OK;
}

mj_status mj_comm_nccl_init_rank(const mj_comm_id *id, int32_t n_ranks, int32_t rank, mj_comm_t *out) {
    static const char who[] = "mj_comm_nccl_init_rank";
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: out is NULL", who);
    *out = NULL;
    if (!id) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: id is NULL (make one with mj_comm_nccl_unique_id)", who);
    MJ_CHECK(check_n_ranks(who, n_ranks));
    if (rank < 0 || rank >= n_ranks)
        return mj_set_error(MJ_ERR_INVALID_ARG, "%s: rank %d is not one of 0..%d", who, (int)rank,
                            (int)n_ranks - 1);
    MJ_CHECK(mj_nccl_load());
    int n_devices = 0;
    MJ_CHECK(need_device(who, &n_devices));
    mj_nccl_unique_id u;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    mj_nccl_comm comm = NULL;
    mj_nccl_result r = nc.CommInitRank(&comm, n_ranks, u, rank);
    if (r != MJ_NCCL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "ncclCommInitRank (rank %d of %d)", (int)rank, (int)n_ranks);
        return nccl_error(r, NULL, what);
    }
    mj_status s = make_handle(comm, 1, out);
    if (s != MJ_OK) nc.CommDestroy(comm);
    return s;
}

mj_status mj_comm_nccl_init_all(int32_t n_ranks, const int32_t *devices, mj_comm_t *comms) {
    static const char who[] = "mj_comm_nccl_init_all";
    if (!comms) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: comms is NULL", who);
    MJ_CHECK(check_n_ranks(who, n_ranks));
    for (int32_t i = 0; i < n_ranks; i++) comms[i] = NULL;
    MJ_CHECK(mj_nccl_load());
    int n_devices = 0;
    MJ_CHECK(need_device(who, &n_devices));
    int devlist[MJ_COMM_MAX_RANKS];
    for (int32_t i = 0; i < n_ranks; i++) {
        devlist[i] = devices ? devices[i] : i;
        if (devlist[i] < 0 || devlist[i] >= n_devices)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "%s: rank %d's device %d does not exist (this machine has CUDA "
                                "devices 0..%d)",
                                who, (int)i, devlist[i], n_devices - 1);
        for (int32_t j = 0; j < i; j++)
            if (devlist[j] == devlist[i])
                return mj_set_error(MJ_ERR_INVALID_ARG,
                                    "%s: ranks %d and %d are both on device %d (NCCL puts one rank "
                                    "on a GPU; loopback runs ranks as threads)",
                                    who, (int)j, (int)i, devlist[i]);
    }
    mj_nccl_comm raw[MJ_COMM_MAX_RANKS] = {0};
    mj_nccl_result r = nc.CommInitAll(raw, n_ranks, devlist);
    if (r != MJ_NCCL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "ncclCommInitAll (%d ranks)", (int)n_ranks);
        return nccl_error(r, NULL, what);
    }
    mj_status s = MJ_OK;
    for (int32_t i = 0; i < n_ranks && s == MJ_OK; i++) s = make_handle(raw[i], 1, &comms[i]);
    if (s != MJ_OK) {
        /* Nothing half-made: every comm destroyed, every slot NULL. */
        for (int32_t i = 0; i < n_ranks; i++) {
            if (comms[i]) free(comms[i]);
            comms[i] = NULL;
            nc.CommDestroy(raw[i]);
        }
    }
    return s;
}

mj_status mj_comm_nccl_wrap(void *nccl_comm_, mj_comm_t *out) {
    static const char who[] = "mj_comm_nccl_wrap";
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: out is NULL", who);
    *out = NULL;
    if (!nccl_comm_) return mj_set_error(MJ_ERR_INVALID_ARG, "%s: the ncclComm_t is NULL", who);
    MJ_CHECK(mj_nccl_load());
    return make_handle((mj_nccl_comm)nccl_comm_, 0, out);
}
