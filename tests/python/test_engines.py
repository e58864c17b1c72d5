"""moejit.integrations.sglang and .vllm against the engines' real sources (sglang 0.5.23 and
vllm 0.34.0 from PyPI, engine_sources.py; neither can be imported here: no CUDA torch), read
with ast: the base classes and functions they subclass and call exist with the parameters
they are given; the methods overridden keep the base's signatures; every attribute the
inherited create_weights reads of self is one the integration sets or the class has; the
parameters create_weights registers are the ones Experts.from_layer reads; the plugin entry
point groups in python/pyproject.toml are the engines' own; and SGLang 0.5.23's select_experts
is called the way examples/sglang_select_experts.py takes it."""
import ast
import os
import re
import types

import pytest

from conftest import REPO
from engine_sources import sources

INTEG = os.path.join(REPO, "python", "moejit", "integrations")
PARAMS = {"w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
          "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"}


def parse(path):
    with open(path) as f:
        return ast.parse(f.read(), path)


def find_class(tree, name):
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef) and n.name == name:
            return n
    raise AssertionError("class %s not found" % name)


def methods(cls):
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def arg_names(fn):
    a = fn.args
    return ([x.arg for x in a.posonlyargs + a.args], [x.arg for x in a.kwonlyargs], a.vararg is not None,
            a.kwarg is not None)


def self_reads(fn):
    """Attributes read as self.X in fn (not assigned)."""
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" and \
                isinstance(n.ctx, ast.Load):
            out.add(n.attr)
    return out


def self_sets(fn):
    targets = [t for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets]
    targets += [n.target for n in ast.walk(fn) if isinstance(n, ast.AnnAssign)]
    return {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and
            t.value.id == "self"}


def registered_params(fn):
    return {n.args[0].value for n in ast.walk(fn) if isinstance(n, ast.Call) and
            getattr(n.func, "attr", None) == "register_parameter" and isinstance(n.args[0], ast.Constant)}


def class_names(cls):
    """Names a class body defines (methods, properties, class attributes)."""
    out = set(methods(cls))
    for n in cls.body:
        if isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return out


@pytest.fixture(scope="module")
def sg():
    return sources("sglang")


@pytest.fixture(scope="module")
def vl():
    return sources("vllm")


def ours(module, cls_name):
    return find_class(parse(os.path.join(INTEG, module)), cls_name)


# ---- SGLang ------------------------------------------------------------------------------------------

def test_sglang_method(sg):
    mq = parse(os.path.join(sg, "sglang/srt/layers/quantization/modelopt_quant.py"))
    base = find_class(mq, "ModelOptNvFp4FusedMoEMethod")
    assert [b.id for b in base.bases] == ["FusedMoEMethodBase"]
    bm, mine = methods(base), methods(ours("sglang.py", "MoejitNvFp4FusedMoEMethod"))
    for name in ("create_weights", "process_weights_after_loading", "create_moe_runner", "apply", "__init__"):
        assert arg_names(mine[name]) == arg_names(bm[name]), name
    assert arg_names(bm["apply"])[0] == ["self", "layer", "dispatch_output"]
    assert any(isinstance(d, ast.Name) and d.id == "property" for d in bm["load_up_proj_weight_first"].decorator_list)
    # everything the inherited create_weights reads of self: set by our __init__ or on the class
    have = self_sets(mine["__init__"]) | class_names(base) | {"load_up_proj_weight_first"}
    missing = self_reads(bm["create_weights"]) - have
    assert not missing, "SGLang's create_weights reads %s, which the integration does not set" % sorted(missing)
    assert PARAMS <= registered_params(bm["create_weights"])
    # the names create_weights gives the swizzled copies, which the integration drops
    text = open(os.path.join(sg, "sglang/srt/layers/quantization/modelopt_quant.py")).read()
    assert "layer.w13_blockscale_swizzled = Parameter(" in text and "layer.w2_blockscale_swizzled = Parameter(" in text


