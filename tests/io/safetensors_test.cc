// safetensors: bit-exact round trips of every dtype (views and empty tensors included), the byte
// layout parsed by hand, f32 <-> bf16 conversion on load, name/shape/dtype checks, and one Status
// per kind of corrupt file. In parts: a file written piece by piece in any order is the file
// written whole; the reader widens F32, BF16 and F16 ranges to f32 exactly; a copy rounds to bf16
// to nearest even and refuses non-finite values when asked.
#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/bfloat16.h"
#include "engine/kernels/ops.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using ::moe::testing::FromFloats;
using ::moe::testing::FromInts;
using ::moe::testing::PoisonedTensor;

std::vector<uint8_t> HostBytes(const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  ops::CopyToHost(t, bytes.data());
  return bytes;
}

// The bits of each value (so -0.0 differs from 0.0).
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * 4);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file with the given header length field, header text and `data_bytes` zero bytes of data.
std::string RawFile(uint64_t header_length, const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header_length >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}
std::string RawFile(const std::string& header, size_t data_bytes) {
  return RawFile(header.size(), header, data_bytes);
}

// Expects a one-line error of `code` that names `path` and contains `phrase`.
void ExpectError(const Status& status, StatusCode code, const std::string& path,
                 const std::string& phrase) {
  ASSERT_FALSE(status.ok()) << "expected an error containing: " << phrase;
  EXPECT_EQ(status.code(), code) << status.ToString();
  EXPECT_NE(status.message().find("'" + path + "'"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(phrase), std::string::npos) << status.message();
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status.message();
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "safetensors_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // One tensor of every dtype, awkward values, a row view, a scalar and an empty tensor.
  std::vector<NamedTensor> Sample() {
    std::mt19937 rng(::moe::testing::TestSeed());
    std::vector<float> f = ::moe::testing::RandomFloats(15, rng);
    f[0] = std::numeric_limits<float>::quiet_NaN();
    f[1] = -0.0f;
    f[2] = std::numeric_limits<float>::infinity();
    f[3] = std::numeric_limits<float>::denorm_min();
    Tensor i64 = Tensor::Empty({5}, DType::kI64, Device::CPU());
    const int64_t i64_values[] = {0, -1, INT64_MAX, INT64_MIN, 1ll << 40};
    ops::CopyFromHost(i64_values, i64);
    Tensor u8 = Tensor::Empty({9}, DType::kU8, Device::CPU());
    const uint8_t u8_values[] = {0, 1, 2, 127, 128, 200, 254, 255, 7};
    ops::CopyFromHost(u8_values, u8);
    Tensor big =
        FromFloats(::moe::testing::RandomFloats(24, rng), {4, 6}, DType::kF32, Device::CPU());
    return {
        {"layers.0.attn.q_proj.weight", FromFloats(f, {3, 5}, DType::kF32, Device::CPU())},
        {"u8", u8},
        {"bf16",
         FromFloats(::moe::testing::RandomFloats(7, rng), {7}, DType::kBF16, Device::CPU())},
        {"i32", FromInts({-5, 4,  3,  2,  1,  0,  7,  8,  9,  10, 11, 12,
                          13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, INT32_MIN},
                         {2, 3, 4}, Device::CPU())},
        {"i64", i64},
        {"rows_view", big.Rows(1, 3)},
        {"scalar", FromFloats({3.5f}, {}, DType::kF32, Device::CPU())},
        {"empty", Tensor::Empty({0, 4}, DType::kF32, Device::CPU())},
    };
  }

  // Destinations of the same names, shapes and dtypes, every byte 0xFF.
  static std::vector<NamedTensor> PoisonedLike(const std::vector<NamedTensor>& tensors) {
    std::vector<NamedTensor> out;
    for (const NamedTensor& t : tensors) {
      out.push_back({t.name, PoisonedTensor(t.tensor.shape(), t.tensor.dtype(), Device::CPU())});
    }
    return out;
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, WriteThenReadKeepsEveryBit) {
  const std::vector<NamedTensor> tensors = Sample();
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "100"}, {"format", "pt"}}).ok());

  StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  EXPECT_EQ(contents->metadata, (SafetensorsMetadata{{"format", "pt"}, {"step", "100"}}));
  ASSERT_EQ(contents->tensors.size(), tensors.size());
  for (const NamedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    const HostTensor& got = contents->tensors.at(t.name);
    EXPECT_EQ(got.dtype, t.tensor.dtype());
    EXPECT_EQ(got.shape, t.tensor.shape());
    EXPECT_EQ(got.bytes, HostBytes(t.tensor));
  }
}

