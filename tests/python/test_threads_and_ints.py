"""The binding under threads and hostile arguments: one object used from several threads
(calls serialized, close() waiting for calls in flight), integers that do not fit the C
types they go to, NUL bytes in paths, last_routing after prepare(), and the texts of the
refusals of arrays C cannot read."""
import threading
import time

import numpy as np
import pytest

import moejit
from moejit import _lib
from conftest import SMALL

JOIN_S = 120


def _slow(monkeypatch, name, state, delay=0.3):
    """Replace C function `name` by one that marks `state` busy for `delay` seconds before
    calling it (so another thread's close() lands during the call), and refuses to call it
    once the handle was freed (the use-after-free a missing wait would be, made an error
    instead of a crash)."""
    real = getattr(_lib.C, name)

    def call(*a):
        state["inside"].set()
        state["active"] += 1
        state["max_active"] = max(state["max_active"], state["active"])
        try:
            time.sleep(delay)
            if state["freed"]:
                state["after_free"] += 1
                raise AssertionError("%s ran after its handle was freed" % name)
            return real(*a)
        finally:
            state["active"] -= 1
    monkeypatch.setattr(_lib.C, name, call)


def _watch_free(monkeypatch, name, state):
    real = getattr(_lib.C, name)

    def free(p):
        state["freed_while_active"] += state["active"]
        state["freed"] = True
        return real(p)
    monkeypatch.setattr(_lib.C, name, free)


def _state():
    return {"inside": threading.Event(), "active": 0, "max_active": 0, "freed": False, "after_free": 0,
            "freed_while_active": 0}


def _run_threads(fns):
    errs = [None] * len(fns)

    def wrap(i, f):
        try:
            f()
        except BaseException as e:  # noqa: B902 - reported below
            errs[i] = e
    ts = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_S)
        assert not t.is_alive(), "a thread did not finish in %d s" % JOIN_S
    return errs


# ---- close() from one thread while another is inside a call (issue 23, item 2) ---------------

def test_checkpoint_close_waits_for_load_layer(checkpoint_dir, monkeypatch):
    _lib.load()
    st = _state()
    _slow(monkeypatch, "mj_layer_load", st)
    _watch_free(monkeypatch, "mj_checkpoint_close", st)
    ck = moejit.Checkpoint(checkpoint_dir)
    got = {}

    def load():
        got["layer"] = ck.load_layer(3)

    def close():
        assert st["inside"].wait(JOIN_S)
        ck.close()
        got["closed_at_active"] = st["active"]
    errs = _run_threads([load, close])
    assert errs == [None, None], errs
    assert st["freed_while_active"] == 0 and st["after_free"] == 0
    assert got["closed_at_active"] == 0
    assert got["layer"].index == 3 and not got["layer"].closed   # the load finished, the layer is whole
    got["layer"].close()
    with pytest.raises(ValueError, match="checkpoint is closed"):
        ck.load_layer(3)


def test_context_close_while_a_moe_is_made_on_it(checkpoint_dir, monkeypatch, rng):
    """close() of a context from one thread while another builds a Moe on it: the close waits
    for mj_moe_create, then finds the new Moe using the context and refuses (it used to free
    the context under the new Moe, which kept the freed pointer)."""
    _lib.load()
    ctx = moejit.Context(backend="sim")
    st = _state()
    _slow(monkeypatch, "mj_moe_create", st)
    _watch_free(monkeypatch, "mj_context_destroy", st)
    got = {}

    def make():
        got["moe"] = moejit.Moe(checkpoint_dir, context=ctx, batches=[2])

    def close():
        assert st["inside"].wait(JOIN_S)
        try:
            ctx.close()
            got["closed"] = True
        except RuntimeError as e:
            got["refused"] = str(e)
    errs = _run_threads([make, close])
    assert errs == [None, None], errs
    assert "closed" not in got and "still used" in got["refused"], got
    assert not st["freed"] and not ctx.closed
    x = rng.standard_normal((2, SMALL["hidden"])).astype(np.float32)
    assert np.isfinite(got["moe"].forward(x)).all()   # the context it holds is alive
    got["moe"].close()
    ctx.close()
    assert ctx.closed and st["freed"]


