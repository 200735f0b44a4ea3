// The device and compute dtype of a test source compiled twice (tests/CMakeLists.txt): the CPU
// backend (f32), or with MOE_TEST_ON_CUDA=1 the first GPU (bf16 activations).
#pragma once

#include "engine/core/device.h"
#include "engine/core/dtype.h"

namespace moe::testing {

#if MOE_TEST_ON_CUDA
inline const Device kTestDevice = Device::CUDA(0);
inline constexpr DType kTestCompute = DType::kBF16;
#else
inline const Device kTestDevice = Device::CPU();
inline constexpr DType kTestCompute = DType::kF32;
#endif

}  // namespace moe::testing
