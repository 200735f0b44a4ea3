// GradientSync: the data-parallel gradient all-reduce of one optimizer step, overlapped with
// backward. Backward announces each set of parameters whose gradients are final (no later
// micro-batch adds to them) by name prefix, e.g. "layers.7."; their all-reduces are enqueued at
// once on the data group's stream, after the compute work enqueued so far, and run while compute
// goes on with the layers before. A prefix is one bucket: one all-reduce per parameter of it.
// Finish() reduces whatever was not announced and makes the compute stream wait for every
// all-reduce, so the optimizer sees summed gradients. grad = the sum over replicas (=, in place).
//
// Between GradsFinal(prefix) and Finish() nothing may write those gradients. A traced step
// (step_timeline.h) gets one data-parallel comm span per bucket ("all-reduce layers.7.").
#pragma once

#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/distributed/communicator.h"

namespace moe {

class GradientSync {
 public:
  // `data` is the data-parallel group (size > 1); `compute` the stream backward runs on.
  GradientSync(Communicator& data, const ParameterSet& parameters, Stream& compute);

  // All-reduces the gradients of the not yet reduced parameters whose names start with `prefix`.
  void GradsFinal(const std::string& prefix);
  // All-reduces the rest; later compute work waits for every all-reduce. Call once.
  void Finish();

 private:
  Communicator& data_;
  Stream& compute_;
  std::vector<Parameter*> pending_;  // not yet reduced, in creation order
};

}  // namespace moe
