#!/usr/bin/env bash
# test.sh — the whole test suite, as CI runs it: install what is missing, build with
# warnings as errors, run ctest; then the same under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DMJ_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure --timeout 900 -j"$jobs"
cmake -S . -B build-asan -DMJ_WERROR=ON -DMJ_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure --timeout 900 -j"$jobs"
