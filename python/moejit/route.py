"""route(): noaux_tc / group_limited_greedy routing with OEA, as mj_route (or mj_route_ref) does it."""
import ctypes

import numpy as np

from . import _arrays as A
from . import _structs as S
from .context import Context, get_context
from ._lib import lib, text_arg

SCORINGS = {"sigmoid": S.MJ_SCORING_SIGMOID, "softmax": S.MJ_SCORING_SOFTMAX}
GROUP_SCORES = {"top2_sum": S.MJ_GROUP_SCORE_TOP2_SUM, "max": S.MJ_GROUP_SCORE_MAX}


class RouteResult:
    """What a routing wrote, as arrays of the inputs' kind (numpy, or torch on the inputs' device).

    ids [T, k] int32        experts in ranking order, -1 past n_sel
    weights [T, k] float32  routing weights, 0 past n_sel
    n_sel [T] int32         experts each token got (k0..k; 0 for padding rows)
    expert_counts [E] int32, expert_offsets [E + 1] int32, active_experts [E] int32 (ascending,
    then -1), n_active [1] int32, permutation [T, k] int32, row_index [T, k] int32: the dispatch
    metadata (see mj_route_outputs in include/moejit.h); None when route(..., dispatch=False).
    k0: the k0 used. stats: mj_route_stats as a dict (backend "ref" only, else None).
    """

    __slots__ = ("ids", "weights", "n_sel", "expert_counts", "expert_offsets", "active_experts", "n_active",
                 "permutation", "row_index", "k0", "stats", "_keep")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    @property
    def unique_experts(self):
        """The number of active experts, as a Python int (reads the device on a GPU)."""
        if self.n_active is None:
            raise ValueError("no dispatch outputs: route(..., dispatch=True) writes n_active")
        return int(self.n_active[0])

    def __repr__(self):
        return "<moejit.RouteResult T=%d k=%d k0=%s>" % (tuple(self.ids.shape) + (self.k0,))


class K0Policy:
    """k0 by batch size: "4" or "1-3:8,4-15:6,16-:4" (mj_k0_policy_parse), for top-k `topk`."""

    def __init__(self, text, topk):
        self.text, self.topk = str(text), int(topk)
        self._c = S.K0PolicyC()
        lib().mj_k0_policy_parse(text_arg(self.text, "k0 policy"), self.topk, ctypes.byref(self._c))

    def k0(self, batch):
        """k0 for a batch of `batch` tokens (an error naming the batch when no rule covers it)."""
        v = ctypes.c_int32()
        lib().mj_k0_policy_resolve(ctypes.byref(self._c), int(batch), ctypes.byref(v))
        return v.value

    def __repr__(self):
        return "K0Policy(%r, topk=%d)" % (self.text, self.topk)


def _choice(name, value, table):
    if value not in table:
        raise ValueError("%s %r: use %s" % (name, value, " or ".join(repr(k) for k in table)))
    return table[value]


def _num_valid(num_valid, T, like):
    """(an int for mj_route_ref, an Arr or None for mj_route). num_valid: None, an int in
    0..T, or an int32 array of one element of the inputs' kind (read when the kernel runs)."""
    if num_valid is None:
        return T, None
    if isinstance(num_valid, (int, np.integer)) and not isinstance(num_valid, bool):
        n = int(num_valid)
        if not 0 <= n <= T:
            raise ValueError("num_valid %d is not in 0..%d (the tokens)" % (n, T))
        return n, None
    a = A.adapt(num_valid, "num_valid", dtypes=("int32",), ndim=(0, 1))
    if a.shape not in ((), (1,)):
        raise ValueError("num_valid has shape %s; it must hold one int32 (shape [] or [1])" % (list(a.shape),))
    A.same_place(like, a, "num_valid")
    return None, a


def _params(E, topk, k0, rsf, scoring, n_group, topk_group, group_score, renormalize):
    p = S.RouteParamsC()
    p.n_experts, p.topk, p.k0 = E, topk, k0
    p.n_group, p.topk_group = n_group, topk_group
    p.scoring = scoring
    p.routed_scaling_factor = rsf
    p.renormalize = 1 if renormalize else 0
    p.group_score = group_score
    return p


