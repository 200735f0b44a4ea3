#!/usr/bin/env bash
# The GPU-machine benchmark pass (after tests/gpu_suite.sh has built into /tmp/moe-build): moe_bench
# beside the PyTorch layer peer (which also times save_on_cpu) and its block timed with fresh and
# with accumulating gradients (tests/reference/torch_moe_block_grads.py), the offload comparison on
# the 8-layer Qwen3-30B-A3B-shaped model, the training presets, (timeline) the step breakdown of
# that model at global batch 1 and 8 with a trace of an offloaded step, and (recompute) each
# recompute module's step time and peak, and larger micro-batches with and without recompute, and
# (budget) the memory planner: the largest micro-batch without and with --memory_budget_gib, and
# (sweep) step time vs budget at micro-batch 8 beside --offload_fraction reaching the same peak,
# and (step) the optimizer against the copy bandwidth and the 8-layer preset beside PyTorch eager
# (tests/peers/torch_moe_model_peer.py) at global batch 1 and 8 (at 8 also with
# --moe_wgrad_micro_batches=4), and
# (profile) every kernel of the fused Qwen3-30B-A3B block at 4096 tokens under ncu, summed by name
# (tests/ncu_kernel_times.py), for each path in PROFILE_PATHS (default fused; fused_fp8 too) and
# shape in PROFILE_SHAPES (default qwen3), and
# (attention) attention_bench (the Hopper kernels, then the mma.sync ones) beside PyTorch's SDPA
# (tests/peers/torch_attention_peer.py) at the model's shape and three others, and (moments) bf16 AdamW moments: the optimizer, the
# preset's larger micro-batches, and moe_100m's loss curves beside f32 (the step section runs the
# preset with bf16 moments too), and (grads) bf16 gradients (--main_grads_dtype=bf16, with bf16
# moments): the optimizer, the preset's larger micro-batches, moe_100m's loss curves beside f32
# (the step section runs the preset with them too), and (wgrad) the fused MoE blocks at 16384
# tokens with f32 and with bf16 weight gradients, and the Qwen3 block at 4096 tokens adding its
# bf16 weight gradients once per 1, 2, 4 and 8 micro-batches, and (probe) the grouped GEMM kernels' probe
# (tests/kernels/grouped_gemm_sm90_probe.cu: every kernel against cuBLAS, timed beside it) and
# compute-sanitizer memcheck, racecheck and synccheck on its tiny and tails cases, and (fp8_train)
# the blockwise FP8 recipe beside bf16: moe_bench's fused block with and without it at every shape
# (FP8_BENCH_SHAPES, default all three) and both token counts, the preset at global batch 8 (bf16
# state) and the preset offloading fused_group_mlp whole at global batch 1, and (fp8_curves) loss
# curves of both: moe_100m (FP8_CURVE_STEPS, default 2000) and the preset at global batch 8
# (FP8_PRESET_STEPS, default 300), and (fp8_lag) the preset's first 150 steps with FP8 and with
# bf16, each also with f32 state, a weight gradient per micro-batch, or both, and (fp8) the FP8
# grouped GEMM's probe (the suite's build of tests/kernels/fp8_grouped_gemm_sm90_probe.cu:
# checked against cuBLAS f32 on the dequantised operands, timed beside the bf16 kernel) and the
# same three compute-sanitizer tools on its tiny and tails cases and on op_parity_cuda_test's FP8
# cases (the quantisers), and (fp8_stalls) ncu's warp-stall breakdown (the average warps stalled
# per issued instruction, by reason) of each FP8 quantising kernel, one launch each at Qwen3's
# 4096 tokens, and (fp8_gap) the preset's step with and without the FP8 recipe phase by phase
# from traces, and the Qwen3 block adding its weight gradients once per 8 micro-batches with each
# (and its weight-gradient launches under ncu: time, DRAM bytes read, L2 hit rate, tensor pipe),
# and (ab) the preset's step built from a base revision's files
# (.device-deps/base) and from the tree, alternately in one call, phase by phase from their
# traces, and (gemm_versus) a GEMM probe (GEMM_VERSUS_PROBE, default the grouped GEMM's) built
# from a base revision's kernels (.device-deps/gemm_base) and from the tree, alternately,
# and (leave_out) the FP8 weight gradient's probe timings with one stage of the kernel's work left
# out at a time (tests/fp8_wgrad_leave_out.py: promotion, output writes), beside the whole,
# and (sustained) moe_bench at every shape under sustained load (--iters=100; Mixtral-8x7B again with
# the paths in the other order) beside nvidia-smi's SM clock and power every 50 ms, summed per path
# by tests/clock_during_phases.py (about 5 minutes), and (real_shape) the 8-layer cut of the real
# Qwen3-30B-A3B at global batch 8: moe_train (when its flagfile exists), the PyTorch peer set to that
# shape, and transformers' Qwen3MoeForCausalLM (tests/peers/hf_qwen3_moe_peer.py).
# Logs and JSON go to $OUT; a short summary is printed last.
#   usage: tests/gpu_benchmarks.sh [sections]   (any of bench offload presets timeline recompute budget
#   sweep step profile attention moments grads wgrad probe fp8 fp8_train fp8_curves fp8_lag
#   fp8_stalls fp8_gap ab gemm_versus leave_out sustained real_shape base_build before_after; default the first three)
# The PyTorch peer scripts are the repository's own, tests/peers/ (what each measures: its README).
set -uo pipefail
cd "$(dirname "$0")/.."
sections=${1:-bench offload presets}
peers=tests/peers
out=${OUT:-/tmp/moe-out}
bin=/tmp/moe-build/apps
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# The 8-layer Qwen3-30B-A3B-shaped preset as the sections below run it (no evaluation).
preset="--flagfile=configs/qwen3_moe_8layer.flags --warmup_steps=2 --eval_interval=0 --eval_steps=1"
preset_gb_run() {  # global batch, log name[, flags]: steps 7-12 of the preset; prints the last step line
  timeout 150 "$bin/moe_train" $preset --global_batch_size=$1 --train_steps=12 --log_interval=6 \
    ${3:-} > "$out/$2.log" 2>&1
  echo "global batch $1 ${3:-} (rc $?): $(grep '^step' "$out/$2.log" | tail -1)"
}
build_probe() {  # source tree, binary, log[, probe source]: a GEMM probe (default the bf16
  # grouped GEMM's) built from that tree's kernels
  (cd "$1" && nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -I. \
    "${4:-tests/kernels/grouped_gemm_sm90_probe.cu}" \
    -lcublas -o "$2") > "$3" 2>&1
}
sanitize_probe() {  # probe binary, log prefix, timeout[, case...]: memcheck, racecheck, synccheck
  # on the cases (default its tiny and tails; checks only); racecheck's reports counted by the
  # kernel they lie in
  local binary=$1 prefix=$2 limit=$3
  shift 3
  local cases=("$@")
  [ ${#cases[@]} -gt 0 ] || cases=(tiny tails)
  for case in "${cases[@]}"; do
    for tool in memcheck racecheck synccheck; do
      local log="$out/${prefix}_${tool}_${case// /_}.log"
      PROBE_CHECKS_ONLY=1 timeout "$limit" compute-sanitizer --tool $tool "$binary" "$case" > "$log" 2>&1
      echo "$tool $case (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
      grep -oE 'Race reported between .* at [A-Za-z_0-9]+' "$log" | awk '{print $NF}' | sort |
        uniq -c
    done
  done
}
bf16_moments="--exp_avg_dtype=bf16 --exp_avg_sq_dtype=bf16"
bf16_state="--main_grads_dtype=bf16 $bf16_moments"
preset_curve() {  # log base, timeout, steps, eval interval, flags: the preset at global batch 8
  # with 20 warm-up steps, its metrics file beside the log
  timeout "$2" "$bin/moe_train" --flagfile=configs/qwen3_moe_8layer.flags --warmup_steps=20 \
    --global_batch_size=8 --train_steps="$3" --log_interval=10 --eval_interval="$4" \
    --eval_steps=2 $5 --metrics_file="$1.jsonl" > "$1.log" 2>&1
}
moe_100m_curve() {  # label, flags: moe_100m for 500 steps (or the flags' --train_steps); its metrics
  # file holds the loss curve
  timeout 400 "$bin/moe_train" --flagfile=configs/moe_100m.flags --train_steps=500 --log_interval=10 \
    --eval_interval=100 --eval_steps=4 $2 --metrics_file="$out/moe_100m_$1.jsonl" \
    > "$out/moe_100m_$1.log" 2>&1
  echo "$1 (rc $?): $(grep '^step' "$out/moe_100m_$1.log" | tail -1 | cut -c1-160)"
  grep '^eval' "$out/moe_100m_$1.log" | tail -5
}

if [[ $sections == *bench* ]]; then
echo "== moe_bench"
timeout 400 "$bin/moe_bench" --shapes=qwen3,mixtral,deepseek --tokens=4096,16384 --breakdown --json_out="$out/moe_bench.json" 2>&1 | tee "$out/moe_bench.log"
echo "== PyTorch layer peer"
timeout 180 python3 "$peers/torch_moe_block_peer.py" > "$out/torch_peer.log" 2>&1; tail -1 "$out/torch_peer.log" | cut -c1-2000
echo "== PyTorch block, gradients accumulating vs fresh"
timeout 120 python3 tests/reference/torch_moe_block_grads.py 2>&1 | tail -1
fi

if [[ $sections == *offload* ]]; then
echo "== offload: the 8-layer Qwen3-30B-A3B-shaped model, one micro-batch of 4096 tokens per step"
common="--flagfile=configs/qwen3_moe_8layer.flags --train_steps=24 --warmup_steps=2 --log_interval=8"
run() {  # name, extra flags
  local log=/tmp/offload_run.log
  timeout 150 "$bin/moe_train" $common $2 > $log 2>&1
  local rc=$?
  (echo "=== $1"; cat $log) >> "$out/offload.log"
  printf "%-34s rc %3d |%s\n" "$1" "$rc" "$(grep '^step' $log | tail -1 | cut -d'|' -f6-)"
  grep 'offload |' $log | tail -1
}
for path in fused unfused; do
  run "$path none" "--moe_grouped_mlp=$path"
  [ $path = fused ] && experts=fused_group_mlp || experts=expert_fc1,moe_act
  for fraction in 1 0.5; do
    run "$path $experts f=$fraction" "--moe_grouped_mlp=$path --offload_modules=$experts --offload_fraction=$fraction"
  done
done
run "fused attention groups" "--offload_modules=attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm"
fi

if [[ $sections == *presets* ]]; then
echo "== presets"
timeout 120 "$bin/moe_train" --device=cuda --log_interval=100 > "$out/tiny_cuda.log" 2>&1; tail -2 "$out/tiny_cuda.log"
timeout 150 "$bin/moe_train" --flagfile=configs/moe_100m.flags --train_steps=100 --log_interval=20 --eval_interval=0 --eval_steps=2 > "$out/moe_100m.log" 2>&1; grep -E "^parameters|^step|^eval" "$out/moe_100m.log" | tail -4
fi

if [[ $sections == *timeline* ]]; then
echo "== timeline: the 8-layer model's step breakdown at global batch 1 and 8, and an offloaded step"
for gb in 1 8; do preset_gb_run $gb breakdown_gb$gb; done
offload="--offload_modules=fused_group_mlp --offload_fraction=0.5 --train_steps=10 --log_interval=5"
timeout 150 "$bin/moe_train" $preset $offload --trace_file="$out/trace_offload.json" --trace_steps=9:9 \
  > "$out/trace_offload.log" 2>&1
echo "offloaded, traced (rc $?): $(grep '^step' "$out/trace_offload.log" | tail -1)"
timeout 150 "$bin/moe_train" $preset $offload > "$out/untraced_offload.log" 2>&1
echo "offloaded, untraced (rc $?): $(grep '^step' "$out/untraced_offload.log" | tail -1)"
for f in trace untraced; do grep '^eval\|^step' "$out/${f}_offload.log" | tail -2 | cut -c1-60; done
fi

if [[ $sections == *recompute* ]]; then
echo "== recompute: the 8-layer model, global batch 8 of micro-batch 1, then larger micro-batches"
line() { grep '^step' "$1" | tail -1 | sed 's/.*| \([0-9.]* ms\/step\).*| \([0-9]* tokens\/s\).*| \(peak mem [0-9]* MiB\).*/\1 | \2 | \3/'; }
for r in none layernorm moe core_attn layernorm,moe,core_attn; do
  flags=""; [ $r != none ] && flags="--recompute_modules=$r"
  timeout 150 "$bin/moe_train" $preset --global_batch_size=8 --train_steps=8 --log_interval=4 $flags \
    > /tmp/r.log 2>&1
  printf "%-26s rc %3d | %s\n" "$r" $? "$(line /tmp/r.log)"
  (echo "=== $r"; cat /tmp/r.log) >> "$out/recompute.log"
done
for mb in 16 20; do
  for r in none layernorm,moe,core_attn; do
    flags=""; [ $r != none ] && flags="--recompute_modules=$r"
    timeout 150 "$bin/moe_train" $preset --micro_batch_size=$mb --global_batch_size=$mb \
      --train_steps=4 --log_interval=2 $flags > /tmp/mb.log 2>&1
    rc=$?
    (echo "=== micro-batch $mb $r"; cat /tmp/mb.log) >> "$out/recompute.log"
    printf "micro-batch %2d %-24s rc %3d | %s | %s\n" $mb "$r" $rc "$(line /tmp/mb.log)" \
      "$(grep -m1 -i 'memory\|error' /tmp/mb.log | grep -v '^model\|^parameters' | cut -c1-150)"
  done
done
fi

summary() {
  grep '^step' "$1" | tail -1 |
    sed -E 's/.*\| ([0-9.]+ ms\/step).*\| ([0-9]+ tokens\/s).*\| peak mem ([0-9]+ MiB)( \(plan ([0-9]+ MiB).*)?/\1 | \2 | peak \3 | plan \5/'
}
peak_gib() { grep '^step' "$1" | tail -1 | sed -E 's/.*peak mem ([0-9]+) MiB.*/\1/' | awk '{printf "%.2f", $1 / 1024}'; }
brun() {  # name, flags
  timeout 200 "$bin/moe_train" $preset $2 > /tmp/b.log 2>&1
  local rc=$?
  (echo "=== $1"; cat /tmp/b.log) >> "$out/budget.log"
  printf "%-44s rc %3d | %s %s\n" "$1" $rc "$(summary /tmp/b.log)" \
    "$(grep -m1 'moe_train:' /tmp/b.log | grep -v 'moe_train: cuda' | cut -c1-170)"
}
unsaved_micro_batches() {  # the preset at micro-batches 13-16, accumulation 1, nothing saved
  for mb in 13 14 15 16; do
    brun "mb $mb, nothing saved" "--micro_batch_size=$mb --global_batch_size=$mb --train_steps=4 --log_interval=2"
  done
}
if [[ $sections == *budget* ]]; then
echo "== memory budget: the 8-layer model, accumulation 1; micro-batches without and with the planner"
unsaved_micro_batches
for mb in 16 20 24 28; do
  brun "mb $mb, --memory_budget_gib=130" "--micro_batch_size=$mb --global_batch_size=$mb --train_steps=4 --log_interval=2 --memory_budget_gib=130"
done
fi

if [[ $sections == *sweep* ]]; then
echo "== step time vs budget at micro-batch 8 (global batch 8): --offload_fraction, then the planner at its peak"
mb8="--micro_batch_size=8 --global_batch_size=8 --train_steps=5 --log_interval=1"  # step 5 alone
brun "mb 8, nothing saved" "$mb8"
brun "mb 8, budget 112.61, offload only" "$mb8 --offload_modules=auto --memory_budget_gib=112.61"
groups=attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,fused_group_mlp
for f in 0.25 0.5 0.75 1; do
  brun "mb 8, fraction $f" "$mb8 --offload_modules=$groups --offload_fraction=$f"
  b=$(peak_gib /tmp/b.log)
  brun "mb 8, budget $b, offload + recompute" "$mb8 --memory_budget_gib=$b"
done
fi

if [[ $sections == *step* ]]; then
echo "== whole step: the optimizer against the copy bandwidth"
timeout 200 "$bin/optimizer_bench" 2>&1 | tee "$out/optimizer_bench.log"
echo "== the 8-layer preset beside PyTorch eager (same model, batch and precision; steps 7-12)"
for gb in 1 8; do
  preset_gb_run $gb step_gb$gb
  preset_gb_run $gb step_gb${gb}_bf16_moments "$bf16_moments"
  preset_gb_run $gb step_gb${gb}_bf16_state "$bf16_state"
  # Expert weight gradients once per 4 micro-batches (global batch 1 has one: nothing changes).
  [ $gb = 8 ] && preset_gb_run $gb step_gb${gb}_bf16_state_wgrad4 "$bf16_state --moe_wgrad_micro_batches=4"
  ACCUM=$gb OFFLOAD=0 timeout 200 python3 "$peers/torch_moe_model_peer.py" > "$out/peer_gb$gb.log" 2>&1
  echo "PyTorch eager, ACCUM=$gb (rc $?): $(tail -1 "$out/peer_gb$gb.log" | cut -c1-400)"
done
fi

if [[ $sections == *profile* ]]; then
for shape in ${PROFILE_SHAPES:-qwen3}; do
  for path in ${PROFILE_PATHS:-fused}; do
    echo "== the $path $shape block's kernels at 4096 tokens (bf16 weight gradients; one check pass, one forward, two forward + backward)"
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$bin/moe_bench" \
      --shapes=$shape --tokens=4096 --paths=$path --grads=bf16 --warmup=0 --iters=1 \
      > "$out/moe_block_ncu_${path}_$shape.csv" 2> "$out/moe_block_ncu_${path}_$shape.err"
    echo "ncu (rc $?)"
    python3 tests/ncu_kernel_times.py "$out/moe_block_ncu_${path}_$shape.csv" 120 | head -30
  done
done
fi

if [[ $sections == *attention* ]]; then
echo "== attention, causal, bf16: ours beside PyTorch SDPA (flash, cuDNN, efficient)"
# batch heads kv_heads seq head_dim: the preset's shape, a longer sequence, groups of 8, no groups
for shape in "1 16 4 4096 128" "1 32 8 8192 128" "2 32 4 4096 128" "4 16 16 2048 64"; do
  read -r b h kv t d <<< "$shape"
  for hopper in true false; do  # the wgmma kernels, then the mma.sync kernels other GPUs run
    log="$out/attention_b${b}h${h}kv${kv}t${t}d${d}_hopper_$hopper.log"
    timeout 60 "$bin/attention_bench" --batch=$b --heads=$h --kv_heads=$kv --seq=$t --head_dim=$d \
      --hopper_kernels=$hopper > "$log" 2>&1
    echo "ours, Hopper kernels $hopper (rc $?): $(grep SUMMARY "$log")"
  done
  B=$b H=$h KV=$kv T=$t D=$d timeout 120 python3 "$peers/torch_attention_peer.py" 2>&1 |
    grep SUMMARY | sed 's/^/peer  /'
done
fi

# A storage-dtype section's first half: optimizer_bench with its flags, then the preset's given
# micro-batches without any saving. Args: what, optimizer_bench flags, log name, moe_train flags,
# micro-batches...
state_dtype_runs() {
  local what=$1 bench_flags=$2 log=$3 train_flags=$4
  shift 4
  echo "== $what: the optimizer, micro-batches $* of the preset"
  timeout 200 "$bin/optimizer_bench" $bench_flags 2>&1 | tee "$out/$log.log"
  for mb in "$@"; do
    brun "mb $mb, nothing saved, $what" "--micro_batch_size=$mb --global_batch_size=$mb --train_steps=4 --log_interval=2 $train_flags"
  done
}

if [[ $sections == *moments* ]]; then
state_dtype_runs "bf16 moments" "--moments=bf16" optimizer_bench_bf16 "$bf16_moments" 16 17 18
echo "== moe_100m, 500 steps: f32 vs bf16 moments (metrics files: the loss curves)"
for m in fp32 bf16; do moe_100m_curve moments_$m "--exp_avg_dtype=$m --exp_avg_sq_dtype=$m"; done
fi

if [[ $sections == *grads* ]]; then
state_dtype_runs "bf16 gradients and moments" "--moments=bf16 --grads=bf16" \
  optimizer_bench_bf16_state "$bf16_state" 22 23 24
echo "== moe_100m, 500 steps: f32 vs bf16 gradients (f32 moments; metrics files: the loss curves)"
for g in fp32 bf16; do moe_100m_curve grads_$g "--main_grads_dtype=$g"; done
fi

if [[ $sections == *wgrad* ]]; then
echo "== the MoE blocks at 16384 tokens, fused, f32 vs bf16 weight gradients"
for g in fp32 bf16; do
  timeout 280 "$bin/moe_bench" --shapes=qwen3,mixtral,deepseek --tokens=16384 --paths=fused \
    --grads=$g 2>&1 | tee "$out/moe_bench_grads_$g.log"
done
echo "== the Qwen3 block at 4096 tokens, bf16 weight gradients once per N micro-batches"
for n in 2 4 8; do
  timeout 60 "$bin/moe_bench" --shapes=qwen3 --tokens=4096 --paths=fused --grads=bf16 \
    --wgrad_micro_batches=$n 2>&1 | tee "$out/moe_bench_wgrad_once_per_$n.log"
done
fi

if [[ $sections == *probe* ]]; then
echo "== the grouped GEMM probe: checks against cuBLAS, times"
probe=/tmp/grouped_gemm_sm90_probe
build_probe . $probe "$out/probe_build.log" || { tail -20 "$out/probe_build.log"; exit 1; }
timeout 200 $probe > "$out/probe.log" 2>&1
echo "probe (rc $?): $(grep -c FAIL "$out/probe.log") failed; $(grep 'passed, ' "$out/probe.log")"
sanitize_probe $probe sanitizer 300
fi

if [[ " $sections " == *" fp8 "* ]]; then
echo "== the FP8 grouped GEMM probe: checks against cuBLAS f32, times beside the bf16 kernel"
fp8_probe=/tmp/moe-build/tests/fp8_grouped_gemm_probe_cuda_test  # the suite's build of it
timeout 150 $fp8_probe > "$out/fp8_probe.log" 2>&1
echo "fp8 probe (rc $?): $(grep -c FAIL "$out/fp8_probe.log") failed; $(grep 'passed, ' \
  "$out/fp8_probe.log")"
grep -E '^(FAIL|fp8 kernel)|^  fp8|^[a-z].*: rows' "$out/fp8_probe.log"
# (a case runs every case whose name holds it: "tails" the weight gradients' tails too; "two parts"
# and "ring wraps" wrap the weight gradients' stage rings)
sanitize_probe $fp8_probe fp8_sanitizer 120 tiny tails "two parts" "ring wraps"
for tool in memcheck racecheck synccheck; do  # the FP8 op-parity cases: the quantisers' kernels
  log="$out/fp8_op_parity_$tool.log"
  timeout 240 compute-sanitizer --tool $tool /tmp/moe-build/tests/op_parity_cuda_test \
    --gtest_filter='*fp8*:*Fp8*' > "$log" 2>&1
  echo "op parity fp8 $tool (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
done
fi

if [[ $sections == *fp8_stalls* ]]; then
echo "== the FP8 quantising kernels' warp stalls (ncu): one launch each, Qwen3 shape, 4096 tokens"
# moe_bench's first pass launches them in this order: the weights (fc1, fc2), x, a, dy, dh.
timeout 180 ncu --clock-control none -k regex:Quantize -c 6 --metrics \
  "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum" \
  "$bin/moe_bench" --shapes=qwen3 --tokens=4096 --paths=fused_fp8 --warmup=0 --iters=1 \
  > "$out/fp8_stalls.log" 2>&1
echo "ncu (rc $?):"
awk 'match($0, /Quantize[A-Za-z]*Kernel<.*>\(/) { print substr($0, RSTART, RLENGTH - 1) }
  $1 ~ /^(gpu__time|smsp__issue_active)/ || ($1 ~ /stalled/ && $NF + 0 >= 0.5)' "$out/fp8_stalls.log"
fi

if [[ $sections == *fp8_train* ]]; then
echo "== the blockwise FP8 recipe against bf16: the MoE block, the preset's step, offloading, moe_100m"
timeout 300 "$bin/moe_bench" --shapes=${FP8_BENCH_SHAPES:-qwen3,mixtral,deepseek} --tokens=4096,16384 \
  --paths=fused,fused_fp8 --iters=20 --json_out="$out/moe_bench_fp8.json" > "$out/moe_bench_fp8.log" 2>&1
echo "moe_bench (rc $?):"; grep -vE '^[IWE][0-9]{8} ' "$out/moe_bench_fp8.log" | grep -E "fused|shape"
for recipe in none blockwise; do
  preset_gb_run 8 "fp8_${recipe}_step" "$bf16_state --moe_wgrad_micro_batches=8 --fp8_recipe=$recipe"
done
offloaded="--offload_modules=fused_group_mlp --offload_fraction=1"
for recipe in none blockwise; do
  preset_gb_run 1 "fp8_${recipe}_offload" "$offloaded --fp8_recipe=$recipe"
done
fi

if [[ $sections == *fp8_gap* ]]; then
echo "== where the preset's FP8 step loses what its blocks gain: both recipes' phases, the 8-part weight gradients"
# The preset (FP8_GAP_LAYERS layers, default 6: an 80 GB H100 holds them) at global batch 8 with the
# fp8_train section's flags, bf16 then FP8 twice, traces of steps 8-12 side by side
# (tests/trace_span_times.py); then the Qwen3 block at 4096 tokens adding its bf16 weight
# gradients once per 8 micro-batches (the preset's grouping), both recipes.
for round in 1 2; do
  for recipe in none blockwise; do
    log="$out/fp8_gap_${recipe}_$round"
    timeout 150 "$bin/moe_train" $preset --num_layers=${FP8_GAP_LAYERS:-6} --global_batch_size=8 \
      --train_steps=12 --log_interval=6 $bf16_state --moe_wgrad_micro_batches=8 \
      --fp8_recipe=$recipe --trace_file="$log.json" --trace_steps=8:12 > "$log.log" 2>&1
    echo "$recipe, round $round (rc $?): $(grep '^step' "$log.log" | tail -1 | cut -c60-)"
  done
done
python3 tests/trace_span_times.py "$out"/fp8_gap_none_1.json "$out"/fp8_gap_blockwise_1.json \
  "$out"/fp8_gap_none_2.json "$out"/fp8_gap_blockwise_2.json
timeout 120 "$bin/moe_bench" --shapes=qwen3 --tokens=4096 --paths=fused,fused_fp8 --grads=bf16 \
  --wgrad_micro_batches=8 > "$out/fp8_gap_bench.log" 2>&1
echo "moe_bench (rc $?):"; grep -vE '^[IWE][0-9]{8} ' "$out/fp8_gap_bench.log"
# The weight-gradient launches of one pass of that block under ncu (one part, then 8): time, DRAM
# bytes read, L2 hit rate, tensor pipe.
timeout 120 ncu --clock-control none -k regex:WeightGrad --metrics gpu__time_duration.sum,\
dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
  "$bin/moe_bench" --shapes=qwen3 --tokens=4096 --paths=fused,fused_fp8 --grads=bf16 \
  --wgrad_micro_batches=8 --warmup=0 --iters=1 > "$out/fp8_gap_wgrad_ncu.log" 2>&1
echo "ncu of the weight gradients (rc $?):"
grep -E "WeightGradKernel|gpu__time|dram__|lts__|sm__pipe" "$out/fp8_gap_wgrad_ncu.log" | cut -c1-120
fi

if [[ $sections == *fp8_curves* ]]; then
echo "== the blockwise FP8 recipe against bf16: loss curves of moe_100m and of the preset"
for recipe in none blockwise; do
  moe_100m_curve "fp8_$recipe" "--fp8_recipe=$recipe --train_steps=${FP8_CURVE_STEPS:-2000}"
done
for recipe in none blockwise; do  # the preset at global batch 8, bf16 state
  log="$out/preset_curve_fp8_$recipe"
  preset_curve "$log" 280 "${FP8_PRESET_STEPS:-300}" 100 \
    "$bf16_state --moe_wgrad_micro_batches=8 --fp8_recipe=$recipe"
  echo "preset $recipe (rc $?): $(grep '^step' "$log.log" | tail -1 | cut -c1-160)"
  grep '^eval' "$log.log" | tail -3
done
fi

if [[ $sections == *fp8_lag* ]]; then
echo "== the preset's first FP8_LAG_STEPS (default 150) steps at global batch 8, one change each"
# bf16 and FP8 with the fp8_curves section's flags, then with f32 state, with the weight gradients
# once per micro-batch, and with both: how far runs differing only in rounding spread, beside
# the recipes' difference.
i=0
wgrad8="--moe_wgrad_micro_batches=8"
for flags in "$bf16_state $wgrad8" "$wgrad8" "$bf16_state" ""; do
  for recipe in none blockwise; do
    i=$((i + 1))
    log="$out/fp8_lag_$i"
    preset_curve "$log" 200 "${FP8_LAG_STEPS:-150}" 50 "$flags --fp8_recipe=$recipe"
    echo "$recipe $flags (rc $?): $(grep '^eval' "$log.log" | awk '{print $3 ": " $7}' | tr '\n' ' ')"
  done
done
fi

if [[ $sections == *ab* ]]; then
echo "== the preset's step, a base revision against the tree, alternating in this call"
# .device-deps/base holds the base revision's versions of the files that differ, e.g.
#   git archive REV $(git diff --name-only REV -- engine modules apps) | tar -x -C .device-deps/base
# Both builds run the same flags twice each, alternately; their traces of steps 8-12 give each
# phase's time per step (tests/trace_span_times.py). Across calls the same build moves by 1-2%.
rm -rf /tmp/base-src && mkdir -p /tmp/base-src
cp -r CMakeLists.txt engine modules apps configs tests third_party /tmp/base-src/
cp -r .device-deps/base/* /tmp/base-src/
cmake -S /tmp/base-src -B /tmp/base-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH=/tmp/moe-prefix/usr -DCMAKE_MODULE_PATH=/tmp/moe-prefix/usr/share/glog/cmake \
  > "$out/base_configure.log" 2>&1 || { tail -5 "$out/base_configure.log"; exit 1; }
timeout 300 cmake --build /tmp/base-build -j"$(nproc)" --target moe_train > "$out/base_build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/base_build.log" | head; exit 1; }
for round in 1 2; do
  for build in base tree; do
    build_bin=$bin; [ $build = base ] && build_bin=/tmp/base-build/apps
    timeout 150 "$build_bin/moe_train" $preset --global_batch_size=8 --train_steps=12 \
      --log_interval=6 $bf16_state --trace_file="$out/ab_${build}_$round.json" --trace_steps=8:12 \
      > "$out/ab_${build}_$round.log" 2>&1
    echo "$build, round $round (rc $?): $(grep '^step' "$out/ab_${build}_$round.log" | tail -1 | cut -c60-)"
  done
done
python3 tests/trace_span_times.py "$out"/ab_base_1.json "$out"/ab_tree_1.json "$out"/ab_base_2.json \
  "$out"/ab_tree_2.json
fi

# (base_build) builds moe_bench, attention_bench and moe_train from a whole base revision in
# .device-deps/base_src (git archive REV | tar -x -C .device-deps/base_src) into /tmp/base-full,
# touching /tmp/base-full/done at the end: start it with setsid in the call before, beside the
# suite; (before_after) then times them against the tree's, alternating in one call.
if [[ $sections == *base_build* ]]; then
cmake -S .device-deps/base_src -B /tmp/base-full -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=nvcc \
  -DCMAKE_PREFIX_PATH=/tmp/moe-prefix/usr -DCMAKE_MODULE_PATH=/tmp/moe-prefix/usr/share/glog/cmake \
  > "$out/base_full_configure.log" 2>&1 &&
  cmake --build /tmp/base-full -j"$(nproc)" --target moe_bench attention_bench moe_train \
  > "$out/base_full_build.log" 2>&1 && touch /tmp/base-full/done
fi

if [[ $sections == *before_after* ]]; then
echo "== a base revision against the tree, alternating: moe_bench, attention_bench, the preset's step"
for i in $(seq 120); do [ -f /tmp/base-full/done ] && break; sleep 5; done
[ -f /tmp/base-full/done ] || { echo "no base build (/tmp/base-full/done)"; exit 1; }
for round in 1 2; do
  for build in base tree; do
    build_bin=$bin; [ $build = base ] && build_bin=/tmp/base-full/apps
    timeout 120 "$build_bin/moe_bench" --shapes=qwen3,mixtral --tokens=4096 --iters=30 \
      > "$out/ba_moe_${build}_$round.log" 2>&1
    echo "-- moe_bench $build, round $round (rc $?)"
    grep -vE '^[IWE][0-9]{8} ' "$out/ba_moe_${build}_$round.log" | grep -iE "fused|unfused" | head -8
    timeout 60 "$build_bin/attention_bench" > "$out/ba_attn_${build}_$round.log" 2>&1
    echo "-- attention_bench $build, round $round (rc $?)"
    grep -E "^SUMMARY|ms" "$out/ba_attn_${build}_$round.log" | tail -4
  done
done
for build in base tree; do
  build_bin=$bin; [ $build = base ] && build_bin=/tmp/base-full/apps
  timeout 150 "$build_bin/moe_train" $preset --global_batch_size=8 --train_steps=12 --log_interval=6 \
    $bf16_state --moe_wgrad_micro_batches=8 > "$out/ba_step_$build.log" 2>&1
  echo "preset, global batch 8, bf16 state, $build (rc $?): $(grep '^step' "$out/ba_step_$build.log" | tail -1)"
done
ACCUM=8 OFFLOAD=0 timeout 200 python3 "$peers/torch_moe_model_peer.py" > "$out/ba_peer.log" 2>&1
echo "PyTorch eager, ACCUM=8 (rc $?): $(tail -1 "$out/ba_peer.log" | cut -c1-300)"
fi

if [[ $sections == *gemm_versus* ]]; then
echo "== a GEMM probe: a base revision's kernels against the tree's, alternating"
# .device-deps/gemm_base holds the base revision's kernels and probe, e.g.
#   git archive REV engine/kernels engine/core tests/kernels | tar -x -C .device-deps/gemm_base
# GEMM_VERSUS_PROBE names the probe (default tests/kernels/grouped_gemm_sm90_probe.cu; the FP8
# one, fp8_grouped_gemm_sm90_probe.cu, times the bf16 kernels beside its own as a control).
# Each probe checks its kernels, then times them (the bf16 probe only its own: PROBE_OURS_ONLY=1);
# the cases (the probe's filters, ":"-separated in GEMM_VERSUS_CASES) run base, tree, base, tree.
versus_probe=${GEMM_VERSUS_PROBE:-tests/kernels/grouped_gemm_sm90_probe.cu}
build_probe . /tmp/probe_tree "$out/probe_tree_build.log" "$versus_probe" & tree_build=$!
build_probe .device-deps/gemm_base /tmp/probe_base "$out/probe_base_build.log" "$versus_probe" &
base_build=$!
wait $tree_build && wait $base_build || { tail -5 "$out"/probe_*_build.log; exit 1; }
IFS=: read -r -a versus_cases <<< "${GEMM_VERSUS_CASES:-mixtral:qwen3 random:deepseek}"
for case in "${versus_cases[@]}"; do
  for build in base tree base tree; do
    PROBE_OURS_ONLY=1 timeout 60 /tmp/probe_$build "$case" > /tmp/probe_versus.log 2>&1
    echo "-- $case, $build (rc $?): $(grep -c FAIL /tmp/probe_versus.log) failed"
    grep -E '^  [a-z]|ours' /tmp/probe_versus.log | sed 's/  */ /g'
    cat /tmp/probe_versus.log >> "$out/probe_versus.log"
  done
done
fi

if [[ $sections == *leave_out* ]]; then
echo "== the FP8 weight gradient with one stage of its work left out (timing only)"
# tests/fp8_wgrad_leave_out.py writes the variants (their checks fail; their times stand); the
# whole kernel runs first and last, so the differences are what each stage costs.
python3 tests/fp8_wgrad_leave_out.py /tmp/leave_out > "$out/leave_out.log" || exit 1
variants=(whole no_promote no_write none)
rm -f "${variants[@]/#//tmp/probe_}"  # a failed build leaves no stale binary behind
build_probe . /tmp/probe_whole "$out/probe_whole_build.log" tests/kernels/fp8_grouped_gemm_sm90_probe.cu &
for v in "${variants[@]:1}"; do
  build_probe /tmp/leave_out/$v /tmp/probe_$v "$out/probe_${v}_build.log" \
    tests/kernels/fp8_grouped_gemm_sm90_probe.cu &
done
wait
for v in "${variants[@]}"; do
  [ -x /tmp/probe_$v ] || { echo "probe $v did not build:"; tail -5 "$out/probe_${v}_build.log"; exit 1; }
done
for v in "${variants[@]}" whole; do
  for case in "wgrad qwen3-30b-a3b fc1" "wgrad qwen3-30b-a3b fc2" "wgrad mixtral-8x7b fc1"; do
    timeout 60 /tmp/probe_$v "$case" > /tmp/probe_leave_out.log 2>&1
    echo "$v, $case (rc $?): $(grep -E 'fp8 \(dw' /tmp/probe_leave_out.log | sed 's/  */ /g' | tr '\n' ' ')"
    cat /tmp/probe_leave_out.log >> "$out/probe_leave_out.log"
  done
done
fi

if [[ $sections == *sustained* ]]; then
echo "== moe_bench under sustained load (--iters=100), with SM clock and power per path"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
  -lms 50 > "$out/sustained_smi.csv" & smi=$!
sustained() {  # log name, shapes, paths
  timeout 400 "$bin/moe_bench" --shapes=$2 --tokens=4096,16384 --paths=$3 --iters=100 \
    --json_out="$out/$1.json" > "$out/$1.log" 2>&1
  echo "-- $2, $3 (rc $?)"
  grep -vE '^[IWE][0-9]{8} ' "$out/$1.log"
}
sustained sustained qwen3,mixtral,deepseek fused,unfused
sustained sustained_mixtral_reversed mixtral unfused,fused
kill $smi
python3 tests/clock_during_phases.py "$out/sustained_smi.csv" "$out/sustained.log" \
  "$out/sustained_mixtral_reversed.log"
fi

if [[ $sections == *real_shape* ]]; then
echo "== the real Qwen3-30B-A3B layer shape, 8 layers, global batch 8: ours, the PyTorch peer, transformers"
real_flags=${REAL_SHAPE_FLAGS:-configs/qwen3_30b_a3b_8layer.flags}
if [ -f "$real_flags" ]; then
  timeout 200 "$bin/moe_train" --flagfile="$real_flags" --warmup_steps=2 --eval_interval=0 \
    --eval_steps=1 --global_batch_size=8 --train_steps=12 --log_interval=6 \
    > "$out/real_shape_ours.log" 2>&1
  echo "ours (rc $?): $(grep '^step' "$out/real_shape_ours.log" | tail -1)"
else
  echo "ours: no $real_flags (REAL_SHAPE_FLAGS names the preset): skipped"
fi
LAYERS=8 HEADS=32 KV=4 HEAD_DIM=128 QK_NORM=1 ROPE_BASE=1000000 VOCAB=151936 ACCUM=8 OFFLOAD=0 \
  timeout 300 python3 "$peers/torch_moe_model_peer.py" > "$out/real_shape_peer.log" 2>&1
echo "PyTorch eager, ACCUM=8 (rc $?): $(tail -1 "$out/real_shape_peer.log" | cut -c1-400)"
LAYERS=8 ACCUM=8 timeout 300 python3 "$peers/hf_qwen3_moe_peer.py" > "$out/real_shape_hf.log" 2>&1
echo "transformers Qwen3MoeForCausalLM, ACCUM=8 (rc $?): $(tail -1 "$out/real_shape_hf.log" | cut -c1-400)"
fi
