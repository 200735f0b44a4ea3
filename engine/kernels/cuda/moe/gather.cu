// CUDA row gathers (contracts: engine/kernels/op_declarations.inc).
//   GatherRows: out[i] = x[index[i]], any dtype: rows are copied as raw words of the widest size
//     (16, 8, 4, 2 or 1 bytes) that the row length and both base pointers allow.
//   GatherSumRows: out[i] = sum_j x[index[i, j]], f32 or bf16, summed in fp32 in j order.
// GatherRows: a block's threads split into groups of `lanes` (a power of two covering a row's
// words, at most the block), each group copying rows kRowsInFlight at a time (all their loads
// before their stores; four where a group is at least a warp, else one, which keeps four times
// the blocks for narrow rows), the words of a row to neighbouring threads, so accesses coalesce;
// no division per word (one thread per word over a flat index needs a 64-bit division for each).
// GatherSumRows: grid-stride over (output row, 8-element chunk).
// Indices out of range trap (MOE_DEVICE_CHECK).
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kGatherThreads = 256;

template <typename Word, int kRowsInFlight>
__global__ void __launch_bounds__(kGatherThreads)
    GatherRowsKernel(const Word* __restrict__ x, int64_t n, const int32_t* __restrict__ index,
                     int64_t m, int row_words, int lanes, Word* __restrict__ out) {
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t groups = int64_t{gridDim.x} * (kGatherThreads / lanes);
  const int64_t group = int64_t{blockIdx.x} * (kGatherThreads / lanes) + threadIdx.x / lanes;
  for (int64_t first = group * kRowsInFlight; first < m; first += groups * kRowsInFlight) {
    int64_t src[kRowsInFlight];
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      src[r] = first + r < m ? index[first + r] : 0;
      MOE_DEVICE_CHECK(src[r] >= 0 && src[r] < n);
    }
    for (int w = lane; w < row_words; w += lanes) {
      Word words[kRowsInFlight];
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        if (first + r < m) words[r] = x[src[r] * row_words + w];
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        if (first + r < m) out[(first + r) * row_words + w] = words[r];
      }
    }
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
  CHECK_LE(row_words, INT32_MAX) << "gather: row words must fit in i32";
  int lanes = 1;
  while (lanes < row_words && lanes < kGatherThreads) lanes *= 2;
  const int64_t m = index.dim(0);
  // Four rows in flight where a warp copies one row (wide rows: each thread's loads overlap);
  // one where it copies several, which keeps enough blocks for short gathers of narrow rows.
  const auto launch = [&]<int kRowsInFlight>(std::integral_constant<int, kRowsInFlight>) {
    GatherRowsKernel<Word, kRowsInFlight>
        <<<BlocksFor(m, int64_t{kGatherThreads} / lanes * kRowsInFlight), kGatherThreads, 0,
           StreamOf(x)>>>(Ptr<const Word>(x), x.dim(0), Ptr<const int32_t>(index), m,
                          static_cast<int>(row_words), lanes, Ptr<Word>(out));
    MOE_CUDA_CHECK_LAUNCH();
  };
  if (lanes >= 32) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
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
