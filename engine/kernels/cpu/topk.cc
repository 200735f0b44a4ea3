// CPU top-k and its backward.
//   TopK: per row the k largest of x (rows, cols), descending; ties go to the lower column and
//     NaN ranks above every number (so it propagates). values (rows, k) f32, indices i32.
//   TopKBackward: dx (rows, cols) = 0, then dvalues added at their columns (indices outside
//     [0, cols) are CHECK failures).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/kernels/cpu/checked_index.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// a ranks above b: larger, or NaN against a number.
bool RanksAbove(float a, float b) { return a > b || (std::isnan(a) && !std::isnan(b)); }

}  // namespace

void TopK(const Tensor& x, const Tensor& values, const Tensor& indices) {
  const int64_t rows = x.dim(0), cols = x.dim(1), k = values.dim(1);
  std::vector<int32_t> columns(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data<float>() + r * cols;
    std::iota(columns.begin(), columns.end(), 0);
    std::partial_sort(columns.begin(), columns.begin() + k, columns.end(),
                      [xr](int32_t a, int32_t b) {
                        if (RanksAbove(xr[a], xr[b])) return true;
                        return !RanksAbove(xr[b], xr[a]) && a < b;
                      });
    for (int64_t j = 0; j < k; ++j) {
      values.data<float>()[r * k + j] = xr[columns[j]];
      indices.data<int32_t>()[r * k + j] = columns[j];
    }
  }
}

void TopKBackward(const Tensor& dvalues, const Tensor& indices, const Tensor& dx) {
  const int64_t rows = dx.dim(0), cols = dx.dim(1), k = dvalues.dim(1);
  float* pdx = dx.data<float>();
  std::fill_n(pdx, dx.numel(), 0.0f);
  const int32_t* index = indices.data<int32_t>();
  for (int64_t i = 0; i < rows * k; ++i) {
    pdx[(i / k) * cols + CheckedIndex(index, i, cols, "topk index")] += dvalues.data<float>()[i];
  }
}

}  // namespace moe::cpu
