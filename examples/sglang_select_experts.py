"""sglang_select_experts.py — SGLang's select_experts, done by moejit's mj_route (with OEA).

An SGLang deployment picks each token's experts in python/sglang/srt/layers/moe/topk.py:
select_experts(hidden_states, router_logits, top_k, *, use_grouped_topk, renormalize,
topk_group, num_expert_group, correction_bias, routed_scaling_factor, num_token_non_padded,
...) -> StandardTopKOutput(topk_weights f32 [T, k], topk_ids i32 [T, k], router_logits); since
0.5.23 select_experts(hidden_states, router_logits, topk_config, *, layer_id,
num_token_non_padded, expert_location_dispatch_info, dynamic_expert_bias,
router_logits_partials), the options in a TopKConfig (its num_shared_topk_slots in place of
num_fused_shared_experts; dynamic_expert_bias, when given, in place of its correction_bias).
The select_experts below takes either call and returns the same triple, computed by one mj_route
kernel on the tensors' GPU and torch's current stream (capturable in a CUDA graph:
num_token_non_padded is read when the kernel runs). One more argument, k0, turns on OEA
(Opportunistic Expert Activation): each token keeps its first k0 experts and takes the rest
of its top-k only from experts another token of the batch already needs, so a decode batch
reads fewer experts' weights. k0=None is SGLang's plain top-k, id for id.

Swapping it in (the model's FusedMoE / TopK layers call select_experts by name):

    import functools, sglang.srt.layers.moe.topk as topk
    import sglang_select_experts as mj
    topk.select_experts = functools.partial(mj.select_experts, k0="1-3:8,4-15:6,16-:4")

What maps to what (mj_route_params):
  use_grouped_topk + correction_bias   noaux_tc (DeepSeek-V3, GLM-5, Kimi K2): sigmoid scores,
                                       bias for selection only, a group scored by its top-2 sum
  use_grouped_topk, no bias            group_limited_greedy (DeepSeek-V2): softmax, group max
  otherwise                            plain top-k (Qwen-MoE): softmax, or scoring_func
  renormalize                          norm_topk_prob
  routed_scaling_factor                multiplies the weights only with
                                       apply_routed_scaling_factor_on_output=True, as SGLang
                                       (otherwise the model scales the MoE output itself)
  num_token_non_padded                 num_valid: rows at and past it get topk_ids -1 (SGLang's
                                       masking of padded rows), weights 0, and never join OEA
With OEA a token may get fewer than top_k experts: its slots past n_sel hold id -1 and weight
0, which SGLang's fused MoE kernels already skip (the ids of masked padding rows). Not
supported (refused with NotImplementedError): num_fused_shared_experts > 0,
custom_routing_function, expert_location_dispatch_info (EPLB's logical-to-physical map: apply
it to topk_ids after this call).

Inputs may be torch tensors (CUDA: the GPU; CPU: moejit's interpreter) or numpy arrays (the
interpreter); outputs are of the same kind. router_logits of another float dtype (bf16) is
converted to float32 first (a copy). Run this file to check it on the interpreter against
moejit's CPU reference and against a plain numpy transcription of SGLang's top-k rules:

    PYTHONPATH=python python3 examples/sglang_select_experts.py
"""
import os
import sys
from typing import NamedTuple

import numpy as np

try:
    import moejit
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import moejit


class StandardTopKOutput(NamedTuple):
    """SGLang's StandardTopKOutput: unpacks as (topk_weights, topk_ids, router_logits)."""

    topk_weights: object   # [T, k] float32
    topk_ids: object       # [T, k] int32, -1 past each token's experts and on padding rows
    router_logits: object  # [T, E] as given


class MoejitTopKOutput(StandardTopKOutput):
    """The same triple, plus what OEA adds: k0 (the k0 this batch size ran with), n_sel [T]
    (experts each token got, k0..k, 0 on padding rows) and `routing`, the whole
    moejit.RouteResult (the dispatch metadata: expert_counts, expert_offsets,
    active_experts, n_active, permutation, row_index)."""

    k0 = None
    routing = None

    @property
    def n_sel(self):
        return self.routing.n_sel


