#include "engine/io/synthetic_dataset.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include <glog/logging.h>

#include "engine/io/token_random.h"

namespace moe {
namespace {

// Bounds that keep building a chain (about 100 power-iteration sweeps over contexts) under a
// second: order 1 up to a 262144-token vocabulary, order 2 up to 512.
constexpr int64_t kMaxContexts = int64_t{1} << 18;
constexpr int kMaxSuccessors = 64;
constexpr double kStationaryTolerance = 1e-12;  // L1 change of one lazy power-iteration step
constexpr int kMaxPowerIterations = 100000;
constexpr uint64_t kChainStreamTag = 2;  // window streams use the split (0, 1)

// Entropy in nats of a distribution given by (possibly zero) probabilities.
double Entropy(std::span<const double> probabilities) {
  double h = 0;
  for (const double p : probabilities) {
    if (p > 0) h -= p * std::log(p);
  }
  return h;
}

// The stationary distribution over contexts, by lazy power iteration from uniform.
std::vector<double> StationaryDistribution(const MarkovChain& chain) {
  const int64_t contexts = chain.num_contexts();
  const int k = chain.successors;
  std::vector<double> pi(contexts, 1.0 / static_cast<double>(contexts));
  std::vector<double> next(contexts);
  for (int iteration = 0;; ++iteration) {
    CHECK_LT(iteration, kMaxPowerIterations) << "power iteration did not converge";
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t c = 0; c < contexts; ++c) {
      if (pi[c] == 0) continue;
      for (int j = 0; j < k; ++j) {
        const int64_t to = (c * chain.vocab_size + chain.next_tokens[c * k + j]) % contexts;
        next[to] += pi[c] * chain.probabilities[c * k + j];
      }
    }
    double sum = 0;
    for (int64_t c = 0; c < contexts; ++c) {
      next[c] = 0.5 * (pi[c] + next[c]);
      sum += next[c];
    }
    double change = 0;
    for (int64_t c = 0; c < contexts; ++c) {
      next[c] /= sum;
      change += std::abs(next[c] - pi[c]);
    }
    pi.swap(next);
    if (change < kStationaryTolerance) return pi;
  }
}

std::vector<double> InclusivePrefixSums(std::span<const double> values) {
  std::vector<double> sums(values.size());
  std::partial_sum(values.begin(), values.end(), sums.begin());
  return sums;
}

// The first index whose inclusive prefix sum exceeds u * total: a draw from the weights.
int64_t SampleIndex(std::span<const double> prefix_sums, double u) {
  const double x = u * prefix_sums.back();
  return std::upper_bound(prefix_sums.begin(), prefix_sums.end(), x) - prefix_sums.begin();
}

}  // namespace

int64_t MarkovChain::num_contexts() const {
  return order == 1 ? vocab_size : vocab_size * vocab_size;
}

StatusOr<MarkovChain> RandomMarkovChain(int64_t vocab_size, const SyntheticOptions& options) {
  if (options.order != 1 && options.order != 2) {
    return InvalidArgument("synthetic data: order " + std::to_string(options.order) +
                           " is not supported (1 or 2)");
  }
  const int64_t max_successors = std::min<int64_t>(vocab_size, kMaxSuccessors);
  if (options.successors < 1 || options.successors > max_successors) {
    return InvalidArgument("synthetic data: successors per context must be in [1, " +
                           std::to_string(max_successors) + "] (at most --vocab_size and " +
                           std::to_string(kMaxSuccessors) + "), got " +
                           std::to_string(options.successors));
  }
  MarkovChain chain;
  chain.vocab_size = vocab_size;
  chain.order = options.order;
  chain.successors = options.successors;
  if (chain.num_contexts() > kMaxContexts) {
    return InvalidArgument("synthetic data: an order-" + std::to_string(options.order) +
                           " chain over --vocab_size " + std::to_string(vocab_size) + " has " +
                           std::to_string(chain.num_contexts()) + " contexts; the limit is " +
                           std::to_string(kMaxContexts));
  }

  SplitMix64 rng(StreamKey(options.seed, kChainStreamTag, 0));
  std::vector<int32_t> cycle(vocab_size);
  std::iota(cycle.begin(), cycle.end(), 0);
  for (int64_t i = vocab_size - 1; i > 0; --i) std::swap(cycle[i], cycle[rng.NextBelow(i + 1)]);
  std::vector<int32_t> cycle_successor(vocab_size);
  for (int64_t i = 0; i < vocab_size; ++i) cycle_successor[cycle[i]] = cycle[(i + 1) % vocab_size];

  const int k = chain.successors;
  chain.next_tokens.resize(chain.num_contexts() * k);
  chain.probabilities.resize(chain.num_contexts() * k);
  for (int64_t c = 0; c < chain.num_contexts(); ++c) {
    int32_t* next = &chain.next_tokens[c * k];
    double* probability = &chain.probabilities[c * k];
    next[0] = cycle_successor[c % vocab_size];
    for (int j = 1; j < k; ++j) {
      do {
        next[j] = static_cast<int32_t>(rng.NextBelow(vocab_size));
      } while (std::find(next, next + j, next[j]) != next + j);
    }
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += probability[j] = 0.1 + rng.NextDouble();
    for (int j = 0; j < k; ++j) probability[j] /= sum;
  }
  return chain;
}

