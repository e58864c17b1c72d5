"""ctypes mirrors of the structs of include/moejit.h, field for field.

Each class names its C type (_c_name_) and, where the header has one, its initializer macro
(_c_init_); constructing the class with no arguments gives the macro's values, struct_size
included (ctypes.sizeof). tests/python/test_structs.py compiles a small C program against the
header and checks every size, field offset, field size and initializer value here against it.
Enums are C ints (4 bytes on every ABI the library builds for).
"""
import ctypes

from ctypes import c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_uint8, c_uint32, c_uint64, c_void_p

# Constants of the header (checked against C by the same test).
MJ_SCORING_SIGMOID, MJ_SCORING_SOFTMAX = 0, 1
MJ_GROUP_SCORE_TOP2_SUM, MJ_GROUP_SCORE_MAX = 0, 1
MJ_PAR_NONE, MJ_PAR_TP, MJ_PAR_EP = 0, 1, 2
MJ_MODE_W4A16, MJ_MODE_W4A4, MJ_MODE_AUTO = 0, 1, 2
MJ_BACKEND_CUDA, MJ_BACKEND_SIM, MJ_BACKEND_AUTO = 0, 1, -1
MJ_DEVICE_NONE, MJ_DEVICE_AUTO = -1, -2
MJ_QUANT_NONE, MJ_QUANT_NVFP4 = 0, 1
MJ_ACT_SILU = 0
MJ_K0_POLICY_MAX_RULES = 16
MJ_COMM_MAX_RANKS = 64
MJ_MAX_BATCH = 65536
MJ_DIM_ALIGN = 64
MJ_ADOPT_UP_FIRST, MJ_ADOPT_SCALES_SWIZZLED = 1 << 0, 1 << 1
MJ_ADOPT_RECIPROCAL_WEIGHT_SCALE_2, MJ_ADOPT_RECIPROCAL_INPUT_SCALE, MJ_ADOPT_COPY = 1 << 2, 1 << 3, 1 << 4
MJ_ADOPT_FLAGS_ALL = (1 << 5) - 1
MJ_OUT_F32, MJ_OUT_BF16 = 0, 1

CONSTANTS = {
    name: value
    for name, value in globals().items()
    if name.startswith("MJ_") and isinstance(value, int)
}


_INT_BITS = {c_int: (-2 ** 31, 2 ** 31 - 1), c_int32: (-2 ** 31, 2 ** 31 - 1), c_int64: (-2 ** 63, 2 ** 63 - 1),
             c_uint8: (0, 255), c_uint32: (0, 2 ** 32 - 1), c_uint64: (0, 2 ** 64 - 1)}


class _Struct(ctypes.Structure):
    _c_name_ = None
    _c_init_ = None       # the initializer macro, or None
    _defaults_ = {}       # field -> the macro's value (other fields are zero)

    def __setattr__(self, name, value):
        # ctypes would wrap an int to the field's width and cut bytes at a NUL: refuse both.
        t = type(self)._field_types().get(name)
        if t is not None and value is not None and not isinstance(value, bool):
            if t is c_char_p:
                if isinstance(value, (bytes, bytearray)) and b"\0" in value:
                    raise ValueError("%s.%s: %r contains a NUL byte, where C would end the string" %
                                     (self._c_name_, name, bytes(value)))
            elif t in _INT_BITS and hasattr(value, "__index__"):
                n = value.__index__()
                lo, hi = _INT_BITS[t]
                if not lo <= n <= hi:
                    raise ValueError("%s.%s = %d does not fit its C type (%d..%d)" % (self._c_name_, name, n, lo, hi))
        super().__setattr__(name, value)

    @classmethod
    def _field_types(cls):
        ft = cls.__dict__.get("_ftypes_")
        if ft is None:
            ft = {f[0]: f[1] for f in cls._fields_}
            setattr(cls, "_ftypes_", ft)
        return ft

    def __init__(self, **kw):
        super().__init__()
        names = {f[0] for f in self._fields_}
        if "struct_size" in names:
            self.struct_size = ctypes.sizeof(self)
        for k, v in self._defaults_.items():
            setattr(self, k, v)
        for k, v in kw.items():
            if k not in names:
                raise TypeError("%s has no field %r" % (self._c_name_, k))
            setattr(self, k, v)


