// optimizer_bench: times the optimizer step of a model's parameters against the device's copy
// bandwidth, in one process: a device-to-device copy of --copy_gib (bandwidth = read + write
// bytes / time), the gradient norm (reads the gradient: 4 bytes per parameter, 2 with
// --grads=bf16), the multi-tensor AdamW update (reads master, grad, m, v and writes master, m, v
// and the model copy: 30 bytes per parameter with bf16 values, f32 gradients and f32 moments, 22
// with bf16 moments (--moments=bf16), 20 with bf16 gradients too; 2 fewer on the CPU backend,
// where values are the masters) and the whole AdamW::Step (norm, host read-back, clipping,
// update: the gradient's bytes more).
// The model is GptConfig's shape set by the flags below (defaults: the qwen3_moe_8layer preset of
// modules/model_presets.h, as configs/qwen3_moe_8layer.flags); values are zeros (the timing does
// not depend on them). A model and copy
// whose state cannot fit in the device's memory (moe_train's estimate, modules/memory_estimate.h)
// end before any allocation in one line and exit code 1, as an allocation that fails does.
#include <cstdio>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/common/bench_flags.h"
#include "apps/common/device_capacity.h"
#include "apps/common/median_time.h"
#include "apps/common/out_of_memory_exit.h"
#include "engine/core/byte_units.h"
#include "engine/kernels/ops.h"
#include "engine/optim/adamw.h"
#include "modules/gpt_model.h"
#include "modules/memory_estimate.h"
#include "modules/model_presets.h"

// The default model: the qwen3_moe_8layer preset (modules/model_presets.h).
const moe::GptConfig& kDefaultModel = moe::ModelPresetNamed("qwen3_moe_8layer");
DEFINE_int64(num_layers, kDefaultModel.num_layers, "layers");
DEFINE_int64(first_dense_layers, kDefaultModel.first_dense_layers, "dense layers first");
DEFINE_int64(hidden_size, kDefaultModel.hidden_size, "hidden size");
DEFINE_int64(num_attention_heads, kDefaultModel.num_attention_heads, "attention heads");
DEFINE_int64(num_query_groups, kDefaultModel.num_query_groups, "key/value heads");
DEFINE_int64(kv_channels, kDefaultModel.kv_channels,
             "attention head dimension (0: --hidden_size / --num_attention_heads)");
DEFINE_int64(num_experts, kDefaultModel.num_experts, "experts per MoE layer");
DEFINE_int64(moe_ffn_hidden_size, kDefaultModel.moe_ffn_hidden_size, "expert ffn size");
DEFINE_int64(vocab_size, kDefaultModel.vocab_size, "vocabulary");
DEFINE_double(copy_gib, 4, "size of the device-to-device copy that measures the bandwidth");
DEFINE_int32(iters, 10, "timed iterations (the median is reported)");
DEFINE_string(device, "cuda", "cpu | cuda");
DEFINE_string(moments, "fp32", "both AdamW moments' storage: fp32 | bf16");
DEFINE_string(grads, "fp32",
              "the gradients' storage (moe_train's --main_grads_dtype): fp32 | bf16");

