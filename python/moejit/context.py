"""Contexts: a kernel cache and, optionally, a GPU. One per (backend, device) is cached."""
import ctypes
import os
import threading

from . import _structs as S
from ._handle import Handle
from ._lib import lib, path_arg, text_arg

_BACKENDS = {"cuda": S.MJ_BACKEND_CUDA, "sim": S.MJ_BACKEND_SIM, "auto": S.MJ_BACKEND_AUTO}


class Context(Handle):
    """An mj_context_t: where kernels run and the kernel cache they come from.

    backend: "sim" (the CPU interpreter: host memory), "cuda" (a GPU: device memory) or
    "auto" (cuda when there is a device, else sim). device: the CUDA ordinal (cuda only;
    default 0). target: the GPU target to build for ("sm_120a"; default the device's, and
    sm_120a on the interpreter). cache_dir, cache_max_bytes, strict: as mj_context_options
    (None: the environment's MOEJIT_CACHE_DIR, MOEJIT_CACHE_MAX_BYTES, MOEJIT_STRICT).
    """

    _free_name = "mj_context_destroy"
    _what = "context"

    def __init__(self, backend="auto", device=None, *, target=None, cache_dir=None, cache_max_bytes=None,
                 strict=None):
        super().__init__()
        if backend not in _BACKENDS:
            raise ValueError("backend %r: use 'sim', 'cuda' or 'auto'" % (backend,))
        if device is not None and (not isinstance(device, int) or device < 0):
            raise ValueError("device %r: a CUDA ordinal (0, 1, ...) or None" % (device,))
        if backend == "sim" and device is not None:
            raise ValueError("a sim context has no device; leave device None")
        o = S.ContextOptionsC()
        o.backend = _BACKENDS[backend]
        if backend == "sim":
            o.device = S.MJ_DEVICE_NONE
        elif device is not None:
            o.device = device
        elif backend == "cuda":
            o.device = 0
        if target is not None:
            o.target = text_arg(target, "target")
        if cache_dir is not None:
            o.cache_dir = path_arg(cache_dir, "cache_dir")
        if cache_max_bytes is not None:
            o.cache_max_bytes = int(cache_max_bytes)
        if strict is not None:
            o.strict = 1 if strict else 0
        c = lib()
        p = ctypes.c_void_p()
        c.mj_context_create(ctypes.byref(o), ctypes.byref(p))
        self._adopt(p.value)
        b, t = ctypes.c_int(), ctypes.c_char_p()
        c.mj_context_backend(self._handle(), ctypes.byref(b), ctypes.byref(t))
        self.backend = "cuda" if b.value == S.MJ_BACKEND_CUDA else "sim"
        self.target = t.value.decode()
        self.device = (device if device is not None else 0) if self.backend == "cuda" else None

    def stats(self):
        """The JIT's counters (mj_jit_stats) as a dict."""
        st = S.JitStatsC()
        with self._using() as p:
            lib().mj_context_stats(p, ctypes.byref(st))
        return {f: getattr(st, f) for f, _ in st._fields_}

    def __repr__(self):
        return "<moejit.Context %s%s %s%s>" % (self.backend, "" if self.device is None else ":%d" % self.device,
                                              self.target, " closed" if self.closed else "")


_cache = {}
_cache_lock = threading.Lock()


def get_context(backend="auto", device=None):
    """The shared context of (backend, device), made on first use and kept for the process.

    "auto" resolves once (cuda:0 when there is a GPU, else sim) and is then the same object as
    the context it resolved to."""
    key = (backend, device)
    with _cache_lock:
        ctx = _cache.get(key)
        if ctx is None or ctx.closed:
            ctx = Context(backend, device)
            resolved = (ctx.backend, ctx.device)
            if resolved != key and resolved in _cache and not _cache[resolved].closed:
                ctx.close()
                ctx = _cache[resolved]
            _cache[key] = _cache[resolved] = ctx
    return ctx
