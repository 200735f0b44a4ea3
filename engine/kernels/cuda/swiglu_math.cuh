// The SwiGLU of one (gate, up) pair, the one formula of the CUDA SwiGLU kernels (activations.cu)
// and the Hopper fc1 GEMM's SwiGLU epilogue (grouped_gemm_sm90.cuh), so that both give
// bit-identical results: fp32, expf and an IEEE division (the engine builds without fast math), in
// this order. CUDA headers only (the grouped GEMM probe builds with one nvcc command).
#pragma once

namespace moe::cuda {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// silu(gate) * up * scale.
__device__ __forceinline__ float SwigluValue(float gate, float up, float scale) {
  return gate * Sigmoid(gate) * up * scale;
}

}  // namespace moe::cuda
