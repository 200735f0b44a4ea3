// CUDA per-token cross-entropy (contracts: engine/kernels/op_declarations.inc). logits (tokens,
// vocab) f32 or bf16; targets (tokens) i32, negative = ignored; losses, lse (tokens) f32.
//   Forward: lse = log sum exp(logits row) in fp32 with an online max and rescaled sum (one pass
//   over the row); losses = lse - logit[target], 0 where ignored (lse is still written).
//   Backward: dlogits = grad_scale * (exp(logit - lse) - onehot(target)) (=), 0 where ignored.
//   ForwardBackward: both from one read of the row where a block's registers hold it (vocab up to
//   kFusedThreads x 8 x kMaxFusedChunks = 32768 with 16-byte aligned rows): each thread keeps
//   e = exp(logit - its own max) and their sum, one block reduction combines the (max, sum)
//   pairs, then dlogits = grad_scale * (e exp(own max - max) / sum - onehot): one exp per
//   element, one barrier round; otherwise the two kernels. (The 8-layer preset's head, 4096 x 32000
//   bf16 logits in place: forward 98 us + backward 133 us under ncu on the H200.)
// One block per row (grid-stride over rows). Targets >= vocab trap (MOE_DEVICE_CHECK).
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

// A running max and the sum of exp(x - max) over the elements seen.
struct MaxSum {
  float max;
  float sum;
};

struct CombineMaxSum {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    if (a.max == -INFINITY && b.max == -INFINITY) return a;  // nothing but -inf so far
    const float max = fmaxf(a.max, b.max);  // a NaN max still makes the sum NaN below
    return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
  }
};

template <int kVec, typename T>
__global__ void CrossEntropyForwardKernel(const T* logits, const int32_t* targets, int64_t rows,
                                          int64_t vocab, float* losses, float* lse) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = logits + row * vocab;
    MaxSum acc = {-INFINITY, 0.0f};
    for (int64_t c = threadIdx.x * kVec; c < vocab; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(xr + c);
      float chunk_max = v.v[0];
#pragma unroll
      for (int j = 1; j < kVec; ++j) chunk_max = fmaxf(chunk_max, v.v[j]);
      if (!(chunk_max <= acc.max)) {  // a larger max, or NaN (which then propagates)
        acc.sum *= expf(acc.max - chunk_max);
        acc.max = chunk_max;
      }
      if (acc.max != -INFINITY) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc.sum += expf(v.v[j] - acc.max);
      }
    }
    const MaxSum total = BlockReduce(acc, CombineMaxSum{}, MaxSum{-INFINITY, 0.0f});
    if (threadIdx.x == 0) {
      const float row_lse = total.max + logf(total.sum);
      const int64_t target = targets[row];
      MOE_DEVICE_CHECK(target < vocab);
      lse[row] = row_lse;
      losses[row] = target < 0 ? 0.0f : row_lse - ToFloat(xr[target]);
    }
  }
}

template <int kVec, typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits, const int32_t* targets,
                                           const float* lse, float grad_scale, int64_t rows,
                                           int64_t vocab, T* dlogits) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t target = targets[row];
    MOE_DEVICE_CHECK(target < vocab);
    const float row_lse = lse[row];
    for (int64_t c = threadIdx.x * kVec; c < vocab; c += blockDim.x * kVec) {
      const Floats<kVec> v = LoadFloats<kVec>(logits + row * vocab + c);
      Floats<kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float onehot = c + j == target ? 1.0f : 0.0f;
        out.v[j] = target < 0 ? 0.0f : grad_scale * (expf(v.v[j] - row_lse) - onehot);
      }
      StoreFloats(dlogits + row * vocab + c, out);
    }
  }
}

constexpr int kFusedThreads = 1024;
constexpr int kMaxFusedChunks = 4;  // 32 floats a thread: 1024 threads keep them in registers