def test_sglang_dispatch_types_and_rsf(sg):
    std = parse(os.path.join(sg, "sglang/srt/layers/moe/token_dispatcher/standard.py"))
    fields = lambda c: [n.target.id for n in find_class(std, c).body if isinstance(n, ast.AnnAssign)]
    assert fields("StandardCombineInput") == ["hidden_states"]
    assert {"hidden_states", "topk_output"} <= set(fields("StandardDispatchOutput"))
    topk = parse(os.path.join(sg, "sglang/srt/layers/moe/topk.py"))
    assert [n.target.id for n in find_class(topk, "StandardTopKOutput").body
            if isinstance(n, ast.AnnAssign)][:2] == ["topk_weights", "topk_ids"]
    disp = find_class(std, "StandardDispatcher")
    assert "skip_local_expert_mapping" in self_sets(methods(disp)["__init__"])
    layer = open(os.path.join(sg, "sglang/srt/layers/moe/fused_moe_triton/layer.py")).read()
    # the routed scaling factor goes into topk_weights for a method with this attribute
    assert 'getattr(quant_method, "fuse_routed_scaling_factor_in_topk", False)' in layer
    for attr in ("top_k", "moe_ep_rank", "num_local_experts", "num_experts", "moe_ep_size"):
        assert re.search(r"self\.%s = " % attr, layer), attr


def real_function(path, cls_name, fn_name):
    """A method of the engine's source, compiled on its own (it must need no imports)."""
    tree = parse(path)
    fn = methods(find_class(tree, cls_name))[fn_name]
    fn.decorator_list = []
    ns = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), path, "exec"), ns)
    return ns[fn_name]


@pytest.mark.parametrize("ep,rank,storage_rank,shared", [(4, 0, 0, 1), (4, 1, 1, 1), (4, 3, 3, 1), (4, 0, 2, 1),
                                                         (2, 1, 1, 2), (4, 2, 2, 0), (1, 0, 0, 1)])
def test_sglang_input_scale_rows(sg, ep, rank, storage_rank, shared):
    """The input scales' row Experts.from_layer reads for each local expert is the global id
    SGLang's FusedMoE loads into that local expert (its own _map_global_expert_id_to_local_
    expert_id, run here): the input scales are loaded by global id (_sglang_require_global_
    experts), the shared experts' at _num_global_routed + i; and a layer with per-rank shared
    slots (num_experts = routed + shared x ranks) is the one refused."""
    from moejit.experts import _input_rows
    path = os.path.join(sg, "sglang/srt/layers/moe/fused_moe_triton/layer.py")
    to_local = real_function(path, "FusedMoE", "_map_global_expert_id_to_local_expert_id")
    routed_loc = 3
    routed = routed_loc * ep
    me = types.SimpleNamespace(_expert_storage_rank=storage_rank, _num_local_routed=routed_loc,
                               _num_global_routed=routed, _has_fused_shared=shared > 0)
    e_loc = routed_loc + shared
    owner = {}
    for g in range(routed + shared):
        x = to_local(me, g)
        if x >= 0:
            owner.setdefault(x, g)
    layer = types.SimpleNamespace(num_fused_shared_experts=shared, moe_ep_rank=rank, _expert_storage_rank=storage_rank,
                                  num_global_routed_experts=routed)
    rows = _input_rows(layer, e_loc, routed + shared)
    if ep == 1:
        assert rows is None and owner == {x: x for x in range(e_loc)}, "one rank: row x is local expert x"
    else:
        assert rows == [owner[x] for x in range(e_loc)]
    text = open(path).read()
    assert "physical_expert_ids = [self._num_global_routed + shared_expert_id]" in text
    assert "rank * self.num_local_experts\n                    + self._num_local_routed\n" \
           "                    + shared_expert_id" in text, "per-rank slots' input-scale rows"
    assert "num_shared_slots = num_fused_shared_experts * self.moe_ep_size" in text
    for attr in ("num_fused_shared_experts", "_expert_storage_rank"):
        assert re.search(r"self\.%s = " % attr, text), attr
    prop = methods(find_class(parse(path), "FusedMoE"))["num_global_routed_experts"]
    assert any(getattr(d, "id", None) == "property" for d in prop.decorator_list)
    mq = open(os.path.join(sg, "sglang/srt/layers/quantization/modelopt_quant.py")).read()
    for n in ("w13_input_scale", "w2_input_scale"):
        assert "%s._sglang_require_global_experts = True" % n in mq, n
    if shared and ep > 1:
        per_rank = types.SimpleNamespace(num_fused_shared_experts=shared, moe_ep_rank=rank,
                                         num_global_routed_experts=routed)
        with pytest.raises(ValueError, match="per-rank shared-expert slots"):
            _input_rows(per_rank, e_loc, routed + shared * ep)


