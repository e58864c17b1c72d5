"""Configs, random layers and their shards, the CPU reference through the binding, bf16
conversion, contexts."""
import numpy as np
import pytest

import moejit
from conftest import GLM5_CONFIG


def test_bf16_round_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, np.inf, -np.inf, np.finfo(np.float32).max, np.nan], np.float32)
    b = moejit.bf16_from_f32(x)
    assert b.dtype == np.uint16
    # 1+2^-8 is a tie: to the even 1.0; 1+3*2^-8 rounds up; the largest float rounds to inf.
    assert b[:7].tolist() == [0x3F80, 0x3F80, 0x3F82, 0x8000, 0x7F80, 0xFF80, 0x7F80]
    assert np.isnan(moejit.bf16_to_f32(b)[7])
    back = moejit.bf16_to_f32(b[:3])
    assert back.dtype == np.float32 and back.tolist() == [1.0, 1.0, 1 + 2 ** -6]


def test_config_read_and_glm5():
    c = moejit.MoeConfig.read(GLM5_CONFIG)
    g = moejit.MoeConfig.glm5()
    assert (c.hidden, c.intermediate, c.n_experts, c.topk) == (6144, 2048, 256, 8)
    assert (g.hidden, g.n_experts, g.topk, g.scoring) == (6144, 256, 8, "sigmoid")
    assert c.routed_scaling_factor == pytest.approx(2.5) and c.has_correction_bias
    g.validate()
    bad = moejit.MoeConfig(hidden=100, intermediate=128, n_experts=8, topk=2)
    with pytest.raises(moejit.MoejitError) as e:
        bad.validate()
    assert "100" in e.value.message
    with pytest.raises(moejit.FileError) as e:
        moejit.MoeConfig.read("/nonexistent/config.json")
    assert "/nonexistent/config.json" in e.value.message


def test_random_layer_shards_sum_to_the_whole(rng):
    """mj_layer_shard through the binding: the TP and EP ranks' reference partial outputs sum
    to the whole layer's (each rank's partial in f32, so within rounding)."""
    cfg = moejit.MoeConfig(hidden=128, intermediate=128, n_experts=8, topk=2, routed_scaling_factor=2.5)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    with moejit.Layer.random(cfg, seed=11) as whole:
        want = whole.forward_ref(x)
        logits = whole.router_ref(x)
        assert logits.shape == (3, 8) and logits.dtype == np.float32
        for split in ("tp", "ep"):
            parts = []
            for r in range(2):
                with whole.shard(rank=r, **{split: 2}) as s:
                    assert s.n_ranks == 2 and s.rank == r
                    parts.append(s.forward_ref(x))
            np.testing.assert_allclose(parts[0] + parts[1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_contexts_are_shared_and_count(sim):
    assert moejit.get_context("sim") is sim
    assert sim.backend == "sim" and sim.device is None and sim.target.startswith("sm_")
    moejit.route(np.zeros((2, 8), np.float32), topk=2, backend="sim")
    st = sim.stats()
    assert st["mem_hits"] + st["mem_misses"] >= 1
    assert set(st) >= {"compiles", "disk_hits", "compile_ms", "store_failures"}
    with pytest.raises(ValueError, match="no device"):
        moejit.Context("sim", 0)
