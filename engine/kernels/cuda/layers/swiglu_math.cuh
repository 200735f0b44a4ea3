// The SwiGLU of one (gate, up) pair and its gradients, the one formula of the CUDA SwiGLU kernels
// (activations.cu) and the Hopper grouped GEMMs' SwiGLU epilogues (grouped_gemm_sm90.cuh), so
// that both give bit-identical results: fp32, expf (the engine builds without fast math) and
// __fdividef, in this order. CUDA headers only (the grouped GEMM probe builds with one nvcc
// command).
#pragma once

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

}  // namespace moe::cuda
