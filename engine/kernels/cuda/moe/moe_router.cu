// CUDA MoE router ops (contracts in op_declarations.inc). These tensors are small
// ((tokens, experts) f32 and (tokens * topk) indices), so the kernels are simple. The two losses
// reduce in two fixed-order stages (per expert column or per token, then one block over those
// partial sums), so results are bit-identical run to run.
#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/moe/load_balancing.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return BlocksFor(n, kThreads); }

__device__ float RowLogSumExp(const float* row, int64_t n) {
  float max = row[0];
  for (int64_t j = 1; j < n; ++j) max = fmaxf(max, row[j]);
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += expf(row[j] - max);
  return max + logf(sum);
}

__global__ void NormalizeRowsForwardKernel(const float* x, float* y, int64_t rows, int64_t k) {
  for (int64_t r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += x[r * k + j];
    for (int64_t j = 0; j < k; ++j) y[r * k + j] = x[r * k + j] / sum;
  }
}

__global__ void NormalizeRowsBackwardKernel(const float* dy, const float* x, float* dx,
                                            int64_t rows, int64_t k) {
  for (int64_t r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    float sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) sum += x[r * k + j];
    for (int64_t j = 0; j < k; ++j) dot += dy[r * k + j] * (x[r * k + j] / sum);
    for (int64_t j = 0; j < k; ++j) dx[r * k + j] = (dy[r * k + j] - dot) / sum;
  }
}

// One block per expert e: weighted[e] = count_e * sum_t probs[t, e].
__global__ void WeightedColumnSumsKernel(const float* probs, const int32_t* offsets, int64_t tokens,
                                         int64_t experts, float* weighted) {
  const int64_t e = blockIdx.x;
  double column = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) column += probs[t * experts + e];
  column = BlockSum(column);
  if (threadIdx.x == 0) weighted[e] = static_cast<float>((offsets[e + 1] - offsets[e]) * column);
}

// out[0] = scale * sum of values[0, n), in one block.
__global__ void ScaledSumKernel(const float* values, int64_t n, double scale, float* out) {
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) total += values[i];
  total = BlockSum(total);
  if (threadIdx.x == 0) out[0] = static_cast<float>(total * scale);
}

__global__ void LoadBalancingLossBackwardKernel(const int32_t* offsets, int64_t tokens,
                                                int64_t experts, int64_t topk, float grad,
                                                float* dprobs) {
  const int64_t n = tokens * experts;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t e = i % experts;
    dprobs[i] += LoadBalancingGrad(grad, experts, offsets[e + 1] - offsets[e], tokens, topk);
  }
}

__global__ void SquaredLogSumExpKernel(const float* logits, int64_t tokens, int64_t experts,
                                       float* squares) {
  for (int64_t t = blockIdx.x * blockDim.x + threadIdx.x; t < tokens; t += gridDim.x * blockDim.x) {
    const float lse = RowLogSumExp(logits + t * experts, experts);
    squares[t] = lse * lse;
  }
}

__global__ void ZLossBackwardKernel(const float* logits, int64_t tokens, int64_t experts,
                                    float grad, float* dlogits) {
  for (int64_t t = blockIdx.x * blockDim.x + threadIdx.x; t < tokens; t += gridDim.x * blockDim.x) {
    const float* row = logits + t * experts;
    const float lse = RowLogSumExp(row, experts);
    for (int64_t e = 0; e < experts; ++e) {
      dlogits[t * experts + e] += grad * 2.0f * lse * expf(row[e] - lse) / tokens;
    }
  }
}

__global__ void InvertPermutationKernel(const int32_t* order, int64_t n, int64_t topk,
                                        int32_t* source_rows, int32_t* inverse) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    source_rows[i] = static_cast<int32_t>(order[i] / topk);
    inverse[order[i]] = static_cast<int32_t>(i);
  }
}

}  // namespace

void NormalizeRowsForward(const Tensor& x, const Tensor& y) {
  NormalizeRowsForwardKernel<<<Blocks(x.dim(0)), kThreads, 0, StreamOf(x)>>>(
      x.data<float>(), y.data<float>(), x.dim(0), x.dim(1));
  MOE_CUDA_CHECK_LAUNCH();
}

void NormalizeRowsBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  NormalizeRowsBackwardKernel<<<Blocks(x.dim(0)), kThreads, 0, StreamOf(x)>>>(
      dy.data<float>(), x.data<float>(), dx.data<float>(), x.dim(0), x.dim(1));
  MOE_CUDA_CHECK_LAUNCH();
}

void LoadBalancingLossForward(const Tensor& probs, const Tensor& offsets, int64_t topk,
                              const Tensor& loss) {
  const int64_t tokens = probs.dim(0), experts = probs.dim(1);
  Tensor weighted = Tensor::Empty({experts}, DType::kF32, probs.device());
  WeightedColumnSumsKernel<<<static_cast<int>(experts), kThreads, 0, StreamOf(probs)>>>(
      probs.data<float>(), offsets.data<int32_t>(), tokens, experts, weighted.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
  const double scale = static_cast<double>(experts) / (static_cast<double>(tokens) * tokens * topk);
  ScaledSumKernel<<<1, kThreads, 0, StreamOf(probs)>>>(weighted.data<float>(), experts, scale,
                                                       loss.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
}

void LoadBalancingLossBackward(const Tensor& offsets, int64_t topk, float grad,
                               const Tensor& dprobs) {
  LoadBalancingLossBackwardKernel<<<Blocks(dprobs.numel()), kThreads, 0, StreamOf(dprobs)>>>(
      offsets.data<int32_t>(), dprobs.dim(0), dprobs.dim(1), topk, grad, dprobs.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
}

void ZLossForward(const Tensor& logits, const Tensor& loss) {
  const int64_t tokens = logits.dim(0);
  Tensor squares = Tensor::Empty({tokens}, DType::kF32, logits.device());
  SquaredLogSumExpKernel<<<Blocks(tokens), kThreads, 0, StreamOf(logits)>>>(
      logits.data<float>(), tokens, logits.dim(1), squares.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
  ScaledSumKernel<<<1, kThreads, 0, StreamOf(logits)>>>(
      squares.data<float>(), tokens, 1.0 / static_cast<double>(tokens), loss.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
}

void ZLossBackward(const Tensor& logits, float grad, const Tensor& dlogits) {
  ZLossBackwardKernel<<<Blocks(logits.dim(0)), kThreads, 0, StreamOf(logits)>>>(
      logits.data<float>(), logits.dim(0), logits.dim(1), grad, dlogits.data<float>());
  MOE_CUDA_CHECK_LAUNCH();
}

void InvertPermutation(const Tensor& order, int64_t topk, const Tensor& source_rows,
                       const Tensor& inverse) {
  InvertPermutationKernel<<<Blocks(order.numel()), kThreads, 0, StreamOf(order)>>>(
      order.data<int32_t>(), order.numel(), topk, source_rows.data<int32_t>(),
      inverse.data<int32_t>());
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
