// CUDA RMSNorm (contracts: engine/kernels/op_declarations.inc). x, y, dy, dx f32 or bf16 (one
// dtype); weight f32 or bf16; rstd f32; dweight f32 or bf16 (a gradient: rounded once per call);
// fp32 arithmetic.
//   Forward: rstd = 1 / sqrt(mean(x^2) + eps); y = x * rstd * weight. One block per row. With a
//   residual, x = x + residual is stored first (rounded as stored) and normalised.
//   Backward: dx = rstd * (w*dy - x * rstd^2 * mean(w*dy*x)) (=) + residual (where given, read
//   before dx is written: may alias); dweight += sum_rows dy*x*rstd.
// dweight is deterministic without float atomics: a fixed number of blocks (kPartialBlocks, or
// fewer rows) each walk rows b, b + grid, ... and keep per-column sums, written to a (blocks, h)
// scratch; a second kernel adds each column's partials in a fixed order. Where a block's threads
// hold a row in one vector each (h <= 1024 kVec), the backward loads dy, x and the residual once
// into registers before the row's reduction and keeps its column sums there (one memory round
// trip a row instead of two); wider rows are walked twice, their column sums in shared memory.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int64_t kPartialBlocks = 512;
constexpr int kMaxRowThreads = 1024;  // the widest row a block holds: kMaxRowThreads kVec

template <int kVec, typename T, typename W>
__global__ void RmsNormForwardKernel(T* x, const T* residual, const W* weight, float eps,
                                     int64_t rows, int64_t h, T* y, float* rstd) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* xr = x + row * h;
    float sum_sq = 0.0f;
    for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
      Floats<kVec> v = LoadFloats<kVec>(xr + c);
      if (residual) {  // x += residual, rounded as stored (the second loop reads it back)
        const Floats<kVec> r = LoadFloats<kVec>(residual + row * h + c);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v.v[j] = ToFloat(FromFloat<T>(v.v[j] + r.v[j]));
        StoreFloats(xr + c, v);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum_sq += v.v[j] * v.v[j];
    }
    const float s = 1.0f / sqrtf(BlockSum(sum_sq) / static_cast<float>(h) + eps);
    if (threadIdx.x == 0) rstd[row] = s;
    for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(xr + c), w = LoadFloats<kVec>(weight + c);
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = v.v[j] * s * w.v[j];
      StoreFloats(y + row * h + c, out);
    }
  }
}

// One element's share of the backward: dx given k = rstd^3 mean(w dy x) (r: the residual).
__device__ __forceinline__ float RmsNormDx(float s, float w, float d, float v, float k, float r) {
  return s * (w * d - v * k) + r;
}

// Writes dx for rows blockIdx.x, blockIdx.x + gridDim.x, ... and this block's column sums of
// dy * x * rstd over those rows to partials[blockIdx.x] (h). Thread t holds columns
// [t kVec, + kVec) of each row in registers (h <= blockDim.x * kVec).
template <int kVec, typename T, typename W>
__global__ void __launch_bounds__(kMaxRowThreads)
    RmsNormBackwardRowKernel(const T* dy, const T* x, const W* weight, const float* rstd,
                             const T* residual, int64_t rows, int64_t h, T* dx, float* partials) {
  const int64_t c = int64_t{threadIdx.x} * kVec;
  const bool owns = c < h;
  Floats<kVec> column_sums = {}, w = {};
  if (owns) w = LoadFloats<kVec>(weight + c);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float s = rstd[row];
    Floats<kVec> d = {}, v = {}, r = {};
    float dot = 0.0f;  // sum_j w dy x
    if (owns) {
      d = LoadFloats<kVec>(dy + row * h + c);
      v = LoadFloats<kVec>(x + row * h + c);
      if (residual) r = LoadFloats<kVec>(residual + row * h + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += w.v[j] * d.v[j] * v.v[j];
    }
    const float k = BlockSum(dot) / static_cast<float>(h) * s * s;
    if (owns) {
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out.v[j] = RmsNormDx(s, w.v[j], d.v[j], v.v[j], k, r.v[j]);
        column_sums.v[j] += d.v[j] * v.v[j] * s;
      }
      StoreFloats(dx + row * h + c, out);
    }
  }
  if (owns) StoreFloats(partials + blockIdx.x * h + c, column_sums);
}

