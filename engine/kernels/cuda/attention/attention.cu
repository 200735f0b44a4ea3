// Causal attention with grouped KV heads on CUDA: AttentionForward / AttentionBackward (contract
// in op_declarations.inc; ops.cc has already checked shapes and dtypes).
//
// Design (flash-attention 2 style; the (seq, seq) score matrix never exists in device memory):
//   Forward: one thread block per (query tile, batch, head), tiles launched longest-first. It
//     keeps its query tile resident and streams key/value tiles 0 .. diagonal, keeping per row
//     the running max m and sum l of an online softmax in fp32 and rescaling the output
//     accumulator when m grows. Scores are scaled by log2(e) / sqrt(d) so base-2 exponentials
//     compute them; lse = (m + log2 l) * ln 2 is stored in natural log, as the contract says.
//     Only tiles that cross the diagonal are masked; rows and keys past seq load as zeros and
//     are never stored, so seq need not be a multiple of the tile.
//   Backward, three kernels on the compute stream:
//     1. delta (batch, heads, seq) f32 = rowsum(dout * out), head_dim / 8 threads a row
//        (temporary).
//     2. dk, dv: per (key tile, batch, kv head), a cluster of blocks that split the GQA group's
//        query heads; each loops over its heads and every query tile at or after the key tile,
//        recomputing P = exp(s - lse) from the saved lse, and the cluster adds the partial sums
//        in rank order through distributed shared memory (bf16 path; f32 runs one block).
//     3. dq: one block per (query tile, batch, head), looping over key tiles up to the diagonal.
//   Determinism: no atomics. Every output element is accumulated in a fixed order, so results
//   are bitwise identical run to run.
// Paths (attention_internal.cuh): f32 runs exact fp32 FMA kernels on CUDA cores
// (attention_fma.cu); bf16 runs mma.sync m16n8k16 tensor-core kernels with fp32 accumulation
// (attention_mma_*.cu), except on compute capability 9.0, where warp-specialised wgmma + TMA
// kernels of the same design take the forward, and the backward at head dim 128
// (attention_sm90.cu). Head dims 64 and 128.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "engine/core/tensor.h"
#include "engine/kernels/cuda/attention/attention_internal.cuh"
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

using attention::BackwardParams;
using attention::ForwardParams;

constexpr int kDeltaThreads = 256;

// delta[b, h, s] = sum_d dout[b, s, h, d] * out[b, s, h, d]; head_dim / 8 neighbouring threads
// per (b, s, h) row, each one 8-element (16-byte for bf16) load of each input, their sums added
// by shuffles: every thread's loads are 16 bytes wide (one warp per row of scalar loads is
// slower).
template <typename T>
__global__ void __launch_bounds__(kDeltaThreads)
    AttentionDeltaKernel(const T* dout, const T* out, float* delta, int64_t rows, int seq,
                         int heads, int head_dim) {
  const int lanes = head_dim / 8;  // a power of two (head dims 64 and 128)
  const int64_t row = (int64_t{blockIdx.x} * kDeltaThreads + threadIdx.x) / lanes;
  const int64_t at = row * head_dim + threadIdx.x % lanes * 8;
  float sum = 0.0f;
  if (row < rows) {
    const Floats<8> d = LoadFloats<8>(dout + at), o = LoadFloats<8>(out + at);
#pragma unroll
    for (int j = 0; j < 8; ++j) sum = fmaf(d.v[j], o.v[j], sum);
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) sum += ShuffleXor(sum, offset);
  if (row < rows && threadIdx.x % lanes == 0) {
    const int64_t h = row % heads, bs = row / heads;  // bs = b * seq + s
    delta[(bs / seq * heads + h) * seq + bs % seq] = sum;
  }
}

int HeadDim(const Tensor& q) {
  const int64_t d = q.dim(3);
  CHECK(d == 64 || d == 128) << "CUDA attention supports head_dim 64 and 128, got " << d << " ("
                             << q.DebugString() << ")";
  return static_cast<int>(d);
}

attention::Dims MakeDims(const Tensor& q, const Tensor& k) {
  CHECK(q.dim(0) * q.dim(2) <= 65535)
      << "CUDA attention: batch * heads must fit a grid dimension: " << q.DebugString();
  attention::Dims dims;
  dims.batch = static_cast<int>(q.dim(0));
  dims.seq = static_cast<int>(q.dim(1));
  dims.heads = static_cast<int>(q.dim(2));
  dims.kv_heads = static_cast<int>(k.dim(2));
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.dim(3)));
  dims.scale = static_cast<float>(scale);
  dims.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  return dims;
}

// The tensor-core path moves 16-byte pieces.
void CheckAligned(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    CHECK(Aligned16(t->data())) << "CUDA attention needs 16-byte aligned tensors: "
                                << t->DebugString();
}

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse) {
  if (q.numel() == 0) return;
  CheckAligned({&q, &k, &v, &out});
  const int head_dim = HeadDim(q);
  DispatchFloat(q.dtype(), [&]<typename T>(TypeTag<T>) {
    const ForwardParams<T> params{Ptr<const T>(q), Ptr<const T>(k), Ptr<const T>(v),
                                  Ptr<T>(out),     Ptr<float>(lse), MakeDims(q, k)};
    attention::LaunchAttentionForward(params, head_dim, StreamOf(q));
  });
}

void AttentionBackward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                       const Tensor& dv) {
  if (q.numel() == 0) return;
  CheckAligned({&dout, &q, &k, &v, &out, &dq, &dk, &dv});
  const int head_dim = HeadDim(q);
  const attention::Dims dims = MakeDims(q, k);
  cudaStream_t stream = StreamOf(q);
  // Dropped on return; the stream-ordered allocator keeps it until the kernels are done.
  const Tensor delta = Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, DType::kF32, q.device());
  DispatchFloat(q.dtype(), [&]<typename T>(TypeTag<T>) {
    const int64_t rows = q.dim(0) * q.dim(1) * q.dim(2);
    const int64_t rows_per_block = kDeltaThreads / (head_dim / 8);
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    AttentionDeltaKernel<T><<<static_cast<unsigned>(blocks), kDeltaThreads, 0, stream>>>(
        Ptr<const T>(dout), Ptr<const T>(out), Ptr<float>(delta), rows, dims.seq, dims.heads,
        head_dim);
    MOE_CUDA_CHECK_LAUNCH();
    const BackwardParams<T> params{Ptr<const T>(dout),
                                   Ptr<const T>(q),
                                   Ptr<const T>(k),
                                   Ptr<const T>(v),
                                   Ptr<const float>(lse),
                                   Ptr<const float>(delta),
                                   Ptr<T>(dq),
                                   Ptr<T>(dk),
                                   Ptr<T>(dv),
                                   dims};
    attention::LaunchAttentionBackward(params, head_dim, stream);
  });
}

}  // namespace moe::cuda
