"""The torch paths without torch: a stand-in module and tensor (conftest.FakeTorch) with just
what the binding reads. CPU "tensors" run on the interpreter for real; "CUDA" ones are host
memory the binding takes for device memory: the tests check that the device pointers and
torch's current stream reach mj_route / mj_moe_forward, then run those calls on the
interpreter's context, so the outputs (tensors made through torch.empty and
__cuda_array_interface__) are checked by value too. Not run here: a real GPU, real torch."""
import sys

import numpy as np
import pytest

import moejit
from moejit import _lib
from moejit.context import Context
from moejit._handle import Handle
from conftest import FAKE_STREAM, SMALL, FakeTensor

route_mod = sys.modules["moejit.route"]


def test_route_cpu_tensors(fake_torch, rng):
    t = fake_torch
    lg = rng.standard_normal((5, 16)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(16)).astype(np.float32)
    got = moejit.route(FakeTensor(lg, t.float32), FakeTensor(bias, t.float32), topk=4, k0=2, num_valid=4)
    want = moejit.route(lg, bias, topk=4, k0=2, num_valid=4, backend="ref")
    for f in ("ids", "weights", "n_sel", "permutation", "row_index", "expert_counts", "n_active"):
        v = getattr(got, f)
        assert isinstance(v, FakeTensor) and str(v.device) == "cpu", f
        np.testing.assert_array_equal(v.numpy(), getattr(want, f), err_msg=f)
    assert got.ids.dtype is t.int32 and got.weights.dtype is t.float32


class _Recorder:
    """Wraps a C function: checks the stream argument, then calls it with stream None on the
    interpreter."""

    def __init__(self, real, stream_index, expect):
        self.real, self.i, self.expect, self.calls = real, stream_index, expect, []

    def __call__(self, *args):
        self.calls.append(args)
        assert args[self.i] == self.expect, "stream %r, expected %r" % (args[self.i], self.expect)
        args = list(args)
        args[self.i] = None
        return self.real(*args)


@pytest.mark.parametrize("stream,expect", [(None, FAKE_STREAM), (77, 77)])
def test_route_cuda_tensors(stream, expect, fake_torch, monkeypatch, rng, sim):
    t = fake_torch
    lg = rng.standard_normal((6, 32)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(32)).astype(np.float32)
    asked = []
    monkeypatch.setattr(route_mod, "get_context", lambda b, d: asked.append((b, d)) or sim)
    rec = _Recorder(_lib.C.mj_route, 7, expect)
    monkeypatch.setattr(_lib.C, "mj_route", rec)
    x, b = FakeTensor(lg, t.float32, "cuda:0"), FakeTensor(bias, t.float32, "cuda:0")
    got = moejit.route(x, b, topk=4, k0=2, num_valid=5, stream=stream)
    assert asked == [("cuda", 0)]                       # the context of the tensors' device
    (args,) = rec.calls
    assert args[2] == x.data_ptr() and args[3] == b.data_ptr() and args[4] == 6
    nv = args[5]
    assert nv == got._keep.data_ptr() and got._keep.numpy().tolist() == [5]   # num_valid on the device
    want = moejit.route(lg, bias, topk=4, k0=2, num_valid=5, backend="ref")
    for f in ("ids", "weights", "n_sel", "permutation", "row_index", "active_experts"):
        v = getattr(got, f)
        assert isinstance(v, FakeTensor) and str(v.device) == "cuda:0", f
        np.testing.assert_array_equal(v.numpy(), getattr(want, f), err_msg=f)


class _CudaLookingContext(Context):
    """The interpreter's context, presented as cuda:0 (so Moe takes fake CUDA tensors); never
    frees the context it borrows."""

    def __init__(self, sim):
        Handle.__init__(self)
        self._adopt(sim._ptr)
        self.backend, self.device, self.target = "cuda", 0, sim.target

    def close(self):
        self._ptr = None


def test_moe_cuda_tensors(fake_torch, monkeypatch, checkpoint_dir, rng, sim):
    t = fake_torch
    B, H = 2, SMALL["hidden"]
    bits = moejit.bf16_from_f32(rng.standard_normal((B, H)).astype(np.float32))
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[B]) as plain:
        want = plain.forward(bits)
        want_route = plain.last_routing
    ctx = _CudaLookingContext(sim)
    moe = moejit.Moe(checkpoint_dir, context=ctx, batches=[B])
    rec = _Recorder(_lib.C.mj_moe_forward, 5, FAKE_STREAM)
    monkeypatch.setattr(_lib.C, "mj_moe_forward", rec)
    x = FakeTensor(bits, t.bfloat16, "cuda:0")
    y = moe.forward(x)
    (args,) = rec.calls
    assert args[1] == x.data_ptr() and args[2] == B and args[3] is None and args[4] == y.data_ptr()
    assert isinstance(y, FakeTensor) and str(y.device) == "cuda:0" and y.dtype is t.float32
    np.testing.assert_array_equal(y.numpy(), want)
    r = moe.last_routing                                # copied out through __cuda_array_interface__
    for f in ("ids", "weights", "n_sel", "expert_offsets", "row_index"):
        v = getattr(r, f)
        assert isinstance(v, FakeTensor) and str(v.device) == "cuda:0", f
        np.testing.assert_array_equal(v.numpy(), getattr(want_route, f), err_msg=f)
    with pytest.raises(ValueError, match="runs on cuda:0"):
        moe.forward(bits)                               # host memory to a GPU layer
    with pytest.raises(ValueError, match="runs on cuda:0"):
        moe.forward(FakeTensor(bits, t.bfloat16, "cuda:1"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        raw = np.zeros(B * H + 1, np.uint16)
        moe.forward(FakeTensor(raw[1:].reshape(B, H), t.bfloat16, "cuda:0"))
    moe.close()
    ctx.close()


def test_moe_cpu_tensors(fake_torch, checkpoint_dir, rng):
    t = fake_torch
    B, H = 2, SMALL["hidden"]
    bits = moejit.bf16_from_f32(rng.standard_normal((B, H)).astype(np.float32))
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[B]) as moe:
        want = moe.forward(bits)
        y = moe.forward(FakeTensor(bits, t.bfloat16, "cpu"), num_valid=1)
        assert isinstance(y, FakeTensor) and str(y.device) == "cpu"
        np.testing.assert_array_equal(y.numpy()[0], want[0])
        assert (y.numpy()[1] == 0).all()
        r = moe.last_routing
        assert isinstance(r.ids, FakeTensor) and r.ids.numpy()[1].tolist() == [-1] * SMALL["topk"]


def test_moe_auto_takes_torchs_current_gpu(fake_torch, monkeypatch, checkpoint_dir):
    """backend "auto" with torch imported and a GPU: the context of torch's current device
    (one process per GPU sets it before NcclComm and Moe); without a GPU, the library's choice."""
    moe_mod = sys.modules["moejit.moe"]
    asked = []

    class Stop(Exception):
        pass

    def fake_get_context(backend, device):
        asked.append((backend, device))
        raise Stop()

    monkeypatch.setattr(moe_mod, "get_context", fake_get_context)
    with pytest.raises(Stop):
        moejit.Moe(checkpoint_dir)
    monkeypatch.setattr(fake_torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fake_torch.cuda, "current_device", lambda: 3)
    with pytest.raises(Stop):
        moejit.Moe(checkpoint_dir)
    with pytest.raises(Stop):
        moejit.Moe(checkpoint_dir, device=1)
    with pytest.raises(Stop):
        moejit.Moe(checkpoint_dir, backend="sim")
    assert asked == [("auto", None), ("cuda", 3), ("cuda", 1), ("sim", None)]
