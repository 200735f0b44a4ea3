// CUDA row softmax (contracts: engine/kernels/op_declarations.inc). x, y, dy, dx (rows, cols),
// one dtype, f32 or bf16; fp32 arithmetic.
//   Forward: y = exp(x - max) / sum exp(x - max). Backward: dx = y * (dy - sum(dy * y)).
// One block per row (grid-stride over rows); the row is read once per pass (max, sum, write),
// the later passes mostly from cache.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

template <int kVec, typename T>
__global__ void SoftmaxForwardKernel(const T* x, int64_t rows, int64_t cols, T* y) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    float max = -INFINITY;
    for (int64_t c = threadIdx.x * kVec; c < cols; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(xr + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) max = fmaxf(max, v.v[j]);
    }
    max = BlockMax(max);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x * kVec; c < cols; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(xr + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += expf(v.v[j] - max);
    }
    const float inv = 1.0f / BlockSum(sum);
    for (int64_t c = threadIdx.x * kVec; c < cols; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(xr + c);
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = expf(v.v[j] - max) * inv;
      StoreFloats(y + row * cols + c, out);
    }
  }
}

template <int kVec, typename T>
__global__ void SoftmaxBackwardKernel(const T* dy, const T* y, int64_t rows, int64_t cols, T* dx) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * cols;
    const T* yr = y + row * cols;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x * kVec; c < cols; c += blockDim.x * kVec) {
      const Floats<kVec> d = LoadFloats<kVec>(dyr + c), v = LoadFloats<kVec>(yr + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += d.v[j] * v.v[j];
    }
    dot = BlockSum(dot);
    for (int64_t c = threadIdx.x * kVec; c < cols; c += blockDim.x * kVec) {
      const Floats<kVec> d = LoadFloats<kVec>(dyr + c), v = LoadFloats<kVec>(yr + c);
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = v.v[j] * (d.v[j] - dot);
      StoreFloats(dx + row * cols + c, out);
    }
  }
}

}  // namespace

void SoftmaxForward(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(cols, {x.data(), y.data()}, [&]<int kVec>(VecTag<kVec>) {
      SoftmaxForwardKernel<kVec, T>
          <<<BlocksFor(rows, 1), RowThreads(cols / kVec), 0, StreamOf(x)>>>(Ptr<const T>(x), rows,
                                                                            cols, Ptr<T>(y));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

void SoftmaxBackward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  if (y.numel() == 0) return;
  const int64_t cols = y.dim(-1), rows = y.numel() / cols;
  DispatchFloat(y.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(cols, {dy.data(), y.data(), dx.data()}, [&]<int kVec>(VecTag<kVec>) {
      SoftmaxBackwardKernel<kVec, T>
          <<<BlocksFor(rows, 1), RowThreads(cols / kVec), 0, StreamOf(y)>>>(
              Ptr<const T>(dy), Ptr<const T>(y), rows, cols, Ptr<T>(dx));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace moe::cuda
