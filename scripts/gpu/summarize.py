#!/usr/bin/env python3
"""summarize.py — run.sh's last step: results.json and summary.txt under OUT, and a short
table printed last. Exit 0 when every check passed, 1 otherwise (a goal missed is reported,
not a failure: goals are targets, checks are correctness). On a GPU machine (--gpu 1) a step
that skipped is a failure (a GPU test that saw no GPU, test_nccl without NCCL: the machine has
it from pip), and so is a bench whose bench.json measured no GPU ("gpu": null); the torch
baseline's skip is not when its torch.json says why ({"skipped": "no numpy ..."}), shown."""
import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": "%s: %s" % (path, e)} if os.path.exists(path) else None


def model_rows(bench):
    """The performance model (bench --predict, in bench.json when run.sh named the GPU) beside
    what the GPU measured, at each (B, k0) of both, W4A16: the routing (router GEMM and
    oea_route), the experts (quant, up, down) and the layer (its graph replay against the
    model's kernels one after another, each with its launch), in us, and measured / predicted."""
    g, p = bench.get("gpu") or {}, bench.get("predict") or {}
    if not g or not p.get("rows"):
        return []

    def meas(table, key, what=None):
        for r in g.get(table, []):
            if (r["B"], r["k0"]) == key and (what is None or r.get("what") == what) and r.get("mode", "W4A16") == "W4A16":
                return r
        return None

    out = []
    for r in p["rows"]:
        if r.get("mode") != "W4A16":
            continue
        key, k = (r["B"], r["k0"]), r["kernels"]
        pred = {"routing": sum(k[n]["predicted_us"] for n in ("router_gemm", "oea_route") if n in k),
                "experts": sum(v["predicted_us"] for n, v in k.items() if n.startswith("experts")),
                "layer": r["layer"]["predicted_us"]}
        got = {"routing": meas("routing", key), "experts": meas("experts", key),
               "layer": meas("layer", key, "layer_graph")}
        row = {"B": key[0], "k0": key[1], "active_measured": (got["experts"] or {}).get("active"),
               "active_model": r.get("active"), "bounds": {n: v["bound"] for n, v in k.items()}}
        for n in pred:
            m = got[n]["us"] if got[n] else None
            row[n] = {"measured_us": m, "predicted_us": pred[n],
                      "measured_over_predicted": m / pred[n] if m is not None and pred[n] > 0 else None}
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", required=True)
    ap.add_argument("--gpu", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--elapsed", type=int, default=0)
    a = ap.parse_args()
    steps = []
    with open(a.steps) as f:
        for line in f:
            name, status, rc, secs, limit = line.rstrip("\n").split("\t")
            steps.append({"step": name, "status": status, "exit": rc, "seconds": int(secs), "limit": limit})
    bench = load(os.path.join(a.out, "bench.json"))
    torch = load(os.path.join(a.out, "torch.json"))
    failed = []
    skipped = {}  # step -> why, for a skip that is not a failure
    torch_skip = (torch or {}).get("skipped")
    for s in steps:
        st, name = s["status"], s["step"]
        if st in ("fail", "timeout", "no-time"):
            failed.append(name)
        elif st == "skip" and a.gpu and name == "torch" and torch_skip:
            skipped[name] = torch_skip  # the baseline could not run here, and said why
        elif st == "skip" and a.gpu:
            failed.append(name)  # a GPU test that saw no GPU (or test_nccl no NCCL) on a GPU machine
        elif st == "skip" and name == "torch" and torch_skip:
            skipped[name] = torch_skip
    ran_bench = any(s["step"] == "bench" and s["status"] == "pass" for s in steps)
    if a.gpu and ran_bench and not (isinstance(bench, dict) and bench.get("gpu")):
        failed.append("bench")  # a bench on a GPU machine that measured no GPU ("gpu": null) did not do its job
    res = {"gpu": bool(a.gpu), "elapsed_s": a.elapsed, "budget_s": a.budget, "steps": steps,
           "failed": failed, "skipped": skipped, "passed": not failed}
    if bench and bench.get("gpu"):
        res["goals"] = bench["gpu"].get("goals")
        res["copy_gbps"] = bench["gpu"].get("copy", {}).get("gbps")
        res["device"] = bench["gpu"].get("device")
    if torch:
        res["torch_check"] = torch.get("check")
    model = model_rows(bench) if isinstance(bench, dict) else []
    if model:
        res["model"] = {"gpu": bench["predict"].get("gpu"), "active_from": bench["predict"].get("active_from"),
                        "rows": model}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)

    lines = []
    if not a.gpu:
        lines.append("no GPU: nothing was measured on a GPU; the parts that need none %s"
                     % ("passed" if not failed else "FAILED: " + ", ".join(failed)))
    else:
        lines.append("moejit on %s: %s" % (res.get("device", "a GPU"),
                                            "ALL CHECKS PASSED" if not failed else "FAILED: " + ", ".join(failed)))
    lines.append("steps: " + "  ".join("%s %s %ss" % (s["step"], s["status"], s["seconds"]) for s in steps))
    for name, why in skipped.items():
        lines.append("%s skipped: %s" % (name, why))
    if bench and bench.get("gpu"):
        g = bench["gpu"]
        copy = g.get("copy", {}).get("gbps", 0) or 0
        ex = {(r["B"], r["k0"]): r for r in g.get("experts", []) if r.get("mode") == "W4A16"}
        lay = {(r["B"], r["k0"]): r for r in g.get("layer", []) if r["what"] == "layer"}
        gra = {(r["B"], r["k0"]): r for r in g.get("layer", []) if r["what"] == "layer_graph"}
        tor = {(r["B"], r["k0"]): r for r in (torch or {}).get("rows", [])}
        lines.append("copy %.0f GB/s. us (weight GB/s as a fraction of copy); torch = PyTorch eager on the same weights"
                     % copy)
        lines.append("%4s %3s %16s %16s %16s %10s %8s" % ("B", "k0", "experts W4A16", "layer", "layer+graph",
                                                          "torch", "mj/torch"))
        for key in sorted(gra, key=lambda k: (k[1] * -1, k[0])):
            def cell(r):
                return "%7.1f (%5.2f)" % (r["us"], r["of_copy"]) if r else "%16s" % "-"
            t = tor.get(key)
            ratio = "%8.2f" % (gra[key]["us"] / t["us"]) if t and t.get("us") else "%8s" % "-"
            lines.append("%4d %3d %16s %16s %16s %10s %s" % (key[0], key[1], cell(ex.get(key)), cell(lay.get(key)),
                                                            cell(gra[key]), "%10.1f" % t["us"] if t else "-", ratio))
        goals = g.get("goals", {})
        for k, v in goals.items():
            lines.append("goal %s: %s (%s)" % (k, "met" if v.get("met") else "NOT met", v.get("goal")))
    if model:
        lines.append("the performance model (bench --predict %s, active experts from the %s) against the GPU, W4A16, "
                     "us measured / predicted (ratio)" % (res["model"]["gpu"], res["model"]["active_from"]))
        lines.append("%4s %3s %22s %22s %22s" % ("B", "k0", "routing", "experts", "layer (graph)"))
        for r in model:
            def mp(c):
                if c["measured_over_predicted"] is None:
                    return "%22s" % ("%s / %.1f" % ("-" if c["measured_us"] is None else "%.1f" % c["measured_us"],
                                                     c["predicted_us"]))
                return "%22s" % ("%.1f / %.1f (%.2f)" % (c["measured_us"], c["predicted_us"], c["measured_over_predicted"]))
            lines.append("%4d %3d %s %s %s" % (r["B"], r["k0"], mp(r["routing"]), mp(r["experts"]), mp(r["layer"])))
    if torch and torch.get("check"):
        c = torch["check"]
        lines.append("torch vs moejit output: %s" % json.dumps(c)[:300])
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
