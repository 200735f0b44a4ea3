// Per-device cuBLAS handles, created on first use and kept for the life of the process (like
// DeviceContext). Each is bound to its device's compute stream and owns a fixed workspace, so
// cuBLAS picks the same algorithms every run and results are bit-identical run to run. The
// precision is chosen per call by the compute type (CublasComputeType), not by the handle.
// Also the conversions every cuBLAS call site shares.
#pragma once

#include <cublas_v2.h>
#include <glog/logging.h>

#include <climits>
#include <cstdint>

#include "engine/core/device.h"
#include "engine/core/dtype.h"

namespace moe::cuda {

cublasHandle_t CublasHandle(Device device);

// CUDA_R_32F or CUDA_R_16BF for an f32 or bf16 tensor.
inline cudaDataType_t CublasDataType(DType dtype) {
  return dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
}

// The precision of products of `dtype` operands, fp32 accumulation either way: f32 uses
// CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, whatever NVIDIA_TF32_OVERRIDE says), bf16
// CUBLAS_COMPUTE_32F (tensor cores).
inline cublasComputeType_t CublasComputeType(DType dtype) {
  return dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
}

// A size or leading dimension as cuBLAS's int.
inline int CublasInt(int64_t v) {
  CHECK_LE(v, INT_MAX) << "matrix dimension too large for cuBLAS";
  return static_cast<int>(v);
}

}  // namespace moe::cuda
