// Counter-based random numbers that do not depend on the platform's <random> distributions:
// the same (seed, stream) gives the same values everywhere, so CPU and CUDA runs of one seed
// start from identical weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace moe {

inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;  // the state's step per draw

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += kSplitMix64Gamma);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a: a stable hash of a name, to derive a parameter's stream from its name.
inline uint64_t StableHash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0)
      : state_(seed ^ (stream * 0xda942042e4dd58b5ull)) {}

  uint64_t NextU64() { return SplitMix64(state_); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (one value per call; the pair's second half is dropped).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Moves on as `n` calls of Normal() would (two draws each, nothing cached), in O(1).
  void SkipNormals(uint64_t n) { state_ += 2 * n * kSplitMix64Gamma; }

 private:
  uint64_t state_;
};

}  // namespace moe
