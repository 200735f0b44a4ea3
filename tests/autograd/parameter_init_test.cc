// Initial values follow the streams parameters.h documents: element j of chunk c (2^20 elements)
// of parameter `name` is draw j of Rng(seed, StableHash(name) + 0x9e3779b97f4a7c15 * c), Normal()
// x init_std, also where the set writes a parameter in several pieces (16 chunks each), and
// whatever the storage (a plain set and a bucketed one). A part of a bigger tensor
// (ParameterSpec::whole_shape) holds exactly the same rows of the whole's values, bit for bit,
// wherever it starts in a chunk and however many chunks it spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/core/random.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

constexpr int64_t kChunk = int64_t{1} << 20;

// Chunk `c` of parameter `name`'s values as the documented stream draws them.
std::vector<float> StreamChunk(uint64_t seed, const std::string& name, float init_std, int64_t c) {
  Rng rng(seed, StableHash(name) + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c));
  std::vector<float> values(kChunk);
  for (float& v : values) v = static_cast<float>(rng.Normal() * init_std);
  return values;
}

TEST(ParameterInitTest, ValuesAreTheDocumentedStreamsAcrossPiecesAndStorages) {
  // 17 chunks and a part: two pieces, the second's first chunk is 16.
  const ParameterSpec spec{.name = "big", .shape = {17 * 1024 + 3, 1024}, .init_std = 0.5f};
  const uint64_t seed = 7;
  ParameterSet plain(Device::CPU(), DType::kF32, seed, /*optimizer_state=*/false);
  const std::vector<float> got = testing::ToFloats(plain.Create(spec).value);
  ASSERT_EQ(got.size(), 17 * kChunk + 3 * 1024);
  for (const int64_t c : {0, 15, 16, 17}) {
    const std::vector<float> want = StreamChunk(seed, spec.name, spec.init_std, c);
    const int64_t end = std::min<int64_t>(kChunk, static_cast<int64_t>(got.size()) - c * kChunk);
    for (int64_t j = 0; j < end; ++j) {
      ASSERT_EQ(got[c * kChunk + j], want[j]) << "chunk " << c << " element " << j;
    }
  }

  ParameterSet bucketed = ParameterSet::Deferred(Device::CPU(), DType::kF32, seed);
  const Parameter& p = bucketed.Create(spec);
  bucketed.AllocateBuckets(/*sharding=*/{}, /*bucket_bytes=*/int64_t{1} << 20);
  EXPECT_EQ(testing::ToFloats(p.value), got);
}

// Rows [first_row, first_row + rows) of `whole` as a part of it.
ParameterSpec PartOf(const ParameterSpec& whole, int64_t first_row, int64_t rows) {
  ParameterSpec part = whole;
  part.shape[0] = rows;
  part.whole_shape = whole.shape;
  part.first_row = first_row;
  return part;
}

TEST(ParameterInitTest, APartHoldsTheWholesRowsBitForBit) {
  // 2.4M elements: 2.3 chunks. Rows of 300000 elements, so parts start inside chunks (600000,
  // 900000, ...) and parts of two rows or more span a chunk's end.
  const ParameterSpec whole_spec{.name = "experts.fc1", .shape = {8, 300000}, .init_std = 0.3f};
  const uint64_t seed = 11;
  ParameterSet alone(Device::CPU(), DType::kF32, seed, /*optimizer_state=*/false);
  const std::vector<float> whole = testing::ToFloats(alone.Create(whole_spec).value);
  const int64_t row = whole_spec.shape[1];
  // (first_row, rows): four parts of two rows, and uneven ones.
  const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 2}, {2, 2}, {4, 2}, {6, 2},
                                                          {3, 1}, {1, 6}, {7, 1}};
  ParameterSet plain(Device::CPU(), DType::kF32, seed, /*optimizer_state=*/false);
  ParameterSet bucketed = ParameterSet::Deferred(Device::CPU(), DType::kF32, seed);
  for (const auto& [first_row, rows] : parts) {
    // One set cannot hold one name twice: each part its own set.
    ParameterSet set(Device::CPU(), DType::kF32, seed, /*optimizer_state=*/false);
    const std::vector<float> got =
        testing::ToFloats(set.Create(PartOf(whole_spec, first_row, rows)).value);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows * row));
    const std::vector<float> want(whole.begin() + first_row * row,
                                  whole.begin() + (first_row + rows) * row);
    EXPECT_TRUE(got == want) << "rows [" << first_row << ", " << first_row + rows << ")";
  }
  // A bucketed part (value and master written through the buckets) and a stacked one alike.
  const Parameter& part = bucketed.Create(PartOf(whole_spec, 5, 3));
  bucketed.AllocateBuckets(/*sharding=*/{}, /*bucket_bytes=*/int64_t{1} << 20);
  EXPECT_TRUE(testing::ToFloats(part.value) ==
              std::vector<float>(whole.begin() + 5 * row, whole.end()));
  const ParameterSpec stacked[] = {PartOf(whole_spec, 1, 1)};
  const ParameterStack& stack = plain.CreateStack(stacked);
  EXPECT_TRUE(testing::ToFloats(stack.value) ==
              std::vector<float>(whole.begin() + row, whole.begin() + 2 * row));
}

TEST(ParameterInitTest, APartOfOnesIsOnes) {
  ParameterSpec spec{.name = "norm", .shape = {2, 3}, .init = Init::kOnes};
  spec.whole_shape = {5, 3};
  spec.first_row = 3;
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/1, /*optimizer_state=*/false);
  EXPECT_EQ(testing::ToFloats(set.Create(spec).value), std::vector<float>(6, 1.0f));
}

TEST(ParameterInitDeathTest, APartMustLieInsideItsWhole) {
  ParameterSpec spec{.name = "w", .shape = {2, 3}};
  spec.whole_shape = {4, 3};
  spec.first_row = 3;  // rows [3, 5) of 4
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/1, /*optimizer_state=*/false);
  EXPECT_DEATH(set.Create(spec), "rows \\[3, 5\\) of a whole of 4");
  spec.first_row = 0;
  spec.whole_shape = {4, 5};
  EXPECT_DEATH(set.Create(spec), "trailing dimensions");
  spec.whole_shape = {};
  spec.first_row = 1;
  EXPECT_DEATH(set.Create(spec), "rows of no whole tensor");
}

}  // namespace
}  // namespace moe
