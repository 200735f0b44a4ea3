// For the CPU kernels that read indices (embedding ids, targets, routing and gather indices):
// index[i], CHECKed to lie in [0, bound), the message naming `what`, the value and the position.
#pragma once

#include <cstdint>

#include <glog/logging.h>

namespace moe::cpu {

inline int32_t CheckedIndex(const int32_t* index, int64_t i, int64_t bound, const char* what) {
  CHECK(index[i] >= 0 && index[i] < bound)
      << what << " " << index[i] << " at " << i << " outside [0, " << bound << ")";
  return index[i];
}

}  // namespace moe::cpu
