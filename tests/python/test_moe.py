"""Moe: a checkpoint's layer through mj_moe_* on the interpreter, against the CPU reference
forward of the same layer (Layer.forward_ref = mj_moe_forward_ref), whole and split over
loopback ranks driven from Python threads."""
import threading
import time

import numpy as np
import pytest

import moejit
from conftest import SMALL

TOL = {"w4a16": 2e-3, "w4a4": 5e-2}   # the kernels' tolerance (relative L2), as tests/test_moe.c
JOIN_S = 120                           # a rank thread not done by then is a deadlock


def rel_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.fixture(scope="module")
def whole(checkpoint_dir):
    with moejit.Checkpoint(checkpoint_dir) as ck:
        layer = ck.load_layer(3)
    yield layer
    layer.close()


def test_checkpoint_and_config(checkpoint_dir):
    with moejit.Checkpoint(checkpoint_dir) as ck:
        assert ck.moe_layers == [3, 4]
        c = ck.config
        assert (c.hidden, c.intermediate, c.n_experts, c.topk) == (128, 128, 16, 4)
        assert c.scoring == "sigmoid" and c.quant == "nvfp4" and c.routed_scaling_factor == pytest.approx(2.5)
    assert ck.closed


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
def test_forward_matches_reference(mode, checkpoint_dir, whole, rng):
    B, nv = 4, 3
    x = rng.standard_normal((B, SMALL["hidden"])).astype(np.float32)
    with moejit.Moe(checkpoint_dir, 3, backend="sim", k0_policy="2", mode=mode) as moe:
        moe.prepare(batches=[B])
        assert moe.prepared_batches == (B,)
        assert moe.batch_plan(B) == (2, mode)
        y = moe.forward(x, num_valid=nv)
        assert y.dtype == np.float32 and y.shape == (B, SMALL["hidden"])
        ref = whole.forward_ref(x, nv, k0=2, mode=mode)
        e = rel_l2(y[:nv], ref[:nv])
        print("%s: relative L2 %.3g (tolerance %g)" % (mode, e, TOL[mode]))
        assert e <= TOL[mode]
        assert (y[nv:] == 0).all()
        r = moe.last_routing
        assert r.k0 == 2 and r.ids.shape == (B, SMALL["topk"])
        assert (r.n_sel[:nv] >= 2).all() and (r.n_sel[nv:] == 0).all() and (r.ids[nv:] == -1).all()
        assert r.unique_experts == len(np.unique(r.ids[r.ids >= 0]))


def test_forward_input_forms_agree(checkpoint_dir, rng):
    """float32 (rounded to bf16 on the way in), uint16 bf16 bits and a caller's out= give the
    same bits; a misaligned uint16 view is copied to an aligned buffer."""
    B, H = 2, SMALL["hidden"]
    x = rng.standard_normal((B, H)).astype(np.float32)
    bits = moejit.bf16_from_f32(x)
    np.testing.assert_array_equal(moejit.bf16_to_f32(bits), moejit.bf16_to_f32(moejit.bf16_from_f32(
        moejit.bf16_to_f32(bits))))
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[B]) as moe:
        assert moe.layer == 3
        a = moe.forward(x)
        b = moe.forward(bits)
        out = np.full((B, H), np.nan, dtype=np.float32)
        assert moe.forward(bits, out=out) is out
        raw = np.empty(B * H + 1, dtype=np.uint16)
        odd = raw[1:].reshape(B, H)
        odd[...] = bits
        c = moe.forward(odd)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, out)
    np.testing.assert_array_equal(a, c)


def _run_ranks(checkpoint_dir, split, n, x, nv):
    """n rank threads, each with its own Moe over loopback_comms(n)[rank]; returns the outputs
    and each rank's (start, end) of its forward."""
    comms = moejit.loopback_comms(n)
    outs, spans, errors = [None] * n, [None] * n, []
    barrier = threading.Barrier(n)

    def rank(r):
        try:
            with moejit.Moe(checkpoint_dir, 3, rank=r, comm=comms[r], backend="sim", k0_policy="2",
                            mode="w4a16", **{split: n}) as moe:
                moe.prepare(batches=[x.shape[0]])
                barrier.wait(timeout=JOIN_S)
                t0 = time.perf_counter()
                outs[r] = moe.forward(x, num_valid=nv)
                spans[r] = (t0, time.perf_counter())
        except BaseException as e:  # reported by the main thread
            errors.append((r, e))
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "rank threads still running after %d s: deadlock" % JOIN_S
    assert not errors, errors
    for c in comms:
        c.close()
    return outs, spans


