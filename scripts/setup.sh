#!/usr/bin/env bash
# setup.sh — install what moejit builds and tests with, if any of it is missing: Debian
# packages (apt-get) and nvdisasm (PyPI, for `moejit inspect --sass` and the SASS checks).
# Safe to run again: it installs nothing when everything is there.
set -euo pipefail
# libclang-rt-14-dev: libFuzzer and the sanitizer runtimes for clang (the fuzz harnesses);
# clang only recommends it. python3-numpy, python3-pytest: the Python binding's tests
# (tests/python, tests/python_real_torch), run with the system python3 (/usr/bin/python3).
pkgs=(cmake make gcc clang libclang-rt-14-dev pkg-config libjansson-dev libssl-dev libclang-14-dev python3 python3-pip
      python3-numpy python3-pytest perl)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# python3-torch: Debian's CPU torch (1.13), for tests/python_real_torch; without its recommends
# (143 MB of packages, 610 MB installed; its recommends would add OpenCV, GDAL and Qt: 184 MB).
if ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
    echo "setup: installing python3-torch"
    [ ${#missing[@]} -gt 0 ] || $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch
fi
# nvdisasm: the CUDA toolkit here ships without it; NVIDIA publishes it on PyPI.
if ! command -v nvdisasm >/dev/null 2>&1; then
    py=$(command -v python3)
    echo "setup: installing nvdisasm (pip: nvidia-cuda-nvdisasm)"
    "$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        "nvidia-cuda-nvdisasm==13.2.78" 2>/dev/null ||
        "$py" -m pip install -q --disable-pip-version-check --break-system-packages \
            "nvidia-cuda-nvdisasm==13.2.78"
    nv=$("$py" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "nvdisasm"))')
    [ -x "$nv" ] || { echo "setup: nvdisasm not found after install ($nv)" >&2; exit 1; }
    $SUDO ln -sf "$nv" /usr/local/bin/nvdisasm
fi
# The real sources the Python tests check moejit against (sglang, vllm and torch wheels from
# PyPI, the .py and .pyi files they read, into ~/.cache/moejit-engines or $MJ_ENGINE_SOURCES).
/usr/bin/python3 "$(dirname "$0")/../tests/python/engine_sources.py" >/dev/null
