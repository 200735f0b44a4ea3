// Shared between the attention translation units (attention.cu is the entry point and holds the
// design note): the raw-pointer parameters the kernels take, the launchers each path defines,
// and the constants and indexing every kernel uses (conversions come from cuda_common.cuh).
//
// Paths, chosen by dtype through overloading: f32 -> CUDA-core FMA kernels (attention_fma.cu,
// exact fp32 math for parity with the CPU reference); bf16 -> tensor-core mma.sync kernels
// (attention_mma_forward.cu, attention_mma_backward.cu), which hand over to the Hopper wgmma
// kernels (attention_sm90.cu) where those run. Launchers check every launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/common/cuda_common.cuh"

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

// The Hopper kernels (attention_sm90.cu): the forward, and the backward (dq, dk, dv; delta already
// in memory; head dim 128 only). Each launches and returns true where they run (sm90_device.h,
// and AllowSm90Attention not turned off); otherwise returns false having done nothing.
bool TryAttentionForwardSm90(const ForwardParams<bf16>& params, int head_dim, cudaStream_t stream);
bool TryAttentionBackwardSm90(const BackwardParams<bf16>& params, int head_dim,
                              cudaStream_t stream);

// The thread-block cluster of the dk/dv kernels splits a GQA group's query heads over this many
// blocks: the largest divisor of the group that a portable cluster (8 blocks) holds.
inline int ClusterSplit(int group) {
  int split = group < 8 ? group : 8;
  while (group % split != 0) --split;
  return split;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x for the tensor-core (bf16) kernels: the special-function unit alone, results below 2^-126
// (f32's smallest normal) flushed to zero, where exp2f adds instructions to keep them on every
// element of every tile. Softmax probabilities that small vanish in any sum with the row's
// largest. The f32 kernels keep exp2f (parity with the CPU reference).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Offset of row `s`, head `h` of sequence `b` in a (batch, seq, num_heads, d) tensor.
__device__ __forceinline__ int64_t RowOffset(int b, int s, int h, int seq, int num_heads, int d) {
  return ((static_cast<int64_t>(b) * seq + s) * num_heads + h) * d;
}

// A block's place in a (tiles, groups) grid in clusters of (1, cluster_y, 1), the most work first
// across the whole grid: blocks start about in their linear order (x fastest), so the cluster at
// linear position i takes tile rank i / groups (0: the tile with the most work) of group i %
// groups. (With the rank blockIdx.x, each group's tiles ran longest first but the groups one after
// another, the last groups' longest tiles in the tail, with SMs idle beside them.)
struct GridPlace {
  int rank;   // 0: the most work
  int group;  // of gridDim.y / cluster_y
};

__device__ __forceinline__ GridPlace LongestFirst(int cluster_y) {
  const int groups = static_cast<int>(gridDim.y) / cluster_y;
  const int linear = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y / cluster_y));
  return {linear / groups, linear % groups};
}

// The block of `rows` queries a (query blocks, batch * heads) grid's block owns, the longest rows
// first (LongestFirst): rows [q0, q0 + rows) of head h of sequence b, and the keys and values of
// kv head kvh.
struct QueryBlock {
  int q0, b, h, kvh;
  int q_stride, kv_stride;  // row strides of q (and out, dout, dq) and of k and v
};

template <int D>
__device__ __forceinline__ QueryBlock ThisQueryBlock(const Dims& s, int rows) {
  const GridPlace at = LongestFirst(1);
  QueryBlock qb;
  qb.q0 = (static_cast<int>(gridDim.x) - 1 - at.rank) * rows;
  qb.b = at.group / s.heads;
  qb.h = at.group % s.heads;
  qb.kvh = qb.h / (s.heads / s.kv_heads);
  qb.q_stride = s.heads * D;
  qb.kv_stride = s.kv_heads * D;
  return qb;
}

// Row 0 of the block's query head and of its kv head in a (batch, seq, heads, d) tensor.
template <int D, typename T>
__device__ __forceinline__ T* QueryHead(T* base, const QueryBlock& qb, const Dims& s) {
  return base + RowOffset(qb.b, 0, qb.h, s.seq, s.heads, D);
}
template <int D, typename T>
__device__ __forceinline__ T* KvHead(T* base, const QueryBlock& qb, const Dims& s) {
  return base + RowOffset(qb.b, 0, qb.kvh, s.seq, s.kv_heads, D);
}

// Launches `kernel` with `threads` per block over `grid` in thread-block clusters of (1, cluster_y,
// 1) (cluster_y 1: no cluster attribute, as images older than sm_90 need) with `smem_bytes` of
// dynamic shared memory, on `stream`; checks both calls.
template <typename... Params, typename... Args>
void LaunchInClusters(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes,
                      int cluster_y, cudaStream_t stream, const Args&... args) {
  MOE_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem_bytes)));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = cluster_y;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = cluster_y > 1 ? 1 : 0;
  MOE_CUDA_CALL(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// Calls launch(std::integral_constant<int, D>) for head_dim D in {64, 128} (checked by the caller).
template <typename Launch>
void WithHeadDim(int head_dim, Launch&& launch) {
  if (head_dim == 64) {
    launch(std::integral_constant<int, 64>());
  } else {
    launch(std::integral_constant<int, 128>());
  }
}

}  // namespace moe::cuda::attention
