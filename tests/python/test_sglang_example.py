"""examples/sglang_select_experts.py: importable, its self-check passes (on the interpreter,
against moejit's reference and a numpy transcription of SGLang's top-k rules), and its
argument mapping."""
import importlib.util
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import REPO

PATH = os.path.join(REPO, "examples", "sglang_select_experts.py")


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("sglang_select_experts", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_self_check(ex):
    assert ex.self_check(seed=3, verbose=False) == 0


def test_runs_as_a_script():
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    r = subprocess.run([sys.executable, PATH], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and r.stdout.count("ok  ") == 16


def test_outputs_and_mapping(ex, rng):
    T, E, k = 6, 32, 4
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(E)).astype(np.float32)
    hidden = np.zeros((T, 16), np.float32)
    kw = dict(use_grouped_topk=True, num_expert_group=4, topk_group=2, renormalize=True, correction_bias=bias,
              routed_scaling_factor=2.5)
    out = ex.select_experts(hidden, logits, k, **kw)
    w, ids, lg = out                                  # SGLang's unpacking
    assert w.dtype == np.float32 and ids.dtype == np.int32 and w.shape == ids.shape == (T, k) and lg is logits
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)   # rsf left to the model, as SGLang
    scaled = ex.select_experts(hidden, logits, k, apply_routed_scaling_factor_on_output=True, **kw)
    np.testing.assert_allclose(scaled.topk_weights.sum(-1), 2.5, rtol=1e-6)
    np.testing.assert_array_equal(scaled.topk_ids, ids)
    # A TopKConfig-like object (newer SGLang) gives the same.
    cfg = types.SimpleNamespace(top_k=k, scoring_func=None, num_fused_shared_experts=0,
                                custom_routing_function=None, apply_routed_scaling_factor_on_output=False, **kw)
    via_cfg = ex.select_experts(hidden, logits, topk_config=cfg)
    np.testing.assert_array_equal(via_cfg.topk_ids, ids)
    np.testing.assert_array_equal(via_cfg.topk_weights, w)
    # OEA with padding given as a one-element int64 array (converted to int32).
    oea = ex.select_experts(hidden, logits, k, k0=2, num_token_non_padded=np.array(4), **kw)
    assert oea.k0 == 2
    assert (oea.topk_ids[4:] == -1).all() and (oea.n_sel[4:] == 0).all() and (oea.n_sel[:4] >= 2).all()
    assert oea.routing.unique_experts <= len(np.unique(ids[:4]))


def test_refusals(ex):
    lg = np.zeros((2, 8), np.float32)
    with pytest.raises(NotImplementedError, match="shared"):
        ex.select_experts(lg, lg, 2, num_fused_shared_experts=1)
    with pytest.raises(NotImplementedError, match="custom_routing_function"):
        ex.select_experts(lg, lg, 2, custom_routing_function=lambda **kw: None)
    with pytest.raises(NotImplementedError, match="physical"):
        ex.select_experts(lg, lg, 2, expert_location_dispatch_info=object())
    with pytest.raises(ValueError, match="tokens"):
        ex.select_experts(np.zeros((3, 8), np.float32), lg, 2)
    with pytest.raises(ValueError, match="topk_group"):
        ex.select_experts(lg, lg, 2, use_grouped_topk=True)