SyntheticTokenSource::SyntheticTokenSource(MarkovChain chain, uint64_t seed)
    : chain_(std::move(chain)), seed_(seed) {
  const int64_t contexts = chain_.num_contexts();
  const int k = chain_.successors;
  CHECK(chain_.order == 1 || chain_.order == 2) << chain_.order;
  CHECK_GE(k, 1);
  CHECK_EQ(static_cast<int64_t>(chain_.next_tokens.size()), contexts * k);
  CHECK_EQ(static_cast<int64_t>(chain_.probabilities.size()), contexts * k);
  for (int64_t c = 0; c < contexts; ++c) {
    const std::span<const int32_t> next(&chain_.next_tokens[c * k], k);
    const std::span<const double> probability(&chain_.probabilities[c * k], k);
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      CHECK(next[j] >= 0 && next[j] < chain_.vocab_size) << "context " << c;
      CHECK(std::find(next.begin(), next.begin() + j, next[j]) == next.begin() + j)
          << "context " << c << " lists token " << next[j] << " twice";
      CHECK_GE(probability[j], 0.0);
      sum += probability[j];
    }
    CHECK_LT(std::abs(sum - 1.0), 1e-9) << "context " << c;
  }

  stationary_ = StationaryDistribution(chain_);
  stationary_cdf_ = InclusivePrefixSums(stationary_);
  transition_cdf_.resize(contexts * k);
  for (int64_t c = 0; c < contexts; ++c) {
    const std::span<const double> row(&chain_.probabilities[c * k], k);
    std::partial_sum(row.begin(), row.end(), transition_cdf_.begin() + c * k);
    entropy_rate_ += stationary_[c] * Entropy(row);
  }
  if (chain_.order == 2) {
    const int64_t v = chain_.vocab_size;
    for (int64_t a = 0; a < v; ++a) {
      const std::span<const double> joint(&stationary_[a * v], v);  // pi(a, .)
      const double marginal = std::accumulate(joint.begin(), joint.end(), 0.0);
      for (const double p : joint) {
        if (p > 0) first_target_entropy_ -= p * std::log(p / marginal);
      }
    }
  }
}

StatusOr<std::unique_ptr<SyntheticTokenSource>> SyntheticTokenSource::Create(
    int64_t vocab_size, const SyntheticOptions& options) {
  MOE_ASSIGN_OR_RETURN(MarkovChain chain, RandomMarkovChain(vocab_size, options));
  return std::make_unique<SyntheticTokenSource>(std::move(chain), options.seed);
}

StatusOr<int64_t> SyntheticTokenSource::NumWindows(Split, int64_t window_length) const {
  CHECK_GE(window_length, 2);
  return kWindowsPerSplit;
}

int32_t SyntheticTokenSource::SampleNext(int64_t context, double u) const {
  const int k = chain_.successors;
  const int64_t j = SampleIndex(std::span(&transition_cdf_[context * k], k), u);
  return chain_.next_tokens[context * k + j];
}

void SyntheticTokenSource::ReadWindow(Split split, int64_t index, std::span<int32_t> out) const {
  CHECK(index >= 0 && index < kWindowsPerSplit) << index;
  CHECK_GE(out.size(), 2u);
  const int64_t v = chain_.vocab_size;
  const int64_t contexts = chain_.num_contexts();
  SplitMix64 rng(StreamKey(seed_, static_cast<uint64_t>(split), static_cast<uint64_t>(index)));
  int64_t context = SampleIndex(stationary_cdf_, rng.NextDouble());
  if (chain_.order == 1) {
    out[0] = static_cast<int32_t>(context);
  } else {
    out[0] = static_cast<int32_t>(context / v);
    out[1] = static_cast<int32_t>(context % v);
  }
  for (size_t t = chain_.order; t < out.size(); ++t) {
    out[t] = SampleNext(context, rng.NextDouble());
    context = (context * v + out[t]) % contexts;
  }
}

std::optional<double> SyntheticTokenSource::CrossEntropyFloor(int64_t seq_length) const {
  CHECK_GE(seq_length, 1);
  if (chain_.order == 1) return entropy_rate_;
  return (first_target_entropy_ + static_cast<double>(seq_length - 1) * entropy_rate_) /
         static_cast<double>(seq_length);
}

double SyntheticTokenSource::OptimalProbability(std::span<const int32_t> window, int64_t t) const {
  CHECK(t >= 1 && t < static_cast<int64_t>(window.size())) << t;
  const int64_t v = chain_.vocab_size;
  if (t < chain_.order) {  // order 2, target 1: only token 0 is known
    const std::span<const double> joint(&stationary_[window[0] * v], v);
    const double marginal = std::accumulate(joint.begin(), joint.end(), 0.0);
    return marginal > 0 ? joint[window[1]] / marginal : 0.0;
  }
  const int64_t context =
      chain_.order == 1 ? window[t - 1] : int64_t{window[t - 2]} * v + window[t - 1];
  const int k = chain_.successors;
  for (int j = 0; j < k; ++j) {
    if (chain_.next_tokens[context * k + j] == window[t]) {
      return chain_.probabilities[context * k + j];
    }
  }
  return 0.0;
}

std::string SyntheticTokenSource::Describe() const {
  std::ostringstream out;
  out << "synthetic: order-" << chain_.order << " Markov chain over " << chain_.vocab_size
      << " tokens, " << chain_.successors << " successors per context, seed " << seed_
      << ", entropy rate " << entropy_rate_ << " nats/token";
  return out.str();
}

}  // namespace moe
