#!/usr/bin/env bash
# setup.sh — install the Debian packages moejit builds with, if any are missing.
# Safe to run again: it installs nothing when everything is there.
set -euo pipefail
pkgs=(cmake make gcc pkg-config libjansson-dev libssl-dev libclang-14-dev python3 perl)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
