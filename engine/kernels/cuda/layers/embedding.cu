// CUDA embedding (contracts: engine/kernels/op_declarations.inc). ids (tokens) i32.
//   Forward: out (tokens, h) = table[ids]: GatherRows.
//   Backward: dtable (vocab, h) f32 or bf16 += dout (tokens, h) rows scattered by id,
//   deterministic: SortByKey groups the token positions by id (stable, so in token order), then one
//   block per vocabulary row starts from the dtable row and adds its tokens' rows in token order,
//   in fp32 (the CPU reference's order exactly), a bf16 row rounded once. Rows without tokens are
//   left untouched.
#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

template <int kVec, typename T, typename G>
__global__ void EmbeddingBackwardKernel(const int32_t* order, const int32_t* offsets, const T* dout,
                                        int64_t vocab, int64_t h, G* dtable) {
  for (int64_t id = blockIdx.x; id < vocab; id += gridDim.x) {
    const int32_t begin = offsets[id], end = offsets[id + 1];
    if (begin == end) continue;
    G* row = dtable + id * h;
    for (int64_t c = threadIdx.x * kVec; c < h; c += blockDim.x * kVec) {
      Floats<kVec> sum = LoadFloats<kVec>(row + c);
#pragma unroll 8  // independent loads in flight; the adds stay in token order
      for (int32_t t = begin; t < end; ++t) {
        const Floats<kVec> g = LoadFloats<kVec>(dout + int64_t{order[t]} * h + c);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum.v[j] += g.v[j];
      }
      StoreFloats(row + c, sum);
    }
  }
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  GatherRows(table, ids, out);
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const int64_t tokens = ids.dim(0), vocab = dtable.dim(0), h = dtable.dim(1);
  if (tokens == 0 || h == 0) return;
  Tensor order = Tensor::Empty({tokens}, DType::kI32, ids.device());
  Tensor offsets = Tensor::Empty({vocab + 1}, DType::kI32, ids.device());
  SortByKey(ids, vocab, order, offsets);
  DispatchFloat(dout.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchFloat(dtable.dtype(), [&]<typename G>(TypeTag<G>) {
      DispatchVec(h, {dout.data(), dtable.data()}, [&]<int kVec>(VecTag<kVec>) {
        EmbeddingBackwardKernel<kVec, T, G>
            <<<BlocksFor(vocab, 1), RowThreads(h / kVec), 0, StreamOf(ids)>>>(
                Ptr<const int32_t>(order), Ptr<const int32_t>(offsets), Ptr<const T>(dout), vocab,
                h, Ptr<G>(dtable));
        MOE_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace moe::cuda
