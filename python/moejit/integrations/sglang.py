"""moejit's experts in SGLang (checked against sglang 0.5.23's sources by tests/python/test_engines.py).

MoejitNvFp4FusedMoEMethod is SGLang's ModelOptNvFp4FusedMoEMethod with moejit running the
experts: the same parameters (create_weights is SGLang's: names, shapes, weight loaders), w13
loaded [gate; up] (load_up_proj_weight_first False), no swizzled copies of the scales; after
loading, process_weights_after_loading adopts the tensors in place (Experts.from_layer: no
second copy of the weights; again after a reload into the same storage); apply runs the
dispatch output's top-k (topk_weights carry the routed scaling factor, as SGLang's NVFP4 path
folds it in: fuse_routed_scaling_factor_in_topk) and returns StandardCombineInput with the
un-reduced bf16 output (SGLang all-reduces after the method).

Use: install() before SGLang builds the model (it replaces the class in modelopt_quant, where
ModelOptFp4Config.get_quant_method looks it up), or pip install moejit and set
MOEJIT_EXPERTS=1: SGLang's plugin loader calls register() (entry point group
sglang.srt.plugins), which registers the same replacement through its HookRegistry.
"""
from . import options, wanted

TARGET = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
_cls = {}


def method_class():
    """The MoE method class (made on first use: it subclasses SGLang's, imported then)."""
    if "c" in _cls:
        return _cls["c"]
    import torch

    import moejit
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput
    from sglang.srt.layers.quantization import modelopt_quant

    base = getattr(modelopt_quant, "_moejit_original", modelopt_quant.ModelOptNvFp4FusedMoEMethod)

    class MoejitNvFp4FusedMoEMethod(base):
        # topk_weights carry rsf (SGLang then does not scale the output again)
        fuse_routed_scaling_factor_in_topk = True

        def __init__(self, quant_config):
            # base.__init__ chooses (and checks the GPU for) one of SGLang's FP4 backends: none runs here
            self.quant_config = quant_config
            self._lora_marlin = False
            self.enable_flashinfer_trtllm_moe = False
            self.use_flashinfer_trtllm_weight_layout = False
            self._cache_permute_indices = {}
            self.moejit_options = options()

        @property
        def load_up_proj_weight_first(self):
            return False

        def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                           **extra_weight_attrs):
            super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                                   **extra_weight_attrs)
            layer.w13_blockscale_swizzled = None   # SGLang's CUTLASS copies; moejit packs in place
            layer.w2_blockscale_swizzled = None

        def process_weights_after_loading(self, layer):
            ex = getattr(layer, "_moejit_experts", None)
            if ex is not None and not ex.closed:
                ex.readopt()   # a reload into the same storage
                return
            layer._moejit_experts = moejit.Experts.from_layer(layer, top_k=int(layer.top_k), **self.moejit_options)

        def create_moe_runner(self, layer, moe_runner_config):
            self.moe_runner_config = moe_runner_config
            self.runner = None

        def apply(self, layer, dispatch_output):
            topk = dispatch_output.topk_output
            ids = _local_ids(layer, topk.topk_ids, torch)
            out = layer._moejit_experts(dispatch_output.hidden_states, topk.topk_weights, ids)
            return StandardCombineInput(hidden_states=out)

    _cls["c"] = MoejitNvFp4FusedMoEMethod
    return MoejitNvFp4FusedMoEMethod


def _local_ids(layer, ids, torch):
    """Local expert ids: SGLang maps global ids to local ones in its dispatcher under EP, except
    for the backends that keep them global; then the same map here (-1: not on this rank)."""
    d = getattr(layer, "dispatcher", None)
    if getattr(layer, "moe_ep_size", 1) <= 1 or not getattr(d, "skip_local_expert_mapping", False):
        return ids
    m = getattr(layer, "_moejit_local_map", None)
    if m is None:
        n_loc = int(layer.num_local_experts)
        shared = int(getattr(d, "num_local_shared_experts", 0) or 0)
        m = torch.full((int(layer.num_experts),), -1, dtype=torch.int32, device=ids.device)
        r0 = int(layer.moe_ep_rank) * (n_loc - shared)
        m[r0:r0 + n_loc - shared] = torch.arange(n_loc - shared, dtype=torch.int32, device=ids.device)
        if shared:
            m[-shared:] = torch.arange(n_loc - shared, n_loc, dtype=torch.int32, device=ids.device)
        layer._moejit_local_map = m
    return torch.where(ids < 0, -1, m[ids.clamp_min(0)])


def install():
    """Make SGLang build moejit's MoE method for ModelOpt NVFP4 layers (the one-line patch)."""
    from sglang.srt.layers.quantization import modelopt_quant
    cls = method_class()
    if not hasattr(modelopt_quant, "_moejit_original"):
        modelopt_quant._moejit_original = modelopt_quant.ModelOptNvFp4FusedMoEMethod
    modelopt_quant.ModelOptNvFp4FusedMoEMethod = cls
    return cls


def register():
    """SGLang's general plugin entry point: with $MOEJIT_EXPERTS=1, register the class
    replacement with SGLang's HookRegistry (applied before the engine starts)."""
    if not wanted():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    HookRegistry.register(TARGET, method_class(), HookType.REPLACE)
