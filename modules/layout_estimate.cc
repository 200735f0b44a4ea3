#include "modules/layout_estimate.h"

#include <algorithm>
#include <utility>

namespace moe {
namespace {

double D(int64_t value) { return static_cast<double>(value); }

double Sum(const std::vector<SavedTensorSize>& saves) {
  double total = 0;
  for (const SavedTensorSize& s : saves) total += s.bytes;
  return total;
}

// One rank's layers as memory_estimate.h counts them: each layer's saves at the larger of the
// rank's layer kinds, with what that layer recomputes (a few distinct choices, computed once).
class LayerCounts {
 public:
  LayerCounts(const MemoryEstimateOptions& o, bool has_moe, bool has_dense)
      : o_(o), has_moe_(has_moe), has_dense_(has_dense) {}

  double Activations(const RecomputeModules& recompute) {
    for (const auto& [known, bytes] : known_) {
      if (known == recompute) return bytes;
    }
    GptConfig m = o_.model;
    m.recompute = recompute;
    m.recompute_by_layer.clear();
    const double bytes = std::max(
        has_moe_
            ? ActivationBytesPerLayer(m, o_.micro_batch_size, o_.expert_parallel, true, o_.cuda)
            : 0.0,
        has_dense_
            ? ActivationBytesPerLayer(m, o_.micro_batch_size, o_.expert_parallel, false, o_.cuda)
            : 0.0);
    known_.emplace_back(recompute, bytes);
    return bytes;
  }

 private:
  const MemoryEstimateOptions& o_;
  const bool has_moe_, has_dense_;
  std::vector<std::pair<RecomputeModules, double>> known_;
};

RankMemoryEstimate EstimateRank(const MemoryEstimateOptions& o, const PipelineLayout& layout,
                                int rank) {
  const GptConfig& m = o.model;
  const LayerPartition& partition = layout.partition;
  RankMemoryEstimate r;
  r.rank = rank;
  bool has_moe = false, has_dense = false;
  double moe_layers = 0;
  RankParameters parameters;
  for (int chunk = 0; chunk < partition.virtual_chunks(); ++chunk) {
    const int stage = StageIndex(rank, chunk, partition.pipeline_size());
    const LayerRange& range = partition.layers(rank, chunk);
    r.chunks.push_back(range);
    r.embedding = r.embedding || partition.is_first_stage(stage);
    r.head = r.head || partition.is_last_stage(stage);
    for (int l = range.begin; l < range.end; ++l) {
      const bool moe = m.is_moe_layer(l);
      (moe ? has_moe : has_dense) = true;
      moe_layers += moe ? 1 : 0;
      parameters += LayerParameters(o, moe);
    }
  }
  const double h = D(m.hidden_size);
  if (r.embedding) parameters.dense += D(m.vocab_size) * h;
  if (r.head) parameters.dense += D(m.vocab_size) * h + h;
  const StateBytes state = RankStateBytes(o, parameters);
  r.memory.parameters = parameters.total();
  r.memory.state_bytes = state.total();
  r.weight_bytes = state.weights;
  r.gradient_bytes = state.gradients;
  r.optimizer_bytes = state.optimizer;

  // What one pass of each chunk saves.
  LayerCounts counts(o, has_moe, has_dense);
  std::vector<double> pass_bytes;
  for (int chunk = 0; chunk < partition.virtual_chunks(); ++chunk) {
    const int stage = StageIndex(rank, chunk, partition.pipeline_size());
    const LayerRange& range = partition.layers(rank, chunk);
    double bytes = partition.is_first_stage(stage) ? Sum(EmbeddingSaves(m, o.micro_batch_size)) : 0;
    if (partition.is_last_stage(stage)) bytes += Sum(HeadSaves(m, o.micro_batch_size, o.cuda));
    for (int l = range.begin; l < range.end; ++l) bytes += counts.Activations(m.recompute_in(l));
    pass_bytes.push_back(bytes);
  }
  double held = 0, most = 0;
  int in_flight = 0;
  for (const Action& a : layout.schedule[rank]) {
    if (a.kind == Action::Kind::kForward) {
      held += pass_bytes[a.chunk];
      ++in_flight;
      if (held > most) {
        most = held;
        r.passes_in_flight = in_flight;
      }
    } else if (a.kind == Action::Kind::kBackward) {
      held -= pass_bytes[a.chunk];
      --in_flight;
    }
  }
  r.memory.activation_bytes =
      most + PendingWeightGradBytes(m, o.micro_batch_size, o.expert_parallel, o.micro_batches,
                                    moe_layers, o.cuda);

  double head_workspace = 0;
  if (r.head) {
    for (double bytes : HeadForwardWorkspace(m, o.micro_batch_size, o.cuda))
      head_workspace += bytes;
  }
  r.memory.workspace_bytes = std::max(head_workspace, counts.Activations({}));
  r.memory.total_bytes =
      r.memory.state_bytes + r.memory.activation_bytes + r.memory.workspace_bytes;
  return r;
}

}  // namespace

const RankMemoryEstimate& LayoutMemoryEstimate::busiest() const {
  const RankMemoryEstimate* most = &ranks.front();
  for (const RankMemoryEstimate& r : ranks) {
    if (r.memory.total_bytes > most->memory.total_bytes) most = &r;
  }
  return *most;
}

StatusOr<PipelineLayout> MakePipelineLayout(const MemoryEstimateOptions& o) {
  PartitionOptions layout;
  layout.num_layers = static_cast<int>(o.model.num_layers);
  layout.pipeline_size = static_cast<int>(o.pipeline_parallel);
  layout.virtual_chunks = static_cast<int>(o.virtual_pipeline);
  layout.first_stage_layers = static_cast<int>(o.first_stage_layers);
  layout.last_stage_layers = static_cast<int>(o.last_stage_layers);
  return PipelineLayout::Create(layout, static_cast<int>(o.micro_batches));
}

StatusOr<LayoutMemoryEstimate> EstimateLayoutMemory(const MemoryEstimateOptions& o) {
  MOE_ASSIGN_OR_RETURN(const PipelineLayout layout, MakePipelineLayout(o));
  LayoutMemoryEstimate out;
  for (int rank = 0; rank < layout.partition.pipeline_size(); ++rank) {
    out.ranks.push_back(EstimateRank(o, layout, rank));
  }
  return out;
}

}  // namespace moe
