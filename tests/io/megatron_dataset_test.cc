// Megatron indexed datasets: files written here in Megatron's exact on-disk format round-trip,
// and every corruption of the .idx/.bin pair is refused with a one-line error naming the file.
#include "engine/io/megatron_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "engine/io/dataset.h"
#include "engine/io/flat_dataset.h"

namespace moe {
namespace {

constexpr uint8_t kInt32Code = 4;
constexpr uint8_t kUint16Code = 8;

template <typename T>
void Append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <typename T>
void Store(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// What Megatron's IndexedDatasetBuilder writes when each document is added as sequences of at
// most `max_sequence` tokens, followed by end_document().
struct MegatronFiles {
  std::string idx;
  std::string bin;
  int64_t num_sequences = 0;

  size_t sizes_at() const { return 34; }
  size_t pointers_at() const { return 34 + 4 * num_sequences; }
  size_t documents_at() const { return 34 + 12 * num_sequences; }
};

MegatronFiles BuildMegatron(const std::vector<std::vector<int32_t>>& documents, uint8_t code,
                            size_t max_sequence) {
  const int64_t token_bytes = code == kUint16Code ? 2 : 4;
  MegatronFiles files;
  std::vector<int32_t> sizes;
  std::vector<int64_t> document_index = {0};
  for (const std::vector<int32_t>& document : documents) {
    for (size_t begin = 0; begin < document.size(); begin += max_sequence) {
      const size_t end = std::min(document.size(), begin + max_sequence);
      sizes.push_back(static_cast<int32_t>(end - begin));
      for (size_t t = begin; t < end; ++t) {
        if (code == kUint16Code) {
          Append(files.bin, static_cast<uint16_t>(document[t]));
        } else {
          Append(files.bin, document[t]);
        }
      }
    }
    document_index.push_back(static_cast<int64_t>(sizes.size()));
  }
  files.num_sequences = static_cast<int64_t>(sizes.size());
  files.idx.append("MMIDIDX\0\0", 9);
  Append(files.idx, uint64_t{1});
  Append(files.idx, code);
  Append(files.idx, static_cast<uint64_t>(sizes.size()));
  Append(files.idx, static_cast<uint64_t>(document_index.size()));
  for (const int32_t size : sizes) Append(files.idx, size);
  int64_t pointer = 0;
  for (const int32_t size : sizes) {
    Append(files.idx, pointer);
    pointer += size * token_bytes;
  }
  for (const int64_t entry : document_index) Append(files.idx, entry);
  return files;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

class MegatronDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = ::testing::TempDir() + "/megatron_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::remove(idx().c_str());  // left by an earlier run
    std::remove(bin().c_str());
    for (int d = 0; d < 3; ++d) {
      std::vector<int32_t> document;
      for (int t = 0; t < 100 + 37 * d; ++t) document.push_back((d * 1000 + t * 13) % 500);
      document.push_back(0);  // end of document
      documents_.push_back(document);
      stream_.insert(stream_.end(), document.begin(), document.end());
    }
    files_ = BuildMegatron(documents_, kUint16Code, 64);
  }
  StatusOr<std::unique_ptr<TokenSource>> Open(int64_t vocab_size) {
    WriteFile(prefix_ + ".idx", files_.idx);
    WriteFile(prefix_ + ".bin", files_.bin);
    return OpenMegatronDataset(prefix_, vocab_size, 0.1);
  }
  // The error message the corrupted files give, after checking it names `file`.
  std::string Error(const std::string& file, StatusCode code = StatusCode::kDataLoss,
                    int64_t vocab_size = 500) {
    const Status status = Open(vocab_size).status();
    EXPECT_EQ(status.code(), code) << status.message();
    const std::string prefix = "--data_path " + file + ": ";
    EXPECT_EQ(status.message().substr(0, prefix.size()), prefix);
    return status.message().substr(std::min(prefix.size(), status.message().size()));
  }
  std::string idx() const { return prefix_ + ".idx"; }
  std::string bin() const { return prefix_ + ".bin"; }

  std::string prefix_;
  std::vector<std::vector<int32_t>> documents_;
  std::vector<int32_t> stream_;  // the documents concatenated
  MegatronFiles files_;
};

TEST_F(MegatronDatasetTest, DocumentsRoundTripAsOneStream) {
  for (const uint8_t code : {kUint16Code, kInt32Code}) {
    files_ = BuildMegatron(documents_, code, 64);
    const std::unique_ptr<TokenSource> source = Open(500).value();
    EXPECT_NE(source->Describe().find("(3 documents, 8 sequences)"), std::string::npos)
        << source->Describe();
    const auto& flat = static_cast<const FlatTokenSource&>(*source);
    ASSERT_EQ(flat.num_tokens(), static_cast<int64_t>(stream_.size()));
    // Windows of 21 tokens at stride 20 read the concatenated stream, across documents.
    for (const Split split : {Split::kTrain, Split::kValidation}) {
      const int64_t windows = source->NumWindows(split, 21).value();
      EXPECT_EQ(windows, (flat.split_end(split) - flat.split_begin(split) - 1) / 20);
      for (int64_t i = 0; i < windows; ++i) {
        std::vector<int32_t> window(21);
        source->ReadWindow(split, i, window);
        const auto begin = stream_.begin() + flat.split_begin(split) + 20 * i;
        EXPECT_EQ(window, std::vector<int32_t>(begin, begin + 21)) << SplitName(split) << i;
      }
    }
  }
}

TEST_F(MegatronDatasetTest, OpensThroughTheDataFormatFlag) {
  WriteFile(idx(), files_.idx);
  WriteFile(bin(), files_.bin);
  DataOptions options;
  options.format = "megatron";
  options.path = prefix_;
  options.vocab_size = 500;
  const std::unique_ptr<TokenSource> source = OpenTokenSource(options).value();
  BatchSampler sampler = BatchSampler::Create(source.get(), 31, 2, 0).value();
  std::vector<int32_t> batch(64);
  sampler.NextTrainBatch(batch);
  for (const int32_t token : batch) EXPECT_LT(token, 500);
}

TEST_F(MegatronDatasetTest, MissingFiles) {
  Status status = OpenMegatronDataset(prefix_, 500, 0.1).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "--data_path " + idx() +
                                  ": no such file (for --data_format=megatron, --data_path is the "
                                  "prefix of PREFIX.bin and PREFIX.idx)");
  WriteFile(idx(), files_.idx);
  status = OpenMegatronDataset(prefix_, 500, 0.1).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "--data_path " + bin() + ": no such file");
}

