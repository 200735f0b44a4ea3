#include "modules/memory_estimate.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/fp8_scaling.h"
#include "modules/lm_head_loss.h"
#include "modules/offload_groups.h"

namespace moe {
namespace {

double D(int64_t value) { return static_cast<double>(value); }

// The bytes of `rows` rows of width k as FP8 column tiles (values, scales) over the experts a
// rank holds (the groups of its grouped GEMMs).
Fp8ColumnTileSizes ExpertColumnTileBytes(const GptConfig& m, int64_t expert_parallel, double rows,
                                         int64_t k) {
  const int64_t experts = m.num_experts / std::max<int64_t>(1, expert_parallel);
  return Fp8ColumnTileBytes(experts, static_cast<int64_t>(rows), k);
}

// Their sum.
double ExpertColumnTilesTotal(const GptConfig& m, int64_t expert_parallel, double rows, int64_t k) {
  const Fp8ColumnTileSizes sizes = ExpertColumnTileBytes(m, expert_parallel, rows, k);
  return D(sizes.values + sizes.scales);
}

}  // namespace

double Fp8TileFormsBytes(const GptConfig& m, int64_t expert_parallel, double rows, int64_t k) {
  return ExpertColumnTilesTotal(m, expert_parallel, rows, k) + rows * D(k + 4 * Fp8Tiles(k));
}

double ComputeBytes(bool cuda) { return cuda ? 2.0 : 4.0; }

double StateBytesPerParameter(bool cuda, int64_t state_shards, const OptimizerDTypes& dtypes) {
  const double shards = D(std::max<int64_t>(1, state_shards));
  const double moments = D(dtypes.moment_bytes()), grad = D(dtypes.grad_bytes());
  return cuda ? 2.0 + grad + (4.0 + moments) / shards : 4.0 + grad + moments / shards;
}

double ExpertRows(const GptConfig& m, int64_t micro_batch_size, int64_t expert_parallel) {
  const double rows = D(micro_batch_size) * D(m.seq_length) * D(m.moe_router_topk);
  return expert_parallel > 1 ? std::ceil(rows * kExpertRowsMargin) : rows;
}

RankParameters LayerParameters(const MemoryEstimateOptions& o, bool moe_layer) {
  const GptConfig& m = o.model;
  const double h = D(m.hidden_size), q = D(m.q_dim()), kv = D(m.kv_dim());
  // GptConfig::attention_parameters
  const double attention = 2 * h * q + 2 * h * kv + 2 * h + D(m.qk_norm_parameters());
  if (!moe_layer) return {attention + 3 * h * D(m.ffn_hidden_size), 0};
  const double experts = D(m.num_experts) / D(std::max<int64_t>(1, o.expert_parallel));
  return {attention + h * D(m.num_experts), experts * 3 * h * D(m.moe_ffn_hidden_size)};
}

StateBytes RankStateBytes(const MemoryEstimateOptions& o, const RankParameters& p) {
  const int64_t e = std::max<int64_t>(1, o.expert_parallel);
  const double grad = D(o.dtypes.grad_bytes());
  // The copy compute reads, which StateBytesPerParameter counts, and the FP8 recipe's quantised
  // expert weights (both orientations, with their block scales), which it does not.
  const double compute_copy = p.total() * ComputeBytes(o.cuda);
  const double quantised = o.model.fp8_recipe != Fp8Recipe::kNone
                               ? p.expert * 2 * (1 + 4.0 / D(kFp8TileSize * kFp8TileSize))
                               : 0;
  StateBytes s;
  s.weights = compute_copy + quantised;
  // The CPU backend's per-source gradient slots of the rank's experts (grouped_mlp.h).
  const double slots = !o.cuda && e > 1 ? D(e) : 0;
  s.gradients = (p.total() + slots * p.expert) * grad;
  s.optimizer = p.dense * StateBytesPerParameter(o.cuda, o.state_shards, o.dtypes) +
                p.expert * StateBytesPerParameter(o.cuda, std::max<int64_t>(1, o.state_shards / e),
                                                  o.dtypes) -
                compute_copy - p.total() * grad;
  return s;
}

double RopeTableBytes(const GptConfig& m) { return D(m.seq_length) * D(m.head_dim() / 2) * 2 * 4; }

std::vector<SavedTensorSize> LayerSaves(const GptConfig& m, int64_t micro_batch_size,
                                        int64_t expert_parallel, bool moe_layer, bool cuda,
                                        const RecomputeModules& r) {
  const double b = ComputeBytes(cuda);
  const double tokens = D(micro_batch_size) * D(m.seq_length);
  const double h = D(m.hidden_size), q = D(m.q_dim()), kv = D(m.kv_dim()),
               heads = D(m.num_attention_heads);
  std::vector<SavedTensorSize> out;
  const auto add = [&out](const char* group, double bytes) { out.push_back({group, bytes}); };
  // Attention: each norm saves its input and f32 rstd; the norm's output (the attention's and
  // the MLP's input) is dropped by layernorm recompute; out and lse by core_attn recompute. The
  // query and key norms save their inputs (q and k before the norm) and rstd, one per head or,
  // across heads, one per token.
  add(kAttnNormGroup, tokens * b * h);
  add(kAttnNormGroup, tokens * 4);
  if (m.qk_layernorm) {
    const bool across = m.qk_layernorm_across_heads;
    add(kQkvLinearGroup, tokens * b * q);
    add(kQkvLinearGroup, tokens * 4 * (across ? 1 : heads));
    add(kQkvLinearGroup, tokens * b * kv);
    add(kQkvLinearGroup, tokens * 4 * (across ? 1 : D(m.num_query_groups)));
  }
  if (!r.layernorm) add(kQkvLinearGroup, tokens * b * h);
  add(kCoreAttnGroup, tokens * b * q);                        // q
  add(kCoreAttnGroup, tokens * b * kv);                       // k
  add(kCoreAttnGroup, tokens * b * kv);                       // v
  if (!r.core_attn) add(kCoreAttnGroup, tokens * 4 * heads);  // lse
  if (!r.core_attn) add(kAttnProjGroup, tokens * b * q);      // out
  add(kMlpNormGroup, tokens * b * h);
  add(kMlpNormGroup, tokens * 4);
  if (!r.layernorm) add("", tokens * b * h);  // the MLP's input: router.x, mlp.x or moe.input
  if (!moe_layer) {
    add("", tokens * b * 2 * D(m.ffn_hidden_size));  // fc1 output
    return out;
  }
  if (r.moe) return out;  // the MoE layer keeps only its input
  const double experts = D(m.num_experts), k = D(m.moe_router_topk), rows = tokens * k;
  const double f = D(m.moe_ffn_hidden_size);
  // What the grouped MLP saves, per row its experts run (received, under expert parallelism).
  const double expert_rows = ExpertRows(m, micro_batch_size, expert_parallel);
  if (m.moe_z_loss_coeff != 0.0f) add("", tokens * 4 * experts);  // router logits
  add("", tokens * 4 * experts);                                  // probabilities
  add("", tokens * 4 * k);                                        // top values
  add("", tokens * 4 * k);                                        // experts
  add("", (experts + 1) * 4);                                     // router offsets
  add("", rows * 4);                                              // source rows
  add("", rows * 4);                                              // inverse
  if (m.moe_grouped_mlp == GroupedMlpKind::kFused) {
    // Device offsets: one set per source rank, each of the rank's experts + 1.
    add("", (experts + D(std::max<int64_t>(1, expert_parallel))) * 4);
    add("", expert_rows * 4);  // weights
    // The permuted input and the activation: under the recipe their FP8 column tiles (values,
    // scales).
    const auto add_rows = [&](int64_t k) {
      if (m.fp8_recipe == Fp8Recipe::kNone) return add(kFusedGroupMlpGroup, expert_rows * b * D(k));
      const Fp8ColumnTileSizes sizes = ExpertColumnTileBytes(m, expert_parallel, expert_rows, k);
      add(kFusedGroupMlpGroup, D(sizes.values));
      add(kFusedGroupMlpGroup, D(sizes.scales));
    };
    add_rows(m.hidden_size);                            // permuted input
    add(kFusedGroupMlpGroup, expert_rows * b * 2 * f);  // fc1 output
    if (!r.moe_act) add_rows(m.moe_ffn_hidden_size);    // activation
  } else {
    add(kExpertFc1Group, expert_rows * b * h);
    add(kMoeActGroup, expert_rows * b * 2 * f);
    add(kMoeActGroup, expert_rows * 4);  // weights
  }
  return out;
}

std::vector<SavedTensorSize> EmbeddingSaves(const GptConfig& m, int64_t micro_batch_size) {
  return {{"", D(micro_batch_size) * D(m.seq_length) * 4}};  // ids
}

std::vector<SavedTensorSize> HeadSaves(const GptConfig& m, int64_t micro_batch_size, bool cuda) {
  const double b = ComputeBytes(cuda);
  const double tokens = D(micro_batch_size) * D(m.seq_length), h = D(m.hidden_size);
  // Final norm input and rstd, the head's input gradient.
  return {{"", tokens * b * h}, {"", tokens * 4}, {"", tokens * b * h}};
}

std::vector<double> HeadForwardWorkspace(const GptConfig& m, int64_t micro_batch_size, bool cuda) {
  const double b = ComputeBytes(cuda);
  const int64_t tokens = micro_batch_size * m.seq_length;
  const int64_t chunk_rows = std::min(tokens, HeadChunkRows(m, static_cast<int64_t>(b)));
  // The head's input, one chunk of logits, losses, lse.
  return {D(tokens) * b * D(m.hidden_size), D(chunk_rows) * D(m.vocab_size) * b, D(tokens) * 4,
          D(tokens) * 4};
}

namespace {

double Sum(const std::vector<SavedTensorSize>& saves) {
  double total = 0;
  for (const SavedTensorSize& s : saves) total += s.bytes;
  return total;
}

}  // namespace

double ActivationBytesPerLayer(const GptConfig& m, int64_t micro_batch_size,
                               int64_t expert_parallel, bool moe_layer, bool cuda) {
  return Sum(LayerSaves(m, micro_batch_size, expert_parallel, moe_layer, cuda, m.recompute));
}

double HeadActivationBytes(const GptConfig& m, int64_t micro_batch_size, bool cuda) {
  return Sum(EmbeddingSaves(m, micro_batch_size)) + Sum(HeadSaves(m, micro_batch_size, cuda));
}

double PendingWeightGradBytes(const GptConfig& m, int64_t micro_batch_size, int64_t expert_parallel,
                              int64_t micro_batches, double moe_layers, bool cuda) {
  if (m.moe_grouped_mlp != GroupedMlpKind::kFused) return 0;
  const double held = D(std::min(std::max<int64_t>(1, m.moe_wgrad_micro_batches),
                                 std::max<int64_t>(1, micro_batches)) -
                        1);
  const double rows = ExpertRows(m, micro_batch_size, expert_parallel);
  const double h = D(m.hidden_size), f = D(m.moe_ffn_hidden_size), b = ComputeBytes(cuda);
  // dy and dh, x and a (under the recipe their FP8 column tiles).
  if (m.fp8_recipe == Fp8Recipe::kNone) return moe_layers * held * rows * (2 * h + 3 * f) * b;
  const auto columns = [&](int64_t k) {
    return ExpertColumnTilesTotal(m, expert_parallel, rows, k);
  };
  const int64_t hidden = m.hidden_size, ffn = m.moe_ffn_hidden_size;
  return moe_layers * held * (2 * columns(hidden) + columns(2 * ffn) + columns(ffn));
}

MemoryEstimate EstimateTrainingMemory(const MemoryEstimateOptions& o) {
  const GptConfig& m = o.model;
  const double p = D(std::max<int64_t>(1, o.pipeline_parallel));
  const double v = D(std::max<int64_t>(1, o.virtual_pipeline));
  const double stages = p * v;
  const double layers = D(m.num_layers);
  // Layers per stage: the largest stage (a fixed first or last stage may be the largest).
  double stage_layers = std::ceil(layers / stages);
  if (o.first_stage_layers >= 0 || o.last_stage_layers >= 0) {
    const double fixed = D(std::max<int64_t>(0, o.first_stage_layers)) +
                         D(std::max<int64_t>(0, o.last_stage_layers));
    const double rest_stages =
        stages - (o.first_stage_layers >= 0 ? 1 : 0) - (o.last_stage_layers >= 0 ? 1 : 0);
    const double rest =
        rest_stages > 0 ? std::ceil(std::max(0.0, layers - fixed) / rest_stages) : 0;
    stage_layers = std::max({rest, D(o.first_stage_layers), D(o.last_stage_layers)});
  }
  const double rank_layers = std::min(layers, stage_layers * v);
  // The busiest layer kind, for a conservative count of a rank's layers.
  const bool has_moe = m.num_moe_layers() > 0;
  const bool has_dense = m.first_dense_layers > 0;
  const RankParameters moe_layer = has_moe ? LayerParameters(o, true) : RankParameters{};
  const RankParameters dense_layer = has_dense ? LayerParameters(o, false) : RankParameters{};
  // A layer's activations, the larger kind's, with `recompute` or with nothing recomputed.
  const auto layer_activations_with = [&](const RecomputeModules& recompute) {
    GptConfig c = m;
    c.recompute = recompute;
    return std::max(
        has_moe ? ActivationBytesPerLayer(c, o.micro_batch_size, o.expert_parallel, true, o.cuda)
                : 0.0,
        has_dense ? ActivationBytesPerLayer(c, o.micro_batch_size, o.expert_parallel, false, o.cuda)
                  : 0.0);
  };
  const double recomputed_layer = layer_activations_with(m.recompute);
  const double full_layer_activations = layer_activations_with({});
  const double h = D(m.hidden_size);
  const double embedding = D(m.vocab_size) * h;
  const double head = D(m.vocab_size) * h + h;

  RankParameters parameters{embedding + head, 0};
  if (p == 1 && v == 1) {
    // One stage: every layer, exactly.
    const double dense = D(std::min(m.num_layers, m.first_dense_layers));
    const double moe = D(m.num_moe_layers());
    parameters += {dense * dense_layer.dense + moe * moe_layer.dense, moe * moe_layer.expert};
  } else {
    // The busiest rank: its layers, each of the kind with the larger state, plus both ends.
    const RankParameters& larger =
        RankStateBytes(o, moe_layer).total() >= RankStateBytes(o, dense_layer).total()
            ? moe_layer
            : dense_layer;
    parameters += {rank_layers * larger.dense, rank_layers * larger.expert};
  }
  MemoryEstimate e;
  e.parameters = parameters.total();
  e.state_bytes = RankStateBytes(o, parameters).total();

  // The activations of the layer passes held at the peak. Recompute limited to the first layers
  // (recompute_num_layers) is counted exactly with one stage; with a pipeline a rank's layers
  // count as not recomputed (an upper bound).
  double layer_passes_bytes;
  if (p == 1 && v == 1) {
    const double recomputed_layers =
        m.recompute_num_layers < 0 ? layers : std::min(layers, D(m.recompute_num_layers));
    layer_passes_bytes = recomputed_layers * recomputed_layer +
                         (layers - recomputed_layers) * full_layer_activations;
  } else {
    const double m_batches = D(std::max<int64_t>(1, o.micro_batches));
    const double passes =
        v == 1 ? std::min(p, m_batches) * rank_layers
               : std::min(2 * (p - 1) + (v - 1) * p + 1, v * m_batches) * stage_layers;
    layer_passes_bytes =
        passes * (m.recompute_num_layers < 0 ? recomputed_layer : full_layer_activations);
  }
  // MoE layers of the busiest rank: all of them with one stage, else all its layers (a bound).
  const double rank_moe_layers =
      !has_moe ? 0 : (p == 1 && v == 1 ? D(m.num_moe_layers()) : rank_layers);
  e.activation_bytes = layer_passes_bytes + HeadActivationBytes(m, o.micro_batch_size, o.cuda) +
                       PendingWeightGradBytes(m, o.micro_batch_size, o.expert_parallel,
                                              o.micro_batches, rank_moe_layers, o.cuda);
  double head_workspace = 0;
  for (double bytes : HeadForwardWorkspace(m, o.micro_batch_size, o.cuda)) head_workspace += bytes;
  // Backward of one layer holds its gradients, as large as everything it saves; a recomputed
  // layer first holds everything it saves again (its recompute). The head's forward workspace is
  // freed before the first backward.
  e.workspace_bytes = std::max(head_workspace, full_layer_activations);
  e.total_bytes = e.state_bytes + e.activation_bytes + e.workspace_bytes;
  return e;
}

}  // namespace moe
