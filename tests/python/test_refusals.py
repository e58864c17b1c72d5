"""Arguments the binding can judge (dtype, shape, layout, device, kind) are refused with
TypeError / ValueError before any call into C: every C function is replaced by one that fails
the test if it is reached."""
import numpy as np
import pytest

import moejit
from moejit import _lib
from conftest import SMALL, FakeTensor


@pytest.fixture
def no_c(monkeypatch):
    """Make reaching any C function a test failure (after the library is loaded). The
    functions that free handles stay: objects a test made are freed when it returns."""
    _lib.load()
    reached = []

    def arm():
        for name in _lib._PROTOS:
            if name.endswith(("_free", "_destroy", "_close")):
                continue
            def boom(*a, _name=name):
                reached.append(_name)
                pytest.fail("%s was called: the binding should have refused the arguments first" % _name)
            monkeypatch.setattr(_lib.C, name, boom)
    return arm


def _logits(T=4, E=16, dtype=np.float32):
    return np.random.default_rng(0).standard_normal((T, E)).astype(dtype)


ROUTE_BAD = [
    ("float64 logits", lambda: dict(logits=_logits(dtype=np.float64)), TypeError, "dtype float64"),
    ("float16 logits", lambda: dict(logits=_logits(dtype=np.float16)), TypeError, "float32"),
    ("1-d logits", lambda: dict(logits=_logits()[0]), ValueError, "dimension"),
    ("3-d logits", lambda: dict(logits=_logits()[None]), ValueError, "dimension"),
    ("transposed logits", lambda: dict(logits=_logits(16, 4).T), ValueError, "contiguous"),
    ("strided logits", lambda: dict(logits=_logits(8, 16)[::2]), ValueError, "contiguous"),
    ("a list", lambda: dict(logits=[[0.0] * 16] * 4), TypeError, "numpy array or a torch tensor"),
    ("bias length", lambda: dict(bias=np.zeros(15, np.float32)), ValueError, r"\[16\]"),
    ("bias dtype", lambda: dict(bias=np.zeros(16, np.float64)), TypeError, "bias has dtype"),
    ("topk too big", lambda: dict(topk=17), ValueError, "topk 17"),
    ("topk float", lambda: dict(topk=2.0), TypeError, "topk"),
    ("k0 too big", lambda: dict(k0=5), ValueError, "k0 5"),
    ("k0 zero", lambda: dict(k0=0), ValueError, "k0 0"),
    ("scoring", lambda: dict(scoring="relu"), ValueError, "scoring"),
    ("group score", lambda: dict(group_score="sum"), ValueError, "group_score"),
    ("num_valid range", lambda: dict(num_valid=5), ValueError, "num_valid 5"),
    ("num_valid dtype", lambda: dict(num_valid=np.array([2], np.int64)), TypeError, "int32"),
    ("num_valid shape", lambda: dict(num_valid=np.array([2, 2], np.int32)), ValueError, "one int32"),
    ("backend", lambda: dict(backend="tpu"), ValueError, "backend"),
    ("cuda backend, host logits", lambda: dict(backend="cuda"), ValueError, "CUDA tensors"),
]


@pytest.mark.parametrize("name,make,exc,msg", ROUTE_BAD, ids=[c[0] for c in ROUTE_BAD])
def test_route_refuses_before_c(name, make, exc, msg, no_c):
    kw = dict(logits=_logits(), bias=None, topk=4, backend="sim")
    kw.update(make())
    no_c()
    with pytest.raises(exc, match=msg):
        moejit.route(kw.pop("logits"), kw.pop("bias"), **kw)


def test_route_refuses_torch_devices_before_c(no_c, fake_torch):
    t = fake_torch
    lg = _logits()
    cuda_lg = FakeTensor(lg, t.float32, "cuda:0")
    cpu_lg = FakeTensor(lg, t.float32, "cpu")
    no_c()
    with pytest.raises(ValueError, match="runs on the host"):
        moejit.route(cuda_lg, topk=4, backend="sim")                       # a GPU tensor to the interpreter
    with pytest.raises(ValueError, match="pass both the same way"):
        moejit.route(cuda_lg, FakeTensor(np.zeros(16, np.float32), t.float32, "cuda:1"), topk=4)   # two GPUs
    with pytest.raises(ValueError, match="pass both the same way"):
        moejit.route(cpu_lg, np.zeros(16, np.float32), topk=4)            # torch logits, numpy bias
    with pytest.raises(ValueError, match="contiguous"):
        moejit.route(FakeTensor(lg, t.float32, "cuda:0", contiguous=False), topk=4)
    with pytest.raises(TypeError, match="dtype float16"):
        moejit.route(FakeTensor(lg.astype(np.float16), t.float16, "cuda:0"), topk=4)
    with pytest.raises(ValueError, match="device mps"):
        moejit.route(FakeTensor(lg, t.float32, "mps"), topk=4)


