// CUDA per-token cross-entropy (contracts: engine/kernels/op_declarations.inc). logits (tokens,
// vocab) f32 or bf16; targets (tokens) i32, negative = ignored; losses, lse (tokens) f32.
//   Forward: lse = log sum exp(logits row) in fp32 with an online max and rescaled sum (one pass
//   over the row); losses = lse - logit[target], 0 where ignored (lse is still written).
//   Backward: dlogits = grad_scale * (exp(logit - lse) - onehot(target)) (=), 0 where ignored.
//   ForwardBackward: both in one kernel, the row's second read (for dlogits, which may alias the
//   logits) straight after its first, while the row is still in L2: the logits cross DRAM once
//   instead of twice. Same arithmetic as the two kernels, so the same bits: the adds and
//   multiplies around expf and logf are _rn intrinsics, which the compiler never contracts into an
//   FMA with their last multiply (plain operators were contracted differently in the two kernels,
//   and in the two operand orders of a reduction's lanes: f32 dlogits 1 ulp apart).
// One block per row (grid-stride over rows). Targets >= vocab trap (MOE_DEVICE_CHECK).
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

// A running max and the sum of exp(x - max) over the elements seen.
struct MaxSum {
  float max;
  float sum;
};

// Commutative to the bit (the _rn intrinsics are never contracted into an FMA, which would round
// one product and not the other): the shuffles of a block reduction combine (a, b) in one lane and
// (b, a) in its partner, and every thread uses the total.
struct CombineMaxSum {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    if (a.max == -INFINITY && b.max == -INFINITY) return a;  // nothing but -inf so far
    const float max = fmaxf(a.max, b.max);  // a NaN max still makes the sum NaN below
    return {max,
            __fadd_rn(__fmul_rn(a.sum, expf(a.max - max)), __fmul_rn(b.sum, expf(b.max - max)))};
  }
};

// log sum exp of the row xr[0, vocab), returned to every thread of the block.
template <int kVec, typename T>
__device__ float RowLogSumExp(const T* xr, int64_t vocab) {
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
      for (int j = 0; j < kVec; ++j) acc.sum = __fadd_rn(acc.sum, expf(v.v[j] - acc.max));
    }
  }
  const MaxSum total = BlockReduce(acc, CombineMaxSum{}, MaxSum{-INFINITY, 0.0f});
  return __fadd_rn(total.max, logf(total.sum));
}

// dr[c] = grad_scale * (exp(xr[c] - row_lse) - onehot(target)), 0 where target < 0. Each thread
// reads each element it writes first, so dr may alias xr.
template <int kVec, typename T>
__device__ void WriteRowGrad(const T* xr, int64_t target, float row_lse, float grad_scale,
                             int64_t vocab, T* dr) {
  for (int64_t c = threadIdx.x * kVec; c < vocab; c += blockDim.x * kVec) {
    const Floats<kVec> v = LoadFloats<kVec>(xr + c);
    Floats<kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float onehot = c + j == target ? 1.0f : 0.0f;
      out.v[j] =
          target < 0 ? 0.0f : __fmul_rn(grad_scale, __fsub_rn(expf(v.v[j] - row_lse), onehot));
    }
    StoreFloats(dr + c, out);
  }
}

template <int kVec, typename T>
__global__ void CrossEntropyForwardKernel(const T* logits, const int32_t* targets, int64_t rows,
                                          int64_t vocab, float* losses, float* lse) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = logits + row * vocab;
    const float row_lse = RowLogSumExp<kVec>(xr, vocab);
    if (threadIdx.x == 0) {
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
    WriteRowGrad<kVec>(logits + row * vocab, target, lse[row], grad_scale, vocab,
                       dlogits + row * vocab);
  }
}

template <int kVec, typename T>
__global__ void CrossEntropyForwardBackwardKernel(const T* logits, const int32_t* targets,
                                                  float grad_scale, int64_t rows, int64_t vocab,
                                                  float* losses, float* lse, T* dlogits) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = logits + row * vocab;
    const int64_t target = targets[row];
    MOE_DEVICE_CHECK(target < vocab);
    // Read before the reduction's barriers, so before any thread overwrites it (in place).
    const float target_logit = threadIdx.x == 0 && target >= 0 ? ToFloat(xr[target]) : 0.0f;
    const float row_lse = RowLogSumExp<kVec>(xr, vocab);
    if (threadIdx.x == 0) {
      lse[row] = row_lse;
      losses[row] = target < 0 ? 0.0f : row_lse - target_logit;
    }
    WriteRowGrad<kVec>(xr, target, row_lse, grad_scale, vocab, dlogits + row * vocab);
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
  DispatchFloat(logits.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(vocab, {logits.data(), dlogits.data()}, [&]<int kVec>(VecTag<kVec>) {
      CrossEntropyForwardBackwardKernel<kVec, T>
          <<<BlocksFor(rows, 1), RowThreads(vocab / kVec), 0, StreamOf(logits)>>>(
              Ptr<const T>(logits), Ptr<const int32_t>(targets), grad_scale, rows, vocab,
              Ptr<float>(losses), Ptr<float>(lse), Ptr<T>(dlogits));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace moe::cuda
