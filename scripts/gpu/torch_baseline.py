#!/usr/bin/env python3
"""torch_baseline.py — what a user would otherwise run for the same MoE layer, in PyTorch, on
the same weights, timed the same way as `moejit bench`, and checked against moejit's output.

The layer is read from the checkpoint `moejit make-checkpoint` wrote (our own minimal
safetensors reader: the JSON header, then raw bytes; F8_E4M3 and U8 block scales alike), its
NVFP4 experts dequantized to bf16 once on the GPU. Each step is then what Hugging Face /
SGLang's plain PyTorch path does: the router in fp32 (F.linear on the hidden states in fp32),
noaux_tc routing with its own torch implementation (sigmoid, + e_score_correction_bias for
selection, group limit, top-k; OEA with k0 < top-k: each token's first k0, then the rest of
its ranking only where some token's first k0 already has the expert), then per active expert
torch matmuls in bf16 (gate/up, SwiGLU, down) and the weighted sum in fp32, plus the shared
expert. Timed with CUDA events after a warm-up, the median of --iters calls, rotating 4 input
sets, for B in --batches x k0 in --k0. The check: one batch through `moejit run --backend cuda`
(plain top-k and OEA k0 = 4) against this implementation, relative L2 (<= 2e-2: bf16
dequantized weights against moejit's exact NVFP4 products).

--numpy runs the same function on the CPU in numpy (float64) instead, for a small checkpoint:
what the machine without a GPU checks (against `moejit run --backend sim`).
--probe only says whether torch and a CUDA device are there (exit 77 when not); it needs no
numpy. The rest needs numpy, which `pip install torch` does not bring: without it the run is
skipped (exit 77), and the reason written to --out as {"skipped": ...} for summarize.py.
The timings are cold-L2, as moejit bench's: before each timed call (before its first event) a
buffer of twice the L2 is zeroed, so the weights come from DRAM, not from the last call's L2.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:  # torch alone does not bring numpy: --probe works without it, the rest says so
    np = None

NO_NUMPY = "no numpy (pip install numpy: torch does not bring it)"


def e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


if np is not None:
    E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    E4M3 = e4m3_table()


# ---- the checkpoint: our own minimal safetensors reader ------------------------------------
class Checkpoint:
    def __init__(self, d):
        self.DT = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1),
                   "F16": (np.float16, 2), "I32": (np.int32, 4)}
        self.dir = d
        with open(os.path.join(d, "config.json")) as f:
            self.cfg = json.load(f)
        self.where = {}
        idx = os.path.join(d, "model.safetensors.index.json")
        files = [os.path.join(d, "model.safetensors")]
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted({os.path.join(d, v) for v in json.load(f)["weight_map"].values()})
        for path in files:
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                hdr = json.loads(f.read(n))
            for name, t in hdr.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + n, t)
        self.maps = {}

    def get(self, name):
        path, base, t = self.where[name]
        if path not in self.maps:
            self.maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        dt, size = self.DT[t["dtype"]]
        a, b = t["data_offsets"]
        raw = np.asarray(self.maps[path][base + a:base + b])
        return raw.view(dt).reshape(t["shape"] if t["shape"] else [1])

    def moe_layers(self):
        return sorted({int(k.split(".")[2]) for k in self.where if ".mlp.gate.weight" in k})


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):  # round to nearest even, as mj_f32_to_bf16
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u >> 16) & 1) + 0x7FFF
    return ((u + r) >> 16).astype(np.uint16)


# ---- the same function in numpy (float64): the check without a GPU -----------------------
def np_dequant(w, sc, s2):
    n = w.shape[0]
    q = np.stack([E2M1[w & 15], E2M1[w >> 4]], axis=-1).reshape(n, -1).astype(np.float64)
    return q * np.repeat(E4M3[sc].astype(np.float64), 16, axis=1) * float(s2[0])


def np_route(logits, bias, p, k0, nv):
    B, E = logits.shape
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    c = s + (bias if bias is not None else 0)
    if p["n_group"] > 1:
        g = c.reshape(B, p["n_group"], -1)
        gs = np.sort(g, axis=2)[:, :, -2:].sum(2)
        keep = np.argsort(-gs, axis=1, kind="stable")[:, :p["topk_group"]]
        mask = np.zeros_like(gs, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        c = np.where(np.repeat(mask, E // p["n_group"], axis=1), c, -np.inf)
    rank = np.argsort(-c, axis=1, kind="stable")
    k = p["topk"]
    sel = np.zeros((B, E), dtype=bool)
    base = np.zeros(E, dtype=bool)
    base[rank[:nv, :k0].ravel()] = True
    for t in range(nv):
        chosen = list(rank[t, :k0])
        for e in rank[t, k0:]:
            if len(chosen) >= k:
                break
            if base[e] and np.isfinite(c[t, e]):
                chosen.append(e)
        sel[t, chosen] = True
    w = np.where(sel, s, 0.0)
    if p["renorm"]:
        w = w / (w.sum(1, keepdims=True) + 1e-20)
    return sel, w * p["rsf"]


def np_layer(L, hidden_bits, k0, nv):
    x = bf16_to_f32(hidden_bits).astype(np.float64)
    logits = (x @ L["gate"].T).astype(np.float32)
    sel, w = np_route(logits, L["bias"], L["p"], k0, nv)
    out = np.zeros_like(x)
    xb = x
    for e in np.nonzero(sel.any(0))[0]:
        rows = np.nonzero(sel[:, e])[0]
        out[rows] += w[rows, e:e + 1] * np_expert(L["experts"][e], xb[rows], L["I"])
    out[:nv] += np_expert(L["shared"], xb[:nv], L["Is"])
    return out


def np_expert(ex, x, I):
    h = x @ ex[0].T
    a = h[:, :I] / (1 + np.exp(-h[:, :I])) * h[:, I:]
    a = bf16_to_f32(f32_to_bf16_bits(a.astype(np.float32))).astype(np.float64)  # bf16 between the GEMMs
    return a @ ex[1].T


# ---- the layer's tensors ----------------------------------------------------------------
def layer_params(ck):
    c = ck.cfg
    p = {"topk": c["num_experts_per_tok"], "n_group": c.get("n_group", 1) or 1,
         "topk_group": c.get("topk_group", 1) or 1, "rsf": float(c.get("routed_scaling_factor", 1.0)),
         "renorm": bool(c.get("norm_topk_prob", True))}
    if c.get("scoring_func", "sigmoid") != "sigmoid":
        raise SystemExit("torch_baseline: only sigmoid scoring (noaux_tc) is implemented")
    return p


def proj(ck, pre):
    return (ck.get(pre + ".weight"), ck.get(pre + ".weight_scale").view(np.uint8), ck.get(pre + ".weight_scale_2"))


def load_numpy(ck, layer):
    c = ck.cfg
    pre = "model.layers.%d.mlp." % layer
    E, I = c["n_routed_experts"], c["moe_intermediate_size"]
    L = {"p": layer_params(ck), "I": I, "Is": I * c.get("n_shared_experts", 1),
         "gate": bf16_to_f32(ck.get(pre + "gate.weight")).astype(np.float64)}
    bn = pre + "gate.e_score_correction_bias"
    L["bias"] = ck.get(bn).astype(np.float64) if bn in ck.where else None

    def one(q):
        g, u, d = (np_dequant(*proj(ck, q + n)) for n in ("gate_proj", "up_proj", "down_proj"))
        return (np.concatenate([g, u]), d)
    L["experts"] = [one(pre + "experts.%d." % e) for e in range(E)]
    L["shared"] = one(pre + "shared_experts.")
    return L


# ---- PyTorch on the GPU -----------------------------------------------------------------
def torch_layer_fn(torch, ck, layer, dev):
    F = torch.nn.functional
    c = ck.cfg
    pre = "model.layers.%d.mlp." % layer
    E, I = c["n_routed_experts"], c["moe_intermediate_size"]
    p = layer_params(ck)
    lut2 = torch.tensor(E2M1, device=dev)
    lut8 = torch.tensor(E4M3, device=dev)

    def deq(q):  # NVFP4 -> bf16, once
        w, sc, s2 = proj(ck, q)
        w = torch.from_numpy(np.ascontiguousarray(w)).to(dev)
        sc = torch.from_numpy(np.ascontiguousarray(sc)).to(dev)
        v = torch.stack([lut2[(w & 15).long()], lut2[(w >> 4).long()]], dim=-1).reshape(w.shape[0], -1)
        return (v * lut8[sc.long()].repeat_interleave(16, dim=1) * float(s2[0])).to(torch.bfloat16)

    w13 = [torch.cat([deq(pre + "experts.%d.gate_proj" % e), deq(pre + "experts.%d.up_proj" % e)]) for e in range(E)]
    w2 = [deq(pre + "experts.%d.down_proj" % e) for e in range(E)]
    s13 = torch.cat([deq(pre + "shared_experts.gate_proj"), deq(pre + "shared_experts.up_proj")])
    s2w = deq(pre + "shared_experts.down_proj")
    Is = s2w.shape[1]
    gate = torch.from_numpy(bf16_to_f32(ck.get(pre + "gate.weight"))).to(dev)  # fp32 router, as HF
    bn = pre + "gate.e_score_correction_bias"
    bias = torch.from_numpy(ck.get(bn).astype(np.float32)).to(dev) if bn in ck.where else None
    k = p["topk"]

    def route(logits, k0, nv):
        B = logits.shape[0]
        s = logits.sigmoid()
        cc = s + bias if bias is not None else s.clone()
        if p["n_group"] > 1:
            g = cc.view(B, p["n_group"], -1)
            gs = g.topk(2, dim=2).values.sum(2)
            keep = gs.topk(p["topk_group"], dim=1).indices
            m = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
            cc = cc.masked_fill(~m.repeat_interleave(E // p["n_group"], dim=1), float("-inf"))
        rank = torch.sort(cc, dim=1, descending=True, stable=True).indices
        sel = torch.zeros(B, E, dtype=torch.bool, device=dev)
        sel.scatter_(1, rank[:, :k0], True)
        if k0 < k:  # OEA: the rest of the ranking, only experts of S_base, until k
            base = torch.zeros(E, dtype=torch.bool, device=dev)
            base[rank[:nv, :k0].reshape(-1)] = True
            ok = base[rank[:, k0:]] & torch.isfinite(cc.gather(1, rank[:, k0:]))
            take = ok & (ok.cumsum(1) <= k - k0)
            sel.scatter_(1, rank[:, k0:], take)
        sel[nv:] = False
        w = s * sel
        if p["renorm"]:
            w = w / (w.sum(1, keepdim=True) + 1e-20)
        return sel, w * p["rsf"]

    def expert(x, a, b, n):
        h = x @ a.T
        return (F.silu(h[:, :n]) * h[:, n:]) @ b.T

    def layer(x, k0, nv):  # x [B, H] bf16 -> [B, H] f32
        logits = F.linear(x.float(), gate)
        sel, w = route(logits, k0, nv)
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=dev)
        active = sel.any(0).nonzero().flatten().tolist()  # the host waits here, as eager MoE does
        for e in active:
            rows = sel[:, e].nonzero().flatten()
            y = expert(x[rows], w13[e], w2[e], I).float()
            out.index_add_(0, rows, y * w[rows, e:e + 1])
        out[:nv] += expert(x[:nv], s13, s2w, Is).float()
        return out

    return layer


def moejit_run(moejit, ckdir, x_bits, k0, work, backend):
    xin, yout = os.path.join(work, "tb_x.npy"), os.path.join(work, "tb_y.npy")
    np.save(xin, bf16_to_f32(x_bits))
    cmd = [moejit, "run", "--checkpoint", ckdir, "--input", xin, "--output", yout, "--backend", backend,
           "--mode", "w4a16"]
    if k0:
        cmd += ["--k0", str(k0)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError("moejit run failed: " + r.stderr.strip()[-500:])
    return np.load(yout).astype(np.float64)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--moejit", help="the moejit command (for the check)")
    ap.add_argument("--out", help="the JSON results")
    ap.add_argument("--work", default="/tmp")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--k0", default="8,4")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--check-batch", type=int, default=16)
    ap.add_argument("--numpy", action="store_true", help="the check on the CPU in numpy (small checkpoints)")
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args()
    if not a.probe and np is None:
        print("torch_baseline: %s: skipped" % NO_NUMPY)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"skipped": NO_NUMPY}, f)
        return 77
    if a.probe or not a.numpy:
        try:
            import torch
        except ImportError:
            print("torch_baseline: no PyTorch here (python3 -c 'import torch' fails): skipped")
            return 77
        if not torch.cuda.is_available():
            print("torch_baseline: PyTorch %s sees no CUDA device: skipped" % torch.__version__)
            return 77
        if a.probe:
            print("torch_baseline: PyTorch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
            return 0
    if not a.checkpoint:
        ap.error("--checkpoint is needed")
    ck = Checkpoint(a.checkpoint)
    layer = ck.moe_layers()[0]
    H, E = ck.cfg["hidden_size"], ck.cfg["n_routed_experts"]
    k = ck.cfg["num_experts_per_tok"]
    rng = np.random.default_rng(7)
    res = {"checkpoint": a.checkpoint, "layer": layer, "hidden": H, "experts": E, "topk": k, "rows": []}
    Bc = a.check_batch
    xc = f32_to_bf16_bits(rng.standard_normal((Bc, H), dtype=np.float32))
    check = {"batch": Bc, "tolerance": 2e-2, "rel_l2": {}, "passed": True}
    if a.numpy:  # the function itself, on the CPU
        L = load_numpy(ck, layer)
        for k0 in (k, max(1, k // 2)):
            ours = np_layer(L, xc, k0, Bc)
            if a.moejit:
                mj = moejit_run(a.moejit, a.checkpoint, xc, k0 if k0 < k else 0, a.work, "sim")
                e = rel_l2(ours, mj)
                check["rel_l2"]["k0=%d" % k0] = e
                check["passed"] &= e <= check["tolerance"]
        res["check"] = check
        print(json.dumps(res["check"]))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
        return 0 if check["passed"] else 1

    import torch
    dev = torch.device("cuda")
    t0 = time.time()
    fn = torch_layer_fn(torch, ck, layer, dev)
    torch.cuda.synchronize()
    res["dequantize_s"] = time.time() - t0
    res["device"] = torch.cuda.get_device_name(0)
    res["torch"] = torch.__version__
    # The check against moejit's own output on the same batch.
    for k0 in (k, 4 if k > 4 else max(1, k // 2)):
        x = torch.from_numpy(xc.view(np.int16)).to(dev).view(torch.bfloat16)
        ours = fn(x, k0, Bc).cpu().numpy()
        if a.moejit:
            try:
                mj = moejit_run(a.moejit, a.checkpoint, xc, k0 if k0 < k else 0, a.work, "cuda")
                e = rel_l2(ours, mj)
                check["rel_l2"]["k0=%d" % k0] = e
                check["passed"] &= e <= check["tolerance"]
            except Exception as ex:  # recorded, and the check fails
                check["error"] = str(ex)
                check["passed"] = False
    res["check"] = check
    # Timing: events around each call, warm-up first, 4 rotating input sets.
    Bs = [int(b) for b in a.batches.split(",")]
    k0s = [int(v) for v in a.k0.split(",") if int(v) <= k]
    sets = [torch.from_numpy(f32_to_bf16_bits(rng.standard_normal((max(Bs), H), dtype=np.float32)).view(np.int16))
            .to(dev).view(torch.bfloat16) for _ in range(4)]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # Cold L2, as moejit bench: twice the L2 zeroed before each timed call, outside its events.
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (128 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    res["flush_bytes"] = 2 * l2
    print("torch: cold L2: %d MiB zeroed before each timed call, outside its events" % (2 * l2 >> 20))
    for k0 in k0s:
        for B in Bs:
            for i in range(3):
                fn(sets[i % 4][:B], k0, B)
            torch.cuda.synchronize()
            ts = []
            for i in range(a.iters):
                flush.zero_()
                e0.record()
                fn(sets[i % 4][:B], k0, B)
                e1.record()
                e1.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e3)
            ts.sort()
            res["rows"].append({"B": B, "k0": k0, "us": ts[len(ts) // 2]})
            print("torch B %3d k0 %d: %9.1f us" % (B, k0, ts[len(ts) // 2]))
    print("check: " + json.dumps(check))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if check["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
