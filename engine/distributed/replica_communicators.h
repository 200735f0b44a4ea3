// The communicators of the replica groups (engine/autograd/replica_group.h) of one pipeline stage:
// data, the stage's data-parallel group; expert_data, the ranks holding the same experts (the data
// group itself without expert parallelism). nullptr, or a communicator of size 1: the group has one
// replica. GradientSync, WeightGather and GatherBucketState use each bucket's group's.
#pragma once

#include "engine/autograd/replica_group.h"
#include "engine/distributed/communicator.h"

namespace moe {

using ReplicaCommunicators = ByReplicaGroup<Communicator*>;

}  // namespace moe
