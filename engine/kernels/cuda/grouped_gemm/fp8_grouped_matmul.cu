// CUDA Fp8GroupedMatmul (contract: engine/kernels/op_declarations.inc).
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {

void Fp8GroupedMatmul(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) {
  LOG(FATAL) << "fp8 grouped matmul has no CUDA kernel yet";
}

}  // namespace moe::cuda
