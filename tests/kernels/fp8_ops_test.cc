// The blockwise FP8 ops on the CPU backend (contracts: engine/kernels/op_declarations.inc):
// quantisation bit for bit against a scalar re-implementation of the contract's formula, f32 and
// bf16 inputs; the round trip within half an e4m3 step of every element; zero tiles, partial
// tiles and outliers; transposed blocks; Fp8GroupedMatmul against a double-precision GEMM of the
// dequantised operands (only f32 summation error) and, in both orientations (through transposed
// blocks), against GroupedMatmul of the unquantised operands (FP8 error), with empty groups and one
// group holding every row; the column tiles (each group's rows transposed) bit for bit; the FP8
// weight gradient likewise against the exact product and the unquantised gradient, in parts, =
// and +=.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/float8.h"
#include "engine/kernels/fp8_scaling.h"
#include "engine/kernels/ops.h"
#include "tests/testing/grad_check.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::FloatBits;
using testing::FromFloats;
using testing::ToFloats;

constexpr int64_t kTile = 128;
int64_t Tiles(int64_t size) { return (size + kTile - 1) / kTile; }

// Host values of `groups` stacked (rows, cols) matrices, quantised in tiles of tile_rows x 128.
struct HostQuantized {
  std::vector<float> values;  // the e4m3 values, decoded
  std::vector<float> scales;
};

// The contract's formula written out plainly: per tile, amax = max |x|, a = max(amax, 2^-64),
// scale = a / 448, q = e4m3(x * (448 / a)).
HostQuantized ScalarQuantize(const std::vector<float>& x, int64_t groups, int64_t rows,
                             int64_t cols, int64_t tile_rows) {
  HostQuantized out{std::vector<float>(x.size()), {}};
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t r1 = std::min(rows, r0 + tile_rows), c1 = std::min(cols, c0 + kTile);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c)
            amax = std::max(amax, std::abs(x[(g * rows + r) * cols + c]));
        }
        const float a = std::max(amax, std::ldexp(1.0f, -64));
        const float multiplier = 448.0f / a;
        out.scales.push_back(a / 448.0f);
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t i = (g * rows + r) * cols + c;
            out.values[i] = E4M3ToFloat(FloatToE4M3(x[i] * multiplier));
          }
        }
      }
    }
  }
  return out;
}

// The bits of `values` as FloatBits reads a tensor.
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

class Fp8OpsTest : public testing::OpTest {
 protected:
  // Normal values whose magnitude changes binade every row, with awkward tiles where the shape
  // has room: row 0's second tile all zeros, an outlier 10^4 in row 1, row 2's first tile below
  // 2^-64 (the amax floor), row 3's first tile -0.0 throughout, and values in bf16 when asked.
  std::vector<float> Values(int64_t rows, int64_t cols, bool bf16) {
    std::vector<float> x = testing::RandomFloats(rows * cols, rng_);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= std::ldexp(1.0f, r % 9 - 4);
    }
    const auto tile_of_row = [&](int64_t r, int64_t t, auto set) {
      if (r >= rows || t * kTile >= cols) return;
      for (int64_t c = t * kTile; c < std::min(cols, (t + 1) * kTile); ++c) set(x[r * cols + c]);
    };
    tile_of_row(0, 1, [](float& v) { v = 0.0f; });
    if (rows > 1) x[cols + std::min<int64_t>(5, cols - 1)] = 1e4f;
    tile_of_row(2, 0, [](float& v) { v *= 1e-25f; });
    tile_of_row(3, 0, [](float& v) { v = -0.0f; });
    if (bf16) {
      for (float& v : x) v = BFloat16ToFloat(FloatToBFloat16(v));
    }
    return x;
  }
};

struct Layout {
  std::string name;
  int64_t groups, rows, cols;
};

// Row tiles: rows x k with k a multiple of 128, off it, below it.
const Layout kRowTileLayouts[] = {{"k 300", 1, 7, 300}, {"k 256", 1, 5, 256}, {"k 5", 1, 4, 5}};
// Blocks: n and k on and off multiples of 128.
const Layout kBlockLayouts[] = {{"n 200 k 300", 3, 200, 300}, {"n 128 k 64", 2, 128, 64}};

TEST_F(Fp8OpsTest, QuantizeRowTilesIsTheContractsFormulaBitForBit) {
  for (const Layout& l : kRowTileLayouts) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(l.name + ", " + DTypeName(dtype));
      const std::vector<float> x = Values(l.rows, l.cols, dtype == DType::kBF16);
      const Tensor q = Poisoned({l.rows, l.cols}, DType::kE4M3);
      const Tensor scales = Poisoned({l.rows, Tiles(l.cols)});
      ops::QuantizeRowTiles(FromFloats(x, {l.rows, l.cols}, dtype, device_), q, scales);
      const HostQuantized want = ScalarQuantize(x, 1, l.rows, l.cols, 1);
      EXPECT_EQ(FloatBits(q), Bits(want.values));
      EXPECT_EQ(FloatBits(scales), Bits(want.scales));
    }
  }
}

