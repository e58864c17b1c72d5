"""moejit.Experts: expert tensors laid out as SGLang and vLLM hold them (tests/python/
engine_tensors.py makes them), adopted and run on the interpreter against a numpy reference
of the NVFP4 experts: both gate/up orders, linear and swizzled block scales, EP with the
input scales of every expert and this rank's rows at expert_begin, reciprocal scales, the
routed scaling factor in the weights, -1 ids. In place the engine's arrays are repacked (no
second copy: the handle's bytes are its workspace), release() gives them back byte for byte,
copy mode never writes them, and a refused adoption leaves them as they were."""
import types

import numpy as np
import pytest

import moejit
from moejit import experts as experts_mod
from conftest import FakeTensor
from engine_tensors import make_engine, reference, routing

E, H, I, K = 8, 256, 256, 4


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def hidden(rng, T):
    return moejit.bf16_to_f32(moejit.bf16_from_f32(rng.standard_normal((T, H)).astype(np.float32)))


@pytest.mark.parametrize("up_first", [False, True], ids=["gate_up", "up_gate"])
@pytest.mark.parametrize("swizzled", [False, True], ids=["linear", "swizzled"])
def test_layouts(rng, up_first, swizzled):
    t, nat = make_engine(rng, E, H, I, up_first=up_first, swizzled=swizzled)
    before = {k: v.copy() for k, v in t.items()}
    ex = moejit.Experts.adopt(**t, top_k=K, up_first=up_first, scales_swizzled=swizzled, max_batch=8, mode="w4a16")
    try:
        assert not np.array_equal(t["w13_weight"], before["w13_weight"]), "in place: repacked where it was"
        x = hidden(rng, 6)
        ids, w = routing(rng, 6, K, E, n_valid=5)
        got = ex(x, w, ids)
        assert got.dtype == np.float32 and got.shape == (6, H)
        want = reference(nat, x, ids, w)
        assert rel_l2(got, want) < 5e-3, rel_l2(got, want)
        assert not got[5].any(), "a padding row (ids -1) comes out 0"
        ex.release()
        for k in t:
            np.testing.assert_array_equal(t[k], before[k], err_msg=k)
        with pytest.raises(moejit.InvalidArgumentError, match="given back"):
            ex(x, w, ids)
        ex.readopt()
        np.testing.assert_array_equal(ex(x, w, ids), got)
    finally:
        ex.close()


def test_ep_offset_and_reciprocals(rng):
    t, nat = make_engine(rng, E, H, I, E_global=2 * E, expert_begin=E, reciprocal=True)
    ex = moejit.Experts.adopt(**t, top_k=K, expert_begin=E, reciprocal_weight_scale_2=True,
                              reciprocal_input_scale=True, max_batch=8, mode="w4a4")
    x = hidden(rng, 5)
    ids, w = routing(rng, 5, K, E)
    got = ex(x, w, ids)
    # W4A4 quantizes x (and the activations) to NVFP4 with the input scales: near the W4A16
    # reference with the right rows, nothing like it with rows that are 1e5 times too large
    assert rel_l2(got, reference(nat, x, ids, w)) < 0.3
    ex.close()
    t2, _ = make_engine(np.random.default_rng(5), E, H, I, E_global=2 * E, expert_begin=E, reciprocal=True)
    wrong = moejit.Experts.adopt(**t2, top_k=K, expert_begin=0, reciprocal_weight_scale_2=True,
                                 reciprocal_input_scale=True, max_batch=8, mode="w4a4")
    _, nat2 = make_engine(np.random.default_rng(5), E, H, I, E_global=2 * E, expert_begin=E, reciprocal=True)
    assert rel_l2(wrong(x, w, ids), reference(nat2, x, ids, w)) > 0.9, "rank 0's rows of input scales differ"
    wrong.close()


def test_in_place_no_second_copy_and_copy_mode(rng):
    t, nat = make_engine(rng, E, H, I)
    codes = t["w13_weight"].nbytes + t["w2_weight"].nbytes
    ex = moejit.Experts.adopt(**t, top_k=K, max_batch=8)
    info = ex.info
    assert info["in_place"] == 1 and info["scales_in_place"] == 1
    assert info["bytes_allocated"] < codes // 4, info     # the workspace, not the weights
    assert info["bytes_weights"] >= codes
    ex.close()
    t, nat = make_engine(rng, E, H, I)
    before = {k: v.copy() for k, v in t.items()}
    cp = moejit.Experts.adopt(**t, top_k=K, in_place=False, max_batch=8)
    assert cp.info["in_place"] == 0 and cp.info["bytes_allocated"] >= cp.info["bytes_weights"]
    x = hidden(rng, 4)
    ids, w = routing(rng, 4, K, E)
    assert rel_l2(cp(x, w, ids), reference(nat, x, ids, w)) < 5e-3
    for k in t:
        np.testing.assert_array_equal(t[k], before[k], err_msg=k)
    cp.close()


def test_refused_adoption_leaves_tensors(rng):
    t, _ = make_engine(rng, E, H, I, swizzled=True)
    t["w2_weight_scale"][E - 1, 3, 1] = 0x7F     # a NaN block scale in the last expert
    before = {k: v.copy() for k, v in t.items()}
    with pytest.raises(moejit.NonFiniteError, match="w2_weight_scale of local expert 7"):
        moejit.Experts.adopt(**t, top_k=K, scales_swizzled=True)
    for k in t:
        np.testing.assert_array_equal(t[k], before[k], err_msg=k)
    bad = dict(t, w2_weight=t["w2_weight"][:, :, :-1].copy())
    with pytest.raises(ValueError, match="w2_weight has shape"):
        moejit.Experts.adopt(**bad, top_k=K)
    with pytest.raises(ValueError, match="w13_input_scale has shape"):
        moejit.Experts.adopt(**dict(t, w13_input_scale=t["w13_input_scale"][:4]), top_k=K, expert_begin=2,
                             scales_swizzled=True)
    for k in t:
        np.testing.assert_array_equal(t[k], before[k], err_msg=k)


