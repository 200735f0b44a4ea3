// CPU embedding lookup, f32.
//   EmbeddingForward: out (tokens, h) = table[ids] (=). EmbeddingBackward: dtable += dout rows
//     scattered by ids, in token order (deterministic; dtable f32, or bf16 rounded once per call).
//     Ids outside the table are CHECK failures.
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/checked_index.h"
#include "engine/kernels/cpu/cpu_ops.h"
#include "engine/kernels/cpu/f32_output.h"

namespace moe::cpu {

void EmbeddingForward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const float* row =
        table.data<float>() + CheckedIndex(ids.data<int32_t>(), t, vocab, "embedding id") * h;
    std::copy(row, row + h, out.data<float>() + t * h);
  }
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const int64_t vocab = dtable.dim(0), h = dtable.dim(1);
  const F32Output dtable_f32(dtable, /*read=*/true);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    float* row = dtable_f32.f32().data<float>() +
                 CheckedIndex(ids.data<int32_t>(), t, vocab, "embedding id") * h;
    const float* g = dout.data<float>() + t * h;
    for (int64_t j = 0; j < h; ++j) row[j] += g[j];
  }
  dtable_f32.Commit();
}

}  // namespace moe::cpu
