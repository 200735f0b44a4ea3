// After an optimizer step on a state sharded over the data group (ParameterSet::shards() ==
// data.size()), every rank holds new values for its owned part of each bucket only:
// GatherUpdatedWeights sends them to every rank, one in-place AllGather per bucket of the value
// buffer (bf16 on CUDA; on the CPU the f32 values, which are the master weights), on the data
// group's stream after the compute work enqueued so far (the update), in forward order (the
// embedding's bucket first). Later compute work waits for all of them (EnqueueBetween), so the
// host goes on at once and the device overlaps the gathers with whatever precedes that wait.
// value = the owned parts of every rank (=, every element of every parameter). A traced step gets
// one data-parallel comm span per bucket ("all-gather bucket 3").
#pragma once

#include "engine/autograd/parameters.h"
#include "engine/distributed/communicator.h"

namespace moe {

void GatherUpdatedWeights(Communicator& data, const ParameterSet& parameters, Stream& compute);

}  // namespace moe
