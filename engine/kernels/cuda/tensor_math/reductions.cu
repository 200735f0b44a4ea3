// CUDA Sum and GlobalL2Norm (contracts: engine/kernels/op_declarations.inc): out (1) f32.
// Deterministic two-pass reductions with a fixed grid (kReduceBlocks x kReduceThreads, whatever
// the sizes), so the summation order depends only on the inputs' sizes:
//   1. Each thread accumulates its grid-stride share in fp32 (8 elements per step when the
//      tensor is 16-byte aligned), the block reduces, and thread 0 writes (or, for a later batch
//      of tensors, adds to) partials[block]. GlobalL2Norm walks its tensors (f32 and bf16 mixed)
//      in span order, up to kMaxInputs per launch, passed by value as kernel parameters.
//   2. One block of kReduceBlocks threads sums the partials; GlobalL2Norm takes the sqrt.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kReduceBlocks = 1024;  // with 256 threads: about 8 a SM, loads in flight on every SM
constexpr int kReduceThreads = 256;
constexpr int kMaxInputs = 32;

struct ReduceInput {
  const void* data;
  int64_t n;
  bool is_bf16;
};

struct ReduceInputs {
  ReduceInput inputs[kMaxInputs];
  int count;
};

template <bool kSquare, typename T>
__device__ float AccumulateShare(const T* p, int64_t n, float acc) {
  const int64_t start = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t done = 0;
  if (Aligned16(p)) {
    for (int64_t c = start; c < n / 8; c += stride) {
      const Floats<8> v = LoadFloats<8>(p + c * 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc += kSquare ? v.v[j] * v.v[j] : v.v[j];
    }
    done = n / 8 * 8;
  }
  for (int64_t i = done + start; i < n; i += stride) {
    const float v = ToFloat(p[i]);
    acc += kSquare ? v * v : v;
  }
  return acc;
}

template <bool kSquare>
__global__ void PartialSumsKernel(ReduceInputs batch, bool accumulate, float* partials) {
  float acc = 0.0f;
  for (int t = 0; t < batch.count; ++t) {
    const ReduceInput& in = batch.inputs[t];
    acc = in.is_bf16 ? AccumulateShare<kSquare>(static_cast<const bf16*>(in.data), in.n, acc)
                     : AccumulateShare<kSquare>(static_cast<const float*>(in.data), in.n, acc);
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = accumulate ? partials[blockIdx.x] + acc : acc;
}

// One block of kReduceBlocks threads.
__global__ void FinishKernel(const float* partials, bool take_sqrt, float* out) {
  const float total = BlockSum(partials[threadIdx.x]);
  if (threadIdx.x == 0) out[0] = take_sqrt ? sqrtf(total) : total;
}

// out = sum over xs of sum(x) (or of sum(x^2), then its sqrt).
void Reduce(std::span<const Tensor> xs, bool square, const Tensor& out) {
  const cudaStream_t stream = StreamOf(out);
  Tensor partials = Tensor::Empty({kReduceBlocks}, DType::kF32, out.device());
  const auto kernel = square ? PartialSumsKernel<true> : PartialSumsKernel<false>;
  size_t next = 0;
  bool accumulate = false;
  do {  // at least once, so that partials are written even for no tensors
    ReduceInputs batch = {};
    for (; next < xs.size() && batch.count < kMaxInputs; ++next) {
      batch.inputs[batch.count++] = {xs[next].data(), xs[next].numel(),
                                     xs[next].dtype() == DType::kBF16};
    }
    kernel<<<kReduceBlocks, kReduceThreads, 0, stream>>>(batch, accumulate, Ptr<float>(partials));
    MOE_CUDA_CHECK_LAUNCH();
    accumulate = true;
  } while (next < xs.size());
  FinishKernel<<<1, kReduceBlocks, 0, stream>>>(Ptr<const float>(partials), square,
                                                Ptr<float>(out));
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void Sum(const Tensor& x, const Tensor& out) { Reduce(std::span<const Tensor>(&x, 1), false, out); }

void GlobalL2Norm(std::span<const Tensor> xs, const Tensor& out) { Reduce(xs, true, out); }

}  // namespace moe::cuda
