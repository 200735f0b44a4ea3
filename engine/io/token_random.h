// Counter-based randomness for the data layer: every draw is a pure function of a few integers
// (a seed and stream tags), so any window or batch can be regenerated from its index alone. That
// is what lets a resumed run see exactly the batches of an uninterrupted one. Portable by
// construction: no std:: distributions, whose outputs differ between standard libraries.
#pragma once

#include <cstdint>

namespace moe {

// The SplitMix64 finaliser: a bijective 64-bit mixer.
uint64_t Mix64(uint64_t x);
// The key of stream (seed, a, b): distinct tags give unrelated streams.
uint64_t StreamKey(uint64_t seed, uint64_t a, uint64_t b);

// SplitMix64: a tiny generator with a 64-bit state.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double NextDouble();             // uniform in [0, 1), 53 random bits
  uint64_t NextBelow(uint64_t n);  // in [0, n), n >= 1 (multiply-shift; bias below 2^-40)

 private:
  uint64_t state_;
};

// A pseudorandom bijection of [0, size), chosen by `key`, in O(1) memory: a 4-round balanced
// Feistel network over the smallest even bit width that covers `size` (so at most 4 * size
// values), cycle-walked back into range (fewer than 4 steps expected).
class IndexPermutation {
 public:
  IndexPermutation(int64_t size, uint64_t key);
  int64_t operator()(int64_t index) const;  // index in [0, size)

 private:
  static constexpr int kRounds = 4;
  uint64_t Encrypt(uint64_t x) const;

  int64_t size_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[kRounds];
};

}  // namespace moe
