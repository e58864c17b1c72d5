#!/usr/bin/env bash
# tsan.sh — the Python binding's threaded tests under ThreadSanitizer (not part of CI: slow,
# and a nightly-style check). Builds libmoejit.so with -fsanitize=thread in build-tsan/,
# then runs tests/python/test_threads_and_ints.py and the loopback-rank tests of
# test_moe.py against it, the TSan runtime preloaded into the (uninstrumented) python3.
# A data race reported in the library fails the run (halt_on_error). The interpreter's
# kernels run on fibers TSan cannot follow, so MOEJIT_SIM_THREADS=1 and only the host
# code around them (handles, JIT cache, communicators, the binding's locks) is checked.
# usage: bash scripts/tsan.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMJ_WERROR=ON \
    -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan -j"$jobs" --target moejit
tsan=$(${CC:-gcc} -print-file-name=libtsan.so)
[ -e "$tsan" ] || { echo "tsan.sh: no libtsan.so (apt-get install libgcc-12-dev)" >&2; exit 1; }
# The python3 with numpy and pytest (as ctest picks it: the system one first).
py=${MJ_PYTHON:-$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)}
mkdir -p build-tsan/cache
export MOEJIT_LIBRARY=$PWD/build-tsan/libmoejit.so MOEJIT_CACHE_DIR=$PWD/build-tsan/cache MOEJIT_SIM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 report_signal_unsafe=0 ${TSAN_OPTIONS:-}"
LD_PRELOAD=$tsan "$py" -m pytest -q -p no:cacheprovider tests/python/test_threads_and_ints.py \
    "tests/python/test_moe.py::test_two_loopback_ranks_equal_the_whole_layer" \
    "tests/python/test_moe.py::test_comm_all_reduce_from_threads" "$@"
