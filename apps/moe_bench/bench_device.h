// The benchmarks' checked flags. Each returns the value, or prints one line on stderr, prefixed
// by the program's name, and returns nullopt (the caller exits 2).
//   BenchDevice: --device names "cpu", or "cuda" (GPU 0) when this machine has it.
//   BenchStateDType: a storage-dtype flag (--grads, --moments) names fp32 or bf16, as moe_train's
//   --main_grads_dtype and --exp_avg_dtype do (OptimizerDTypeFromName).
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "engine/autograd/parameters.h"
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

inline std::optional<DType> BenchStateDType(const char* program, const char* flag,
                                            const std::string& value) {
  const std::optional<DType> dtype = OptimizerDTypeFromName(value);
  if (!dtype) {
    fprintf(stderr, "%s: --%s=%s must be %s\n", program, flag, value.c_str(), kOptimizerDTypeNames);
  }
  return dtype;
}

}  // namespace moe
