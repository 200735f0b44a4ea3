// A run's pipeline layout: its stages (partition.h) and its default schedule (schedule.h), made
// together from the layout's options, so that every user (the trainer, the memory estimate, the
// memory planner) builds the same layout and refuses a bad one with the same errors (they name
// the flags: --num_layers, --pipeline_parallel, --virtual_pipeline, ...).
#pragma once

#include <vector>

#include "engine/core/status.h"
#include "engine/pipeline/partition.h"
#include "engine/pipeline/schedule.h"

namespace moe {

struct PipelineLayout {
  LayerPartition partition;
  std::vector<RankActions> schedule;  // by pipeline rank, of DefaultScheduleKind

  // `microbatches`: per data-parallel replica and step.
  static StatusOr<PipelineLayout> Create(const PartitionOptions& options, int microbatches);
};

}  // namespace moe
