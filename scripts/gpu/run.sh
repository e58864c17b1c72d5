#!/usr/bin/env bash
# run.sh — run THERE, on the GPU machine, in one call (within ~8 minutes): every GPU check
# and measurement of moejit, from the bundle scripts/gpu/bundle.sh made here.
#
#   bash gpu-bundle/run.sh [--dry-run]
#
# Steps, each under its own time limit (timeout) and a budget for the whole run
# ($MJ_RUN_BUDGET seconds, default 450), so that one hang cannot eat the lease; a failed step
# is recorded and the others still run ($MJ_RUN_SKIP="name ..." omits steps):
#   device        nvidia-smi
#   test_route    the routing table on the GPU (test_route_gpu)
#   test_experts  the expert GEMMs against the CPU reference (W4A16; W4A4 on sm_120a/121a)
#   test_layer    mj_moe_forward against mj_moe_forward_ref
#   test_graph    a CUDA graph of mj_moe_forward replayed at several token counts
#   test_silu     the SwiGLU's division against the GPU's own, bit for bit (test_moe_gpu silu)
#   test_dequant  W4A16's dequantization, every code x scale byte, bit for bit (test_moe_gpu
#                 dequant: bf16 subnormals kept)
#   test_nccl     NCCL: one rank (init_all, unique_id + init_rank), two ranks on one GPU
#   memcheck      compute-sanitizer memcheck on test_moe_gpu layer (small shape), where the
#                 sanitizer supports the device (it refuses it under gVisor: recorded so)
#   checkpoint    moejit make-checkpoint: GLM-5's MoE layer with experts of 256 rows (a TP-8
#                 rank's shapes), 256 experts
#   bench         moejit bench --json on that checkpoint (one rank holds it), with the performance
#                 model of this GPU (--predict auto: the one the model knows by the driver's
#                 name of it; its predictions at the active experts this GPU's routing
#                 measured, in the same bench.json)
#   bench_nopdl   the same at B 1, 8, 32 and k0 8 with MOEJIT_PDL=0 (plain launches):
#                 bench_nopdl.json, what programmatic dependent launch saves (the model
#                 assumes pdl_launch_us)
#   torch         scripts/gpu/torch_baseline.py: the same layer in PyTorch, timed the same
#                 way, checked against `moejit run`
#   profile       Nsight Compute (where ncu is) on the expert and routing kernels of that
#                 bench at B 1, 8, 32, k0 8 and 4: ncu.csv
# Results go under $OUT (default ./gpu-results), at most 8 flat files: results.json (every
# step: status, exit code, seconds), bench.json, bench_nopdl.json, torch.json, ncu.csv,
# nvidia-smi.txt, logs.txt (every
# step's output) and summary.txt; a short table is printed last. Exit status: 0 when every
# check passed, 1 when one failed, 77 when there is no GPU (then the parts that need none run:
# the GPU tests' checks on the interpreter, the bench without a GPU).
set -u
B=$(cd "$(dirname "$0")" && pwd)
DRY=0
case "${1:-}" in
--dry-run) DRY=1 ;;
"") ;;
*) echo "usage: run.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT=${OUT:-$PWD/gpu-results}
BUDGET=${MJ_RUN_BUDGET:-450}
T0=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/moejit-gpu-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/logs"
STEPS=$WORK/steps.tsv
: >"$STEPS"

for f in bin/moejit bin/test_route_gpu bin/test_moe_gpu bin/test_nccl_gpu lib/libjansson.so.4 lib/libcrypto.so.3 \
    data/glm5_config.json data/hf_quant_config.json torch_baseline.py summarize.py; do
    [ -e "$B/$f" ] || { echo "run.sh: $B/$f is missing: make the bundle again (scripts/gpu/bundle.sh)" >&2; exit 2; }
done

# A GPU? nvidia-smi must list one.
GPU=0
if [ "${MJ_RUN_NO_GPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    GPU=1
fi

# The kernel cache travels read-only in the bundle: work on a copy.
export MOEJIT_CACHE_DIR=$WORK/cache MJ_TEST_CACHE=$WORK/cache
[ -d "$B/cache" ] && cp -r "$B/cache" "$WORK/cache"
mkdir -p "$WORK/cache" && chmod 700 "$WORK/cache"
# NCCL from the pip package nvidia-nccl-cu13 (or wherever it is), unless MOEJIT_NCCL says.
if [ -z "${MOEJIT_NCCL:-}" ]; then
    for d in $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) \
        /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
        if [ -f "$d/libnccl.so.2" ]; then export MOEJIT_NCCL=$d/libnccl.so.2; break; fi
    done
