#include "engine/distributed/cuda_nccl_communicator.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/distributed/comm_watchdog.h"
#include "engine/runtime/cuda_stream.h"

namespace moe {
namespace {

static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);

CudaStream& AsCudaStream(Stream& stream) {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  CHECK(cuda_stream != nullptr) << "an NCCL communicator runs on a CUDA stream";
  return *cuda_stream;
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    default:
      LOG(FATAL) << "no NCCL reduction type for " << DTypeName(dtype);
  }
  __builtin_unreachable();
}

int UserRank(ncclComm_t comm) {
  int rank = 0;
  MOE_NCCL_CALL(ncclCommUserRank(comm, &rank));
  return rank;
}

int Count(ncclComm_t comm) {
  int count = 0;
  MOE_NCCL_CALL(ncclCommCount(comm, &count));
  return count;
}

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`; `census` may be null.
  NcclCommunicator(ncclComm_t comm, Stream& stream, std::chrono::milliseconds timeout,
                   std::unique_ptr<PeerCensus> census)
      : Communicator(UserRank(comm), Count(comm), stream, timeout),
        comm_(comm),
        cuda_stream_(AsCudaStream(stream)),
        device_index_(stream.device().index),
        census_(std::move(census)) {
    CommWatchdog::Hooks hooks;
    hooks.thread_setup = [device = device_index_] { MOE_CUDA_CALL(cudaSetDevice(device)); };
    hooks.async_error = [comm]() -> std::string {
      ncclResult_t result = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &result) != ncclSuccess)
        return "ncclCommGetAsyncError failed";
      if (result == ncclSuccess || result == ncclInProgress) return "";
      return std::string(ncclGetErrorString(result)) + ": " + ncclGetLastError(comm);
    };
    hooks.abort = [comm] { ncclCommAbort(comm); };
    if (census_ != nullptr) {
      hooks.census = [census = census_.get()](const std::string& operation,
                                              std::chrono::milliseconds grace) {
        return census->Take(operation, grace);
      };
    }
    watchdog_ = std::make_unique<CommWatchdog>("NCCL rank " + std::to_string(rank()) + "/" +
                                                   std::to_string(size()) + " on " +
                                                   stream.device().ToString(),
                                               timeout, std::move(hooks));
  }

  ~NcclCommunicator() override {
    cuda_stream_.Synchronize();  // still watched: a hang here ends the process
    watchdog_.reset();
    MOE_NCCL_CALL(ncclCommFinalize(comm_));
    MOE_NCCL_CALL(ncclCommDestroy(comm_));
  }

 private:
  void DoAllReduceSum(const Tensor& tensor) override {
    tensor.RecordStream(stream());
    Watched(Describe("AllReduceSum", tensor), [&] {
      MOE_NCCL_CALL(ncclAllReduce(tensor.data(), tensor.data(), tensor.numel(),
                                  NcclType(tensor.dtype()), ncclSum, comm_, cuda_stream_.get()));
    });
  }

  void DoBroadcast(const Tensor& tensor, int root) override {
    tensor.RecordStream(stream());
    Watched(Describe("Broadcast", tensor) + " from rank " + std::to_string(root), [&] {
      MOE_NCCL_CALL(ncclBroadcast(tensor.data(), tensor.data(), tensor.nbytes(), ncclUint8, root,
                                  comm_, cuda_stream_.get()));
    });
  }

  void DoReduceScatterSum(const Tensor& input, const Tensor& output) override {
    input.RecordStream(stream());
    output.RecordStream(stream());
    Watched(Describe("ReduceScatterSum", input), [&] {
      MOE_NCCL_CALL(ncclReduceScatter(input.data(), output.data(), output.numel(),
                                      NcclType(output.dtype()), ncclSum, comm_,
                                      cuda_stream_.get()));
    });
  }

  void DoAllGather(const Tensor& input, const Tensor& output) override {
    input.RecordStream(stream());
    output.RecordStream(stream());
    Watched(Describe("AllGather", output), [&] {
      MOE_NCCL_CALL(ncclAllGather(input.data(), output.data(), input.nbytes(), ncclUint8, comm_,
                                  cuda_stream_.get()));
    });
  }

  void DoTransfers(std::vector<Transfer> transfers) override {
    for (const Transfer& t : transfers) t.tensor.RecordStream(stream());
    // ncclGroupEnd blocks the host while NCCL connects to a new peer: watched from the start.
    Watched(Describe(transfers), [&] {
      MOE_NCCL_CALL(ncclGroupStart());
      for (const Transfer& t : transfers) {
        if (t.is_send) {
          MOE_NCCL_CALL(ncclSend(t.tensor.data(), t.tensor.nbytes(), ncclUint8, t.peer, comm_,
                                 cuda_stream_.get()));
        } else {
          MOE_NCCL_CALL(ncclRecv(t.tensor.data(), t.tensor.nbytes(), ncclUint8, t.peer, comm_,
                                 cuda_stream_.get()));
        }
      }
      MOE_NCCL_CALL(ncclGroupEnd());
    });
  }

  void DoBarrier() override {
    if (!barrier_buffer_.defined()) {
      barrier_buffer_ = Tensor::Empty({1}, DType::kF32, device());
      barrier_buffer_.RecordStream(stream());
    }
    Watched("Barrier", [&] {
      MOE_NCCL_CALL(ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1, ncclFloat32,
                                  ncclSum, comm_, cuda_stream_.get()));
    });
    cuda_stream_.Synchronize();
  }

  std::unique_ptr<Communicator> DoSplit(int color, int key, Stream& stream) override {
    AsCudaStream(stream);
    MOE_CUDA_CALL(cudaSetDevice(device_index_));
    ncclComm_t split = nullptr;
    Watched("Split", [&] {  // a null config: the parent's
      MOE_NCCL_CALL(ncclCommSplit(comm_, color, key, &split, /*config=*/nullptr));
    });
    std::unique_ptr<PeerCensus> census = census_ ? census_->Split(color, key) : nullptr;
    return std::make_unique<NcclCommunicator>(split, stream, timeout(), std::move(census));
  }

  // Runs `enqueue` under the watchdog, from the host call (which may block, e.g. while NCCL
  // connects to a peer) until the comm stream has passed the work it enqueued.
  void Watched(std::string description, const std::function<void()>& enqueue) {
    struct Progress {
      std::unique_ptr<Event> event;
      std::atomic<bool> enqueued{false};
    };
    auto progress = std::make_shared<Progress>();
    progress->event = stream().CreateEvent(/*enable_timing=*/false);
    watchdog_->Track(std::move(description),
                     [progress] { return progress->enqueued.load() && progress->event->Query(); });
    enqueue();
    progress->event->Record(stream());
    progress->enqueued.store(true);
  }

  ncclComm_t comm_;
  CudaStream& cuda_stream_;
  const int device_index_;
  const std::unique_ptr<PeerCensus> census_;  // outlives the watchdog, whose failure takes it
  std::unique_ptr<CommWatchdog> watchdog_;
  Tensor barrier_buffer_;  // (1) f32, summed by Barrier (its value never matters)
};

}  // namespace

std::string NewNcclUniqueId() {
  ncclUniqueId id;
  MOE_NCCL_CALL(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> NewNcclCommunicator(const std::string& unique_id, int rank, int size,
                                                  Stream& stream, std::chrono::milliseconds timeout,
                                                  std::unique_ptr<PeerCensus> census) {
  CHECK_EQ(unique_id.size(), sizeof(ncclUniqueId::internal));
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  MOE_CUDA_CALL(cudaSetDevice(AsCudaStream(stream).device().index));
  ncclComm_t comm = nullptr;
  MOE_NCCL_CALL(ncclCommInitRank(&comm, size, id, rank));
  return std::make_unique<NcclCommunicator>(comm, stream, timeout, std::move(census));
}

}  // namespace moe
