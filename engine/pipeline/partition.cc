#include "engine/pipeline/partition.h"

#include <glog/logging.h>

#include <utility>

namespace moe {
namespace {

std::string Flag(const char* name, int value) {
  return std::string("--") + name + "=" + std::to_string(value);
}

std::string StagesText(const PartitionOptions& o) {
  return std::to_string(o.pipeline_size * o.virtual_chunks) + " pipeline stages (" +
         Flag("pipeline_parallel", o.pipeline_size) + " x " +
         Flag("virtual_pipeline", o.virtual_chunks) + ")";
}

// Sizes of the stages, or an error naming the flags.
StatusOr<std::vector<int>> StageSizes(const PartitionOptions& o) {
  if (o.num_layers < 1) return InvalidArgument(Flag("num_layers", o.num_layers) + " must be >= 1");
  if (o.pipeline_size < 1) {
    return InvalidArgument(Flag("pipeline_parallel", o.pipeline_size) + " must be >= 1");
  }
  if (o.virtual_chunks < 1) {
    return InvalidArgument(Flag("virtual_pipeline", o.virtual_chunks) + " must be >= 1");
  }
  const int stages = o.pipeline_size * o.virtual_chunks;
  const bool has_first = o.first_stage_layers != PartitionOptions::kEvenSplit;
  const bool has_last = o.last_stage_layers != PartitionOptions::kEvenSplit;

  if (!has_first && !has_last) {
    if (stages > o.num_layers) {
      return InvalidArgument(Flag("num_layers", o.num_layers) + " is fewer than the " +
                             StagesText(o) + "; every stage needs at least one layer");
    }
    if (o.num_layers % stages != 0) {
      return InvalidArgument(Flag("num_layers", o.num_layers) + " does not split evenly over " +
                             StagesText(o) +
                             "; change the layer count or set --first_stage_layers / "
                             "--last_stage_layers");
    }
    return std::vector<int>(stages, o.num_layers / stages);
  }

  auto check_range = [&](const char* name, int value, bool given) -> Status {
    if (!given || (value >= 0 && value <= o.num_layers)) return Status::Ok();
    return InvalidArgument(Flag(name, value) + " must be in [0, " +
                           Flag("num_layers", o.num_layers) + "]");
  };
  MOE_RETURN_IF_ERROR(check_range("first_stage_layers", o.first_stage_layers, has_first));
  MOE_RETURN_IF_ERROR(check_range("last_stage_layers", o.last_stage_layers, has_last));
  if (stages < 2) {
    return InvalidArgument(
        "--first_stage_layers / --last_stage_layers need at least 2 pipeline stages (" +
        Flag("pipeline_parallel", o.pipeline_size) + " x " +
        Flag("virtual_pipeline", o.virtual_chunks) + ")");
  }
  const int fixed = (has_first ? o.first_stage_layers : 0) + (has_last ? o.last_stage_layers : 0);
  const int rest_layers = o.num_layers - fixed;
  const int rest_stages = stages - (has_first ? 1 : 0) - (has_last ? 1 : 0);
  const std::string overrides =
      (has_first ? Flag("first_stage_layers", o.first_stage_layers) : std::string()) +
      (has_first && has_last ? " + " : "") +
      (has_last ? Flag("last_stage_layers", o.last_stage_layers) : std::string());
  if (rest_layers < 0) {
    return InvalidArgument(overrides + " exceed " + Flag("num_layers", o.num_layers));
  }
  if (rest_stages == 0) {
    if (rest_layers != 0) {
      return InvalidArgument(overrides + " must add up to " + Flag("num_layers", o.num_layers) +
                             " with " + StagesText(o));
    }
  } else if (rest_layers < rest_stages || rest_layers % rest_stages != 0) {
    return InvalidArgument("with " + overrides + ", the remaining " + std::to_string(rest_layers) +
                           " layers of " + Flag("num_layers", o.num_layers) +
                           " must split evenly, at least one each, over the other " +
                           std::to_string(rest_stages) + " of " + StagesText(o));
  }
  std::vector<int> sizes(stages, rest_stages > 0 ? rest_layers / rest_stages : 0);
  if (has_first) sizes.front() = o.first_stage_layers;
  if (has_last) sizes.back() = o.last_stage_layers;
  return sizes;
}

}  // namespace

StatusOr<LayerPartition> LayerPartition::Create(const PartitionOptions& options) {
  MOE_ASSIGN_OR_RETURN(std::vector<int> sizes, StageSizes(options));
  std::vector<LayerRange> stages;
  int begin = 0;
  for (int size : sizes) {
    stages.push_back({begin, begin + size});
    begin += size;
  }
  CHECK_EQ(begin, options.num_layers);
  return LayerPartition(options.pipeline_size, std::move(stages));
}

const LayerRange& LayerPartition::stage_layers(int stage) const {
  CHECK_GE(stage, 0);
  CHECK_LT(stage, num_stages());
  return stages_[stage];
}

const LayerRange& LayerPartition::layers(int rank, int chunk) const {
  CHECK_GE(rank, 0);
  CHECK_LT(rank, pipeline_size_);
  CHECK_GE(chunk, 0);
  CHECK_LT(chunk, virtual_chunks());
  return stages_[StageIndex(rank, chunk, pipeline_size_)];
}

std::string LayerPartition::ToString() const {
  std::string out;
  for (int s = 0; s < num_stages(); ++s) {
    out += "stage " + std::to_string(s) + " (rank " + std::to_string(s % pipeline_size_) +
           ", chunk " + std::to_string(s / pipeline_size_) + "): layers [" +
           std::to_string(stages_[s].begin) + ", " + std::to_string(stages_[s].end) + ")";
    if (is_first_stage(s)) out += " + embedding";
    if (is_last_stage(s)) out += " + head, loss";
    out += "\n";
  }
  return out;
}

}  // namespace moe
