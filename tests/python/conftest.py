"""Shared fixtures of the Python binding's tests (pytest, run by scripts/test.sh and ctest).

The package is imported from the checkout (python/), and the library is the one
$MOEJIT_LIBRARY names (ctest sets it to its build's), else the checkout's build/. Kernels
are compiled into $MJ_TEST_CACHE (the suite's shared cache) or a session tmp dir, so the
interpreter compiles each specialization once across runs.
"""
import contextlib
import inspect
import os
import sys
import types
import weakref

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moejit_testenv import REPO, seed_of, use_test_cache  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "python"))
use_test_cache()

import moejit  # noqa: E402

GLM5_CONFIG = os.path.join(REPO, "tests", "data", "model", "glm5_moe_config.json")
# The small GLM-5-shaped layer every test runs: TP 2 leaves 64 intermediate rows a rank (one
# MJ_DIM_ALIGN), EP 2 eight experts a rank.
SMALL = dict(hidden=128, intermediate=128, n_experts=16, topk=4)


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
# data_ptr(), dtype, shape, device and is_contiguous(), makes tensors with torch.empty /
# full / from_numpy / as_tensor (__cuda_array_interface__), and orders its work with
# torch.cuda streams (current_stream, default_stream, ExternalStream, stream(), wait_stream).
# FakeTorch provides exactly that over numpy arrays in host memory, so a "cuda" FakeTensor is
# host memory the binding believes is on a GPU: the tests check what reaches C (pointers,
# stream) and run it on the interpreter.
#
# FakeGpu models what makes asynchronous GPU work go wrong, without running anything out of
# order: every operation (a torch.full's fill, a clone, a C call the tests wrap) is an op on
# a stream, and streams carry vector clocks (one op ticks its stream; s.wait_stream(o) makes
# s's later ops follow o's earlier ones). Each access to device memory is checked against the
# earlier accesses to the same block: two that conflict (one writes) on different streams
# with no ordering between them are a race, recorded in gpu.races. "cuda" tensors come from
# a caching allocator like torch's: a freed block goes back to the pool of the stream it was
# allocated on and is handed, stale, to the next allocation of that size on that stream
# (kept out until synchronize() when record_stream named another stream), so using a block
# after its tensor was dropped shows up as a race with its next owner's work.

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
        self._block = None   # the allocator's block, for tensors the fake allocated

    def data_ptr(self):
        return self.arr.ctypes.data

    @property
    def shape(self):
        return tuple(self.arr.shape)

    def is_contiguous(self):
        return self._contiguous and self.arr.flags.c_contiguous

    def numpy(self):
        return self.arr

    def record_stream(self, stream):
        if self._block is not None:
            self._block.recorded.add(int(stream.cuda_stream))

    def __getitem__(self, i):
        return self.arr[i]

    def index_select(self, dim, index):   # CPU tensors only
        assert dim == 0 and self.device.type == "cpu"
        return FakeTensor(np.ascontiguousarray(self.arr[index.arr]), self.dtype, "cpu")

    def copy_(self, src):
        assert self.device.type == "cpu"
        self.arr[...] = src.arr
        return self


class _Block:
    __slots__ = ("raw", "buf", "nbytes", "stream", "recorded")

    def __init__(self, nbytes):
        self.raw = np.full(nbytes + 256, 0xA5, np.uint8)   # stale bytes, as a reused block has
        off = (-self.raw.ctypes.data) % 256
        self.buf = self.raw[off:off + nbytes]
        self.nbytes, self.stream, self.recorded = nbytes, None, set()


class FakeGpu:
    """Streams with vector clocks, a caching allocator and the race check (see above)."""

    def __init__(self):
        self.current = FAKE_STREAM
        self.clocks = {}      # stream -> {stream: ops of it ordered before this stream's next op}
        self.history = {}     # address -> [(stream, tick, "r" / "w", what)]
        self.pool = {}        # (stream, nbytes) -> free blocks
        self.held = []        # freed blocks record_stream kept out of the pool until synchronize()
        self.races = []       # one line per race found
        self.ops = []         # (what, stream) of every op, in order

    def _clock(self, s):
        return self.clocks.setdefault(s, {})

    def op(self, stream, what, reads=(), writes=()):
        """One op on stream reading and writing device memory at these addresses."""
        c = self._clock(stream)
        c[stream] = c.get(stream, 0) + 1
        tick = c[stream]
        self.ops.append((what, stream))
        for kind, addrs in (("r", reads), ("w", writes)):
            for a in addrs:
                if not a:
                    continue
                h = self.history.setdefault(int(a), [])
                for s0, t0, k0, w0 in h:
                    if s0 != stream and "w" in (k0, kind) and c.get(s0, 0) < t0:
                        self.races.append("%s (%s on stream %#x) after %s (%s on stream %#x) at %#x, unordered" %
                                          (what, kind, stream, w0, k0, s0, int(a)))
                h.append((stream, tick, kind, what))

    def wait(self, stream, other):
        """stream's later ops follow other's ops so far (an event recorded on other, waited on)."""
        c, o = self._clock(stream), dict(self._clock(other))
        for s, t in o.items():
            c[s] = max(c.get(s, 0), t)

    def synchronize(self):
        self.history.clear()
        for b in self.held:
            self.pool.setdefault((b.stream, b.nbytes), []).append(b)
        self.held = []

    def alloc(self, nbytes):
        free = self.pool.get((self.current, nbytes))
        b = free.pop() if free else _Block(nbytes)
        b.stream, b.recorded = self.current, set()
        return b

    def release(self, b):
        if b.recorded - {b.stream}:
            self.held.append(b)
        else:
            self.pool.setdefault((b.stream, b.nbytes), []).append(b)


