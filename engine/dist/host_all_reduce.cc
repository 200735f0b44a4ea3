#include "engine/dist/host_all_reduce.h"

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

}  // namespace moe
