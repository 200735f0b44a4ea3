#!/usr/bin/env bash
# Installs the build and test dependencies that are missing, from Debian/Ubuntu packages, and
# python3-matplotlib for the plotting scripts (apps/plot_trace.py, apps/plot_metrics.py).
# Idempotent: installs nothing when everything is present. Needs root (or sudo) only to install.
# CUDA (nvcc, cuBLAS, NCCL) is not installed here: the build uses it when /usr/local/cuda has it.
set -euo pipefail

packages=(cmake ninja-build g++ libeigen3-dev libgflags-dev libgoogle-glog-dev libgtest-dev
          openmpi-bin libopenmpi-dev nlohmann-json3-dev clang-format-14 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
