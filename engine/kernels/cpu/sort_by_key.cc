// CPU counting sort by key.
//   SortByKey: stable; order (n) = positions by ascending key, offsets (num_keys + 1) = bucket
//     starts, offsets[num_keys] = n. Keys outside [0, num_keys) are CHECK failures.
#include <algorithm>
#include <numeric>
#include <vector>

#include "engine/kernels/cpu/checked_index.h"
#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {

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

}  // namespace moe::cpu
