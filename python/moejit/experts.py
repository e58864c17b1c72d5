"""Experts: a serving engine's NVFP4 expert tensors run by moejit's kernels (mj_experts_adopt).

An engine that loaded a ModelOpt NVFP4 checkpoint (SGLang, vLLM) holds each MoE layer's
experts as w13_weight / w2_weight (FP4 codes), their block scales, weight_scale_2 and input
scales. Experts.adopt takes those tensors as they are (torch tensors: CPU ones run on the
interpreter, CUDA ones on their GPU; numpy arrays on the interpreter), repacks them in place
for the kernels (no second copy of the weights) and then runs the engine's own top-k:

    ex = moejit.Experts.adopt(w13_weight=..., w13_weight_scale=..., w13_weight_scale_2=...,
                              w2_weight=..., w2_weight_scale=..., w2_weight_scale_2=...,
                              w13_input_scale=..., w2_input_scale=..., top_k=8)
    out = ex(hidden_states, topk_weights, topk_ids)          # [T, H], hidden_states' dtype

After an in-place adoption the engine's weight tensors hold moejit's layout: nothing else may
read them until release() gives them back (docs/engines.md).
"""
import ctypes
import sys
import weakref

import numpy as np

from . import _arrays as A
from . import _structs as S
from ._handle import Handle, serialized
from ._lib import lib
from .checkpoint import MODES
from .context import Context, get_context


def _rup(v, m):
    return (v + m - 1) // m * m


_CODE_DTYPES = ("uint8",)
_SCALE_DTYPES = ("float8_e4m3fn", "uint8")


