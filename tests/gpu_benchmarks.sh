#!/usr/bin/env bash
# The GPU-machine benchmark pass (after tests/gpu_suite.sh has built into /tmp/moe-build): moe_bench
# beside the PyTorch layer peer, the offload comparison at the Qwen3-30B-A3B layer shape, and the
# training presets. Logs and JSON go to $OUT; a short summary is printed last.
#   usage: tests/gpu_benchmarks.sh [peer-scripts-dir]   (default .device-deps/peers)
set -uo pipefail
cd "$(dirname "$0")/.."
peers=${1:-.device-deps/peers}
out=${OUT:-/tmp/moe-out}
bin=/tmp/moe-build/apps
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

echo "== moe_bench"
timeout 240 "$bin/moe_bench" --shapes=qwen3 --tokens=4096,16384 --json_out="$out/moe_bench.json" 2>&1 | tee "$out/moe_bench.log"
timeout 120 "$bin/moe_bench" --shapes=mixtral --tokens=4096 --json_out="$out/moe_bench_mixtral.json" 2>&1 | tee -a "$out/moe_bench.log"
echo "== PyTorch layer peer"
timeout 180 python3 "$peers/torch_moe_peer.py" > "$out/torch_peer.log" 2>&1; tail -1 "$out/torch_peer.log" | cut -c1-2000

echo "== offload at the Qwen3-30B-A3B layer shape (4 layers, seq 4096)"
common="--flagfile=configs/qwen3_moe_8layer.flags --num_layers=4 --train_steps=12 --warmup_steps=2 --log_interval=4"
run() {  # name, extra flags
  timeout 150 "$bin/moe_train" $common $2 --metrics_file="$out/offload_$1.jsonl" > "$out/offload_$1.log" 2>&1
  echo "$1 (rc $?): $(grep '^step' "$out/offload_$1.log" | tail -1)"
  grep '^offload |' "$out/offload_$1.log" | tail -1
}
run fused_none "--moe_grouped_mlp=fused"
run fused_group_mlp "--moe_grouped_mlp=fused --offload_modules=fused_group_mlp"
run unfused_none "--moe_grouped_mlp=unfused"
run unfused_fc1_act "--moe_grouped_mlp=unfused --offload_modules=expert_fc1,moe_act"
run fused_attention "--moe_grouped_mlp=fused --offload_modules=attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm"

echo "== presets"
timeout 120 "$bin/moe_train" --device=cuda --log_interval=100 > "$out/tiny_cuda.log" 2>&1; tail -2 "$out/tiny_cuda.log"
timeout 150 "$bin/moe_train" --flagfile=configs/moe_100m.flags --train_steps=100 --log_interval=20 --eval_interval=0 --eval_steps=2 > "$out/moe_100m.log" 2>&1; grep -E "^parameters|^step|^eval" "$out/moe_100m.log" | tail -4