class FakeStream:
    def __init__(self, gpu, handle):
        self.gpu, self.cuda_stream = gpu, int(handle)

    def wait_stream(self, other):
        self.gpu.wait(self.cuda_stream, int(other.cuda_stream))


# ---- torch.library in the stand-in: the custom op moejit::experts ------------------------------
# The binding registers moejit::experts with torch.library.custom_op and register_fake (torch >=
# 2.4), else with a Library and its define / impl. These have real torch 2.14.1's signatures
# (tests/python/test_torch_api.py compares them with its source) and what the binding relies on:
# custom_op infers the schema from the function's annotations as torch's infer_schema does
# (string annotations evaluated in the function's module globals; positional-or-keyword and
# keyword-only parameters only; int is SymInt), and a call checks its arguments against the
# schema (a Tensor is a tensor). A call on tensors of the "meta" device runs the fake (Meta)
# kernel alone, else the CPU or CUDA one. A Library's definitions go when it is collected, as
# torch's finalizer removes them. What is registered is in torch.library.registry.

_SCHEMA_TYPES = {"Tensor": None, "SymInt": int, "int": int, "float": float, "bool": bool, "str": str}


class FakeOp:
    """One registered operator: its schema and kernels by dispatch key."""

    def __init__(self, torch, qualname, schema):
        self.torch, self.qualname, self.schema, self.kernels = torch, qualname, schema, {}

    def _check(self, args):
        params = [p.strip().split(" ") for p in self.schema.split(") ->")[0].split("(", 1)[1].split(",")]
        if len(args) != len(params):
            raise TypeError("%s() takes %d arguments (%d given)" % (self.qualname, len(params), len(args)))
        for (ty, name), a in zip(params, args):
            want = self.torch.Tensor if ty == "Tensor" else _SCHEMA_TYPES[ty]
            if not isinstance(a, want) or (want is int and isinstance(a, bool)):
                raise TypeError("%s(): argument '%s' must be %s, not %s" % (self.qualname, name, ty, type(a).__name__))

    def __call__(self, *args):
        self._check(args)
        devices = {a.device.type for a in args if isinstance(a, self.torch.Tensor)}
        key = "Meta" if "meta" in devices else "CUDA" if "cuda" in devices else "CPU"
        if key not in self.kernels:
            raise NotImplementedError("Could not run '%s' with arguments from the '%s' backend" % (self.qualname, key))
        return self.kernels[key](*args)


class FakeCustomOpDef(FakeOp):
    def __init__(self, torch, qualname, schema, fn):
        FakeOp.__init__(self, torch, qualname, schema)
        self.kernels["CPU"] = self.kernels["CUDA"] = fn

    def register_fake(self, fn, /):
        self.kernels["Meta"] = fn
        return fn


def _infer_schema(torch, fn):
    """torch's infer_schema for the types the binding uses."""
    sig = inspect.signature(fn)
    types_ = {torch.Tensor: "Tensor", int: "SymInt", float: "float", bool: "bool", str: "str"}

    def resolve(ann, what):
        if ann is inspect.Parameter.empty:
            raise ValueError("infer_schema(func): %s must have a type annotation" % what)
        if isinstance(ann, str):   # torch evaluates it in the function's module globals
            try:
                ann = eval(ann, fn.__globals__)
            except Exception:
                raise ValueError("infer_schema(func): Unsupported type annotation %s. It is not a type." % ann)
        if ann not in types_:
            raise ValueError("infer_schema(func): %s has unsupported type %s" % (what, ann))
        return types_[ann]

    params = []
    for name, p in sig.parameters.items():
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise ValueError("infer_schema(func): We do not support positional-only args, varargs, or varkwargs.")
        params.append("%s %s" % (resolve(p.annotation, "Parameter " + name), name))
    return "(%s) -> %s" % (", ".join(params), resolve(sig.return_annotation, "the return"))