TEST_F(Fp8OpsTest, QuantizeBlocksIsTheContractsFormulaBitForBit) {
  for (const Layout& l : kBlockLayouts) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(l.name + ", " + DTypeName(dtype));
      const std::vector<float> w = Values(l.groups * l.rows, l.cols, dtype == DType::kBF16);
      const Tensor q = Poisoned({l.groups, l.rows, l.cols}, DType::kE4M3);
      const Tensor scales = Poisoned({l.groups, Tiles(l.rows), Tiles(l.cols)});
      ops::QuantizeBlocks(FromFloats(w, {l.groups, l.rows, l.cols}, dtype, device_), q, scales);
      const HostQuantized want = ScalarQuantize(w, l.groups, l.rows, l.cols, kTile);
      EXPECT_EQ(FloatBits(q), Bits(want.values));
      EXPECT_EQ(FloatBits(scales), Bits(want.scales));
    }
  }
}

// The transposed blocks, written by the same pass, are the transpose of the values and scales,
// bit for bit.
TEST_F(Fp8OpsTest, TransposedBlocksAreTheBlocksTransposed) {
  for (const Layout& l : kBlockLayouts) {
    SCOPED_TRACE(l.name);
    const Tensor w = FromFloats(Values(l.groups * l.rows, l.cols, true), {l.groups, l.rows, l.cols},
                                DType::kBF16, device_);
    const int64_t row_tiles = Tiles(l.rows), col_tiles = Tiles(l.cols);
    const Tensor q = Poisoned({l.groups, l.rows, l.cols}, DType::kE4M3);
    const Tensor scales = Poisoned({l.groups, row_tiles, col_tiles});
    const Tensor qt = Poisoned({l.groups, l.cols, l.rows}, DType::kE4M3);
    const Tensor scales_t = Poisoned({l.groups, col_tiles, row_tiles});
    ops::QuantizeBlocks(w, q, scales, qt, scales_t);
    const std::vector<uint32_t> values = FloatBits(q), values_t = FloatBits(qt);
    const std::vector<uint32_t> s = FloatBits(scales), s_t = FloatBits(scales_t);
    for (int64_t g = 0; g < l.groups; ++g) {
      for (int64_t r = 0; r < l.rows; ++r) {
        for (int64_t c = 0; c < l.cols; ++c) {
          ASSERT_EQ(values_t[(g * l.cols + c) * l.rows + r], values[(g * l.rows + r) * l.cols + c])
              << "group " << g << ", row " << r << ", column " << c;
        }
      }
      for (int64_t r = 0; r < row_tiles; ++r) {
        for (int64_t c = 0; c < col_tiles; ++c) {
          ASSERT_EQ(s_t[(g * col_tiles + c) * row_tiles + r],
                    s[(g * row_tiles + r) * col_tiles + c]);
        }
      }
    }
  }
  const Tensor w = Random({2, 3, 5});
  const Tensor q = Poisoned({2, 3, 5}, DType::kE4M3), scales = Poisoned({2, 1, 1});
  EXPECT_DEATH(ops::QuantizeBlocks(w, q, scales, Poisoned({2, 3, 5}, DType::kE4M3), scales),
               "quantize blocks transposed values");
  EXPECT_DEATH(ops::QuantizeBlocks(w, q, scales, Poisoned({2, 5, 3}, DType::kE4M3)),
               "transposed values and scales go together");
}

// Every element comes back within half an e4m3 step of the tile's scaled value: 2^-4 |x| where
// x * 448 / a is normal in e4m3, 2^-10 scale where subnormal; the few f32 roundings around it
// (the multiplier, the product, the dequantising multiplication) add a relative 2^-21 of slack.
void ExpectRoundTripWithinHalfAStep(const std::vector<float>& x, const std::vector<float>& back,
                                    const std::vector<float>& scales, int64_t rows, int64_t cols,
                                    int64_t tile_rows) {
  const int64_t col_tiles = Tiles(cols);
  const int64_t tiles_per_matrix = (rows + tile_rows - 1) / tile_rows * col_tiles;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t e = static_cast<int64_t>(i);
    const int64_t g = e / (rows * cols), r = e / cols % rows, c = e % cols;
    const double scale = scales[g * tiles_per_matrix + r / tile_rows * col_tiles + c / kTile];
    const double bound =
        std::max(std::ldexp(std::abs(static_cast<double>(x[i])), -4), std::ldexp(scale, -10)) *
        (1 + std::ldexp(1.0, -21));
    ASSERT_LE(std::abs(back[i] - static_cast<double>(x[i])), bound)
        << "element " << i << ": " << x[i] << " came back as " << back[i] << ", scale " << scale;
  }
}

