// The device a benchmark's --device flag names: "cpu", or "cuda" (GPU 0) when this machine has
// it. Otherwise one line on stderr, prefixed by the program's name, and nullopt (the caller
// exits 2).
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "engine/runtime/device_context.h"

namespace moe {

inline std::optional<Device> BenchDevice(const char* program, const std::string& flag) {
  if (flag != "cpu" && flag != "cuda") {
    fprintf(stderr, "%s: --device=%s must be cpu or cuda\n", program, flag.c_str());
    return std::nullopt;
  }
  const Device device = flag == "cpu" ? Device::CPU() : Device::CUDA(0);
  const Status available = CheckDeviceAvailable(device);
  if (!available.ok()) {
    fprintf(stderr, "%s: --device=%s: %s\n", program, flag.c_str(), available.message().c_str());
    return std::nullopt;
  }
  return device;
}

}  // namespace moe