def _fake_library(t):
    registry = {}

    def custom_op(name, fn=None, /, *, mutates_args, device_types=None, schema=None, tags=None):
        if name.count("::") != 1 or not all(name.split("::")):
            raise ValueError("Expected name to be of the form namespace::opname, got %s" % name)
        if isinstance(mutates_args, str) and mutates_args != "unknown":
            raise ValueError("mutates_args must either be a sequence of the names of the arguments that are "
                             "mutated or the string 'unknown'.")

        def inner(fn):
            op = FakeCustomOpDef(t, name, schema if schema is not None else _infer_schema(t, fn), fn)
            registry[name] = op
            return op
        if fn is None:
            return inner
        return inner(fn)

    class Library:
        def __init__(self, ns, kind, dispatch_key=""):
            if kind not in ("IMPL", "DEF", "FRAGMENT"):
                raise ValueError("Unsupported kind: %s" % kind)
            self.ns, self.kind, self.dispatch_key, self._defs = ns, kind, dispatch_key, []
            weakref.finalize(self, lambda defs: [registry.pop(d, None) for d in defs], self._defs)

        def define(self, schema, alias_analysis="", *, tags=()):
            name, rest = schema.split("(", 1)
            qualname = "%s::%s" % (self.ns, name)
            registry[qualname] = FakeOp(t, qualname, "(" + rest)
            self._defs.append(qualname)
            return name

        def impl(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=True):
            registry["%s::%s" % (self.ns, op_name)].kernels[dispatch_key or self.dispatch_key] = fn

    class Namespace:
        def __init__(self, ns):
            self.ns = ns

        def __getattr__(self, op_name):
            op = registry.get("%s::%s" % (self.ns, op_name))
            if op is None:
                raise AttributeError("'_OpNamespace' '%s' object has no attribute '%s'" % (self.ns, op_name))
            return op

    class Ops:
        def __getattr__(self, name):
            return Namespace(name)

    return types.SimpleNamespace(custom_op=custom_op, Library=Library, CustomOpDef=FakeCustomOpDef,
                                 registry=registry), Ops()


def make_fake_torch():
    t = types.ModuleType("torch")
    t.Tensor = FakeTensor
    t.library, t.ops = _fake_library(t)
    t.float32 = FakeDtype("float32", np.float32)
    t.int32 = FakeDtype("int32", np.int32)
    t.int64 = FakeDtype("int64", np.int64)
    t.uint16 = FakeDtype("uint16", np.uint16)
    t.bfloat16 = FakeDtype("bfloat16", np.uint16)   # bf16 bits in a uint16 array
    t.float16 = FakeDtype("float16", np.float16)
    gpu = t.gpu = FakeGpu()

    def _alloc(shape, dtype, device):
        """A tensor from the caching allocator ("cuda") or a fresh array ("cpu")."""
        if not str(device).startswith("cuda"):
            return FakeTensor(np.empty(shape, dtype.np_dtype), dtype, device)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.np_dtype.itemsize
        b = gpu.alloc(nbytes)
        x = FakeTensor(b.buf.view(dtype.np_dtype).reshape(shape), dtype, device)
        x._block = b
        weakref.finalize(x, gpu.release, b)
        return x

    def full(shape, v, dtype, device="cpu"):
        x = _alloc(shape, dtype, device)
        x.arr[...] = v
        if x._block is not None:
            gpu.op(gpu.current, "torch.full", writes=[x.data_ptr()])
        return x

    def empty(size, *, dtype=None, device=None):
        return _alloc(tuple(size), dtype or t.float32, "cpu" if device is None else device)

    t.empty, t.full = empty, full
    t.from_numpy = lambda a: FakeTensor(a, {np.dtype(np.float32): t.float32, np.dtype(np.int32): t.int32}[a.dtype],
                                        "cpu")

    def as_tensor(obj, device):
        cai = obj.__cuda_array_interface__
        assert cai["version"] == 3 and cai["strides"] is None
        dt = {"<i4": t.int32, "<f4": t.float32}[cai["typestr"]]
        n = int(np.prod(cai["shape"]))
        src = cai["data"][0]
        buf = (np.ctypeslib.ctypes.c_char * (n * dt.np_dtype.itemsize)).from_address(src)
        view = np.frombuffer(buf, dtype=dt.np_dtype).reshape(cai["shape"])
        x = FakeTensor(view, dt, device)

        def clone():
            y = _alloc(view.shape, dt, device)
            y.arr[...] = view
            gpu.op(gpu.current, "clone", reads=[src], writes=[y.data_ptr()])
            return y

        x.clone = clone
        return x

    t.as_tensor = as_tensor

    def tensor(data, *, dtype=None, device=None):   # CPU tensors only
        assert device is None or str(device) == "cpu"
        return FakeTensor(np.asarray(data, (dtype or t.float32).np_dtype), dtype or t.float32, "cpu")

    t.tensor = tensor

    @contextlib.contextmanager
    def stream(s):
        prev, gpu.current = gpu.current, int(s.cuda_stream)
        try:
            yield
        finally:
            gpu.current = prev

    t.cuda = types.SimpleNamespace(
        current_device=lambda: 0, is_available=lambda: False,
        current_stream=lambda device=None: FakeStream(gpu, gpu.current),
        default_stream=lambda device=None: FakeStream(gpu, FAKE_STREAM),
        ExternalStream=lambda ptr, device=None: FakeStream(gpu, ptr),
        stream=stream, synchronize=lambda device=None: gpu.synchronize())
    return t


@pytest.fixture
def fake_torch(monkeypatch):
    t = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", t)
    return t
