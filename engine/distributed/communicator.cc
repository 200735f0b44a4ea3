#include "engine/distributed/communicator.h"

#include <cstdint>

#include <glog/logging.h>

namespace moe {

Communicator::Communicator(int rank, int size, Stream& stream, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), stream_(stream), timeout_(timeout) {
  CHECK_GE(size, 1);
  CHECK(rank >= 0 && rank < size) << "rank " << rank << " of " << size;
  CHECK_GT(timeout.count(), 0);
}

void Communicator::AllReduceSum(const Tensor& tensor) {
  CheckNotInGroup("AllReduceSum");
  CheckTensor(tensor, "AllReduceSum");
  CHECK(tensor.dtype() == DType::kF32 || tensor.dtype() == DType::kBF16)
      << "AllReduceSum takes f32 or bf16, not " << tensor.DebugString();
  DoAllReduceSum(tensor);
}

void Communicator::Broadcast(const Tensor& tensor, int root) {
  CheckNotInGroup("Broadcast");
  CheckTensor(tensor, "Broadcast");
  CheckPeer(root, "Broadcast");
  DoBroadcast(tensor, root);
}

void Communicator::ReduceScatterSum(const Tensor& input, const Tensor& output) {
  CheckNotInGroup("ReduceScatterSum");
  CheckParts(input, output, "ReduceScatterSum");
  CHECK(output.dtype() == DType::kF32 || output.dtype() == DType::kBF16)
      << "ReduceScatterSum takes f32 or bf16, not " << output.DebugString();
  DoReduceScatterSum(input, output);
}

void Communicator::AllGather(const Tensor& input, const Tensor& output) {
  CheckNotInGroup("AllGather");
  CheckParts(output, input, "AllGather");
  DoAllGather(input, output);
}

void Communicator::Send(const Tensor& tensor, int peer) {
  CheckPeer(peer, "Send");
  AddTransfer({/*is_send=*/true, tensor, peer});
}

void Communicator::Recv(const Tensor& tensor, int peer) {
  CheckPeer(peer, "Recv");
  AddTransfer({/*is_send=*/false, tensor, peer});
}

void Communicator::GroupStart() {
  CHECK(!in_group_) << "communicator groups do not nest";
  in_group_ = true;
}

void Communicator::GroupEnd() {
  CHECK(in_group_) << "GroupEnd without GroupStart";
  in_group_ = false;
  if (group_.empty()) return;
  std::vector<Transfer> transfers;
  transfers.swap(group_);
  DoTransfers(std::move(transfers));
}

void Communicator::Barrier() {
  CheckNotInGroup("Barrier");
  DoBarrier();
}

std::unique_ptr<Communicator> Communicator::Split(int color, int key, Stream& stream) {
  CheckNotInGroup("Split");
  CHECK_GE(color, 0) << "Split: every rank joins a sub-communicator; colors are >= 0";
  CHECK(stream.device() == device())
      << "Split: the new communicator's stream is on " << stream.device().ToString()
      << ", this one's on " << device().ToString();
  return DoSplit(color, key, stream);
}

std::string Communicator::Describe(const char* operation, const Tensor& tensor) {
  return std::string(operation) + " of " + DTypeName(tensor.dtype()) + ShapeString(tensor.shape()) +
         " (" + std::to_string(tensor.nbytes()) + " bytes)";
}

std::string Communicator::Describe(const std::vector<Transfer>& transfers) {
  std::string description;
  for (const Transfer& t : transfers) {
    if (!description.empty()) description += ", ";
    description += Describe(t.is_send ? "Send" : "Recv", t.tensor) +
                   (t.is_send ? " to rank " : " from rank ") + std::to_string(t.peer);
  }
  return description;
}

void Communicator::CheckNotInGroup(const char* operation) const {
  CHECK(!in_group_) << operation << " inside a group: only Send and Recv can be grouped";
}

void Communicator::CheckTensor(const Tensor& tensor, const char* operation) const {
  CHECK(tensor.defined()) << operation << " of an undefined tensor";
  CHECK(tensor.device() == device()) << operation << " of " << tensor.DebugString()
                                     << " on a communicator of " << device().ToString();
  // NCCL reads and writes device memory only.
  CHECK(!device().is_cuda() || tensor.space() == MemorySpace::kDevice)
      << operation << " of " << tensor.DebugString() << ": NCCL needs device memory";
}

void Communicator::CheckPeer(int peer, const char* operation) const {
  CHECK(peer >= 0 && peer < size_)
      << operation << ": rank " << peer << " is not in a communicator of " << size_ << " ranks";
}

void Communicator::CheckParts(const Tensor& whole, const Tensor& part,
                              const char* operation) const {
  CheckTensor(whole, operation);
  CheckTensor(part, operation);
  CHECK(whole.dtype() == part.dtype())
      << operation << " of " << whole.DebugString() << " and " << part.DebugString();
  CHECK_EQ(whole.numel(), part.numel() * size_)
      << operation << ": " << whole.DebugString() << " is not " << size_ << " parts of "
      << part.DebugString();
  if (!whole.SharesStorageWith(part)) return;
  const auto* own_part = static_cast<const uint8_t*>(whole.data()) + part.nbytes() * rank_;
  CHECK(part.data() == own_part) << operation << " in place: " << part.DebugString()
                                 << " must be part " << rank_ << " of " << whole.DebugString();
}

void Communicator::AddTransfer(Transfer transfer) {
  CheckTensor(transfer.tensor, transfer.is_send ? "Send" : "Recv");
  if (in_group_) {
    group_.push_back(std::move(transfer));
    return;
  }
  std::vector<Transfer> single;
  single.push_back(std::move(transfer));
  DoTransfers(std::move(single));
}

void EnqueueBetween(Communicator& comm, Stream& compute, const std::function<void()>& issue) {
  CHECK(comm.device() == compute.device())
      << "comm on " << comm.device().ToString() << ", compute on " << compute.device().ToString();
  const std::unique_ptr<Event> produced = compute.CreateEvent();
  produced->Record(compute);
  comm.stream().Wait(*produced);
  issue();
  const std::unique_ptr<Event> done = comm.stream().CreateEvent();
  done->Record(comm.stream());
  compute.Wait(*done);
}

}  // namespace moe
