"""Communicators: the all-reduce that sums the ranks' partial outputs (mj_comm_t).

Loopback ranks are threads of this process (host memory; the interpreter's multi-rank runs):
loopback_comms(n) gives n handles, each to be driven by its own Python thread; ctypes
releases the GIL during every C call, so the ranks meet inside the collective. NCCL ranks are
one process per GPU: rank 0 makes nccl_unique_id(), sends the 128 bytes to the others (a
torch.distributed store, a file, ...), and each calls NcclComm(unique_id, n_ranks, rank) with
its GPU current (torch.cuda.set_device(rank)).
"""
import ctypes

from . import _arrays as A
from . import _structs as S
from ._handle import Handle, serialized
from ._lib import lib


class Comm(Handle):
    """One rank's end of a group (mj_comm_t). kind: "loopback" or "nccl"."""

    _free_name = "mj_comm_free"
    _what = "communicator"

    def __init__(self, _ptr, kind):
        super().__init__()
        self._adopt(_ptr)
        self.kind = kind
        r, n = ctypes.c_int32(), ctypes.c_int32()
        lib().mj_comm_info(self._handle(), ctypes.byref(r), ctypes.byref(n))
        self.rank, self.n_ranks = r.value, n.value

    @serialized
    def all_reduce(self, send, recv=None, *, stream=None):
        """recv = the sum over ranks of send (float32, any shape; every rank the same count).
        Loopback: host arrays, returns when every rank's recv is written. NCCL: CUDA tensors,
        enqueued on stream (default: torch's current stream). recv None: a new array (on a GPU
        allocated on that stream)."""
        s = A.adapt(send, "send", dtypes=("float32",))
        if self.kind == "loopback" and s.is_cuda:
            raise ValueError("a loopback communicator sums host memory; send is %s" % s.where())
        if self.kind == "nccl" and not s.is_cuda:
            raise ValueError("an NCCL communicator sums device memory; send is %s" % s.where())
        n = 1
        for d in s.shape:
            n *= d
        # A new recv is allocated on the stream the all-reduce writes it on (see A.on_stream).
        with A.on_stream(s, stream) as st:
            if recv is None:
                recv = A.empty(s, s.shape, "float32")
            r = A.adapt(recv, "recv", dtypes=("float32",), shape=s.shape, writable=True)
            A.same_place(s, r, "recv")
            lib().mj_comm_all_reduce_f32(self._handle(), s.ptr, r.ptr, n, st)
        return recv

    def __repr__(self):
        return "<moejit.Comm %s rank %d of %d%s>" % (self.kind, self.rank, self.n_ranks,
                                                    " closed" if self.closed else "")


def loopback_comms(n):
    """n loopback ranks (1..64) as threads of this process: a list of n Comm, rank r at [r].
    Drive each from its own thread. Freeing one rank's handle while others still call aborts
    the group (every rank gets CommError): close them when all ranks are done."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= S.MJ_COMM_MAX_RANKS:
        raise ValueError("n %r: 1..%d ranks" % (n, S.MJ_COMM_MAX_RANKS))
    arr = (ctypes.c_void_p * n)()
    lib().mj_comm_loopback_create(n, arr)
    return _own_all(list(arr), "loopback")


def _own_all(ptrs, kind):
    """Comm objects owning every handle of a group just made, or every handle freed."""
    out = []
    try:
        for p in ptrs:
            out.append(Comm(p, kind))
    except BaseException:
        # A handle not yet owned by a Comm is freed here; owned ones by their Comm.
        for p in ptrs[len(out) + 1:]:
            if p:
                lib().mj_comm_free(p)
        for c in out:
            c.close()
        raise
    return out


def nccl_unique_id():
    """A new NCCL unique id (ncclGetUniqueId), as 128 bytes to send to every rank."""
    cid = S.CommIdC()
    lib().mj_comm_nccl_unique_id(ctypes.byref(cid))
    return bytes(cid.bytes)


class NcclComm(Comm):
    """Rank `rank` of n_ranks over NCCL (ncclCommInitRank) on the calling thread's current CUDA
    device; blocks until every rank has joined. unique_id: nccl_unique_id()'s bytes."""

    def __init__(self, unique_id, n_ranks, rank):
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != 128:
            raise ValueError("unique_id must be the 128 bytes nccl_unique_id() returned")
        cid = S.CommIdC()
        ctypes.memmove(cid.bytes, bytes(unique_id), 128)
        p = ctypes.c_void_p()
        lib().mj_comm_nccl_init_rank(ctypes.byref(cid), int(n_ranks), int(rank), ctypes.byref(p))
        super().__init__(p.value, "nccl")

    @classmethod
    def wrap(cls, nccl_comm):
        """A handle over an engine's own ncclComm_t (an int pointer): not owned, so close()
        leaves the NCCL communicator alive."""
        p = ctypes.c_void_p()
        lib().mj_comm_nccl_wrap(int(nccl_comm), ctypes.byref(p))
        self = cls.__new__(cls)
        Comm.__init__(self, p.value, "nccl")
        return self


def nccl_comms_all(n_ranks, devices=None):
    """n_ranks NCCL ranks on the GPUs `devices` (default 0..n-1) of this process
    (ncclCommInitAll); drive each from its own thread."""
    n = int(n_ranks)
    arr = (ctypes.c_void_p * max(n, 1))()
    dev = None
    if devices is not None:
        if len(devices) != n:
            raise ValueError("devices has %d entries for %d ranks" % (len(devices), n))
        dev = (ctypes.c_int32 * n)(*devices)
    lib().mj_comm_nccl_init_all(n, dev, arr)
    return _own_all(list(arr[:n]), "nccl")
