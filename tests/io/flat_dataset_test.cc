// Flat token files: round trip, the train/validation split, and every file error.
#include "engine/io/flat_dataset.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <numeric>
#include <set>
#include <vector>

#include "engine/io/dataset.h"

namespace moe {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/flat_" + name; }

template <typename T>
std::string WriteTokens(const std::string& name, const std::vector<T>& tokens) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
  return path;
}

StatusOr<std::unique_ptr<TokenSource>> Open(const std::string& format, const std::string& path,
                                            int64_t vocab_size) {
  DataOptions options;
  options.format = format;
  options.path = path;
  options.vocab_size = vocab_size;
  return OpenTokenSource(options);
}

TEST(FlatDatasetTest, WindowsAreConsecutiveFileTokens) {
  for (const std::string format : {"flat_u16", "flat_u32"}) {
    constexpr int64_t kTokens = 1000, kVocab = 70000;
    std::vector<uint32_t> values(kTokens);
    for (int64_t i = 0; i < kTokens; ++i) values[i] = (i * 7919) % kVocab;
    const std::string path =
        format == "flat_u16"
            ? WriteTokens("u16.bin", std::vector<uint16_t>(values.begin(), values.end()))
            : WriteTokens("u32.bin", values);
    const int64_t vocab = format == "flat_u16" ? 65536 : kVocab;
    const std::unique_ptr<TokenSource> source = Open(format, path, vocab).value();
    // seq_length 9: window i of the train split is tokens [9 i, 9 i + 10).
    std::vector<int32_t> window(10);
    source->ReadWindow(Split::kTrain, 5, window);
    for (int64_t t = 0; t < 10; ++t) {
      EXPECT_EQ(window[t], static_cast<int32_t>(values[45 + t] % vocab)) << format;
    }
    source->ReadWindow(Split::kValidation, 0, window);  // validation starts at 900
    for (int64_t t = 0; t < 10; ++t) {
      EXPECT_EQ(window[t], static_cast<int32_t>(values[900 + t] % vocab)) << format;
    }
  }
}

TEST(FlatDatasetTest, TrainAndValidationWindowsNeverOverlap) {
  constexpr int64_t kTokens = 1003, kSeqLength = 8;
  std::vector<uint32_t> positions(kTokens);
  std::iota(positions.begin(), positions.end(), 0);  // each token is its own position
  const std::unique_ptr<TokenSource> source =
      Open("flat_u32", WriteTokens("positions.bin", positions), kTokens).value();
  const auto& flat = static_cast<const FlatTokenSource&>(*source);
  EXPECT_EQ(flat.split_end(Split::kTrain), 903);  // 10% of 1003, rounded down, held out

  BatchSampler sampler = BatchSampler::Create(source.get(), kSeqLength, 1, 17).value();
  std::set<int32_t> seen[2];
  for (const Split split : {Split::kTrain, Split::kValidation}) {
    const int64_t windows = sampler.num_windows(split);
    EXPECT_EQ(windows, (flat.split_end(split) - flat.split_begin(split) - 1) / kSeqLength);
    std::vector<int32_t> all(windows * (kSeqLength + 1));
    sampler.ReadSamples(split, 0, all);  // one epoch: every window once
    for (const int32_t position : all) {
      ASSERT_GE(position, flat.split_begin(split));
      ASSERT_LT(position, flat.split_end(split));
      seen[static_cast<int>(split)].insert(position);
    }
    // Consecutive windows overlap by one token, so one epoch covers the split but its tail.
    EXPECT_EQ(static_cast<int64_t>(seen[static_cast<int>(split)].size()), windows * kSeqLength + 1);
  }
  for (const int32_t position : seen[0]) EXPECT_EQ(seen[1].count(position), 0u) << position;
}

TEST(FlatDatasetTest, MissingFileAndDirectory) {
  const std::string missing = TempPath("missing.bin");
  Status status = Open("flat_u16", missing, 100).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "--data_path " + missing + ": no such file");
  const std::string directory = TempPath("directory");
  mkdir(directory.c_str(), 0755);
  status = Open("flat_u16", directory, 100).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--data_path " + directory + ": not a regular file");
}

TEST(FlatDatasetTest, SizeNotAWholeNumberOfTokens) {
  const std::string odd = WriteTokens("odd.bin", std::vector<uint8_t>(1001, 1));
  Status status = Open("flat_u16", odd, 100).status();
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "--data_path " + odd +
                                  ": 1001 bytes is not a whole number of 2-byte uint16 tokens "
                                  "(truncated?)");
  const std::string six = WriteTokens("six.bin", std::vector<uint8_t>(6, 1));
  status = Open("flat_u32", six, 100).status();
  EXPECT_EQ(status.message(), "--data_path " + six +
                                  ": 6 bytes is not a whole number of 4-byte uint32 tokens "
                                  "(truncated?)");
}

TEST(FlatDatasetTest, TokenOutsideTheVocabularyIsReportedWithItsPosition) {
  std::vector<uint16_t> tokens(5000, 3);
  tokens[4321] = 300;
  tokens[4900] = 400;
  const std::string path = WriteTokens("bad_id.bin", tokens);
  const Status status = Open("flat_u16", path, 256).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      status.message(),
      "--data_path " + path + ": token id 300 at position 4321 is outside [0, --vocab_size 256)");
  EXPECT_TRUE(Open("flat_u16", path, 401).ok());
}

TEST(FlatDatasetTest, SplitTooSmallForOneWindow) {
  const std::string path = WriteTokens("small.bin", std::vector<uint32_t>(100, 1));
  const std::unique_ptr<TokenSource> source = Open("flat_u32", path, 2).value();
  // 90 train tokens, 10 validation tokens.
  Status status = BatchSampler::Create(source.get(), 9, 1, 0).status();
  EXPECT_TRUE(status.ok()) << status.message();
  status = BatchSampler::Create(source.get(), 10, 1, 0).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--data_path " + path +
                                  ": the validation split holds 10 of the file's 100 tokens, "
                                  "fewer than one window of --seq_length + 1 = 11 tokens");
  status = BatchSampler::Create(source.get(), 90, 1, 0).status();
  EXPECT_EQ(status.message(), "--data_path " + path +
                                  ": the train split holds 90 of the file's 100 tokens, fewer "
                                  "than one window of --seq_length + 1 = 91 tokens");
  const std::string empty = WriteTokens("empty.bin", std::vector<uint16_t>());
  const std::unique_ptr<TokenSource> nothing = Open("flat_u16", empty, 2).value();
  EXPECT_EQ(BatchSampler::Create(nothing.get(), 1, 1, 0).status().message(),
            "--data_path " + empty +
                ": the train split holds 0 of the file's 0 tokens, fewer than one window of "
                "--seq_length + 1 = 2 tokens");
}

}  // namespace
}  // namespace moe
