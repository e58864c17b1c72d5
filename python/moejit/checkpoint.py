"""Model configs, checkpoints, layers (host memory) and the CPU reference forward."""
import ctypes
import dataclasses
import os

import numpy as np

from . import _arrays as A
from . import _structs as S
from ._handle import Handle, serialized
from ._lib import int_arg, lib, path_arg

_SCORING = {S.MJ_SCORING_SIGMOID: "sigmoid", S.MJ_SCORING_SOFTMAX: "softmax"}
_GSCORE = {S.MJ_GROUP_SCORE_TOP2_SUM: "top2_sum", S.MJ_GROUP_SCORE_MAX: "max"}
_QUANT = {S.MJ_QUANT_NONE: "none", S.MJ_QUANT_NVFP4: "nvfp4"}
MODES = {"w4a16": S.MJ_MODE_W4A16, "w4a4": S.MJ_MODE_W4A4, "auto": S.MJ_MODE_AUTO}
MODE_NAMES = {v: k for k, v in MODES.items()}


def _inv(d, v, what):
    for k, x in d.items():
        if x == v:
            return k
    raise ValueError("%s %r: use %s" % (what, v, " or ".join(map(repr, d.values()))))


@dataclasses.dataclass
class MoeConfig:
    """mj_moe_config: one MoE layer's shape and routing (GLM-5: MoeConfig.glm5())."""

    hidden: int
    intermediate: int
    n_experts: int
    topk: int
    n_shared: int = 1
    n_group: int = 1
    topk_group: int = 1
    scoring: str = "sigmoid"
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    has_correction_bias: bool = True
    quant: str = "nvfp4"
    quant_group_size: int = 16
    group_score: str = "top2_sum"
    shared_gate: bool = False

    @classmethod
    def _from_c(cls, c):
        return cls(hidden=c.hidden, intermediate=c.intermediate, n_experts=c.n_experts, topk=c.topk,
                   n_shared=c.n_shared, n_group=c.n_group, topk_group=c.topk_group,
                   scoring=_SCORING.get(c.scoring, str(c.scoring)), routed_scaling_factor=c.routed_scaling_factor,
                   norm_topk_prob=bool(c.norm_topk_prob), has_correction_bias=bool(c.has_correction_bias),
                   quant=_QUANT.get(c.quant, str(c.quant)), quant_group_size=c.quant_group_size,
                   group_score=_GSCORE.get(c.group_score, str(c.group_score)), shared_gate=bool(c.shared_gate))

    def _to_c(self):
        c = S.MoeConfigC()
        for f in ("hidden", "intermediate", "n_experts", "topk", "n_shared", "n_group", "topk_group",
                  "quant_group_size"):
            setattr(c, f, int(getattr(self, f)))
        c.scoring = _inv(_SCORING, self.scoring, "scoring")
        c.group_score = _inv(_GSCORE, self.group_score, "group_score")
        c.quant = _inv(_QUANT, self.quant, "quant")
        c.routed_scaling_factor = float(self.routed_scaling_factor)
        c.norm_topk_prob = 1 if self.norm_topk_prob else 0
        c.has_correction_bias = 1 if self.has_correction_bias else 0
        c.shared_gate = 1 if self.shared_gate else 0
        c.activation = S.MJ_ACT_SILU
        return c

    @classmethod
    def glm5(cls):
        """GLM-5's MoE layer (its config.json, NVFP4)."""
        c = S.MoeConfigC()
        lib().mj_moe_config_glm5(ctypes.byref(c))
        return cls._from_c(c)

    @classmethod
    def read(cls, config_json, quant_json=None):
        """From a Hugging Face config.json (and hf_quant_config.json, or None: the
        quantization_config inside config.json)."""
        c = S.MoeConfigC()
        lib().mj_moe_config_read(path_arg(config_json, "config_json"),
                                 None if quant_json is None else path_arg(quant_json, "quant_json"), ctypes.byref(c))
        return cls._from_c(c)

    def validate(self, require_nvfp4=True):
        """mj_moe_config_validate: raises MoejitError saying what the kernels cannot run."""
        c = self._to_c()
        lib().mj_moe_config_validate(ctypes.byref(c), 1 if require_nvfp4 else 0)