TEST_F(Fp8OpsTest, RoundTripIsWithinHalfAnE4M3Step) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    for (const Layout& l : kRowTileLayouts) {
      const std::vector<float> x = Values(l.rows, l.cols, dtype == DType::kBF16);
      const Tensor q = Poisoned({l.rows, l.cols}, DType::kE4M3);
      const Tensor scales = Poisoned({l.rows, Tiles(l.cols)});
      const Tensor back = Poisoned({l.rows, l.cols});
      ops::QuantizeRowTiles(FromFloats(x, {l.rows, l.cols}, dtype, device_), q, scales);
      ops::DequantizeRowTiles(q, scales, back);
      ExpectRoundTripWithinHalfAStep(x, ToFloats(back), ToFloats(scales), l.rows, l.cols, 1);
    }
    for (const Layout& l : kBlockLayouts) {
      const Shape shape = {l.groups, l.rows, l.cols};
      const std::vector<float> w = Values(l.groups * l.rows, l.cols, dtype == DType::kBF16);
      const Tensor q = Poisoned(shape, DType::kE4M3);
      const Tensor scales = Poisoned({l.groups, Tiles(l.rows), Tiles(l.cols)});
      const Tensor back = Poisoned(shape);
      ops::QuantizeBlocks(FromFloats(w, shape, dtype, device_), q, scales);
      ops::DequantizeBlocks(q, scales, back);
      ExpectRoundTripWithinHalfAStep(w, ToFloats(back), ToFloats(scales), l.rows, l.cols, kTile);
    }
  }
}

// A tile of zeros (and one of negative zeros) quantises to zeros with scale 2^-64 / 448 and
// comes back as exact zeros, into f32 and bf16.
TEST_F(Fp8OpsTest, ZeroTilesComeBackExactly) {
  const std::vector<float> x = {0.0f, 0.0f, 0.0f, -0.0f, -0.0f, -0.0f};
  const Tensor q = Poisoned({2, 3}, DType::kE4M3), scales = Poisoned({2, 1});
  ops::QuantizeRowTiles(FromFloats(x, {2, 3}, DType::kF32, device_), q, scales);
  EXPECT_EQ(FloatBits(q), Bits(x));
  EXPECT_EQ(ToFloats(scales), std::vector<float>(2, std::ldexp(1.0f, -64) / 448.0f));
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor back = Poisoned({2, 3}, dtype);
    ops::DequantizeRowTiles(q, scales, back);
    EXPECT_EQ(FloatBits(back), Bits(x)) << DTypeName(dtype);
  }
}

// k = 130: a full tile and a partial one of two elements, each with its own scale; a tile's
// largest magnitude becomes +-448, here the outlier 10^4 of the first tile, which flushes the
// small elements beside it to zero.
TEST_F(Fp8OpsTest, PartialTilesAndOutliersHaveTheirOwnScales) {
  std::vector<float> x(130, 1e-3f);
  x[7] = -1e4f;
  x[128] = 3.0f;
  x[129] = -5.0f;
  const Tensor q = Poisoned({1, 130}, DType::kE4M3), scales = Poisoned({1, 2});
  ops::QuantizeRowTiles(FromFloats(x, {1, 130}, DType::kF32, device_), q, scales);
  EXPECT_EQ(ToFloats(scales), (std::vector<float>{1e4f / 448.0f, 5.0f / 448.0f}));
  const std::vector<float> values = ToFloats(q);
  EXPECT_EQ(values[7], -448.0f);
  EXPECT_EQ(values[0], 0.0f);  // 1e-3 * 448 / 1e4 = 4.5e-5, below half the smallest subnormal
  EXPECT_EQ(values[129], -448.0f);
  EXPECT_EQ(values[128], E4M3ToFloat(FloatToE4M3(3.0f * (448.0f / 5.0f))));
  const Tensor back = Poisoned({1, 130});
  ops::DequantizeRowTiles(q, scales, back);
  EXPECT_NEAR(ToFloats(back)[7], -1e4f, 1e4f * std::ldexp(1.0f, -22));
}

TEST_F(Fp8OpsTest, DequantizeToBf16RoundsTheF32Result) {
  const Layout& l = kBlockLayouts[0];
  const Shape shape = {l.groups, l.rows, l.cols};
  const Tensor q = Poisoned(shape, DType::kE4M3);
  const Tensor scales = Poisoned({l.groups, Tiles(l.rows), Tiles(l.cols)});
  ops::QuantizeBlocks(Random(shape), q, scales);
  const Tensor f32 = Poisoned(shape), bf16 = Poisoned(shape, DType::kBF16);
  ops::DequantizeBlocks(q, scales, f32);
  ops::DequantizeBlocks(q, scales, bf16);
  std::vector<float> rounded = ToFloats(f32);
  for (float& v : rounded) v = BFloat16ToFloat(FloatToBFloat16(v));
  EXPECT_EQ(FloatBits(bf16), Bits(rounded));
}

