"""moejit.Experts on real torch CPU tensors, run on the interpreter: engine-layout tensors
(tests/python/engine_tensors.py) adopted in place, the output against the numpy NVFP4
reference, the custom op moejit::experts through torch.ops (and its fake kernel on meta
tensors), from_layer on an nn.Module's parameters."""
import types

import numpy as np
import pytest
import torch

import moejit
from moejit import experts as experts_mod
from engine_tensors import make_engine, reference, routing

E, H, I, K = 8, 256, 256, 4
SCALE_DTYPE = getattr(torch, "float8_e4m3fn", torch.uint8)   # torch < 2.1 has no float8: the bytes


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def as_torch(t):
    """The engine's numpy arrays as CPU torch tensors sharing their memory (block scales as
    float8_e4m3fn where torch has it)."""
    out = {k: torch.from_numpy(v) for k, v in t.items()}
    for k in ("w13_weight_scale", "w2_weight_scale"):
        out[k] = out[k].view(SCALE_DTYPE)
    return out


def inputs(rng, T, n_valid=None):
    """x bf16 [T, H], weights f32, ids int32 (-1 in some slots and in rows past n_valid), and
    x's values as float32 numpy for the reference."""
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    ids, w = routing(rng, T, K, E, n_valid=n_valid)
    return x, torch.from_numpy(w), torch.from_numpy(ids), x.float().numpy()


def test_real_torch():
    """This directory runs a real torch, not a stand-in, and the registration path it has."""
    base = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase
    assert torch.__version__ and isinstance(torch._C, types.ModuleType) and issubclass(torch.Tensor, base)
    print("torch", torch.__version__, torch.__file__)
    assert torch.from_numpy(np.arange(3, dtype=np.float32)).sum().item() == 3.0


@pytest.mark.parametrize("up_first", [False, True], ids=["gate_up", "up_gate"])
@pytest.mark.parametrize("swizzled", [False, True], ids=["linear", "swizzled"])
def test_layouts(rng, up_first, swizzled):
    t, nat = make_engine(rng, E, H, I, up_first=up_first, swizzled=swizzled)
    before = {k: v.copy() for k, v in t.items()}
    tt = as_torch(t)
    ptrs = {k: v.data_ptr() for k, v in tt.items()}
    ex = moejit.Experts.adopt(**tt, top_k=K, up_first=up_first, scales_swizzled=swizzled, max_batch=8, mode="w4a16")
    try:
        assert {k: v.data_ptr() for k, v in tt.items()} == ptrs
        assert not np.array_equal(tt["w13_weight"].numpy(), before["w13_weight"]), "in place: repacked where it was"
        x, w, ids, xf = inputs(rng, 6, n_valid=5)
        got = ex(x, w, ids)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and tuple(got.shape) == (6, H)
        assert got.device.type == "cpu"
        want = reference(nat, xf, ids.numpy(), w.numpy())
        assert rel_l2(got.float().numpy(), want) < 5e-3, rel_l2(got.float().numpy(), want)
        assert not got[5].any(), "a padding row (ids -1) comes out 0"
        ex.release()
        for k in t:
            np.testing.assert_array_equal(tt[k].view(torch.uint8).numpy() if tt[k].dtype == SCALE_DTYPE
                                          else tt[k].numpy(), before[k], err_msg=k)
        ex.readopt()
        assert torch.equal(ex(x, w, ids), got)
    finally:
        ex.close()


def test_forward_arguments(rng):
    """int64 ids, num_token_non_padded as an int and as a one-element tensor, f32 hidden
    states (rounded to bf16: the bf16 call's output), and what is refused."""
    t, nat = make_engine(rng, E, H, I)
    ex = moejit.Experts.adopt(**as_torch(t), top_k=K, max_batch=8)
    x, w, ids, xf = inputs(rng, 6)
    full = ex(x, w, ids)
    assert full.dtype == torch.bfloat16
    for n in (4, torch.tensor([4], dtype=torch.int32), torch.tensor(4)):
        part = ex(x, w, ids.long(), num_token_non_padded=n)
        assert torch.equal(part[:4], full[:4]) and not part[4:].any(), n
    # float32 / float16 hidden states: rounded to bf16 on the way in, and the output comes
    # back in their dtype (what the op's fake kernel says): the bf16 output, converted
    for dt in (torch.float32, torch.float16):
        o = ex(x.to(dt), w, ids)
        assert o.dtype == dt and torch.equal(o, full.to(dt))
    assert torch.equal(ex(x, w.to(torch.bfloat16).float(), ids), ex(x, w.to(torch.bfloat16), ids))
    with pytest.raises(ValueError, match="not contiguous"):
        ex(x.t().contiguous().t(), w, ids)
    with pytest.raises(ValueError, match="topk_ids has shape"):
        ex(x, w, ids[:, :2].contiguous())
    with pytest.raises(ValueError, match="device meta"):
        ex(x.to("meta"), w, ids)
    with pytest.raises(moejit.InvalidArgumentError, match="local experts 0..7"):
        ex(x, w, torch.where(ids == 0, torch.tensor(E, dtype=torch.int32), ids))
    ex.close()