_CONFIG_FIELDS = ("top_k", "use_grouped_topk", "topk_group", "num_expert_group", "renormalize",
                  "num_fused_shared_experts", "custom_routing_function", "correction_bias",
                  "routed_scaling_factor", "apply_routed_scaling_factor_on_output", "scoring_func")


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def select_experts(hidden_states, router_logits, top_k=None, *, topk_config=None, layer_id=None,
                   use_grouped_topk=False, renormalize=False, topk_group=None, num_expert_group=None,
                   num_fused_shared_experts=0, custom_routing_function=None, correction_bias=None,
                   torch_native=False, routed_scaling_factor=None, num_token_non_padded=None,
                   expert_location_dispatch_info=None, apply_routed_scaling_factor_on_output=False,
                   scoring_func=None, dynamic_expert_bias=None, router_logits_partials=None, k0=None,
                   backend="auto"):
    """SGLang's select_experts by mj_route. Returns MoejitTopKOutput(topk_weights f32 [T, k],
    topk_ids i32 [T, k], router_logits).

    hidden_states: [T, H] (only its T is used, checked against router_logits); router_logits:
    [T, E]; top_k; or topk_config: an object with SGLang's TopKConfig attributes (top_k,
    use_grouped_topk, ...), which then replace the keyword arguments. k0: OEA's k0 (an int
    1..top_k, or a policy by batch size such as "1-3:8,4-15:6,16-:4"); None: plain top-k.
    backend: "auto" (CUDA tensors on their GPU, host arrays on the interpreter) or "ref" (the
    CPU reference, host arrays). layer_id and torch_native are accepted and unused.
    """
    if top_k is not None and not isinstance(top_k, (int, np.integer)) and hasattr(top_k, "top_k"):
        # SGLang >= 0.5.23: select_experts(hidden_states, router_logits, topk_config, *, ...)
        if topk_config is not None:
            raise TypeError("select_experts: a TopKConfig both third and as topk_config=")
        topk_config, top_k = top_k, None
    if topk_config is not None:
        got = {f: getattr(topk_config, f) for f in _CONFIG_FIELDS if hasattr(topk_config, f)}
        # 0.5.23 names the fused shared experts' columns num_shared_topk_slots
        if hasattr(topk_config, "num_shared_topk_slots"):
            got["num_fused_shared_experts"] = topk_config.num_shared_topk_slots
        top_k = got.get("top_k", top_k)
        use_grouped_topk = got.get("use_grouped_topk", use_grouped_topk)
        topk_group = got.get("topk_group", topk_group)
        num_expert_group = got.get("num_expert_group", num_expert_group)
        renormalize = got.get("renormalize", renormalize)
        num_fused_shared_experts = got.get("num_fused_shared_experts", num_fused_shared_experts)
        custom_routing_function = got.get("custom_routing_function", custom_routing_function)
        correction_bias = got.get("correction_bias", correction_bias)
        routed_scaling_factor = got.get("routed_scaling_factor", routed_scaling_factor)
        apply_routed_scaling_factor_on_output = got.get("apply_routed_scaling_factor_on_output",
                                                        apply_routed_scaling_factor_on_output)
        scoring_func = got.get("scoring_func", scoring_func)
    if top_k is None:
        raise TypeError("select_experts needs top_k (or a topk_config with top_k)")
    if num_fused_shared_experts:
        raise NotImplementedError("num_fused_shared_experts > 0: moejit routes the routed experts only; run the "
                                  "shared expert beside them (or mj_moe_forward, which includes it)")
    if custom_routing_function is not None:
        raise NotImplementedError("custom_routing_function: moejit runs noaux_tc, group_limited_greedy or plain "
                                  "top-k routing only")
    if dynamic_expert_bias is not None:   # SGLang: it replaces the config's correction bias
        correction_bias = dynamic_expert_bias
    if router_logits_partials is not None:
        raise NotImplementedError("router_logits_partials: pass the reduced router_logits")
    if expert_location_dispatch_info is not None:
        raise NotImplementedError("expert_location_dispatch_info: map topk_ids to physical experts after this "
                                  "call (SGLang's topk_ids_logical_to_physical)")
    if hidden_states is not None and int(hidden_states.shape[0]) != int(router_logits.shape[0]):
        raise ValueError("hidden_states has %d tokens but router_logits %d" %
                         (int(hidden_states.shape[0]), int(router_logits.shape[0])))

    if use_grouped_topk:
        if topk_group is None or num_expert_group is None:
            raise ValueError("use_grouped_topk needs topk_group and num_expert_group")
        n_group, t_group = int(num_expert_group), int(topk_group)
        if correction_bias is not None:
            scoring, group_score = scoring_func or "sigmoid", "top2_sum"   # noaux_tc (biased_grouped_topk)
        else:
            scoring, group_score = scoring_func or "softmax", "max"        # grouped_topk
    else:
        n_group, t_group, group_score = 1, 1, "top2_sum"
        scoring = scoring_func or "softmax"                                # fused_topk
    rsf = float(routed_scaling_factor) if (apply_routed_scaling_factor_on_output and routed_scaling_factor) else 1.0

    logits = router_logits
    if _is_torch(logits):
        import torch
        if logits.dtype != torch.float32:
            logits = logits.float()
        logits = logits.contiguous()
        bias = correction_bias.float().contiguous() if correction_bias is not None else None
        nv = num_token_non_padded
        if nv is not None and not isinstance(nv, int):
            nv = nv.reshape(1)
            if nv.dtype != torch.int32:
                nv = nv.to(torch.int32)
    else:
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        bias = None if correction_bias is None else np.ascontiguousarray(correction_bias, dtype=np.float32)
        nv = num_token_non_padded
        if nv is not None and not isinstance(nv, (int, np.integer)):
            nv = np.ascontiguousarray(np.asarray(nv).reshape(1), dtype=np.int32)
    r = moejit.route(logits, bias, topk=int(top_k), k0=k0, routed_scaling_factor=rsf, scoring=scoring,
                     n_group=n_group, topk_group=t_group, group_score=group_score, renormalize=bool(renormalize),
                     num_valid=nv, backend=backend)
    out = MoejitTopKOutput(r.weights, r.ids, router_logits)
    out.k0, out.routing = r.k0, r
    return out