TEST_F(Fp8OpsTest, ChecksTheScalesShape) {
  const Tensor x = Random({3, 200}), q = Poisoned({3, 200}, DType::kE4M3);
  EXPECT_DEATH(ops::QuantizeRowTiles(x, q, Poisoned({3, 1})), "scales");
  EXPECT_DEATH(ops::QuantizeRowTiles(x, Poisoned({3, 200}), Poisoned({3, 2})), "e4m3");
}

// ---------------------------------------------------------------- QuantizeColumnTiles

// Grouped rows for the column tiles: groups of 0, 1, 127, 128, 129 and 257 rows between empty
// first and last groups (642 rows: not a multiple of 16), k off a multiple of 128; one group
// holding every row; a single small group.
struct ColumnLayout {
  std::string name;
  std::vector<int32_t> offsets;
  int64_t cols;
};
const ColumnLayout kColumnLayouts[] = {{"tails", {0, 0, 1, 128, 256, 385, 642, 642}, 208},
                                       {"one group with every row", {0, 0, 300, 300}, 5},
                                       {"small", {0, 3}, 16}};

// Each group's rows transposed from token 32 (ceil(begin / 32) + g), cut into tiles of 128 rows
// from the group's first, are the contract's formula bit for bit; the other tokens (the CPU's
// padding) and the unused scale slots are zeros; the row tiles written beside them are
// QuantizeRowTiles' bit for bit; rows read through an index are the gathered rows' forms.
TEST_F(Fp8OpsTest, ColumnTilesAreEachGroupsTransposedRowTilesBitForBit) {
  for (const ColumnLayout& l : kColumnLayouts) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(l.name + ", " + DTypeName(dtype));
      const int64_t groups = static_cast<int64_t>(l.offsets.size()) - 1;
      const int64_t rows = l.offsets.back(), k = l.cols;
      const int64_t tokens = 32 * ((rows + 31) / 32 + groups);
      const std::vector<float> x = Values(rows, k, dtype == DType::kBF16);
      const Tensor input = FromFloats(x, {rows, k}, dtype, device_);
      const Tensor q = Poisoned({k, tokens}, DType::kE4M3);
      const Tensor scales = Poisoned({Fp8ColumnTileSlots(groups, rows), k});
      const Tensor row_q = Poisoned({rows, k}, DType::kE4M3),
                   row_scales = Poisoned({rows, Tiles(k)});
      ops::QuantizeColumnTiles(input, Ints(l.offsets, {groups + 1}), q, scales, row_q, row_scales);

      std::vector<float> want_q(k * tokens, 0.0f), want_scales(scales.numel(), 0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = l.offsets[g], end = l.offsets[g + 1];
        const int64_t start = 32 * ((begin + 31) / 32 + g);  // the group's first token
        // Tile t: the group's rows [begin + 128 t, begin + 128 (t + 1)), one 1 x m tile each.
        for (int64_t t = 0; begin + t * kTile < end; ++t) {
          const int64_t r0 = begin + t * kTile, m = std::min(end, r0 + kTile) - r0;
          std::vector<float> transposed(k * m);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < k; ++c) transposed[c * m + r] = x[(r0 + r) * k + c];
          }
          const HostQuantized tile = ScalarQuantize(transposed, 1, k, m, 1);
          for (int64_t c = 0; c < k; ++c) {
            for (int64_t r = 0; r < m; ++r) {
              want_q[c * tokens + start + r0 - begin + r] = tile.values[c * m + r];
            }
            want_scales[Fp8ColumnTileSlot(g, begin, t) * k + c] = tile.scales[c];
          }
        }
      }
      EXPECT_EQ(FloatBits(q), Bits(want_q));
      EXPECT_EQ(FloatBits(scales), Bits(want_scales));
      const Tensor want_row_q = Poisoned({rows, k}, DType::kE4M3);
      const Tensor want_row_scales = Poisoned({rows, Tiles(k)});
      ops::QuantizeRowTiles(input, want_row_q, want_row_scales);
      EXPECT_EQ(FloatBits(row_q), FloatBits(want_row_q));
      EXPECT_EQ(FloatBits(row_scales), FloatBits(want_row_scales));
    }
  }
  const Tensor x = Random({20, 16});
  // With an index: the gathered rows' forms, read in place.
  const std::vector<int32_t> index = {3, 3, 19, 0, 7, 12, 5, 5, 5, 1, 2};
  const Tensor offsets = Ints({0, 4, 4, 11}, {4}), index_tensor = Ints(index, {11});
  const Tensor gathered = Poisoned({11, 16});
  ops::GatherRows(x, index_tensor, gathered);
  Tensor want_q = Poisoned({16, 128}, DType::kE4M3), want_scales = Poisoned({4, 16});
  Tensor got_q = Poisoned({16, 128}, DType::kE4M3), got_scales = Poisoned({4, 16});
  Tensor want_rows = Poisoned({11, 16}, DType::kE4M3), want_row_scales = Poisoned({11, 1});
  Tensor got_rows = Poisoned({11, 16}, DType::kE4M3), got_row_scales = Poisoned({11, 1});
  ops::QuantizeColumnTiles(gathered, offsets, want_q, want_scales, want_rows, want_row_scales);
  ops::QuantizeColumnTiles(x, offsets, got_q, got_scales, got_rows, got_row_scales, index_tensor);
  EXPECT_EQ(FloatBits(got_q), FloatBits(want_q));
  EXPECT_EQ(FloatBits(got_scales), FloatBits(want_scales));
  EXPECT_EQ(FloatBits(got_rows), FloatBits(want_rows));
  EXPECT_EQ(FloatBits(got_row_scales), FloatBits(want_row_scales));
  EXPECT_DEATH(ops::QuantizeColumnTiles(x, Ints({0, 20}, {2}), Poisoned({16, 20}, DType::kE4M3),
                                        Poisoned({2, 16})),
               "quantize column tiles values");
  EXPECT_DEATH(ops::QuantizeColumnTiles(x, Ints({0, 21}, {2}), Poisoned({16, 64}, DType::kE4M3),
                                        Poisoned({2, 16})),
               "offsets");
}

