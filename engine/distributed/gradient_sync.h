// GradientSync: the data-parallel gradient reduction of one optimizer step, overlapped with
// backward, one collective per bucket of the parameters' flat gradient buffers
// (ParameterSet::buckets(), parameter_buckets.h), over the bucket's replica group
// (replica_group.h: the data group for dense parameters, the expert-data group for experts).
// Backward announces each set of parameters whose gradients are final (no later micro-batch adds
// to them) by name prefix, e.g. "layers.7."; every bucket whose parameters are then all final is
// reduced at once, in bucket order, each on its group's stream after the compute work enqueued so
// far, while compute goes on with the layers before. Gradients still pending zero are written out
// (zeros) first, also in a group of one replica, whose buckets are not reduced. Finish() reduces
// the buckets not yet reduced and makes the compute stream wait for every reduction. Every
// replica announces alike, so the ranks of a group issue the same collectives in the same order.
//
// One state shard (plain data parallel): AllReduceSum of the bucket's buffer, grad = the sum over
// the group's replicas (=, in place) for every parameter. State sharded over the group (the
// distributed optimizer, the bucket's layout.shards == the group's size): ReduceScatterSum in
// place into the rank's owned part of the buffer, which then holds the sum over replicas (=) with
// AllReduceSum's bits on MPI; the rest of the buffer keeps this rank's own gradients, which
// nothing reads before ZeroGrads.
//
// Between a bucket's reduction and Finish() nothing may write its gradients. A traced step
// (step_timeline.h) gets one data-parallel comm span per bucket, named by its first and last
// parameter ("all-reduce bucket 3 (layers.6.attn_norm.weight .. layers.7.mlp.fc2)"), an
// expert-data bucket's with its group ("all-reduce bucket 2 (expert-data) (layers.7.experts...").
#pragma once

#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/distributed/replica_communicators.h"

namespace moe {

class GradientSync {
 public:
  // `groups`: the replica groups' communicators, the data group of size > 1; `parameters`
  // bucketed, each bucket in 1 shard or its group's size; `compute` the stream backward runs on.
  // A group given as nullptr is not reduced: it has one replica, or its gradients are already
  // the sums over its replicas on every rank (then a sharded bucket's owned part is too).
  GradientSync(const ReplicaCommunicators& groups, const ParameterSet& parameters, Stream& compute);

  // The gradients of the parameters whose names start with `prefix` are final: reduces every
  // bucket that is now complete.
  void GradsFinal(const std::string& prefix);
  // Reduces the rest; later compute work waits for every reduction. Call once.
  void Finish();

 private:
  // The communicator that reduces bucket b; nullptr where its group has one replica.
  Communicator* ReducerOf(size_t b) const;

  ReplicaCommunicators groups_;
  const ParameterSet& parameters_;
  Stream& compute_;
  std::vector<bool> final_;          // by parameter (creation order)
  std::vector<bool> issued_;         // by bucket
  std::vector<Communicator*> used_;  // the communicators that reductions were enqueued on
};

}  // namespace moe