def route(logits, bias=None, *, topk, k0=None, routed_scaling_factor=1.0, scoring="sigmoid", n_group=1,
          topk_group=1, group_score="top2_sum", renormalize=True, num_valid=None, backend="auto", context=None,
          stream=None, dispatch=True):
    """Route T tokens over E experts: each token's top-k (by sigmoid or softmax score + bias,
    within its topk_group best groups of n_group), or OEA when k0 < topk.

    logits: float32 [T, E]; bias: float32 [E] (e_score_correction_bias) or None; both numpy
    arrays or both torch tensors on one device. k0: an int in 1..topk, a policy string by batch
    size ("1-3:8,4-:4"), or None (plain top-k). num_valid: None (every row is a token), an int,
    or a one-element int32 array/tensor read when the kernel runs (CUDA graphs): rows at and
    past it are padding. backend: "auto" (CUDA tensors: the GPU; host arrays: the interpreter),
    "sim", "cuda", or "ref" (the CPU reference, mj_route_ref + mj_route_dispatch_ref; host
    arrays only). context: a Context to use instead of the shared one. stream: a CUstream (int)
    or torch stream for CUDA tensors (default: torch's current stream on the tensors' device).
    On a GPU the call is asynchronous on that stream, like any torch op under `with
    torch.cuda.stream(stream)`: the outputs (and an int num_valid's device copy) are allocated
    and written on it.

    Returns a RouteResult of the inputs' kind. Arguments of a wrong dtype, shape, device or
    layout raise TypeError/ValueError before anything reaches C.
    """
    lg = A.adapt(logits, "logits", dtypes=("float32",), ndim=2)
    T, E = lg.shape
    bs = None
    if bias is not None:
        bs = A.adapt(bias, "bias", dtypes=("float32",), shape=(E,))
        A.same_place(lg, bs, "bias")
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
        raise TypeError("topk must be an int")
    topk = int(topk)
    if not 1 <= topk <= E:
        raise ValueError("topk %d is not in 1..%d (the experts, logits.shape[1])" % (topk, E))
    sc = _choice("scoring", scoring, SCORINGS)
    gs = _choice("group_score", group_score, GROUP_SCORES)
    nv_int, nv_arr = _num_valid(num_valid, T, lg)
    if backend not in ("auto", "sim", "cuda", "ref"):
        raise ValueError("backend %r: use 'auto', 'sim', 'cuda' or 'ref'" % (backend,))
    if context is not None:
        if not isinstance(context, Context):
            raise TypeError("context must be a moejit.Context")
        if backend not in ("auto", context.backend):
            raise ValueError("backend %r but the context given is %s" % (backend, context.backend))
        backend = context.backend
    if backend == "auto":
        backend = "cuda" if lg.is_cuda else "sim"
    if backend == "cuda" and not lg.is_cuda:
        raise ValueError("backend 'cuda' needs CUDA tensors; logits is %s (use backend 'sim' or 'ref' for host "
                         "arrays, or move the tensors to the GPU)" % lg.where())
    if backend in ("sim", "ref") and lg.is_cuda:
        raise ValueError("backend %r runs on the host; logits is %s (use backend 'cuda', or .cpu())" %
                         (backend, lg.where()))
    if context is not None and context.backend == "cuda" and context.device != lg.device[1]:
        raise ValueError("the context is on cuda:%d but logits is %s" % (context.device, lg.where()))
    if backend == "ref" and nv_arr is not None:
        nv_int = int(np.asarray(nv_arr.obj).reshape(-1)[0])
        if not 0 <= nv_int <= T:
            raise ValueError("num_valid %d is not in 0..%d (the tokens)" % (nv_int, T))
    if k0 is None:
        k0v = topk
    elif isinstance(k0, str):
        k0v = K0Policy(k0, topk).k0(max(T, 1))
    elif isinstance(k0, bool) or not isinstance(k0, (int, np.integer)):
        raise TypeError("k0 must be an int, a policy string or None")
    else:
        k0v = int(k0)
        if not 1 <= k0v <= topk:
            raise ValueError("k0 %d is not in 1..%d (topk)" % (k0v, topk))
    p = _params(E, topk, k0v, float(routed_scaling_factor), sc, int(n_group), int(topk_group), gs, renormalize)

    # Outputs, of the inputs' kind. On a GPU everything below runs with the kernel's stream s
    # as torch's current one, so the outputs and the num_valid count are allocated (and that
    # count filled) on the stream the kernel uses them on.
    with A.on_stream(lg, stream) as s:
        r = RouteResult(k0=k0v)
        r.ids = A.empty(lg, (T, topk), "int32")
        r.weights = A.empty(lg, (T, topk), "float32")
        r.n_sel = A.empty(lg, (T,), "int32")
        if dispatch:
            r.expert_counts = A.empty(lg, (E,), "int32")
            r.expert_offsets = A.empty(lg, (E + 1,), "int32")
            r.active_experts = A.empty(lg, (E,), "int32")
            r.n_active = A.empty(lg, (1,), "int32")
            r.permutation = A.empty(lg, (T, topk), "int32")
            r.row_index = A.empty(lg, (T, topk), "int32")

        torch_out = lg.kind == "torch"

        def ptr(name):
            v = getattr(r, name)
            return None if v is None else (v.data_ptr() if torch_out else v.ctypes.data)

        c = lib()
        if backend == "ref":
            st = S.RouteStatsC()
            c.mj_route_ref(ctypes.byref(p), lg.ptr, bs.ptr if bs is not None else None, T, nv_int, ptr("ids"),
                           ptr("weights"), ptr("n_sel"), ctypes.byref(st))
            r.stats = {f: getattr(st, f) for f, _ in st._fields_ if f != "struct_size"}
            if dispatch:
                c.mj_route_dispatch_ref(ptr("ids"), ptr("n_sel"), T, topk, E, ptr("expert_counts"),
                                        ptr("expert_offsets"), ptr("active_experts"), ptr("n_active"),
                                        ptr("permutation"), ptr("row_index"))
            return r
        ctx = context if context is not None else get_context(backend, lg.device[1] if lg.is_cuda else None)
        if nv_arr is None and nv_int < T:
            # An int count for a kernel, which reads it from memory where it runs: filled on the
            # kernel's stream (s is current here) and kept with the result, so it outlives the
            # (possibly asynchronous) launch.
            r._keep = A.full_int32(lg, (1,), nv_int)
            nv_arr = A.adapt(r._keep, "num_valid", dtypes=("int32",), ndim=1)
        out = S.RouteOutputsC()
        for f in ("ids", "weights", "n_sel", "expert_counts", "expert_offsets", "active_experts", "n_active",
                  "permutation", "row_index"):
            setattr(out, f, ptr(f))
        with ctx._using() as cp:
            c.mj_route(cp, ctypes.byref(p), lg.ptr, bs.ptr if bs is not None else None, T,
                       nv_arr.ptr if nv_arr is not None else None, ctypes.byref(out), s)
        # On a GPU the kernel reads the inputs on the stream after this returns, as with any
        # torch op: the caller's tensors are the caller's to keep (and to have written, when
        # `stream` is not the current one) until then.
        return r
