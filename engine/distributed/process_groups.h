// The pipeline and data-parallel groups of a world of pipeline_size x data_size ranks, in
// Megatron-LM's order: rank = pipeline_rank * data_size + data_rank. The ranks of one pipeline
// group (the stages of one replica) share data_rank, ranked by pipeline_rank; the ranks of one
// data group (the replicas of one stage) share pipeline_rank, ranked by data_rank.
//
// Expert parallelism of size E (Megatron-LM's --expert_model_parallel_size) splits each data group
// further: the expert group is E consecutive data ranks (data_rank / E alike, ranked by data_rank),
// which hold different experts and exchange tokens; the expert-data group is the data ranks with
// the same place in their expert group (data_rank % E alike), which hold the same experts and
// reduce their gradients. With E = 1 neither exists (the data group plays the expert-data role).
//
// Each group has its own communication stream, so a gradient all-reduce over the data group can
// run during backward without holding up the pipeline's sends and receives queued behind it, nor
// the expert group's token exchanges.
#pragma once

#include <memory>

#include "engine/distributed/communicator.h"

namespace moe {

struct ProcessGroups {
  // Declared before the communicators, which wait for their streams when destroyed.
  std::unique_ptr<Stream> pipeline_stream;
  std::unique_ptr<Stream> data_stream;
  std::unique_ptr<Stream> expert_stream;
  std::unique_ptr<Stream> expert_data_stream;
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> data;
  std::unique_ptr<Communicator> expert;       // nullptr unless E > 1
  std::unique_ptr<Communicator> expert_data;  // nullptr unless E > 1
};

// Collective over `world`; pipeline_size must divide its size and expert_size the data size
// (CHECKed: validate first). The streams are new side streams of world's device.
ProcessGroups SplitProcessGroups(Communicator& world, int pipeline_size, int expert_size = 1);

}  // namespace moe
