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
    t, nat = make_engine(rng, E, H, I)
    ref_t = {k: v.copy() for k, v in t.items()}
    ex = moejit.Experts.adopt(**torch_tensors(tt, t), top_k=K, max_batch=8)
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


def torch_tensors(tt, t):
    """The engine's arrays as (stand-in) CPU torch tensors of its dtypes (no copy)."""
    tt.uint8 = type(tt.float32)("uint8", np.uint8)
    tt.float8_e4m3fn = type(tt.float32)("float8_e4m3fn", np.uint8)
    dt = dict(w13_weight=tt.uint8, w2_weight=tt.uint8, w13_weight_scale=tt.float8_e4m3fn,
              w2_weight_scale=tt.float8_e4m3fn)
    return {k: FakeTensor(v, dt.get(k, tt.float32)) for k, v in t.items()}


def op_args(tt, rng, T, device="cpu"):
    x = moejit.bf16_from_f32(hidden(rng, T))
    ids, w = routing(rng, T, K, E)
    return (FakeTensor(x, tt.bfloat16, device), FakeTensor(w, tt.float32, device), FakeTensor(ids, tt.int32, device))


@pytest.mark.parametrize("api", ["custom_op", "Library"])
def test_torch_op_registration(fake_torch, rng, monkeypatch, api):
    """moejit::experts through torch.library.custom_op and register_fake (torch >= 2.4), or a
    Library's define and CPU / CUDA / Meta / AutogradMeta impls before that (the stand-in has real torch
    2.14.1's signatures, infers the schema from the annotations and checks a call's arguments
    as torch does; test_torch_api.py). A call on CPU tensors runs the experts; one on meta
    tensors runs the fake kernel alone: shape and dtype, nothing run (the handle is closed)."""
    tt = fake_torch
    if api == "Library":
        monkeypatch.delattr(tt.library, "custom_op")
    monkeypatch.setitem(experts_mod._op, "fn", None)
    t, _ = make_engine(rng, E, H, I)
    ex = moejit.Experts.adopt(**torch_tensors(tt, t), top_k=K, max_batch=8)
    call = ex.as_torch_op()
    op = tt.library.registry["moejit::experts"]
    assert op.schema == ("(Tensor hidden_states, Tensor topk_weights, Tensor topk_ids, %s handle) -> Tensor" %
                         ("SymInt" if api == "custom_op" else "int"))
    assert set(op.kernels) == {"CPU", "CUDA", "Meta"} | ({"AutogradMeta"} if api == "Library" else set())
    args = op_args(tt, rng, 2)
    got = call(*args)
    assert isinstance(got, FakeTensor) and got.dtype is tt.bfloat16
    np.testing.assert_array_equal(got.numpy(), ex(*args).numpy())
    ex.close()
    meta = call(*op_args(tt, rng, 3, "meta"))
    assert meta.shape == (3, H) and meta.dtype is tt.bfloat16 and meta.device.type == "meta"
    with pytest.raises(ValueError, match="no open Experts"):
        call(*args)
    with pytest.raises(TypeError, match="argument 'hidden_states' must be Tensor"):
        call(args[0].numpy(), *args[1:])

def sglang_ep_layer(t, *, rank, ep, shared, storage_rank=None, per_rank_slots=False):
    """An SGLang FusedMoE under EP as 0.5.23 lays it out (fused_moe_triton/layer.py), from one
    rank's engine tensors t (E_loc experts: the routed ones, then `shared` fused shared
    experts): the input scales hold a row for every expert of the model, the rank's routed
    experts at storage_rank * routed_loc + x (_map_global_expert_id_to_local_expert_id), its
    shared experts after all the routed ones (global slots: num_experts = routed + shared).
    Other rows hold 1e3, far off. Returns (layer, rows)."""
    e_loc = t["w13_weight"].shape[0]
    routed_loc = e_loc - shared
    routed = routed_loc * ep
    storage_rank = rank if storage_rank is None else storage_rank
    n = routed + (shared * ep if per_rank_slots else shared)
    rows = [storage_rank * routed_loc + x for x in range(routed_loc)] + [routed + i for i in range(shared)]
    in13 = np.full((n, 2), 1e3, np.float32)
    in2 = np.full(n, 1e3, np.float32)
    in13[rows], in2[rows] = t["w13_input_scale"], t["w2_input_scale"]
    g = dict(t, w13_input_scale=in13, w2_input_scale=in2)
    layer = types.SimpleNamespace(**{k: types.SimpleNamespace(data=v) for k, v in g.items()})
    layer.top_k, layer.num_experts, layer.num_local_experts = K, n, e_loc
    layer.num_fused_shared_experts, layer.moe_ep_rank, layer.moe_ep_size = shared, rank, ep
    layer.num_global_routed_experts, layer._expert_storage_rank = routed, storage_rank
    return layer, rows


