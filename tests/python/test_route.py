"""route(): the interpreter's mj_route against the CPU reference (mj_route_ref +
mj_route_dispatch_ref), through the binding."""
import numpy as np
import pytest

import moejit

DISPATCH = ("expert_counts", "expert_offsets", "active_experts", "n_active", "permutation", "row_index")

# (name, E, T, kwargs): plain top-k, OEA, groups with both group scores, softmax, padding.
CASES = [
    ("topk", 32, 8, dict(topk=4)),
    ("oea", 32, 8, dict(topk=4, k0=2, routed_scaling_factor=2.5)),
    ("groups_top2", 32, 6, dict(topk=4, k0=3, n_group=4, topk_group=2)),
    ("groups_max_softmax", 32, 5, dict(topk=4, scoring="softmax", n_group=4, topk_group=2, group_score="max")),
    ("no_renorm_padding", 16, 7, dict(topk=2, k0=1, renormalize=False, num_valid=5)),
    ("policy", 16, 3, dict(topk=4, k0="1-3:2,4-:1")),
]


@pytest.mark.parametrize("name,E,T,kw", CASES, ids=[c[0] for c in CASES])
def test_route_sim_equals_ref(name, E, T, kw, rng, sim):
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(E)).astype(np.float32) if kw.get("scoring") != "softmax" else None
    ref = moejit.route(logits, bias, backend="ref", **kw)
    got = moejit.route(logits, bias, backend="sim", **kw)
    assert isinstance(got.ids, np.ndarray) and got.ids.dtype == np.int32 and got.ids.shape == (T, kw["topk"])
    assert got.weights.dtype == np.float32
    np.testing.assert_array_equal(got.ids, ref.ids)
    np.testing.assert_array_equal(got.n_sel, ref.n_sel)
    np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-6, atol=0)
    for f in DISPATCH:
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)
    assert got.k0 == ref.k0
    nv = kw.get("num_valid", T)
    assert (ref.n_sel[nv:] == 0).all() and (ref.ids[nv:] == -1).all()
    assert (ref.n_sel[:nv] >= ref.k0).all() and (ref.n_sel[:nv] <= kw["topk"]).all()
    assert ref.unique_experts == got.unique_experts == len(np.unique(ref.ids[ref.ids >= 0]))
    assert ref.stats["unique_after"] == ref.unique_experts


def test_route_policy_k0_by_batch(rng):
    logits = rng.standard_normal((5, 16)).astype(np.float32)
    assert moejit.route(logits, topk=4, k0="1-3:2,4-:1", backend="ref").k0 == 1
    assert moejit.route(logits[:3], topk=4, k0="1-3:2,4-:1", backend="ref").k0 == 2
    p = moejit.K0Policy("1-3:8,4-15:6,16-:4", 8)
    assert [p.k0(b) for b in (1, 3, 4, 15, 16, 256)] == [8, 8, 6, 6, 4, 4]


def test_route_oea_uses_fewer_experts(rng):
    """OEA's point: fewer distinct experts than plain top-k over a batch, each token keeping
    at least its first k0."""
    logits = rng.standard_normal((16, 64)).astype(np.float32)
    plain = moejit.route(logits, topk=8, backend="sim")
    oea = moejit.route(logits, topk=8, k0=4, backend="sim")
    assert oea.unique_experts < plain.unique_experts
    np.testing.assert_array_equal(oea.ids[:, :4], plain.ids[:, :4])


def test_route_num_valid_array_read_at_run_time(rng, sim):
    """num_valid as a one-element int32 array: the kernel reads it where it runs."""
    logits = rng.standard_normal((6, 16)).astype(np.float32)
    nv = np.array([4], dtype=np.int32)
    got = moejit.route(logits, topk=4, k0=2, num_valid=nv, backend="sim")
    ref = moejit.route(logits, topk=4, k0=2, num_valid=4, backend="ref")
    np.testing.assert_array_equal(got.ids, ref.ids)
    np.testing.assert_array_equal(got.row_index, ref.row_index)


def test_route_without_dispatch(rng):
    logits = rng.standard_normal((3, 16)).astype(np.float32)
    r = moejit.route(logits, topk=2, backend="sim", dispatch=False)
    assert r.expert_counts is None and r.permutation is None
    with pytest.raises(ValueError, match="dispatch"):
        r.unique_experts


def test_route_bad_group_setting_is_a_c_error(rng):
    """What only C judges (topk_group > n_group) comes back as InvalidArgumentError with C's text."""
    logits = rng.standard_normal((2, 16)).astype(np.float32)
    with pytest.raises(moejit.MoejitError) as e:
        moejit.route(logits, topk=2, n_group=4, topk_group=5, backend="ref")
    assert e.value.status_name == "MJ_ERR_INVALID_ARG" and e.value.function == "mj_route_ref"
    assert "topk_group" in e.value.message
    assert isinstance(e.value, moejit.InvalidArgumentError)
