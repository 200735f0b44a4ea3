// The memory a training run needs on each pipeline rank of its layout: what moe_train checks at
// start (apps/moe_train/memory_check.h, against its busiest rank) and what `moe_train --dry_run`
// prints for every rank. The counts are memory_estimate.h's (its sizes, its conventions), taken
// for each rank's own stages instead of one bound for all:
// - Layers and ends: the run's PipelineLayout (engine/pipeline/layout.h); chunk c of rank r is
//   stage c x p + r, the embedding on the first stage, the final norm and the head on the last.
// - State: the rank's parameters (its layers', LayerParameters: 1 / E of each MoE layer's experts
//   under expert parallelism, and its ends'), split into weights (the copy compute reads: bf16 on
//   CUDA, the f32 master on the CPU), gradients (the main grads' dtype) and optimizer (the AdamW
//   moments, and on CUDA the f32 master weights; under the distributed optimizer 1 / state_shards
//   of them, of the experts' 1 / (state_shards / E)): RankStateBytes.
// - Activations: walking the rank's list of the schedule, the most bytes held by the (micro-batch,
//   chunk) passes whose forward has run and whose backward has not; a pass holds its chunk's
//   saves: each layer's (ActivationBytesPerLayer, with what that layer recomputes, counted at the
//   larger of the rank's layer kinds, as memory_estimate.h counts), the embedding's on the first
//   stage and the head's on the last (EmbeddingSaves, HeadSaves). Plus the weight-gradient
//   operands its MoE layers hold (PendingWeightGradBytes).
// - Workspace: the larger of the head's forward (HeadForwardWorkspace, on the rank with the last
//   stage) and one layer's backward (its saves without recompute, the larger kind's).
// With one stage the figures are EstimateTrainingMemory's, exactly; with a pipeline each rank's
// own, where that function counts one bound for every rank: the largest stage, both ends, every
// layer as not recomputed (tests/modules/layout_estimate_test.cc). Nothing is allocated: a model
// of any size is estimated in microseconds per layer.
#pragma once

#include <vector>

#include "engine/core/status.h"
#include "engine/pipeline/layout.h"
#include "modules/memory_estimate.h"

namespace moe {

struct RankMemoryEstimate {
  int rank = 0;                    // pipeline rank
  std::vector<LayerRange> chunks;  // its stages' layers, by chunk
  bool embedding = false;          // holds the first stage
  bool head = false;               // holds the last stage
  // parameters, state_bytes, activation_bytes, workspace_bytes, total_bytes of this rank.
  MemoryEstimate memory;
  double weight_bytes = 0;  // state_bytes = weight + gradient + optimizer bytes
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  int passes_in_flight = 0;  // (micro-batch, chunk) passes held at the activations' peak
};

struct LayoutMemoryEstimate {
  std::vector<RankMemoryEstimate> ranks;  // by pipeline rank

  // The rank with the largest total (the first of equals).
  const RankMemoryEstimate& busiest() const;
};

// The run's stages and schedule, or the error naming the flags (--num_layers, ...).
StatusOr<PipelineLayout> MakePipelineLayout(const MemoryEstimateOptions& options);

// Every pipeline rank's figures; an error when the layout is not one (MakePipelineLayout).
StatusOr<LayoutMemoryEstimate> EstimateLayoutMemory(const MemoryEstimateOptions& options);

}  // namespace moe
