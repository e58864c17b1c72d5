"""The torch paths without torch: a stand-in module and tensor (conftest.FakeTorch) with just
what the binding reads. CPU "tensors" run on the interpreter for real; "CUDA" ones are host
memory the binding takes for device memory: the tests check that the device pointers and
torch's current stream reach mj_route / mj_moe_forward, then run those calls on the
interpreter's context, so the outputs (tensors made through torch.empty and
__cuda_array_interface__) are checked by value too. The wrapped C calls are also ops on the
fake's streams (conftest.FakeGpu), so a tensor filled on one stream and read by a kernel on
another, or a block the allocator hands out again while a kernel on another stream still uses
it, is a race the tests see. Not run here: a real GPU, real torch."""
import ctypes
import sys

import numpy as np
import pytest

import moejit
from moejit import _lib
from moejit.context import Context
from moejit._handle import Handle
from conftest import FAKE_STREAM, SMALL, FakeGpu, FakeTensor
from moejit import _structs as S

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
    interpreter. With gpu, the call is also an op on that stream of the fake GPU, reading the
    pointer arguments at `reads` and writing those at `writes` (and the pointers of the
    mj_route_outputs at `outputs`; and what extra_writes(args) returns). only: record the
    calls on this handle only (others go straight through)."""

    def __init__(self, real, stream_index, expect, gpu=None, reads=(), writes=(), outputs=None, extra_writes=None,
                 only=None):
        self.real, self.i, self.expect, self.calls = real, stream_index, expect, []
        self.gpu, self.reads, self.writes, self.outputs, self.extra = gpu, reads, writes, outputs, extra_writes
        self.name, self.only = getattr(real, "__name__", "C call"), only

    def __call__(self, *args):
        if self.only is not None and args[0] != self.only:
            return self.real(*args)
        self.calls.append(args)
        assert args[self.i] == self.expect, "stream %r, expected %r" % (args[self.i], self.expect)
        stream = args[self.i]
        args = list(args)
        args[self.i] = None
        rc = self.real(*args)
        if self.gpu is not None:
            w = [args[i] for i in self.writes]
            if self.outputs is not None:
                w += _outputs_ptrs(args[self.outputs]._obj)
            if self.extra is not None:
                w += self.extra(args)
            self.gpu.op(stream, self.name, reads=[args[i] for i in self.reads], writes=w)
        return rc


def _outputs_ptrs(o):
    return [getattr(o, f) for f, _ in S.RouteOutputsC._fields_ if f != "struct_size"]


def _moe_workspace(args):
    """The routing mj_moe_forward writes inside the layer (what last_routing copies)."""
    r = S.RouteOutputsC()
    _lib.C.mj_moe_route_outputs(args[0], ctypes.byref(r))
    return _outputs_ptrs(r)


def test_fake_gpu_model():
    """The stand-in's race check and caching allocator, on their own."""
    g = FakeGpu()
    g.op(1, "fill", writes=[0x100])
    g.op(2, "kernel", reads=[0x100])                    # no ordering: a race
    assert len(g.races) == 1 and g.races[0].startswith("kernel (r on stream 0x2) after fill (w on stream 0x1)")
    g.races.clear()
    g.op(1, "fill", writes=[0x200])
    g.wait(2, 1)
    g.op(2, "kernel", reads=[0x200])                    # stream 2 waited on 1: ordered
    g.op(2, "kernel", reads=[0x300])
    g.op(1, "other read", reads=[0x300])                # two reads never race
    assert g.races == []
    g.current = 1
    b = g.alloc(8)
    g.release(b)
    assert g.alloc(8) is b and g.alloc(8) is not b      # reused on its own stream, once
    g.current = 2
    assert g.alloc(8) is not b                          # never on another stream
    b.recorded.add(2)
    g.release(b)
    g.current = 1
    assert g.alloc(8) is not b                          # record_stream: held until synchronize()
    g.synchronize()
    assert g.alloc(8) is b and g.history == {}


