// CPU routing ops: top-k, its backward, counting sort by key, row gathers.
//   TopK: per row the k largest of x (rows, cols), descending; ties go to the lower column and
//     NaN ranks above every number (so it propagates). values (rows, k) f32, indices i32.
//   TopKBackward: dx (rows, cols) = 0, then dvalues added at their columns.
//   SortByKey: stable counting sort; order (n) = positions by ascending key, offsets
//     (num_keys + 1) = bucket starts, offsets[num_keys] = n.
//   GatherRows: out[i] = x[index[i]] (any dtype). GatherSumRows: out[i] = sum_j x[index[i, j]]
//     (f32, summed in double in j order).
// Indices outside their range are CHECK failures.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <glog/logging.h>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

int32_t CheckedIndex(const int32_t* index, int64_t i, int64_t bound, const char* what) {
  CHECK(index[i] >= 0 && index[i] < bound)
      << what << " " << index[i] << " at " << i << " outside [0, " << bound << ")";
  return index[i];
}

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

void SortByKey(const Tensor& keys, int64_t num_keys, const Tensor& order, const Tensor& offsets) {
  const int64_t n = keys.numel();
  const int32_t* key = keys.data<int32_t>();
  int32_t* start = offsets.data<int32_t>();
  std::fill_n(start, num_keys + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++start[CheckedIndex(key, i, num_keys, "sort key") + 1];
  std::partial_sum(start, start + num_keys + 1, start);
  std::vector<int32_t> next(start, start + num_keys);
  for (int64_t i = 0; i < n; ++i) order.data<int32_t>()[next[key[i]]++] = static_cast<int32_t>(i);
}

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
