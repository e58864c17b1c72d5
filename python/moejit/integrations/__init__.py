"""moejit's experts inside serving engines (docs/engines.md).

  moejit.integrations.sglang   SGLang 0.5.23: MoE method for ModelOpt NVFP4 checkpoints
  moejit.integrations.vllm     vLLM 0.34: the same for vLLM's ModelOpt NVFP4 MoE

Each keeps the engine's expert parameters (names, shapes, weight loaders), adopts them in
place after loading (moejit.Experts.from_layer) and runs the engine's own top-k. Each has
install() (the one-line patch: call it before the engine builds its model) and register(),
the engine's plugin entry point (python/pyproject.toml names both), which installs only when
$MOEJIT_EXPERTS is 1: having moejit installed changes nothing until it is asked for.
"""
import os

ENV = "MOEJIT_EXPERTS"


def wanted():
    """Whether the engines' plugin entry points should install moejit ($MOEJIT_EXPERTS=1)."""
    return os.environ.get(ENV, "") == "1"


def options():
    """Experts.adopt options from the environment: MOEJIT_MODE (auto, w4a16, w4a4),
    MOEJIT_MAX_BATCH (the most tokens of one call; 256)."""
    return dict(mode=os.environ.get("MOEJIT_MODE", "auto"), max_batch=int(os.environ.get("MOEJIT_MAX_BATCH", "256")))
