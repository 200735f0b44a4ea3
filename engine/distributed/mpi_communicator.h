// The CPU backend's Communicator: MPI, on a CpuStream (include only from MPI translation units).
//
// Every operation is one task on the stream, so communication runs on the comm stream's worker
// thread beside compute, as a GPU comm stream would. Inside a task the calls block: a transfer
// group posts all its MPI_Isend/MPI_Irecv before one MPI_Waitall, which is why paired send/recv
// cannot deadlock; a collective waits for its peers like a device kernel would.
//
// AllReduceSum is an explicit ordered reduction (not MPI_Allreduce, whose float result may differ
// between ranks and runs): ranks 1..n-1 send to rank 0, which adds them in rank order,
// ((x0 + x1) + x2) + ..., then broadcasts the bytes of the sum. bf16 is accumulated in f32 and
// rounded once. Rank 0 receives n-1 tensors, which is fine at the sizes the CPU backend runs.
// ReduceScatterSum is the same sum per part: every rank sends part r to rank r, which adds the
// ranks' parts in rank order (its own at its place), so an element has AllReduceSum's bits.
// AllGather: every rank sends its input to every other rank (exact bytes).
//
// Threads: every communicator's worker and the host thread call MPI at the same time, each on its
// own MPI communicator, so MPI must provide MPI_THREAD_MULTIPLE (World::Init checks it). Messages
// larger than MPI's int counts are sent in chunks. A timed-out operation names the ranks that did
// not arrive at it (mpi_peer_census.h).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/comm_watchdog.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/mpi_peer_census.h"
#include "engine/runtime/cpu_stream.h"

namespace moe {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed by the destructor after the stream has drained). `stream`
  // must be a CpuStream.
  MpiCommunicator(MPI_Comm comm, Stream& stream, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

 private:
  void DoAllReduceSum(const Tensor& tensor) override;
  void DoBroadcast(const Tensor& tensor, int root) override;
  void DoReduceScatterSum(const Tensor& input, const Tensor& output) override;
  void DoAllGather(const Tensor& input, const Tensor& output) override;
  void DoTransfers(std::vector<Transfer> transfers) override;
  void DoBarrier() override;
  std::unique_ptr<Communicator> DoSplit(int color, int key, Stream& stream) override;

  // Enqueues `work` on the stream; the watchdog watches it from when it starts until it returns.
  void Run(std::string description, std::function<void()> work);
  // Rank 0's side of AllReduceSum: receives and adds the other ranks' tensors in rank order.
  template <typename T>
  void ReduceAtRoot(T* data, int64_t count);
  // This rank's side of ReduceScatterSum: sends the other parts of `input` to their ranks,
  // receives theirs of its own part, adds all in rank order into `output` (count elements).
  template <typename T>
  void ReduceScatterParts(const T* input, T* output, int64_t count);

  MPI_Comm comm_;
  CpuStream& cpu_stream_;
  const std::unique_ptr<MpiPeerCensus> census_;  // outlives the watchdog, whose failure takes it
  CommWatchdog watchdog_;
};

}  // namespace moe