// SwiGLU's output quantised without being stored: the forms of SwigluForward's output, both at
// once and each alone.
TEST_F(Fp8OpsTest, SwigluForwardQuantizedIsSwigluThenTheQuantisation) {
  const ColumnLayout& l = kColumnLayouts[0];
  const int64_t groups = static_cast<int64_t>(l.offsets.size()) - 1, rows = l.offsets.back();
  const int64_t f = l.cols;
  const Tensor h = Random({rows, 2 * f}, 3.0f), scale = Random({rows});
  const Tensor offsets = Ints(l.offsets, {groups + 1});
  const Tensor a = Poisoned({rows, f});
  ops::SwigluForward(h, scale, a);
  const auto forms = [&] {
    return std::vector<Tensor>{Poisoned({f, Fp8ColumnTokens(groups, rows)}, DType::kE4M3),
                               Poisoned({Fp8ColumnTileSlots(groups, rows), f}),
                               Poisoned({rows, f}, DType::kE4M3), Poisoned({rows, Tiles(f)})};
  };
  const std::vector<Tensor> want = forms(), both = forms(), columns = forms(), row_tiles = forms();
  ops::QuantizeColumnTiles(a, offsets, want[0], want[1], want[2], want[3]);
  ops::SwigluForwardQuantized(h, scale, offsets, both[0], both[1], both[2], both[3]);
  ops::SwigluForwardQuantized(h, scale, offsets, columns[0], columns[1], Tensor(), Tensor());
  ops::SwigluForwardQuantized(h, scale, offsets, Tensor(), Tensor(), row_tiles[2], row_tiles[3]);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(FloatBits(both[i]), FloatBits(want[i])) << "output " << i;
    EXPECT_EQ(FloatBits(i < 2 ? columns[i] : row_tiles[i]), FloatBits(want[i])) << "output " << i;
  }
  EXPECT_DEATH(
      ops::SwigluForwardQuantized(h, scale, offsets, Tensor(), Tensor(), Tensor(), Tensor()),
      "no output");
}

// SwiGLU's input gradient quantised without being stored: the forms of SwigluBackward's dh and
// its dscale, bit for bit.
TEST_F(Fp8OpsTest, SwigluBackwardQuantizedIsSwigluBackwardThenTheQuantisation) {
  const ColumnLayout& l = kColumnLayouts[0];
  const int64_t groups = static_cast<int64_t>(l.offsets.size()) - 1, rows = l.offsets.back();
  const int64_t f = l.cols;
  const Tensor h = Random({rows, 2 * f}, 3.0f), scale = Random({rows}), da = Random({rows, f});
  const Tensor offsets = Ints(l.offsets, {groups + 1});
  const Tensor dh = Poisoned({rows, 2 * f}), want_dscale = Poisoned({rows});
  ops::SwigluBackward(da, h, scale, dh, want_dscale);
  const auto forms = [&] {
    return std::vector<Tensor>{Poisoned({2 * f, Fp8ColumnTokens(groups, rows)}, DType::kE4M3),
                               Poisoned({Fp8ColumnTileSlots(groups, rows), 2 * f}),
                               Poisoned({rows, 2 * f}, DType::kE4M3),
                               Poisoned({rows, Tiles(2 * f)})};
  };
  const std::vector<Tensor> want = forms(), got = forms();
  ops::QuantizeColumnTiles(dh, offsets, want[0], want[1], want[2], want[3]);
  const Tensor dscale = Poisoned({rows});
  ops::SwigluBackwardQuantized(da, h, scale, offsets, got[0], got[1], got[2], got[3], dscale);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(FloatBits(got[i]), FloatBits(want[i])) << "output " << i;
  EXPECT_EQ(FloatBits(dscale), FloatBits(want_dscale));
}

