// attention_bench: times causal grouped-query attention (ops::AttentionForward, and forward +
// ops::AttentionBackward) at one shape, the way tests/peers/torch_attention_peer.py times
// PyTorch's SDPA: bf16 (batch, seq, heads, head_dim) inputs (f32 with --device=cpu, a check of the
// bench only), FLOPs of causal attention only (forward 2 * 2 * b * h * t * t * d / 2, backward
// 2.5x that), the median of --iters runs after a warm-up. Prints one line per pass and a JSON
// SUMMARY line last (the peer's fields).
#include <cstdio>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/common/bench_flags.h"
#include "apps/common/median_time.h"
#include "apps/common/out_of_memory_exit.h"
#include "apps/common/random_tensor.h"
#include "engine/kernels/ops.h"
#include "modules/model_presets.h"
#if MOE_WITH_CUDA
#include "engine/kernels/cuda/attention/attention_sm90.h"
#endif

// The default shape: the attention of the qwen3_moe_8layer preset (modules/model_presets.h).
const moe::GptConfig& kDefaultModel = moe::ModelPresetNamed("qwen3_moe_8layer");
DEFINE_int64(batch, 1, "sequences");
DEFINE_int64(seq, kDefaultModel.seq_length, "tokens per sequence");
DEFINE_int64(heads, kDefaultModel.num_attention_heads, "query heads");
DEFINE_int64(kv_heads, kDefaultModel.num_query_groups, "key/value heads (divides --heads)");
DEFINE_int64(head_dim, kDefaultModel.head_dim(), "64 or 128");
DEFINE_int32(iters, 20, "timed iterations (the median is reported)");
DEFINE_string(device, "cuda", "cpu | cuda");
DEFINE_bool(hopper_kernels, true,
            "false: time the mma.sync kernels on a Hopper GPU instead of its wgmma kernels");

namespace moe {
namespace {

int Run() {
  constexpr const char* kProgram = "attention_bench";
  if (!BenchInRange(kProgram, "batch", FLAGS_batch, 1, 1 << 20) ||
      !BenchInRange(kProgram, "seq", FLAGS_seq, 1, 1 << 24) ||
      !BenchInRange(kProgram, "heads", FLAGS_heads, 1, 1 << 16) ||
      !BenchInRange(kProgram, "kv_heads", FLAGS_kv_heads, 1, FLAGS_heads) ||
      !BenchInRange(kProgram, "iters", FLAGS_iters, 1, 1 << 20)) {
    return 2;
  }
  if (FLAGS_heads % FLAGS_kv_heads != 0) {
    fprintf(stderr, "%s: --kv_heads=%lld does not divide --heads=%lld\n", kProgram,
            (long long)FLAGS_kv_heads, (long long)FLAGS_heads);
    return 2;
  }
  if (FLAGS_head_dim != 64 && FLAGS_head_dim != 128) {
    fprintf(stderr, "%s: --head_dim=%lld must be 64 or 128\n", kProgram, (long long)FLAGS_head_dim);
    return 2;
  }
  const std::optional<Device> chosen = BenchDevice(kProgram, FLAGS_device);
  if (!chosen) return 2;
  const Device device = *chosen;
#if MOE_WITH_CUDA
  cuda::attention::AllowSm90Attention(FLAGS_hopper_kernels);
#endif
  // The CPU reference computes in f32 (a check of the bench, not a timing to compare).
  const DType dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  const int64_t b = FLAGS_batch, t = FLAGS_seq, h = FLAGS_heads, kv = FLAGS_kv_heads,
                d = FLAGS_head_dim;
  const auto input = [&](const Shape& shape, uint32_t seed) {
    return RandomTensor(shape, dtype, device, 1.0f, seed, /*distinct=*/1 << 20);
  };
  const Tensor q = input({b, t, h, d}, 1), k = input({b, t, kv, d}, 2), v = input({b, t, kv, d}, 3);
  const Tensor dout = input({b, t, h, d}, 4);
  const Tensor out = Tensor::Empty({b, t, h, d}, dtype, device);
  const Tensor lse = Tensor::Empty({b, h, t}, DType::kF32, device);
  const Tensor dq = Tensor::Empty(q.shape(), dtype, device);
  const Tensor dk = Tensor::Empty(k.shape(), dtype, device);
  const Tensor dv = Tensor::Empty(v.shape(), dtype, device);
  const auto forward = [&] { ops::AttentionForward(q, k, v, out, lse); };
  const auto forward_backward = [&] {
    forward();
    ops::AttentionBackward(dout, q, k, v, out, lse, dq, dk, dv);
  };
  const double fwd_ms = WarmedMedianMs(device, FLAGS_iters, forward);
  const double fwdbwd_ms = WarmedMedianMs(device, FLAGS_iters, forward_backward);
  const double fwd_flop = 2.0 * 2.0 * b * h * t * t * d / 2;
  const double fwd_tflops = fwd_flop / fwd_ms / 1e9,
               fwdbwd_tflops = 3.5 * fwd_flop / fwdbwd_ms / 1e9;
  printf("shape b=%ld h=%ld kv=%ld t=%ld d=%ld, Hopper kernels %s\n", b, h, kv, t, d,
         FLAGS_hopper_kernels ? "allowed" : "off");
  printf("forward            %8.3f ms %7.1f TFLOP/s\n", fwd_ms, fwd_tflops);
  printf("forward + backward %8.3f ms %7.1f TFLOP/s\n", fwdbwd_ms, fwdbwd_tflops);
  printf(
      "SUMMARY {\"shape\": {\"b\": %ld, \"h\": %ld, \"kv\": %ld, \"t\": %ld, \"d\": %ld}, "
      "\"ours\": {\"fwd_ms\": %.4f, \"fwd_TFLOPs\": %.1f, \"fwdbwd_ms\": %.4f, "
      "\"fwdbwd_TFLOPs\": %.1f}}\n",
      b, h, kv, t, d, fwd_ms, fwd_tflops, fwdbwd_ms, fwdbwd_tflops);
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "times causal grouped-query attention, forward and backward, at one shape (see README.md)");
  if (const std::optional<int> exit_code =
          moe::BenchCommandLine("attention_bench", "apps/attention_bench/main.cc", argc, argv)) {
    return *exit_code;
  }
  moe::ExitOnOutOfMemory("attention_bench",
                         "the benchmark does not fit (reduce --batch, --seq or --heads)");
  google::InitGoogleLogging(argv[0]);
  return moe::Run();
}