def test_moe_close_waits_for_forward(checkpoint_dir, monkeypatch, rng):
    x = rng.standard_normal((2, SMALL["hidden"])).astype(np.float32)
    with moejit.Checkpoint(checkpoint_dir) as ck, ck.load_layer(3) as L:
        want = L.forward_ref(x)
    moe = moejit.Moe(checkpoint_dir, backend="sim", batches=[2])
    st = _state()
    _slow(monkeypatch, "mj_moe_forward", st)
    _watch_free(monkeypatch, "mj_moe_free", st)
    got = {}

    def fwd():
        got["y"] = moe.forward(x)

    def close():
        assert st["inside"].wait(JOIN_S)
        moe.close()
    errs = _run_threads([fwd, close])
    assert errs == [None, None], errs
    assert st["freed_while_active"] == 0 and st["after_free"] == 0
    assert float(np.linalg.norm(got["y"] - want) / np.linalg.norm(want)) < 2e-3
    assert moe.closed
    with pytest.raises(ValueError, match="Moe is closed"):
        moe.forward(x)


def test_close_from_many_threads_while_forwarding(checkpoint_dir, rng):
    """No monkeypatching: forwards in a loop on one thread, close() on another, for real. The
    forward thread ends with 'closed' (never a crash), every output it got is right."""
    x = rng.standard_normal((2, SMALL["hidden"])).astype(np.float32)
    with moejit.Checkpoint(checkpoint_dir) as ck, ck.load_layer(3) as L:
        want = L.forward_ref(x)
    for _ in range(3):
        moe = moejit.Moe(checkpoint_dir, backend="sim", batches=[2])
        outs, started = [], threading.Event()

        def loop():
            while True:
                try:
                    outs.append(moe.forward(x))
                except ValueError as e:
                    assert "closed" in str(e)
                    return
                started.set()

        def close():
            assert started.wait(JOIN_S)
            moe.close()
        errs = _run_threads([loop, close])
        assert errs == [None, None], errs
        assert outs and all(float(np.linalg.norm(y - want) / np.linalg.norm(want)) < 2e-3 for y in outs)


# ---- two threads calling forward() on one Moe (issue 23, item 5) ------------------------------

def test_forward_from_two_threads_is_serialized(checkpoint_dir, monkeypatch, rng):
    xs = [rng.standard_normal((2, SMALL["hidden"])).astype(np.float32) for _ in range(2)]
    with moejit.Checkpoint(checkpoint_dir) as ck, ck.load_layer(3) as L:
        wants = [L.forward_ref(x) for x in xs]
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        st = _state()
        _slow(monkeypatch, "mj_moe_forward", st, delay=0.05)
        results = [[], []]

        def worker(i):
            def run():
                for _ in range(6):
                    results[i].append(moe.forward(xs[i]))
            return run
        errs = _run_threads([worker(0), worker(1)])
        assert errs == [None, None], errs
        assert st["max_active"] == 1           # never two forwards of one Moe in C at once
        for i in range(2):
            assert len(results[i]) == 6
            for y in results[i]:
                assert float(np.linalg.norm(y - wants[i]) / np.linalg.norm(wants[i])) < 2e-3


def test_forward_from_two_threads_real(checkpoint_dir, rng):
    """The same without a slowed C call: each thread gets its own input's output, every time."""
    xs = [rng.standard_normal((2, SMALL["hidden"])).astype(np.float32) for _ in range(2)]
    with moejit.Checkpoint(checkpoint_dir) as ck, ck.load_layer(3) as L:
        wants = [L.forward_ref(x) for x in xs]
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        bad = [0, 0]

        def worker(i):
            def run():
                for _ in range(6):
                    y = moe.forward(xs[i])
                    bad[i] += float(np.linalg.norm(y - wants[i]) / np.linalg.norm(wants[i])) >= 2e-3
            return run
        errs = _run_threads([worker(0), worker(1)])
        assert errs == [None, None], errs
        assert bad == [0, 0]


# ---- integers that do not fit, NUL in paths (issue 23, item 6) --------------------------------

BIG = [2 ** 32 + 3, 2 ** 31, -2 ** 31 - 1, 2 ** 63 + 1]


@pytest.mark.parametrize("v", BIG)
def test_ints_out_of_range_refused_before_c(checkpoint_dir, v):
    with moejit.Checkpoint(checkpoint_dir) as ck:
        with pytest.raises(ValueError, match="layer"):
            ck.load_layer(v)
        with ck.load_layer(3) as L:
            x = np.zeros((1, SMALL["hidden"]), np.float32)
            with pytest.raises(ValueError, match="k0"):
                L.forward_ref(x, k0=v)
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        with pytest.raises(ValueError, match="batch"):
            moe.prepare(batches=[v])
        with pytest.raises(ValueError, match="max_batch"):
            moe.prepare(max_batch=v)
        with pytest.raises(ValueError, match="batch"):
            moe.batch_plan(v)
        assert moe.prepared_batches == (2,)      # a refused prepare changed nothing
        assert moe.batch_plan(2)[0] == SMALL["topk"]


