#include "engine/distributed/world.h"

#include "engine/core/check.h"
#include "engine/runtime/device_context.h"
#if !MOE_WITH_MPI
#include "engine/distributed/single_rank_communicator.h"
#if MOE_WITH_CUDA
#include "engine/distributed/cuda_nccl_communicator.h"
#endif
#endif

namespace moe {

World::World(int rank, int size, int local_rank, int local_size)
    : rank_(rank), size_(size), local_rank_(local_rank), local_size_(local_size) {}

StatusOr<Device> World::SelectDevice(DeviceType type) const {
  if (type == DeviceType::kCPU) return Device::CPU();
  const Device device = Device::CUDA(local_rank_);
  const Status available = CheckDeviceAvailable(device);
  if (!available.ok()) {
    std::string message = "rank " + std::to_string(rank_) + " (local rank " +
                          std::to_string(local_rank_) + " of " + std::to_string(local_size_) +
                          " on host " + HostName() + ") would use " + device.ToString() + ": " +
                          available.message();
    if (CudaDeviceCount() > 0) message += "; start at most one rank per GPU on each host";
    return FailedPrecondition(std::move(message));
  }
  DeviceContext::Get(device);  // selects it for this thread
  return device;
}

#if !MOE_WITH_MPI
namespace {

// The world of a build without MPI: this process alone.
class SingleProcessWorld final : public World {
 public:
  SingleProcessWorld() : World(/*rank=*/0, /*size=*/1, /*local_rank=*/0, /*local_size=*/1) {}

  std::unique_ptr<Communicator> NewCommunicator(Stream& stream,
                                                std::chrono::milliseconds timeout) override {
#if MOE_WITH_CUDA
    if (stream.device().is_cuda()) {
      return NewNcclCommunicator(NewNcclUniqueId(), /*rank=*/0, /*size=*/1, stream, timeout,
                                 /*census=*/nullptr);
    }
#endif
    return std::make_unique<SingleRankCommunicator>(stream, timeout);
  }

  Status AllAgree(const Status& local) override { return local; }

  std::string Broadcast(const std::string& data, int) override { return data; }
};

}  // namespace

StatusOr<std::unique_ptr<World>> World::Init() {
  SetProcessRank(0);
  return std::unique_ptr<World>(std::make_unique<SingleProcessWorld>());
}
#endif  // !MOE_WITH_MPI

}  // namespace moe
