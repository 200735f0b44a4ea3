// SiLU and SwiGLU arithmetic for one element, fp32, shared by the activation kernels
// (activations.cu) and the grouped GEMM epilogues (grouped_swiglu.cu), so both compute the same.
//   silu(x) = x * sigmoid(x); silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
//   SwiGLU: y = silu(gate) * up * scale; backward: dgate = dy*scale*up*silu'(gate),
//   dup = dy*scale*silu(gate), and dscale's term silu(gate) * up * dy.
#pragma once

namespace moe::cuda {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float Silu(float x) { return x * Sigmoid(x); }

__device__ __forceinline__ float SiluGrad(float x) {
  const float s = Sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

__device__ __forceinline__ float Swiglu(float gate, float up, float scale) {
  return Silu(gate) * up * scale;
}

struct SwigluGrads {
  float dgate, dup;
  float dscale_term;  // silu(gate) * up * dy, summed over a row into dscale
};

__device__ __forceinline__ SwigluGrads SwigluBackwardAt(float dy, float gate, float up,
                                                        float scale) {
  const float silu = Silu(gate);
  return {dy * scale * up * SiluGrad(gate), dy * scale * silu, silu * up * dy};
}

}  // namespace moe::cuda
