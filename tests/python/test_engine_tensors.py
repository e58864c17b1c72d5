"""engine_tensors.py is the engines' side of the adoption tests (their tensors and a numpy
reference): its pieces checked here against facts stated apart from it, so that a mistake in
it cannot hide by agreeing with moejit (the E2M1 and E4M3 encodings from their bit fields, the
CUTLASS 128x4 scale layout from its byte formula, bf16 rounding's ties, the engine layouts)."""
import numpy as np

from engine_tensors import E2M1, bf16_round, dequant, e4m3, make_engine, reference, routing, swizzle


def test_e2m1_and_e4m3_tables():
    for c in range(16):  # sign, 2 exponent bits (bias 1), 1 mantissa bit
        s, e, m = c >> 3, (c >> 1) & 3, c & 1
        v = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        assert E2M1[c] == (-v if s else v) and np.signbit(E2M1[c]) == bool(s), c
    known = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x38: 1.0, 0x3C: 1.5, 0x7E: 448.0}
    for b, v in known.items():
        assert e4m3(b) == v, hex(b)


def test_dequant_low_nibble_first():
    codes = np.zeros((1, 8), np.uint8)
    codes[0, 0] = 0x21           # element 0: code 1 (0.5), element 1: code 2 (1.0)
    codes[0, 7] = 0xF0           # element 14: 0, element 15: code 15 (-6)
    scales = np.array([[0x38]], np.uint8)  # 1.0
    d = dequant(codes, scales, 2.0)
    assert d.shape == (1, 16)
    assert d[0, 0] == 1.0 and d[0, 1] == 2.0 and d[0, 14] == 0.0 and d[0, 15] == -12.0
    assert np.count_nonzero(d) == 3


def test_swizzle_is_the_cutlass_128x4_layout():
    rng = np.random.default_rng(5)
    for M, K in ((256, 8), (130, 6), (16, 3)):
        lin = rng.integers(1, 256, (2, M, K), dtype=np.uint8)
        sw = swizzle(lin)
        Mp, Kp = (M + 127) // 128 * 128, (K + 3) // 4 * 4
        assert sw.shape == (2, Mp, Kp)
        flat = sw.reshape(2, -1)
        want = np.zeros_like(flat)
        for m in range(M):
            for k in range(K):
                off = ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
                want[:, off] = lin[:, m, k]
        assert np.array_equal(flat, want), (M, K)   # the padding is 0


def test_bf16_round_ties_to_even():
    x = np.array([1.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -7 + 2.0 ** -20, -2.5], np.float32)
    want = np.array([1.0, 1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7, -2.5], np.float32)
    assert np.array_equal(bf16_round(x), want)


def test_engine_layouts():
    rng = np.random.default_rng(6)
    E, H, I = 3, 64, 32
    for up_first in (False, True):
        t, nat = make_engine(rng, E, H, I, up_first=up_first, E_global=5, expert_begin=1)
        first, second = (nat["up"], nat["gate"]) if up_first else (nat["gate"], nat["up"])
        assert np.array_equal(t["w13_weight"][:, :I], first) and np.array_equal(t["w13_weight"][:, I:], second)
        sfirst = nat["su"] if up_first else nat["sg"]
        assert np.array_equal(t["w13_weight_scale"][:, :I], sfirst)
        assert t["w13_input_scale"].shape == (5, 2) and t["w2_input_scale"].shape == (5,)
        assert (t["w13_input_scale"][1:4] < 1).all() and (t["w13_input_scale"][[0, 4]] == 1e3).all()
    # a zero block scale in every expert's gate (row 0, block 0): its 16 values dequantize to 0
    t, nat = make_engine(rng, E, H, I)
    assert (nat["sg"][:, 0, 0] == 0).all() and (t["w13_weight_scale"][:, 0, 0] == 0).all()
    assert (dequant(nat["gate"][0], nat["sg"][0], 1.0)[0, :16] == 0).all()
    t, _ = make_engine(rng, E, H, I, swizzled=True)
    assert t["w13_weight_scale"].shape == (E, 128, H // 16 + (-(H // 16)) % 4)
    t1, _ = make_engine(np.random.default_rng(7), E, H, I)
    tr, _ = make_engine(np.random.default_rng(7), E, H, I, reciprocal=True)
    for k in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"):
        assert np.allclose(tr[k] * t1[k], 1.0, rtol=1e-6), k


def test_routing_and_reference():
    rng = np.random.default_rng(8)
    E, H, I, T, k = 4, 64, 32, 6, 2
    ids, w = routing(rng, T, k, E, n_valid=4)
    assert (ids[4:] == -1).all() and ((ids >= -1) & (ids < E)).all()
    # weights uniform in [0.05, 1) times the routed scaling factor (2.5)
    _, wide = routing(np.random.default_rng(11), 64, 4, 8)
    assert wide.dtype == np.float32 and 0.05 * 2.5 <= wide.min() and wide.max() < 2.5 and wide.max() > 1.0
    for row in ids:
        got = row[row >= 0]
        assert len(set(got)) == len(got)
    # valid rows keep most slots and leave some empty (-1), which the adoption tests rely on
    many, _ = routing(np.random.default_rng(9), 64, 4, 8)
    empty = (many == -1).mean()
    assert 0.05 < empty < 0.4, empty
    _, nat = make_engine(rng, E, H, I)
    x = bf16_round(rng.standard_normal((T, H)).astype(np.float32))
    y = reference(nat, x, ids, w)
    assert y.shape == (T, H) and (y[4:] == 0).all() and np.abs(y[:4]).max() > 0
    # linear in the weights, and one token's row depends on its own experts alone
    assert np.allclose(reference(nat, x, ids, 2 * w), 2 * y, rtol=1e-6, atol=1e-6)
    one = np.full_like(ids, -1)
    one[0] = ids[0]
    assert np.allclose(reference(nat, x, one, w)[0], y[0], rtol=1e-6, atol=1e-6)


def test_reference_rounds_the_activations_to_bf16():
    # w2 dequantizes to a selection (code 2 = 1.0 at w2[h, h], scale 1.0, ws2 1.0), so each
    # output is a weight of 1 times one intermediate activation, which the W4A16 path holds
    # in bf16: every output must be a bf16 value (low 16 bits 0), whatever x, gate and up are
    rng = np.random.default_rng(10)
    H = I = 32
    _, nat = make_engine(rng, 1, H, I)
    w2 = np.zeros((1, H, I // 2), np.uint8)
    for h in range(H):
        w2[0, h, h // 2] = 2 << (4 * (h & 1))
    nat.update(w2=w2, s2=np.full((1, H, I // 16), 0x38, np.uint8), ws2=np.ones(1, np.float32))
    x = bf16_round(rng.standard_normal((3, H)).astype(np.float32))
    ids, w = np.zeros((3, 1), np.int32), np.ones((3, 1), np.float32)
    y = reference(nat, x, ids, w)
    assert np.abs(y).max() > 0
    assert (y.view(np.uint32) & 0xFFFF == 0).all(), "activations between the GEMMs are bf16"