def test_sglang_plugin(sg):
    plug = open(os.path.join(sg, "sglang/srt/plugins/__init__.py")).read()
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plug
    pyproject = open(os.path.join(REPO, "python", "pyproject.toml")).read()
    assert '[project.entry-points."sglang.srt.plugins"]\nmoejit = "moejit.integrations.sglang:register"' in pyproject
    hr = parse(os.path.join(sg, "sglang/srt/plugins/hook_registry.py"))
    reg = methods(find_class(hr, "HookRegistry"))["register"]
    assert arg_names(reg)[0][:4] == ["cls", "target", "hook", "hook_type"]
    assert "REPLACE" in class_names(find_class(hr, "HookType"))
    mine = open(os.path.join(INTEG, "sglang.py")).read()
    target = re.search(r'TARGET = "([\w.]+)"', mine).group(1)
    mod, cls = target.rsplit(".", 1)
    find_class(parse(os.path.join(sg, mod.replace(".", "/") + ".py")), cls)


def test_sglang_select_experts_signature(sg):
    topk = parse(os.path.join(sg, "sglang/srt/layers/moe/topk.py"))
    fn = next(n for n in topk.body if isinstance(n, ast.FunctionDef) and n.name == "select_experts")
    pos, kw, _, _ = arg_names(fn)
    assert pos == ["hidden_states", "router_logits", "topk_config"]
    assert kw == ["layer_id", "num_token_non_padded", "expert_location_dispatch_info", "dynamic_expert_bias",
                  "router_logits_partials"]
    ex = parse(os.path.join(REPO, "examples", "sglang_select_experts.py"))
    mine = next(n for n in ex.body if isinstance(n, ast.FunctionDef) and n.name == "select_experts")
    assert set(kw) <= set(arg_names(mine)[1])
    assert "num_shared_topk_slots" in class_names(find_class(topk, "TopKConfig"))


