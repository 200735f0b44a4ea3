// moe_bench: times one MoE block (router, permutation, grouped expert MLP, unpermutation) on
// real layer shapes (--shapes: the MoE layers of model presets, modules/model_presets.h), forward
// and forward + backward, for the fused and the unfused grouped MLP, and the fused one with the
// blockwise FP8 recipe (--paths=fused_fp8: moe_train's --fp8_recipe=blockwise).
// Each path's weights are drawn once per shape and timed at every token count. Before timing it
// checks the paths against each other on the same weights and inputs (outputs, input
// gradients, router and expert weight gradients; relative error in norm within 2e-2 on CUDA, 1e-5
// on the CPU, and kFp8CheckTolerance for a pair with the FP8 path, whose operands carry e4m3's
// rounding). Prints a table and writes JSON (--json_out);
// logs (stderr) where each path's wall time went. TFLOP/s counts only the expert
// GEMMs: 6 * rows * hidden * ffn forward (fc1 to 2 * ffn, fc2 back), three times that forward +
// backward; rows = tokens * topk. Forward + backward is timed twice: as a step's first micro-batch
// (gradients zeroed before it, so backward stores them: "fwd+bwd") and as a later micro-batch
// adding to them ("+= grads").
// Under the table each shape and token count's routing: rows per expert (min, median, max) and
// how many experts end in a row tile of at most 64 rows (the Hopper GEMMs' costliest, about as
// dear as a full 128-row tile); the JSON rows hold every expert's rows.
// --breakdown adds, per shape and token count, the fused path's ops one by one (op_breakdown.h).
// --grads=bf16 keeps the weight gradients in bf16 (moe_train's --main_grads_dtype).
// --wgrad_micro_batches=N (> 1) also times the fused path as a step's later micro-batches whose
// weight gradients are added once per N (moe_train's --moe_wgrad_micro_batches): N forward +
// backward passes, the weight gradients in the last, per micro-batch ("+= per N").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "apps/common/bench_flags.h"
#include "apps/common/median_time.h"
#include "apps/common/out_of_memory_exit.h"
#include "apps/common/random_tensor.h"
#include "apps/moe_bench/op_breakdown.h"
#include "engine/core/bfloat16.h"
#include "engine/kernels/cuda/grouped_gemm/grouped_gemm_tiles.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "modules/model_presets.h"
#include "modules/moe_layer.h"

DEFINE_string(shapes, "qwen3,mixtral,deepseek", "layer shapes: qwen3, mixtral, deepseek, tiny");
DEFINE_string(tokens, "4096,16384", "token counts per block");
DEFINE_string(paths, "fused,unfused", "grouped MLP paths to time: fused, unfused, fused_fp8");
DEFINE_int32(warmup, 3, "untimed iterations");
DEFINE_int32(iters, 10, "timed iterations (the median is reported)");
DEFINE_string(device, "cuda", "cpu | cuda");
DEFINE_string(grads, "fp32", "the weight gradients' storage: fp32 | bf16");
DEFINE_string(json_out, "", "write the results here as JSON");
DEFINE_int32(wgrad_micro_batches, 1,
             "also time the fused path adding its weight gradients once per this many "
             "micro-batches (1: not)");
DEFINE_bool(breakdown, false,
            "also time the fused path's ops one by one beside dense GEMMs of the same size");