fi

# NVRTC: the toolkit's (/usr/local/cuda, $CUDA_HOME: moejit looks there), else the pip
# package's (nvidia-cuda-nvrtc), unless MOEJIT_NVRTC says.
if [ -z "${MOEJIT_NVRTC:-}" ] && ! ls /usr/local/cuda/lib64/libnvrtc.so* "${CUDA_HOME:-/nonexistent}"/lib64/libnvrtc.so* \
    >/dev/null 2>&1; then
    for d in $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cu13", "cuda_nvrtc")]' 2>/dev/null); do
        f=$(ls "$d"/libnvrtc.so.1[0-9] 2>/dev/null | head -n 1)
        if [ -n "$f" ]; then export MOEJIT_NVRTC=$f; break; fi
    done
fi
[ "$GPU" = 1 ] && nvidia-smi -L
echo "run.sh: GPU $GPU; MOEJIT_NCCL=${MOEJIT_NCCL:-(search)}; MOEJIT_NVRTC=${MOEJIT_NVRTC:-(search)}; budget ${BUDGET}s"

# step NAME LIMIT CMD...: run CMD with its output in logs/NAME.log, under min(LIMIT, what is
# left of the budget); record status pass / fail / skip (exit 77) / timeout / unsupported.
step() {
    local name=$1 limit=$2
    shift 2
    local now left status rc t1
    now=$(date +%s)
    left=$((BUDGET - (now - T0)))
    if [ "$DRY" = 1 ]; then
        printf '%-13s %4ss  %s\n' "$name" "$limit" "$*"
        return 0
    fi
    case " ${MJ_RUN_SKIP:-} " in
    *" $name "*)
        printf '%s\tomitted\t-\t0\t%s\n' "$name" "$limit" >>"$STEPS"
        echo "== $name: omitted (MJ_RUN_SKIP)"
        return 0
        ;;
    esac
    if [ "$left" -lt 15 ]; then
        printf '%s\tno-time\t-\t0\t%s\n' "$name" "$limit" >>"$STEPS"
        echo "== $name: skipped, the run's budget of ${BUDGET}s is spent"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
    rc=$?
    t1=$(date +%s)
    case $rc in
    0) status=pass ;;
    77) status=skip ;;
    124 | 137) status=timeout ;;
    *) status=fail ;;
    esac
    if [ "$name" = memcheck ] && [ "$status" != pass ] &&
        grep -qi "device not supported\|not supported on this\|unsupported device" "$WORK/logs/$name.log"; then
        status=unsupported
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((t1 - now))" "$limit" >>"$STEPS"
    echo "   $status (exit $rc, $((t1 - now))s): $(tail -n 1 "$WORK/logs/$name.log" | cut -c1-160)"
}