TEST_F(SafetensorsTest, LoadIntoTensorsKeepsEveryBit) {
  const std::vector<NamedTensor> tensors = Sample();
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {}).ok());

  std::vector<NamedTensor> loaded = PoisonedLike(tensors);
  // Destinations in another order than the file's, one of them a row view.
  std::swap(loaded[0], loaded[3]);
  Tensor big = PoisonedTensor({5, 6}, DType::kF32, Device::CPU());
  for (NamedTensor& t : loaded) {
    if (t.name == "rows_view") t.tensor = big.Rows(2, 4);
  }
  const Status status = LoadSafetensors(path, loaded);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (const NamedTensor& want : tensors) {
    for (const NamedTensor& got : loaded) {
      if (got.name == want.name) {
        EXPECT_EQ(HostBytes(got.tensor), HostBytes(want.tensor)) << got.name;
      }
    }
  }
  EXPECT_EQ(HostBytes(big.Rows(0, 2)), std::vector<uint8_t>(48, 0xFF)) << "rows outside the view";
}

// Checkpoints ask for NaN and infinity to be refused: the first one names its tensor and
// element, for f32 (Sample's NaN at element 0) and for bf16 (an infinity at element 2).
TEST_F(SafetensorsTest, NonFiniteValuesAreRefusedWhenAsked) {
  const std::vector<NamedTensor> tensors = Sample();
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {}).ok());
  const std::vector<NamedTensor> loaded = PoisonedLike(tensors);
  ExpectError(LoadSafetensors(path, loaded, NonFiniteValues::kRefuse), StatusCode::kDataLoss, path,
              "tensor 'layers.0.attn.q_proj.weight' in '" + path +
                  "' holds a non-finite value (NaN or infinity) at element 0");

  const std::string bf16_path = Path("bf16.safetensors");
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor bf16 = FromFloats({1.0f, -2.0f, inf, 4.0f}, {4}, DType::kBF16, Device::CPU());
  ASSERT_TRUE(WriteSafetensors(bf16_path, {{"w", bf16}}, {}).ok());
  const Tensor dst = Tensor::Empty({4}, DType::kF32, Device::CPU());
  ExpectError(
      LoadSafetensorsSubset(bf16_path, {{"w", dst}}, NonFiniteValues::kRefuse),
      StatusCode::kDataLoss, bf16_path,
      "tensor 'w' in '" + bf16_path + "' holds a non-finite value (NaN or infinity) at element 2");
  EXPECT_TRUE(LoadSafetensors(bf16_path, {{"w", dst}}).ok()) << "kept by default";
}

TEST_F(SafetensorsTest, HeaderIsAlignedJsonWithExactOffsets) {
  const std::vector<NamedTensor> tensors = Sample();
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "7"}}).ok());
  const std::string file = ReadFile(path);
  ASSERT_GE(file.size(), 8u);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  const std::string text = file.substr(8, n);
  const size_t close = text.find_last_not_of(' ');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(text[close], '}') << "only spaces may pad the header";
  EXPECT_LT(text.size() - close - 1, 8u);
  const nlohmann::json header = nlohmann::json::parse(text);
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"step", "7"}}));

  const std::map<std::string, std::pair<std::string, size_t>> codes = {
      {"layers.0.attn.q_proj.weight", {"F32", 4}},
      {"u8", {"U8", 1}},
      {"bf16", {"BF16", 2}},
      {"i32", {"I32", 4}},
      {"i64", {"I64", 8}},
      {"rows_view", {"F32", 4}},
      {"scalar", {"F32", 4}},
      {"empty", {"F32", 4}}};
  const std::string data = file.substr(8 + n);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const NamedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    const nlohmann::json& entry = header.at(t.name);
    const auto [code, size] = codes.at(t.name);
    EXPECT_EQ(entry.at("dtype"), code);
    EXPECT_EQ(entry.at("shape").get<Shape>(), t.tensor.shape());
    const uint64_t begin = entry.at("data_offsets")[0];
    const uint64_t end = entry.at("data_offsets")[1];
    EXPECT_EQ(end - begin, t.tensor.nbytes());
    EXPECT_EQ(begin % size, 0u) << "element-aligned";
    ASSERT_LE(end, data.size());
    const std::vector<uint8_t> bytes(data.begin() + begin, data.begin() + end);
    EXPECT_EQ(bytes, HostBytes(t.tensor));
    ranges.push_back({begin, end});
  }
  EXPECT_EQ(header.size(), tensors.size() + 1);
  std::sort(ranges.begin(), ranges.end());
  uint64_t position = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, position) << "packed without gaps or overlap";
    position = end;
  }
  EXPECT_EQ(position, data.size()) << "nothing after the last tensor";
  EXPECT_EQ(header.at("i64").at("data_offsets")[0], 0) << "widest elements first";
}