def every_token_to(ids, e):
    """Expert e in every valid token's first slot, once (a token's ids stay distinct)."""
    for row in ids:
        j = np.flatnonzero(row == e)
        if len(j):
            row[j[0]] = row[0]
        row[0] = e


@pytest.mark.parametrize("rank,storage_rank", [(0, None), (1, None), (3, None), (0, 2)],
                         ids=["rank0", "rank1", "last_rank", "elastic_storage_rank2"])
def test_from_layer_sglang_fused_shared_ep(rng, rank, storage_rank):
    """SGLang under EP 4 with one shared expert fused as local expert 3 (routed experts 0..2):
    the input scales' rows of this rank's experts are not one run (the shared expert's row
    follows every routed expert of the model), so from_layer reads each expert's own rows;
    the result is the same bits as an adoption of the rank's rows copied out. After release
    and a reload of the scales, readopt reads them again."""
    t, _ = make_engine(rng, 4, H, I)
    local = {k: v.copy() for k, v in t.items()}
    layer, rows = sglang_ep_layer(t, rank=rank, ep=4, shared=1, storage_rank=storage_rank)
    ex = moejit.Experts.from_layer(layer, max_batch=8, mode="w4a4")
    ref = moejit.Experts.adopt(**local, top_k=K, max_batch=8, mode="w4a4")
    x = hidden(rng, 5)
    ids, w = routing(rng, 5, K, 4)
    every_token_to(ids, 3)                            # every token reaches the shared expert
    first = ex(x, w, ids)
    np.testing.assert_array_equal(first, ref(x, w, ids))
    # the engine reloads: new input scales for the shared expert and routed expert 0 (not
    # powers of 2, which would move every block scale by the same exponent: the same bits)
    ex.release(), ref.release()
    layer.w13_input_scale.data[rows[3]] *= 3
    layer.w2_input_scale.data[rows[0]] *= 3
    local["w13_input_scale"][3] *= 3
    local["w2_input_scale"][0] *= 3
    ex.readopt()
    ref.close()
    ref = moejit.Experts.adopt(**local, top_k=K, max_batch=8, mode="w4a4")
    again = ex(x, w, ids)
    np.testing.assert_array_equal(again, ref(x, w, ids))
    assert not np.array_equal(again, first), "the reloaded scales are used"
    ex.close(), ref.close()


def test_from_layer_sglang_fused_shared_ep_torch(fake_torch, rng):
    """The same with (stand-in) CPU torch tensors: the rank's rows taken with index_select
    into a tensor of their own, and copied into it again by readopt."""
    tt = fake_torch
    t, _ = make_engine(rng, 4, H, I)
    local = {k: v.copy() for k, v in t.items()}
    layer, rows = sglang_ep_layer(t, rank=1, ep=4, shared=1)
    for k, v in torch_tensors(tt, {k: getattr(layer, k).data for k in t}).items():
        getattr(layer, k).data = v
    ex = moejit.Experts.from_layer(layer, max_batch=8, mode="w4a4")
    ref = moejit.Experts.adopt(**local, top_k=K, max_batch=8, mode="w4a4")
    x = moejit.bf16_from_f32(hidden(rng, 3))
    ids, w = routing(rng, 3, K, 4)
    every_token_to(ids, 3)
    call = lambda e: e(FakeTensor(x, tt.bfloat16), FakeTensor(w, tt.float32), FakeTensor(ids, tt.int32)).numpy()
    np.testing.assert_array_equal(call(ex), ref(x, w, ids))
    ex.release(), ref.release()
    layer.w13_input_scale.data.arr[rows[3]] *= 3
    local["w13_input_scale"][3] *= 3
    ex.readopt()
    ref.close()
    ref = moejit.Experts.adopt(**local, top_k=K, max_batch=8, mode="w4a4")
    np.testing.assert_array_equal(call(ex), ref(x, w, ids))
    ex.close(), ref.close()


def test_from_layer_sglang_per_rank_shared_slots_refused(rng):
    """SGLang's DeepEP-class and MegaMoE backends give every rank its own shared-expert slot
    (num_experts = routed + shared x ranks), and its loader writes those slots' input scales
    into rows routed experts use too: refused, the tensors untouched."""
    t, _ = make_engine(rng, 4, H, I)
    layer, _ = sglang_ep_layer(t, rank=1, ep=4, shared=1, per_rank_slots=True)
    before = {k: getattr(layer, k).data.copy() for k in t}
    with pytest.raises(ValueError, match="per-rank shared-expert slots"):
        moejit.Experts.from_layer(layer, max_batch=8)
    for k in t:
        np.testing.assert_array_equal(getattr(layer, k).data, before[k], err_msg=k)
