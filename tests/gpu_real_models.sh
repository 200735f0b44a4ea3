#!/usr/bin/env bash
# The published models' GPU checks in one command, after tests/gpu_suite.sh has built into
# /tmp/moe-build on the GPU machine: the transformers judge (tests/hf/judge.py: the fixtures made
# fresh, our loss and gradients against transformers' on the CPU and on CUDA, a trained Qwen3-MoE
# exported and loaded back), compute-sanitizer (memcheck, racecheck, synccheck) on the op parity
# cases of the kernels the query/key norm and the pre-softmax router use, and the real-shape
# benchmark (tests/gpu_benchmarks.sh real_shape). Logs go to $OUT.
#   usage: tests/gpu_real_models.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/moe-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

echo "== transformers judge"
timeout 400 python3 tests/hf/judge.py --build /tmp/moe-build --work /tmp/moe-judge \
  > "$out/judge.log" 2>&1
echo "judge rc $?"
grep -E "FAIL|judge:" "$out/judge.log" | tail -20

echo "== compute-sanitizer on the RoPE, RMSNorm and router gate kernels"
for tool in memcheck racecheck synccheck; do
  timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 3 \
    /tmp/moe-build/tests/op_parity_cuda_test --gtest_filter='*rope*:*Rope*:*rmsnorm*:*router*' \
    > "$out/sanitizer_$tool.log" 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$tool.log" | tail -1)"
done

bash tests/gpu_benchmarks.sh real_shape