class Experts(Handle):
    """One rank's experts adopted from an engine's tensors (see Experts.adopt)."""

    _free_name = "mj_experts_free"
    _what = "Experts"

    def __init__(self):
        raise TypeError("make Experts with Experts.adopt(...) or Experts.from_layer(layer)")

    # ---- making one ------------------------------------------------------------------------

    @classmethod
    def adopt(cls, w13_weight, w13_weight_scale, w13_weight_scale_2, w2_weight, w2_weight_scale, w2_weight_scale_2,
              w13_input_scale, w2_input_scale, *, top_k, up_first=False, scales_swizzled=False, expert_begin=0,
              in_place=True, reciprocal_weight_scale_2=False, reciprocal_input_scale=False, max_batch=256,
              mode="auto", mode_policy=None, context=None):
        """Adopt one rank's expert tensors (mj_experts_adopt).

        w13_weight uint8 [E, 2I, H/2], w13_weight_scale float8_e4m3fn (or uint8) [E, 2I, H/16]
        (swizzled: [E, 2I rounded up to 128, H/16 rounded up to 4]), w2_weight uint8 [E, H, I/2],
        w2_weight_scale [E, H, I/16] (swizzled likewise); w13_weight_scale_2 float32 [E, 2],
        [E] or one value; w2_weight_scale_2 [E] or one; w13_input_scale [E_rows, 2], [E_rows]
        or one, w2_input_scale [E_rows] or one, where local expert x reads row expert_begin + x
        (E_rows: the engine's, the global expert count under EP). All on one device.
        top_k: the columns of the topk_ids the forward gets (with a fused shared expert's).
        up_first: w13 rows are [up; gate]. scales_swizzled: the block scales are in CUTLASS's
        128x4 layout. reciprocal_*: the tensors hold 1 / scale (CompressedTensors' global
        scales). in_place=False copies instead (the engine's tensors are then only read).
        max_batch: the most tokens of one call. mode: "auto", "w4a16" or "w4a4".
        """
        if mode not in MODES:
            raise ValueError("mode %r: use 'auto', 'w4a16' or 'w4a4'" % (mode,))
        w13 = A.adapt(w13_weight, "w13_weight", dtypes=_CODE_DTYPES, ndim=3)
        E, I2, H2 = w13.shape
        if I2 % 2:
            raise ValueError("w13_weight has shape %s: its rows are gate's and up's, an even number" % (list(w13.shape),))
        H, I = 2 * H2, I2 // 2
        w2 = A.adapt(w2_weight, "w2_weight", dtypes=_CODE_DTYPES, shape=(E, H, I // 2))
        if scales_swizzled:
            s13_shape, s2_shape = (E, _rup(2 * I, 128), _rup(H // 16, 4)), (E, _rup(H, 128), _rup(I // 16, 4))
        else:
            s13_shape, s2_shape = (E, 2 * I, H // 16), (E, H, I // 16)
        s13 = A.adapt(w13_weight_scale, "w13_weight_scale", dtypes=_SCALE_DTYPES, shape=s13_shape)
        s2 = A.adapt(w2_weight_scale, "w2_weight_scale", dtypes=_SCALE_DTYPES, shape=s2_shape)
        scal = [
            _scale(w13_weight_scale_2, "w13_weight_scale_2", E, 2, exact_rows=True),
            _scale(w2_weight_scale_2, "w2_weight_scale_2", E, 1, exact_rows=True),
            _scale(w13_input_scale, "w13_input_scale", E + expert_begin, 2),
            _scale(w2_input_scale, "w2_input_scale", E + expert_begin, 1),
        ]
        arrs = [w13, s13, w2, s2] + [a for a, _, _ in scal]
        for a, name in zip(arrs[1:], ("w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_weight_scale_2",
                                      "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")):
            A.same_place(w13, a, name)
        if context is None:
            context = get_context("cuda", w13.device[1]) if w13.is_cuda else get_context("sim")
        elif not isinstance(context, Context):
            raise TypeError("context must be a moejit.Context")
        if (context.backend == "cuda") != w13.is_cuda:
            raise ValueError("the tensors are %s but the context is %s: CPU tensors run on the interpreter ('sim'), "
                             "CUDA tensors on their GPU" % (w13.where(), context.backend))
        t = S.AdoptTensorsC()
        t.n_experts, t.hidden, t.intermediate, t.topk = E, H, I, int(top_k)
        t.w13_weight, t.w13_weight_scale, t.w2_weight, t.w2_weight_scale = w13.ptr, s13.ptr, w2.ptr, s2.ptr
        for field, (a, rows, cols) in zip(("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale",
                                            "w2_input_scale"), scal):
            sc = getattr(t, field)
            sc.data, sc.rows, sc.cols = a.ptr, rows, cols
        t.expert_begin = int(expert_begin)
        t.flags = ((S.MJ_ADOPT_UP_FIRST if up_first else 0) | (S.MJ_ADOPT_SCALES_SWIZZLED if scales_swizzled else 0) |
                   (S.MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2 if reciprocal_weight_scale_2 else 0) |
                   (S.MJ_ADOPT_RECIPROCAL_INPUT_SCALE if reciprocal_input_scale else 0) |
                   (0 if in_place else S.MJ_ADOPT_COPY))
        o = S.ExpertsOptionsC()
        o.max_batch = int(max_batch)
        if mode_policy is not None:
            o.mode_policy = mode_policy.encode()
        self = cls.__new__(cls)
        Handle.__init__(self)
        p = ctypes.c_void_p()
        with context._using() as cp:
            lib().mj_experts_adopt(cp, ctypes.byref(t), ctypes.byref(o), ctypes.byref(p))
        self._adopt(p.value, deps=(context,))
        self.context, self.mode, self.top_k = context, mode, int(top_k)
        self.n_experts, self.hidden, self.intermediate, self.max_batch = E, H, I, int(max_batch)
        self._c_tensors = t
        self._tensors = tuple(a.obj for a in arrs)   # the engine's storage lives as long as we do
        self._like = w13
        self._inflight = None
        self._refresh = None   # from_layer's copy of the rank's input-scale rows, taken again
        return self

    @classmethod
    def from_layer(cls, layer, **flags):
        """Adopt the experts of an engine's MoE layer (SGLang's FusedMoE, vLLM's FusedMoE /
        RoutedExperts with ModelOpt NVFP4 weights): its w13_weight ... w2_input_scale
        parameters, top_k from the layer (flags override: top_k, expert_begin, up_first,
        scales_swizzled, in_place, ...). When the input scales hold a row for every expert of
        the model (SGLang under EP), each local expert reads its own (_input_rows): the rank's
        routed experts from its first one on, its fused shared experts from after every
        routed expert of the model. Where those rows are one run, expert_begin is its first;
        otherwise the rank's rows are copied out (a few floats an expert) and copied again by
        readopt(). Input scales with a row per local expert (vLLM) are read from row 0."""
        names = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
                 "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")
        missing = [n for n in names if getattr(layer, n, None) is None]
        if missing:
            raise ValueError("the layer has no %s: Experts.from_layer takes a ModelOpt NVFP4 MoE layer" %
                             ", ".join(missing))
        tensors = {n: getattr(getattr(layer, n), "data", getattr(layer, n)) for n in names}
        kw = dict(flags)
        if "top_k" not in kw:
            kw["top_k"] = _layer_top_k(layer)
        if "expert_begin" in kw:
            return cls.adopt(**tensors, **kw)
        e_loc = int(tensors["w13_weight"].shape[0])
        in_rows = int(tensors["w13_input_scale"].shape[0]) if len(tensors["w13_input_scale"].shape) else 1
        rows = _input_rows(layer, e_loc, in_rows)
        if rows is None or rows == list(range(rows[0], rows[0] + e_loc)):
            return cls.adopt(**tensors, **kw, expert_begin=0 if rows is None else rows[0])
        names = ("w13_input_scale", "w2_input_scale")
        mine = {n: _take_rows(tensors[n], rows, n) for n in names}
        self = cls.adopt(**dict(tensors, **mine), **kw, expert_begin=0)

        def refresh():   # the engine reloaded its scales into the same storage
            for n in names:
                _take_rows(tensors[n], rows, n, into=mine[n])
        self._refresh = refresh
        return self

    # ---- using it ------------------------------------------------------------------------------

    @serialized
    def prepare(self, max_batch=None):
        """Compile (or load) every kernel calls of 1..max_batch tokens use (default: the
        adoption's max_batch): afterwards a call allocates nothing in C and compiles nothing,
        so it can be captured in a CUDA graph."""
        mb = self.max_batch if max_batch is None else int(max_batch)
        with self.context._using() as cp:
            lib().mj_experts_prepare(cp, self._handle(), MODES[self.mode], mb)

    def __call__(self, hidden_states, topk_weights, topk_ids, num_token_non_padded=None, *, stream=None):
        return self.forward(hidden_states, topk_weights, topk_ids, num_token_non_padded, stream=stream)

    @serialized
    def forward(self, hidden_states, topk_weights, topk_ids, num_token_non_padded=None, *, stream=None):
        """[T, H] = sum over j of topk_weights[:, j] * expert_{topk_ids[:, j]}(hidden_states),
        in hidden_states' dtype (bfloat16 in, bfloat16 out; a numpy float32 or uint16 of bf16
        bits in, float32 out). topk_ids int32 (int64 is converted) [T, top_k], local expert ids,
        -1 for none; topk_weights float32 [T, top_k], used as they are (the routed scaling
        factor, when the engine folds it in, included). num_token_non_padded: rows at and past
        it get ids -1 (an int, or a one-element tensor read on the device). On a GPU, enqueued
        on `stream` (default torch's current stream)."""
        x, numpy_f32 = _hidden(hidden_states)
        T, H = x.shape
        if H != self.hidden:
            raise ValueError("hidden_states has %d columns; these experts' hidden size is %d" % (H, self.hidden))
        ids = A.adapt(_as_int32(topk_ids), "topk_ids", dtypes=("int32",), shape=(T, self.top_k))
        w = A.adapt(_as_float32(topk_weights), "topk_weights", dtypes=("float32",), shape=(T, self.top_k))
        A.same_place(self._like, x, "hidden_states")
        A.same_place(x, ids, "topk_ids")
        A.same_place(x, w, "topk_weights")
        if num_token_non_padded is not None:
            ids = A.adapt(_mask_rows(ids.obj, num_token_non_padded), "topk_ids", dtypes=("int32",),
                          shape=(T, self.top_k))
        bf16_out = not numpy_f32
        with A.on_stream(x, stream) as s:
            # the down kernel writes bf16 itself (from its f32 sums), on a GPU and the interpreter
            out = A.empty(x, (T, H), "uint16" if x.kind == "numpy" and bf16_out else
                          ("bfloat16" if bf16_out else "float32"))
            o = A.adapt(out, "out", dtypes=("uint16", "bfloat16", "float32"), shape=(T, H), writable=True)
            lib().mj_experts_forward_topk(self.context._handle(), self._handle(), MODES[self.mode], x.ptr, T,
                                          ids.ptr, w.ptr, None, o.ptr, S.MJ_OUT_BF16 if bf16_out else S.MJ_OUT_F32, s)
        self._inflight = (ids.obj, w.obj)   # read by the kernels after the call returns (GPU)
        if A.is_torch(hidden_states) and str(hidden_states.dtype) in ("torch.float16", "torch.float32"):
            out = out.to(hidden_states.dtype)  # the hidden states' dtype, as the fake kernel says
        return out

    # ---- reloads ---------------------------------------------------------------------------------

    @serialized
    def release(self):
        """Give the engine its tensors back in its own layout (in place; a copy adoption has
        nothing to give back). Calls are refused until readopt()."""
        lib().mj_experts_release(self._handle())

    @serialized
    def readopt(self):
        """Pack the tensors again after the engine reloaded every expert into the same storage
        (or after release())."""
        if self._refresh is not None:
            self._refresh()
        lib().mj_experts_readopt(self._handle(), ctypes.byref(self._c_tensors))

    @property
    def info(self):
        """What the adoption did: in_place, scales_in_place, released, bytes_allocated (where
        the kernels run, by this handle: workspace, scalars, and its own copies) and
        bytes_weights (the packed weights)."""
        r = S.AdoptInfoC()
        with self._using() as p:
            lib().mj_experts_adopt_info(p, ctypes.byref(r))
        return {f: getattr(r, f) for f, _ in r._fields_ if f != "struct_size"}

    def __repr__(self):
        return "<moejit.Experts %d experts, H %d, I %d, top-%d on %s%s>" % (
            self.n_experts, self.hidden, self.intermediate, self.top_k, self.context.backend,
            " closed" if self.closed else "")


# ---- argument helpers ---------------------------------------------------------------------------

def _scale(x, name, rows_needed, max_cols, exact_rows=False):
    """A float32 scale tensor as (Arr, rows, cols): [rows, cols], [rows], or one value."""
    a = A.adapt(x, name, dtypes=("float32",), ndim=(0, 1, 2))
    shp = a.shape
    if len(shp) == 0 or (len(shp) == 1 and shp[0] == 1):
        return a, 1, 1
    rows, cols = (shp[0], 1) if len(shp) == 1 else shp
    if cols > max_cols or (exact_rows and rows != rows_needed) or rows < rows_needed:
        want = ("[%d%s]" % (rows_needed, ", 2] or [%d]" % rows_needed if max_cols == 2 else "") if exact_rows
                else "at least %d rows (expert_begin + experts)%s" % (rows_needed, ", 1 or 2 columns"
                                                                      if max_cols == 2 else ""))
        raise ValueError("%s has shape %s; it must be %s, or hold one value" % (name, list(shp), want))
    return a, int(rows), int(cols)


def _input_rows(layer, e_loc, in_rows):
    """The input scales' row of each local expert, or None where they have a row per local
    expert (in_rows <= e_loc: vLLM, or no EP). SGLang 0.5.23's FusedMoE keeps a row for every
    expert of the model (_sglang_require_global_experts) and loads each by its global id: the
    rank's routed experts 0..R-1 at storage_rank * R + x (moe_ep_rank, or the storage rank of
    an elastic EP join), its fused shared experts R.. at num_global_routed_experts + i, after
    every routed expert of the model (global shared slots). The per-rank shared slots of its
    DeepEP-class and MegaMoE backends (one a rank) have no rows of their own: refused."""
    if in_rows <= e_loc:
        return None
    shared = int(getattr(layer, "num_fused_shared_experts", 0) or 0)
    routed = e_loc - shared
    rank = next((int(v) for v in (getattr(layer, a, None) for a in ("_expert_storage_rank", "moe_ep_rank", "ep_rank"))
                 if v is not None), 0)
    routed_all = getattr(layer, "num_global_routed_experts", None)
    routed_all = in_rows - shared if routed_all is None else int(routed_all)
    if shared and in_rows - routed_all != shared:
        raise ValueError(
            "the layer keeps its %d fused shared expert(s) in per-rank shared-expert slots (num_experts %d = %d routed "
            "+ %d slots: SGLang's DeepEP, MoRI, Mooncake, NIXL or MegaMoE all-to-all), whose input scales SGLang loads "
            "into rows routed experts use too: run moejit with SGLang's standard dispatcher (no --moe-a2a-backend), "
            "or pass --disable-shared-experts-fusion" % (shared, in_rows, routed_all, in_rows - routed_all))
    rows = [rank * routed + x for x in range(routed)] + [routed_all + i for i in range(shared)]
    if rows and max(rows) >= in_rows:
        raise ValueError("the layer's input scales have %d rows; rank %d's %d routed experts reach row %d: pass "
                         "expert_begin= (or copies of the rank's rows)" % (in_rows, rank, routed, max(rows)))
    return rows


def _take_rows(x, rows, name, into=None):
    """x's rows `rows` (a numpy array or a torch tensor), as a new contiguous one on x's device
    or copied into `into`. A CUDA copy is waited for: C reads it with a plain memcpy."""
    if isinstance(x, np.ndarray):
        if into is None:
            return np.ascontiguousarray(x[np.asarray(rows)])
        into[...] = x[np.asarray(rows)]
        return into
    if not A.is_torch(x):
        raise TypeError("%s is a %s; pass a numpy array or a torch tensor" % (name, type(x).__name__))
    torch = sys.modules["torch"]
    got = x.index_select(0, torch.tensor(rows, dtype=torch.int64, device=x.device))   # a new, contiguous tensor
    if into is None:
        into = got
    else:
        into.copy_(got)
    if str(x.device).startswith("cuda"):
        torch.cuda.current_stream(x.device).synchronize()
    return into


def _layer_top_k(layer):
    for path in (("top_k",), ("moe_runner_config", "top_k"), ("topk_config", "top_k"), ("moe_config", "experts_per_token")):
        v = layer
        for p in path:
            v = getattr(v, p, None)
        if isinstance(v, int) and v > 0:
            return v
    raise ValueError("the layer does not say its top_k; pass top_k=")


def _hidden(h):
    """hidden as an Arr of bf16 bits (torch bfloat16, numpy uint16) and whether it came in as
    numpy float32 (then rounded to bf16 on the way in, f32 out)."""
    if isinstance(h, np.ndarray) and h.dtype == np.float32:
        return A.adapt(A.bf16_from_f32(h), "hidden_states", dtypes=("uint16",), ndim=2), True
    if A.is_torch(h) and str(h.dtype) in ("torch.float16", "torch.float32") and hasattr(h, "to"):
        h = h.to(sys.modules["torch"].bfloat16)
    return A.adapt(h, "hidden_states", dtypes=("bfloat16", "uint16"), ndim=2), False


def _as_int32(ids):
    if A.is_torch(ids) and str(ids.dtype) == "torch.int64" and hasattr(ids, "to"):
        return ids.to(sys.modules["torch"].int32)
    if isinstance(ids, np.ndarray) and ids.dtype == np.int64:
        return ids.astype(np.int32)
    return ids


def _as_float32(w):
    if A.is_torch(w) and str(w.dtype) in ("torch.bfloat16", "torch.float16") and hasattr(w, "float"):
        return w.float()
    return w


def _mask_rows(ids, n):
    """ids with the rows at and past n set to -1 (a new array / tensor; n may be a tensor)."""
    if isinstance(ids, np.ndarray):
        k = int(np.asarray(n).reshape(-1)[0])
        out = ids.copy()
        out[k:] = -1
        return out
    torch = sys.modules["torch"]
    rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    return ids.masked_fill(rows >= n, -1)


# ---- a torch custom op ---------------------------------------------------------------------------
# torch.compile and CUDA-graph capture see an Experts call as one opaque op, moejit::experts, with
# a fake (meta) implementation that gives the output's shape and dtype without running anything.
# The handle travels as an int key into _OPS (kept until the Experts is closed).

_OPS = weakref.WeakValueDictionary()
_op = {"fn": None}


def _op_impl(hidden_states, topk_weights, topk_ids, handle):
    ex = _OPS.get(int(handle))
    if ex is None or ex.closed:
        raise ValueError("moejit::experts: handle %d names no open Experts" % int(handle))
    return ex.forward(hidden_states, topk_weights, topk_ids)


def _op_fake(hidden_states, topk_weights, topk_ids, handle):
    torch = sys.modules["torch"]
    return torch.empty(tuple(hidden_states.shape), dtype=hidden_states.dtype, device=hidden_states.device)


def torch_op():
    """The op moejit::experts(hidden_states, topk_weights, topk_ids, handle) -> Tensor, registered
    with torch.library once (torch.library.custom_op and register_fake on torch >= 2.4; a
    Library with CPU, CUDA, Meta and AutogradMeta kernels before that)."""
    if _op["fn"] is not None:
        return _op["fn"]
    import torch
    tl = torch.library
    if hasattr(tl, "custom_op"):
        fn = tl.custom_op("moejit::experts", mutates_args=())(_typed_impl(torch))
        fn.register_fake(_op_fake)
    else:
        L = tl.Library("moejit", "DEF")
        L.define("experts(Tensor hidden_states, Tensor topk_weights, Tensor topk_ids, int handle) -> Tensor")
        for key in ("CPU", "CUDA"):
            L.impl("experts", _op_impl, key)
        # torch < 2.0 has no autograd fallthrough for meta tensors: without a kernel at
        # AutogradMeta a call on them never reaches Meta's
        for fake_key in ("Meta", "AutogradMeta"):
            L.impl("experts", _op_fake, fake_key)
        _op["lib"] = L
        fn = torch.ops.moejit.experts
    _op["fn"] = fn
    return fn


def _typed_impl(torch):
    # custom_op reads the schema from the annotations
    def experts(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                handle: int) -> torch.Tensor:
        return _op_impl(hidden_states, topk_weights, topk_ids, handle)
    return experts


def _as_op(self):
    """This Experts as a call of the torch op moejit::experts (see torch_op)."""
    key = id(self)
    _OPS[key] = self
    fn = torch_op()
    return lambda hidden_states, topk_weights, topk_ids: fn(hidden_states, topk_weights, topk_ids, key)


Experts.as_torch_op = _as_op
