// The pipeline and data-parallel groups of a world of pipeline_size x data_size ranks, in
// Megatron-LM's order: rank = pipeline_rank * data_size + data_rank. The ranks of one pipeline
// group (the stages of one replica) share data_rank, ranked by pipeline_rank; the ranks of one
// data group (the replicas of one stage) share pipeline_rank, ranked by data_rank.
//
// Each group has its own communication stream, so a gradient all-reduce over the data group can
// run during backward without holding up the pipeline's sends and receives queued behind it.
#pragma once

#include <memory>

#include "engine/distributed/communicator.h"

namespace moe {

struct ProcessGroups {
  // Declared before the communicators, which wait for their streams when destroyed.
  std::unique_ptr<Stream> pipeline_stream;
  std::unique_ptr<Stream> data_stream;
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> data;
};

// Collective over `world`; pipeline_size must divide its size (CHECKed: validate first). The
// streams are new side streams of world's device.
ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size);

}  // namespace moe