def test_sglang_example_new_call(rng):
    """The example called as SGLang 0.5.23 calls it: topk_config third, its shared slots."""
    import importlib.util
    import numpy as np
    spec = importlib.util.spec_from_file_location("sse", os.path.join(REPO, "examples", "sglang_select_experts.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    T, E, k = 5, 32, 4
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(E)).astype(np.float32)
    cfg = types.SimpleNamespace(top_k=k, use_grouped_topk=True, num_expert_group=4, topk_group=2, renormalize=True,
                                correction_bias=None, routed_scaling_factor=2.5, custom_routing_function=None,
                                apply_routed_scaling_factor_on_output=True, scoring_func="sigmoid",
                                num_shared_topk_slots=0)
    new = m.select_experts(np.zeros((T, 8), np.float32), logits, cfg, layer_id=3, num_token_non_padded=None,
                           expert_location_dispatch_info=None, dynamic_expert_bias=bias)
    old = m.select_experts(np.zeros((T, 8), np.float32), logits, k, use_grouped_topk=True, num_expert_group=4,
                           topk_group=2, renormalize=True, correction_bias=bias, routed_scaling_factor=2.5,
                           apply_routed_scaling_factor_on_output=True)
    np.testing.assert_array_equal(new.topk_ids, old.topk_ids)
    np.testing.assert_array_equal(new.topk_weights, old.topk_weights)
    cfg.num_shared_topk_slots = 1
    with pytest.raises(NotImplementedError, match="shared"):
        m.select_experts(np.zeros((T, 8), np.float32), logits, cfg)


# ---- vLLM --------------------------------------------------------------------------------------------

def test_vllm_method(vl):
    mo = parse(os.path.join(vl, "vllm/model_executor/layers/quantization/modelopt.py"))
    base = find_class(mo, "ModelOptNvFp4FusedMoE")
    assert [b.id for b in base.bases] == ["FusedMoEMethodBase"]
    fb = find_class(parse(os.path.join(vl, "vllm/model_executor/layers/fused_moe/fused_moe_method_base.py")),
                    "FusedMoEMethodBase")
    bm, fm, mine = methods(base), methods(fb), methods(ours("vllm.py", "MoejitNvFp4FusedMoE"))
    assert arg_names(mine["__init__"]) == arg_names(bm["__init__"]) == (["self", "quant_config", "moe_config"], [],
                                                                         False, False)
    assert arg_names(fm["__init__"]) == (["self", "moe"], [], False, False)
    for name in ("apply", "get_fused_moe_quant_config", "process_weights_after_loading"):
        assert arg_names(mine[name]) == arg_names(fm.get(name) or bm[name]), name
    assert "is_monolithic" in fm
    have = self_sets(mine["__init__"]) | self_sets(fm["__init__"]) | class_names(base) | class_names(fb)
    missing = self_reads(bm["create_weights"]) - have
    assert not missing, "vLLM's create_weights reads %s, which the integration does not set" % sorted(missing)
    assert PARAMS <= registered_params(bm["create_weights"])
    text = open(os.path.join(vl, "vllm/model_executor/layers/quantization/modelopt.py")).read()
    assert "ModelOptNvFp4Config.FusedMoEMethodCls = ModelOptNvFp4FusedMoE" in text
    assert re.search(r"self\.FusedMoEMethodCls\(\s*quant_config=self, moe_config=layer\.moe_config\s*\)", text)


def test_vllm_input_scales_per_local_expert(vl):
    """vLLM loads the input scales by local id (the layer's expert_map, as the weights) unless
    the method sets use_global_sf, which the integration turns off: row x is local expert x
    whatever the placement (linear, round_robin, EPLB's redundant experts), and from_layer
    reads them from row 0."""
    re_ = open(os.path.join(vl, "vllm/model_executor/layers/fused_moe/routed_experts.py")).read()
    assert "expert_id = self._map_global_expert_id_to_local_expert_id(global_expert_id)" in re_
    assert "scale_expert_id = global_expert_id if use_global_sf else expert_id" in re_
    assert "expert_id=global_expert_id if use_global_sf else expert_id" in re_
    mo = open(os.path.join(vl, "vllm/model_executor/layers/quantization/modelopt.py")).read()
    assert re.search(r"global_sf_num_experts = \(\s*global_num_experts if self\.use_global_sf else "
                     r"num_experts\s*\)", mo)
    init = methods(ours("vllm.py", "MoejitNvFp4FusedMoE"))["__init__"]
    sets = {t.attr: n.value for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute)}
    assert isinstance(sets["use_global_sf"], ast.Constant) and sets["use_global_sf"].value is False
    from moejit.experts import _input_rows
    assert _input_rows(types.SimpleNamespace(ep_rank=3), 8, 8) is None


def test_vllm_layer_and_plugin(vl):
    re_ = parse(os.path.join(vl, "vllm/model_executor/layers/fused_moe/routed_experts.py"))
    cls = find_class(re_, "RoutedExperts")
    assert "expert_map" in methods(cls)
    assert "experts_per_token" in open(os.path.join(vl, "vllm/model_executor/layers/fused_moe/routed_experts.py")).read()
    plug = open(os.path.join(vl, "vllm/plugins/__init__.py")).read()
    assert 'DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"' in plug
    pyproject = open(os.path.join(REPO, "python", "pyproject.toml")).read()
    assert '[project.entry-points."vllm.general_plugins"]\nmoejit = "moejit.integrations.vllm:register"' in pyproject


def test_plugins_wait_to_be_asked(monkeypatch):
    """register() installs nothing without MOEJIT_EXPERTS=1 (so importing it needs no engine)."""
    from moejit.integrations import sglang, vllm, wanted
    monkeypatch.delenv("MOEJIT_EXPERTS", raising=False)
    assert not wanted()
    assert sglang.register() is None and vllm.register() is None
    monkeypatch.setenv("MOEJIT_EXPERTS", "1")
    with pytest.raises(ImportError):     # asked for, it reaches for the engine
        vllm.register()
