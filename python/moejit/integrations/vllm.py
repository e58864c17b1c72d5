"""moejit's experts in vLLM (checked against vllm 0.34.0's sources by tests/python/test_engines.py).

MoejitNvFp4FusedMoE is vLLM's ModelOptNvFp4FusedMoE with moejit running the experts: the same
parameters (create_weights is vLLM's), the input scales kept per local expert (use_global_sf
off: [E_loc, 2]); process_weights_after_loading adopts them in place; apply(layer, x,
topk_weights, topk_ids, shared_experts, shared_experts_input) maps ids through the layer's
expert_map under EP and returns the un-reduced output (vLLM's runner reduces it). A model with
shared experts passed to apply is refused (vLLM runs them beside the method by default).

Use: install() before vLLM builds the model (ModelOptNvFp4Config.FusedMoEMethodCls =
MoejitNvFp4FusedMoE), or pip install moejit and set MOEJIT_EXPERTS=1: vLLM's plugin loader
calls register() (entry point group vllm.general_plugins) in every process.
"""
from . import options, wanted

_cls = {}


def method_class():
    if "c" in _cls:
        return _cls["c"]
    import torch

    import moejit
    from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
    from vllm.model_executor.layers.quantization import modelopt

    base = getattr(modelopt, "_moejit_original", modelopt.ModelOptNvFp4FusedMoE)

    class MoejitNvFp4FusedMoE(base):
        def __init__(self, quant_config, moe_config):
            # base.__init__ selects one of vLLM's NVFP4 kernels (and needs one): none runs here
            FusedMoEMethodBase.__init__(self, moe_config)
            self.quant_config = quant_config
            self.use_a16 = False
            self.uses_input_scales = True
            self.per_token_activation = False
            self.nvfp4_backend = None
            self.use_global_sf = False
            self.moejit_options = options()

        @property
        def is_monolithic(self):
            return False

        def get_fused_moe_quant_config(self, layer):
            return None

        def process_weights_after_loading(self, layer):
            ex = getattr(layer, "_moejit_experts", None)
            if ex is not None and not ex.closed:
                ex.readopt()
                return
            layer._moejit_experts = moejit.Experts.from_layer(layer, top_k=int(self.moe.experts_per_token),
                                                              expert_begin=0, **self.moejit_options)

        def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
            if shared_experts is not None:
                raise NotImplementedError("moejit's vLLM method runs the routed experts; leave the shared "
                                          "experts to vLLM (not passed to the method)")
            m = getattr(layer, "expert_map", None)
            if m is not None:
                topk_ids = torch.where(topk_ids < 0, -1, m[topk_ids.clamp_min(0)])
            return layer._moejit_experts(x, topk_weights, topk_ids)

    _cls["c"] = MoejitNvFp4FusedMoE
    return MoejitNvFp4FusedMoE


def install():
    """Make vLLM build moejit's MoE method for ModelOpt NVFP4 layers (the one-line patch)."""
    from vllm.model_executor.layers.quantization import modelopt
    cls = method_class()
    if not hasattr(modelopt, "_moejit_original"):
        modelopt._moejit_original = modelopt.ModelOptNvFp4FusedMoE
    modelopt.ModelOptNvFp4Config.FusedMoEMethodCls = cls
    return cls


def register():
    """vLLM's general plugin entry point: installs with $MOEJIT_EXPERTS=1."""
    if wanted():
        install()
