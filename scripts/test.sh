#!/usr/bin/env bash
# test.sh — the whole test suite, as CI runs it: install what is missing, build with
# warnings as errors, run ctest; then the same under AddressSanitizer + UBSan; then the
# Python binding's tests (tests/python, pytest) against the plain build; then the libFuzzer
# harnesses (tests/fuzz), built with clang, a few seconds each.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
# One kernel cache for both builds' tests: cubins compiled once (sim objects differ by build).
export MJ_TEST_CACHE="$PWD/build/test-cache"
cmake -S . -B build -DMJ_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
# The benchmark programs are not tests, but they must still build.
cmake --build build -j"$jobs" --target benches
# (tests/python is the ctest test python_binding, label "python": run once, below.)
ctest --test-dir build --output-on-failure --timeout 900 -j"$jobs" -LE '^python$'
cmake -S . -B build-asan -DMJ_WERROR=ON -DMJ_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
# This run includes python_binding: the binding's tests against the sanitized library.
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure --timeout 900 -j"$jobs"
# The Python binding (python/moejit) and examples/sglang_select_experts.py, with pytest, on the
# system python3 (setup.sh installs python3-numpy and python3-pytest), against build/.
ctest --test-dir build -L '^python$' --no-tests=error --output-on-failure --timeout 900
# Fuzz: each harness fuzzes MJ_FUZZ_SECONDS (5) from its seed corpus, two at a time (about
# 20 s, plus the clang build). A crash or a broken invariant fails the test, and this script;
# the reproducer is in build-fuzz/fuzz/artifacts/.
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DMJ_WERROR=ON -DMJ_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz
ctest --test-dir build-fuzz -L '^fuzz$' --output-on-failure --timeout 120 -j"$jobs"
