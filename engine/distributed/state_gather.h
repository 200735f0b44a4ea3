// GatherBucketState: one bucket's optimizer state whole on one rank, out of a state sharded over
// the bucket's replica group (replica_group.h; its layout.shards == the group's size), for
// checkpoints in the single-process format. Collective over that group (groups[replicas]):
// every rank but `root` (a rank of the group) sends its owned part of the bucket's master,
// exp_avg and exp_avg_sq to root (one transfer group, on the group's stream after the compute
// work enqueued so far); root puts them, and its own part, in new whole buffers
// (ParameterSet::NewWholeBucketState, padding zero) and returns them. Compute work enqueued
// afterwards waits for the transfers. The other ranks return an empty state (undefined tensors).
// Root holds the whole bucket's state (12 bytes per parameter) until it drops the result.
#pragma once

#include <cstddef>

#include "engine/autograd/parameters.h"
#include "engine/distributed/replica_communicators.h"

namespace moe {

WholeBucketState GatherBucketState(const ReplicaCommunicators& groups,
                                   const ParameterSet& parameters, size_t bucket, int root);

}  // namespace moe
