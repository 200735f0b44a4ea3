// The router's gate as one kernel each way (ops::RouterGateForward / RouterGateBackward, whose
// contracts are in engine/kernels/ops.h). One warp per token row; a lane holds the row's columns
// c = lane, lane + 32, ... in registers (up to kMaxCached of them) and lane j the row's pick j.
//   Forward: softmax (the row's max and sum by warp butterflies), the probabilities stored, then
//   k picks in TopK's order (topk_order.cuh: one integer maximum a pick), each broadcast from the
//   lane holding it and added to the picks' sum in pick order; lane j writes value, index and
//   value / sum (value without renormalisation). The same formulas as the three ops; the
//   softmax's sum in another order.
//   Backward: every lane walks the row's k picks (NormalizeRowsBackward's sums in pick order, or
//   the picks' gradients as they are without renormalisation) and keeps the gradients of its
//   own columns, adds the load-balancing term of its columns (computed
//   once per warp, load_balancing.cuh), then the softmax backward with the row's dot product by
//   a butterfly, stored once in dlogits' dtype.
// One launch each way instead of softmax, top-k and renormalisation (forward) and four kernels
// and a cast of dlogits (backward): the row stays in registers between the steps.
#include "engine/kernels/cuda/moe/router_gate.h"

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/moe/load_balancing.cuh"
#include "engine/kernels/cuda/moe/topk_order.cuh"

namespace moe::cuda {
namespace {

constexpr int kMaxCached = 8;  // columns a lane holds: experts <= 256
constexpr int kMaxPicks = 32;  // one lane a pick
constexpr int kWarpsPerBlock = 8;

// The rows of a grid-stride loop, a warp each.
__device__ __forceinline__ int64_t FirstRow() {
  return int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t RowStride() { return int64_t{gridDim.x} * kWarpsPerBlock; }

// values[q] for the slot q = column / 32 every lane names (a select, not a dynamic index, so the
// array stays in registers).
template <int kCached>
__device__ __forceinline__ float AtSlot(const float (&values)[kCached], int slot) {
  float v = 0.0f;
#pragma unroll
  for (int q = 0; q < kCached; ++q) {
    if (q == slot) v = values[q];
  }
  return v;
}

template <int kCached>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    RouterGateForwardKernel(const float* logits, int64_t rows, int cols, int k, bool renormalize,
                            float* probs, float* values, float* weights, int32_t* indices) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = FirstRow(); row < rows; row += RowStride()) {
    float p[kCached];
    float max = -INFINITY;
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      const int c = lane + 32 * q;
      p[q] = c < cols ? logits[row * cols + c] : -INFINITY;
      max = fmaxf(max, p[q]);
    }
    max = WarpReduce(max, MaxOp{});
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      if (lane + 32 * q < cols) {
        p[q] = expf(p[q] - max);
        sum += p[q];
      }
    }
    const float inv = 1.0f / WarpReduce(sum, SumOp{});
    uint64_t keys[kCached];
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      const int c = lane + 32 * q;
      keys[q] = 0;
      if (c < cols) {
        p[q] *= inv;
        probs[row * cols + c] = p[q];
        keys[q] = OrderKey(p[q], c);
      }
    }
    uint64_t last = ~uint64_t{0};
    float total = 0.0f, my_value = 0.0f;
    int my_column = 0;
    for (int j = 0; j < k; ++j) {
      last = NextPick(keys, last);
      const int column = KeyColumn(last);
      const float v = __shfl_sync(0xffffffffu, AtSlot(p, column / 32), column % 32);
      total += v;
      if (lane == j) {
        my_value = v;
        my_column = column;
      }
    }
    if (lane < k) {
      values[row * k + lane] = my_value;
      indices[row * k + lane] = my_column;
      weights[row * k + lane] = renormalize ? my_value / total : my_value;
    }
  }
}

