// The pipeline and data-parallel groups of a world of pipeline_size x data_size ranks, in
// Megatron-LM's order: rank = pipeline_rank * data_size + data_rank. The ranks of one pipeline
// group (the stages of one replica) share data_rank, ranked by pipeline_rank; the ranks of one
// data group (the replicas of one stage) share pipeline_rank, ranked by data_rank.
#pragma once

#include <memory>

#include "engine/dist/communicator.h"

namespace moe {

struct ProcessGroups {
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> data;
};

// Collective over `world`; pipeline_size must divide its size (CHECKed: validate first). Both
// groups run their operations on `stream`.
ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size, Stream& stream);

}  // namespace moe
