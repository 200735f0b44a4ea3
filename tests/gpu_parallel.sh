#!/usr/bin/env bash
# Multi-GPU throughput on the GPU machine (after tests/gpu_suite.sh has built into
# /tmp/moe-build): the 8-layer Qwen3-30B-A3B-shaped model (configs/qwen3_moe_8layer.flags) on 1, 2
# and 4 GPUs under mpirun: pipeline (1F1B, interleaved), data parallel, both, with and without
# offloading, and expert parallelism beside data parallelism at the same global batch (its log
# line adds the rows per expert and rank, the all-to-all bytes and the ep wait); on 4 GPUs first
# trainer_parallel_cuda_test under 4 ranks. Each run's log goes to
# $OUT/parallel.log; one summary line per run is printed.
#   usage: tests/gpu_parallel.sh [max GPUs]   (default: all GPUs of the machine)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/moe-out}
gpus=${1:-$(nvidia-smi -L | wc -l)}
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
offload="--offload_modules=attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,fused_group_mlp"
common="--flagfile=configs/qwen3_moe_8layer.flags --global_batch_size=8 --train_steps=6
        --warmup_steps=1 --log_interval=3 --eval_steps=1"

run() {  # ranks, name, flags
  [ "$1" -le "$gpus" ] || return 0
  echo "=== $2 ($1 GPUs): $3" >> "$out/parallel.log"
  timeout 180 mpirun -np "$1" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none \
    /tmp/moe-build/apps/moe_train $common $3 >> "$out/parallel.log" 2>&1
  local rc=$?
  printf "%-22s %d GPU rc %3d | %s\n" "$2" "$1" "$rc" \
    "$(grep '^step' "$out/parallel.log" | tail -1 | cut -d'|' -f6-)"
}

if [ "$gpus" -ge 4 ]; then  # the trainer equivalences of 4-rank layouts over NCCL (2 ranks: ctest)
  mpirun -np 4 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE --bind-to none \
    /tmp/moe-build/tests/trainer_parallel_cuda_test > "$out/trainer_parallel_np4.log" 2>&1
  echo "trainer_parallel_cuda_test, 4 ranks: rc $? ($(grep -c '\[       OK \]' "$out/trainer_parallel_np4.log") tests OK)"
fi

run 1 single ""
run 1 single+offload "$offload"
run 2 pp2 "--pipeline_parallel=2"
run 2 pp2+offload "--pipeline_parallel=2 $offload"
run 2 pp2-v2 "--pipeline_parallel=2 --virtual_pipeline=2"
run 2 dp2 "--pipeline_parallel=1"
run 2 dp2-ep2 "--pipeline_parallel=1 --expert_model_parallel_size=2"
run 2 dp2-ep2+offload "--pipeline_parallel=1 --expert_model_parallel_size=2 $offload"
run 4 pp4 "--pipeline_parallel=4"
run 4 pp4+offload "--pipeline_parallel=4 $offload"
run 4 pp4-v2 "--pipeline_parallel=4 --virtual_pipeline=2"
run 4 pp2-dp2 "--pipeline_parallel=2"
run 4 dp4 "--pipeline_parallel=1"
run 4 dp4-ep4 "--pipeline_parallel=1 --expert_model_parallel_size=4"
run 4 pp2-dp2-ep2 "--pipeline_parallel=2 --expert_model_parallel_size=2"
