"""Arrays in and out: numpy arrays and torch tensors as C pointers, checked before any C call.

Two kinds of array are taken:
  numpy   an ndarray (or anything with __array_interface__, viewed without a copy): host
          memory, for the interpreter and the CPU reference;
  torch   a torch.Tensor, read through data_ptr(), dtype, shape, device and is_contiguous()
          only (so a stand-in with those attributes is handled the same way): a CPU tensor is
          host memory, a CUDA tensor device memory on device.index.
Outputs are made of the inputs' kind (numpy in, numpy out; torch in, torch out on the same
device). torch is imported only when a torch tensor is seen.
"""
import contextlib
import sys

import numpy as np


class Arr:
    """One checked array: its kind, device, dtype name, shape and data pointer."""

    __slots__ = ("obj", "kind", "device", "dtype", "shape", "ptr")

    def __init__(self, obj, kind, device, dtype, shape, ptr):
        self.obj, self.kind, self.device, self.dtype, self.shape, self.ptr = obj, kind, device, dtype, shape, ptr

    @property
    def is_cuda(self):
        return self.device[0] == "cuda"

    def where(self):
        if self.kind == "numpy":
            return "a numpy array"
        return "a torch tensor on %s" % (self.device[0] if self.device[1] is None else "%s:%d" % self.device)


def is_torch(x):
    return (not isinstance(x, np.ndarray) and hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")
            and hasattr(x, "device") and hasattr(x, "dtype") and hasattr(x, "shape"))


def _torch_dtype_name(dt):
    s = str(dt)
    return s[6:] if s.startswith("torch.") else s


def _torch_device(dev):
    kind = getattr(dev, "type", None) or str(dev).split(":")[0]
    index = getattr(dev, "index", None)
    if kind == "cuda" and index is None:
        index = sys.modules["torch"].cuda.current_device()
    return (kind, None if kind == "cpu" else index)


def adapt(x, name, *, dtypes, ndim=None, shape=None, writable=False):
    """Check x and return an Arr. dtypes: accepted dtype names ("float32", ...). ndim: the
    number of dimensions, or a tuple of accepted ones; shape: the expected shape, None for a
    free dimension; writable: C writes into it (a read-only numpy array is refused). Raises
    TypeError / ValueError naming the argument and what would work."""
    if x is None:
        raise TypeError("%s is None; pass an array" % name)
    if is_torch(x):
        kind = "torch"
        dtype = _torch_dtype_name(x.dtype)
        shp = tuple(int(d) for d in x.shape)
        device = _torch_device(x.device)
        if device[0] not in ("cpu", "cuda"):
            raise ValueError("%s is on device %s; moejit takes CPU or CUDA tensors" % (name, x.device))
        contiguous, aligned = bool(x.is_contiguous()), True
        fix = "%s.contiguous()" % name
    else:
        if not isinstance(x, np.ndarray):
            if hasattr(x, "__cuda_array_interface__"):
                raise TypeError("%s has __cuda_array_interface__ but is not a torch tensor; pass device memory as "
                                "a torch tensor (torch.as_tensor(x, device='cuda') wraps it without a copy)" % name)
            if not hasattr(x, "__array_interface__"):
                raise TypeError("%s is a %s; pass a numpy array or a torch tensor" % (name, type(x).__name__))
            x = np.asarray(x)
        kind = "numpy"
        if not x.dtype.isnative:
            raise TypeError("%s has dtype %s in the other byte order; pass %s.astype(%s.dtype.newbyteorder('='))" %
                            (name, x.dtype.str, name, name))
        if writable and not x.flags.writeable:
            raise ValueError("%s is read-only and moejit writes into it; pass a writable array (or none: one is "
                             "made)" % name)
        dtype = x.dtype.name
        shp = tuple(x.shape)
        device = ("cpu", None)
        contiguous, aligned = bool(x.flags.c_contiguous), bool(x.flags.aligned)
        fix = "np.ascontiguousarray(%s)" % name
    if dtype not in dtypes:
        raise TypeError("%s has dtype %s; moejit takes %s here" % (name, dtype, " or ".join(dtypes)))
    nd = (ndim,) if isinstance(ndim, int) else ndim
    if nd is not None and len(shp) not in nd:
        raise ValueError("%s has shape %s; it must have %s dimension(s)" % (name, shp, " or ".join(map(str, nd))))
    if shape is not None:
        if len(shp) != len(shape) or any(w is not None and w != g for w, g in zip(shape, shp)):
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            raise ValueError("%s has shape %s; it must be %s" % (name, list(shp), want))
    if not contiguous:
        raise ValueError("%s is not contiguous (row-major); pass %s" % (name, fix))
    if not aligned:
        raise ValueError("%s is not aligned to its dtype (its data starts at an odd address); pass a copy: "
                         "%s.copy()" % (name, name))
    ptr = x.data_ptr() if kind == "torch" else x.ctypes.data
    return Arr(x, kind, device, dtype, shp, int(ptr))


