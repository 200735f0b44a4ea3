#include "apps/moe_train/run_summary.h"

#include <algorithm>
#include <cstdio>

#include "engine/pipeline/schedule.h"

namespace moe {
namespace {

std::string Millions(int64_t n) {
  char buffer[32];
  snprintf(buffer, sizeof(buffer), "%.2fM", n / 1e6);
  return buffer;
}

}  // namespace

std::string ModelSummary(const GptConfig& m) {
  std::string grouped_mlp = m.moe_grouped_mlp == GroupedMlpKind::kUnfused ? "unfused grouped MLP"
                            : m.moe_wgrad_micro_batches > 1
                                ? "fused grouped MLP, weight gradients once per " +
                                      std::to_string(m.moe_wgrad_micro_batches) + " micro-batches"
                                : "fused grouped MLP";
  if (m.fp8_recipe == Fp8Recipe::kBlockwise) grouped_mlp += ", FP8 blockwise e4m3";
  const std::string routing = (m.moe_router_pre_softmax ? "pre-softmax, " : "") + grouped_mlp;
  std::string attention = "kv " + std::to_string(m.num_query_groups);
  if (m.q_dim() != m.hidden_size) attention += ", head dim " + std::to_string(m.head_dim());
  if (m.qk_layernorm) {
    attention += m.qk_layernorm_across_heads ? ", QK norm across heads" : ", QK norm";
  }
  char buffer[512];
  snprintf(buffer, sizeof(buffer),
           "%lld layers (%lld dense, %lld MoE), hidden %lld, heads %lld (%s), experts %lld "
           "top-%lld (%s), expert ffn %lld, seq %lld, vocab %lld",
           (long long)m.num_layers, (long long)std::min(m.num_layers, m.first_dense_layers),
           (long long)m.num_moe_layers(), (long long)m.hidden_size,
           (long long)m.num_attention_heads, attention.c_str(), (long long)m.num_experts,
           (long long)m.moe_router_topk, routing.c_str(), (long long)m.moe_ffn_hidden_size,
           (long long)m.seq_length, (long long)m.vocab_size);
  return buffer;
}

std::string ParameterCounts(const GptConfig& m) {
  return Millions(m.total_parameters()) + " total, " + Millions(m.active_parameters()) +
         " active per token";
}

std::string BatchSummary(const RunConfig& run) {
  const TrainerOptions& t = run.trainer;
  char buffer[256];
  snprintf(buffer, sizeof(buffer),
           "micro %lld x accumulation %lld x data-parallel %d = %lld sequences, %lld tokens/step",
           (long long)t.micro_batch_size,
           (long long)(t.global_batch_size / (t.micro_batch_size * run.data_parallel)),
           run.data_parallel, (long long)t.global_batch_size,
           (long long)(t.global_batch_size * run.model.seq_length));
  return buffer;
}

std::string PrecisionSummary(const RunConfig& run) {
  const OptimizerDTypes& d = run.trainer.optimizer_dtypes;
  return run.device.ToString() + ", " +
         (run.device.is_cuda() ? "bf16 (f32 master weights)" : "f32") + " compute; gradients " +
         DTypeName(d.grad) + "; AdamW moments exp_avg " + DTypeName(d.exp_avg) + ", exp_avg_sq " +
         DTypeName(d.exp_avg_sq);
}

std::string ParallelSummary(const RunConfig& run) {
  const int chunks = run.trainer.virtual_pipeline;
  const std::string experts =
      run.expert_parallel == 1
          ? ""
          : ", expert parallel " + std::to_string(run.expert_parallel) + " (" +
                std::to_string(run.model.num_experts / run.expert_parallel) + " of " +
                std::to_string(run.model.num_experts) + " experts per rank, expert-data " +
                std::to_string(run.data_parallel / run.expert_parallel) + ")";
  return std::to_string(run.pipeline_parallel * run.data_parallel) + " ranks = pipeline " +
         std::to_string(run.pipeline_parallel) + " x data " + std::to_string(run.data_parallel) +
         experts + "; " + std::to_string(chunks) + " chunk(s) per pipeline rank, schedule " +
         ScheduleKindName(DefaultScheduleKind(run.pipeline_parallel, chunks));
}

}  // namespace moe
