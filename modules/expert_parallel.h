// A rank's expert parallelism as its MoE layers see it (moe_layer.h): the expert group they
// exchange tokens over, the expert-data group whose experts' gradients the CPU backend sums in
// data-rank order (grouped_mlp.h), and what they exchanged since the trainer last took it
// (ExpertTraffic).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/distributed/communicator.h"

namespace moe {

// Summed over the rank's MoE layers and micro-batches (forward passes; a recomputed forward counts
// again): the rows routed to each expert of the model by the group's ranks, the rows each rank of
// the group received, and the bytes this rank sent to other ranks (both exchanges of forward and
// of backward). Apart, each forward exchange's rows per receiving rank (one layer, one
// micro-batch: what the memory estimate's kExpertRowsMargin covers).
struct ExpertTraffic {
  std::vector<int64_t> rows_per_expert;    // (num_experts)
  std::vector<int64_t> rows_per_rank;      // (group size)
  std::vector<int64_t> rows_per_exchange;  // (exchanges x group size), in exchange order
  int64_t bytes_sent = 0;
};

struct ExpertParallel {
  Communicator* group = nullptr;        // the expert group, E > 1 ranks
  Communicator* expert_data = nullptr;  // the ranks holding the same experts (any size)
  ExpertTraffic traffic;
};

}  // namespace moe
