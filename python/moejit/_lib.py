"""Finding and loading libmoejit.so, and the prototypes of the C functions the binding calls.

Where the library is looked for, in order (the first that exists is loaded; a file that
exists but does not load is an error, not a reason to try the next):
  1. $MOEJIT_LIBRARY: that file and nothing else;
  2. beside this package: moejit/libmoejit.so (copy it there before `pip install`);
  3. from a checkout: <repository>/build/libmoejit.so (this file is python/moejit/_lib.py);
  4. the dynamic loader's search path (LD_LIBRARY_PATH, ldconfig): libmoejit.so.0.
The library is loaded on the first call that needs it, so `import moejit` works without it.

Every function that returns an mj_status raises MoejitError (errors.py) when it is not MJ_OK,
through ctypes' errcheck, reading mj_last_error() on the calling thread right away. The
functions are attributes of the object C (the tests replace them to prove that refused
arguments never reach C). ctypes releases the GIL for the length of every call, so ranks
driven from Python threads run in C at the same time.
"""
import ctypes
import ctypes.util
import os
import threading

from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_uint64, c_void_p

from . import _structs as S
from ._version import __version__
from .errors import LibraryNotFoundError, LibraryVersionError, error_for

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_state = {"lib": None, "path": None, "bound": None}

c_int32_p = POINTER(c_int32)


def candidates():
    """Where the library is looked for, as (how, path or name) pairs, in order."""
    out = []
    env = os.environ.get("MOEJIT_LIBRARY")
    if env:
        return [("$MOEJIT_LIBRARY", env)]
    out.append(("beside the package", os.path.join(_HERE, "libmoejit.so")))
    repo = os.path.dirname(os.path.dirname(_HERE))
    if os.path.isfile(os.path.join(repo, "include", "moejit.h")):
        out.append(("the checkout's build directory", os.path.join(repo, "build", "libmoejit.so")))
    found = ctypes.util.find_library("moejit")
    out.append(("the loader's search path", found or "libmoejit.so.0"))
    return out


def _load():
    tried = []
    for how, where in candidates():
        by_name = os.sep not in where
        if not by_name and not os.path.exists(where):
            tried.append("%s: %s (not there)" % (how, where))
            continue
        try:
            lib = ctypes.CDLL(where)
        except OSError as e:
            if by_name:
                tried.append("%s: %s (%s)" % (how, where, e))
                continue
            raise LibraryNotFoundError(
                "moejit: %s (%s) exists but does not load: %s. Rebuild it (cmake --build build) or point "
                "MOEJIT_LIBRARY at a working libmoejit.so" % (where, how, e)) from None
        return lib, where
    raise LibraryNotFoundError(
        "moejit: libmoejit.so not found. Looked in:\n  " + "\n  ".join(tried) +
        "\nBuild it (cmake -S . -B build && cmake --build build) and set MOEJIT_LIBRARY=/path/to/libmoejit.so, "
        "or copy libmoejit.so into the installed package directory (%s), or add its directory to "
        "LD_LIBRARY_PATH" % _HERE)


def _check(result, func, args):
    if result != 0:
        raise error_for(result, func.__name__, last_error())
    return result


_P = c_void_p  # pointers to data and opaque handles are passed as integers
_PP = POINTER(c_void_p)
# The return type of a function returning an mj_status: c_int, checked by _check.
STATUS = "mj_status"

