// CPU GroupedMatmul and GroupedMatmulWeightGrad (contracts: engine/kernels/op_declarations.inc):
// the CPU Matmul (Eigen) on each non-empty group's row range, so the results are bit-identical to
// one Matmul per group. All f32.
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Group g's matrix of a stacked (groups, r, c) tensor.
Tensor GroupMatrix(const Tensor& stacked, int64_t g) {
  return stacked.Rows(g, g + 1).View({stacked.dim(1), stacked.dim(2)});
}

}  // namespace

void GroupedMatmul(const Tensor& x, const Tensor& w, std::span<const int32_t> offsets,
                   const Tensor& y, bool transpose_w) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    if (begin == end) continue;
    Matmul(x.Rows(begin, end), GroupMatrix(w, g), y.Rows(begin, end), /*transpose_a=*/false,
           transpose_w);
  }
}

void GroupedMatmulWeightGrad(const Tensor& dy, const Tensor& x, std::span<const int32_t> offsets,
                             const Tensor& dw) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    if (begin == end) continue;
    Matmul(dy.Rows(begin, end), x.Rows(begin, end), GroupMatrix(dw, g), /*transpose_a=*/true,
           /*transpose_b=*/false, /*beta=*/1.0f);
  }
}

}  // namespace moe::cpu
