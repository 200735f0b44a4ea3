// GatherBucketState: one bucket's optimizer state whole on one rank, out of a state sharded over
// the data group (ParameterSet::shards() == data.size()), for checkpoints in the single-process
// format. Collective over `data`: every rank but `root` sends its owned part of the bucket's
// master, exp_avg and exp_avg_sq to root (one transfer group, on the data group's stream after
// the compute work enqueued so far); root puts them, and its own part, in new whole buffers
// (ParameterSet::NewWholeBucketState, padding zero) and returns them. Compute work enqueued
// afterwards waits for the transfers. The other ranks return an empty state (undefined tensors).
// Root holds the whole bucket's state (12 bytes per parameter) until it drops the result.
#pragma once

#include <cstddef>

#include "engine/autograd/parameters.h"
#include "engine/distributed/communicator.h"

namespace moe {

WholeBucketState GatherBucketState(Communicator& data, const ParameterSet& parameters,
                                   size_t bucket, int root);

}  // namespace moe
