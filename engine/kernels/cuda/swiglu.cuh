// The SwiGLU arithmetic (fp32), one home for every kernel that computes it: the activation
// kernels (activations.cu) and the Hopper fc1 epilogue (grouped_gemm_sm90.cuh), whose
// activations must equal the activation kernel's bit for bit (a recomputed activation replaces a
// saved one). CUDA headers only, so that the grouped-GEMM probe still builds with one nvcc line.
#pragma once

#include <cuda_runtime.h>

namespace moe::cuda {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// silu(gate) * up * scale, multiplied in this order.
__device__ __forceinline__ float SwigluValue(float gate, float up, float scale) {
  return gate * Sigmoid(gate) * up * scale;
}

}  // namespace moe::cuda