namespace moe {
namespace {

constexpr double kMinCopyGib = 0.001;  // about 1 MiB
constexpr const char* kNoFit =
    "the benchmark does not fit (reduce --copy_gib or the model's sizes)";

void PrintRow(const char* what, double ms, double bytes, double copy_gbs) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  printf("%-44s %9.3f ms %8.0f GB/s %6.1f%% of copy\n", what, ms, gbs, 100 * gbs / copy_gbs);
}

int Run() {
  constexpr const char* kProgram = "optimizer_bench";
  if (!BenchInRange(kProgram, "num_layers", FLAGS_num_layers, 1, 1 << 20) ||
      !BenchInRange(kProgram, "first_dense_layers", FLAGS_first_dense_layers, 0,
                    FLAGS_num_layers) ||
      !BenchInRange(kProgram, "hidden_size", FLAGS_hidden_size, 1, 1 << 20) ||
      !BenchInRange(kProgram, "num_attention_heads", FLAGS_num_attention_heads, 1, 1 << 16) ||
      !BenchInRange(kProgram, "num_query_groups", FLAGS_num_query_groups, 1,
                    FLAGS_num_attention_heads) ||
      !BenchInRange(kProgram, "kv_channels", FLAGS_kv_channels, 0, 1 << 16) ||
      !BenchInRange(kProgram, "num_experts", FLAGS_num_experts, 1, 1 << 16) ||
      !BenchInRange(kProgram, "moe_ffn_hidden_size", FLAGS_moe_ffn_hidden_size, 1, 1 << 24) ||
      !BenchInRange(kProgram, "vocab_size", FLAGS_vocab_size, 2, 2147483647) ||
      !BenchInRange(kProgram, "iters", FLAGS_iters, 1, 1 << 20)) {
    return 2;
  }
  // At least about 1 MiB: a smaller copy (--copy_gib=1e-300 copies no element) times nothing, and
  // every row's share of its bandwidth would be nan or inf.
  if (!(FLAGS_copy_gib >= kMinCopyGib && FLAGS_copy_gib <= 1024)) {  // NaN too
    fprintf(stderr, "%s: --copy_gib=%g must be in [%g, 1024]\n", kProgram, FLAGS_copy_gib,
            kMinCopyGib);
    return 2;
  }
  GptConfig config;
  config.num_layers = FLAGS_num_layers;
  config.first_dense_layers = FLAGS_first_dense_layers;
  config.hidden_size = FLAGS_hidden_size;
  config.num_attention_heads = FLAGS_num_attention_heads;
  config.num_query_groups = FLAGS_num_query_groups;
  config.kv_channels = FLAGS_kv_channels;
  config.num_experts = FLAGS_num_experts;
  config.moe_ffn_hidden_size = FLAGS_moe_ffn_hidden_size;
  config.vocab_size = FLAGS_vocab_size;
  if (const Status model = CheckModel(config); !model.ok()) {
    fprintf(stderr, "%s: %s\n", kProgram, model.message().c_str());
    return 2;
  }
  const std::optional<DType> moment_dtype = BenchStateDType(kProgram, "moments", FLAGS_moments);
  const std::optional<DType> grad_dtype = BenchStateDType(kProgram, "grads", FLAGS_grads);
  if (!moment_dtype || !grad_dtype) return 2;
  const std::optional<Device> chosen = BenchDevice(kProgram, FLAGS_device);
  if (!chosen) return 2;
  const Device device = *chosen;
  const OptimizerDTypes dtypes{*grad_dtype, *moment_dtype, *moment_dtype};
  // Sizes that cannot fit end here, before anything is made (creating the tensors of
  // --num_layers=1048576 took minutes before an allocation failed), as moe_train's memory check
  // does, with the one line an allocation that fails would give (out_of_memory_exit.h).
  MemoryEstimateOptions estimate;
  estimate.model = config;
  estimate.cuda = device.is_cuda();
  estimate.dtypes = dtypes;
  const double state_bytes = EstimateTrainingMemory(estimate).state_bytes;
  const double copy_bytes_needed = 2 * FLAGS_copy_gib * static_cast<double>(kGiB);
  const size_t capacity = DeviceContext::Get(device).allocator().capacity_bytes();
  if (capacity > 0 && state_bytes + copy_bytes_needed > UsableBytes(device, capacity)) {
    fprintf(stderr,
            "%s: out of %s memory: needs at least about %s (parameters, gradients and optimizer "
            "state %s, the copy's source and destination %s) but %s; %s\n",
            kProgram, device.is_cuda() ? "device" : "cpu",
            Bytes(state_bytes + copy_bytes_needed).c_str(), Bytes(state_bytes).c_str(),
            Bytes(copy_bytes_needed).c_str(), CapacityText(device, capacity).c_str(), kNoFit);
    return 1;
  }
  ParameterSet parameters(device, device.is_cuda() ? DType::kBF16 : DType::kF32, /*seed=*/1,
                          /*optimizer_state=*/true, dtypes);
  for (ParameterSpec spec :
       GptModel::StageParameterSpecs(config, GptStage{0, config.num_layers, true, true})) {
    spec.init = Init::kZeros;
    parameters.Create(spec);
  }
  std::vector<Tensor> grads;
  for (const auto& p : parameters.all()) {
    grads.push_back(MaterializedGrad(*p));
    ops::Fill(grads.back(), 1e-3f);
  }
  const auto n = static_cast<double>(parameters.NumElements());
  printf("%zu tensors, %.3fB parameters, %s gradients, %s moments\n", parameters.all().size(),
         n / 1e9, DTypeName(dtypes.grad), DTypeName(dtypes.exp_avg));

  const auto copy_elements = static_cast<int64_t>(FLAGS_copy_gib * static_cast<double>(kGiB) / 4);
  Tensor src = Tensor::Empty({copy_elements}, DType::kF32, device);
  Tensor dst = Tensor::Empty({copy_elements}, DType::kF32, device);
  ops::Fill(src, 1.0f);
  const auto run = [&](const std::function<void()>& body) {
    return WarmedMedianMs(device, FLAGS_iters, body);
  };
  const double copy_ms = run([&] { ops::Copy(src, dst); });
  const double copy_bytes = 2.0 * static_cast<double>(src.nbytes());
  const double copy_gbs = copy_bytes / (copy_ms * 1e-3) / 1e9;
  PrintRow("device-to-device copy (read + write)", copy_ms, copy_bytes, copy_gbs);

  Tensor norm = Tensor::Empty({1}, DType::kF32, device);
  const auto grad_bytes = static_cast<double>(dtypes.grad_bytes());
  PrintRow("gradient norm", run([&] { ops::GlobalL2Norm(grads, norm); }), grad_bytes * n, copy_gbs);
  const std::vector<ops::AdamWTensors> entries = AdamWUpdateEntries(parameters.OwnedSlices());
  // master, grad, m, v read; master, m, v and the model copy (if any) written.
  const auto model_bytes = static_cast<double>(
      entries.front().model.defined() ? DTypeSize(entries.front().model.dtype()) : 0);
  const auto moment_bytes = static_cast<double>(2 * dtypes.moment_bytes());  // read and written
  const double update_bytes = (8 + grad_bytes + moment_bytes + model_bytes) * n;
  ops::AdamWConfig update;
  PrintRow("AdamW update", run([&] { ops::AdamWUpdate(entries, update); }), update_bytes, copy_gbs);
  AdamW adamw(AdamWOptions{});
  PrintRow("AdamW::Step: norm, clip, update", run([&] { adamw.Step(parameters, 1e-4f); }),
           update_bytes + grad_bytes * n, copy_gbs);
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  gflags::SetUsageMessage("times the optimizer step against the copy bandwidth (see README.md)");
  if (const std::optional<int> exit_code =
          moe::BenchCommandLine("optimizer_bench", "apps/optimizer_bench/main.cc", argc, argv)) {
    return *exit_code;
  }
  moe::ExitOnOutOfMemory("optimizer_bench", moe::kNoFit);
  google::InitGoogleLogging(argv[0]);
  return moe::Run();
}
