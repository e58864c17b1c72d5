"""Owning a C handle: freed once, by close() (or a with block), else by __del__."""
import threading
import weakref


class Handle:
    """Base of every object that owns a C handle.

    close() frees it exactly once (a lock makes two threads closing at once free it once);
    using a closed object raises ValueError. Objects a handle depends on (its context, its
    communicator) are kept in _deps, so they outlive it; they in turn refuse close() while
    an open handle still uses them (_users), instead of pulling memory out from under it.
    """

    _free_name = None   # the C function that frees the handle
    _what = "handle"

    def __init__(self):
        self._ptr = None
        self._deps = ()
        self._users = weakref.WeakSet()
        self._close_lock = threading.Lock()

    def _adopt(self, ptr, deps=()):
        self._ptr = ptr
        self._deps = tuple(deps)
        for d in self._deps:
            d._users.add(self)

    @property
    def closed(self):
        return self._ptr is None

    def _handle(self):
        p = self._ptr
        if p is None:
            raise ValueError("this %s is closed" % self._what)
        return p

    def close(self):
        """Free the C handle now (idempotent)."""
        with self._close_lock:
            users = [u for u in list(self._users) if not u.closed]
            if self._ptr is not None and users:
                raise RuntimeError("this %s is still used by %d open object(s) (%s); close those first" %
                                   (self._what, len(users), ", ".join(sorted({u._what for u in users}))))
            ptr, self._ptr = self._ptr, None
        if ptr is not None:
            from ._lib import C
            getattr(C, self._free_name)(ptr)
            for d in self._deps:
                d._users.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A fallback: at interpreter shutdown the modules may be half gone; never raise here.
        try:
            if getattr(self, "_ptr", None) is not None:
                self.close()
        except Exception:
            pass
