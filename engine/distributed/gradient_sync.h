// GradientSync: the data-parallel gradient reduction of one optimizer step, overlapped with
// backward, one collective per bucket of the parameters' flat gradient buffers
// (ParameterSet::buckets(), parameter_buckets.h). Backward announces each set of parameters whose
// gradients are final (no later micro-batch adds to them) by name prefix, e.g. "layers.7."; every
// bucket whose parameters are then all final is reduced at once, in bucket order, on the data
// group's stream after the compute work enqueued so far, while compute goes on with the layers
// before. Gradients still pending zero are written out (zeros) first. Finish() reduces the
// buckets not yet reduced and makes the compute stream wait for every reduction. Every replica
// announces alike, so the ranks issue the same collectives in the same order.
//
// One state shard (plain data parallel): AllReduceSum of the bucket's buffer, grad = the sum over
// replicas (=, in place) for every parameter. State sharded over the data group (the distributed
// optimizer, parameters.shards() == data.size()): ReduceScatterSum in place into the rank's owned
// part of the buffer, which then holds the sum over replicas (=) with AllReduceSum's bits on MPI;
// the rest of the buffer keeps this rank's own gradients, which nothing reads before ZeroGrads.
//
// Between a bucket's reduction and Finish() nothing may write its gradients. A traced step
// (step_timeline.h) gets one data-parallel comm span per bucket, named by its first and last
// parameter ("all-reduce bucket 3 (layers.6.attn_norm.weight .. layers.7.mlp.fc2)").
#pragma once

#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/distributed/communicator.h"

namespace moe {

class GradientSync {
 public:
  // `data` is the data-parallel group (size > 1); `parameters` bucketed, with 1 or data.size()
  // shards; `compute` the stream backward runs on.
  GradientSync(Communicator& data, const ParameterSet& parameters, Stream& compute);

  // The gradients of the parameters whose names start with `prefix` are final: reduces every
  // bucket that is now complete.
  void GradsFinal(const std::string& prefix);
  // Reduces the rest; later compute work waits for every reduction. Call once.
  void Finish();

 private:
  Communicator& data_;
  const ParameterSet& parameters_;
  Stream& compute_;
  std::vector<bool> final_;   // by parameter (creation order)
  std::vector<bool> issued_;  // by bucket
};

}  // namespace moe
