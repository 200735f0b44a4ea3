#include "engine/distributed/host_collectives.h"

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"

namespace moe {

void AllReduceHostValues(Communicator* group, std::vector<float>& values) {
  if (group == nullptr || group->size() == 1) return;
  Tensor t = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kF32, group->device());
  ops::CopyFromHost(values.data(), t);
  EnqueueBetween(*group, DeviceContext::Get(group->device()).compute_stream(),
                 [&] { group->AllReduceSum(t); });
  ops::CopyToHost(t, values.data());
}

std::vector<uint8_t> AllGatherHostBytes(Communicator* group, const void* mine, size_t bytes) {
  const int ranks = group == nullptr ? 1 : group->size();
  std::vector<uint8_t> out(static_cast<size_t>(ranks) * bytes);
  const int rank = group == nullptr ? 0 : group->rank();
  if (bytes > 0) std::memcpy(out.data() + static_cast<size_t>(rank) * bytes, mine, bytes);
  if (ranks == 1 || bytes == 0) return out;
  Tensor t = Tensor::Empty({ranks, static_cast<int64_t>(bytes)}, DType::kU8, group->device());
  ops::CopyFromHost(out.data(), t);
  EnqueueBetween(*group, DeviceContext::Get(group->device()).compute_stream(), [&] {
    for (int root = 0; root < ranks; ++root) group->Broadcast(t.Rows(root, root + 1), root);
  });
  ops::CopyToHost(t, out.data());
  return out;
}

}  // namespace moe
