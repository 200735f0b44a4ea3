// Shared between the attention translation units (attention.cu is the entry point and holds the
// design note): the raw-pointer parameters the kernels take, the launchers each path defines,
// and the constants and indexing every kernel uses (conversions come from cuda_common.cuh).
//
// Paths, chosen by dtype through overloading: f32 -> CUDA-core FMA kernels (attention_fma.cu,
// exact fp32 math for parity with the CPU reference); bf16 -> tensor-core mma.sync kernels
// (attention_mma_forward.cu, attention_mma_backward.cu). Launchers check every launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/cuda/cuda_common.cuh"

namespace moe::cuda::attention {

// Sizes of one call. Row strides follow from the (batch, seq, heads, d) layouts.
struct Dims {
  int batch = 0;
  int seq = 0;
  int heads = 0;
  int kv_heads = 0;
  float scale = 0.0f;       // 1 / sqrt(head_dim)
  float scale_log2 = 0.0f;  // log2(e) / sqrt(head_dim): scaled scores go straight into exp2f
};

template <typename T>
struct ForwardParams {
  const T* q;  // (batch, seq, heads, d)
  const T* k;  // (batch, seq, kv_heads, d)
  const T* v;  // (batch, seq, kv_heads, d)
  T* out;      // (batch, seq, heads, d) =
  float* lse;  // (batch, heads, seq) =, natural log
  Dims dims;
};

template <typename T>
struct BackwardParams {
  const T* dout;       // (batch, seq, heads, d)
  const T* q;          // (batch, seq, heads, d)
  const T* k;          // (batch, seq, kv_heads, d)
  const T* v;          // (batch, seq, kv_heads, d)
  const float* lse;    // (batch, heads, seq), natural log
  const float* delta;  // (batch, heads, seq) = rowsum(dout * out), from the preprocessing kernel
  T* dq;               // like q, =
  T* dk;               // like k, =
  T* dv;               // like v, =
  Dims dims;
};

// head_dim is 64 or 128 (checked by the caller).
void LaunchAttentionForward(const ForwardParams<float>& params, int head_dim, cudaStream_t stream);
void LaunchAttentionForward(const ForwardParams<bf16>& params, int head_dim, cudaStream_t stream);
void LaunchAttentionBackward(const BackwardParams<float>& params, int head_dim,
                             cudaStream_t stream);
void LaunchAttentionBackward(const BackwardParams<bf16>& params, int head_dim, cudaStream_t stream);

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Offset of row `s`, head `h` of sequence `b` in a (batch, seq, num_heads, d) tensor.
__device__ __forceinline__ int64_t RowOffset(int b, int s, int h, int seq, int num_heads, int d) {
  return ((static_cast<int64_t>(b) * seq + s) * num_heads + h) * d;
}

}  // namespace moe::cuda::attention