class MoeConfigC(_Struct):
    _c_name_ = "mj_moe_config"
    _fields_ = [
        ("hidden", c_int32),
        ("intermediate", c_int32),
        ("n_experts", c_int32),
        ("topk", c_int32),
        ("n_shared", c_int32),
        ("n_group", c_int32),
        ("topk_group", c_int32),
        ("scoring", c_int),
        ("routed_scaling_factor", c_float),
        ("norm_topk_prob", c_int32),
        ("has_correction_bias", c_int32),
        ("activation", c_int),
        ("quant", c_int),
        ("quant_group_size", c_int32),
        ("group_score", c_int),
        ("shared_gate", c_int32),
    ]


class RouteParamsC(_Struct):
    _c_name_ = "mj_route_params"
    _c_init_ = "MJ_ROUTE_PARAMS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_experts", c_int32),
        ("topk", c_int32),
        ("k0", c_int32),
        ("n_group", c_int32),
        ("topk_group", c_int32),
        ("scoring", c_int),
        ("routed_scaling_factor", c_float),
        ("renormalize", c_int32),
        ("group_score", c_int),
    ]
    _defaults_ = {"n_group": 1, "topk_group": 1, "scoring": MJ_SCORING_SIGMOID, "routed_scaling_factor": 1.0,
                  "renormalize": 1, "group_score": MJ_GROUP_SCORE_TOP2_SUM}


class RouteStatsC(_Struct):
    _c_name_ = "mj_route_stats"
    _c_init_ = "MJ_ROUTE_STATS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("unique_before", c_int32),
        ("unique_after", c_int32),
        ("mean_experts", c_double),
        ("retained_mass", c_double),
        ("nan_logits", c_int64),
    ]


class RouteOutputsC(_Struct):
    _c_name_ = "mj_route_outputs"
    _c_init_ = "MJ_ROUTE_OUTPUTS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("ids", c_void_p),             # [B, k] i32
        ("weights", c_void_p),         # [B, k] f32
        ("n_sel", c_void_p),           # [B] i32
        ("expert_counts", c_void_p),   # [E] i32
        ("expert_offsets", c_void_p),  # [E + 1] i32
        ("active_experts", c_void_p),  # [E] i32
        ("n_active", c_void_p),        # [1] i32
        ("permutation", c_void_p),     # [B, k] i32
        ("row_index", c_void_p),       # [B, k] i32
    ]


class ContextOptionsC(_Struct):
    _c_name_ = "mj_context_options"
    _c_init_ = "MJ_CONTEXT_OPTIONS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("cache_dir", c_char_p),
        ("cache_max_bytes", c_int64),
        ("strict", c_int32),
        ("device", c_int32),
        ("backend", c_int32),
        ("target", c_char_p),
    ]
    _defaults_ = {"strict": -1, "device": MJ_DEVICE_AUTO, "backend": MJ_BACKEND_AUTO}


class JitStatsC(_Struct):
    _c_name_ = "mj_jit_stats"
    _fields_ = [
        ("mem_hits", c_int64),
        ("mem_misses", c_int64),
        ("disk_hits", c_int64),
        ("disk_misses", c_int64),
        ("compiles", c_int64),
        ("compile_failures", c_int64),
        ("compile_ms", c_double),
        ("quarantined", c_int64),
        ("lock_waits", c_int64),
        ("evicted", c_int64),
        ("strict_misses", c_int64),
        ("refused_unsafe", c_int64),
        ("store_failures", c_int64),
    ]


class K0RuleC(ctypes.Structure):
    _fields_ = [("b_lo", c_int32), ("b_hi", c_int32), ("k0", c_int32)]


class K0PolicyC(_Struct):
    _c_name_ = "mj_k0_policy"
    _fields_ = [("n_rules", c_int32), ("rules", K0RuleC * MJ_K0_POLICY_MAX_RULES)]


class CommIdC(_Struct):
    _c_name_ = "mj_comm_id"
    _fields_ = [("bytes", c_uint8 * 128)]