def test_wrapped_values_do_not_alias(checkpoint_dir):
    """The issue's cases, each of which used to act on the value modulo 2**32."""
    with moejit.Checkpoint(checkpoint_dir) as ck:
        with pytest.raises(ValueError):
            ck.load_layer(2 ** 32 + 3)             # was layer 3
        with ck.load_layer(3) as L:
            with pytest.raises(ValueError):
                L.forward_ref(np.zeros((1, SMALL["hidden"]), np.float32), k0=2 ** 32 + 2)   # was k0 2
    with moejit.Moe(checkpoint_dir, backend="sim") as moe:
        with pytest.raises(ValueError):
            moe.prepare(batches=[2 ** 32 + 8])     # prepared 8, reported 4294967304
        assert moe.prepared_batches == ()
        moe.prepare(batches=[4])
        with pytest.raises(ValueError):
            moe.batch_plan(2 ** 32 + 4)           # answered for 4


def test_every_c_int_argument_is_range_checked(monkeypatch):
    """The backstop under every call site: an int argument that does not fit its C type is
    refused by the prototype's wrapper, before C."""
    _lib.load()
    with pytest.raises(ValueError, match="mj_k0_policy_resolve.*4294967297.*int32"):
        _lib.C.mj_k0_policy_resolve(None, 2 ** 32 + 1, None)
    with pytest.raises(ValueError, match="NUL"):
        _lib.C.mj_checkpoint_open(b"/tmp\0/x", None)


@pytest.mark.parametrize("bad", ["DIR\0/x", b"DIR\0/x"])
def test_nul_in_paths_refused(checkpoint_dir, tmp_path, bad):
    if isinstance(bad, str):
        bad = bad.replace("DIR", checkpoint_dir)
    else:
        bad = bad.replace(b"DIR", checkpoint_dir.encode())
    with pytest.raises(ValueError, match="NUL"):
        moejit.Checkpoint(bad)                   # opened DIR before
    with pytest.raises(ValueError, match="NUL"):
        moejit.Moe(bad, backend="sim")
    cfg = checkpoint_dir + "/config.json\0junk"
    with pytest.raises(ValueError, match="NUL"):
        moejit.MoeConfig.read(cfg)
    with pytest.raises(ValueError, match="NUL"):
        moejit.make_checkpoint(cfg, str(tmp_path / "out"), plan_only=True)
    with pytest.raises(ValueError, match="NUL"):
        moejit.Context("sim", cache_dir=str(tmp_path) + "\0x")


# ---- last_routing after prepare() (issue 23, item 7) -------------------------------------------

def test_last_routing_after_prepare_raises(checkpoint_dir, rng):
    x = rng.standard_normal((2, SMALL["hidden"])).astype(np.float32)
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        moe.forward(x)
        r = moe.last_routing
        assert int(r.n_active[0]) > 0 and (r.ids[:, 0] >= 0).all() and r.k0 == SMALL["topk"]
        moe.prepare(batches=[2], k0_policy="2")
        with pytest.raises(ValueError, match="prepare"):
            moe.last_routing
        moe.forward(x)
        r = moe.last_routing
        assert int(r.n_active[0]) > 0 and (r.ids[:, 0] >= 0).all() and r.k0 == 2


# ---- the refusal texts (issue 23, item 13) ------------------------------------------------------

def test_non_contiguous_and_misaligned_texts(checkpoint_dir):
    H = SMALL["hidden"]
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        strided = np.zeros((4, H), np.float32)[::2]
        with pytest.raises(ValueError) as e:
            moe.forward(strided)
        assert str(e.value) == ("hidden is not contiguous (row-major); pass np.ascontiguousarray(hidden)")
        raw = np.zeros(2 * H * 4 + 1, np.uint8)
        misaligned = raw[1:].view(np.float32).reshape(2, H)
        assert misaligned.flags.c_contiguous and not misaligned.flags.aligned
        with pytest.raises(ValueError) as e:
            moe.forward(misaligned)
        msg = str(e.value)
        assert "not contiguous" not in msg
        assert msg == ("hidden is not aligned to its dtype (its data starts at an odd address); pass a copy: "
                       "hidden.copy()")
