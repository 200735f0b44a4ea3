// Tensor::Empty and Tensor::EmptyOnStream (declared in engine/core/tensor.h): allocation needs
// the device's context (its caching allocator, compute stream and pinned pool), which sits above
// core, so the runtime defines them and core includes nothing of the runtime.
#include "engine/core/tensor.h"
#include "engine/runtime/device_context.h"

namespace moe {

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device, MemorySpace space) {
  DeviceContext& context = DeviceContext::Get(device);
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  std::shared_ptr<Storage> storage =
      space == MemorySpace::kDevice ? context.allocator().Allocate(bytes, context.compute_stream())
                                    : context.pinned_pool().Allocate(bytes);
  return Wrap(std::move(storage), shape, dtype);
}

Tensor Tensor::EmptyOnStream(const Shape& shape, DType dtype, Stream& stream) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  return Wrap(DeviceContext::Get(stream.device()).allocator().Allocate(bytes, stream), shape,
              dtype);
}

}  // namespace moe
