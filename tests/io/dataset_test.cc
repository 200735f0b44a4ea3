// BatchSampler and OpenTokenSource: epochs, determinism, exact resume, repeatable evaluation,
// and the errors a user can cause.
#include "engine/io/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moe {
namespace {

// Window i of a split is [split, i, i, ...]: what a batch read is visible in its tokens.
class IndexSource final : public TokenSource {
 public:
  IndexSource(int64_t train_windows, int64_t validation_windows, int64_t max_window_length)
      : windows_{train_windows, validation_windows}, max_window_length_(max_window_length) {}

  int64_t vocab_size() const override { return 1 << 20; }
  StatusOr<int64_t> NumWindows(Split split, int64_t window_length) const override {
    if (window_length > max_window_length_) {
      return InvalidArgument(std::string(SplitName(split)) + " too small");
    }
    return windows_[static_cast<int>(split)];
  }
  void ReadWindow(Split split, int64_t index, std::span<int32_t> out) const override {
    EXPECT_LT(index, windows_[static_cast<int>(split)]);
    std::fill(out.begin(), out.end(), static_cast<int32_t>(index));
    out[0] = static_cast<int32_t>(split);
  }
  std::string Describe() const override { return "index source"; }

 private:
  int64_t windows_[2];
  int64_t max_window_length_;
};

// The window index of each row of a batch read from an IndexSource.
std::vector<int32_t> RowWindows(const std::vector<int32_t>& batch, int64_t window_length) {
  std::vector<int32_t> windows;
  for (size_t row = 0; row < batch.size(); row += window_length) windows.push_back(batch[row + 1]);
  return windows;
}

TEST(BatchSamplerTest, EachEpochVisitsEveryTrainWindowOnceInANewOrder) {
  constexpr int64_t kWindows = 37;
  const IndexSource source(kWindows, 5, 100);
  BatchSampler sampler = BatchSampler::Create(&source, /*seq_length=*/3, 1, /*seed=*/7).value();
  std::vector<int32_t> epoch0(kWindows * 4), epoch1(kWindows * 4);
  sampler.ReadSamples(Split::kTrain, 0, epoch0);
  sampler.ReadSamples(Split::kTrain, kWindows, epoch1);
  std::vector<int32_t> all(kWindows);
  std::iota(all.begin(), all.end(), 0);
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::vector<int32_t> windows = RowWindows(*epoch, 4);
    std::sort(windows.begin(), windows.end());
    EXPECT_EQ(windows, all);
  }
  EXPECT_NE(RowWindows(epoch0, 4), RowWindows(epoch1, 4));
  EXPECT_NE(RowWindows(epoch0, 4), all);  // shuffled
}

TEST(BatchSamplerTest, OneWindowSplitsWork) {
  const IndexSource source(1, 1, 100);
  BatchSampler sampler = BatchSampler::Create(&source, 2, 3, 0).value();
  std::vector<int32_t> batch(9);
  sampler.NextTrainBatch(batch);
  EXPECT_EQ(batch, std::vector<int32_t>({0, 0, 0, 0, 0, 0, 0, 0, 0}));
  sampler.ValidationBatch(4, batch);
  EXPECT_EQ(batch, std::vector<int32_t>({1, 0, 0, 1, 0, 0, 1, 0, 0}));
}

class SyntheticSamplerTest : public ::testing::Test {
 protected:
  static constexpr int64_t kSeqLength = 16;
  static constexpr int64_t kBatch = 4;

  void SetUp() override {
    DataOptions options;
    options.vocab_size = 64;
    source_ = OpenTokenSource(options).value();
  }
  BatchSampler NewSampler(uint64_t seed) const {
    return BatchSampler::Create(source_.get(), kSeqLength, kBatch, seed).value();
  }
  static std::vector<int32_t> NewBatch() { return std::vector<int32_t>(kBatch * (kSeqLength + 1)); }
  static std::vector<std::vector<int32_t>> TrainBatches(BatchSampler& sampler, int count) {
    std::vector<std::vector<int32_t>> batches;
    for (int i = 0; i < count; ++i) {
      batches.push_back(NewBatch());
      sampler.NextTrainBatch(batches.back());
    }
    return batches;
  }

  std::unique_ptr<TokenSource> source_;
};

TEST_F(SyntheticSamplerTest, SameSeedSameBatchesDifferentSeedsDiffer) {
  BatchSampler a = NewSampler(1), b = NewSampler(1), c = NewSampler(2);
  const auto batches_a = TrainBatches(a, 5);
  EXPECT_EQ(batches_a, TrainBatches(b, 5));
  const auto batches_c = TrainBatches(c, 5);
  for (int i = 0; i < 5; ++i) EXPECT_NE(batches_a[i], batches_c[i]) << i;
  for (int i = 1; i < 5; ++i) EXPECT_NE(batches_a[0], batches_a[i]) << i;
  for (const auto& batch : batches_a) {
    for (const int32_t token : batch) ASSERT_TRUE(token >= 0 && token < 64) << token;
  }
}