// ---------------------------------------------------------------- Fp8GroupedMatmul

// Quantised operands of one grouped GEMM y = x w_g^T: x (rows, k) in row tiles, w (groups, n, k)
// in blocks, and the unquantised f32 tensors they came from.
struct Fp8GemmCase {
  std::string name;
  std::vector<int32_t> offsets;
  int64_t contracted, n;
};

const Fp8GemmCase kGemmCases[] = {
    // Empty groups first, inside and last; k and n off multiples of 128.
    {"empty groups", {0, 0, 40, 40, 75, 90, 90}, 300, 200},
    {"one group with every row", {0, 0, 0, 61, 61}, 256, 130},
    {"small", {0, 3, 5}, 20, 7}};

struct Fp8GemmOperands {
  Tensor x, w, xq, x_scales, wq, w_scales, offsets;
  int64_t groups, rows;
};

class Fp8GroupedMatmulTest : public Fp8OpsTest {
 protected:
  Fp8GemmOperands Operands(const Fp8GemmCase& c) {
    Fp8GemmOperands o;
    o.groups = static_cast<int64_t>(c.offsets.size()) - 1;
    o.rows = c.offsets.back();
    o.x = Random({o.rows, c.contracted});
    o.w = Random({o.groups, c.n, c.contracted});
    o.xq = Poisoned(o.x.shape(), DType::kE4M3);
    o.x_scales = Poisoned({o.rows, Tiles(c.contracted)});
    o.wq = Poisoned(o.w.shape(), DType::kE4M3);
    o.w_scales = Poisoned({o.groups, Tiles(c.n), Tiles(c.contracted)});
    o.offsets = Ints(c.offsets, {o.groups + 1});
    ops::QuantizeRowTiles(o.x, o.xq, o.x_scales);
    ops::QuantizeBlocks(o.w, o.wq, o.w_scales);
    return o;
  }
};

// Against the exact product of the dequantised operands (in double): each output element may
// differ by the f32 roundings of its sum, at most (tile length + tiles + 2) 2^-24 of the sum of
// its terms' magnitudes (first order: the partial sums' additions, the scales' product, the fma
// chain's roundings), with a little slack.
TEST_F(Fp8GroupedMatmulTest, IsTheDequantisedProductUpToF32Summation) {
  for (const Fp8GemmCase& c : kGemmCases) {
    SCOPED_TRACE(c.name);
    const Fp8GemmOperands o = Operands(c);
    const Tensor y = Poisoned({o.rows, c.n});
    ops::Fp8GroupedMatmul(o.xq, o.x_scales, o.wq, o.w_scales, o.offsets, y);
    const std::vector<float> xq = ToFloats(o.xq), xs = ToFloats(o.x_scales);
    const std::vector<float> wq = ToFloats(o.wq), ws = ToFloats(o.w_scales), got = ToFloats(y);
    const int64_t k = c.contracted, tiles = Tiles(k), n_tiles = Tiles(c.n);
    const double gamma = (kTile + tiles + 2) * std::ldexp(1.0, -24) * 1.01;
    for (int64_t g = 0; g < o.groups; ++g) {
      for (int64_t r = c.offsets[g]; r < c.offsets[g + 1]; ++r) {
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = 0, magnitude = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double term = static_cast<double>(xq[r * k + i]) * xs[r * tiles + i / kTile] *
                                wq[(g * c.n + j) * k + i] *
                                ws[(g * n_tiles + j / kTile) * tiles + i / kTile];
            sum += term;
            magnitude += std::abs(term);
          }
          ASSERT_LE(std::abs(got[r * c.n + j] - sum), gamma * magnitude + 1e-30)
              << "row " << r << ", column " << j;
        }
      }
    }
  }
}