def test_in_place_no_second_copy_and_copy_mode(rng):
    t, nat = make_engine(rng, E, H, I)
    tt = as_torch(t)
    codes = tt["w13_weight"].numel() + tt["w2_weight"].numel()
    ex = moejit.Experts.adopt(**tt, top_k=K, max_batch=8)
    info = ex.info
    assert info["in_place"] == 1 and info["scales_in_place"] == 1
    assert info["bytes_allocated"] < codes // 4, info     # the workspace, not the weights
    assert info["bytes_weights"] >= codes
    ex.close()
    t, nat = make_engine(rng, E, H, I)
    before = {k: v.copy() for k, v in t.items()}
    cp = moejit.Experts.adopt(**as_torch(t), top_k=K, in_place=False, max_batch=8)
    assert cp.info["in_place"] == 0 and cp.info["bytes_allocated"] >= cp.info["bytes_weights"]
    x, w, ids, xf = inputs(rng, 4)
    assert rel_l2(cp(x, w, ids).float().numpy(), reference(nat, xf, ids.numpy(), w.numpy())) < 5e-3
    for k in t:
        np.testing.assert_array_equal(t[k], before[k], err_msg=k)
    cp.close()


def test_torch_op(rng):
    """moejit::experts registered with this torch (custom_op where torch.library has it, a
    Library's CPU / CUDA / Meta / AutogradMeta kernels before that), called through
    torch.ops.moejit.experts: the experts' output; on meta tensors the fake kernel alone
    (shape, dtype, device; the handle is closed by then, so nothing runs)."""
    t, nat = make_engine(rng, E, H, I)
    ex = moejit.Experts.adopt(**as_torch(t), top_k=K, max_batch=8)
    call = ex.as_torch_op()
    if hasattr(torch.library, "custom_op"):
        assert "lib" not in experts_mod._op
    else:
        assert isinstance(experts_mod._op["lib"], torch.library.Library)
    x, w, ids, xf = inputs(rng, 5, n_valid=4)
    direct = ex(x, w, ids)
    got = call(x, w, ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, direct)
    key = next(k for k, v in experts_mod._OPS.items() if v is ex)
    assert torch.equal(torch.ops.moejit.experts(x, w, ids, key), direct)
    assert rel_l2(got.float().numpy(), reference(nat, xf, ids.numpy(), w.numpy())) < 5e-3
    ex.close()
    for T in (1, 7):
        meta = torch.ops.moejit.experts(torch.empty(T, H, dtype=torch.bfloat16, device="meta"),
                                        torch.empty(T, K, device="meta"),
                                        torch.empty(T, K, dtype=torch.int32, device="meta"), key)
        assert meta.device.type == "meta" and tuple(meta.shape) == (T, H) and meta.dtype == torch.bfloat16
    with pytest.raises(Exception, match="no open Experts"):
        torch.ops.moejit.experts(x, w, ids, key)


class Layer(torch.nn.Module):
    """An SGLang FusedMoE's NVFP4 parameters under EP 4, rank 1, one shared expert fused as
    local expert 3: the input scales hold a row for every expert of the model (the rank's
    routed experts at 3..5, the shared one at 12, after every routed expert), 1e3 elsewhere."""

    def __init__(self, t):
        super().__init__()
        self.rows = [3, 4, 5, 12]
        n = 13
        in13, in2 = np.full((n, 2), 1e3, np.float32), np.full(n, 1e3, np.float32)
        in13[self.rows], in2[self.rows] = t["w13_input_scale"], t["w2_input_scale"]
        for k, v in as_torch(dict(t, w13_input_scale=in13, w2_input_scale=in2)).items():
            setattr(self, k, torch.nn.Parameter(v, requires_grad=False))
        self.top_k, self.num_experts, self.num_local_experts = K, n, 4
        self.num_fused_shared_experts, self.moe_ep_rank, self.moe_ep_size = 1, 1, 4
        self.num_global_routed_experts = 12


def test_from_layer_module(rng):
    """from_layer on an nn.Module's parameters: the rank's input-scale rows taken with
    index_select, the same bits as an adoption of those rows; after a reload of the scales
    into the parameters' storage, readopt reads them again."""
    t, _ = make_engine(rng, 4, H, I)
    local = {k: v.copy() for k, v in t.items()}
    layer = Layer(t)
    ex = moejit.Experts.from_layer(layer, max_batch=8, mode="w4a4")
    assert ex.top_k == K
    ref = moejit.Experts.adopt(**as_torch(local), top_k=K, max_batch=8, mode="w4a4")
    x = torch.from_numpy(rng.standard_normal((3, H)).astype(np.float32)).to(torch.bfloat16)
    ids, w = routing(rng, 3, K, 4)
    ids[:, 0] = 3                                     # every token reaches the shared expert
    ids, w = torch.from_numpy(ids), torch.from_numpy(w)
    first = ex(x, w, ids)
    assert torch.equal(first, ref(x, w, ids))
    ex.release(), ref.release()
    with torch.no_grad():
        layer.w13_input_scale[12] *= 3
    local["w13_input_scale"][3] *= 3
    ex.readopt()
    ref.close()
    ref = moejit.Experts.adopt(**as_torch(local), top_k=K, max_batch=8, mode="w4a4")
    again = ex(x, w, ids)
    assert torch.equal(again, ref(x, w, ids)) and not torch.equal(again, first)
    ex.close(), ref.close()
    with pytest.raises(ValueError, match="no w2_input_scale"):
        moejit.Experts.from_layer(types.SimpleNamespace(**{k: getattr(layer, k) for k in t if k != "w2_input_scale"}))