@pytest.mark.parametrize("split", ["tp", "ep"])
def test_two_loopback_ranks_equal_the_whole_layer(split, checkpoint_dir, whole, rng):
    B, nv = 4, 4
    x = rng.standard_normal((B, SMALL["hidden"])).astype(np.float32)
    outs, spans = _run_ranks(checkpoint_dir, split, 2, x, nv)
    np.testing.assert_array_equal(outs[0], outs[1])   # the all-reduce gives every rank the same bits
    ref = whole.forward_ref(x, nv, k0=2, mode="w4a16")
    e = rel_l2(outs[0], ref)
    print("%s 2: relative L2 %.3g" % (split, e))
    assert e <= TOL["w4a16"]
    # Both ranks were inside their forward at once (the all-reduce waits for both, so a rank
    # holding the GIL through its C call would have hung the other).
    assert max(s[0] for s in spans) < min(s[1] for s in spans)


def test_comm_all_reduce_from_threads():
    """n loopback ranks summing from their own threads: rank order, every rank the same bits."""
    n, count = 3, 1000
    rng = np.random.default_rng(5)
    data = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    comms = moejit.loopback_comms(n)
    assert [(c.rank, c.n_ranks, c.kind) for c in comms] == [(r, n, "loopback") for r in range(n)]
    outs = [None] * n
    threads = [threading.Thread(target=lambda r=r: outs.__setitem__(r, comms[r].all_reduce(data[r])), daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    want = (data[0] + data[1]) + data[2]
    for o in outs:
        np.testing.assert_array_equal(o, want)
    for c in comms:
        c.close()


def test_bad_checkpoint_path_raises_with_c_message(tmp_path):
    missing = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(moejit.MoejitError) as e:
        moejit.Moe(missing, backend="sim")
    assert e.value.function == "mj_checkpoint_open"
    assert missing in e.value.message and missing in str(e.value)
    assert e.value.status_name.startswith("MJ_ERR_")


def test_unprepared_batch_raises_with_c_message(checkpoint_dir, rng):
    x = rng.standard_normal((3, SMALL["hidden"])).astype(np.float32)
    with moejit.Moe(checkpoint_dir, backend="sim", batches=[2]) as moe:
        with pytest.raises(moejit.MoejitError) as e:
            moe.forward(x)
        assert e.value.function == "mj_moe_forward"
        assert e.value.status_name == "MJ_ERR_INVALID_ARG"
        assert "3" in e.value.message and "prepare" in e.value.message


def test_handles_close_once_and_keep_deps(checkpoint_dir):
    comms = moejit.loopback_comms(1)
    moe = moejit.Moe(checkpoint_dir, backend="sim", tp=1, comm=comms[0], batches=[1])
    with pytest.raises(RuntimeError, match="still used"):
        comms[0].close()          # the Moe still needs it
    moe.close()
    moe.close()                   # idempotent
    assert moe.closed
    with pytest.raises(ValueError, match="closed"):
        moe.forward(np.zeros((1, SMALL["hidden"]), np.float32))
    comms[0].close()
    assert comms[0].closed


def test_handles_freed_once_by_close_or_collection(checkpoint_dir, monkeypatch):
    import gc
    from moejit import _lib
    freed = []
    for name in ("mj_moe_free", "mj_checkpoint_close", "mj_layer_free"):
        real = getattr(_lib.C, name)
        monkeypatch.setattr(_lib.C, name, lambda p, _r=real, _n=name: (freed.append((_n, p)), _r(p))[1])
    moe = moejit.Moe(checkpoint_dir, backend="sim")      # loads (then frees) a layer, opens/closes the checkpoint
    assert sorted(n for n, _ in freed) == ["mj_checkpoint_close", "mj_layer_free"]
    # Count only the frees after each handle was made: malloc may hand a new handle the
    # address of one freed before it (the checkpoint Moe() opened and closed).
    ptr, n0 = moe._ptr, len(freed)
    moe.close()
    del moe
    gc.collect()
    assert freed[n0:].count(("mj_moe_free", ptr)) == 1    # close(), and not again on collection
    ck = moejit.Checkpoint(checkpoint_dir)
    ptr, n0 = ck._ptr, len(freed)
    del ck                                               # never closed: freed when collected
    gc.collect()
    assert freed[n0:].count(("mj_checkpoint_close", ptr)) == 1