GLM="--config $B/data/glm5_config.json --quant $B/data/hf_quant_config.json"
# The performance model of this GPU (bench --predict auto: the one the model knows by the
# driver's name of it; the dry run models an H200). It reads the kernels' SASS: only where
# nvdisasm is, so that the bench's measurements never depend on it.
PRED=$([ "$DRY" = 1 ] && echo h200 || echo auto)
if ! command -v nvdisasm >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvdisasm ] && [ "$DRY" = 0 ]; then PRED=; fi
PREDICT=${PRED:+--predict $PRED}
if [ "$GPU" = 1 ] || [ "$DRY" = 1 ]; then
    [ "$DRY" = 1 ] && echo "run.sh --dry-run: the steps on a GPU (name, time limit, command); budget ${BUDGET}s"
    step device 30 nvidia-smi
    step test_route 120 "$B/bin/test_route_gpu"
    step test_experts 150 "$B/bin/test_moe_gpu" experts
    step test_layer 150 "$B/bin/test_moe_gpu" layer
    step test_graph 150 "$B/bin/test_moe_gpu" graph
    step test_silu 60 "$B/bin/test_moe_gpu" silu
    step test_dequant 60 "$B/bin/test_moe_gpu" dequant
    step test_nccl 90 "$B/bin/test_nccl_gpu"
    if command -v compute-sanitizer >/dev/null 2>&1 || [ "$DRY" = 1 ]; then
        step memcheck 150 env MJ_GPU_TEST_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 3 \
            "$B/bin/test_moe_gpu" layer
    else
        printf 'memcheck\tunsupported\t-\t0\t0\n' >>"$STEPS"
    fi
    step checkpoint 240 "$B/bin/moejit" make-checkpoint $GLM --out "$WORK/ck" --seed 1 --intermediate 256
    step bench 240 sh -c "\"$B/bin/moejit\" bench --checkpoint \"$WORK/ck\" --json --reps 1 --no-sim --iters 50 \
        $PREDICT --cache-dir \"$WORK/cache\" >\"$WORK/bench.json\""
    step bench_nopdl 120 sh -c "MOEJIT_PDL=0 \"$B/bin/moejit\" bench --checkpoint \"$WORK/ck\" --json --reps 1 --no-sim \
        --no-compile --bench-batch 1,8,32 --k0 8 --iters 50 -q --cache-dir \"$WORK/cache\" >\"$WORK/bench_nopdl.json\""
    step torch 200 python3 "$B/torch_baseline.py" --checkpoint "$WORK/ck" --moejit "$B/bin/moejit" \
        --out "$WORK/torch.json" --work "$WORK"
    # Nsight Compute on the expert kernels and the routing of that bench at B 1, 8, 32 and k0
    # 8, 4 (caches flushed before each replay pass: cold L2): duration, DRAM throughput,
    # occupancy, launch shape and the warps' stall reasons, as CSV.
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
    if [ -n "$NCU" ] || [ "$DRY" = 1 ]; then
        step profile 150 sh -c "for k in 'regex:experts_(up|down|quant)' 'regex:oea_route|router_gemm'; do \"${NCU:-ncu}\" \
            --clock-control none -k \"\$k\" --launch-count 40 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page details \
            \"$B/bin/moejit\" bench --checkpoint \"$WORK/ck\" --no-sim --no-compile --bench-batch 1,8,32 --k0 8,4 \
            --iters 1 --reps 1 --copy-mb 64 -q --cache-dir \"$WORK/cache\" || exit 1; done >\"$WORK/ncu.csv\""
    else
        printf 'profile\tunsupported\t-\t0\t0\n' >>"$STEPS"
    fi
    [ "$DRY" = 1 ] && exit 0
else
    echo "run.sh: no GPU here (nvidia-smi lists none): the GPU tests skip (exit 77); running the parts that need no GPU"
    step test_route 60 "$B/bin/test_route_gpu"
    step test_moe 60 "$B/bin/test_moe_gpu" all
    step test_nccl 60 "$B/bin/test_nccl_gpu"
    if command -v cc >/dev/null 2>&1; then
        step test_moe_sim 240 "$B/bin/test_moe_gpu" all --sim
    fi
    step bench 240 sh -c "\"$B/bin/moejit\" bench $GLM --hidden 256 --intermediate 256 --experts 16 --topk 4 \
        --tp 2 --batch 1-8 --k0-policy 1-3:4,4-:2 --bench-batch 1,8 --k0 4,2 --reps 1 --iters 5 --json -q \
        --cache-dir \"$WORK/cache\" >\"$WORK/bench.json\""
    step torch 60 python3 "$B/torch_baseline.py" --probe
fi

# Results: at most 8 flat files under $OUT.
mkdir -p "$OUT"
[ -f "$WORK/logs/device.log" ] && cp "$WORK/logs/device.log" "$OUT/nvidia-smi.txt"
[ -s "$WORK/bench.json" ] && cp "$WORK/bench.json" "$OUT/bench.json"
[ -s "$WORK/bench_nopdl.json" ] && cp "$WORK/bench_nopdl.json" "$OUT/bench_nopdl.json"
[ -s "$WORK/torch.json" ] && cp "$WORK/torch.json" "$OUT/torch.json"
[ -s "$WORK/ncu.csv" ] && cp "$WORK/ncu.csv" "$OUT/ncu.csv"
for f in "$WORK"/logs/*.log; do
    [ -e "$f" ] || continue
    echo "===== $(basename "$f" .log)"
    tail -c 2000000 "$f"
done >"$OUT/logs.txt"
if command -v python3 >/dev/null 2>&1; then
    python3 "$B/summarize.py" --steps "$STEPS" --gpu "$GPU" --out "$OUT" --budget "$BUDGET" \
        --elapsed "$(($(date +%s) - T0))"
    rc=$?
else
    echo "run.sh: no python3: no summary (see $OUT/logs.txt)"
    rc=1
    grep -qP '\t(fail|timeout)\t' "$STEPS" || rc=0
fi
[ "$GPU" = 0 ] && [ "$rc" = 0 ] && rc=77
exit "$rc"
