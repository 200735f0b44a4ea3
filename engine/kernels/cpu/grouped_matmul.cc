// CPU grouped GEMMs (contracts: engine/kernels/op_declarations.inc): the CPU Matmul (Eigen) on
// each non-empty group's row range, so the results are bit-identical to one Matmul per group; the
// SwiGLU forms compose those with the CPU SwigluForward / SwigluBackward. All f32. The offsets
// live in host memory here, so they are checked before use.
#include <glog/logging.h>

#include <span>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// The offsets' values, checked: 0 = offsets[0] <= ... <= offsets[groups] = rows.
std::span<const int32_t> GroupOffsets(const Tensor& offsets, int64_t rows) {
  const std::span<const int32_t> values(offsets.data<int32_t>(),
                                        static_cast<size_t>(offsets.numel()));
  CHECK(values.front() == 0 && values.back() == rows)
      << "group offsets run from " << values.front() << " to " << values.back()
      << ", expected 0 to " << rows;
  for (size_t g = 0; g + 1 < values.size(); ++g) {
    CHECK_LE(values[g], values[g + 1]) << "group offsets decrease after group " << g;
  }
  return values;
}

// Group g's matrix of a stacked (groups, r, c) tensor.
Tensor GroupMatrix(const Tensor& stacked, int64_t g) {
  return stacked.Rows(g, g + 1).View({stacked.dim(1), stacked.dim(2)});
}

}  // namespace

void GroupedMatmul(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                   bool transpose_w) {
  const std::span<const int32_t> rows = GroupOffsets(offsets, x.dim(0));
  for (size_t g = 0; g + 1 < rows.size(); ++g) {
    const int64_t begin = rows[g], end = rows[g + 1];
    if (begin == end) continue;
    Matmul(x.Rows(begin, end), GroupMatrix(w, g), y.Rows(begin, end), /*transpose_a=*/false,
           transpose_w);
  }
}

void GroupedMatmulWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                             const Tensor& dw) {
  const std::span<const int32_t> rows = GroupOffsets(offsets, x.dim(0));
  for (size_t g = 0; g + 1 < rows.size(); ++g) {
    const int64_t begin = rows[g], end = rows[g + 1];
    if (begin == end) continue;
    Matmul(dy.Rows(begin, end), x.Rows(begin, end), GroupMatrix(dw, g), /*transpose_a=*/true,
           /*transpose_b=*/false, /*beta=*/1.0f);
  }
}

void GroupedMatmulSwiglu(const Tensor& x, const Tensor& w, const Tensor& offsets,
                         const Tensor& scale, const Tensor& h, const Tensor& a) {
  GroupedMatmul(x, w, offsets, h, /*transpose_w=*/true);
  SwigluForward(h, scale, a);
}

void GroupedMatmulSwigluBackward(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 const Tensor& h, const Tensor& scale, const Tensor& dh,
                                 const Tensor& dscale) {
  Tensor da = Tensor::Empty({h.dim(0), h.dim(1) / 2}, DType::kF32, h.device());
  GroupedMatmul(dy, w, offsets, da, /*transpose_w=*/false);
  SwigluBackward(da, h, scale, dh, dscale);
}

}  // namespace moe::cpu