def _split(tp, ep, rank):
    """(kind, rank, n_ranks) from tp= / ep=."""
    if tp is not None and ep is not None:
        raise ValueError("give tp or ep, not both")
    n = tp if tp is not None else ep
    if n is None:
        if rank not in (0, None):
            raise ValueError("rank %r without tp or ep" % (rank,))
        return S.MJ_PAR_NONE, 0, 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= S.MJ_COMM_MAX_RANKS:
        raise ValueError("%s=%r: the number of ranks, 1..%d" % ("tp" if tp is not None else "ep", n,
                                                               S.MJ_COMM_MAX_RANKS))
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError("rank %r is not one of 0..%d" % (rank, n - 1))
    return (S.MJ_PAR_TP if tp is not None else S.MJ_PAR_EP), rank, n


class Layer(Handle):
    """An mj_layer_t: one MoE layer's weights in host memory (whole, or a rank's slice)."""

    _free_name = "mj_layer_free"
    _what = "layer"

    def __init__(self, _ptr, config, parallel=S.MJ_PAR_NONE, rank=0, n_ranks=1, index=None):
        super().__init__()
        self._adopt(_ptr)
        self.config = config
        self.parallel, self.rank, self.n_ranks, self.index = parallel, rank, n_ranks, index

    @classmethod
    def random(cls, config, seed=0):
        """A random layer of this MoeConfig, reproducible from seed (mj_layer_create_random)."""
        c = config._to_c()
        p = ctypes.c_void_p()
        lib().mj_layer_create_random(ctypes.byref(c), int(seed), ctypes.byref(p))
        return cls(p.value, config)

    @serialized
    def shard(self, *, tp=None, ep=None, rank=0):
        """The slice rank `rank` holds under tp=n or ep=n (a new Layer)."""
        kind, rank, n = _split(tp, ep, rank)
        p = ctypes.c_void_p()
        lib().mj_layer_shard(self._handle(), kind, rank, n, ctypes.byref(p))
        return Layer(p.value, self.config, kind, rank, n, self.index)

    def _hidden(self, hidden):
        return _bf16_host(hidden, "hidden", self.config.hidden)

    @serialized
    def router_ref(self, hidden):
        """logits [B, E] float32 of hidden [B, H] (bf16 as in Moe.forward), on the CPU."""
        h, keep = self._hidden(hidden)
        B = h.shape[0]
        out = A.empty(h, (B, self.config.n_experts), "float32")
        lib().mj_router_ref(self._handle(), h.ptr, B, _ptr_of(out))
        del keep
        return out

    @serialized
    def forward_ref(self, hidden, num_valid=None, *, k0=None, mode="w4a16"):
        """The CPU reference forward (mj_moe_forward_ref) of this layer (or this rank's part):
        out [B, H] float32 for hidden [B, H] bf16 (see Moe.forward for the accepted forms).
        k0: None (plain top-k) or 1..topk; mode: "w4a16" or "w4a4"."""
        if k0 is not None:
            k0 = int_arg(k0, "k0", 1, self.config.topk)
        h, keep = self._hidden(hidden)
        B = h.shape[0]
        nv = B if num_valid is None else int_arg(num_valid, "num_valid", 0, B)
        if not 0 <= nv <= B:
            raise ValueError("num_valid %d is not in 0..%d" % (nv, B))
        if mode not in ("w4a16", "w4a4"):
            raise ValueError("mode %r: the reference runs 'w4a16' or 'w4a4'" % (mode,))
        out = A.empty(h, (B, self.config.hidden), "float32")
        lib().mj_moe_forward_ref(self._handle(), MODES[mode], h.ptr, B, nv, 0 if k0 is None else k0,
                                 _ptr_of(out), None)
        del keep
        return out


def _ptr_of(x):
    return x.data_ptr() if A.is_torch(x) else x.ctypes.data