// As RmsNormBackwardRowKernel for rows wider than a block's vectors: each row is read twice (the
// reduction, then dx) and the column sums kept in dynamic shared memory (h floats).
template <int kVec, typename T, typename W>
__global__ void RmsNormBackwardWideKernel(const T* dy, const T* x, const W* weight,
                                          const float* rstd, const T* residual, int64_t rows,
                                          int64_t h, T* dx, float* partials) {
  extern __shared__ float column_sums[];  // each thread owns the columns it walks: no races
  for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) column_sums[c + j] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * h;
    const T* xr = x + row * h;
    const float s = rstd[row];
    float dot = 0.0f;  // sum_j w dy x
    for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
      const Floats<kVec> d = LoadFloats<kVec>(dyr + c), v = LoadFloats<kVec>(xr + c);
      const Floats<kVec> w = LoadFloats<kVec>(weight + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += w.v[j] * d.v[j] * v.v[j];
    }
    const float k = BlockSum(dot) / static_cast<float>(h) * s * s;
    for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
      const Floats<kVec> d = LoadFloats<kVec>(dyr + c), v = LoadFloats<kVec>(xr + c);
      const Floats<kVec> w = LoadFloats<kVec>(weight + c);
      const Floats<kVec> r = residual ? LoadFloats<kVec>(residual + row * h + c) : Floats<kVec>{};
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out.v[j] = RmsNormDx(s, w.v[j], d.v[j], v.v[j], k, r.v[j]);
        column_sums[c + j] += d.v[j] * v.v[j] * s;
      }
      StoreFloats(dx + row * h + c, out);
    }
  }
  for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) partials[blockIdx.x * h + c + j] = column_sums[c + j];
  }
}

// dweight[c] += sum over b of partials[b][c] in a fixed order: a block covers 32 columns with
// kAddGroups warps; warp g sums b = g, g + kAddGroups, ... and the groups are then added in order
// (32 warps a block: faster than 8).
constexpr int kAddGroups = 32;
template <typename G>
__global__ void AddPartialsKernel(const float* partials, int64_t num_partials, int64_t h,
                                  G* dweight) {
  __shared__ float group_sums[kAddGroups][32];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < h) {
    for (int64_t b = threadIdx.y; b < num_partials; b += kAddGroups) sum += partials[b * h + c];
  }
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < h) {
    float total = 0.0f;
    for (int g = 0; g < kAddGroups; ++g) total += group_sums[g][threadIdx.x];
    dweight[c] = FromFloat<G>(ToFloat(dweight[c]) + total);
  }
}

}  // namespace

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd, const Tensor& residual) {
  if (x.numel() == 0) return;
  const int64_t h = x.dim(-1), rows = x.numel() / h;
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchFloat(weight.dtype(), [&]<typename W>(TypeTag<W>) {
      DispatchVec(h, {x.data(), weight.data(), y.data(), Ptr<const T>(residual)},
                  [&]<int kVec>(VecTag<kVec>) {
                    RmsNormForwardKernel<kVec, T, W>
                        <<<BlocksFor(rows, 1), RowThreads(h / kVec), 0, StreamOf(x)>>>(
                            Ptr<T>(x), Ptr<const T>(residual), Ptr<const W>(weight), eps, rows, h,
                            Ptr<T>(y), Ptr<float>(rstd));
                    MOE_CUDA_CHECK_LAUNCH();
                  });
    });
  });
}

void RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                     const Tensor& dx, const Tensor& dweight, const Tensor& residual) {
  if (x.numel() == 0) return;
  const int64_t h = x.dim(-1), rows = x.numel() / h;
  const cudaStream_t stream = StreamOf(x);
  const int64_t blocks = std::min(rows, kPartialBlocks);
  Tensor partials = Tensor::Empty({blocks, h}, DType::kF32, x.device());
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchFloat(weight.dtype(), [&]<typename W>(TypeTag<W>) {
      DispatchVec(
          h, {dy.data(), x.data(), weight.data(), dx.data(), Ptr<const T>(residual)},
          [&]<int kVec>(VecTag<kVec>) {
            const int64_t vectors = h / kVec;
            const bool in_registers = vectors <= kMaxRowThreads;
            const auto kernel = in_registers ? RmsNormBackwardRowKernel<kVec, T, W>
                                             : RmsNormBackwardWideKernel<kVec, T, W>;
            const size_t shared_bytes = in_registers ? 0 : static_cast<size_t>(h) * sizeof(float);
            if (shared_bytes > 48 * 1024) {  // beyond the default limit: opt in (up to 227 KiB)
              MOE_CUDA_CALL(cudaFuncSetAttribute(kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(shared_bytes)));
            }
            const int threads =
                in_registers ? RowThreads(vectors, kMaxRowThreads) : RowThreads(vectors);
            kernel<<<static_cast<int>(blocks), threads, shared_bytes, stream>>>(
                Ptr<const T>(dy), Ptr<const T>(x), Ptr<const W>(weight), Ptr<const float>(rstd),
                Ptr<const T>(residual), rows, h, Ptr<T>(dx), Ptr<float>(partials));
            MOE_CUDA_CHECK_LAUNCH();
          });
    });
  });
  DispatchFloat(dweight.dtype(), [&]<typename G>(TypeTag<G>) {
    AddPartialsKernel<G><<<static_cast<int>((h + 31) / 32), dim3(32, kAddGroups), 0, stream>>>(
        Ptr<const float>(partials), blocks, h, Ptr<G>(dweight));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace moe::cuda