TEST_F(SafetensorsTest, ConvertsBetweenF32AndBF16OnLoad) {
  const std::vector<float> values = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, -0.0f};
  const std::string f32_path = Path("f32.safetensors");
  const std::string bf16_path = Path("bf16.safetensors");
  ASSERT_TRUE(WriteSafetensors(f32_path,
                               {{"w", FromFloats(values, {2, 3}, DType::kF32, Device::CPU())}}, {})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(bf16_path,
                               {{"w", FromFloats(values, {2, 3}, DType::kBF16, Device::CPU())}}, {})
                  .ok());

  Tensor narrow = PoisonedTensor({2, 3}, DType::kBF16, Device::CPU());
  ASSERT_TRUE(LoadSafetensors(f32_path, {{"w", narrow}}).ok());
  std::vector<BFloat16> got(6);
  ops::CopyToHost(narrow, got.data());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(got[i].bits, FloatToBFloat16(values[i]).bits) << i;
  }

  Tensor wide = PoisonedTensor({2, 3}, DType::kF32, Device::CPU());
  ASSERT_TRUE(LoadSafetensors(bf16_path, {{"w", wide}}).ok());
  const std::vector<float> widened = ::moe::testing::ToFloats(wide);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(widened[i], BFloat16ToFloat(FloatToBFloat16(values[i]))) << i;
  }
}

TEST_F(SafetensorsTest, LoadChecksNamesShapesAndDTypes) {
  const std::string path = Path("m.safetensors");
  const std::string q = "layers.0.attn.q_proj.weight";
  ASSERT_TRUE(WriteSafetensors(path,
                               {{q, PoisonedTensor({64, 32}, DType::kF32, Device::CPU())},
                                {"b", FromInts({1, 2, 3}, {3}, Device::CPU())}},
                               {})
                  .ok());
  Tensor q_dst = Tensor::Empty({128, 32}, DType::kF32, Device::CPU());
  std::vector<uint8_t> zeros(q_dst.nbytes(), 0);
  ops::CopyFromHost(zeros.data(), q_dst);
  Tensor b_dst = FromInts({0, 0, 0}, {3}, Device::CPU());

  Status s = LoadSafetensors(path, {{q, q_dst}, {"b", b_dst}});
  ExpectError(s, StatusCode::kInvalidArgument, path, "");
  EXPECT_EQ(s.message(), "tensor 'layers.0.attn.q_proj.weight' in '" + path +
                             "' has shape [64, 32], expected [128, 32]");
  EXPECT_EQ(HostBytes(q_dst), zeros) << "a failed load writes nothing";
  EXPECT_EQ(::moe::testing::ToInts(b_dst), (std::vector<int32_t>{0, 0, 0}))
      << "a failed load writes nothing";

  Tensor q_ok = Tensor::Empty({64, 32}, DType::kF32, Device::CPU());
  s = LoadSafetensors(
      path, {{q, q_ok}, {"b", b_dst}, {"c", Tensor::Empty({2}, DType::kF32, Device::CPU())}});
  ExpectError(s, StatusCode::kNotFound, path, "");
  EXPECT_EQ(s.message(), "'" + path + "' has no tensor 'c' (expected f32[2])");

  s = LoadSafetensors(path, {{q, q_ok}});
  ExpectError(s, StatusCode::kInvalidArgument, path, "");
  EXPECT_EQ(s.message(), "'" + path +
                             "' holds unexpected tensor 'b' (i32[3]; 2 tensors in the file, 1 "
                             "expected)");

  s = LoadSafetensors(path, {{q, q_ok}, {"b", Tensor::Empty({3}, DType::kF32, Device::CPU())}});
  ExpectError(s, StatusCode::kInvalidArgument, path, "");
  EXPECT_EQ(s.message(), "tensor 'b' in '" + path +
                             "' has dtype i32, expected f32 (only f32 and bf16 convert into each "
                             "other)");

  const std::string missing = Path("nope.safetensors");
  ExpectError(LoadSafetensors(missing, {}), StatusCode::kNotFound, missing,
              "cannot open '" + missing + "': No such file or directory");
  const std::string no_dir = Path("no_dir/a.safetensors");
  ExpectError(WriteSafetensors(no_dir, {}, {}), StatusCode::kFailedPrecondition, no_dir,
              "cannot create '" + no_dir + "': No such file or directory");
}

