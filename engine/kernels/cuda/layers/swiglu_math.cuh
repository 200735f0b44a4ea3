// The SwiGLU of one (gate, up) pair and its gradients, the one formula of the CUDA SwiGLU kernels
// (activations.cu), the Hopper grouped GEMMs' SwiGLU epilogues (grouped_gemm_sm90.cuh) and the FP8
// quantisers (fp8/quantize_column_tiles.cu), so that all give bit-identical results: fp32, expf
// (the engine builds without fast math) and __fdividef, in this order. And the sum of the
// per-tile partials of the scale's gradient that the epilogue and the FP8 quantiser write. CUDA
// headers only (the grouped GEMM probe builds with one nvcc command).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace moe::cuda {

// __fdividef, not an IEEE division: no slow-path branch, so the epilogues' 8 values a thread
// computes at once overlap (2 ulp; 1 + e >= 2^126, e = inf included, gives 0, sigmoid's limit).
__device__ __forceinline__ float Sigmoid(float x) { return __fdividef(1.0f, 1.0f + expf(-x)); }

// silu(gate) * up * scale.
__device__ __forceinline__ float SwigluValue(float gate, float up, float scale) {
  return gate * Sigmoid(gate) * up * scale;
}

// The gradients of silu(gate) * up * scale given its output's gradient d.
struct SwigluGradient {
  float gate;     // d * scale * up * silu'(gate)
  float up;       // d * scale * silu(gate)
  float product;  // silu(gate) * up * d: this element's term of the scale's gradient
};

__device__ __forceinline__ SwigluGradient SwigluGradients(float gate, float up, float scale,
                                                          float d) {
  const float sig = Sigmoid(gate);
  const float silu = gate * sig;
  return {d * scale * up * (sig * (1.0f + gate * (1.0f - sig))), d * scale * silu, silu * up * d};
}

// dscale[row] = sum over the tiles t, in order, of partials[t][row]; partials (tiles, rows). A
// template only so that every file including this one may define it.
template <typename T>
__global__ void SumDscalePartialsKernel(const T* partials, int64_t tiles, int64_t rows, T* dscale) {
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T sum = 0;
    for (int64_t t = 0; t < tiles; ++t) sum += partials[t * rows + row];
    dscale[row] = sum;
  }
}

// Launches SumDscalePartialsKernel on `stream` (rows > 0); returns the launch's status.
inline cudaError_t SumDscalePartials(const float* partials, int64_t tiles, int64_t rows,
                                     float* dscale, cudaStream_t stream) {
  constexpr int kSumThreads = 256;
  const int64_t blocks = std::min<int64_t>((rows + kSumThreads - 1) / kSumThreads, 4096);
  SumDscalePartialsKernel<float>
      <<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(partials, tiles, rows, dscale);
  return cudaGetLastError();
}

}  // namespace moe::cuda
