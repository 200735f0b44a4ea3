// CUDA top-k over rows and its backward (contracts: engine/kernels/op_declarations.inc).
// x (rows, cols) f32; values (rows, k) f32, indices (rows, k) i32; dx (rows, cols) f32.
//   TopK: one warp per row. The order is a strict total order on (value, column): larger
//   first, NaN above every number (as on the CPU), ties to the lower column. Pick j is the first
//   element after pick j-1 in that order: each lane scans its columns (c = lane, lane + 32, ...)
//   for its best candidate, then a butterfly over the warp finds the overall one. k passes over
//   the row, which lanes hold in registers up to 256 columns (read again each pass beyond).
//   TopKBackward: one thread per element of dx: the sum of the dvalues whose index names its
//   column (0 if none), in j order, as the CPU reference adds them. Indices out of range trap.
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

// True when (a, column ca) comes before (b, column cb) in top-k order.
__device__ __forceinline__ bool Precedes(float a, int ca, float b, int cb) {
  const bool a_above = a > b || (isnan(a) && !isnan(b));
  const bool b_above = b > a || (isnan(b) && !isnan(a));
  return a_above || (!b_above && ca < cb);
}

// kCached > 0: each lane holds its columns of the row in registers (cols <= 32 * kCached);
// kCached == 0: each pass reads the row again (any cols).
template <int kCached>
__global__ void TopKKernel(const float* x, int64_t rows, int cols, int k, float* values,
                           int32_t* indices) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_block = blockDim.x / 32;
  for (int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows;
       row += gridDim.x * warps_per_block) {
    const float* xr = x + row * cols;
    float cached[kCached > 0 ? kCached : 1];
#pragma unroll
    for (int q = 0; q < kCached; ++q) cached[q] = lane + 32 * q < cols ? xr[lane + 32 * q] : 0.0f;
    float last = 0.0f;
    int last_col = -1;  // the previous pick; none yet while negative
    for (int j = 0; j < k; ++j) {
      float best = 0.0f;
      int best_col = -1;  // none yet while negative
      const auto consider = [&](float v, int c) {
        if ((last_col < 0 || Precedes(last, last_col, v, c)) &&
            (best_col < 0 || Precedes(v, c, best, best_col))) {
          best = v;
          best_col = c;
        }
      };
      if constexpr (kCached > 0) {
#pragma unroll
        for (int q = 0; q < kCached; ++q) {
          if (lane + 32 * q < cols) consider(cached[q], lane + 32 * q);
        }
      } else {
        for (int c = lane; c < cols; c += 32) consider(xr[c], c);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_col = __shfl_xor_sync(0xffffffffu, best_col, offset);
        if (other_col >= 0 && (best_col < 0 || Precedes(other, other_col, best, best_col))) {
          best = other;
          best_col = other_col;
        }
      }
      if (lane == 0) {
        values[row * k + j] = best;
        indices[row * k + j] = best_col;
      }
      last = best;
      last_col = best_col;
    }
  }
}

__global__ void TopKBackwardKernel(const float* dvalues, const int32_t* indices, int64_t rows,
                                   int64_t cols, int64_t k, float* dx) {
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < rows * cols;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / cols, col = idx % cols;
    float grad = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t index = indices[row * k + j];
      MOE_DEVICE_CHECK(index >= 0 && index < cols);
      if (index == col) grad += dvalues[row * k + j];
    }
    dx[idx] = grad;
  }
}

}  // namespace

void TopK(const Tensor& x, const Tensor& values, const Tensor& indices) {
  const int64_t rows = x.dim(0), cols = x.dim(1), k = values.dim(1);
  if (rows == 0) return;
  CHECK_LE(cols, INT32_MAX) << "topk: columns must fit in i32";
  constexpr int kWarpsPerBlock = 8;
  const auto launch = [&](auto kernel) {
    kernel<<<BlocksFor(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, StreamOf(x)>>>(
        Ptr<const float>(x), rows, static_cast<int>(cols), static_cast<int>(k), Ptr<float>(values),
        Ptr<int32_t>(indices));
    MOE_CUDA_CHECK_LAUNCH();
  };
  if (cols <= 32 * 4) {
    launch(TopKKernel<4>);
  } else if (cols <= 32 * 8) {
    launch(TopKKernel<8>);
  } else {
    launch(TopKKernel<0>);
  }
}

void TopKBackward(const Tensor& dvalues, const Tensor& indices, const Tensor& dx) {
  if (dx.numel() == 0) return;
  constexpr int kThreads = 256;
  TopKBackwardKernel<<<BlocksFor(dx.numel(), kThreads), kThreads, 0, StreamOf(dx)>>>(
      Ptr<const float>(dvalues), Ptr<const int32_t>(indices), dx.dim(0), dx.dim(1), dvalues.dim(1),
      Ptr<float>(dx));
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
