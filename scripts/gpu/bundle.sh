#!/usr/bin/env bash
# bundle.sh — run HERE (the build machine, with the Debian -dev packages): build what the GPU
# run needs and pack it into one self-contained folder, gpu-bundle/ at the repository root
# (git-ignored), that travels to the GPU machine (`carry: ["gpu-bundle"]`) and runs there
# with `bash gpu-bundle/run.sh`:
#
#   bin/      moejit and the GPU test programs (test_route_gpu, test_moe_gpu, test_nccl_gpu),
#             each with an rpath of $ORIGIN/../lib
#   lib/      libmoejit.so.0 and the shared libraries they need beyond glibc: libjansson,
#             libcrypto (copied from this machine)
#   cache/    the kernel cache, prefilled for the target (default sm_90a, the H200): what the
#             tests and `moejit bench` compile there, compiled here through the stub driver,
#             so the GPU run loads cubins instead of compiling (if its NVRTC is the same
#             version as this one; else it compiles, slower)
#   data/     the model configs; run.sh, torch_baseline.py, summarize.py
#
# Checked here before the folder is written: nothing outside the bundle but glibc (libc, libm,
# libdl, libpthread, the loader) is needed (ldd, LD_LIBRARY_PATH unset), the binaries run from
# another directory under `env -i`, run.sh --dry-run passes, and the folder is under 64 MiB.
#
# usage: scripts/gpu/bundle.sh [OUTDIR]   (env: MJ_BUNDLE_ARCH=sm_90a, JOBS=2,
#                                           MJ_BUNDLE_BUILD=build-bundle)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:-$ROOT/gpu-bundle}
BUILD=${MJ_BUNDLE_BUILD:-$ROOT/build-bundle}
ARCH=${MJ_BUNDLE_ARCH:-sm_90a}
JOBS=${JOBS:-2}
case "$ARCH" in
sm_90a) CC_STUB=9.0 ;;
sm_120a) CC_STUB=12.0 ;;
*) echo "bundle.sh: MJ_BUNDLE_ARCH must be sm_90a (H200) or sm_120a, got $ARCH" >&2; exit 2 ;;
esac
say() { echo "bundle: $*"; }

say "building in $BUILD (Release, rpath \$ORIGIN/../lib)"
# (Warnings as errors belong to the normal build: -O2 adds gcc's maybe-uninitialized guesses.)
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMJ_WERROR=OFF \
    '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target moejit_cli moejit test_route_gpu test_moe_gpu test_nccl_gpu \
    cuda_stub nccl_stub >/dev/null

TMP="$OUTDIR.tmp.$$"
rm -rf "$TMP"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/bin" "$TMP/lib" "$TMP/cache" "$TMP/data" "$TMP/stub"
cp "$BUILD/moejit" "$BUILD/test_route_gpu" "$BUILD/test_moe_gpu" "$BUILD/test_nccl_gpu" "$TMP/bin/"
cp "$BUILD/libmoejit.so.0" "$TMP/lib/" 2>/dev/null || cp -L "$BUILD/libmoejit.so" "$TMP/lib/libmoejit.so.0"
cp "$BUILD/libcuda_stub.so" "$BUILD/libnccl_stub.so" "$TMP/stub/" # for run.sh --dry-run checks here
strip --strip-unneeded "$TMP/bin/"* "$TMP/lib/"* 2>/dev/null || true
# The shared libraries beyond glibc, from where the loader finds them here.
for lib in libjansson.so.4 libcrypto.so.3; do
    p=$(ldd "$TMP/bin/moejit" | awk -v l="$lib" '$1 == l {print $3}')
    [ -n "$p" ] && [ -f "$p" ] || { echo "bundle.sh: $lib not found by ldd for moejit" >&2; exit 1; }
    cp -L "$p" "$TMP/lib/$lib"
done
cp "$ROOT/tests/data/model/glm5_moe_config.json" "$TMP/data/glm5_config.json"
cp "$ROOT/tests/data/model/hf_quant_config.example.json" "$TMP/data/hf_quant_config.json"
cp "$ROOT/scripts/gpu/run.sh" "$ROOT/scripts/gpu/torch_baseline.py" "$ROOT/scripts/gpu/summarize.py" "$TMP/"

