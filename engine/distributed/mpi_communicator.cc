#include "engine/distributed/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/core/bfloat16.h"
#include "engine/core/mpi_check.h"

namespace moe {
namespace {

constexpr int kTransferTag = 0;
constexpr int kReduceTag = 1;
constexpr int kGatherTag = 2;
// MPI counts are ints: larger messages go in chunks of this many bytes.
constexpr size_t kChunkBytes = size_t{1} << 30;

int CommRank(MPI_Comm comm) {
  int rank = 0;
  MOE_MPI_CALL(MPI_Comm_rank(comm, &rank));
  return rank;
}

int CommSize(MPI_Comm comm) {
  int size = 0;
  MOE_MPI_CALL(MPI_Comm_size(comm, &size));
  return size;
}

CpuStream& AsCpuStream(Stream& stream) {
  auto* cpu_stream = dynamic_cast<CpuStream*>(&stream);
  CHECK(cpu_stream != nullptr) << "an MPI communicator runs on a CPU stream";
  return *cpu_stream;
}

// Nonblocking transfers in chunks, completed together.
class Requests {
 public:
  explicit Requests(MPI_Comm comm) : comm_(comm) {}

  void Send(const void* data, size_t bytes, int peer, int tag) {
    const auto* base = static_cast<const uint8_t*>(data);
    size_t offset = 0;
    do {  // an empty message still goes, so both sides match the same number
      const int count = static_cast<int>(std::min(kChunkBytes, bytes - offset));
      requests_.emplace_back();
      expected_bytes_.push_back(-1);
      MOE_MPI_CALL(MPI_Isend(base + offset, count, MPI_BYTE, peer, tag, comm_, &requests_.back()));
      offset += count;
    } while (offset < bytes);
  }

  void Recv(void* data, size_t bytes, int peer, int tag) {
    auto* base = static_cast<uint8_t*>(data);
    size_t offset = 0;
    do {
      const int count = static_cast<int>(std::min(kChunkBytes, bytes - offset));
      requests_.emplace_back();
      expected_bytes_.push_back(count);
      MOE_MPI_CALL(MPI_Irecv(base + offset, count, MPI_BYTE, peer, tag, comm_, &requests_.back()));
      offset += count;
    } while (offset < bytes);
  }

  // Waits for every request; a receive must get exactly the bytes it asked for (a larger message
  // already fails in MPI with a truncation error).
  void WaitAll() {
    std::vector<MPI_Status> statuses(requests_.size());
    MOE_MPI_CALL(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), statuses.data()));
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (expected_bytes_[i] < 0) continue;
      int count = 0;
      MOE_MPI_CALL(MPI_Get_count(&statuses[i], MPI_BYTE, &count));
      CHECK_EQ(count, expected_bytes_[i])
          << "a receive from rank " << statuses[i].MPI_SOURCE
          << " got a message of another size: the peers' tensors differ";
    }
  }

 private:
  MPI_Comm comm_;
  std::vector<MPI_Request> requests_;
  std::vector<int> expected_bytes_;  // per request; -1 for sends
};

void BroadcastBytes(void* data, size_t bytes, int root, MPI_Comm comm) {
  auto* base = static_cast<uint8_t*>(data);
  for (size_t offset = 0; offset < bytes; offset += kChunkBytes) {
    const int count = static_cast<int>(std::min(kChunkBytes, bytes - offset));
    MOE_MPI_CALL(MPI_Bcast(base + offset, count, MPI_BYTE, root, comm));
  }
}

// The watchdog asks `census` which peers reached a timed-out operation.
CommWatchdog::Hooks CensusHooks(MpiPeerCensus* census) {
  CommWatchdog::Hooks hooks;
  hooks.census = [census](const std::string& operation, std::chrono::milliseconds grace) {
    return census->Take(operation, grace);
  };
  return hooks;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Stream& stream, std::chrono::milliseconds timeout)
    : Communicator(CommRank(comm), CommSize(comm), stream, timeout),
      comm_(comm),
      cpu_stream_(AsCpuStream(stream)),
      census_(MpiPeerCensus::Duplicating(comm)),
      watchdog_("MPI rank " + std::to_string(rank()) + "/" + std::to_string(size()), timeout,
                CensusHooks(census_.get())) {}

MpiCommunicator::~MpiCommunicator() {
  cpu_stream_.Synchronize();
  int finalized = 0;
  MOE_MPI_CALL(MPI_Finalized(&finalized));
  CHECK(!finalized) << "a communicator outlived the World: MPI is already finalized";
  MOE_MPI_CALL(MPI_Comm_free(&comm_));
}

void MpiCommunicator::Run(std::string description, std::function<void()> work) {
  cpu_stream_.Enqueue(
      [this, description = std::move(description), work = std::move(work)]() mutable {
        auto done = std::make_shared<std::atomic<bool>>(false);
        watchdog_.Track(std::move(description), [done] { return done->load(); });
        work();
        // Drop the captured tensors here: the worker destroys a finished task under its queue lock,
        // and freeing a tensor may enqueue on this very stream.
        work = nullptr;
        done->store(true);
      });
}

