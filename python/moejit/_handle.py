"""Owning a C handle: freed once, by close() (or a with block), else by __del__; never while
a call on it is in flight.

The threading rule of the binding (docs/python.md says it to users):
  - Every call that passes a handle to C holds it for the length of the call (_using):
    close() from another thread waits until those calls have returned, then frees it; calls
    that start after close() began raise ValueError ("... is closed").
  - Objects with per-call state (a Moe's workspace and last routing, a checkpoint's shard
    reads, a layer, a communicator rank) serialize their calls: a lock per object
    (@serialized), so two threads calling forward() on one Moe run one after the other and
    each gets its own output. For parallel forwards, give each thread its own Moe.
  - A Context is shared by every object of its (backend, device) and is not serialized (the
    JIT behind it is thread-safe); its close() still waits for calls in flight.
"""
import functools
import threading
import weakref


class Handle:
    """Base of every object that owns a C handle.

    close() frees it exactly once, after every call in flight on it has returned; using a
    closed object raises ValueError. Objects a handle depends on (its context, its
    communicator) are kept in _deps, so they outlive it; they in turn refuse close() while
    an open handle still uses them (_users), instead of pulling memory out from under it.
    """

    _free_name = None   # the C function that frees the handle
    _what = "handle"

    def __init__(self):
        self._ptr = None
        self._deps = ()
        self._users = weakref.WeakSet()
        self._state = threading.Condition(threading.Lock())
        self._busy = {}           # thread id -> calls of that thread in flight on this handle
        self._closing = False
        self._serial = threading.RLock()

    def _adopt(self, ptr, deps=()):
        self._ptr = ptr
        self._deps = tuple(deps)
        for d in self._deps:
            d._users.add(self)

    @property
    def closed(self):
        return self._ptr is None

    def _handle(self):
        """The C pointer, for a call made inside _using() / a @serialized method."""
        p = self._ptr
        if p is None:
            raise ValueError("this %s is closed" % self._what)
        return p

    def _using(self):
        """A with block during which the handle is not freed (close() waits for its end)."""
        return _Use(self)

    def close(self):
        """Free the C handle now (idempotent). Waits for calls other threads have in flight
        on this object; raises RuntimeError when called from inside one of this object's
        own calls, or while open objects still use this one."""
        me = threading.get_ident()
        with self._state:
            if self._ptr is None:
                return
            users = [u for u in list(self._users) if not u.closed]
            if users:
                raise RuntimeError("this %s is still used by %d open object(s) (%s); close those first" %
                                   (self._what, len(users), ", ".join(sorted({u._what for u in users}))))
            if self._busy.get(me):
                raise RuntimeError("close() of this %s from inside a call on it" % self._what)
            self._closing = True
            while self._busy and self._ptr is not None:
                self._state.wait()
            if self._ptr is None:
                return
            # A call that ended meanwhile may have made an object that uses this one (a Moe
            # built on this context or communicator): it holds the pointer now.
            users = [u for u in list(self._users) if not u.closed]
            if users:
                self._closing = False
                self._state.notify_all()
                raise RuntimeError("this %s is still used by %d open object(s) (%s), made while close() waited; "
                                   "close those first" % (self._what, len(users),
                                                          ", ".join(sorted({u._what for u in users}))))
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


class _Use:
    __slots__ = ("h", "me")

    def __init__(self, h):
        self.h = h

    def __enter__(self):
        h = self.h
        self.me = threading.get_ident()
        with h._state:
            if h._ptr is None or (h._closing and not h._busy.get(self.me)):
                raise ValueError("this %s is closed" % h._what)
            h._busy[self.me] = h._busy.get(self.me, 0) + 1
            return h._ptr

    def __exit__(self, *exc):
        h = self.h
        with h._state:
            n = h._busy[self.me] - 1
            if n:
                h._busy[self.me] = n
            else:
                del h._busy[self.me]
                if not h._busy:
                    h._state.notify_all()


def serialized(method):
    """One call at a time on this object (a lock per object), holding its handle throughout."""
    @functools.wraps(method)
    def call(self, *args, **kw):
        with self._serial, self._using():
            return method(self, *args, **kw)
    return call