// Against GroupedMatmul of the operands before quantisation, in both orientations (y = x w^T;
// y = x w through the transposed blocks, an input gradient's GEMM): the FP8 error (each operand
// within 2^-4 relative, much less on average) is a few percent of the result in norm; a bf16 y
// holds the f32 result rounded.
TEST_F(Fp8GroupedMatmulTest, IsCloseToGroupedMatmulOfTheUnquantisedOperands) {
  for (const Fp8GemmCase& c : kGemmCases) {
    for (const bool transposed : {false, true}) {
      SCOPED_TRACE(c.name + (transposed ? ", y = x w" : ", y = x w^T"));
      Fp8GemmOperands o = Operands(c);
      if (transposed) {  // w (groups, k, n): its blocks transposed are the K-major operand
        o.w = Random({o.groups, c.contracted, c.n});
        const Tensor rows_q = Poisoned(o.w.shape(), DType::kE4M3);
        const Tensor rows_scales = Poisoned({o.groups, Tiles(c.contracted), Tiles(c.n)});
        ops::QuantizeBlocks(o.w, rows_q, rows_scales, o.wq, o.w_scales);
      }
      const Tensor y = Poisoned({o.rows, c.n}), y_bf16 = Poisoned({o.rows, c.n}, DType::kBF16);
      const Tensor want = Poisoned({o.rows, c.n});
      ops::Fp8GroupedMatmul(o.xq, o.x_scales, o.wq, o.w_scales, o.offsets, y);
      ops::Fp8GroupedMatmul(o.xq, o.x_scales, o.wq, o.w_scales, o.offsets, y_bf16);
      ops::GroupedMatmul(o.x, o.w, o.offsets, {}, want, /*transpose_w=*/!transposed);
      EXPECT_LT(testing::RelativeError(ToFloats(y), ToFloats(want)), 0.08);
      std::vector<float> rounded = ToFloats(y);
      for (float& v : rounded) v = BFloat16ToFloat(FloatToBFloat16(v));
      EXPECT_EQ(FloatBits(y_bf16), Bits(rounded));
    }
  }
}

// ---------------------------------------------------------------- Fp8GroupedMatmulWeightGrad

// The weight gradient's parts: one (the tails), two cutting the same groups differently, one
// group holding every row.
struct Fp8WeightGradCase {
  std::string name;
  std::vector<std::vector<int32_t>> parts;  // each part's offsets
  int64_t n, k;
};
const Fp8WeightGradCase kWeightGradCases[] = {
    {"tails", {{0, 0, 1, 128, 256, 385, 642, 642}}, 48, 208},
    {"two parts", {{0, 130, 130, 200}, {0, 5, 5, 300}}, 16, 144},
    {"one group with every row", {{0, 0, 300}}, 32, 16}};

class Fp8WeightGradTest : public Fp8OpsTest {
 protected:
  struct Part {
    Tensor dy, x;  // (rows, n), (rows, k) f32
    ops::Fp8GroupedColumns columns;
  };

  std::vector<Part> Parts(const Fp8WeightGradCase& c) {
    std::vector<Part> parts;
    for (const std::vector<int32_t>& offsets : c.parts) {
      const int64_t groups = static_cast<int64_t>(offsets.size()) - 1, rows = offsets.back();
      Part p{Random({rows, c.n}), Random({rows, c.k}), {}};
      p.columns.offsets = Ints(offsets, {groups + 1});
      p.columns.rows = rows;
      const auto quantize = [&](const Tensor& v, Tensor& q, Tensor& scales) {
        q = Poisoned({v.dim(1), Fp8ColumnTokens(groups, rows)}, DType::kE4M3);
        scales = Poisoned({Fp8ColumnTileSlots(groups, rows), v.dim(1)});
        ops::QuantizeColumnTiles(v, p.columns.offsets, q, scales);
      };
      quantize(p.dy, p.columns.dy_q, p.columns.dy_scales);
      quantize(p.x, p.columns.x_q, p.columns.x_scales);
      parts.push_back(p);
    }
    return parts;
  }

  static std::vector<ops::Fp8GroupedColumns> Columns(const std::vector<Part>& parts) {
    std::vector<ops::Fp8GroupedColumns> out;
    for (const Part& p : parts) out.push_back(p.columns);
    return out;
  }
};

