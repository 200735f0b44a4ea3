// Synthetic Markov data: the exact loss floor (hand-computed chains, and a Monte-Carlo estimate
// over sampled windows), stationarity, window determinism, and option errors.
#include "engine/io/synthetic_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/io/dataset.h"

namespace moe {
namespace {

// 0 -> {0, 1} with 1/2 each, 1 -> 0 always: pi = (2/3, 1/3), entropy rate (2/3) ln 2.
TEST(SyntheticDatasetTest, HandComputedOrderOneChain) {
  MarkovChain chain{.vocab_size = 2,
                    .order = 1,
                    .successors = 2,
                    .next_tokens = {0, 1, 0, 1},
                    .probabilities = {0.5, 0.5, 1.0, 0.0}};
  const SyntheticTokenSource source(std::move(chain), 1);
  EXPECT_NEAR(source.stationary()[0], 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(source.stationary()[1], 1.0 / 3.0, 1e-12);
  for (const int64_t seq_length : {1, 7, 128}) {
    EXPECT_NEAR(*source.CrossEntropyFloor(seq_length), 2.0 / 3.0 * std::log(2.0), 1e-12);
  }
  std::vector<int32_t> window(50);
  source.ReadWindow(Split::kTrain, 3, window);
  for (size_t t = 1; t < window.size(); ++t) {
    EXPECT_FALSE(window[t - 1] == 1 && window[t] == 1) << "1 -> 1 has probability 0, t " << t;
  }
}

// x_t = x_{t-2}: after two tokens the rest is determined, but token 1 is a fair coin given
// token 0 (pi is uniform over the four pairs). Floor: ln 2 / seq_length.
TEST(SyntheticDatasetTest, HandComputedOrderTwoChain) {
  MarkovChain chain{.vocab_size = 2,
                    .order = 2,
                    .successors = 1,
                    .next_tokens = {0, 0, 1, 1},  // contexts (0,0) (0,1) (1,0) (1,1)
                    .probabilities = {1, 1, 1, 1}};
  const SyntheticTokenSource source(std::move(chain), 1);
  for (const double p : source.stationary()) EXPECT_NEAR(p, 0.25, 1e-12);
  for (const int64_t seq_length : {1, 2, 10}) {
    EXPECT_NEAR(*source.CrossEntropyFloor(seq_length), std::log(2.0) / seq_length, 1e-12);
  }
  std::vector<int32_t> window(9);
  source.ReadWindow(Split::kValidation, 11, window);
  for (size_t t = 2; t < window.size(); ++t) EXPECT_EQ(window[t], window[t - 2]);
  EXPECT_DOUBLE_EQ(source.OptimalProbability(window, 1), 0.5);
  EXPECT_DOUBLE_EQ(source.OptimalProbability(window, 5), 1.0);
}

TEST(SyntheticDatasetTest, StationaryDistributionIsStationary) {
  for (const int order : {1, 2}) {
    const int64_t vocab = order == 1 ? 256 : 32;
    const MarkovChain chain =
        RandomMarkovChain(vocab, {.order = order, .successors = 4, .seed = 9}).value();
    const SyntheticTokenSource source(chain, 9);
    const std::vector<double>& pi = source.stationary();
    std::vector<double> moved(pi.size(), 0.0);
    for (int64_t c = 0; c < chain.num_contexts(); ++c) {
      for (int j = 0; j < 4; ++j) {
        moved[(c * vocab + chain.next_tokens[c * 4 + j]) % chain.num_contexts()] +=
            pi[c] * chain.probabilities[c * 4 + j];
      }
    }
    double residual = 0;
    for (size_t c = 0; c < pi.size(); ++c) residual += std::abs(moved[c] - pi[c]);
    EXPECT_LT(residual, 1e-11) << "order " << order;
  }
}

// The mean of -log p(target | context) under the optimal predictor over sampled windows must
// match the computed floor: checks the stationary start, the sampling and the entropy sums.
void ExpectMonteCarloMatchesFloor(int64_t vocab, int order, int64_t seq_length, int windows) {
  DataOptions options;
  options.vocab_size = vocab;
  options.synthetic = {.order = order, .successors = 3, .seed = 21};
  const std::unique_ptr<TokenSource> source = OpenTokenSource(options).value();
  const auto& synthetic = static_cast<const SyntheticTokenSource&>(*source);
  BatchSampler sampler = BatchSampler::Create(source.get(), seq_length, windows, 5).value();
  std::vector<int32_t> batch(windows * (seq_length + 1));
  sampler.NextTrainBatch(batch);
  // Windows are independent; tokens within one are not, so the error bar uses window means.
  double sum = 0, sum_squares = 0;
  for (int w = 0; w < windows; ++w) {
    const std::span<const int32_t> window(&batch[w * (seq_length + 1)], seq_length + 1);
    double loss = 0;
    for (int64_t t = 1; t <= seq_length; ++t)
      loss -= std::log(synthetic.OptimalProbability(window, t));
    loss /= static_cast<double>(seq_length);
    sum += loss;
    sum_squares += loss * loss;
  }
  const double mean = sum / windows;
  const double standard_error = std::sqrt((sum_squares / windows - mean * mean) / (windows - 1));
  const double floor = *source->CrossEntropyFloor(seq_length);
  EXPECT_LT(standard_error, 0.01);
  EXPECT_NEAR(mean, floor, 4 * standard_error)
      << "order " << order << ", standard error " << standard_error;
}

TEST(SyntheticDatasetTest, FloorMatchesMonteCarloOrderOne) {
  ExpectMonteCarloMatchesFloor(/*vocab=*/256, /*order=*/1, /*seq_length=*/64, /*windows=*/4000);
}

TEST(SyntheticDatasetTest, FloorMatchesMonteCarloOrderTwo) {
  // Short windows, so the first target's higher entropy moves the floor well off the rate.
  ExpectMonteCarloMatchesFloor(/*vocab=*/16, /*order=*/2, /*seq_length=*/4, /*windows=*/40000);
}

TEST(SyntheticDatasetTest, OrderTwoFloorIncludesTheFirstTarget) {
  const std::unique_ptr<SyntheticTokenSource> source =
      SyntheticTokenSource::Create(16, {.order = 2, .successors = 3, .seed = 21}).value();
  const double first_target = *source->CrossEntropyFloor(1);             // H(X1 | X0)
  const double rate = 2 * *source->CrossEntropyFloor(2) - first_target;  // H(X2 | X0, X1)
  EXPECT_GT(first_target, rate + 0.5);
  EXPECT_NEAR(*source->CrossEntropyFloor(4), (first_target + 3 * rate) / 4, 1e-12);
}

TEST(SyntheticDatasetTest, WindowsAreAFunctionOfSeedSplitAndIndex) {
  const SyntheticOptions options{.order = 1, .successors = 4, .seed = 3};
  const auto a = SyntheticTokenSource::Create(64, options).value();
  const auto b = SyntheticTokenSource::Create(64, options).value();
  std::vector<int32_t> wa(33), wb(33), other(33);
  a->ReadWindow(Split::kTrain, 12345, wa);
  b->ReadWindow(Split::kTrain, 12345, wb);
  EXPECT_EQ(wa, wb);
  a->ReadWindow(Split::kValidation, 12345, other);
  EXPECT_NE(wa, other);
  a->ReadWindow(Split::kTrain, 12346, other);
  EXPECT_NE(wa, other);
  const auto reseeded = SyntheticTokenSource::Create(64, {.seed = 4}).value();
  reseeded->ReadWindow(Split::kTrain, 12345, other);
  EXPECT_NE(wa, other);
}

TEST(SyntheticDatasetTest, RejectsBadOptions) {
  auto message = [](int64_t vocab, const SyntheticOptions& options) {
    return RandomMarkovChain(vocab, options).status().message();
  };
  EXPECT_EQ(message(256, {.order = 3}), "synthetic data: order 3 is not supported (1 or 2)");
  EXPECT_EQ(message(256, {.successors = 0}),
            "synthetic data: successors per context must be in [1, 64] (at most --vocab_size and "
            "64), got 0");
  EXPECT_EQ(message(3, {.successors = 4}),
            "synthetic data: successors per context must be in [1, 3] (at most --vocab_size and "
            "64), got 4");
  EXPECT_EQ(message(4096, {.order = 2}),
            "synthetic data: an order-2 chain over --vocab_size 4096 has 16777216 contexts; the "
            "limit is 262144");
}

}  // namespace
}  // namespace moe