TEST_F(MegatronDatasetTest, BadMagicVersionAndDType) {
  const std::string whole = files_.idx;
  files_.idx[6] = 'Y';
  EXPECT_EQ(Error(idx(), StatusCode::kInvalidArgument),
            "not a Megatron indexed dataset index (the magic is not MMIDIDX\\0\\0)");
  files_.idx = whole;
  Store(files_.idx, 9, uint64_t{2});
  EXPECT_EQ(Error(idx(), StatusCode::kInvalidArgument), "unsupported index version 2 (expected 1)");
  files_.idx = whole;
  Store(files_.idx, 17, uint8_t{9});
  EXPECT_EQ(Error(idx(), StatusCode::kInvalidArgument),
            "unknown dtype code 9 (Megatron's codes are 1-8)");
  Store(files_.idx, 17, uint8_t{7});
  EXPECT_EQ(Error(idx(), StatusCode::kInvalidArgument),
            "token dtype float32 (code 7) is not supported; expected uint16 (code 8) or int32 "
            "(code 4)");
}

TEST_F(MegatronDatasetTest, TruncatedOrInconsistentIndex) {
  const std::string whole = files_.idx;
  files_.idx = whole.substr(0, 20);
  EXPECT_EQ(Error(idx()), "truncated: 20 bytes, shorter than the 34-byte header");
  files_.idx = whole.substr(0, whole.size() - 8);
  EXPECT_EQ(Error(idx()), std::to_string(whole.size() - 8) +
                              " bytes, but its header's 8 sequences and 4 document indices need " +
                              std::to_string(whole.size()) + " (truncated or corrupt)");
  files_.idx = whole;
  Store(files_.idx, 18, uint64_t{1} << 40);
  EXPECT_EQ(Error(idx()), std::to_string(whole.size()) +
                              " bytes, too short for the 1099511627776 sequences and 4 document "
                              "indices its header declares (truncated or corrupt)");
  files_.idx = whole + std::string(8, '\0');  // Megatron's multimodal mode bytes
  EXPECT_EQ(Error(idx(), StatusCode::kInvalidArgument),
            "has a mode byte per sequence (a multimodal dataset); only token datasets are "
            "supported");
}

