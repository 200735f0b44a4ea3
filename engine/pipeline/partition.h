// Layer partition of a pipeline: num_layers transformer layers split over
// num_stages = pipeline_size x virtual_chunks stages, each a contiguous [begin, end) range, in
// stage order (stage 0 holds layers [0, ...)).
//
// Stage numbering follows Megatron-LM: model chunk c of pipeline rank r is stage
// c * pipeline_size + r (StageIndex), so rank r holds stages r, r + p, r + 2p, ... and the
// activations of chunk c on the last rank go to chunk c + 1 on rank 0.
//
// Besides its layers, the first stage (stage 0: rank 0, chunk 0) holds the embedding and the last
// stage (num_stages - 1: rank p - 1, chunk v - 1) holds the final norm, the head and the loss;
// is_first_stage / is_last_stage say which.
//
// Split rule:
// - By default every stage gets num_layers / num_stages layers; num_layers must be a multiple of
//   num_stages.
// - first_stage_layers / last_stage_layers (>= 0; kEvenSplit = not given) fix the size of the
//   first / last stage, e.g. to make room for the embedding or the head; they need at least two
//   stages, and the remaining layers are split evenly over the remaining stages, each of which
//   must get at least one layer. With two stages and both given, they must add up to num_layers.
//   A first or last stage of 0 layers (embedding or head only) is allowed.
// Every violation is a Status naming the flags (--num_layers, --pipeline_parallel,
// --virtual_pipeline, --first_stage_layers, --last_stage_layers).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace moe {

// The stage of model chunk `chunk` on pipeline rank `rank`.
inline int StageIndex(int rank, int chunk, int pipeline_size) {
  return chunk * pipeline_size + rank;
}

struct LayerRange {
  int begin = 0;
  int end = 0;  // exclusive
  int size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

struct PartitionOptions {
  static constexpr int kEvenSplit = -1;

  int num_layers = 1;
  int pipeline_size = 1;
  int virtual_chunks = 1;
  int first_stage_layers = kEvenSplit;
  int last_stage_layers = kEvenSplit;
};

class LayerPartition {
 public:
  static StatusOr<LayerPartition> Create(const PartitionOptions& options);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  int pipeline_size() const { return pipeline_size_; }
  int virtual_chunks() const { return num_stages() / pipeline_size_; }

  const LayerRange& stage_layers(int stage) const;
  const LayerRange& layers(int rank, int chunk) const;
  bool is_first_stage(int stage) const { return stage == 0; }
  bool is_last_stage(int stage) const { return stage == num_stages() - 1; }

  // One line per stage: "stage 2 (rank 0, chunk 1): layers [4, 6)".
  std::string ToString() const;

 private:
  LayerPartition(int pipeline_size, std::vector<LayerRange> stages)
      : pipeline_size_(pipeline_size), stages_(std::move(stages)) {}

  int pipeline_size_;
  std::vector<LayerRange> stages_;
};

}  // namespace moe