# Nothing outside the bundle but glibc.
say "checking the libraries each binary needs (ldd, LD_LIBRARY_PATH unset)"
for f in "$TMP/bin/"* "$TMP/lib/"*; do
    out=$(env -u LD_LIBRARY_PATH ldd "$f")
    if echo "$out" | grep -q "not found"; then echo "bundle.sh: $f: $out" >&2; exit 1; fi
    while read -r name arrow path _; do
        case "$name" in
        linux-vdso* | *ld-linux* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.*) continue ;;
        esac
        [ "$arrow" = "=>" ] || continue
        case "$(readlink -f "$path")" in
        "$TMP"/lib/*) ;;
        *) echo "bundle.sh: $f needs $name from outside the bundle ($path)" >&2; exit 1 ;;
        esac
    done <<<"$out"
done

# The kernel cache: what the GPU run compiles, compiled here through the stub driver as a
# compute-capability $CC_STUB device (kernels do not run; NVRTC is real).
say "filling the kernel cache for $ARCH (the GPU tests and the bench's kernels through the stub driver)"
export MOEJIT_QUIET=1
STUBENV=(env MOEJIT_LIBCUDA="$TMP/stub/libcuda_stub.so" MOEJIT_NCCL="$TMP/stub/libnccl_stub.so" MJ_STUB_CC=$CC_STUB
         MOEJIT_CACHE_DIR="$TMP/cache" MJ_TEST_CACHE="$TMP/cache")
# test_route_gpu's checks fail on the stub (no kernel runs): only its compiles matter here.
"${STUBENV[@]}" "$TMP/bin/test_route_gpu" >/dev/null 2>&1 || true
"${STUBENV[@]}" MJ_GPU_TEST_ALL_SHAPES=1 "$TMP/bin/test_moe_gpu" all --stub >/dev/null
# run.sh's bench: the model of make-checkpoint there (GLM-5, experts of 256 rows: a TP-8
# rank's), one rank holding it, as `bench --checkpoint` sees it.
sed 's/"moe_intermediate_size": *[0-9]*/"moe_intermediate_size": 256/' "$TMP/data/glm5_config.json" \
    >"$TMP/data/glm5_tp8rank_config.json"
"${STUBENV[@]}" "$TMP/bin/moejit" bench --config "$TMP/data/glm5_tp8rank_config.json" \
    --quant "$TMP/data/hf_quant_config.json" --tp 1 --no-compile --no-sim --iters 1 --copy-mb 1 -q \
    --cache-dir "$TMP/cache" >/dev/null
# Strict now: the same run must find every kernel in the cache.
"${STUBENV[@]}" MOEJIT_STRICT=1 MJ_GPU_TEST_ALL_SHAPES=1 "$TMP/bin/test_moe_gpu" all --stub >/dev/null ||
    { echo "bundle.sh: test_moe_gpu needs a kernel the cache lacks" >&2; exit 1; }
say "kernel cache: $(find "$TMP/cache" -type f | wc -l) files, $(du -sh "$TMP/cache" | cut -f1)"

# From another directory, with an empty environment.
say "checking the binaries from / under env -i"
(cd / && env -i "$TMP/bin/moejit" --version >/dev/null) || { echo "bundle.sh: moejit does not run under env -i" >&2; exit 1; }
(cd / && env -i "$TMP/bin/test_moe_gpu" experts >/dev/null; [ $? = 77 ]) ||
    { echo "bundle.sh: test_moe_gpu does not skip (77) without a GPU under env -i" >&2; exit 1; }
(cd / && env -i PATH=/usr/bin:/bin bash "$TMP/run.sh" --dry-run >/dev/null) ||
    { echo "bundle.sh: run.sh --dry-run failed" >&2; exit 1; }

size=$(du -sm "$TMP" | cut -f1)
[ "$size" -lt 64 ] || { echo "bundle.sh: the bundle is $size MiB: over the 64 MiB a call carries" >&2; exit 1; }
rm -rf "$OUTDIR"
mv "$TMP" "$OUTDIR"
trap - EXIT
say "wrote $OUTDIR ($size MiB). On the GPU machine: bash gpu-bundle/run.sh (results under \$OUT)"