template <typename T>
void MpiCommunicator::ReduceAtRoot(T* data, int64_t count) {
  std::vector<float> sum(count);
  for (int64_t i = 0; i < count; ++i) sum[i] = ToFloat(data[i]);
  std::vector<T> received(count);
  for (int source = 1; source < size(); ++source) {
    Requests requests(comm_);
    requests.Recv(received.data(), count * sizeof(T), source, kReduceTag);
    requests.WaitAll();
    for (int64_t i = 0; i < count; ++i) sum[i] += ToFloat(received[i]);
  }
  for (int64_t i = 0; i < count; ++i) data[i] = FromFloat<T>(sum[i]);
}

template <typename T>
void MpiCommunicator::ReduceScatterParts(const T* input, T* output, int64_t count) {
  const size_t part_bytes = count * sizeof(T);
  std::vector<T> received(static_cast<size_t>(count) * size());  // part rank() of rank r at r
  Requests requests(comm_);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    requests.Recv(received.data() + peer * count, part_bytes, peer, kReduceTag);
    requests.Send(input + peer * count, part_bytes, peer, kReduceTag);
  }
  requests.WaitAll();
  const T* own = input + rank() * count;
  const auto part_of = [&](int r) { return r == rank() ? own : received.data() + r * count; };
  std::vector<float> sum(count);
  for (int64_t i = 0; i < count; ++i) sum[i] = ToFloat(part_of(0)[i]);
  for (int r = 1; r < size(); ++r) {
    const T* part = part_of(r);
    for (int64_t i = 0; i < count; ++i) sum[i] += ToFloat(part[i]);
  }
  for (int64_t i = 0; i < count; ++i) output[i] = FromFloat<T>(sum[i]);
}

void MpiCommunicator::DoReduceScatterSum(const Tensor& input, const Tensor& output) {
  Run(Describe("ReduceScatterSum", input), [this, input, output] {
    DispatchStorage(output.dtype(), [&]<typename T>(StorageTag<T>) {
      ReduceScatterParts(input.data<T>(), output.data<T>(), output.numel());
    });
  });
}

void MpiCommunicator::DoAllGather(const Tensor& input, const Tensor& output) {
  Run(Describe("AllGather", output), [this, input, output] {
    auto* parts = static_cast<uint8_t*>(output.data());
    const size_t part_bytes = input.nbytes();
    uint8_t* own = parts + rank() * part_bytes;
    if (own != input.data()) std::memcpy(own, input.data(), part_bytes);
    Requests requests(comm_);
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == rank()) continue;
      requests.Recv(parts + peer * part_bytes, part_bytes, peer, kGatherTag);
      requests.Send(own, part_bytes, peer, kGatherTag);
    }
    requests.WaitAll();
  });
}

void MpiCommunicator::DoAllReduceSum(const Tensor& tensor) {
  Run(Describe("AllReduceSum", tensor), [this, tensor] {
    if (size() == 1) return;
    if (rank() == 0) {
      DispatchStorage(tensor.dtype(), [&]<typename T>(StorageTag<T>) {
        ReduceAtRoot(tensor.data<T>(), tensor.numel());
      });
    } else {
      Requests requests(comm_);
      requests.Send(tensor.data(), tensor.nbytes(), 0, kReduceTag);
      requests.WaitAll();
    }
    BroadcastBytes(tensor.data(), tensor.nbytes(), 0, comm_);
  });
}

void MpiCommunicator::DoBroadcast(const Tensor& tensor, int root) {
  Run(Describe("Broadcast", tensor) + " from rank " + std::to_string(root),
      [this, tensor, root] { BroadcastBytes(tensor.data(), tensor.nbytes(), root, comm_); });
}

void MpiCommunicator::DoTransfers(std::vector<Transfer> transfers) {
  std::string description = Describe(transfers);
  Run(std::move(description), [this, transfers = std::move(transfers)] {
    Requests requests(comm_);
    for (const Transfer& t : transfers) {
      if (!t.is_send) requests.Recv(t.tensor.data(), t.tensor.nbytes(), t.peer, kTransferTag);
    }
    for (const Transfer& t : transfers) {
      if (t.is_send) requests.Send(t.tensor.data(), t.tensor.nbytes(), t.peer, kTransferTag);
    }
    requests.WaitAll();
  });
}

void MpiCommunicator::DoBarrier() {
  Run("Barrier", [this] { MOE_MPI_CALL(MPI_Barrier(comm_)); });
  cpu_stream_.Synchronize();
}

std::unique_ptr<Communicator> MpiCommunicator::DoSplit(int color, int key, Stream& stream) {
  MPI_Comm split = MPI_COMM_NULL;
  Run("Split",
      [this, color, key, &split] { MOE_MPI_CALL(MPI_Comm_split(comm_, color, key, &split)); });
  cpu_stream_.Synchronize();
  return std::make_unique<MpiCommunicator>(split, stream, timeout());
}

}  // namespace moe
