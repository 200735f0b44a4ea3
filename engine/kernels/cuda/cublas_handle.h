// Per-device cuBLAS handles, created on first use and kept for the life of the process (like
// DeviceContext). Each is bound to its device's compute stream and owns a fixed workspace, so
// cuBLAS picks the same algorithms every run and results are bit-identical run to run. The
// precision is chosen per call by the compute type (see matmul.cu), not by the handle.
#pragma once

#include <cublas_v2.h>

#include "engine/core/device.h"

namespace moe::cuda {

cublasHandle_t CublasHandle(Device device);

}  // namespace moe::cuda