// Row elements [8 (q blockDim + threadIdx), + 8) for q < kChunks in registers (kVec 8).
template <int kChunks, typename T>
__global__ void __launch_bounds__(kFusedThreads)
    CrossEntropyFusedKernel(const T* logits, const int32_t* targets, float grad_scale, int64_t rows,
                            int64_t vocab, float* losses, float* lse, T* dlogits) {
  constexpr int kVec = 8;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = logits + row * vocab;
    const int64_t target = targets[row];
    MOE_DEVICE_CHECK(target < vocab);
    // Read before the reductions' barriers, so before any thread overwrites it (in place).
    const float target_logit = threadIdx.x == 0 && target >= 0 ? ToFloat(xr[target]) : 0.0f;
    // e = exp(logit - this thread's max), summed; one block reduction of (max, sum) pairs.
    Floats<kVec> e[kChunks];
    MaxSum local = {-INFINITY, 0.0f};
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int64_t c = (int64_t{q} * blockDim.x + threadIdx.x) * kVec;
      if (c < vocab) {
        e[q] = LoadFloats<kVec>(xr + c);
#pragma unroll
        for (int j = 0; j < kVec; ++j) local.max = fmaxf(local.max, e[q].v[j]);
      }
    }
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      if ((int64_t{q} * blockDim.x + threadIdx.x) * kVec < vocab) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          e[q].v[j] = local.max == -INFINITY ? 0.0f : expf(e[q].v[j] - local.max);
          local.sum += e[q].v[j];
        }
      }
    }
    const MaxSum total = BlockReduce(local, CombineMaxSum{}, MaxSum{-INFINITY, 0.0f});
    const float row_lse = total.max + logf(total.sum);
    if (threadIdx.x == 0) {
      lse[row] = row_lse;
      losses[row] = target < 0 ? 0.0f : row_lse - target_logit;
    }
    const float scale = target < 0 ? 0.0f : grad_scale / total.sum * expf(local.max - total.max);
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int64_t c = (int64_t{q} * blockDim.x + threadIdx.x) * kVec;
      if (c < vocab) {
        Floats<kVec> out;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float onehot = c + j == target ? grad_scale : 0.0f;
          out.v[j] = target < 0 ? 0.0f : scale * e[q].v[j] - onehot;
        }
        StoreFloats(dlogits + row * vocab + c, out);
      }
    }
  }
}

}  // namespace

void CrossEntropyForward(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                         const Tensor& lse) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0) return;
  DispatchFloat(logits.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(vocab, {logits.data()}, [&]<int kVec>(VecTag<kVec>) {
      CrossEntropyForwardKernel<kVec, T>
          <<<BlocksFor(rows, 1), RowThreads(vocab / kVec), 0, StreamOf(logits)>>>(
              Ptr<const T>(logits), Ptr<const int32_t>(targets), rows, vocab, Ptr<float>(losses),
              Ptr<float>(lse));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                          float grad_scale, const Tensor& dlogits) {
  if (logits.numel() == 0) return;
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  DispatchFloat(logits.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(vocab, {logits.data(), dlogits.data()}, [&]<int kVec>(VecTag<kVec>) {
      CrossEntropyBackwardKernel<kVec, T>
          <<<BlocksFor(rows, 1), RowThreads(vocab / kVec), 0, StreamOf(logits)>>>(
              Ptr<const T>(logits), Ptr<const int32_t>(targets), Ptr<const float>(lse), grad_scale,
              rows, vocab, Ptr<T>(dlogits));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

void CrossEntropyForwardBackward(const Tensor& logits, const Tensor& targets, float grad_scale,
                                 const Tensor& losses, const Tensor& lse, const Tensor& dlogits) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0) return;
  const bool vectorised = vocab % 8 == 0 && Aligned16(logits.data()) && Aligned16(dlogits.data());
  const int threads = RowThreads(vocab / 8, kFusedThreads);
  int chunks = 1;
  while (int64_t{chunks} * threads * 8 < vocab) chunks *= 2;
  if (!vectorised || chunks > kMaxFusedChunks) {
    CrossEntropyForward(logits, targets, losses, lse);
    CrossEntropyBackward(logits, targets, lse, grad_scale, dlogits);
    return;
  }
  DispatchFloat(logits.dtype(), [&]<typename T>(TypeTag<T>) {
    const auto launch = [&]<int kChunks>(std::integral_constant<int, kChunks>) {
      CrossEntropyFusedKernel<kChunks, T><<<BlocksFor(rows, 1), threads, 0, StreamOf(logits)>>>(
          Ptr<const T>(logits), Ptr<const int32_t>(targets), grad_scale, rows, vocab,
          Ptr<float>(losses), Ptr<float>(lse), Ptr<T>(dlogits));
      MOE_CUDA_CHECK_LAUNCH();
    };
    switch (chunks) {
      case 1:
        launch(std::integral_constant<int, 1>{});
        break;
      case 2:
        launch(std::integral_constant<int, 2>{});
        break;
      default:
        launch(std::integral_constant<int, kMaxFusedChunks>{});
        break;
    }
  });
}

}  // namespace moe::cuda