# ---- the self-check ---------------------------------------------------------------------------

def _numpy_sglang_topk(logits, top_k, *, use_grouped_topk=False, renormalize=False, topk_group=None,
                       num_expert_group=None, correction_bias=None, routed_scaling_factor=None,
                       apply_routed_scaling_factor_on_output=False, num_token_non_padded=None):
    """SGLang's plain top-k rules written out in numpy (fp64), for the check: fused_topk
    (softmax), grouped_topk (softmax, group max) and biased_grouped_topk (sigmoid + bias,
    group top-2 sum). Ties rank the lower expert id first, as moejit does."""
    x = logits.astype(np.float64)
    T, E = x.shape
    if use_grouped_topk and correction_bias is not None:
        scores = 1.0 / (1.0 + np.exp(-x))
        choice = scores + correction_bias.astype(np.float64)
        grouped = choice.reshape(T, num_expert_group, -1)
        gscore = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
    else:
        e = np.exp(x - x.max(-1, keepdims=True))
        scores = choice = e / e.sum(-1, keepdims=True)
        gscore = choice.reshape(T, num_expert_group or 1, -1).max(-1) if use_grouped_topk else None
    if use_grouped_topk:
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :topk_group]
        mask = np.zeros_like(gscore, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, E // num_expert_group, axis=-1), choice, -np.inf)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    if apply_routed_scaling_factor_on_output and routed_scaling_factor:
        w = w * routed_scaling_factor
    if num_token_non_padded is not None:
        ids[int(num_token_non_padded):] = -1
    return w.astype(np.float32), ids.astype(np.int32)


# (name, T, E, top_k, arguments): GLM-5/DeepSeek-V3 style, DeepSeek-V2 style, Qwen style.
CHECKS = [
    ("noaux_tc", 12, 64, 8, dict(use_grouped_topk=True, num_expert_group=8, topk_group=4, renormalize=True,
                                 routed_scaling_factor=2.5)),
    ("noaux_tc rsf on output, padded", 9, 64, 8, dict(use_grouped_topk=True, num_expert_group=8, topk_group=4,
                                                      renormalize=True, routed_scaling_factor=2.5,
                                                      apply_routed_scaling_factor_on_output=True,
                                                      num_token_non_padded=6)),
    ("group_limited_greedy", 7, 32, 6, dict(use_grouped_topk=True, num_expert_group=4, topk_group=2,
                                            renormalize=False)),
    ("fused_topk", 5, 16, 4, dict(renormalize=True)),
]


def self_check(seed=1, verbose=True):
    """Run CHECKS on the interpreter: plain top-k against the numpy transcription of SGLang's
    rules and moejit's CPU reference; OEA (k0 = k/2) against the reference. Returns the number
    of failures (0: all good)."""
    rng = np.random.default_rng(seed)
    failures = 0

    def report(ok, what):
        nonlocal failures
        failures += not ok
        if verbose:
            print("%s  %s" % ("ok  " if ok else "FAIL", what))

    if verbose:
        print("select_experts by mj_route on the interpreter (seed %d)" % seed)
    for name, T, E, k, kw in CHECKS:
        logits = rng.standard_normal((T, E)).astype(np.float32)
        hidden = np.zeros((T, 8), dtype=np.float32)
        if kw.get("use_grouped_topk") and "routed_scaling_factor" in kw:
            kw = dict(kw, correction_bias=(0.05 * rng.standard_normal(E)).astype(np.float32))
        w_np, ids_np = _numpy_sglang_topk(logits, k, **kw)
        for k0 in (None, k // 2):
            out = select_experts(hidden, logits, k, k0=k0, **kw)
            ref = select_experts(hidden, logits, k, k0=k0, backend="ref", **kw)
            w, ids, lg = out
            same_ref = (np.array_equal(ids, ref.topk_ids) and np.allclose(w, ref.topk_weights, rtol=1e-6, atol=0)
                        and np.array_equal(out.n_sel, ref.n_sel))
            label = "%-32s k0=%-4s" % (name, k0)
            report(same_ref and lg is logits, "%s sim == reference" % label)
            if k0 is None:
                # Padding rows: both give ids -1; SGLang leaves their weights, moejit writes 0.
                nv = kw.get("num_token_non_padded", T)
                same_np = (np.array_equal(ids, ids_np) and np.allclose(w[:nv], w_np[:nv], rtol=1e-5, atol=1e-7)
                           and not w[nv:].any())
                report(same_np, "%s == SGLang's rules (numpy)" % label)
            else:
                nv = kw.get("num_token_non_padded", T)
                plain = len(np.unique(ids_np[:nv][ids_np[:nv] >= 0]))
                oea = out.routing.unique_experts
                report(oea <= plain and out.k0 == k0,
                       "%s unique experts %d (plain top-k %d)" % (label, oea, plain))
    return failures


if __name__ == "__main__":
    sys.exit(1 if self_check() else 0)