def _bf16_host(hidden, name, H):
    """hidden [B, H] as bf16 bits in host memory: (Arr, what to keep alive)."""
    a = A.adapt(hidden, name, dtypes=("bfloat16", "uint16", "float32"), ndim=2)
    if a.shape[1] != H:
        raise ValueError("%s has shape %s; it must be [B, %d] (hidden size)" % (name, list(a.shape), H))
    if a.is_cuda:
        raise ValueError("%s is %s; the CPU reference takes host arrays (.cpu())" % (name, a.where()))
    if a.kind == "numpy":
        if a.dtype == "float32":
            bits = A.bf16_from_f32(a.obj)
            return A.adapt(bits, name, dtypes=("uint16",), ndim=2), bits
        if a.dtype == "bfloat16":
            bits = a.obj.view(np.uint16)
            return A.adapt(bits, name, dtypes=("uint16",), ndim=2), bits
    elif a.dtype != "bfloat16":
        raise TypeError("%s is a torch %s tensor; pass torch.bfloat16 (hidden.to(torch.bfloat16))" % (name, a.dtype))
    return a, a.obj


class Checkpoint(Handle):
    """An open ModelOpt NVFP4 checkpoint directory (mj_checkpoint_open)."""

    _free_name = "mj_checkpoint_close"
    _what = "checkpoint"

    def __init__(self, path):
        super().__init__()
        self.path = os.fspath(path)
        p = ctypes.c_void_p()
        lib().mj_checkpoint_open(path_arg(self.path, "checkpoint path"), ctypes.byref(p))
        self._adopt(p.value)
        c = S.MoeConfigC()
        lib().mj_checkpoint_config(self._handle(), ctypes.byref(c))
        self.config = MoeConfig._from_c(c)

    @property
    def moe_layers(self):
        """The MoE layers it holds, ascending."""
        return self._moe_layers()

    @serialized
    def _moe_layers(self):
        n = ctypes.c_int32()
        lib().mj_checkpoint_moe_layers(self._handle(), None, 0, ctypes.byref(n))
        arr = (ctypes.c_int32 * max(n.value, 1))()
        lib().mj_checkpoint_moe_layers(self._handle(), arr, n.value, ctypes.byref(n))
        return list(arr[:n.value])

    @serialized
    def load_layer(self, layer=None, *, tp=None, ep=None, rank=0):
        """Layer `layer` (None: the first MoE layer), whole or rank's slice under tp=n / ep=n:
        only that slice's bytes are read."""
        kind, rank, n = _split(tp, ep, rank)
        if layer is not None:
            layer = int_arg(layer, "layer", 0, 2 ** 31 - 1)
        if layer is None:
            layers = self.moe_layers
            if not layers:
                raise ValueError("%s holds no MoE layer" % self.path)
            layer = layers[0]
        p = ctypes.c_void_p()
        lib().mj_layer_load(self._handle(), layer, kind, rank, n, ctypes.byref(p))
        return Layer(p.value, self.config, kind, rank, n, layer)

    def __repr__(self):
        return "<moejit.Checkpoint %s%s>" % (self.path, " closed" if self.closed else "")


def make_checkpoint(config_json, out_dir, *, seed=0, layer_first=None, layer_last=None, hidden=None,
                    intermediate=None, n_experts=None, topk=None, shard_bytes=None, quant_json=None, plan_only=False):
    """Write a checkpoint directory of random MoE layers (mj_checkpoint_make, as `moejit
    make-checkpoint`): config_json's model with the given overrides, NVFP4. Returns what was
    (or, with plan_only, would be) written: a dict with config, layer_first, layer_last,
    n_layers, n_shards, tensor_bytes, total_bytes. out_dir must not exist or be empty."""
    o = S.CheckpointMakeOptionsC()
    o.config_json = path_arg(config_json, "config_json")
    o.out_dir = path_arg(out_dir, "out_dir")
    if quant_json is not None:
        o.quant_json = path_arg(quant_json, "quant_json")
    o.seed = int(seed)
    for f, v in (("layer_first", layer_first), ("layer_last", layer_last), ("hidden", hidden),
                 ("intermediate", intermediate), ("n_experts", n_experts), ("topk", topk),
                 ("shard_bytes", shard_bytes)):
        if v is not None:
            setattr(o, f, int(v))
    info = S.CheckpointMakeInfoC()
    c = lib()
    c.mj_checkpoint_make_plan(ctypes.byref(o), ctypes.byref(info))
    if not plan_only:
        c.mj_checkpoint_make(ctypes.byref(o))
    return {"config": MoeConfig._from_c(info.cfg), "layer_first": info.layer_first, "layer_last": info.layer_last,
            "n_layers": info.n_layers, "n_shards": info.n_shards, "tensor_bytes": info.tensor_bytes,
            "total_bytes": info.total_bytes}