TEST_F(SafetensorsTest, SubsetLoadReadsTheNamedTensorsAndIgnoresTheRest) {
  const std::string path = Path("full.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", FromInts({1, 2}, {2}, Device::CPU())},
                                {"b", FromInts({3, 4, 5}, {3}, Device::CPU())},
                                {"c", FromInts({6}, {1}, Device::CPU())}},
                               {})
                  .ok());
  Tensor b = FromInts({0, 0, 0}, {3}, Device::CPU());
  ASSERT_TRUE(LoadSafetensorsSubset(path, {{"b", b}}).ok());
  EXPECT_EQ(::moe::testing::ToInts(b), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_TRUE(LoadSafetensorsSubset(path, {}).ok());
  EXPECT_FALSE(LoadSafetensors(path, {{"b", b}}).ok()) << "the exact loader still refuses";

  // Missing names and mismatched shapes are still errors, and nothing is written.
  Tensor a = FromInts({0, 0}, {2}, Device::CPU());
  Status s = LoadSafetensorsSubset(path, {{"a", a}, {"d", FromInts({0}, {1}, Device::CPU())}});
  ExpectError(s, StatusCode::kNotFound, path, "");
  EXPECT_EQ(s.message(), "'" + path + "' has no tensor 'd' (expected i32[1])");
  s = LoadSafetensorsSubset(path, {{"a", a}, {"c", FromInts({0, 0}, {2}, Device::CPU())}});
  ExpectError(s, StatusCode::kInvalidArgument, path, "");
  EXPECT_EQ(::moe::testing::ToInts(a), (std::vector<int32_t>{0, 0}))
      << "a failed load writes nothing";
}

