// CUDA row gathers (contracts: engine/kernels/op_declarations.inc).
//   GatherRows: out[i] = x[index[i]], any dtype: rows are copied as raw words of the widest size
//     (16, 8, 4, 2 or 1 bytes) that the row length and both base pointers allow.
//   GatherSumRows: out[i] = sum_j x[index[i, j]], f32 or bf16, summed in fp32 in j order.
// Grid-stride over (output row, word or 8-element chunk): neighbouring threads copy
// neighbouring parts of a row, so accesses coalesce. Indices out of range trap (MOE_DEVICE_CHECK).
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

template <typename Word>
__global__ void GatherRowsKernel(const Word* x, int64_t n, const int32_t* index, int64_t m,
                                 int64_t row_words, Word* out) {
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < m * row_words;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t src = index[idx / row_words];
    MOE_DEVICE_CHECK(src >= 0 && src < n);
    out[idx] = x[src * row_words + idx % row_words];
  }
}

template <int kVec, typename T>
__global__ void GatherSumRowsKernel(const T* x, int64_t n, const int32_t* index, int64_t m,
                                    int64_t k, int64_t h, T* out) {
  const int64_t chunks = h / kVec;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < m * chunks;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / chunks, c = idx % chunks * kVec;
    Floats<kVec> sum = {};
    for (int64_t j = 0; j < k; ++j) {
      const int64_t src = index[i * k + j];
      MOE_DEVICE_CHECK(src >= 0 && src < n);
      const Floats<kVec> v = LoadFloats<kVec>(x + src * h + c);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum.v[e] += v.v[e];
    }
    StoreFloats(out + i * h + c, sum);
  }
}

template <typename Word>
void LaunchGatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t row_words = x.dim(1) * static_cast<int64_t>(DTypeSize(x.dtype())) / sizeof(Word);
  const int64_t m = index.dim(0);
  constexpr int kThreads = 256;
  GatherRowsKernel<Word><<<BlocksFor(m * row_words, kThreads), kThreads, 0, StreamOf(x)>>>(
      Ptr<const Word>(x), x.dim(0), Ptr<const int32_t>(index), m, row_words, Ptr<Word>(out));
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  const size_t row_bytes = x.dim(1) * DTypeSize(x.dtype());
  const auto fits = [&](size_t word) {
    return row_bytes % word == 0 && reinterpret_cast<uintptr_t>(x.data()) % word == 0 &&
           reinterpret_cast<uintptr_t>(out.data()) % word == 0;
  };
  if (fits(16)) {
    LaunchGatherRows<uint4>(x, index, out);
  } else if (fits(8)) {
    LaunchGatherRows<uint2>(x, index, out);
  } else if (fits(4)) {
    LaunchGatherRows<uint32_t>(x, index, out);
  } else if (fits(2)) {
    LaunchGatherRows<uint16_t>(x, index, out);
  } else {
    LaunchGatherRows<uint8_t>(x, index, out);
  }
}

void GatherSumRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  const int64_t h = x.dim(1), m = index.dim(0), k = index.dim(1);
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(h, {x.data(), out.data()}, [&]<int kVec>(VecTag<kVec>) {
      constexpr int kThreads = 256;
      GatherSumRowsKernel<kVec, T>
          <<<BlocksFor(m * (h / kVec), kThreads), kThreads, 0, StreamOf(x)>>>(
              Ptr<const T>(x), x.dim(0), Ptr<const int32_t>(index), m, k, h, Ptr<T>(out));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace moe::cuda
