// WeightGather: after an optimizer step on a state sharded over the replica groups (each bucket
// over its own group, replica_group.h: ParameterBucket::layout.shards == the group's size) every
// rank holds new values for its owned part of each sharded bucket only; WeightGather sends them to
// every rank of the bucket's group, overlapped with the next forward. Buckets of one shard (their
// group of one replica, or a state not sharded) are left alone.
//
// Start() enqueues one in-place AllGather per sharded bucket of the value buffer (bf16 on CUDA; on
// the CPU the f32 values, which are the master weights) on its group's stream, after the compute
// work enqueued so far (the update), in forward order (the embedding's bucket first), each
// followed by an event, and returns at once. Before the next forward reads the weights named
// `prefix`..., it calls WaitFor(prefix): later compute work waits for the gathers of the buckets
// that hold them (each bucket once), so a layer's forward overlaps the gathers of the layers
// after it. WaitAll() waits for every gather still pending (before the optimizer writes the
// values again, and before evaluation, checkpoints or a reader of the parameters). Until a
// bucket is waited for, nothing may read or write its values. value = every rank's owned parts
// (=, every element of every parameter).
//
// The gathers run between steps, outside any step's timeline: their time shows in the next
// step's forward as far as compute waits for them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/distributed/replica_communicators.h"

namespace moe {

class WeightGather {
 public:
  // `groups`: the replica groups' communicators (each sharded bucket's group's of its shards'
  // size); `compute`: the stream the optimizer and the forward run on.
  WeightGather(const ReplicaCommunicators& groups, const ParameterSet& parameters, Stream& compute);

  // Enqueues the gathers; the previous ones must have been waited for.
  void Start();
  // Compute waits for the pending gathers of the buckets holding parameters named prefix...
  void WaitFor(const std::string& prefix);
  // Compute waits for every pending gather.
  void WaitAll();

 private:
  ReplicaCommunicators groups_;
  const ParameterSet& parameters_;
  Stream& compute_;
  std::vector<std::unique_ptr<Event>> gathered_;  // by bucket: pending gather's event, or null
};

}  // namespace moe