def same_place(a, b, what):
    """b must be of a's kind and on a's device."""
    if b.kind != a.kind or b.device != a.device:
        raise ValueError("%s is %s but the inputs are %s; pass both the same way" % (what, b.where(), a.where()))


def empty(like, shape, dtype):
    """An uninitialized array of like's kind and device. dtype: "float32", "int32", "uint16"."""
    if like.kind == "numpy":
        return np.empty(shape, dtype=dtype)
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811 (a torch tensor came in, so torch is importable)
    dev = "cpu" if like.device[0] == "cpu" else "cuda:%d" % like.device[1]
    return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=dev)


def full_int32(like, shape, value):
    """An int32 array of like's kind and device holding value everywhere (for num_valid)."""
    if like.kind == "numpy":
        return np.full(shape, value, dtype=np.int32)
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811
    dev = "cpu" if like.device[0] == "cpu" else "cuda:%d" % like.device[1]
    return torch.full(tuple(shape), int(value), dtype=torch.int32, device=dev)


def cuda_stream(arr, stream):
    """The CUstream to enqueue on: the caller's, else torch's current stream on arr's device."""
    if stream is not None:
        s = getattr(stream, "cuda_stream", stream)
        return int(s)
    if not arr.is_cuda:
        return None
    torch = sys.modules["torch"]
    return int(torch.cuda.current_stream(arr.device[1]).cuda_stream)


def _torch_stream(device, s, given=None):
    """torch's stream object for CUstream s on CUDA device `device` (the one given, the
    current or default stream when s is one of them, else an ExternalStream wrapping s)."""
    if given is not None and not isinstance(given, (int, np.integer)):
        return given
    torch = sys.modules["torch"]
    for known in (torch.cuda.current_stream(device), torch.cuda.default_stream(device)):
        if int(known.cuda_stream) == s:
            return known
    return torch.cuda.ExternalStream(s, device=device)


@contextlib.contextmanager
def on_stream(arr, stream):
    """Run the body with torch's current stream set to the one a call on arr enqueues its work
    on (`stream`, else the current one), and yield that CUstream (None off the GPU).

    Tensors the body makes (outputs, a num_valid count) are then allocated and filled on the
    stream the kernel reads and writes them on, as a torch op under `with
    torch.cuda.stream(stream)` would: their fill is ordered before the kernel, and the caching
    allocator hands their blocks out again only to work on that stream, after the kernel."""
    if not arr.is_cuda:
        yield None
        return
    s = cuda_stream(arr, stream)
    torch = sys.modules["torch"]
    if s == int(torch.cuda.current_stream(arr.device[1]).cuda_stream):
        yield s
        return
    with torch.cuda.stream(_torch_stream(arr.device[1], s, stream)):
        yield s


@contextlib.contextmanager
def reading_after(device, s):
    """Run the body (copies on torch's current stream of what work on CUstream s wrote) ordered
    after that work, and the work later enqueued on s after the body's copies: the current
    stream waits on s first, s on the current stream afterwards (events, no host sync)."""
    torch = sys.modules["torch"]
    cur = torch.cuda.current_stream(device)
    if s is None or s == int(cur.cuda_stream):
        yield
        return
    other = _torch_stream(device, s)
    cur.wait_stream(other)
    try:
        yield
    finally:
        other.wait_stream(cur)


def host_copy_out(ptr, dtype, shape):
    """A numpy copy of host memory at ptr."""
    n = int(np.prod(shape)) if shape else 1
    if n == 0 or not ptr:
        return np.zeros(shape, dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    buf = (np.ctypeslib.ctypes.c_char * (n * itemsize)).from_address(ptr)
    return np.frombuffer(bytes(buf), dtype=dtype).reshape(shape).copy()


class _CudaView:
    """Device memory described by __cuda_array_interface__ (version 3), for torch.as_tensor."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (int(ptr), False),
                                         "version": 3, "strides": None}


def cuda_copy_out(like, ptr, dtype, shape):
    """A torch copy of device memory at ptr, on like's device."""
    torch = sys.modules["torch"]
    typestr = {"int32": "<i4", "float32": "<f4"}[dtype]
    dev = "cuda:%d" % like.device[1]
    if int(np.prod(shape)) == 0:
        return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=dev)
    return torch.as_tensor(_CudaView(ptr, shape, typestr), device=dev).clone()


# ---- bf16 -----------------------------------------------------------------------------------

def bf16_from_f32(x):
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # quiet, sign kept
    return r


def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) -> float32, exactly."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)
