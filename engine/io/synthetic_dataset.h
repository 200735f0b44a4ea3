// Synthetic data: a seeded sparse Markov chain whose best achievable loss is known exactly.
//
// The chain has order 1 (the next token depends on the previous one) or 2 (on the previous two).
// Its context c is the previous token, or the previous two as a * vocab_size + b; each context
// has `successors` distinct possible next tokens with random probabilities. A random chain always
// includes, for the context ending in token b, the successor of b on a random cycle through all
// tokens; so every context reaches one closed class and the stationary distribution pi over
// contexts is unique. It is found by lazy power iteration (pi <- (pi + pi P) / 2) until the L1
// change is below 1e-12.
//
// Windows: window i of a split is an independent sequence drawn from the seeded stream
// (seed, split, i): its first context from pi, then the chain. Train and validation are separate
// streams; each split holds 2^40 windows. Drawing a window costs O(window length).
//
// Loss floor: a window starts stationary, so target t (predicted from tokens 0..t-1) has
// conditional entropy H_rate = sum_c pi(c) H(next | c) once t >= order. For order 2, target 1
// sees one token only: H(X1 | X0) = -sum_ab pi(a,b) log(pi(a,b) / pi1(a)). The floor is the mean
// over the seq_length targets, in nats; OptimalProbability is the predictor that attains it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/io/token_source.h"

namespace moe {

struct SyntheticOptions {
  int order = 1;         // 1 or 2
  int successors = 4;    // distinct possible next tokens per context
  uint64_t seed = 1234;  // picks the chain and the window contents (the sampler picks the order)
};

struct MarkovChain {
  int64_t vocab_size = 0;
  int order = 1;
  int successors = 0;
  std::vector<int32_t> next_tokens;   // (contexts, successors), distinct within a row
  std::vector<double> probabilities;  // (contexts, successors), >= 0, each row sums to 1

  int64_t num_contexts() const;
};

// The chain SyntheticOptions describe: successor probabilities (0.1 + u) / sum, u ~ U[0, 1).
// Errors for options a user can get wrong (order, successors, too many order-2 contexts).
StatusOr<MarkovChain> RandomMarkovChain(int64_t vocab_size, const SyntheticOptions& options);

class SyntheticTokenSource final : public TokenSource {
 public:
  // CHECKs that `chain` is well formed; `seed` keys the window streams.
  SyntheticTokenSource(MarkovChain chain, uint64_t seed);
  static StatusOr<std::unique_ptr<SyntheticTokenSource>> Create(int64_t vocab_size,
                                                                const SyntheticOptions& options);

  int64_t vocab_size() const override { return chain_.vocab_size; }
  StatusOr<int64_t> NumWindows(Split split, int64_t window_length) const override;
  void ReadWindow(Split split, int64_t index, std::span<int32_t> out) const override;
  std::optional<double> CrossEntropyFloor(int64_t seq_length) const override;
  std::string Describe() const override;

  // The probability the optimal predictor gives window[t] after window[0, t), t >= 1.
  double OptimalProbability(std::span<const int32_t> window, int64_t t) const;
  const std::vector<double>& stationary() const { return stationary_; }  // (contexts)

  static constexpr int64_t kWindowsPerSplit = int64_t{1} << 40;

 private:
  int32_t SampleNext(int64_t context, double u) const;

  MarkovChain chain_;
  uint64_t seed_;
  std::vector<double> stationary_;      // (contexts)
  std::vector<double> stationary_cdf_;  // (contexts), inclusive prefix sums
  std::vector<double> transition_cdf_;  // (contexts, successors), inclusive prefix sums
  double entropy_rate_ = 0;             // nats
  double first_target_entropy_ = 0;     // H(X1 | X0) for order 2, nats
};

}  // namespace moe
