// A Communicator of one rank, on any stream, with no MPI: what a one-process run has when the
// build has no MPI. AllReduceSum and Broadcast leave the tensor as it is; ReduceScatterSum and
// AllGather copy input to output (nothing in place); a rank's sends to itself are matched in
// order with its receives from itself in the same group (a stream copy each).
#pragma once

#include "engine/distributed/communicator.h"

namespace moe {

class SingleRankCommunicator final : public Communicator {
 public:
  SingleRankCommunicator(Stream& stream, std::chrono::milliseconds timeout);
  ~SingleRankCommunicator() override;

 private:
  void DoAllReduceSum(const Tensor& /*tensor*/) override {}
  void DoBroadcast(const Tensor& /*tensor*/, int /*root*/) override {}
  void DoReduceScatterSum(const Tensor& input, const Tensor& output) override {
    CopyOnStream(input, output);
  }
  void DoAllGather(const Tensor& input, const Tensor& output) override {
    CopyOnStream(input, output);
  }
  void DoTransfers(std::vector<Transfer> transfers) override;
  void DoBarrier() override;
  std::unique_ptr<Communicator> DoSplit(int color, int key, Stream& stream) override;
  // dst = src (same bytes) on the stream; nothing when they are the same memory.
  void CopyOnStream(const Tensor& src, const Tensor& dst);
};

}  // namespace moe