@pytest.mark.parametrize("stream,expect", [(None, FAKE_STREAM), (77, 77)])
def test_route_cuda_tensors(stream, expect, fake_torch, monkeypatch, rng, sim):
    t = fake_torch
    lg = rng.standard_normal((6, 32)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(32)).astype(np.float32)
    asked = []
    monkeypatch.setattr(route_mod, "get_context", lambda b, d: asked.append((b, d)) or sim)
    rec = _Recorder(_lib.C.mj_route, 7, expect, t.gpu, reads=(2, 3, 5), outputs=6)
    monkeypatch.setattr(_lib.C, "mj_route", rec)
    x, b = FakeTensor(lg, t.float32, "cuda:0"), FakeTensor(bias, t.float32, "cuda:0")
    got = moejit.route(x, b, topk=4, k0=2, num_valid=5, stream=stream)
    assert asked == [("cuda", 0)]                       # the context of the tensors' device
    # The count was filled on the kernel's stream, the outputs allocated there.
    assert t.gpu.races == [] and t.gpu.ops == [("torch.full", expect), ("mj_route", expect)]
    assert got.ids._block.stream == expect and got._keep._block.stream == expect
    assert t.gpu.current == FAKE_STREAM                 # the caller's current stream, back
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
    rec = _Recorder(_lib.C.mj_moe_forward, 5, FAKE_STREAM, t.gpu, reads=(1, 3), writes=(4,),
                    extra_writes=_moe_workspace)
    monkeypatch.setattr(_lib.C, "mj_moe_forward", rec)
    x = FakeTensor(bits, t.bfloat16, "cuda:0")
    y = moe.forward(x)
    assert t.gpu.races == []
    (args,) = rec.calls
    assert args[1] == x.data_ptr() and args[2] == B and args[3] is None and args[4] == y.data_ptr()
    assert isinstance(y, FakeTensor) and str(y.device) == "cuda:0" and y.dtype is t.float32
    np.testing.assert_array_equal(y.numpy(), want)
    r = moe.last_routing                                # copied out through __cuda_array_interface__
    for f in ("ids", "weights", "n_sel", "expert_offsets", "row_index"):
        v = getattr(r, f)
        assert isinstance(v, FakeTensor) and str(v.device) == "cuda:0", f
        np.testing.assert_array_equal(v.numpy(), getattr(want_route, f), err_msg=f)
    assert t.gpu.races == []
    with pytest.raises(ValueError, match="runs on cuda:0"):
        moe.forward(bits)                               # host memory to a GPU layer
    with pytest.raises(ValueError, match="runs on cuda:0"):
        moe.forward(FakeTensor(bits, t.bfloat16, "cuda:1"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        raw = np.zeros(B * H + 1, np.uint16)
        moe.forward(FakeTensor(raw[1:].reshape(B, H), t.bfloat16, "cuda:0"))
    moe.close()
    ctx.close()


SIDE = 77   # a stream of the caller's that is not torch's current one


@pytest.fixture
def cuda_moe(fake_torch, monkeypatch, checkpoint_dir, sim):
    """A Moe on the interpreter presented as cuda:0, its forward recorded on the fake GPU
    (reading hidden and num_valid, writing out and the routing it keeps), expecting SIDE."""
    ctx = _CudaLookingContext(sim)
    moe = moejit.Moe(checkpoint_dir, context=ctx, batches=[2])
    rec = _Recorder(_lib.C.mj_moe_forward, 5, SIDE, fake_torch.gpu, reads=(1, 3), writes=(4,),
                    extra_writes=_moe_workspace, only=moe._ptr)
    monkeypatch.setattr(_lib.C, "mj_moe_forward", rec)
    yield moe
    moe.close()
    ctx.close()


def _hidden(t, rng):
    bits = moejit.bf16_from_f32(rng.standard_normal((2, SMALL["hidden"])).astype(np.float32))
    return bits, FakeTensor(bits, t.bfloat16, "cuda:0")


def test_moe_num_valid_filled_on_kernel_stream(fake_torch, cuda_moe, checkpoint_dir, rng):
    """An int num_valid becomes a device tensor: filled on the stream the forward runs on
    (stream=), not on torch's current one, else the kernel may read it before it is written."""
    t = fake_torch
    bits, x = _hidden(t, rng)
    y = cuda_moe.forward(x, num_valid=1, stream=SIDE)
    assert [r for r in t.gpu.races if r.startswith("mj_moe_forward")] == []
    assert ("torch.full", SIDE) in t.gpu.ops and ("torch.full", FAKE_STREAM) not in t.gpu.ops
    assert y._block.stream == SIDE and t.gpu.current == FAKE_STREAM
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as plain:
        want = plain.forward(bits, num_valid=1)
    np.testing.assert_array_equal(y.numpy(), want)
    assert (y.numpy()[1] == 0).all()


def test_moe_num_valid_outlives_launch(fake_torch, cuda_moe, rng):
    """The num_valid tensor must not go back to the allocator, for others to write, while the
    forward enqueued on its stream may still read it."""
    t = fake_torch
    _, x = _hidden(t, rng)
    cuda_moe.forward(x, num_valid=1, stream=SIDE)
    later = [t.full((1,), 0, dtype=t.int32, device="cuda:0") for _ in range(2)]   # the caller's next work
    assert [r for r in t.gpu.races if r.startswith("torch.full")] == []
    assert all(v.numpy().tolist() == [0] for v in later)


@pytest.mark.parametrize("call", ["route", "forward", "all_reduce"])
def test_outputs_allocated_on_kernel_stream(call, fake_torch, cuda_moe, monkeypatch, rng, sim):
    """Outputs are allocated on the stream the kernel writes them on: a block the caller freed
    on its current stream while work there still reads it is not handed to a kernel on
    another stream."""
    t = fake_torch
    monkeypatch.setattr(route_mod, "get_context", lambda b, d: sim)
    monkeypatch.setattr(_lib.C, "mj_route", _Recorder(_lib.C.mj_route, 7, SIDE, t.gpu, reads=(2, 3, 5), outputs=6))
    T, E, k = 2, 16, 4
    sizes = [T * k] * 8 + [E + 1] * 2 + [2 * SMALL["hidden"]] * 2
    for n in sizes:                                     # tensors of every output's size, read, then dropped
        z = t.full((n,), 1, dtype=t.int32, device="cuda:0")
        t.gpu.op(FAKE_STREAM, "the caller's read", reads=[z.data_ptr()])
        del z
    if call == "route":
        lg = FakeTensor(rng.standard_normal((T, E)).astype(np.float32), t.float32, "cuda:0")
        got = moejit.route(lg, topk=k, stream=SIDE)
        outs = [getattr(got, f) for f in ("ids", "weights", "n_sel", "permutation", "row_index", "expert_offsets")]
    elif call == "forward":
        outs = [cuda_moe.forward(_hidden(t, rng)[1], stream=SIDE)]
    else:   # a one-rank loopback group standing in for NCCL (which takes "CUDA" tensors)
        monkeypatch.setattr(_lib.C, "mj_comm_all_reduce_f32",
                            _Recorder(_lib.C.mj_comm_all_reduce_f32, 4, SIDE, t.gpu, reads=(1,), writes=(2,)))
        (comm,) = moejit.loopback_comms(1)
        comm.kind = "nccl"
        send = FakeTensor(rng.standard_normal((2, SMALL["hidden"])).astype(np.float32), t.float32, "cuda:0")
        outs = [comm.all_reduce(send, stream=SIDE)]
        comm.close()
        np.testing.assert_array_equal(outs[0].numpy(), send.numpy())
    assert t.gpu.races == []
    assert all(o._block.stream == SIDE for o in outs)


def test_moe_last_routing_ordered_with_forward_stream(fake_torch, cuda_moe, checkpoint_dir, rng):
    """last_routing copies (on torch's current stream) what the forward wrote on its stream:
    after that forward, and before the next forward on that stream overwrites it."""
    t = fake_torch
    bits, x = _hidden(t, rng)
    cuda_moe.forward(x, stream=SIDE)
    r = cuda_moe.last_routing
    assert [s for s in t.gpu.races if s.startswith("clone")] == []
    cuda_moe.forward(x, stream=SIDE)
    assert t.gpu.races == []
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as plain:
        plain.forward(bits)
        want = plain.last_routing
    for f in ("ids", "weights", "n_sel", "expert_offsets", "row_index"):
        np.testing.assert_array_equal(getattr(r, f).numpy(), getattr(want, f), err_msg=f)
        assert getattr(r, f)._block.stream == FAKE_STREAM, f


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