# name: (argtypes, return type): the prototypes of include/moejit.h, as ctypes sees them. A C
# enum (mj_status, mj_parallel, mj_weight_mode, mj_backend) is a c_int, a pointer to data or an
# opaque handle is _P. tests/python/test_prototypes.py checks each one against the header with
# the C compiler, and that every function of the header is here or deliberately left out.
_PROTOS = {
    "mj_status_string": ([c_int], c_char_p),
    "mj_last_error": ([], c_char_p),
    "mj_version": ([POINTER(c_int), POINTER(c_int), POINTER(c_int), POINTER(c_char_p)], STATUS),
    # config
    "mj_moe_config_glm5": ([POINTER(S.MoeConfigC)], STATUS),
    "mj_moe_config_read": ([c_char_p, c_char_p, POINTER(S.MoeConfigC)], STATUS),
    "mj_moe_config_validate": ([POINTER(S.MoeConfigC), c_int], STATUS),
    "mj_route_params_from_config": ([POINTER(S.MoeConfigC), POINTER(S.RouteParamsC)], STATUS),
    # routing
    "mj_route_ref": ([POINTER(S.RouteParamsC), _P, _P, c_int32, c_int32, _P, _P, _P, POINTER(S.RouteStatsC)], STATUS),
    "mj_route_dispatch_ref": ([_P, _P, c_int32, c_int32, c_int32, _P, _P, _P, _P, _P, _P], STATUS),
    "mj_route": ([_P, POINTER(S.RouteParamsC), _P, _P, c_int32, _P, POINTER(S.RouteOutputsC), _P], STATUS),
    "mj_k0_policy_parse": ([c_char_p, c_int32, POINTER(S.K0PolicyC)], STATUS),
    "mj_k0_policy_resolve": ([POINTER(S.K0PolicyC), c_int32, c_int32_p], STATUS),
    # contexts
    "mj_context_create": ([POINTER(S.ContextOptionsC), _PP], STATUS),
    "mj_context_destroy": ([_P], STATUS),
    "mj_context_stats": ([_P, POINTER(S.JitStatsC)], STATUS),
    "mj_context_backend": ([_P, POINTER(c_int), POINTER(c_char_p)], STATUS),
    # layers and checkpoints
    "mj_layer_create_random": ([POINTER(S.MoeConfigC), c_uint64, _PP], STATUS),
    "mj_layer_shard": ([_P, c_int, c_int32, c_int32, _PP], STATUS),
    "mj_layer_free": ([_P], STATUS),
    "mj_moe_forward_ref": ([_P, c_int, _P, c_int32, c_int32, c_int32, _P, POINTER(S.RouteStatsC)], STATUS),
    "mj_router_ref": ([_P, _P, c_int32, _P], STATUS),
    "mj_checkpoint_open": ([c_char_p, _PP], STATUS),
    "mj_checkpoint_config": ([_P, POINTER(S.MoeConfigC)], STATUS),
    "mj_checkpoint_moe_layers": ([_P, c_int32_p, c_int32, c_int32_p], STATUS),
    "mj_layer_load": ([_P, c_int32, c_int, c_int32, c_int32, _PP], STATUS),
    "mj_checkpoint_close": ([_P], STATUS),
    "mj_checkpoint_make_plan": ([POINTER(S.CheckpointMakeOptionsC), POINTER(S.CheckpointMakeInfoC)], STATUS),
    "mj_checkpoint_make": ([POINTER(S.CheckpointMakeOptionsC)], STATUS),
    # communicators
    "mj_comm_loopback_create": ([c_int32, _PP], STATUS),
    "mj_comm_nccl_unique_id": ([POINTER(S.CommIdC)], STATUS),
    "mj_comm_nccl_init_rank": ([POINTER(S.CommIdC), c_int32, c_int32, _PP], STATUS),
    "mj_comm_nccl_init_all": ([c_int32, c_int32_p, _PP], STATUS),
    "mj_comm_nccl_wrap": ([_P, _PP], STATUS),
    "mj_comm_info": ([_P, c_int32_p, c_int32_p], STATUS),
    "mj_comm_all_reduce_f32": ([_P, _P, _P, c_int64, _P], STATUS),
    "mj_comm_free": ([_P], STATUS),
    # the layer runtime
    "mj_moe_create": ([_P, _P, POINTER(S.MoeOptionsC), _PP], STATUS),
    "mj_moe_prepare": ([_P, POINTER(S.MoePrepareOptionsC)], STATUS),
    "mj_moe_forward": ([_P, _P, c_int32, _P, _P, _P], STATUS),
    "mj_moe_batch_plan": ([_P, c_int32, c_int32_p, POINTER(c_int)], STATUS),
    "mj_moe_route_outputs": ([_P, POINTER(S.RouteOutputsC)], STATUS),
    "mj_moe_free": ([_P], STATUS),
    # experts adopted from an engine's tensors
    "mj_experts_adopt": ([_P, POINTER(S.AdoptTensorsC), POINTER(S.ExpertsOptionsC), _PP], STATUS),
    "mj_experts_readopt": ([_P, POINTER(S.AdoptTensorsC)], STATUS),
    "mj_experts_release": ([_P], STATUS),
    "mj_experts_adopt_info": ([_P, POINTER(S.AdoptInfoC)], STATUS),
    "mj_experts_prepare": ([_P, _P, c_int, c_int32], STATUS),
    "mj_experts_forward_topk": ([_P, _P, c_int, _P, c_int32, _P, _P, _P, _P, c_int, _P], STATUS),
    "mj_experts_free": ([_P], STATUS),
}


class _CFunctions:
    """The C functions, as attributes (filled on first use)."""


