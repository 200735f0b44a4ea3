// Communicator: collectives and point-to-point transfers among a group of ranks, ordered on one
// communication stream (a side stream beside compute). Backends: MPI for CPU tensors
// (mpi_communicator.h), NCCL for CUDA tensors (cuda_nccl_communicator.h), and a one-rank
// communicator without MPI (single_rank_communicator.h). World (world.h) makes the first one;
// Split makes sub-communicators (pipeline group, data-parallel group).
//
// Stream order. Every operation is enqueued on stream() and returns at once; Barrier and Split
// alone block the host. The caller orders the comm stream against others with events: the comm
// stream waits on an event recorded after whatever produced a tensor it sends, and a consumer of
// received or reduced data waits on an event recorded on the comm stream after the operation.
// Tensors are kept valid for the operation (CPU: its task holds a reference; CUDA: RecordStream
// on the comm stream, so the caching allocator does not hand the memory out early).
//
// Matching follows NCCL. Every rank of a communicator issues the same collectives in the same
// order. Transfers between two ranks are matched in issue order and must agree in size. Transfers
// that go both ways between ranks belong in one group (GroupStart ... GroupEnd): a group issues
// all its transfers together, so every rank may send first without deadlock. Outside a group a
// transfer may hold the comm stream until its peer has matched it, exactly like ncclSend without
// a group. A rank may send to itself inside a group. Collectives are not allowed inside a group.
//
// AllReduceSum takes f32 or bf16, and every rank receives identical bits. CPU (MPI): rank 0 adds
// the ranks' tensors in rank order, ((x0 + x1) + x2) + ..., (bf16: accumulated in f32, rounded
// once) and broadcasts the sum, so the result is also the same from run to run and independent of
// timing. CUDA (NCCL): NCCL reduces every element once and copies the result to all ranks, so
// ranks agree; it is run-to-run deterministic for a fixed world size and NCCL configuration.
//
// ReduceScatterSum and AllGather cut a tensor of size x n elements into `size` contiguous parts of
// n, part r belonging to rank r (the layout of a sharded buffer). ReduceScatterSum: rank r's
// output = the sum over ranks of their input's part r, f32 or bf16, added in the order
// AllReduceSum adds (MPI: rank order, ((x0 + x1) + x2) + ..., bf16 accumulated in f32 and rounded
// once, so an element equals AllReduceSum's bit for bit; NCCL: its reduction, deterministic for a
// fixed world size and configuration). AllGather: output part r = rank r's input, any dtype, bits
// moved exactly. Either may run in place: the small tensor is then the big one's part `rank`
// (ReduceScatterSum: output = input's part rank; AllGather: input = output's part rank), as NCCL
// defines in-place operation; otherwise the two do not share storage.
//
// Failure. A rank that dies makes mpirun end the others. An operation that has not finished
// `timeout` after it started (CPU: its task began; CUDA: its host call), or an asynchronous NCCL
// error, ends the process with a message naming the operation, rank and host (comm_watchdog.h).
//
// A Communicator is used from one host thread. Its stream must outlive it, and it must be
// destroyed before the World; its destructor waits for its stream.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace moe {

inline constexpr std::chrono::milliseconds kDefaultCommTimeout = std::chrono::minutes(10);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Stream& stream() const { return stream_; }
  Device device() const { return stream_.device(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // tensor = the sum of every rank's tensor, in place. f32 or bf16.
  void AllReduceSum(const Tensor& tensor);
  // tensor = root's tensor on every rank (same shape and dtype everywhere).
  void Broadcast(const Tensor& tensor, int root);
  // output (n) = the sum over ranks of input (size * n) part rank (see above). f32 or bf16.
  void ReduceScatterSum(const Tensor& input, const Tensor& output);
  // output (size * n) part r = rank r's input (n) (see above). Same dtype, any.
  void AllGather(const Tensor& input, const Tensor& output);

  // Point-to-point: send `tensor` to `peer`, or receive into it from `peer`.
  void Send(const Tensor& tensor, int peer);
  void Recv(const Tensor& tensor, int peer);
  // Transfers between these two calls are issued together at GroupEnd. Groups do not nest.
  void GroupStart();
  void GroupEnd();

  // Blocks the host until every rank has reached the barrier and this rank's operations enqueued
  // before it have finished.
  void Barrier();
  // Collective: the ranks with the same color form a new communicator, ranked by (key, rank).
  // Its operations run on `stream` (same device). Blocks the host.
  std::unique_ptr<Communicator> Split(int color, int key, Stream& stream);

 protected:
  struct Transfer {
    bool is_send;
    Tensor tensor;
    int peer;
  };

  Communicator(int rank, int size, Stream& stream, std::chrono::milliseconds timeout);

  // Called after the arguments have been checked. DoTransfers gets one transfer outside a group,
  // or a whole group (never empty).
  virtual void DoAllReduceSum(const Tensor& tensor) = 0;
  virtual void DoBroadcast(const Tensor& tensor, int root) = 0;
  virtual void DoReduceScatterSum(const Tensor& input, const Tensor& output) = 0;
  virtual void DoAllGather(const Tensor& input, const Tensor& output) = 0;
  virtual void DoTransfers(std::vector<Transfer> transfers) = 0;
  virtual void DoBarrier() = 0;
  virtual std::unique_ptr<Communicator> DoSplit(int color, int key, Stream& stream) = 0;

  // E.g. "AllReduceSum of f32[4, 8] (128 bytes)": names an operation in timeout messages.
  static std::string Describe(const char* operation, const Tensor& tensor);
  // E.g. "Send of f32[4] (16 bytes) to rank 1, Recv of f32[4] (16 bytes) from rank 1".
  static std::string Describe(const std::vector<Transfer>& transfers);

 private:
  void CheckNotInGroup(const char* operation) const;
  void CheckTensor(const Tensor& tensor, const char* operation) const;
  void CheckPeer(int peer, const char* operation) const;
  // `whole` (size * n elements) and `part` (n) of one dtype, on this device; in place only as
  // part `rank` of whole.
  void CheckParts(const Tensor& whole, const Tensor& part, const char* operation) const;
  void AddTransfer(Transfer transfer);

  const int rank_;
  const int size_;
  Stream& stream_;
  const std::chrono::milliseconds timeout_;
  bool in_group_ = false;
  std::vector<Transfer> group_;
};

// Runs `issue`, which enqueues operations on comm, ordered after the work already enqueued on
// `compute`, and makes the work enqueued on `compute` afterwards wait for those operations
// (events both ways): the pattern around a batch of transfers or a gradient all-reduce.
void EnqueueBetween(Communicator& comm, Stream& compute, const std::function<void()>& issue);

}  // namespace moe