template <int kCached, typename T>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    RouterGateBackwardKernel(const float* dweights, const float* values, const int32_t* indices,
                             const float* probs, const int32_t* offsets, int64_t rows, int cols,
                             int k, float balance_grad, bool renormalize, T* dlogits) {
  const int lane = threadIdx.x % 32;
  float balance[kCached];  // the load-balancing loss's gradient of this lane's columns
#pragma unroll
  for (int q = 0; q < kCached; ++q) {
    const int c = lane + 32 * q;
    balance[q] = c < cols
                     ? LoadBalancingGrad(balance_grad, cols, offsets[c + 1] - offsets[c], rows, k)
                     : 0.0f;
  }
  for (int64_t row = FirstRow(); row < rows; row += RowStride()) {
    const float* v = values + row * k;
    const float* dw = dweights + row * k;
    float sum = 1.0f, dot = 0.0f;  // without renormalisation dvalue = dw[j]
    if (renormalize) {
      sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += v[j];
      for (int j = 0; j < k; ++j) dot += dw[j] * (v[j] / sum);
    }
    float d[kCached] = {};
    for (int j = 0; j < k; ++j) {
      const int column = indices[row * k + j];
      MOE_DEVICE_CHECK(column >= 0 && column < cols);
      if (column % 32 != lane) continue;
      const float dvalue = (dw[j] - dot) / sum;
#pragma unroll
      for (int q = 0; q < kCached; ++q) {
        if (q == column / 32) d[q] += dvalue;
      }
    }
    float p[kCached];
    float pd = 0.0f;
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      const int c = lane + 32 * q;
      p[q] = c < cols ? probs[row * cols + c] : 0.0f;
      d[q] += balance[q];
      pd += d[q] * p[q];
    }
    pd = WarpReduce(pd, SumOp{});
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      const int c = lane + 32 * q;
      if (c < cols) dlogits[row * cols + c] = FromFloat<T>(p[q] * (d[q] - pd));
    }
  }
}

template <int kCached>
using CachedTag = std::integral_constant<int, kCached>;

// Calls launch(CachedTag<n>{}) with the fewest columns a lane, n, that hold `cols` and returns
// true; returns false where a row does not fit in a warp's registers or the picks exceed its
// lanes.
template <typename Launch>
bool DispatchCached(int64_t cols, int64_t k, Launch launch) {
  if (k > kMaxPicks || cols > 32 * kMaxCached) return false;
  if (cols <= 32) {
    launch(CachedTag<1>{});
  } else if (cols <= 64) {
    launch(CachedTag<2>{});
  } else if (cols <= 128) {
    launch(CachedTag<4>{});
  } else {
    launch(CachedTag<kMaxCached>{});
  }
  return true;
}

}  // namespace

bool TryRouterGateForward(const Tensor& logits, bool renormalize, const Tensor& probs,
                          const Tensor& values, const Tensor& weights, const Tensor& indices) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1), k = values.dim(1);
  return DispatchCached(cols, k, [&]<int kCached>(CachedTag<kCached>) {
    if (rows == 0) return;
    RouterGateForwardKernel<kCached>
        <<<BlocksFor(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, StreamOf(logits)>>>(
            Ptr<const float>(logits), rows, static_cast<int>(cols), static_cast<int>(k),
            renormalize, Ptr<float>(probs), Ptr<float>(values), Ptr<float>(weights),
            Ptr<int32_t>(indices));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

bool TryRouterGateBackward(const Tensor& dweights, const Tensor& values, const Tensor& indices,
                           const Tensor& probs, const Tensor& offsets, float balance_grad,
                           bool renormalize, const Tensor& dlogits) {
  const int64_t rows = probs.dim(0), cols = probs.dim(1), k = values.dim(1);
  return DispatchCached(cols, k, [&]<int kCached>(CachedTag<kCached>) {
    if (rows == 0) return;
    DispatchFloat(dlogits.dtype(), [&]<typename T>(TypeTag<T>) {
      RouterGateBackwardKernel<kCached, T>
          <<<BlocksFor(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, StreamOf(probs)>>>(
              Ptr<const float>(dweights), Ptr<const float>(values), Ptr<const int32_t>(indices),
              Ptr<const float>(probs), Ptr<const int32_t>(offsets), rows, static_cast<int>(cols),
              static_cast<int>(k), balance_grad, renormalize, Ptr<T>(dlogits));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace moe::cuda
