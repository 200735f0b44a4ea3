// CUDA top-k over rows and its backward (contracts: engine/kernels/op_declarations.inc).
// x (rows, cols) f32; values (rows, k) f32, indices (rows, k) i32; dx (rows, cols) f32.
//   TopK: one warp per row. The order is a strict total order on (value, column): larger
//   first, NaN above every number (as on the CPU), ties (and -0 with +0) to the lower column. It
//   is the order of one 64-bit key per element (OrderKey), so a pick is an integer maximum: pick j
//   is the largest key below pick j-1's; each lane finds its own over its columns (c = lane,
//   lane + 32, ...), then a butterfly over the warp takes the largest. k passes over the row,
//   whose keys the lanes hold in registers up to 256 columns (read again each pass beyond); the
//   picked value is read back from x. (One integer comparison a step, instead of comparing
//   (value, column) pairs with the NaN and tie rules at every step.)
//   TopKBackward: one thread per element of dx: the sum of the dvalues whose index names its
//   column (0 if none), in j order, as the CPU reference adds them. Indices out of range trap.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/moe/topk_order.cuh"

namespace moe::cuda {
namespace {

// kCached > 0: each lane holds the keys of its columns in registers (cols <= 32 * kCached);
// kCached == 0: each pass reads the row again (any cols).
template <int kCached>
__global__ void TopKKernel(const float* x, int64_t rows, int cols, int k, float* values,
                           int32_t* indices) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_block = blockDim.x / 32;
  for (int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows;
       row += gridDim.x * warps_per_block) {
    const float* xr = x + row * cols;
    uint64_t cached[kCached > 0 ? kCached : 1];
#pragma unroll
    for (int q = 0; q < kCached; ++q) {
      const int c = lane + 32 * q;
      cached[q] = c < cols ? OrderKey(xr[c], c) : 0;
    }
    uint64_t last = ~uint64_t{0};
    for (int j = 0; j < k; ++j) {
      uint64_t best = 0;
      if constexpr (kCached > 0) {
        best = NextPick(cached, last);
      } else {
        for (int c = lane; c < cols; c += 32) {
          const uint64_t key = OrderKey(xr[c], c);
          if (key < last && key > best) best = key;
        }
        best = WarpMaxKey(best);
      }
      if (lane == 0) {
        const int column = KeyColumn(best);
        values[row * k + j] = xr[column];
        indices[row * k + j] = column;
      }
      last = best;
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