// Against the exact sum over the parts of the dequantised operands' products (in double), within
// the f32 roundings of the contract's order ((tile length + tiles + 2) 2^-24 of the terms'
// magnitudes, as the forward's); a group without rows gets zeros.
TEST_F(Fp8WeightGradTest, IsTheDequantisedProductUpToF32Summation) {
  for (const Fp8WeightGradCase& c : kWeightGradCases) {
    SCOPED_TRACE(c.name);
    const std::vector<Part> parts = Parts(c);
    const int64_t groups = static_cast<int64_t>(c.parts[0].size()) - 1;
    const Tensor dw = Poisoned({groups, c.n, c.k});
    ops::Fp8GroupedMatmulWeightGrad(Columns(parts), dw, /*accumulate=*/false);
    const std::vector<float> got = ToFloats(dw);
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> sum(c.n * c.k, 0.0), magnitude(c.n * c.k, 0.0);
      int64_t tiles = 0;
      for (size_t p = 0; p < parts.size(); ++p) {
        const ops::Fp8GroupedColumns& part = parts[p].columns;
        const std::vector<float> dy = ToFloats(part.dy_q), dys = ToFloats(part.dy_scales);
        const std::vector<float> x = ToFloats(part.x_q), xs = ToFloats(part.x_scales);
        const int64_t tokens = part.dy_q.dim(1), begin = c.parts[p][g];
        const int64_t end = c.parts[p][g + 1];
        tiles += (end - begin + kTile - 1) / kTile;
        for (int64_t r = begin; r < end; ++r) {  // row r's tile: 128 rows from begin's
          const int64_t slot = Fp8ColumnTileSlot(g, begin, (r - begin) / kTile);
          const int64_t token = Fp8ColumnToken(g, begin, r);
          for (int64_t i = 0; i < c.n; ++i) {
            for (int64_t j = 0; j < c.k; ++j) {
              const double term = static_cast<double>(dy[i * tokens + token]) *
                                  dys[slot * c.n + i] * x[j * tokens + token] * xs[slot * c.k + j];
              sum[i * c.k + j] += term;
              magnitude[i * c.k + j] += std::abs(term);
            }
          }
        }
      }
      const double gamma = (kTile + tiles + 2) * std::ldexp(1.0, -24) * 1.01;
      for (int64_t e = 0; e < c.n * c.k; ++e) {
        ASSERT_LE(std::abs(got[g * c.n * c.k + e] - sum[e]), gamma * magnitude[e] + 1e-30)
            << "group " << g << ", element " << e;
      }
    }
  }
}

// Against GroupedMatmulWeightGrad of the unquantised operands: the FP8 error, a few percent in
// norm; a bf16 dw holds the f32 result rounded.
TEST_F(Fp8WeightGradTest, IsCloseToTheUnquantisedWeightGradient) {
  for (const Fp8WeightGradCase& c : kWeightGradCases) {
    SCOPED_TRACE(c.name);
    const std::vector<Part> parts = Parts(c);
    const int64_t groups = static_cast<int64_t>(c.parts[0].size()) - 1;
    const Tensor dw = Poisoned({groups, c.n, c.k});
    const Tensor dw_bf16 = Poisoned({groups, c.n, c.k}, DType::kBF16);
    const Tensor want = Poisoned({groups, c.n, c.k});
    ops::Fp8GroupedMatmulWeightGrad(Columns(parts), dw, /*accumulate=*/false);
    ops::Fp8GroupedMatmulWeightGrad(Columns(parts), dw_bf16, /*accumulate=*/false);
    std::vector<ops::GroupedRows> rows;
    for (const Part& p : parts) rows.push_back({p.dy, p.x, p.columns.offsets, {}});
    ops::GroupedMatmulWeightGrad(rows, want, /*accumulate=*/false);
    EXPECT_LT(testing::RelativeError(ToFloats(dw), ToFloats(want)), 0.08);
    std::vector<float> rounded = ToFloats(dw);
    for (float& v : rounded) v = BFloat16ToFloat(FloatToBFloat16(v));
    EXPECT_EQ(FloatBits(dw_bf16), Bits(rounded));
  }
}

// += adds the = result to dw in f32 (one rounding: bit for bit for an f32 dw) and leaves the
// matrices of groups without rows as they were; = writes those as zeros.
TEST_F(Fp8WeightGradTest, AccumulateAddsTheResultAndKeepsGroupsWithoutRows) {
  const Fp8WeightGradCase& c = kWeightGradCases[0];  // groups 0 and 6 have no rows
  const std::vector<ops::Fp8GroupedColumns> parts = Columns(Parts(c));
  const int64_t groups = 7;
  const Tensor result = Poisoned({groups, c.n, c.k});
  ops::Fp8GroupedMatmulWeightGrad(parts, result, /*accumulate=*/false);
  const Tensor dw = Random({groups, c.n, c.k});
  const std::vector<float> before = ToFloats(dw), added = ToFloats(result);
  ops::Fp8GroupedMatmulWeightGrad(parts, dw, /*accumulate=*/true);
  std::vector<float> want(before.size());
  for (size_t e = 0; e < want.size(); ++e) want[e] = before[e] + added[e];
  EXPECT_EQ(FloatBits(dw), Bits(want));
  const int64_t matrix = c.n * c.k;
  for (const int64_t g : {0, 6}) {
    EXPECT_TRUE(std::all_of(added.begin() + g * matrix, added.begin() + (g + 1) * matrix,
                            [](float v) { return v == 0.0f; }))
        << "group " << g;
  }
}

}  // namespace
}  // namespace moe
