#include "engine/distributed/single_rank_communicator.h"

#include <glog/logging.h>

namespace moe {

SingleRankCommunicator::SingleRankCommunicator(Stream& stream, std::chrono::milliseconds timeout)
    : Communicator(/*rank=*/0, /*size=*/1, stream, timeout) {}

SingleRankCommunicator::~SingleRankCommunicator() { stream().Synchronize(); }

void SingleRankCommunicator::DoTransfers(std::vector<Transfer> transfers) {
  std::vector<const Transfer*> sends, recvs;
  for (const Transfer& t : transfers) (t.is_send ? sends : recvs).push_back(&t);
  CHECK_EQ(sends.size(), recvs.size())
      << "a one-rank communicator matches each send to itself with a receive in the same group";
  for (size_t i = 0; i < sends.size(); ++i) {
    const Tensor& src = sends[i]->tensor;
    const Tensor& dst = recvs[i]->tensor;
    CHECK_EQ(src.nbytes(), dst.nbytes())
        << "send " << src.DebugString() << " into receive " << dst.DebugString();
    CopyOnStream(src, dst);
  }
}

void SingleRankCommunicator::CopyOnStream(const Tensor& src, const Tensor& dst) {
  if (src.data() == dst.data()) return;
  src.RecordStream(stream());
  dst.RecordStream(stream());
  stream().CopyAsync(dst.data(), src.data(), src.nbytes());
}

void SingleRankCommunicator::DoBarrier() { stream().Synchronize(); }

std::unique_ptr<Communicator> SingleRankCommunicator::DoSplit(int /*color*/, int /*key*/,
                                                              Stream& stream) {
  return std::make_unique<SingleRankCommunicator>(stream, timeout());
}

}  // namespace moe
