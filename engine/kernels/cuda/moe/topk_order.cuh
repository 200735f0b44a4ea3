// Top-k order as integer keys, shared by the top-k kernels (topk.cu, router_gate.cu).
#pragma once

#include <cstdint>

namespace moe::cuda {

// The element (v, column)'s rank in top-k order as an unsigned key: the float's bits made
// order-preserving (negatives flipped, positives' sign bit set; every NaN just above +inf, -0
// as +0) above the column's complement, so that a tie goes to the lower column. The largest key,
// a NaN in column 0, stays below ~0 (TopKKernel's "above every key").
__device__ __forceinline__ uint64_t OrderKey(float v, int column) {
  constexpr uint32_t kNan = 0xff800001u;  // +inf's bits with the sign bit set, plus one
  uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  bits = isnan(v) ? kNan : (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return uint64_t{bits} << 32 | ~static_cast<uint32_t>(column);
}

// The column an OrderKey names.
__device__ __forceinline__ int KeyColumn(uint64_t key) {
  return static_cast<int>(~static_cast<uint32_t>(key));
}

// The largest of the warp's `best` keys, in every lane.
__device__ __forceinline__ uint64_t WarpMaxKey(uint64_t best) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, best, offset);
    if (other > best) best = other;
  }
  return best;
}

// The next pick of a warp whose lanes hold their columns' keys in registers: the largest key
// below `last` (the previous pick's; ~0 before the first), in every lane. A key of 0 stands for
// "none" (a lane's slot past the row's end): no element's key is 0, as a column's complement is
// never 0.
template <int kCached>
__device__ __forceinline__ uint64_t NextPick(const uint64_t (&keys)[kCached], uint64_t last) {
  uint64_t best = 0;
#pragma unroll
  for (int q = 0; q < kCached; ++q) {
    if (keys[q] < last && keys[q] > best) best = keys[q];
  }
  return WarpMaxKey(best);
}

}  // namespace moe::cuda