TEST_F(MegatronDatasetTest, SizesPointersAndDocumentIndexMustAgree) {
  const std::string whole = files_.idx;
  Store(files_.idx, files_.sizes_at() + 4 * 1, int32_t{-1});
  EXPECT_EQ(Error(idx()), "sequence 1 has negative size -1 (corrupt)");
  files_.idx = whole;
  Store(files_.idx, files_.pointers_at() + 8 * 2, int64_t{204});  // really 202: 64 + 37 tokens
  EXPECT_EQ(Error(idx()),
            "sequence 2 starts at byte 204, but the sizes before it put it at 202 (corrupt)");
  files_.idx = whole;
  Store(files_.idx, files_.documents_at() + 8 * 3, int64_t{7});  // the last entry must be 8
  EXPECT_EQ(Error(idx()),
            "document index entry 3 is 7; expected a non-decreasing list from 0 to the sequence "
            "count 8 (corrupt)");
  files_.idx = whole;
  Store(files_.idx, files_.documents_at() + 8 * 2, int64_t{1});  // below entry 1 (2)
  EXPECT_EQ(Error(idx()),
            "document index entry 2 is 1; expected a non-decreasing list from 0 to the sequence "
            "count 8 (corrupt)");
}

TEST_F(MegatronDatasetTest, BinLengthMustMatchTheIndex) {
  const size_t bytes = files_.bin.size();
  files_.bin.resize(bytes - 2);
  EXPECT_EQ(Error(bin()), std::to_string(bytes - 2) + " bytes, but " + idx() + " describes " +
                              std::to_string(bytes) +
                              " bytes in 8 sequences (truncated, or .bin and .idx of different "
                              "datasets)");
  files_.bin.resize(bytes + 4);
  EXPECT_EQ(Error(bin()), std::to_string(bytes + 4) + " bytes, but " + idx() + " describes " +
                              std::to_string(bytes) +
                              " bytes in 8 sequences (truncated, or .bin and .idx of different "
                              "datasets)");
}

TEST_F(MegatronDatasetTest, TokenIdsOutsideTheVocabulary) {
  const auto first_big =
      std::find_if(stream_.begin(), stream_.end(), [](int32_t t) { return t >= 400; });
  ASSERT_NE(first_big, stream_.end());
  EXPECT_EQ(Error(bin(), StatusCode::kInvalidArgument, 400),
            "token id " + std::to_string(*first_big) + " at position " +
                std::to_string(first_big - stream_.begin()) + " is outside [0, --vocab_size 400)");
  documents_[1][5] = -3;  // int32 tokens can be negative
  files_ = BuildMegatron(documents_, kInt32Code, 64);
  EXPECT_EQ(Error(bin(), StatusCode::kInvalidArgument),
            "token id -3 at position " + std::to_string(documents_[0].size() + 5) +
                " is outside [0, --vocab_size 500)");
}

}  // namespace
}  // namespace moe