def test_forward_arguments(rng):
    t, nat = make_engine(rng, E, H, I)
    ex = moejit.Experts.adopt(**t, top_k=K, max_batch=8)
    x = hidden(rng, 6)
    ids, w = routing(rng, 6, K, E)
    full = ex(x, w, ids)
    # int64 ids are taken; num_token_non_padded masks the rows past it
    part = ex(x, w, ids.astype(np.int64), num_token_non_padded=4)
    np.testing.assert_array_equal(part[:4], full[:4])
    assert not part[4:].any()
    # bf16 bits in, bf16 bits out: f32's rounded
    bits = moejit.bf16_from_f32(x)
    np.testing.assert_array_equal(ex(bits, w, ids), moejit.bf16_from_f32(full))
    with pytest.raises(moejit.InvalidArgumentError, match="local experts 0..7"):
        ex(x, w, np.where(ids == 0, E, ids).astype(np.int32))
    with pytest.raises(ValueError, match="topk_ids has shape"):
        ex(x, w, ids[:, :2].copy())
    with pytest.raises(moejit.InvalidArgumentError, match="0..8 tokens"):
        big = hidden(rng, 9)
        ex(big, np.ones((9, K), np.float32), np.zeros((9, K), np.int32))
    ex.close()


def test_torch_cpu_tensors(fake_torch, rng):
    """CPU torch tensors (the stand-in) run on the interpreter: bf16 in, bf16 out."""
    tt = fake_torch
    tt.uint8 = type(tt.float32)("uint8", np.uint8)
    tt.float8_e4m3fn = type(tt.float32)("float8_e4m3fn", np.uint8)
    t, nat = make_engine(rng, E, H, I)
    ref_t = {k: v.copy() for k, v in t.items()}
    dt = dict(w13_weight=tt.uint8, w2_weight=tt.uint8, w13_weight_scale=tt.float8_e4m3fn,
              w2_weight_scale=tt.float8_e4m3fn)
    tens = {k: FakeTensor(v, dt.get(k, tt.float32)) for k, v in t.items()}
    ex = moejit.Experts.adopt(**tens, top_k=K, max_batch=8)
    x = hidden(rng, 3)
    ids, w = routing(rng, 3, K, E)
    got = ex(FakeTensor(moejit.bf16_from_f32(x), tt.bfloat16), FakeTensor(w, tt.float32), FakeTensor(ids, tt.int32))
    assert isinstance(got, FakeTensor) and got.dtype is tt.bfloat16 and got.shape == (3, H)
    ref = moejit.Experts.adopt(**ref_t, top_k=K, max_batch=8)
    np.testing.assert_array_equal(got.numpy(), ref(moejit.bf16_from_f32(x), w, ids))
    ex.close(), ref.close()


def test_from_layer(rng):
    """SGLang's layer attributes: parameters with .data, moe_ep_rank, num_local_experts, top_k."""
    t, nat = make_engine(rng, E, H, I, E_global=2 * E, expert_begin=E)
    layer = types.SimpleNamespace(**{k: types.SimpleNamespace(data=v) for k, v in t.items()})
    layer.moe_ep_rank, layer.num_local_experts, layer.top_k = 1, E, K
    ex = moejit.Experts.from_layer(layer, max_batch=8, mode="w4a4")
    assert ex.top_k == K
    x = hidden(rng, 4)
    ids, w = routing(rng, 4, K, E)
    assert rel_l2(ex(x, w, ids), reference(nat, x, ids, w)) < 0.3   # rows 8.. of the input scales (W4A4)
    ex.close()
    with pytest.raises(ValueError, match="no w2_input_scale"):
        moejit.Experts.from_layer(types.SimpleNamespace(**{k: v for k, v in vars(layer).items()
                                                          if k != "w2_input_scale"}))


def test_torch_op_registration(fake_torch, rng, monkeypatch):
    """moejit::experts goes through torch.library.custom_op with a fake (meta) kernel that
    gives the output's shape and dtype without running anything."""
    reg = {}

    class Op:
        def __init__(self, fn):
            self.fn = fn

        def register_fake(self, f):
            reg["fake"] = f

        def __call__(self, *a):
            return self.fn(*a)

    def custom_op(name, mutates_args):
        reg["name"], reg["mutates"] = name, mutates_args
        return lambda fn: reg.setdefault("op", Op(fn))

    fake_torch.Tensor = FakeTensor
    fake_torch.library = types.SimpleNamespace(custom_op=custom_op)
    monkeypatch.setitem(experts_mod._op, "fn", None)
    t, _ = make_engine(rng, E, H, I)
    ex = moejit.Experts.adopt(**t, top_k=K, max_batch=8)
    call = ex.as_torch_op()
    assert reg["name"] == "moejit::experts" and reg["mutates"] == ()
    x = moejit.bf16_from_f32(hidden(rng, 2))
    ids, w = routing(rng, 2, K, E)
    np.testing.assert_array_equal(call(x, w, ids), ex(x, w, ids))
    meta = reg["fake"](FakeTensor(x, fake_torch.bfloat16), FakeTensor(w, fake_torch.float32),
                       FakeTensor(ids, fake_torch.int32), 0)
    assert meta.shape == (2, H) and meta.dtype is fake_torch.bfloat16
    ex.close()
    with pytest.raises(ValueError, match="no open Experts"):
        call(x, w, ids)
