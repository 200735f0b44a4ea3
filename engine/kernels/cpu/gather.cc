// CPU row gathers.
//   GatherRows: out[i] = x[index[i]] (any dtype). GatherSumRows: out[i] = sum_j x[index[i, j]]
//     (f32, summed in double in j order). Indices outside x's rows are CHECK failures.
#include <cstring>

#include "engine/kernels/cpu/checked_index.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

void GatherRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const size_t row_bytes = x.dim(1) * DTypeSize(x.dtype());
  const auto* src = static_cast<const char*>(x.data());
  auto* dst = static_cast<char*>(out.data());
  const int32_t* idx = index.data<int32_t>();
  for (int64_t i = 0; i < index.dim(0); ++i) {
    std::memcpy(dst + i * row_bytes,
                src + CheckedIndex(idx, i, x.dim(0), "gather index") * row_bytes, row_bytes);
  }
}

void GatherSumRows(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t n = x.dim(0), h = x.dim(1), m = index.dim(0), k = index.dim(1);
  const int32_t* idx = index.data<int32_t>();
  std::vector<double> acc(h);
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const float* row = x.data<float>() + CheckedIndex(idx, i * k + j, n, "gather-sum index") * h;
      for (int64_t c = 0; c < h; ++c) acc[c] += row[c];
    }
    std::copy(acc.begin(), acc.end(), out.data<float>() + i * h);
  }
}

}  // namespace moe::cpu
