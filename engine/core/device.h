// Where a tensor lives: the backend device (CPU or CUDA:n) and the memory space on it.
// On the CPU backend "device" memory is a separate arena so tests can measure it like GPU memory.
#pragma once

#include <cstdint>
#include <string>

namespace moe {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device CPU() { return {DeviceType::kCPU, 0}; }
  static Device CUDA(int index) { return {DeviceType::kCUDA, index}; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string ToString() const;
};

enum class MemorySpace : uint8_t {
  kDevice,      // the device's own memory (its caching allocator)
  kPinnedHost,  // page-locked host memory from the pinned pool
};

const char* MemorySpaceName(MemorySpace space);

}  // namespace moe
