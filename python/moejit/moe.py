"""Moe: one MoE layer on this rank (mj_moe_create / prepare / forward)."""
import contextlib
import ctypes
import os
import sys

import numpy as np

from . import _arrays as A
from . import _structs as S
from ._handle import Handle, serialized
from ._lib import int_arg, lib, text_arg
from .checkpoint import MODE_NAMES, MODES, Checkpoint, Layer, _split
from .comm import Comm
from .context import Context, get_context
from .route import RouteResult


class Moe(Handle):
    """One MoE layer on this rank: the router GEMM, routing (OEA with the prepared k0), the
    experts as NVFP4 grouped GEMMs and the all-reduce of the ranks' partial outputs.

    checkpoint: a checkpoint directory (str / PathLike), an open Checkpoint, or a Layer (then
    `layer` must be None; the Layer is the whole layer or already this rank's slice).
    layer: the MoE layer index (None: the checkpoint's first MoE layer).
    tp / ep: split over n ranks by tensor or expert parallelism (None: one rank holds the
    layer); rank: this rank; comm: a Comm of that group (loopback_comms(n)[rank] on the
    interpreter, NcclComm on GPUs); needed when n > 1. Only this rank's slice is read.
    k0_policy: OEA's k0 by batch size ("4", "1-3:8,4-:4"; None: plain top-k); mode: "auto"
    (the mode policy: W4A16 at 1-8 tokens, W4A4 above where the target has it), "w4a16" or
    "w4a4"; mode_policy: the policy "auto" uses (None: the target's default).
    backend / device / context: where it runs ("auto": the GPU torch has current when torch
    is imported and has one, else GPU 0 when there is one, else the interpreter; "sim";
    "cuda" with device=N), or an explicit Context. Contexts are shared per (backend, device).
    rsf_in_weights / shared_expert: see mj_moe_options (False for an engine that scales the
    routed output and adds the shared expert itself).
    max_batch / batches: when given, prepare() runs now with them.

    The handle is freed by close() or a with block (else when garbage-collected); it keeps
    its context and communicator alive while it is open.
    """

    _free_name = "mj_moe_free"
    _what = "Moe"

    def __init__(self, checkpoint, layer=None, *, tp=None, ep=None, rank=0, comm=None, k0_policy=None,
                 mode="auto", mode_policy=None, backend="auto", device=None, context=None, rsf_in_weights=True,
                 shared_expert=True, max_batch=None, batches=None):
        super().__init__()
        kind, rank, n = _split(tp, ep, rank)
        if mode not in MODES:
            raise ValueError("mode %r: use 'auto', 'w4a16' or 'w4a4'" % (mode,))
        if comm is not None and not isinstance(comm, Comm):
            raise TypeError("comm must be a moejit Comm (loopback_comms(n)[rank] or NcclComm)")
        if n > 1 and comm is None:
            raise ValueError("%s=%d needs comm: loopback_comms(%d)[rank] on the interpreter, NcclComm on GPUs" %
                             ("tp" if kind == S.MJ_PAR_TP else "ep", n, n))
        if context is not None:
            if not isinstance(context, Context):
                raise TypeError("context must be a moejit.Context")
            ctx = context
        else:
            if backend not in ("auto", "sim", "cuda"):
                raise ValueError("backend %r: use 'auto', 'sim' or 'cuda'" % (backend,))
            if backend == "sim" and device is not None:
                raise ValueError("the interpreter has no device; leave device None")
            if device is None and backend in ("auto", "cuda"):
                device = _torch_current_device()   # the GPU torch has current, as NCCL uses
            if backend == "auto" and device is not None:
                backend = "cuda"
            if backend == "cuda" and device is None:
                device = 0
        self.k0_policy, self.mode, self.mode_policy = k0_policy, mode, mode_policy
        self.parallel = {S.MJ_PAR_NONE: None, S.MJ_PAR_TP: "tp", S.MJ_PAR_EP: "ep"}[kind]
        self.rank, self.n_ranks = rank, n
        self._last_B = self._last_stream = None
        self._prepared_after_forward = False
        self._inflight = None
        self._prepared = ()

        # The weights: this rank's slice only (a Layer given is used as it is).
        own_layer = None
        if isinstance(checkpoint, Layer):
            if layer is not None:
                raise ValueError("a Layer was given; leave layer None")
            L = checkpoint
        else:
            ck = checkpoint if isinstance(checkpoint, Checkpoint) else None
            if ck is None:
                if not isinstance(checkpoint, (str, bytes, os.PathLike)):
                    raise TypeError("checkpoint must be a directory path, a Checkpoint or a Layer")
                ck = Checkpoint(checkpoint)
            try:
                tp_ep = {} if kind == S.MJ_PAR_NONE else {"tp" if kind == S.MJ_PAR_TP else "ep": n}
                own_layer = L = ck.load_layer(layer, rank=rank, **tp_ep)
            finally:
                if ck is not checkpoint:
                    ck.close()
        self.config = L.config
        self.layer = L.index

        if context is None:
            ctx = get_context(backend, device)
        self.context = ctx
        o = S.MoeOptionsC()
        o.parallel, o.rank, o.n_ranks = kind, rank, n
        o.rsf_in_weights = 1 if rsf_in_weights else 0
        o.shared_expert = 1 if shared_expert else 0
        if mode_policy is not None:
            o.mode_policy = text_arg(mode_policy, "mode_policy")
        p = ctypes.c_void_p()
        try:
            # The context and the communicator are held until this Moe is adopted as their
            # user: a close() of either from another thread waits, then sees the user.
            with contextlib.ExitStack() as held:
                cp = held.enter_context(ctx._using())
                lp = held.enter_context(L._using())
                o.comm = held.enter_context(comm._using()) if comm is not None else None
                lib().mj_moe_create(cp, lp, ctypes.byref(o), ctypes.byref(p))
                self._adopt(p.value, [d for d in (ctx, comm) if d is not None])
        finally:
            if own_layer is not None:
                own_layer.close()  # the handle keeps no reference to it
        self.comm = comm
        if max_batch is not None or batches is not None:
            self.prepare(max_batch=max_batch, batches=batches)

    @property
    def backend(self):
        return self.context.backend

    @property
    def prepared_batches(self):
        """The batch sizes the last prepare() covered."""
        return self._prepared

    @serialized
    def prepare(self, max_batch=None, batches=None, *, k0_policy=None, mode=None):
        """Compile (or load from the cache) every kernel forwards of these batch sizes launch
        and allocate their workspace: 1..max_batch, or exactly `batches` (e.g. an engine's
        CUDA-graph buckets). Afterwards such a forward compiles and allocates nothing.
        k0_policy / mode: override the constructor's."""
        if (max_batch is None) == (batches is None):
            raise ValueError("give max_batch or batches")
        if mode is not None and mode not in MODES:
            raise ValueError("mode %r: use 'auto', 'w4a16' or 'w4a4'" % (mode,))
        o = S.MoePrepareOptionsC()
        keep = None
        if batches is not None:
            bl = [int_arg(b, "batch size", 1, S.MJ_MAX_BATCH) for b in batches]
            if not bl:
                raise ValueError("batches is empty")
            keep = (ctypes.c_int32 * len(bl))(*bl)
            o.batches = ctypes.cast(keep, ctypes.c_void_p)
            o.n_batches = len(bl)
            prepared = tuple(sorted(set(bl)))
        else:
            o.max_batch = int_arg(max_batch, "max_batch", 1, S.MJ_MAX_BATCH)
            prepared = tuple(range(1, o.max_batch + 1))
        k0p = k0_policy if k0_policy is not None else self.k0_policy
        if k0p is not None:
            o.k0_policy = text_arg(k0p, "k0_policy")
        o.mode = MODES[mode if mode is not None else self.mode]
        # prepare() replaces the routing buffers: the last forward's routing is gone.
        if self._last_B is not None:
            self._prepared_after_forward = True
        self._last_B = None
        lib().mj_moe_prepare(self._handle(), ctypes.byref(o))
        del keep
        if k0_policy is not None:
            self.k0_policy = k0_policy
        if mode is not None:
            self.mode = mode
        self._prepared = prepared
        return self

    @serialized
    def batch_plan(self, batch):
        """(k0, mode) a prepared batch size runs with; mode "w4a16" or "w4a4"."""
        batch = int_arg(batch, "batch size", 1, S.MJ_MAX_BATCH)
        k0, md = ctypes.c_int32(), ctypes.c_int()
        lib().mj_moe_batch_plan(self._handle(), batch, ctypes.byref(k0), ctypes.byref(md))
        return k0.value, MODE_NAMES[md.value]

    def _hidden(self, hidden):
        """hidden as bf16 bits where the kernels run, as an Arr (its .obj keeps them alive)."""
        H = self.config.hidden
        a = A.adapt(hidden, "hidden", dtypes=("bfloat16", "uint16", "float32"), ndim=2)
        if a.shape[1] != H:
            raise ValueError("hidden has shape %s; it must be [B, %d] (the layer's hidden size)" % (list(a.shape), H))
        if a.kind == "torch":
            if a.dtype != "bfloat16":
                raise TypeError("hidden is a torch %s tensor; pass torch.bfloat16 (hidden.to(torch.bfloat16))" %
                                a.dtype)
            if a.ptr % 16:
                raise ValueError("hidden's data is not 16-byte aligned (a view at an odd offset); pass "
                                 "hidden.clone()")
        else:
            if a.dtype == "float32":
                bits = A.bf16_from_f32(a.obj)  # rounded to nearest even, on the way in
            elif a.dtype == "bfloat16":
                bits = a.obj.view(np.uint16)
            else:
                bits = a.obj
            if bits.ctypes.data % 16:
                bits = _aligned_copy(bits)
            if bits is not a.obj:
                a = A.adapt(bits, "hidden", dtypes=("uint16",), ndim=2)
        self._check_place(a, "hidden")
        return a

    def _check_place(self, a, name):
        if self.backend == "cuda":
            if not a.is_cuda or a.device[1] != self.context.device:
                raise ValueError("this Moe runs on cuda:%d; %s is %s (move it there)" %
                                 (self.context.device, name, a.where()))
        elif a.is_cuda:
            raise ValueError("this Moe runs on the interpreter (host memory); %s is %s (use .cpu(), or a Moe "
                             "with backend='cuda')" % (name, a.where()))

    @serialized
    def forward(self, hidden, num_valid=None, *, out=None, stream=None):
        """out [B, H] float32 = the layer applied to hidden [B, H], the same on every rank.

        hidden: a torch.bfloat16 tensor (on this Moe's GPU, or on the CPU for the
        interpreter), a numpy uint16 array of bf16 bit patterns, a numpy bfloat16 array
        (ml_dtypes), or a numpy float32 array (rounded to bf16, to nearest even, on the way
        in: a copy). B must be a prepared batch size. num_valid: None (all B rows are tokens),
        an int, or a one-element int32 array/tensor read when the kernels run (CUDA graphs);
        rows at and past it are padding and come out 0. out: a float32 [B, H] array to write
        (else a new one, of hidden's kind). On a GPU the forward is enqueued on `stream`
        (default torch's current stream; a new out and an int num_valid's device copy are
        allocated and written on it) and the call returns at once; on the interpreter it
        has run when the call returns. Every rank of a split must call forward with the same B.
        Calls on one Moe are serialized (see the module's threading rule in _handle.py).
        """
        a = self._hidden(hidden)   # a.obj holds a host copy for the (synchronous) interpreter
        B, H = a.shape
        nv = None
        count = isinstance(num_valid, (int, np.integer)) and not isinstance(num_valid, bool)
        if num_valid is not None and not count:
            nv = A.adapt(num_valid, "num_valid", dtypes=("int32",), ndim=(0, 1))
            if nv.shape not in ((), (1,)):
                raise ValueError("num_valid has shape %s; it must hold one int32" % (list(nv.shape),))
            A.same_place(a, nv, "num_valid")
        elif count and not 0 <= int(num_valid) <= B:
            raise ValueError("num_valid %d is not in 0..%d (the batch)" % (int(num_valid), B))
        if out is not None:
            o = A.adapt(out, "out", dtypes=("float32",), shape=(B, H), writable=True)
            A.same_place(a, o, "out")
        # On a GPU, with the forward's stream s as torch's current one: what is made here (out,
        # the num_valid count) is allocated, and filled, on the stream the kernels use it on.
        with A.on_stream(a, stream) as s:
            nv_keep = None
            if count:
                nv_keep = A.full_int32(a, (1,), int(num_valid))
                nv = A.adapt(nv_keep, "num_valid", dtypes=("int32",), ndim=1)
            if out is None:
                out = A.empty(a, (B, H), "float32")
                o = A.adapt(out, "out", dtypes=("float32",), shape=(B, H), writable=True)
            lib().mj_moe_forward(self._handle(), a.ptr, B, nv.ptr if nv is not None else None, o.ptr, s)
        # The kernels read the count when they run, after this returns: it stays with the handle
        # until the next forward (and its block is s's, so it is reused only after this work).
        self._inflight = nv_keep
        self._last_B, self._last_stream = B, s
        self._prepared_after_forward = False
        # What last_routing needs of the input (its kind and device), not the input itself.
        self._last_like = A.Arr(None, a.kind, a.device, a.dtype, a.shape, 0)
        return out

    @property
    def last_routing(self):
        """The routing of this Moe's last forward (whichever thread ran it): a RouteResult of
        copies, of the hidden's kind (on a GPU copied on torch's current stream, ordered after
        the forward's stream and before the work enqueued on that stream next). A prepare()
        since that forward replaced the routing buffers: ValueError until the next forward."""
        return self._last_routing()

    @serialized
    def _last_routing(self):
        if self._last_B is None:
            if self._prepared_after_forward:
                raise ValueError("no forward since the last prepare(), which replaced the routing buffers: run "
                                 "forward() first")
            raise ValueError("no forward has run yet")
        r = S.RouteOutputsC()
        lib().mj_moe_route_outputs(self._handle(), ctypes.byref(r))
        B, k, E = self._last_B, self.config.topk, self.config.n_experts
        like = self._last_like
        shapes = {"ids": ((B, k), "int32"), "weights": ((B, k), "float32"), "n_sel": ((B,), "int32"),
                  "expert_counts": ((E,), "int32"), "expert_offsets": ((E + 1,), "int32"),
                  "active_experts": ((E,), "int32"), "n_active": ((1,), "int32"),
                  "permutation": ((B, k), "int32"), "row_index": ((B, k), "int32")}
        res = RouteResult(k0=self.batch_plan(B)[0])
        if like.is_cuda:
            # The forward wrote these on its stream; the next forward there overwrites them.
            with A.reading_after(like.device[1], self._last_stream):
                for name, (shape, dt) in shapes.items():
                    setattr(res, name, A.cuda_copy_out(like, getattr(r, name), dt, shape))
            return res
        for name, (shape, dt) in shapes.items():
            v = A.host_copy_out(getattr(r, name), dt, shape)
            setattr(res, name, _torch_from_numpy(v) if like.kind == "torch" else v)
        return res

    def __repr__(self):
        split = "" if self.parallel is None else " %s rank %d of %d" % (self.parallel, self.rank, self.n_ranks)
        return "<moejit.Moe layer %s%s on %r%s>" % (self.layer, split, self.context, " closed" if self.closed else "")


def _torch_current_device():
    """torch's current CUDA device when torch is imported and has a GPU, else None (then
    "auto" is the context's own choice: GPU 0 when there is one, else the interpreter)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            return int(cuda.current_device())
    except Exception:  # a torch without a working CUDA: leave the choice to the library
        return None
    return None


def _aligned_copy(a):
    """A copy of a in a 16-byte-aligned buffer (the router GEMM loads 16 bytes at a time)."""
    raw = np.empty(a.nbytes + 16, dtype=np.uint8)
    off = (-raw.ctypes.data) % 16
    b = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


def _torch_from_numpy(v):
    return sys.modules["torch"].from_numpy(v)
