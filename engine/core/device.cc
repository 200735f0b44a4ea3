#include "engine/core/device.h"

namespace moe {

std::string Device::ToString() const {
  return type == DeviceType::kCPU ? "cpu" : "cuda:" + std::to_string(index);
}

const char* MemorySpaceName(MemorySpace space) {
  return space == MemorySpace::kDevice ? "device" : "pinned_host";
}

}  // namespace moe
