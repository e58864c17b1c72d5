"""Expert tensors as serving engines hold them, made up here (numpy), and a numpy reference of
what the experts compute on them (SPEC's NVFP4 formulas, written out apart from moejit's C).

make_engine(...) -> dict of the eight tensors SGLang's / vLLM's ModelOpt NVFP4 MoE layers keep
(w13 [gate; up] or [up; gate], block scales linear or swizzled as SGLang's swizzle_blockscale
does it), plus the natural weights reference() reads. reference(...) -> float32 [T, H]:
sum over each token's (id, weight) of weight * w2 . bf16(silu(gate . x) * (up . x)), the W4A16
path (bf16 activations between the GEMMs, as the kernels round them).
"""
import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def e4m3(b):
    b = np.asarray(b, np.int64)
    e, m = (b >> 3) & 15, b & 7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))


def dequant(codes, scales, ws2):
    """[N, K/2] codes, [N, K/16] scales -> [N, K] float64."""
    lo, hi = codes & 15, codes >> 4
    q = np.stack([E2M1[lo], E2M1[hi]], -1).reshape(codes.shape[0], -1)
    return q * np.repeat(e4m3(scales), 16, axis=1) * ws2


def rup(v, m):
    return (v + m - 1) // m * m


def swizzle(lin):
    """SGLang's swizzle_blockscale of [E, M, K] scales: pad to 128 / 4, reshape, permute."""
    E, M, K = lin.shape
    Mp, Kp = rup(M, 128), rup(K, 4)
    p = np.zeros((E, Mp, Kp), lin.dtype)
    p[:, :M, :K] = lin
    return np.ascontiguousarray(p.reshape(E, Mp // 128, 4, 32, Kp // 4, 4).transpose(0, 1, 4, 3, 2, 5)).reshape(E, Mp, Kp)


def make_engine(rng, E, H, I, *, E_global=None, expert_begin=0, up_first=False, swizzled=False, reciprocal=False):
    E_global = E if E_global is None else E_global
    gate = rng.integers(0, 256, (E, I, H // 2), dtype=np.uint8)
    up = rng.integers(0, 256, (E, I, H // 2), dtype=np.uint8)
    w2 = rng.integers(0, 256, (E, H, I // 2), dtype=np.uint8)
    # block scales: e4m3 bytes of 0.25 .. 2 (exponents 5..8), a few zero blocks
    sg = rng.integers(0x28, 0x48, (E, I, H // 16), dtype=np.uint8)
    su = rng.integers(0x28, 0x48, (E, I, H // 16), dtype=np.uint8)
    s2 = rng.integers(0x28, 0x48, (E, H, I // 16), dtype=np.uint8)
    sg[:, 0, 0] = 0
    ws13 = (rng.uniform(0.5, 1.5, E) * 1e-2).astype(np.float32)
    ws2 = (rng.uniform(0.5, 1.5, E) * 1e-2).astype(np.float32)
    in13 = np.full((E_global, 2), 1e3, np.float32)   # other ranks' rows: far off
    in2 = np.full(E_global, 1e3, np.float32)
    in13[expert_begin:expert_begin + E] = rng.uniform(0.01, 0.02, (E, 1)).astype(np.float32)
    in2[expert_begin:expert_begin + E] = rng.uniform(0.01, 0.02, E).astype(np.float32)
    first, second = (up, gate) if up_first else (gate, up)
    sfirst, ssecond = (su, sg) if up_first else (sg, su)
    w13 = np.ascontiguousarray(np.concatenate([first, second], 1))
    s13 = np.ascontiguousarray(np.concatenate([sfirst, ssecond], 1))
    t = dict(w13_weight=w13, w13_weight_scale=swizzle(s13) if swizzled else s13,
             w13_weight_scale_2=np.ascontiguousarray(np.stack([ws13, ws13], 1)),
             w2_weight=w2, w2_weight_scale=swizzle(s2) if swizzled else s2, w2_weight_scale_2=ws2,
             w13_input_scale=in13, w2_input_scale=in2)
    if reciprocal:
        for k in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"):
            t[k] = (1.0 / t[k]).astype(np.float32)
    # copies: an in-place adoption repacks the engine's arrays
    nat = dict(gate=gate, up=up, w2=w2.copy(), sg=sg, su=su, s2=s2.copy(), ws13=ws13, ws2=ws2)
    return t, nat


def routing(rng, T, k, E, n_valid=None, rsf=2.5):
    """ids [T, k] int32 (local, -1 in random slots and in padding rows), weights f32 with rsf."""
    n_valid = T if n_valid is None else n_valid
    ids = np.full((T, k), -1, np.int32)
    for t in range(n_valid):
        chosen = rng.permutation(E)[:k]
        keep = rng.random(k) < 0.8
        ids[t, keep] = chosen[keep]
    w = (rng.uniform(0.05, 1.0, (T, k)) * rsf).astype(np.float32)
    return ids, w


def bf16_round(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def reference(nat, x, ids, w):
    """x float32 [T, H] (bf16 values) -> float32 [T, H]."""
    T, H = x.shape
    out = np.zeros((T, H), np.float64)
    for e in np.unique(ids[ids >= 0]):
        g = dequant(nat["gate"][e], nat["sg"][e], nat["ws13"][e])
        u = dequant(nat["up"][e], nat["su"][e], nat["ws13"][e])
        d = dequant(nat["w2"][e], nat["s2"][e], nat["ws2"][e])
        rows, slots = np.nonzero(ids == e)
        xs = x[rows].astype(np.float64)
        a, b = xs @ g.T, xs @ u.T
        act = bf16_round((a / (1 + np.exp(-a)) * b).astype(np.float32)).astype(np.float64)
        out[rows] += w[rows, slots][:, None] * (act @ d.T)
    return out.astype(np.float32)
