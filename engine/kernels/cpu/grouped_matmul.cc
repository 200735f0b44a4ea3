// CPU GroupedMatmul and GroupedMatmulWeightGrad (contracts: engine/kernels/op_declarations.inc):
// the CPU Matmul (Eigen) on each non-empty group's row range, so the results are bit-identical to
// one Matmul per group. f32, except dw, which may be bf16 (Matmul rounds each group's result
// once). The offsets tensor is host memory here, read directly: host
// offsets are never needed (ops.cc has checked that any given equal it).
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Group g's matrix of a stacked (groups, r, c) tensor.
Tensor GroupMatrix(const Tensor& stacked, int64_t g) {
  return stacked.Rows(g, g + 1).View({stacked.dim(1), stacked.dim(2)});
}

}  // namespace

void GroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets,
                   std::span<const int32_t> /*host_offsets*/, const Tensor& y, bool transpose_w) {
  const std::span<const int32_t> rows = offsets.values<int32_t>();
  for (size_t g = 0; g + 1 < rows.size(); ++g) {
    const int64_t begin = rows[g], end = rows[g + 1];
    if (begin == end) continue;
    Matmul(x.Rows(begin, end), GroupMatrix(w, g), y.Rows(begin, end), /*transpose_a=*/false,
           transpose_w);
  }
}

void GroupedMatmulWeightGrad(std::span<const GroupedRows> parts, const Tensor& dw,
                             bool accumulate) {
  if (!accumulate) Fill(dw, 0.0f);
  for (const GroupedRows& part : parts) {
    const std::span<const int32_t> rows = part.offsets.values<int32_t>();
    for (size_t g = 0; g + 1 < rows.size(); ++g) {
      const int64_t begin = rows[g], end = rows[g + 1];
      if (begin == end) continue;
      Matmul(part.dy.Rows(begin, end), part.x.Rows(begin, end), GroupMatrix(dw, g),
             /*transpose_a=*/true, /*transpose_b=*/false, /*beta=*/1.0f);
    }
  }
}

bool GroupedMatmulNeedsHostOffsets(Device /*device*/, DType /*dtype*/,
                                   const Shape& /*weight_shape*/) {
  return false;
}

}  // namespace moe::cpu