namespace moe {
namespace {

// --json_out holds one JSON array of result rows; an existing file that begins otherwise is not
// ours to replace.
constexpr std::string_view kResultsStart = "[";

// The block's name, and the key under which its router saves the routing's offsets (experts + 1).
constexpr char kLayerName[] = "moe";
std::string RoutingOffsetsKey() { return std::string(kLayerName) + ".router.offsets"; }

// A --shapes name and the model preset (modules/model_presets.h) whose MoE layer it times.
struct Shape {
  std::string name;
  const char* preset;
  const GptConfig& model() const { return ModelPresetNamed(preset); }
  int64_t hidden() const { return model().hidden_size; }
  int64_t experts() const { return model().num_experts; }
  int64_t topk() const { return model().moe_router_topk; }
  int64_t ffn() const { return model().moe_ffn_hidden_size; }
};

const std::vector<Shape> kShapes = {{"qwen3", "qwen3_moe_8layer"},
                                    {"mixtral", "mixtral_moe_layer"},
                                    {"deepseek", "deepseek_v3_moe_layer"},
                                    {"tiny", "tiny_moe_layer"}};

// The --paths names.
constexpr char kFused[] = "fused", kUnfused[] = "unfused", kFusedFp8[] = "fused_fp8";
// The cross-path check's bound for a pair with the FP8 path (e4m3 holds 3 mantissa bits: each
// operand within 2^-4 relative, a few percent of a GEMM's result in norm, compounded over the
// block's GEMMs).
constexpr double kFp8CheckTolerance = 0.1;

// One MoE layer of the shape's model, on `path`.
GptConfig LayerConfig(const Shape& shape, const std::string& path) {
  GptConfig c = shape.model();
  c.num_layers = 1;
  c.first_dense_layers = 0;
  c.moe_grouped_mlp = path == kUnfused ? GroupedMlpKind::kUnfused : GroupedMlpKind::kFused;
  c.fp8_recipe = path == kFusedFp8 ? Fp8Recipe::kBlockwise : Fp8Recipe::kNone;
  return c;
}

// (tokens, hidden) standard normal values, all distinct.
Tensor RandomInput(const Shape& shape, int64_t tokens, DType dtype, Device device, uint32_t seed) {
  return RandomTensor({tokens, shape.hidden()}, dtype, device, 1.0f, seed, tokens * shape.hidden());
}

std::vector<float> HostFloats(const Tensor& t) {
  Tensor f32 = t;
  if (t.dtype() != DType::kF32) {
    f32 = Tensor::Empty(t.shape(), DType::kF32, t.device());
    ops::Cast(t, f32);
  }
  std::vector<float> out(f32.numel());
  ops::CopyToHost(f32, out.data());
  return out;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// What the check compares between the paths.
struct Outputs {
  std::map<std::string, std::vector<float>> values;
};

struct PathResult {
  std::string path;
  double forward_ms = 0, forward_backward_ms = 0, accumulating_ms = 0, peak_mib = 0;
  double grouped_accumulating_ms = 0;  // per micro-batch, --wgrad_micro_batches together
  Outputs outputs;
  std::vector<int32_t> rows_per_expert;  // the block's routing at the timed inputs
};

// The rows a forward routed to each expert, from what it saved for backward.
std::vector<int32_t> RowsPerExpert(const SavedTensors& saved) {
  const Tensor& offsets = saved.Peek(RoutingOffsetsKey());
  std::vector<int32_t> host(offsets.numel());
  ops::CopyToHost(offsets, host.data());
  std::vector<int32_t> rows(host.size() - 1);
  for (size_t e = 0; e < rows.size(); ++e) rows[e] = host[e + 1] - host[e];
  return rows;
}

// "routing: rows per expert min / median / max; experts ending in a short row tile".
void PrintRouting(std::vector<int32_t> rows) {
  const int short_tiles = static_cast<int>(std::count_if(
      rows.begin(), rows.end(), [](int32_t r) { return cuda::sm90::EndsInShortRowTile(r); }));
  std::sort(rows.begin(), rows.end());
  printf(
      "  routing: rows per expert min %d, median %d, max %d; %d of %zu experts end in a row "
      "tile of <= %d rows\n",
      rows.front(), rows[rows.size() / 2], rows.back(), short_tiles, rows.size(),
      cuda::sm90::kShortRowTile);
}

// Wall seconds since the last call (the first: since construction), for the progress log.
class PhaseClock {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// `path`'s block (`layer`, its weights in `parameters`) at `tokens` tokens: the outputs for the
// cross-path check, then the timed passes.
PathResult TimePath(const Shape& shape, int64_t tokens, const std::string& path, int grouped,
                    ParameterSet& parameters, MoeLayer& layer, Device device, DType dtype) {
  PathResult result;
  result.path = path;
  PhaseClock clock;
  const Tensor x = RandomInput(shape, tokens, dtype, device, 11);
  const Tensor dy = RandomInput(shape, tokens, dtype, device, 13);
  Tensor aux = Tensor::Empty({1}, DType::kF32, device);
  // routing (the check pass): the forward's rows per expert, read before backward consumes them.
  auto forward_backward = [&](bool backward, bool zero_grads, bool last_of_step = true,
                              std::vector<int32_t>* routing = nullptr) {
    if (zero_grads) parameters.ZeroGrads();
    SavedTensors saved;
    ops::Fill(aux, 0.0f);
    Tensor y = layer.Forward(saved, x, aux);
    if (routing != nullptr) *routing = RowsPerExpert(saved);
    if (!backward) return std::make_pair(y, Tensor());
    return std::make_pair(y, layer.Backward(saved, dy, 1.0f, last_of_step));
  };

  const double setup_seconds = clock.Lap();
  {  // outputs for the cross-path check (grads from exactly one backward)
    auto [y, dx] = forward_backward(true, true, true, &result.rows_per_expert);
    result.outputs.values["y"] = HostFloats(y);
    result.outputs.values["dx"] = HostFloats(dx);
    for (const auto& p : parameters.all()) {
      const Tensor& grad = MaterializedGrad(*p);
      const int64_t rows = std::min<int64_t>(grad.dim(0), 2);  // router rows or two experts
      result.outputs.values[p->name] = HostFloats(grad.Rows(0, rows));
    }
  }
  const double check_seconds = clock.Lap();
  for (int i = 0; i < FLAGS_warmup; ++i) forward_backward(true, i % 2 == 0);
  result.forward_ms = MedianMs(device, FLAGS_iters, [&] { forward_backward(false, false); });
  result.accumulating_ms = MedianMs(device, FLAGS_iters, [&] { forward_backward(true, false); });
  if (grouped > 1) {
    result.grouped_accumulating_ms = MedianMs(device, FLAGS_iters,
                                              [&] {
                                                for (int i = 0; i < grouped; ++i)
                                                  forward_backward(true, false, i == grouped - 1);
                                              }) /
                                     grouped;
  }
  CachingAllocator& allocator = DeviceContext::Get(device).allocator();
  const int64_t base = allocator.stats().allocated_bytes;
  allocator.ResetPeakStats();
  result.forward_backward_ms = MedianMs(device, FLAGS_iters, [&] { forward_backward(true, true); });
  result.peak_mib = (allocator.stats().peak_allocated_bytes - base) / 1048576.0;
  LOG(INFO) << std::fixed << std::setprecision(1) << shape.name << " " << tokens << " " << path
            << ": inputs " << setup_seconds << " s, check pass " << check_seconds
            << " s, warm-up and timed passes " << clock.Lap() << " s";
  return result;
}

// One path's block at `shape`, timed at each of `token_counts` (results in that order): its
// weights are drawn once (at the DeepSeek-V3-like shape, 11 G of them on the host, which takes
// longer than the timed passes).
std::vector<PathResult> RunPath(const Shape& shape, const std::vector<int64_t>& token_counts,
                                const std::string& path, Device device, DType dtype,
                                DType grad_dtype) {
  PhaseClock clock;
  GptConfig config = LayerConfig(shape, path);
  const int grouped =
      config.moe_grouped_mlp == GroupedMlpKind::kFused ? FLAGS_wgrad_micro_batches : 1;
  config.moe_wgrad_micro_batches = grouped;
  ParameterSet parameters(device, dtype, /*seed=*/7, /*optimizer_state=*/false,
                          OptimizerDTypes{.grad = grad_dtype});
  MoeLayer layer(parameters, kLayerName, config, 0);
  LOG(INFO) << std::fixed << std::setprecision(1) << shape.name << " " << path << ": weights "
            << clock.Lap() << " s";
  std::vector<PathResult> results;
  for (const int64_t tokens : token_counts) {
    results.push_back(TimePath(shape, tokens, path, grouped, parameters, layer, device, dtype));
  }
  return results;
}

int Run() {
  std::vector<std::string> shape_names;
  for (const Shape& shape : kShapes) shape_names.push_back(shape.name);
  const auto shapes = BenchChoices("moe_bench", "shapes", FLAGS_shapes, shape_names);
  if (!shapes) return 2;
  const auto token_counts = BenchCounts("moe_bench", "tokens", FLAGS_tokens, 1, int64_t{1} << 20);
  if (!token_counts) return 2;
  const auto paths = BenchChoices("moe_bench", "paths", FLAGS_paths, {kFused, kUnfused, kFusedFp8});
  if (!paths || !BenchInRange("moe_bench", "warmup", FLAGS_warmup, 0, 1 << 20) ||
      !BenchInRange("moe_bench", "wgrad_micro_batches", FLAGS_wgrad_micro_batches, 1, 64) ||
      !BenchInRange("moe_bench", "iters", FLAGS_iters, 1, 1 << 20) ||
      !BenchOutputPath("moe_bench", "json_out", FLAGS_json_out, kResultsStart)) {
    return 2;
  }
  const std::optional<DType> grad_dtype = BenchStateDType("moe_bench", "grads", FLAGS_grads);
  if (!grad_dtype) return 2;
  const std::optional<Device> chosen = BenchDevice("moe_bench", FLAGS_device);
  if (!chosen) return 2;
  const Device device = *chosen;
  const DType dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  const double tolerance = device.is_cuda() || *grad_dtype == DType::kBF16 ? 2e-2 : 1e-5;
  nlohmann::json results = nlohmann::json::array();
  bool all_ok = true;
  printf("%-9s %6s %-9s %9s %8s %10s %8s %12s %10s %s\n", "shape", "tokens", "path", "fwd ms",
         "TFLOP/s", "fwd+bwd ms", "TFLOP/s", "+= grads ms", "peak MiB", "check vs other path");
  for (const std::string& name : *shapes) {
    const auto shape = std::find_if(kShapes.begin(), kShapes.end(),
                                    [&](const Shape& s) { return s.name == name; });
    std::vector<std::vector<PathResult>> by_path;  // [path][token count]
    for (const std::string& path : *paths) {
      by_path.push_back(RunPath(*shape, *token_counts, path, device, dtype, *grad_dtype));
    }
    for (size_t t = 0; t < token_counts->size(); ++t) {
      const int64_t tokens = (*token_counts)[t];
      std::vector<PathResult> path_results;
      for (std::vector<PathResult>& results : by_path) {
        path_results.push_back(std::move(results[t]));
      }
      const double gemm_flops = 6.0 * tokens * shape->topk() * shape->hidden() * shape->ffn();
      for (const PathResult& r : path_results) {
        double worst = 0, worst_share = 0;  // the error nearest its pair's bound, and its share
        std::string worst_name;
        for (const PathResult& other : path_results) {
          if (&other == &r) continue;
          const double bound =
              r.path == kFusedFp8 || other.path == kFusedFp8 ? kFp8CheckTolerance : tolerance;
          for (const auto& [key, want] : other.outputs.values) {
            const double error = RelativeError(r.outputs.values.at(key), want);
            if (error / bound > worst_share)
              worst_share = error / bound, worst = error, worst_name = key;
          }
        }
        const bool ok = worst_share <= 1;
        all_ok = all_ok && ok;
        printf("%-9s %6lld %-9s %9.3f %8.1f %10.3f %8.1f %12.3f %10.0f %s (max rel err %.2e %s)\n",
               shape->name.c_str(), (long long)tokens, r.path.c_str(), r.forward_ms,
               gemm_flops / r.forward_ms / 1e9, r.forward_backward_ms,
               3 * gemm_flops / r.forward_backward_ms / 1e9, r.accumulating_ms, r.peak_mib,
               ok ? "ok" : "FAIL", worst, worst_name.c_str());
        if (r.grouped_accumulating_ms > 0) {
          printf("%-9s %6lld %-9s += grads once per %d micro-batches: %.3f ms per micro-batch\n",
                 shape->name.c_str(), (long long)tokens, r.path.c_str(), FLAGS_wgrad_micro_batches,
                 r.grouped_accumulating_ms);
        }
        results.push_back(
            {{"shape", shape->name},
             {"tokens", tokens},
             {"path", r.path},
             {"hidden", shape->hidden()},
             {"experts", shape->experts()},
             {"topk", shape->topk()},
             {"ffn", shape->ffn()},
             {"forward_ms", r.forward_ms},
             {"forward_backward_ms", r.forward_backward_ms},
             {"forward_backward_accumulating_ms", r.accumulating_ms},
             {"wgrad_micro_batches", r.grouped_accumulating_ms > 0 ? FLAGS_wgrad_micro_batches : 1},
             {"forward_backward_grouped_accumulating_ms", r.grouped_accumulating_ms},
             {"forward_tflops", gemm_flops / r.forward_ms / 1e9},
             {"forward_backward_tflops", 3 * gemm_flops / r.forward_backward_ms / 1e9},
             {"peak_mib", r.peak_mib},
             {"max_rel_err_vs_other_path", worst},
             {"rows_per_expert", r.rows_per_expert}});
      }
      PrintRouting(path_results.front().rows_per_expert);
      if (FLAGS_breakdown) {
        const ExpertShape expert_shape{tokens * shape->topk(), shape->hidden(), shape->experts(),
                                       shape->ffn()};
        nlohmann::json ops_json = nlohmann::json::array();
        const bool cublas =
            ops::GroupedMatmulNeedsHostOffsets(
                device, dtype, {shape->experts(), 2 * shape->ffn(), shape->hidden()}) ||
            ops::GroupedMatmulNeedsHostOffsets(device, dtype,
                                               {shape->experts(), shape->hidden(), shape->ffn()});
        const char* grouped_gemms = !device.is_cuda() ? "cpu" : cublas ? "cublas" : "sm90";
        printf("  %-12s %9s %8s %9s %8s %6s  (dense GEMM of the same size; grouped GEMMs: %s)\n",
               "op", "ms", "TFLOP/s", "dense ms", "TFLOP/s", "share", grouped_gemms);
        for (const OpTime& op :
             TimeFusedMlpOps(expert_shape, device, dtype, *grad_dtype, FLAGS_warmup, FLAGS_iters)) {
          printf("  %-12s %9.3f", op.op.c_str(), op.ms);
          if (op.gflop > 0) {
            // share: the op's rate as a fraction of the dense GEMM's (dense ms / op ms).
            printf(" %8.1f %9.3f %8.1f %5.0f%%", op.gflop / op.ms, op.dense_ms,
                   op.gflop / op.dense_ms, 100 * op.dense_ms / op.ms);
          }
          printf("\n");
          ops_json.push_back(
              {{"op", op.op}, {"ms", op.ms}, {"gflop", op.gflop}, {"dense_ms", op.dense_ms}});
        }
        results.push_back({{"shape", shape->name},
                           {"tokens", tokens},
                           {"grouped_gemms", grouped_gemms},
                           {"breakdown", ops_json}});
      }
      fflush(stdout);
    }
  }
  if (!FLAGS_json_out.empty()) {
    std::ofstream out(FLAGS_json_out);
    out << results.dump(2) << "\n";
    if (!out) {
      fprintf(stderr, "moe_bench: --json_out=%s: could not be written\n", FLAGS_json_out.c_str());
      return 1;
    }
  }
  if (!all_ok) fprintf(stderr, "moe_bench: the paths disagree (see the check column)\n");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  gflags::SetUsageMessage("times one MoE block, fused vs unfused grouped MLP (see README.md)");
  if (const std::optional<int> exit_code =
          moe::BenchCommandLine("moe_bench", "apps/moe_bench/main.cc", argc, argv)) {
    return *exit_code;
  }
  moe::ExitOnOutOfMemory("moe_bench", "the benchmark does not fit (reduce --tokens or --shapes)");
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return moe::Run();
}
