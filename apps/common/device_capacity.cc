#include "apps/common/device_capacity.h"

#include <cstdio>

namespace moe {

double UsableBytes(const Device& device, size_t capacity_bytes) {
  const auto capacity = static_cast<double>(capacity_bytes);
  return device.is_cuda() ? capacity * (1 - kCudaHeadroomFraction) : capacity;
}

std::string CapacityText(const Device& device, size_t capacity_bytes) {
  if (!device.is_cuda()) {
    return "cpu (physical memory) has " + Bytes(static_cast<double>(capacity_bytes));
  }
  return device.ToString() + " has " + Bytes(static_cast<double>(capacity_bytes)) +
         ", of which runs can use " + Bytes(UsableBytes(device, capacity_bytes)) +
         " (the rest: CUDA context, libraries, the allocator's cache)";
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) {
    bytes /= 1024;
    ++unit;
  }
  char text[64];
  snprintf(text, sizeof(text), unit == 6 && bytes >= 1024 ? "%.3g %s" : "%.1f %s", bytes,
           units[unit]);
  return text;
}

}  // namespace moe
