// MOE_CUDA_CALL / MOE_CUBLAS_CALL / MOE_NCCL_CALL: include only from CUDA translation units.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "engine/core/check.h"

#define MOE_CUDA_CALL(expr)                                                             \
  do {                                                                                  \
    cudaError_t moe_err_ = (expr);                                                      \
    if (moe_err_ != cudaSuccess)                                                        \
      ::moe::FailCall("CUDA", #expr, __FILE__, __LINE__, cudaGetErrorString(moe_err_)); \
  } while (0)

#define MOE_CUBLAS_CALL(expr)                                                                \
  do {                                                                                       \
    cublasStatus_t moe_err_ = (expr);                                                        \
    if (moe_err_ != CUBLAS_STATUS_SUCCESS)                                                   \
      ::moe::FailCall("cuBLAS", #expr, __FILE__, __LINE__, cublasGetStatusString(moe_err_)); \
  } while (0)

#define MOE_NCCL_CALL(expr)                                                             \
  do {                                                                                  \
    ncclResult_t moe_err_ = (expr);                                                     \
    if (moe_err_ != ncclSuccess)                                                        \
      ::moe::FailCall("NCCL", #expr, __FILE__, __LINE__, ncclGetErrorString(moe_err_)); \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define MOE_CUDA_CHECK_LAUNCH() MOE_CUDA_CALL(cudaGetLastError())
