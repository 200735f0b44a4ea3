// Map: the elementwise kernel behind Fill, Cast, Add, Scale, Axpy and SiLU.
//   out[i] = op(in[i]...) for i < n, computed in fp32; each pointer is f32 or bf16 storage (the
//   output may also be an integer type, for Fill). Op is a functor with a __device__
//   float operator()(float...) const. Contiguous tensors; the output may alias an input.
// When every pointer is 16-byte aligned a thread handles 8 elements per step with 16-byte
// accesses; the last n % 8 elements are done one by one.
#pragma once

#include "engine/kernels/cuda/common/cuda_common.cuh"

namespace moe::cuda {

template <int kVec, typename Op, typename Out, typename... In>
__global__ void MapKernel(int64_t n, Op op, Out* out, const In*... in) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x * kVec;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec; i < n; i += stride) {
    if (i + kVec <= n) {
      Floats<kVec> result;
      [&](const auto&... args) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) result.v[j] = op(args.v[j]...);
      }(LoadFloats<kVec>(in + i)...);
      StoreFloats(out + i, result);
    } else {
      for (int64_t j = i; j < n; ++j) out[j] = FromFloat<Out>(op(ToFloat(in[j])...));
    }
  }
}

// Enqueues the map on `stream`.
template <typename Op, typename Out, typename... In>
void Map(cudaStream_t stream, int64_t n, Op op, Out* out, const In*... in) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (Aligned16(out) && (Aligned16(in) && ...)) {
    MapKernel<8><<<BlocksFor(n, kThreads * 8), kThreads, 0, stream>>>(n, op, out, in...);
  } else {
    MapKernel<1><<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, op, out, in...);
  }
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
