// Initial values follow the streams parameters.h documents: element j of chunk c (2^20 elements)
// of parameter `name` is draw j of Rng(seed, StableHash(name) + 0x9e3779b97f4a7c15 * c), Normal()
// x init_std, also where the set writes a parameter in several pieces (16 chunks each), and
// whatever the storage (a plain set and a bucketed one).
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

}  // namespace
}  // namespace moe
