// CUDA SiLU and SwiGLU (contracts: engine/kernels/op_declarations.inc), f32 or bf16 storage,
// fp32 arithmetic.
//   silu(x) = x * sigmoid(x); silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
//   SwiGLU: x (rows, 2f) = [gate | up]; y (rows, f) = silu(gate) * up * scale[row].
//   Backward: dgate = dy*scale*up*silu'(gate), dup = dy*scale*silu(gate) (=);
//   dscale[row] = sum_j silu(gate) * up * dy (=), a block reduction per row.
// SiLU goes through Map; SwiGLU runs one block per row (grid-stride over rows), 8 columns per
// thread step when f % 8 == 0 and the rows are 16-byte aligned.
#include "engine/kernels/cuda/cuda_ops.h"
#include "engine/kernels/cuda/layers/swiglu_math.cuh"
#include "engine/kernels/cuda/tensor_math/elementwise.cuh"

namespace moe::cuda {
namespace {

struct SiluOp {
  __device__ float operator()(float x) const { return x * Sigmoid(x); }
};

struct SiluBackwardOp {
  __device__ float operator()(float dy, float x) const {
    const float s = Sigmoid(x);
    return dy * (s * (1.0f + x * (1.0f - s)));
  }
};

template <int kVec, typename T>
__global__ void SwigluForwardKernel(const T* x, const float* scale, int64_t rows, int64_t f, T* y) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gate = x + row * 2 * f;
    const T* up = gate + f;
    const float s = scale != nullptr ? scale[row] : 1.0f;
    for (int64_t c = threadIdx.x * kVec; c < f; c += blockDim.x * kVec) {
      const Floats<kVec> g = LoadFloats<kVec>(gate + c), u = LoadFloats<kVec>(up + c);
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = SwigluValue(g.v[j], u.v[j], s);
      StoreFloats(y + row * f + c, out);
    }
  }
}

template <int kVec, typename T>
__global__ void SwigluBackwardKernel(const T* dy, const T* x, const float* scale, int64_t rows,
                                     int64_t f, T* dx, float* dscale) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gate = x + row * 2 * f;
    const T* up = gate + f;
    const float s = scale != nullptr ? scale[row] : 1.0f;
    float dscale_partial = 0.0f;
    for (int64_t c = threadIdx.x * kVec; c < f; c += blockDim.x * kVec) {
      const Floats<kVec> g = LoadFloats<kVec>(gate + c), u = LoadFloats<kVec>(up + c);
      const Floats<kVec> d = LoadFloats<kVec>(dy + row * f + c);
      Floats<kVec> dg, du;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const SwigluGradient gradient = SwigluGradients(g.v[j], u.v[j], s, d.v[j]);
        dg.v[j] = gradient.gate;
        du.v[j] = gradient.up;
        dscale_partial += gradient.product;
      }
      if (dx != nullptr) {  // the same for every thread
        StoreFloats(dx + row * 2 * f + c, dg);
        StoreFloats(dx + row * 2 * f + f + c, du);
      }
    }
    if (dscale != nullptr) {  // the same for every thread: all reach the block reduction
      dscale_partial = BlockSum(dscale_partial);
      if (threadIdx.x == 0) dscale[row] = dscale_partial;
    }
  }
}

}  // namespace

void SiluForward(const Tensor& x, const Tensor& y) {
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    Map(StreamOf(x), x.numel(), SiluOp{}, Ptr<T>(y), Ptr<const T>(x));
  });
}

void SiluBackward(const Tensor& dy, const Tensor& x, const Tensor& dx) {
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    Map(StreamOf(x), x.numel(), SiluBackwardOp{}, Ptr<T>(dx), Ptr<const T>(dy), Ptr<const T>(x));
  });
}

void SwigluForward(const Tensor& x, const Tensor& scale, const Tensor& y) {
  const int64_t rows = x.dim(0), f = y.dim(1);
  if (rows == 0 || f == 0) return;
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(f, {x.data(), y.data()}, [&]<int kVec>(VecTag<kVec>) {
      SwigluForwardKernel<kVec, T><<<BlocksFor(rows, 1), RowThreads(f / kVec), 0, StreamOf(x)>>>(
          Ptr<const T>(x), Ptr<const float>(scale), rows, f, Ptr<T>(y));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

void SwigluBackward(const Tensor& dy, const Tensor& x, const Tensor& scale, const Tensor& dx,
                    const Tensor& dscale) {
  const int64_t rows = x.dim(0), f = dy.dim(1);
  if (rows == 0) return;
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(f, {dy.data(), x.data(), Ptr<const T>(dx)}, [&]<int kVec>(VecTag<kVec>) {
      SwigluBackwardKernel<kVec, T><<<BlocksFor(rows, 1), RowThreads(f / kVec), 0, StreamOf(x)>>>(
          Ptr<const T>(dy), Ptr<const T>(x), Ptr<const float>(scale), rows, f, Ptr<T>(dx),
          Ptr<float>(dscale));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace moe::cuda