TEST_F(SyntheticSamplerTest, RestoredPositionReproducesTheFollowingBatches) {
  BatchSampler uninterrupted = NewSampler(3);
  const auto all = TrainBatches(uninterrupted, 8);
  EXPECT_EQ(uninterrupted.consumed_train_samples(), 8 * kBatch);

  BatchSampler first_run = NewSampler(3);
  TrainBatches(first_run, 3);
  const int64_t saved = first_run.consumed_train_samples();
  EXPECT_EQ(saved, 3 * kBatch);

  BatchSampler resumed = NewSampler(3);
  ASSERT_TRUE(resumed.RestoreConsumedTrainSamples(saved).ok());
  const auto rest = TrainBatches(resumed, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(rest[i], all[3 + i]) << "batch " << 3 + i;
}

TEST_F(SyntheticSamplerTest, PositionCountsSamplesSoTheBatchSizeMayChangeOnResume) {
  BatchSampler big = NewSampler(4);
  TrainBatches(big, 2);  // 8 samples
  BatchSampler small = BatchSampler::Create(source_.get(), kSeqLength, kBatch / 2, 4).value();
  ASSERT_TRUE(small.RestoreConsumedTrainSamples(big.consumed_train_samples()).ok());
  std::vector<int32_t> half_a(kBatch / 2 * (kSeqLength + 1)), half_b(half_a.size());
  small.NextTrainBatch(half_a);
  small.NextTrainBatch(half_b);
  std::vector<int32_t> whole = NewBatch();
  big.NextTrainBatch(whole);
  half_a.insert(half_a.end(), half_b.begin(), half_b.end());
  EXPECT_EQ(half_a, whole);
}

TEST_F(SyntheticSamplerTest, ValidationBatchesRepeatAndDifferFromTrain) {
  BatchSampler sampler = NewSampler(5);
  std::vector<int32_t> first0 = NewBatch(), first1 = NewBatch(), again0 = NewBatch(),
                       again1 = NewBatch();
  sampler.ValidationBatch(0, first0);
  sampler.ValidationBatch(1, first1);
  const auto train = TrainBatches(sampler, 3);
  sampler.ValidationBatch(0, again0);
  sampler.ValidationBatch(1, again1);
  EXPECT_EQ(first0, again0);
  EXPECT_EQ(first1, again1);
  EXPECT_NE(first0, first1);
  for (const auto& batch : train) EXPECT_NE(batch, first0);
  EXPECT_EQ(sampler.consumed_train_samples(), 3 * kBatch);  // evaluation moved nothing
}

TEST(BatchSamplerTest, RejectsBadSizesAndPositions) {
  const IndexSource source(4, 4, 9);
  EXPECT_EQ(BatchSampler::Create(&source, 0, 1, 0).status().message(),
            "--seq_length must be >= 1, got 0");
  EXPECT_EQ(BatchSampler::Create(&source, 4, 0, 0).status().message(),
            "the batch size must be >= 1, got 0");
  EXPECT_EQ(BatchSampler::Create(&source, 9, 1, 0).status().message(), "train too small");
  BatchSampler sampler = BatchSampler::Create(&source, 8, 1, 0).value();
  const Status status = sampler.RestoreConsumedTrainSamples(-1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "consumed_train_samples must be >= 0, got -1");
}

TEST(OpenTokenSourceTest, RejectsBadOptions) {
  auto message = [](const DataOptions& options) {
    return OpenTokenSource(options).status().message();
  };
  DataOptions options;
  options.vocab_size = 1;
  EXPECT_EQ(message(options), "--vocab_size must be in [2, 2147483647], got 1");
  options.vocab_size = 100;
  options.validation_fraction = 1;
  EXPECT_EQ(message(options), "the validation fraction must be in (0, 1), got 1");
  options.validation_fraction = 0.1;
  options.format = "parquet";
  EXPECT_EQ(message(options),
            "--data_format=parquet is unknown; expected synthetic, megatron, flat_u16 or flat_u32");
  options.format = "megatron";
  EXPECT_EQ(message(options), "--data_format=megatron needs --data_path");
  options.format = "synthetic";
  options.path = "/x/y";
  EXPECT_EQ(message(options), "--data_path /x/y: --data_format=synthetic reads no file");
  options.format = "flat_u32";
  options.path = ::testing::TempDir() + "/no_such_tokens.bin";
  const Status status = OpenTokenSource(options).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "--data_path " + options.path + ": no such file");
}

TEST(OpenTokenSourceTest, SyntheticSourceKnowsItsFloor) {
  DataOptions options;
  options.vocab_size = 256;
  const std::unique_ptr<TokenSource> source = OpenTokenSource(options).value();
  ASSERT_TRUE(source->CrossEntropyFloor(128).has_value());
  EXPECT_GT(*source->CrossEntropyFloor(128), 0.5);
  EXPECT_LT(*source->CrossEntropyFloor(128), std::log(4.0));  // 4 successors, uneven
  EXPECT_NE(source->Describe().find("order-1 Markov chain over 256 tokens"), std::string::npos);
}

}  // namespace
}  // namespace moe