TEST_F(SafetensorsTest, EmptyFileListIsValid) {
  const std::string path = Path("none.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  StatusOr<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  EXPECT_TRUE(contents->tensors.empty());
  EXPECT_TRUE(LoadSafetensors(path, {}).ok());
}

struct Corruption {
  const char* what;
  std::string bytes;
  std::string phrase;
};

TEST_F(SafetensorsTest, EachCorruptionHasItsOwnMessage) {
  const std::string w8 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const std::vector<Corruption> cases = {
      {"short file", std::string(3, '\0'),
       "is not a safetensors file: 3 bytes, too short for the 8-byte header length"},
      {"header past end", RawFile(1000, std::string(16, ' '), 0),
       "header length 1000 runs past the end of the file (24 bytes)"},
      {"bad json", RawFile(R"({"w": {"dtype": )", 0),
       "header is not valid JSON: [json.exception.parse_error.101]"},
      {"not an object", RawFile("[1, 2]  ", 0), "header is not a JSON object"},
      {"unknown dtype", RawFile(R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
       "tensor 'w' has unsupported dtype 'F16' (supported: F32, BF16, I32, I64, U8)"},
      {"malformed entry", RawFile(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "header entry 'w' is malformed"},
      {"missing field", RawFile(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
       "header entry 'w' is malformed"},
      {"size mismatch", RawFile(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
       "tensor 'w' has data_offsets [0, 12], but f32[2, 2] needs 16 bytes"},
      {"reversed offsets", RawFile(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
       "tensor 'w' has data_offsets [8, 0], but u8[0] needs 0 bytes"},
      {"overlap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               12),
       "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
      {"gap",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
               20),
       "4 unused bytes before tensor 'b'"},
      {"out of range", RawFile("{\"a\":{" + w8 + "}}", 4),
       "tensor 'a' data_offsets [0, 8] run past the end of the data buffer (4 bytes; file "
       "truncated?)"},
      {"trailing bytes", RawFile("{\"a\":{" + w8 + "}}", 12), "4 bytes after the last tensor"},
      {"metadata not strings", RawFile("{\"__metadata__\":{\"step\":100},\"a\":{" + w8 + "}}", 8),
       "__metadata__ must map strings to strings"},
  };
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = Path("bad.safetensors");
    WriteFile(path, c.bytes);
    ExpectError(ReadSafetensors(path).status(), StatusCode::kDataLoss, path, c.phrase);
    ExpectError(LoadSafetensors(path, {}), StatusCode::kDataLoss, path, c.phrase);
  }
}

TEST_F(SafetensorsTest, TruncatedFileIsReported) {
  const std::string path = Path("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Sample(), {}).ok());
  EXPECT_TRUE(CheckSafetensorsLayout(path).ok());
  fs::resize_file(path, fs::file_size(path) - 2);
  ExpectError(ReadSafetensors(path).status(), StatusCode::kDataLoss, path,
              "run past the end of the data buffer");
  ExpectError(CheckSafetensorsLayout(path), StatusCode::kDataLoss, path,
              "run past the end of the data buffer");
}

TEST_F(SafetensorsTest, AFileWrittenInPartsIsTheFileWrittenWhole) {
  const std::vector<NamedTensor> tensors = Sample();
  ASSERT_TRUE(WriteSafetensors(Path("whole.safetensors"), tensors, {{"step", "3"}}).ok());
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const NamedTensor& t : tensors)
    specs.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(Path("parts.safetensors"), specs, {{"step", "3"}});
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  for (auto t = tensors.rbegin(); t != tensors.rend(); ++t) {  // backwards, each in two parts
    const std::vector<uint8_t> bytes = HostBytes(t->tensor);
    const int64_t n = t->tensor.numel(), half = n / 2;
    const size_t size = DTypeSize(t->tensor.dtype());
    EXPECT_EQ((*writer)->dtype(t->name), t->tensor.dtype());
    ASSERT_TRUE((*writer)->Write(t->name, half, n - half, bytes.data() + half * size).ok());
    ASSERT_TRUE((*writer)->Write(t->name, 0, half, bytes.data()).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(ReadFile(Path("parts.safetensors")), ReadFile(Path("whole.safetensors")));
}

TEST_F(SafetensorsTest, TheReaderWidensEveryFloatTypeExactly) {
  const std::vector<float> f32 = {1.5f, -0.0f, 3e-38f, 7.25f, -1e30f, 0.1f};
  const Tensor bf16 = FromFloats({1.0f, -2.5f, 3.0e38f, 0.1f}, {2, 2}, DType::kBF16, Device::CPU());
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"),
                               {{"f32", FromFloats(f32, {2, 3}, DType::kF32, Device::CPU())},
                                {"bf16", bf16},
                                {"i32", FromInts({1, 2}, {2}, Device::CPU())}},
                               {})
                  .ok());
  StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Open(Path("a.safetensors"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_EQ((*reader)->tensors().size(), 3u);
  ASSERT_NE((*reader)->Find("bf16"), nullptr);
  EXPECT_EQ((*reader)->Find("bf16")->dtype, "BF16");
  EXPECT_EQ((*reader)->Find("bf16")->shape, (Shape{2, 2}));
  EXPECT_EQ((*reader)->Find("nope"), nullptr);
  std::vector<float> out(4, 99.0f);
  ASSERT_TRUE((*reader)->ReadF32("f32", 2, 3, out.data()).ok());
  EXPECT_EQ(Bits({out[0], out[1], out[2]}), Bits({f32[2], f32[3], f32[4]}));
  ASSERT_TRUE((*reader)->ReadF32("bf16", 0, 4, out.data()).ok());
  EXPECT_EQ(out, ::moe::testing::ToFloats(bf16));
  const Status integer = (*reader)->ReadF32("i32", 0, 2, out.data());
  EXPECT_EQ(integer.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(integer.message().find("tensor 'i32' in '" + Path("a.safetensors") +
                                   "' is I32, not a float (F32, BF16 or F16)"),
            std::string::npos)
      << integer.message();

  // F16, which no engine dtype stores (the strict readers refuse it: EachCorruption...): normal,
  // negative zero, the largest, the smallest subnormal, a subnormal, infinity.
  const uint16_t halves[] = {0x3C00, 0x8000, 0x7BFF, 0x0001, 0x0234, 0xFC00};
  const float want[] = {1.0f,
                        -0.0f,
                        65504.0f,
                        std::ldexp(1.0f, -24),
                        0x234 * std::ldexp(1.0f, -24),
                        -std::numeric_limits<float>::infinity()};
  std::string bytes = RawFile(R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]}}  )", 12);
  std::memcpy(bytes.data() + bytes.size() - 12, halves, 12);
  WriteFile(Path("h.safetensors"), bytes);
  reader = SafetensorsReader::Open(Path("h.safetensors"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> wide(6);
  ASSERT_TRUE((*reader)->ReadF32("h", 0, 6, wide.data()).ok());
  EXPECT_EQ(Bits(wide), Bits(std::vector<float>(want, want + 6)));
}

TEST_F(SafetensorsTest, ACopyRoundsToBF16AndRefusesNonFiniteValuesWhenAsked) {
  std::mt19937 rng(::moe::testing::TestSeed());
  std::vector<float> values = ::moe::testing::RandomFloats(1000, rng, 3.0f);
  values[7] = 1.0f + std::ldexp(1.0f, -8);                         // a tie: stays 1.0
  values[8] = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -7);  // a tie: rounds up to even
  ASSERT_TRUE(WriteSafetensors(Path("src.safetensors"),
                               {{"w", FromFloats(values, {10, 100}, DType::kF32, Device::CPU())}},
                               {})
                  .ok());
  StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Open(Path("src.safetensors"));
  ASSERT_TRUE(reader.ok());
  StatusOr<std::unique_ptr<SafetensorsWriter>> writer = SafetensorsWriter::Create(
      Path("dst.safetensors"), {{"a", DType::kBF16, {4, 100}}, {"b", DType::kF32, {600}}}, {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(
      CopySafetensorsElements(**reader, "w", 0, **writer, "a", 0, 400, NonFiniteValues::kRefuse)
          .ok());
  ASSERT_TRUE(
      CopySafetensorsElements(**reader, "w", 400, **writer, "b", 0, 600, NonFiniteValues::kRefuse)
          .ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  StatusOr<SafetensorsContents> copied = ReadSafetensors(Path("dst.safetensors"));
  ASSERT_TRUE(copied.ok());
  const std::vector<uint8_t>& a = copied->tensors.at("a").bytes;
  for (int i = 0; i < 400; ++i) {  // round to nearest even, by hand
    uint32_t u;
    std::memcpy(&u, &values[i], 4);
    const uint16_t want = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    uint16_t got;
    std::memcpy(&got, a.data() + 2 * i, 2);
    ASSERT_EQ(got, want) << "element " << i << " " << values[i];
  }
  EXPECT_EQ(std::memcmp(copied->tensors.at("b").bytes.data(), values.data() + 400, 600 * 4), 0);

  values[517] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(WriteSafetensors(Path("src.safetensors"),
                               {{"w", FromFloats(values, {10, 100}, DType::kF32, Device::CPU())}},
                               {})
                  .ok());
  reader = SafetensorsReader::Open(Path("src.safetensors"));
  ASSERT_TRUE(reader.ok());
  writer = SafetensorsWriter::Create(Path("dst.safetensors"), {{"b", DType::kF32, {600}}}, {});
  ASSERT_TRUE(writer.ok());
  EXPECT_TRUE(
      CopySafetensorsElements(**reader, "w", 400, **writer, "b", 0, 600, NonFiniteValues::kKeep)
          .ok());
  ExpectError(
      CopySafetensorsElements(**reader, "w", 400, **writer, "b", 0, 600, NonFiniteValues::kRefuse),
      StatusCode::kDataLoss, Path("src.safetensors"),
      "tensor 'w' in '" + Path("src.safetensors") +
          "' holds a non-finite value (NaN or infinity) at element 517");
}

}  // namespace
}  // namespace moe