# ctypes converts a Python int to a C integer by wrapping it modulo 2**bits, silently
# (load_layer(2**32 + 3) loaded layer 3), and a bytes argument ends at its first NUL
# (Checkpoint("DIR\0/x") opened DIR). So every int and char* argument of a prototype is
# checked on the way in (_guard), and the struct fields too (_structs._Struct.__setattr__);
# the call sites check their own arguments first, to name them.
_INT_RANGES = {
    c_int: ("int", -2 ** 31, 2 ** 31 - 1),
    c_int32: ("int32_t", -2 ** 31, 2 ** 31 - 1),
    c_int64: ("int64_t", -2 ** 63, 2 ** 63 - 1),
    c_uint64: ("uint64_t", 0, 2 ** 64 - 1),
}


def _check_arg(func, i, ctype, v):
    if ctype is c_char_p:
        if isinstance(v, (bytes, bytearray)) and b"\0" in v:
            raise ValueError("%s: argument %d (%r) contains a NUL byte, where C would end the string: refused" %
                             (func, i + 1, bytes(v)))
        return
    if isinstance(v, bool) or v is None:
        return
    try:
        n = v.__index__()
    except AttributeError:
        return  # not an integer: ctypes says what it thinks of it
    name, lo, hi = _INT_RANGES[ctype]
    if not lo <= n <= hi:
        raise ValueError("%s: argument %d is %d, outside %s (%d..%d): refused rather than wrapped" %
                         (func, i + 1, n, name, lo, hi))


def _guard(name, f, argtypes):
    """f, or a wrapper checking its int and char* arguments (see _INT_RANGES)."""
    checks = [(i, t) for i, t in enumerate(argtypes) if t in _INT_RANGES or t is c_char_p]
    if not checks:
        return f

    def call(*args):
        for i, t in checks:
            if i < len(args):
                _check_arg(name, i, t, args[i])
        return f(*args)
    call.__name__ = call.__qualname__ = name
    return call


def int_arg(v, what, lo, hi):
    """v as an int in lo..hi, else ValueError naming `what` (TypeError when not an integer)."""
    if isinstance(v, bool):
        raise TypeError("%s must be an integer, not a bool" % what)
    try:
        n = v.__index__()
    except AttributeError:
        raise TypeError("%s must be an integer, not %s" % (what, type(v).__name__)) from None
    if not lo <= n <= hi:
        raise ValueError("%s %d is out of range (%d..%d)" % (what, n, lo, hi))
    return n


def path_arg(p, what):
    """A path (str, bytes, PathLike) as bytes for C; ValueError when it holds a NUL byte."""
    b = os.fsencode(p)
    if b"\0" in b:
        raise ValueError("%s %r contains a NUL byte, where C would end the path: refused" % (what, p))
    return b


def text_arg(t, what):
    """A str as UTF-8 bytes for C; ValueError when it holds a NUL character."""
    b = str(t).encode()
    if b"\0" in b:
        raise ValueError("%s %r contains a NUL character, where C would end the text: refused" % (what, t))
    return b


C = _CFunctions()


def _bind(lib):
    for name, (argtypes, restype) in _PROTOS.items():
        f = getattr(lib, name)
        f.argtypes = argtypes
        if restype is STATUS:
            f.restype = c_int
            f.errcheck = _check
        else:
            f.restype = restype
        setattr(C, name, _guard(name, f, argtypes))
    _state["bound"] = lib  # what last_error() reads, already during load()'s version check


def load():
    """Load the library (once) and check its version; returns its path."""
    with _lock:
        if _state["lib"] is None:
            lib, path = _load()
            _bind(lib)
            major, minor, patch, text = c_int(), c_int(), c_int(), c_char_p()
            C.mj_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch), ctypes.byref(text))
            want = tuple(int(x) for x in __version__.split(".")[:2])
            if (major.value, minor.value) != want:
                raise LibraryVersionError(
                    "moejit: %s is version %s; this package (%s) needs %d.%d.x. Point MOEJIT_LIBRARY at the "
                    "library built from the same checkout as the package" %
                    (path, (text.value or b"?").decode(), __version__, want[0], want[1]))
            _state["lib"], _state["path"] = lib, path
    return _state["path"]


def lib():
    """The C functions, loading the library on first use."""
    if _state["lib"] is None:
        load()
    return C


def last_error():
    """mj_last_error() of the calling thread (read right after the failed call)."""
    return (_state["bound"].mj_last_error() or b"").decode("utf-8", "replace")


def library_path():
    """The path of the loaded library (loading it if needed)."""
    return load()


def library_version():
    """The loaded library's version text ("MAJOR.MINOR.PATCH")."""
    c = lib()
    text = c_char_p()
    c.mj_version(None, None, None, ctypes.byref(text))
    return text.value.decode()
