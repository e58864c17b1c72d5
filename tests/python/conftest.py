"""Shared fixtures of the Python binding's tests (pytest, run by scripts/test.sh and ctest).

The package is imported from the checkout (python/), and the library is the one
$MOEJIT_LIBRARY names (ctest sets it to its build's), else the checkout's build/. Kernels
are compiled into $MJ_TEST_CACHE (the suite's shared cache) or a session tmp dir, so the
interpreter compiles each specialization once across runs.
"""
import os
import sys
import types

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

if not os.environ.get("MOEJIT_CACHE_DIR"):
    if os.environ.get("MJ_TEST_CACHE"):
        os.environ["MOEJIT_CACHE_DIR"] = os.environ["MJ_TEST_CACHE"]
    else:  # a cache of this run's own, removed when it ends
        import atexit
        import shutil
        import tempfile
        _own_cache = tempfile.mkdtemp(prefix="moejit-pytest-cache-")
        atexit.register(shutil.rmtree, _own_cache, True)
        os.environ["MOEJIT_CACHE_DIR"] = _own_cache
os.environ.setdefault("MOEJIT_SIM_THREADS", "2")

import moejit  # noqa: E402

GLM5_CONFIG = os.path.join(REPO, "tests", "data", "model", "glm5_moe_config.json")
# The small GLM-5-shaped layer every test runs: TP 2 leaves 64 intermediate rows a rank (one
# MJ_DIM_ALIGN), EP 2 eight experts a rank.
SMALL = dict(hidden=128, intermediate=128, n_experts=16, topk=4)


def seed_of(request):
    """A test's seed: $MJ_TEST_SEED, else a fixed one; printed so a failure can be replayed."""
    s = int(os.environ.get("MJ_TEST_SEED", "1234"))
    print("%s: seed %d (replay with MJ_TEST_SEED=%d)" % (request.node.name, s, s))
    return s


@pytest.fixture
def rng(request):
    return np.random.default_rng(seed_of(request))


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """A two-layer checkpoint (MoE layers 3 and 4) of the small shape, written by the C
    writer (mj_checkpoint_make) through the binding, in 64 KiB shards."""
    out = str(tmp_path_factory.mktemp("ck") / "small")
    moejit.make_checkpoint(GLM5_CONFIG, out, seed=7, layer_first=3, layer_last=4, shard_bytes=64 << 10, **SMALL)
    return out


@pytest.fixture(scope="session")
def sim():
    return moejit.get_context("sim")


# ---- a stand-in for torch ---------------------------------------------------------------------
# torch is not installed here (too big for CI). The binding reads a tensor only through
# data_ptr(), dtype, shape, device and is_contiguous(), and makes tensors with torch.empty /
# full / from_numpy / as_tensor (__cuda_array_interface__) and finds the stream with
# torch.cuda.current_stream(device).cuda_stream. FakeTorch provides exactly that over numpy
# arrays in host memory, so a "cuda" FakeTensor is host memory the binding believes is on a
# GPU: the tests check what reaches C (pointers, stream) and run it on the interpreter.

FAKE_STREAM = 0x5EED


class FakeDtype:
    def __init__(self, name, np_dtype):
        self.name, self.np_dtype = name, np.dtype(np_dtype)

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__


class FakeDevice:
    def __init__(self, spec):
        kind, _, idx = str(spec).partition(":")
        self.type, self.index = kind, (int(idx) if idx else None)

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)


class FakeTensor:
    def __init__(self, arr, dtype, device="cpu", contiguous=True):
        self.arr, self.dtype, self.device, self._contiguous = arr, dtype, FakeDevice(device), contiguous

    def data_ptr(self):
        return self.arr.ctypes.data

    @property
    def shape(self):
        return tuple(self.arr.shape)

    def is_contiguous(self):
        return self._contiguous and self.arr.flags.c_contiguous

    def numpy(self):
        return self.arr

    def __getitem__(self, i):
        return self.arr[i]


class _Stream:
    cuda_stream = FAKE_STREAM


def make_fake_torch():
    t = types.ModuleType("torch")
    t.float32 = FakeDtype("float32", np.float32)
    t.int32 = FakeDtype("int32", np.int32)
    t.uint16 = FakeDtype("uint16", np.uint16)
    t.bfloat16 = FakeDtype("bfloat16", np.uint16)   # bf16 bits in a uint16 array
    t.float16 = FakeDtype("float16", np.float16)
    t.made = []                                      # every tensor the binding made

    def _new(arr, dtype, device):
        x = FakeTensor(arr, dtype, device)
        t.made.append(x)
        return x

    t.empty = lambda shape, dtype, device="cpu": _new(np.empty(shape, dtype.np_dtype), dtype, device)
    t.full = lambda shape, v, dtype, device="cpu": _new(np.full(shape, v, dtype.np_dtype), dtype, device)
    t.from_numpy = lambda a: _new(a, {np.dtype(np.float32): t.float32, np.dtype(np.int32): t.int32}[a.dtype], "cpu")

    def as_tensor(obj, device):
        cai = obj.__cuda_array_interface__
        assert cai["version"] == 3 and cai["strides"] is None
        dt = {"<i4": t.int32, "<f4": t.float32}[cai["typestr"]]
        n = int(np.prod(cai["shape"]))
        buf = (np.ctypeslib.ctypes.c_char * (n * dt.np_dtype.itemsize)).from_address(cai["data"][0])
        view = np.frombuffer(buf, dtype=dt.np_dtype).reshape(cai["shape"])
        x = FakeTensor(view, dt, device)
        x.clone = lambda: _new(view.copy(), dt, device)
        return x

    t.as_tensor = as_tensor
    t.cuda = types.SimpleNamespace(current_device=lambda: 0, current_stream=lambda device=None: _Stream(),
                                   is_available=lambda: False)
    return t


@pytest.fixture
def fake_torch(monkeypatch):
    t = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", t)
    return t