class MoeOptionsC(_Struct):
    _c_name_ = "mj_moe_options"
    _c_init_ = "MJ_MOE_OPTIONS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("parallel", c_int),
        ("rank", c_int32),
        ("n_ranks", c_int32),
        ("comm", c_void_p),
        ("rsf_in_weights", c_int32),
        ("shared_expert", c_int32),
        ("mode_policy", c_char_p),
    ]
    _defaults_ = {"parallel": MJ_PAR_NONE, "n_ranks": 1, "rsf_in_weights": 1, "shared_expert": 1}


class MoePrepareOptionsC(_Struct):
    _c_name_ = "mj_moe_prepare_options"
    _c_init_ = "MJ_MOE_PREPARE_OPTIONS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_batch", c_int32),
        ("batches", c_void_p),         # const int32_t * [n_batches]
        ("n_batches", c_int32),
        ("k0_policy", c_char_p),
        ("mode", c_int),
    ]
    _defaults_ = {"max_batch": 256, "mode": MJ_MODE_AUTO}


class CheckpointMakeOptionsC(_Struct):
    _c_name_ = "mj_checkpoint_make_options"
    _c_init_ = "MJ_CHECKPOINT_MAKE_OPTIONS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("config_json", c_char_p),
        ("quant_json", c_char_p),
        ("out_dir", c_char_p),
        ("seed", c_uint64),
        ("layer_first", c_int32),
        ("layer_last", c_int32),
        ("hidden", c_int32),
        ("intermediate", c_int32),
        ("n_experts", c_int32),
        ("topk", c_int32),
        ("shard_bytes", c_int64),
    ]
    _defaults_ = {"layer_first": -1, "layer_last": -1}


class CheckpointMakeInfoC(_Struct):
    _c_name_ = "mj_checkpoint_make_info"
    _c_init_ = "MJ_CHECKPOINT_MAKE_INFO_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("cfg", MoeConfigC),
        ("layer_first", c_int32),
        ("layer_last", c_int32),
        ("n_layers", c_int32),
        ("n_shards", c_int32),
        ("tensor_bytes", c_int64),
        ("total_bytes", c_int64),
    ]


class ExpertsOptionsC(_Struct):
    _c_name_ = "mj_experts_options"
    _c_init_ = "MJ_EXPERTS_OPTIONS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_batch", c_int32),
        ("mode_policy", c_char_p),
    ]
    _defaults_ = {"max_batch": 256}


class AdoptScaleC(_Struct):
    _c_name_ = "mj_adopt_scale"
    _fields_ = [("data", c_void_p), ("rows", c_int32), ("cols", c_int32)]


class AdoptTensorsC(_Struct):
    _c_name_ = "mj_adopt_tensors"
    _c_init_ = "MJ_ADOPT_TENSORS_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_experts", c_int32),
        ("hidden", c_int32),
        ("intermediate", c_int32),
        ("topk", c_int32),
        ("w13_weight", c_void_p),
        ("w13_weight_scale", c_void_p),
        ("w2_weight", c_void_p),
        ("w2_weight_scale", c_void_p),
        ("w13_weight_scale_2", AdoptScaleC),
        ("w2_weight_scale_2", AdoptScaleC),
        ("w13_input_scale", AdoptScaleC),
        ("w2_input_scale", AdoptScaleC),
        ("expert_begin", c_int32),
        ("flags", c_uint32),
    ]


class AdoptInfoC(_Struct):
    _c_name_ = "mj_adopt_info"
    _c_init_ = "MJ_ADOPT_INFO_INIT"
    _fields_ = [
        ("struct_size", c_uint32),
        ("adopted", c_int32),
        ("in_place", c_int32),
        ("scales_in_place", c_int32),
        ("released", c_int32),
        ("bytes_allocated", c_int64),
        ("bytes_weights", c_int64),
    ]


# Every mirrored struct, for the layout test.
ALL = (MoeConfigC, RouteParamsC, RouteStatsC, RouteOutputsC, ContextOptionsC, JitStatsC, K0PolicyC, CommIdC,
       MoeOptionsC, MoePrepareOptionsC, CheckpointMakeOptionsC, CheckpointMakeInfoC, ExpertsOptionsC, AdoptScaleC,
       AdoptTensorsC, AdoptInfoC)
