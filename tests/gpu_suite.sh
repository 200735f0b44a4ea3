#!/usr/bin/env bash
# The GPU-machine suite, one command: unpack the carried gflags/glog packages (.device-deps/, see
# third_party/device/fetch_debs.sh), configure, build with all cores, run the ctest labels given
# (default: cuda, and multi_gpu where the machine has two GPUs or more; with one it says which
# tests it did not run). Logs go to $OUT when the device tool sets it.
#   usage: tests/gpu_suite.sh [ctest label regex]
set -euo pipefail
cd "$(dirname "$0")/.."
gpus=$(nvidia-smi -L | wc -l)
labels=${1:-cuda$([ "$gpus" -ge 2 ] && echo "|multi_gpu" || true)}
prefix=/tmp/moe-prefix
build=/tmp/moe-build
out=${OUT:-/tmp/moe-out}
mkdir -p "$prefix" "$out"
for deb in .device-deps/*.deb; do dpkg -x "$deb" "$prefix"; done
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=nvcc -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DCMAKE_MODULE_PATH="$prefix/usr/share/glog/cmake" > "$out/configure.log" 2>&1 ||
  { tail -50 "$out/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" -- -k 0 > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -50; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ctest --test-dir "$build" -L "$labels" --output-on-failure 2>&1 | tee "$out/ctest.log"
if [ "$gpus" -lt 2 ]; then
  echo "not run (label multi_gpu, needs 2 GPUs; this machine has $gpus):" \
    $(ctest --test-dir "$build" -L multi_gpu -N | grep -oE '[a-z_0-9]+_cuda_test')
fi
