#!/usr/bin/env bash
# test_gpu_scripts.sh — scripts/gpu/ without a GPU: the scripts parse; a bundle laid out
# from this build (what bundle.sh packs, without its Release build and cache fill) passes
# run.sh --dry-run and, run without a GPU, says so, runs the parts that need none (the GPU
# tests skip with 77, their checks on the interpreter, a small bench, the torch probe),
# writes results under $OUT and exits 77; torch_baseline.py --numpy computes the same layer
# as `moejit run --backend sim`.
# usage: test_gpu_scripts.sh PATH/TO/moejit SOURCE_DIR BUILD_DIR [KERNEL_CACHE]
# (KERNEL_CACHE: the tests' shared cache, copied into the bundle as bundle.sh's would be)
set -u
MJ=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SRC=$(cd "$2" && pwd)
BUILD=$(cd "$3" && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
G=$SRC/scripts/gpu

for f in bundle.sh run.sh; do bash -n "$G/$f" && ok || bad "$f does not parse"; done
# No compiled Python committed (a checkout, where git is there).
if command -v git >/dev/null 2>&1 && git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
    [ -z "$(git -C "$SRC" ls-files '*.pyc' '*/__pycache__/*')" ] && ok || bad "compiled Python committed: $(git -C "$SRC" ls-files '*.pyc')"
fi
for f in torch_baseline.py summarize.py; do
    python3 -c "import ast,sys; ast.parse(open(sys.argv[1]).read())" "$G/$f" && ok || bad "$f does not parse"
done

# test_nccl_gpu's guard for two ranks on one GPU is well inside run.sh's limit for that step,
# so that a hang is reported as one, not killed as a timeout.
guard=$(sed -n 's/.*TWO_RANKS_GUARD_S = \([0-9]*\).*/\1/p' "$SRC/tests/test_nccl_gpu.c")
limits=$(sed -n 's/^ *step test_nccl \([0-9]*\) .*/\1/p' "$G/run.sh")
[ -n "$guard" ] && [ -n "$limits" ] && for l in $limits; do [ "$l" -ge $((guard + 15)) ] || guard=; done && [ -n "$guard" ] && ok ||
    bad "test_nccl_gpu's guard ($(sed -n 's/.*TWO_RANKS_GUARD_S = \([0-9]*\).*/\1/p' "$SRC/tests/test_nccl_gpu.c") s) is not 15 s inside run.sh's test_nccl limits ($limits)"

# The GPU tests skip (77) only without a driver or a device; a driver that loads but fails
# (here libm, which has none of its symbols) is a failure.
for t in test_route_gpu test_moe_gpu test_nccl_gpu; do
    MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 "$BUILD/$t" >gt.log 2>&1
    rc=$?
    [ "$rc" = 77 ] && ok || bad "$t without a driver: exit $rc (want 77): $(tail -3 gt.log)"
    MOEJIT_LIBCUDA=libm.so.6 "$BUILD/$t" >gt.log 2>&1
    rc=$?
    [ "$rc" = 1 ] && grep -q "no symbol cuGetErrorName" gt.log && ok || bad "$t with a broken driver: exit $rc (want 1): $(tail -3 gt.log)"
done

# A bundle as bundle.sh lays it out.
B=$T/gpu-bundle
mkdir -p "$B/bin" "$B/lib" "$B/data"
if [ -n "${4:-}" ] && [ -d "$4" ]; then cp -r "$4" "$B/cache"; else mkdir "$B/cache"; fi
cp "$MJ" "$B/bin/moejit"
for t in test_route_gpu test_moe_gpu test_nccl_gpu; do cp "$BUILD/$t" "$B/bin/"; done
for lib in libjansson.so.4 libcrypto.so.3; do
    p=$(ldd "$MJ" | awk -v l="$lib" '$1 == l {print $3}')
    cp -L "$p" "$B/lib/$lib"
done
cp "$SRC/tests/data/model/glm5_moe_config.json" "$B/data/glm5_config.json"
cp "$SRC/tests/data/model/hf_quant_config.example.json" "$B/data/hf_quant_config.json"
cp "$G/run.sh" "$G/torch_baseline.py" "$G/summarize.py" "$B/"

# --dry-run: every step with its time limit.
(cd / && env -i PATH=/usr/bin:/bin bash "$B/run.sh" --dry-run) >dry 2>&1 && ok || bad "run.sh --dry-run: $(cat dry)"
for s in device test_route test_experts test_layer test_graph test_silu test_dequant test_nccl memcheck checkpoint bench bench_nopdl torch profile; do
    grep -q "^$s " dry && ok || bad "run.sh --dry-run does not list $s: $(cat dry)"
done
bash "$B/run.sh" --frobnicate >/dev/null 2>&1
[ $? = 2 ] && ok || bad "run.sh with a bad argument does not exit 2"
rm "$B/bin/test_nccl_gpu"
bash "$B/run.sh" --dry-run >out 2>&1
[ $? = 2 ] && grep -q "test_nccl_gpu is missing" out && ok || bad "a bundle without test_nccl_gpu: $(cat out)"
cp "$BUILD/test_nccl_gpu" "$B/bin/"

# Without a GPU: says so, runs what needs none, exits 77 with the results written.
# (test_moe_sim is omitted: ctest runs it as test_moe_gpu_sim.)
env MJ_RUN_NO_GPU=1 MJ_RUN_SKIP="test_moe_sim" OUT="$T/results" bash "$B/run.sh" >run.log 2>&1
rc=$?
[ "$rc" = 77 ] && ok || bad "run.sh without a GPU: exit $rc (want 77): $(tail -20 run.log)"
grep -q "no GPU here" run.log && ok || bad "run.sh does not say there is no GPU: $(head -5 run.log)"
python3 - "$T/results" <<'EOF' && ok || bad "run.sh's results without a GPU: $(cat "$T/results/results.json" 2>&1 | head -40)"
import json, os, sys
d = sys.argv[1]
r = json.load(open(os.path.join(d, "results.json")))
st = {s["step"]: s["status"] for s in r["steps"]}
assert r["gpu"] is False and r["passed"] is True, r
assert st["test_route"] == st["test_moe"] == st["test_nccl"] == "skip", st
assert st["test_moe_sim"] == "omitted" and st["bench"] == "pass" and st["torch"] in ("skip", "pass"), st
b = json.load(open(os.path.join(d, "bench.json")))
assert b["gpu"] is None and all(x["ratio"] == 1.0 for x in b["bytes"]), b["bytes"]
assert len(os.listdir(d)) <= 8 and all(os.path.isfile(os.path.join(d, f)) for f in os.listdir(d))
EOF
tail -n 2 run.log | grep -q "^no GPU: nothing was measured on a GPU; the parts that need none passed" && ok ||
    bad "the summary is not printed last: $(tail -5 run.log)"

# Without numpy (pip install torch does not bring it): --probe still answers (77: no torch or
# no GPU here, 0 with both; never 1), and a run is a skip that says why, in its --out too.
mkdir -p "$T/nonp/numpy"
echo 'raise ImportError("numpy hidden by test_gpu_scripts.sh")' >"$T/nonp/numpy/__init__.py"
PYTHONPATH=$T/nonp python3 "$G/torch_baseline.py" --probe >np.log 2>&1
rc=$?
[ "$rc" = 77 ] || [ "$rc" = 0 ] && ok || bad "torch_baseline --probe without numpy: exit $rc: $(cat np.log)"
PYTHONPATH=$T/nonp python3 "$G/torch_baseline.py" --checkpoint "$T/none" --out "$T/np.json" >np.log 2>&1
rc=$?
[ "$rc" = 77 ] && grep -q "no numpy" np.log && ok || bad "torch_baseline without numpy: exit $rc (want 77, 'no numpy'): $(cat np.log)"
python3 -c "import json,sys; sys.exit(0 if 'no numpy' in json.load(open(sys.argv[1]))['skipped'] else 1)" "$T/np.json" &&
    ok || bad "torch_baseline without numpy wrote no reason to --out: $(cat "$T/np.json" 2>&1)"

# summarize.py on a GPU machine: a test_nccl skip (no NCCL) and a bench that measured no GPU
# ("gpu": null) are failures; a torch skip with its reason is shown and is not.
S=$T/sum
mkdir -p "$S"
summ() { # summ STEP:STATUS... : run summarize.py --gpu 1 on those steps; its output in sum.log
    : >"$S/steps.tsv"
    for x in "$@"; do printf '%s\t%s\t0\t1\t60\n' "${x%%:*}" "${x#*:}" >>"$S/steps.tsv"; done
    python3 "$G/summarize.py" --steps "$S/steps.tsv" --gpu 1 --out "$S" >sum.log 2>&1
}
echo '{"gpu": {"device": "X", "copy": {"gbps": 1}, "experts": [], "layer": [], "goals": {}}}' >"$S/bench.json"
echo '{"skipped": "no numpy (pip install numpy: torch does not bring it)"}' >"$S/torch.json"
summ test_route:pass bench:pass torch:skip
[ $? = 0 ] && grep -q "ALL CHECKS PASSED" sum.log && grep -q "^torch skipped: no numpy" sum.log && ok ||
    bad "summarize: a torch skip with its reason: $(cat sum.log)"
summ test_route:pass test_nccl:skip bench:pass
[ $? = 1 ] && grep -q "FAILED: test_nccl" sum.log && ok || bad "summarize: a test_nccl skip on a GPU machine passed: $(cat sum.log)"
echo '{"gpu": null, "notes": ["no GPU"]}' >"$S/bench.json"
summ test_route:pass bench:pass
[ $? = 1 ] && grep -q "FAILED: bench" sum.log && ok || bad "summarize: a bench without GPU results on a GPU machine passed: $(cat sum.log)"
# The model's predictions in bench.json (run.sh's bench --predict): beside the measured routing,
# experts and layer (graph), measured / predicted, in summary.txt and results.json.
cat >"$S/bench.json" <<'JSON'
{"gpu": {"device": "X", "copy": {"gbps": 1}, "goals": {},
  "routing": [{"what": "routing", "B": 1, "k0": 8, "us": 8.0}],
  "experts": [{"what": "experts", "B": 1, "k0": 8, "mode": "W4A16", "us": 15.0, "of_copy": 0.5, "active": 8.0}],
  "layer": [{"what": "layer", "B": 1, "k0": 8, "mode": "W4A16", "us": 30.0, "of_copy": 0.3},
            {"what": "layer_graph", "B": 1, "k0": 8, "mode": "W4A16", "us": 25.0, "of_copy": 0.4}]},
 "predict": {"gpu": "h200", "active_from": "gpu", "rows": [{"B": 1, "k0": 8, "mode": "W4A16", "active": 8.0,
  "kernels": {"router_gemm": {"predicted_us": 3.0, "bound": "waves"}, "oea_route": {"predicted_us": 1.0, "bound": "waves"},
              "experts_up": {"predicted_us": 6.0, "bound": "issue"}, "experts_down": {"predicted_us": 4.0, "bound": "issue"}},
  "layer": {"predicted_us": 20.0}}]}}
JSON
summ test_route:pass bench:pass torch:skip
[ $? = 0 ] && grep -q "bench --predict h200, active experts from the gpu" sum.log &&
    grep -Eq "^ +1 +8 +8.0 / 4.0 \(2.00\) +15.0 / 10.0 \(1.50\) +25.0 / 20.0 \(1.25\)$" sum.log && ok ||
    bad "summarize: the model beside the measurements: $(cat sum.log)"
python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['model']; r=m['rows'][0]; sys.exit(0 if m['gpu'] == 'h200' and r['experts']['measured_over_predicted'] == 1.5 and r['layer']['predicted_us'] == 20.0 and r['active_measured'] == 8.0 else 1)" \
    "$S/results.json" && ok || bad "summarize: results.json's model: $(cat "$S/results.json")"
rm "$S/torch.json"
summ test_route:pass torch:skip
[ $? = 1 ] && grep -q "FAILED: torch" sum.log && ok || bad "summarize: a torch skip without a reason on a GPU machine passed: $(cat sum.log)"

# The baseline's function against moejit's, on the CPU.
"$MJ" make-checkpoint --config "$SRC/tests/data/model/glm5_moe_config.json" --out "$T/ck" --seed 3 --hidden 256 \
    --intermediate 128 --experts 16 --topk 4 >/dev/null && ok || bad "make-checkpoint"
# (MJ_TEST_PYTHON: a python3 with numpy, as CMake found it: the system one first, which may
# not be the first python3 on PATH.)
PY=${MJ_TEST_PYTHON:-python3}
for b in 2 16; do
    "$PY" "$G/torch_baseline.py" --numpy --checkpoint "$T/ck" --moejit "$MJ" --work "$T" --check-batch $b \
        --out "$T/tb.json" >tb.log 2>&1 && ok || bad "torch_baseline --numpy (B $b): $(cat tb.log)"
    python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['check']; sys.exit(0 if c['passed'] and max(c['rel_l2'].values()) < 1e-5 else 1)" \
        "$T/tb.json" && ok || bad "torch_baseline --numpy (B $b) differs from moejit: $(cat tb.log)"
done

finish