def test_moe_forward_refuses_before_c(checkpoint_dir, no_c, fake_torch):
    t = fake_torch
    H = SMALL["hidden"]
    moe = moejit.Moe(checkpoint_dir, backend="sim", batches=[2])
    layer = moejit.Checkpoint(checkpoint_dir).load_layer(3)
    no_c()
    x = np.zeros((2, H), np.float32)
    bad = [
        (np.zeros((2, H), np.float64), TypeError, "dtype float64"),
        (np.zeros((2, H + 64), np.float32), ValueError, r"\[B, 128\]"),
        (np.zeros((2, H, 1), np.float32), ValueError, "dimension"),
        (np.zeros((H, 4), np.float32).T, ValueError, "contiguous"),
        (FakeTensor(np.zeros((2, H), np.uint16), t.bfloat16, "cuda:0"), ValueError, "on cuda:0"),
        (FakeTensor(np.zeros((2, H), np.float32), t.float32, "cpu"), TypeError, "torch.bfloat16"),
    ]
    for arg, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            moe.forward(arg)
        with pytest.raises(exc, match=msg):
            layer.forward_ref(arg)
    with pytest.raises(ValueError, match="num_valid 3"):
        moe.forward(x, num_valid=3)
    with pytest.raises(ValueError, match="out has shape"):
        moe.forward(x, out=np.zeros((2, H + 1), np.float32))
    with pytest.raises(TypeError, match="out has dtype"):
        moe.forward(x, out=np.zeros((2, H), np.float64))
    with pytest.raises(ValueError, match="out is a torch tensor"):
        moe.forward(x, out=FakeTensor(np.zeros((2, H), np.float32), t.float32, "cpu"))
    with pytest.raises(ValueError, match="give max_batch or batches"):
        moe.prepare()
    with pytest.raises(ValueError, match="mode"):
        moe.prepare(max_batch=2, mode="fp8")


def test_moe_and_comm_arguments_refused_before_c(checkpoint_dir, no_c, fake_torch):
    comms = moejit.loopback_comms(2)
    no_c()
    with pytest.raises(ValueError, match="needs comm"):
        moejit.Moe(checkpoint_dir, tp=2, rank=0, backend="sim")
    with pytest.raises(ValueError, match="rank 2"):
        moejit.Moe(checkpoint_dir, tp=2, rank=2, comm=comms[0], backend="sim")
    with pytest.raises(ValueError, match="tp or ep, not both"):
        moejit.Moe(checkpoint_dir, tp=2, ep=2, backend="sim")
    with pytest.raises(TypeError, match="comm must be"):
        moejit.Moe(checkpoint_dir, tp=2, comm=object(), backend="sim")
    with pytest.raises(ValueError, match="mode"):
        moejit.Moe(checkpoint_dir, mode="int8", backend="sim")
    with pytest.raises(ValueError, match="backend"):
        moejit.Moe(checkpoint_dir, backend="rocm")
    with pytest.raises(TypeError, match="checkpoint must be"):
        moejit.Moe(42)
    with pytest.raises(ValueError, match="loopback communicator sums host memory"):
        comms[0].all_reduce(FakeTensor(np.zeros(4, np.float32), fake_torch.float32, "cuda:0"))
    with pytest.raises(ValueError, match="recv has shape"):
        comms[0].all_reduce(np.zeros(4, np.float32), np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="1..64"):
        moejit.loopback_comms(65)
    with pytest.raises(ValueError, match="128 bytes"):
        moejit.NcclComm(b"short", 2, 0)


def test_byte_order_and_read_only_outputs_refused_before_c(checkpoint_dir, no_c):
    """A big-endian float32 array has dtype name float32 but is not what C reads; a read-only
    array would be written through by C: both are refused first."""
    H = SMALL["hidden"]
    moe = moejit.Moe(checkpoint_dir, backend="sim", batches=[2])
    comms = moejit.loopback_comms(1)
    no_c()
    with pytest.raises(TypeError, match="byte order"):
        moejit.route(_logits().astype(">f4"), topk=4, backend="sim")
    with pytest.raises(TypeError, match="byte order"):
        moejit.route(_logits(), np.zeros(16, ">f4"), topk=4, backend="ref")
    with pytest.raises(TypeError, match="byte order"):
        moe.forward(np.zeros((2, H), ">u2"))
    ro = np.zeros((2, H), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        moe.forward(np.zeros((2, H), np.float32), out=ro)
    ro1 = np.zeros(4, np.float32)
    ro1.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        comms[0].all_reduce(np.zeros(4, np.float32), ro1)
    with pytest.raises(pytest.fail.Exception, match="mj_moe_forward was called"):
        moe.forward(ro)  # a read-only input is fine: it gets as far as C
