#include "engine/io/token_random.h"

#include <glog/logging.h>

namespace moe {

uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t StreamKey(uint64_t seed, uint64_t a, uint64_t b) {
  return Mix64(Mix64(Mix64(seed) ^ a) + b);
}

uint64_t SplitMix64::Next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return Mix64(state_);
}

double SplitMix64::NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

uint64_t SplitMix64::NextBelow(uint64_t n) {
  CHECK_GE(n, 1u);
  return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
}

IndexPermutation::IndexPermutation(int64_t size, uint64_t key) : size_(size) {
  CHECK(size >= 1 && size <= (int64_t{1} << 62)) << size;
  int bits = 2;
  while ((int64_t{1} << bits) < size) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < kRounds; ++r) round_keys_[r] = StreamKey(key, 0x5045524D, r);  // "PERM"
}

uint64_t IndexPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (const uint64_t round_key : round_keys_) {
    const uint64_t mixed = left ^ (Mix64(round_key ^ right) & half_mask_);
    left = right;
    right = mixed;
  }
  return (left << half_bits_) | right;
}

int64_t IndexPermutation::operator()(int64_t index) const {
  CHECK(index >= 0 && index < size_) << index << " outside [0, " << size_ << ")";
  // Cycle walking: the cycle through `index` returns to [0, size_) before it closes.
  uint64_t x = Encrypt(static_cast<uint64_t>(index));
  while (x >= static_cast<uint64_t>(size_)) x = Encrypt(x);
  return static_cast<int64_t>(x);
}

}  // namespace moe
