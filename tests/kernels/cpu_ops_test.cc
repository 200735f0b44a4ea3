// The CPU backend's forward ops against independent references, and the properties of the
// routing, reduction and optimizer ops. Every test draws fresh random inputs (the seed is in the
// failure trace; MOE_TEST_SEED repeats it) and poisons its outputs first, so an element an op
// forgets to write is NaN and fails. Float references are computed in double on the host; f32
// results must match them to kTolerance in relative error (RelativeError fails on NaN).
// Gradients are checked in cpu_grad_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "engine/kernels/ops.h"
#include "tests/testing/grad_check.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::FromFloats;
using testing::RelativeError;
using testing::ToFloats;
using testing::ToInts;

constexpr double kTolerance = 1e-5;  // f32 op vs double reference
const float kNaN = std::numeric_limits<float>::quiet_NaN();

class CpuOpsTest : public testing::OpTest {};

// ---------------------------------------------------------------- memory and elementwise

TEST_F(CpuOpsTest, FillWritesEveryDTypeAndOnlyTheView) {
  Tensor f = Poisoned({3, 4});
  ops::Fill(f, 1.5f);
  EXPECT_EQ(ToFloats(f), std::vector<float>(12, 1.5f));
  Tensor b = Poisoned({5}, DType::kBF16);
  ops::Fill(b, -2.25f);
  EXPECT_EQ(ToFloats(b), std::vector<float>(5, -2.25f));
  Tensor i = Poisoned({4}, DType::kI32);
  ops::Fill(i, -3.7f);  // truncated
  EXPECT_EQ(ToInts(i), std::vector<int32_t>(4, -3));
  Tensor e = Poisoned({3}, DType::kE4M3);
  ops::Fill(e, -500.0f);  // rounded to e4m3, saturating
  EXPECT_EQ(ToFloats(e), std::vector<float>(3, -448.0f));

  Tensor whole = Zeros({4, 3});
  ops::Fill(whole.Rows(1, 3), 7.0f);
  EXPECT_EQ(ToFloats(whole), (std::vector<float>{0, 0, 0, 7, 7, 7, 7, 7, 7, 0, 0, 0}));
}

TEST_F(CpuOpsTest, CastRoundTripIsWithinHalfAnUlpOfBf16) {
  const std::vector<float> x = testing::RandomFloats(257, rng_, 100.0f);
  Tensor narrow = Poisoned({257}, DType::kBF16);
  Tensor back = Poisoned({257});
  ops::Cast(Floats(x, {257}), narrow);
  ops::Cast(narrow, back);
  const std::vector<float> got = ToFloats(back);
  for (size_t i = 0; i < x.size(); ++i) {
    // 8 significant bits: round to nearest is within 2^-8 relative (half of 2^-7).
    EXPECT_LE(std::abs(got[i] - x[i]), std::ldexp(std::abs(x[i]), -8)) << "at " << i;
  }
  // f32 -> f32 is a copy.
  Tensor same = Poisoned({257});
  ops::Cast(back, same);
  EXPECT_EQ(ToFloats(same), got);
}

TEST_F(CpuOpsTest, CastRoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // spacing of bf16 in [1, 2)
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::ldexp(1.0f, -20);
  // (input, its bf16 rounding): ties go to the even mantissa.
  const std::vector<std::pair<float, float>> cases = {
      {1.0f + ulp / 2, 1.0f},                // tie, 1 is even: down
      {1.0f + 3 * ulp / 2, 1.0f + 2 * ulp},  // tie, 1 + 2ulp is even: up
      {1.0f + ulp / 2 + tiny, 1.0f + ulp},   // past the tie: up
      {1.0f + ulp / 2 - tiny, 1.0f},         // short of the tie: down
      {-(1.0f + ulp / 2), -1.0f},            // sign symmetric
      {3.0f, 3.0f},
      {inf, inf},
      {-inf, -inf}};
  std::vector<float> x, want;
  for (const auto& [in, rounded] : cases) {
    x.push_back(in);
    want.push_back(rounded);
  }
  const int64_t n = x.size();
  Tensor narrow = Poisoned({n}, DType::kBF16);
  ops::Cast(Floats(x, {n}), narrow);
  EXPECT_EQ(ToFloats(narrow), want);

  Tensor nan_narrow = FromFloats({0.0f}, {1}, DType::kBF16, device_);  // not NaN poison
  ops::Cast(Floats({kNaN}, {1}), nan_narrow);
  EXPECT_TRUE(std::isnan(ToFloats(nan_narrow)[0]));
}

TEST_F(CpuOpsTest, AddScaleAxpyMatchLoops) {
  Tensor a = Random({6, 5}), b = Random({6, 5});
  const std::vector<float> ha = ToFloats(a), hb = ToFloats(b);
  std::vector<float> sum(30), scaled(30), axpy(30);
  for (int i = 0; i < 30; ++i) {
    sum[i] = ha[i] + hb[i];
    scaled[i] = -0.75f * ha[i];
    axpy[i] = hb[i] + 0.5f * ha[i];
  }
  Tensor out = Poisoned({6, 5});
  ops::Add(a, b, out);
  EXPECT_EQ(ToFloats(out), sum);
  ops::Scale(a, -0.75f, out);
  EXPECT_EQ(ToFloats(out), scaled);
  ops::Axpy(0.5f, a, b);  // b += 0.5 a
  EXPECT_EQ(ToFloats(b), axpy);
  ops::Add(a, a, a);  // aliased output
  for (int i = 0; i < 30; ++i) sum[i] = ha[i] + ha[i];
  EXPECT_EQ(ToFloats(a), sum);
}

// ---------------------------------------------------------------- matmul

// op(a) op(b) + beta * c for each batch, in double.
std::vector<float> MatmulReference(const std::vector<float>& a, const std::vector<float>& b,
                                   const std::vector<float>& c, int64_t batches, int64_t m,
                                   int64_t n, int64_t k, bool transpose_a, bool transpose_b,
                                   float beta) {
  std::vector<float> out(batches * m * n);
  for (int64_t z = 0; z < batches; ++z) {
    const float* pa = a.data() + z * m * k;
    const float* pb = b.data() + z * k * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c[(z * m + i) * n + j];
        for (int64_t p = 0; p < k; ++p) {
          const float x = transpose_a ? pa[p * m + i] : pa[i * k + p];
          const float y = transpose_b ? pb[j * k + p] : pb[p * n + j];
          sum += static_cast<double>(x) * y;
        }
        out[(z * m + i) * n + j] = static_cast<float>(sum);
      }
    }
  }
  return out;
}

TEST_F(CpuOpsTest, MatmulAllTransposesBatchesAndBeta) {
  const int64_t m = 6, n = 4, k = 5;
  for (int64_t batches : {0, 3}) {  // 0: plain 2-D
    for (int variant = 0; variant < 8; ++variant) {
      const bool transpose_a = variant & 1, transpose_b = variant & 2;
      const float beta = (variant & 4) ? 0.5f : 0.0f;
      SCOPED_TRACE("batches " + std::to_string(batches) + " variant " + std::to_string(variant));
      auto shape = [&](int64_t rows, int64_t cols) {
        return batches ? Shape{batches, rows, cols} : Shape{rows, cols};
      };
      Tensor a = Random(transpose_a ? shape(k, m) : shape(m, k));
      Tensor b = Random(transpose_b ? shape(n, k) : shape(k, n));
      // beta = 0 must not read out, so it starts poisoned; otherwise random.
      Tensor out = beta == 0.0f ? Poisoned(shape(m, n)) : Random(shape(m, n));
      const std::vector<float> c = ToFloats(out);
      ops::Matmul(a, b, out, transpose_a, transpose_b, beta);
      const std::vector<float> want =
          MatmulReference(ToFloats(a), ToFloats(b), c, std::max<int64_t>(batches, 1), m, n, k,
                          transpose_a, transpose_b, beta);
      EXPECT_LT(RelativeError(ToFloats(out), want), kTolerance);
    }
  }
}

// ---------------------------------------------------------------- grouped GEMM

// 7 groups over 20 rows: empty ones first, inside and last, a crowded one and a single row.
const std::vector<int32_t> kGroupOffsets = {0, 0, 3, 3, 17, 18, 20, 20};
constexpr int64_t kGroups = 7, kGroupedRows = 20;

int64_t GroupOfRow(int64_t row) {
  int64_t g = 0;
  while (kGroupOffsets[g + 1] <= row) ++g;
  return g;
}

TEST_F(CpuOpsTest, GroupedMatmulIsAMatmulPerGroup) {
  const int64_t k = 5, n = 4;
  for (bool transpose_w : {false, true}) {
    SCOPED_TRACE(transpose_w ? "y = x w^T" : "y = x w");
    Tensor x = Random({kGroupedRows, k});
    Tensor w = Random(transpose_w ? Shape{kGroups, n, k} : Shape{kGroups, k, n});
    Tensor y = Poisoned({kGroupedRows, n});
    ops::GroupedMatmul(x, w, Ints(kGroupOffsets, {kGroups + 1}), {}, y, transpose_w);
    const std::vector<float> hx = ToFloats(x), hw = ToFloats(w);
    std::vector<float> want(kGroupedRows * n);
    for (int64_t row = 0; row < kGroupedRows; ++row) {
      const float* wg = hw.data() + GroupOfRow(row) * n * k;
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          sum +=
              static_cast<double>(hx[row * k + p]) * (transpose_w ? wg[j * k + p] : wg[p * n + j]);
        }
        want[row * n + j] = static_cast<float>(sum);
      }
    }
    EXPECT_LT(RelativeError(ToFloats(y), want), kTolerance);
  }
}

// accumulate: dw_g += ..., an empty group left as it is; otherwise dw_g = ..., zeros for an empty
// group, whatever dw held before (NaN here).
TEST_F(CpuOpsTest, GroupedMatmulWeightGradAddsOrStores) {
  const int64_t k = 5, n = 4;
  for (const bool accumulate : {true, false}) {
    SCOPED_TRACE(accumulate ? "+=" : "=");
    Tensor dy = Random({kGroupedRows, n}), x = Random({kGroupedRows, k});
    Tensor dw = accumulate ? Random({kGroups, n, k}) : Poisoned({kGroups, n, k});
    const std::vector<float> before =
        accumulate ? ToFloats(dw) : std::vector<float>(dw.numel(), 0.0f);
    const std::vector<float> hdy = ToFloats(dy), hx = ToFloats(x);
    ops::GroupedMatmulWeightGrad(dy, x, Ints(kGroupOffsets, {kGroups + 1}), {}, dw, accumulate);
    std::vector<double> sums(before.begin(), before.end());
    for (int64_t row = 0; row < kGroupedRows; ++row) {
      double* dwg = sums.data() + GroupOfRow(row) * n * k;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t p = 0; p < k; ++p) {
          dwg[i * k + p] += static_cast<double>(hdy[row * n + i]) * hx[row * k + p];
        }
      }
    }
    const std::vector<float> got = ToFloats(dw);
    EXPECT_LT(RelativeError(got, std::vector<float>(sums.begin(), sums.end())), kTolerance);
    for (int64_t g = 0; g < kGroups; ++g) {
      if (kGroupOffsets[g] != kGroupOffsets[g + 1]) continue;
      EXPECT_TRUE(std::equal(got.begin() + g * n * k, got.begin() + (g + 1) * n * k,
                             before.begin() + g * n * k))
          << "empty group " << g << " is not as it was (+=) or zeros (=)";
    }
  }
}

TEST_F(CpuOpsTest, GroupedMatmulNeedsNoHostOffsetsAndChecksAnyGiven) {
  const int64_t k = 5, n = 4;
  EXPECT_FALSE(ops::GroupedMatmulNeedsHostOffsets(device_, DType::kF32, {kGroups, n, k}));
  const Tensor offsets = Ints(kGroupOffsets, {kGroups + 1});
  Tensor x = Random({kGroupedRows, k}), w = Random({kGroups, n, k});
  Tensor with_host = Poisoned({kGroupedRows, n}), without = Poisoned({kGroupedRows, n});
  ops::GroupedMatmul(x, w, offsets, kGroupOffsets, with_host, /*transpose_w=*/true);
  ops::GroupedMatmul(x, w, offsets, {}, without, /*transpose_w=*/true);
  EXPECT_EQ(ToFloats(with_host), ToFloats(without));
  std::vector<int32_t> other = kGroupOffsets;
  other[3] += 1;  // still valid offsets, but not the tensor's
  EXPECT_DEATH(ops::GroupedMatmul(x, w, offsets, other, without, /*transpose_w=*/true),
               "host offsets differ");
}

// ---------------------------------------------------------------- normalisation, softmax

TEST_F(CpuOpsTest, RmsNormForwardMatchesReference) {
  const int64_t rows = 7, h = 16;
  const float eps = 1e-5f;
  Tensor x = Random({rows, h}), w = Random({h});
  Tensor y = Poisoned({rows, h}), rstd = Poisoned({rows});
  ops::RmsNormForward(x, w, eps, y, rstd);
  const std::vector<float> hx = ToFloats(x), hw = ToFloats(w);
  std::vector<float> want_y(rows * h), want_rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < h; ++j) ms += static_cast<double>(hx[r * h + j]) * hx[r * h + j] / h;
    const double s = 1.0 / std::sqrt(ms + eps);
    want_rstd[r] = static_cast<float>(s);
    for (int64_t j = 0; j < h; ++j)
      want_y[r * h + j] = static_cast<float>(hx[r * h + j] * s * hw[j]);
  }
  EXPECT_LT(RelativeError(ToFloats(y), want_y), kTolerance);
  EXPECT_LT(RelativeError(ToFloats(rstd), want_rstd), kTolerance);
}

TEST_F(CpuOpsTest, RmsNormForwardWithResidualNormalisesTheSumItWritesToX) {
  const int64_t rows = 5, h = 12;
  Tensor x = Random({rows, h}), residual = Random({rows, h}), w = Random({h});
  Tensor sum = Poisoned({rows, h}), y = Poisoned({rows, h}), rstd = Poisoned({rows});
  ops::Add(x, residual, sum);
  ops::RmsNormForward(sum, w, 1e-5f, y, rstd);
  Tensor fused_y = Poisoned({rows, h}), fused_rstd = Poisoned({rows});
  ops::RmsNormForward(x, w, 1e-5f, fused_y, fused_rstd, residual);
  EXPECT_EQ(ToFloats(x), ToFloats(sum));
  EXPECT_EQ(ToFloats(fused_y), ToFloats(y));
  EXPECT_EQ(ToFloats(fused_rstd), ToFloats(rstd));
}

TEST_F(CpuOpsTest, SoftmaxForwardMatchesReference) {
  const int64_t rows = 5, cols = 9;
  Tensor x = Random({rows, cols}, 4.0f), y = Poisoned({rows, cols});
  ops::SoftmaxForward(x, y);
  const std::vector<float> hx = ToFloats(x);
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(static_cast<double>(hx[r * cols + j]));
    for (int64_t j = 0; j < cols; ++j) {
      want[r * cols + j] =
          static_cast<float>(std::exp(static_cast<double>(hx[r * cols + j])) / sum);
    }
  }
  EXPECT_LT(RelativeError(ToFloats(y), want), kTolerance);
}

// ---------------------------------------------------------------- activations

double SiluReference(double x) { return x / (1.0 + std::exp(-x)); }

TEST_F(CpuOpsTest, SiluForwardMatchesReference) {
  Tensor x = Random({4, 11}, 3.0f), y = Poisoned({4, 11});
  ops::SiluForward(x, y);
  std::vector<float> want = ToFloats(x);
  for (float& v : want) v = static_cast<float>(SiluReference(v));
  EXPECT_LT(RelativeError(ToFloats(y), want), kTolerance);
}

TEST_F(CpuOpsTest, SwigluForwardWithAndWithoutScale) {
  const int64_t rows = 5, f = 6;
  Tensor x = Random({rows, 2 * f}, 2.0f), scale = Random({rows});
  const std::vector<float> hx = ToFloats(x), hs = ToFloats(scale);
  for (bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "scaled" : "unscaled");
    Tensor y = Poisoned({rows, f});
    ops::SwigluForward(x, scaled ? scale : Tensor(), y);
    std::vector<float> want(rows * f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < f; ++j) {
        want[r * f + j] = static_cast<float>(SiluReference(hx[r * 2 * f + j]) *
                                             hx[r * 2 * f + f + j] * (scaled ? hs[r] : 1.0));
      }
    }
    EXPECT_LT(RelativeError(ToFloats(y), want), kTolerance);
  }
}

// ---------------------------------------------------------------- rope

// Positions in the thousands, where an angle computed in float would be ~1e-5 rad off; the
// reference computes base^(-2i/d) as exp(-2i/d log base) in long double.
TEST_F(CpuOpsTest, RopeTableHoldsCosAndSinOfAnglesComputedInDouble) {
  const int64_t seq = 4096, d = 16, half = d / 2;
  const float base = 10000.0f;
  Tensor table = Poisoned({seq, half, 2});
  ops::RopeTable(base, table);
  const std::vector<float> got = ToFloats(table);
  double worst = 0;
  for (int64_t pos = 0; pos < seq; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const long double angle =
          pos * std::exp(-2.0L * i / d * std::log(static_cast<long double>(base)));
      const float* pair = &got[(pos * half + i) * 2];
      worst = std::max({worst, std::abs(pair[0] - static_cast<double>(std::cos(angle))),
                        std::abs(pair[1] - static_cast<double>(std::sin(angle)))});
    }
  }
  // Values in [-1, 1] rounded once from double: within one float ulp of 1 of the exact ones.
  EXPECT_LE(worst, 0x1p-24);
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 2 * half),
            std::vector<float>({1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}));  // position 0
}

TEST_F(CpuOpsTest, RopeQkvForwardRotatesQAndKAndCopiesV) {
  const int64_t batch = 2, seq = 5, heads = 3, kv_heads = 2, d = 8, slots = heads + 2 * kv_heads;
  const float base = 10000.0f;
  Tensor qkv = Random({batch * seq, slots * d});
  Tensor q = Poisoned({batch * seq, heads, d}), k = Poisoned({batch * seq, kv_heads, d});
  Tensor v = Poisoned({batch * seq, kv_heads, d});
  Tensor table = Poisoned({seq, d / 2, 2});
  ops::RopeTable(base, table);
  ops::RopeQkvForward(qkv, table, q, k, v);
  const std::vector<float> in = ToFloats(qkv);
  std::vector<float> want_q(q.numel()), want_k(k.numel()), want_v(v.numel());
  for (int64_t r = 0; r < batch * seq; ++r) {
    for (int64_t slot = 0; slot < slots; ++slot) {
      const float* x = &in[(r * slots + slot) * d];
      if (slot >= heads + kv_heads) {
        std::copy(x, x + d, &want_v[(r * kv_heads + slot - heads - kv_heads) * d]);
        continue;
      }
      float* y = slot < heads ? &want_q[(r * heads + slot) * d]
                              : &want_k[(r * kv_heads + slot - heads) * d];
      for (int64_t i = 0; i < d / 2; ++i) {
        const double angle = (r % seq) * std::pow(base, -2.0 * i / d);
        y[i] = static_cast<float>(x[i] * std::cos(angle) - x[i + d / 2] * std::sin(angle));
        y[i + d / 2] = static_cast<float>(x[i + d / 2] * std::cos(angle) + x[i] * std::sin(angle));
      }
    }
  }
  EXPECT_LT(RelativeError(ToFloats(q), want_q), kTolerance);
  EXPECT_LT(RelativeError(ToFloats(k), want_k), kTolerance);
  EXPECT_EQ(ToFloats(v), want_v);
}

// Without a table the move only splits (and packs back): every head copied, bit for bit.
TEST_F(CpuOpsTest, RopeQkvWithoutATableCopiesEveryHead) {
  const int64_t tokens = 6, heads = 3, kv_heads = 1, d = 6, slots = heads + 2 * kv_heads;
  Tensor qkv = Random({tokens, slots * d});
  Tensor q = Poisoned({tokens, heads, d}), k = Poisoned({tokens, kv_heads, d});
  Tensor v = Poisoned({tokens, kv_heads, d});
  ops::RopeQkvForward(qkv, Tensor(), q, k, v);
  const std::vector<float> in = ToFloats(qkv), got_q = ToFloats(q), got_k = ToFloats(k),
                           got_v = ToFloats(v);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t slot = 0; slot < slots; ++slot) {
      const float* want = &in[(t * slots + slot) * d];
      const float* got = slot < heads              ? &got_q[(t * heads + slot) * d]
                         : slot < heads + kv_heads ? &got_k[(t * kv_heads + slot - heads) * d]
                                                   : &got_v[(t * kv_heads) * d];
      EXPECT_EQ(std::vector<float>(got, got + d), std::vector<float>(want, want + d))
          << "token " << t << " slot " << slot;
    }
  }
  Tensor back = Poisoned({tokens, slots * d});
  ops::RopeQkvBackward(q, k, v, Tensor(), back);
  EXPECT_EQ(ToFloats(back), in);
}

// RopeForward rotates one tensor's heads with RopeQkvForward's arithmetic (checked against its
// definition above): the bits of its q, out of place and in place; RopeBackward likewise has the
// bits of RopeQkvBackward's q part.
TEST_F(CpuOpsTest, RopeForwardHasTheBitsOfRopeQkvForwardsQueries) {
  const int64_t seq = 5, tokens = 2 * seq, heads = 3, d = 10;
  Tensor table = Poisoned({seq, d / 2, 2});
  ops::RopeTable(500.0f, table);
  Tensor qkv = Random({tokens, (heads + 2) * d});
  Tensor q = Poisoned({tokens, heads, d}), k = Poisoned({tokens, 1, d}),
         v = Poisoned({tokens, 1, d});
  Tensor raw_q = Poisoned({tokens, heads, d}), raw_k = Poisoned({tokens, 1, d});
  ops::RopeQkvForward(qkv, table, q, k, v);
  ops::RopeQkvForward(qkv, Tensor(), raw_q, raw_k, v);
  Tensor rotated = Poisoned({tokens, heads, d});
  ops::RopeForward(raw_q, table, rotated);
  EXPECT_EQ(testing::FloatBits(rotated), testing::FloatBits(q));
  ops::RopeForward(raw_q, table, raw_q);
  EXPECT_EQ(testing::FloatBits(raw_q), testing::FloatBits(q));

  Tensor dq = Random({tokens, heads, d}), dqkv = Poisoned({tokens, (heads + 2) * d});
  ops::RopeQkvBackward(dq, k, v, table, dqkv);
  Tensor dq_raw = Poisoned({tokens, heads, d});
  ops::RopeBackward(dq, table, dq_raw);
  const std::vector<float> packed = ToFloats(dqkv), got = ToFloats(dq_raw);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* want = &packed[t * (heads + 2) * d];
    EXPECT_EQ(std::vector<float>(got.begin() + t * heads * d, got.begin() + (t + 1) * heads * d),
              std::vector<float>(want, want + heads * d))
        << "token " << t;
  }
  ops::RopeBackward(dq, table, dq);
  EXPECT_EQ(ToFloats(dq), got);
}

// ---------------------------------------------------------------- attention

// Causal GQA attention through an explicit masked (seq, seq) score matrix, in double.
struct AttentionReference {
  std::vector<float> out, lse;
};

AttentionReference ReferenceAttention(const std::vector<float>& q, const std::vector<float>& k,
                                      const std::vector<float>& v, int64_t batch, int64_t seq,
                                      int64_t heads, int64_t kv_heads, int64_t d) {
  AttentionReference ref{std::vector<float>(q.size()), std::vector<float>(batch * heads * seq)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double minus_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(seq * seq);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv_heads);
      auto qv = [&](int64_t i, int64_t c) { return q[((b * seq + i) * heads + h) * d + c]; };
      auto kv = [&](const std::vector<float>& t, int64_t j, int64_t c) {
        return t[((b * seq + j) * kv_heads + g) * d + c];
      };
      for (int64_t i = 0; i < seq; ++i) {
        for (int64_t j = 0; j < seq; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qv(i, c)) * kv(k, j, c);
          s[i * seq + j] = j <= i ? dot * scale : minus_inf;
        }
      }
      for (int64_t i = 0; i < seq; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < seq; ++j) sum += std::exp(s[i * seq + j]);  // exp(-inf) = 0
        ref.lse[(b * heads + h) * seq + i] = static_cast<float>(std::log(sum));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = 0; j < seq; ++j) o += std::exp(s[i * seq + j]) / sum * kv(v, j, c);
          ref.out[((b * seq + i) * heads + h) * d + c] = static_cast<float>(o);
        }
      }
    }
  }
  return ref;
}

TEST_F(CpuOpsTest, AttentionForwardMatchesExplicitScores) {
  const int64_t batch = 2, seq = 6, d = 8;
  for (int64_t kv_heads : {4, 2, 1}) {
    const int64_t heads = 4;
    SCOPED_TRACE("kv_heads " + std::to_string(kv_heads));
    Tensor q = Random({batch, seq, heads, d}), k = Random({batch, seq, kv_heads, d});
    Tensor v = Random({batch, seq, kv_heads, d});
    Tensor out = Poisoned({batch, seq, heads, d}), lse = Poisoned({batch, heads, seq});
    ops::AttentionForward(q, k, v, out, lse);
    const AttentionReference ref =
        ReferenceAttention(ToFloats(q), ToFloats(k), ToFloats(v), batch, seq, heads, kv_heads, d);
    EXPECT_LT(RelativeError(ToFloats(out), ref.out), kTolerance);
    EXPECT_LT(RelativeError(ToFloats(lse), ref.lse), kTolerance);
  }
}

// ---------------------------------------------------------------- embedding, loss

TEST_F(CpuOpsTest, EmbeddingForwardCopiesRows) {
  const int64_t vocab = 7, h = 5, tokens = 9;
  Tensor table = Random({vocab, h}), out = Poisoned({tokens, h});
  const std::vector<int32_t> ids = RandomInts(tokens, vocab);
  ops::EmbeddingForward(Ints(ids, {tokens}), table, out);
  const std::vector<float> ht = ToFloats(table);
  std::vector<float> want;
  for (int32_t id : ids) want.insert(want.end(), &ht[id * h], &ht[id * h + h]);
  EXPECT_EQ(ToFloats(out), want);
}

TEST_F(CpuOpsTest, CrossEntropyForwardMatchesReferenceAndIgnoresNegativeTargets) {
  const int64_t tokens = 6, vocab = 11;
  Tensor logits = Random({tokens, vocab}, 3.0f);
  std::vector<int32_t> targets = RandomInts(tokens, vocab);
  targets[2] = -1;
  Tensor losses = Poisoned({tokens}), lse = Poisoned({tokens});
  ops::CrossEntropyForward(logits, Ints(targets, {tokens}), losses, lse);
  const std::vector<float> hl = ToFloats(logits);
  std::vector<float> want_loss(tokens), want_lse(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(hl[t * vocab + j]));
    want_lse[t] = static_cast<float>(std::log(sum));
    want_loss[t] =
        targets[t] < 0 ? 0.0f : static_cast<float>(std::log(sum) - hl[t * vocab + targets[t]]);
  }
  const std::vector<float> got_loss = ToFloats(losses);
  EXPECT_LT(RelativeError(got_loss, want_loss), kTolerance);
  EXPECT_LT(RelativeError(ToFloats(lse), want_lse), kTolerance);  // written for row 2 too
  EXPECT_EQ(got_loss[2], 0.0f);
}

// ---------------------------------------------------------------- routing

TEST_F(CpuOpsTest, TopKMatchesStableSortDescending) {
  const int64_t rows = 8, cols = 10, k = 3;
  // Values on a coarse grid so ties are common.
  std::vector<float> x(rows * cols);
  const std::vector<int32_t> grid = RandomInts(rows * cols, 4);
  std::transform(grid.begin(), grid.end(), x.begin(), [](int32_t g) { return 0.5f * g; });
  Tensor values = Poisoned({rows, k}), indices = Poisoned({rows, k}, DType::kI32);
  ops::TopK(Floats(x, {rows, cols}), values, indices);
  std::vector<float> want_values;
  std::vector<int32_t> want_indices;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> order(cols);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return x[r * cols + a] > x[r * cols + b]; });
    for (int64_t j = 0; j < k; ++j) {
      want_indices.push_back(order[j]);
      want_values.push_back(x[r * cols + order[j]]);
    }
  }
  EXPECT_EQ(ToFloats(values), want_values);
  EXPECT_EQ(ToInts(indices), want_indices);
}

TEST_F(CpuOpsTest, TopKTiesGoToTheLowerColumn) {
  Tensor values = Poisoned({2, 2}), indices = Poisoned({2, 2}, DType::kI32);
  ops::TopK(Floats({1, 3, 3, 2, 5, 5, 5, 5}, {2, 4}), values, indices);
  EXPECT_EQ(ToFloats(values), (std::vector<float>{3, 3, 5, 5}));
  EXPECT_EQ(ToInts(indices), (std::vector<int32_t>{1, 2, 0, 1}));
}

// The gate against its definition: probs = softmax(logits) (double reference), values and
// indices TopK's, weights = values renormalised to sum 1, or values themselves without
// renormalisation (--moe_router_pre_softmax).
TEST_F(CpuOpsTest, RouterGateRenormalisesTheTopKOrKeepsThem) {
  const int64_t tokens = 7, experts = 6, k = 3;
  const Tensor logits = Random({tokens, experts}, 2.0f);
  const std::vector<float> x = ToFloats(logits);
  for (bool renormalize : {true, false}) {
    SCOPED_TRACE(renormalize ? "renormalised" : "pre-softmax");
    Tensor probs = Poisoned({tokens, experts}), values = Poisoned({tokens, k});
    Tensor weights = Poisoned({tokens, k}), indices = Poisoned({tokens, k}, DType::kI32);
    ops::RouterGateForward(logits, renormalize, probs, values, weights, indices);
    std::vector<float> want_probs(x.size());
    for (int64_t t = 0; t < tokens; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < experts; ++e)
        sum += std::exp(static_cast<double>(x[t * experts + e]));
      for (int64_t e = 0; e < experts; ++e) {
        want_probs[t * experts + e] = static_cast<float>(std::exp(x[t * experts + e]) / sum);
      }
    }
    EXPECT_LT(RelativeError(ToFloats(probs), want_probs), kTolerance);
    Tensor want_values = Poisoned({tokens, k}), want_indices = Poisoned({tokens, k}, DType::kI32);
    ops::TopK(probs, want_values, want_indices);
    EXPECT_EQ(ToFloats(values), ToFloats(want_values));
    EXPECT_EQ(ToInts(indices), ToInts(want_indices));
    const std::vector<float> v = ToFloats(values);
    std::vector<float> want_weights = v;
    if (renormalize) {
      for (int64_t t = 0; t < tokens; ++t) {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += v[t * k + j];
        for (int64_t j = 0; j < k; ++j)
          want_weights[t * k + j] = static_cast<float>(v[t * k + j] / sum);
      }
      EXPECT_LT(RelativeError(ToFloats(weights), want_weights), kTolerance);
    } else {
      EXPECT_EQ(ToFloats(weights), want_weights);
    }
  }
}

// order and offsets of SortByKey against its definition: a stable sort by key, and bucket
// starts = the number of smaller keys.
TEST_F(CpuOpsTest, SortByKeyIsStableWithEmptyBuckets) {
  const std::vector<std::pair<std::vector<int32_t>, int64_t>> cases = {
      {RandomInts(40, 5), 8},            // keys 5..7 never occur
      {{2, 0, 2, 2, 0, 1}, 4},           // hand-made: bucket 3 empty
      {std::vector<int32_t>(13, 3), 5},  // all equal
  };
  for (const auto& [keys, num_keys] : cases) {
    const int64_t n = keys.size();
    Tensor order = Poisoned({n}, DType::kI32), offsets = Poisoned({num_keys + 1}, DType::kI32);
    ops::SortByKey(Ints(keys, {n}), num_keys, order, offsets);
    std::vector<int32_t> want_order(n);
    std::iota(want_order.begin(), want_order.end(), 0);
    std::stable_sort(want_order.begin(), want_order.end(),
                     [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
    std::vector<int32_t> want_offsets(num_keys + 1);
    for (int64_t e = 0; e <= num_keys; ++e) {
      want_offsets[e] =
          std::count_if(keys.begin(), keys.end(), [&](int32_t key) { return key < e; });
    }
    EXPECT_EQ(ToInts(order), want_order);
    EXPECT_EQ(ToInts(offsets), want_offsets);
  }
}

TEST_F(CpuOpsTest, GatherRowsAndGatherSumRowsMatchLoops) {
  const int64_t n = 7, h = 4, m = 5, k = 3;
  Tensor x = Random({n, h});
  const std::vector<float> hx = ToFloats(x);
  const std::vector<int32_t> index = RandomInts(m * k, n);

  Tensor gathered = Poisoned({m * k, h});
  ops::GatherRows(x, Ints(index, {m * k}), gathered);
  std::vector<float> want_gathered;
  for (int32_t i : index) want_gathered.insert(want_gathered.end(), &hx[i * h], &hx[i * h + h]);
  EXPECT_EQ(ToFloats(gathered), want_gathered);

  Tensor summed = Poisoned({m, h});
  ops::GatherSumRows(x, Ints(index, {m, k}), summed);
  std::vector<float> want_summed(m * h);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < h; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += hx[index[i * k + j] * h + c];
      want_summed[i * h + c] = static_cast<float>(sum);
    }
  }
  EXPECT_LT(RelativeError(ToFloats(summed), want_summed), kTolerance);
}

TEST_F(CpuOpsTest, GatherSumRowsExactlyInvertsAPermutation) {
  const int64_t n = 9, h = 3;
  Tensor x = Random({n, h});
  std::vector<int32_t> perm(n), inverse(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  for (int64_t i = 0; i < n; ++i) inverse[perm[i]] = static_cast<int32_t>(i);
  Tensor permuted = Poisoned({n, h}), restored = Poisoned({n, h});
  ops::GatherRows(x, Ints(perm, {n}), permuted);
  ops::GatherSumRows(permuted, Ints(inverse, {n, 1}), restored);
  EXPECT_EQ(ToFloats(restored), ToFloats(x));
}

// ---------------------------------------------------------------- reductions, optimizer, NaN

TEST_F(CpuOpsTest, SumAndGlobalL2NormMatchDoubleReference) {
  std::vector<Tensor> xs = {Random({37}), Random({5, 8}, 10.0f), Random({1})};
  double sum = 0, sum_sq = 0;
  for (const Tensor& x : xs) {
    for (float v : ToFloats(x)) sum_sq += static_cast<double>(v) * v;
  }
  for (float v : ToFloats(xs[1])) sum += v;
  Tensor out = Poisoned({1});
  ops::Sum(xs[1], out);
  EXPECT_LT(RelativeError(ToFloats(out), {static_cast<float>(sum)}), kTolerance);
  ops::GlobalL2Norm(xs, out);
  EXPECT_LT(RelativeError(ToFloats(out), {static_cast<float>(std::sqrt(sum_sq))}), kTolerance);
}

// Outputs start at zero here, not NaN poison, so a NaN seen is one the op produced.
TEST_F(CpuOpsTest, NaNPropagatesAndNeverPassesAComparison) {
  std::vector<float> values = testing::RandomFloats(12, rng_);
  values[5] = kNaN;  // row 1 of (3, 4)
  Tensor x = Floats(values, {3, 4});
  Tensor sum = Zeros({1}), norm = Zeros({1}), y = Zeros({3, 4}), top = Zeros({3, 1});
  Tensor indices = Poisoned({3, 1}, DType::kI32);
  ops::Sum(x, sum);
  ops::GlobalL2Norm(std::vector<Tensor>{x}, norm);
  ops::SoftmaxForward(x, y);
  ops::TopK(x, top, indices);
  EXPECT_TRUE(std::isnan(ToFloats(sum)[0]));
  EXPECT_TRUE(std::isnan(ToFloats(norm)[0]));
  EXPECT_TRUE(std::isnan(ToFloats(y)[4]));    // the row holding the NaN
  EXPECT_TRUE(std::isnan(ToFloats(top)[1]));  // NaN outranks every number
  EXPECT_EQ(ToInts(indices)[1], 1);
  // The comparison every test uses rejects NaN however close the rest is.
  EXPECT_FALSE(RelativeError({1.0f, kNaN}, {1.0f, 0.0f}) < 1e30);
}

// AdamW in double, written out from its definition.
void AdamWReference(std::vector<double>& w, std::vector<double>& m, std::vector<double>& v,
                    const std::vector<float>& grad, const ops::AdamWConfig& c) {
  for (size_t i = 0; i < w.size(); ++i) {
    const double g = static_cast<double>(c.grad_scale) * grad[i];
    m[i] = c.beta1 * m[i] + (1 - static_cast<double>(c.beta1)) * g;
    v[i] = c.beta2 * v[i] + (1 - static_cast<double>(c.beta2)) * g * g;
    const double m_hat = m[i] / (1 - std::pow(static_cast<double>(c.beta1), c.step));
    const double v_hat = v[i] / (1 - std::pow(static_cast<double>(c.beta2), c.step));
    w[i] -= c.lr * (c.weight_decay * w[i] + m_hat / (std::sqrt(v_hat) + c.eps));
  }
}

TEST_F(CpuOpsTest, AdamWTwoStepsMatchHandComputedReference) {
  const int64_t n = 10;
  ops::AdamWConfig config;
  config.lr = 0.1f;
  config.weight_decay = 0.5f;
  config.grad_scale = 0.25f;
  Tensor master = Random({n}), m = Zeros({n}), v = Zeros({n});
  Tensor model = Poisoned({n}, DType::kBF16);
  const std::vector<float> w0 = ToFloats(master);
  std::vector<double> w(w0.begin(), w0.end()), rm(n, 0.0), rv(n, 0.0);

  // Step 1 by hand: with zero moments m_hat = g and v_hat = g^2, so the step is
  // lr * (wd * w + sign(g)) up to eps.
  const std::vector<float> g1 = testing::RandomFloats(n, rng_);
  ops::AdamWUpdate(std::vector<ops::AdamWTensors>{{master, Floats(g1, {n}), m, v, model}}, config);
  std::vector<float> by_hand(n);
  for (int64_t i = 0; i < n; ++i) {
    by_hand[i] = w0[i] - config.lr * (config.weight_decay * w0[i] + (g1[i] > 0 ? 1.0f : -1.0f));
  }
  EXPECT_LT(RelativeError(ToFloats(master), by_hand), 1e-5);
  AdamWReference(w, rm, rv, g1, config);

  config.step = 2;
  const std::vector<float> g2 = testing::RandomFloats(n, rng_);
  ops::AdamWUpdate(std::vector<ops::AdamWTensors>{{master, Floats(g2, {n}), m, v, model}}, config);
  AdamWReference(w, rm, rv, g2, config);
  auto narrow = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
  EXPECT_LT(RelativeError(ToFloats(master), narrow(w)), kTolerance);
  EXPECT_LT(RelativeError(ToFloats(m), narrow(rm)), kTolerance);
  EXPECT_LT(RelativeError(ToFloats(v), narrow(rv)), kTolerance);
  // The bf16 model copy is the new master, rounded.
  std::vector<float> rounded = ToFloats(master);
  for (float& x : rounded) x = BFloat16ToFloat(FloatToBFloat16(x));
  EXPECT_EQ(ToFloats(model), rounded);
}

// bf16 moments: the update reads them widened and does the f32 moments' arithmetic, so from the
// same (bf16-representable) state the masters come out bit-identical to an f32-moment update and
// the stored moments are that update's moments rounded to bf16; mixed dtypes likewise.
TEST_F(CpuOpsTest, AdamWBf16MomentsStoreTheF32UpdatesMomentsRounded) {
  const int64_t n = 1000;
  ops::AdamWConfig config;
  config.lr = 0.01f;
  config.weight_decay = 0.1f;
  config.step = 4;
  const Tensor grad = Random({n});
  const auto bf16_values = [&](float scale) {  // f32 values that bf16 holds exactly
    Tensor narrow = Tensor::Empty({n}, DType::kBF16, Device::CPU());
    ops::Cast(Random({n}, scale), narrow);
    std::vector<float> values = ToFloats(narrow);
    return values;
  };
  const std::vector<float> w0 = bf16_values(1.0f), m0 = bf16_values(0.1f);
  std::vector<float> v0 = bf16_values(0.1f);
  for (float& x : v0) x = BFloat16ToFloat(FloatToBFloat16(x * x));
  const auto run = [&](DType m_dtype, DType v_dtype) {
    ops::AdamWTensors e{Floats(w0, {n}), grad, testing::FromFloats(m0, {n}, m_dtype, Device::CPU()),
                        testing::FromFloats(v0, {n}, v_dtype, Device::CPU()), Tensor()};
    ops::AdamWUpdate(std::vector<ops::AdamWTensors>{e}, config);
    return e;
  };
  const ops::AdamWTensors f32 = run(DType::kF32, DType::kF32);
  const auto rounded = [](const Tensor& t) {
    std::vector<float> values = ToFloats(t);
    for (float& x : values) x = BFloat16ToFloat(FloatToBFloat16(x));
    return values;
  };
  for (const auto& [m_dtype, v_dtype] :
       {std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kBF16, DType::kF32},
        std::pair{DType::kF32, DType::kBF16}}) {
    const ops::AdamWTensors e = run(m_dtype, v_dtype);
    EXPECT_EQ(e.m.dtype(), m_dtype);
    EXPECT_EQ(e.v.dtype(), v_dtype);
    EXPECT_EQ(ToFloats(e.master), ToFloats(f32.master));
    EXPECT_EQ(ToFloats(e.m), m_dtype == DType::kBF16 ? rounded(f32.m) : ToFloats(f32.m));
    EXPECT_EQ(ToFloats(e.v), v_dtype == DType::kBF16 ? rounded(f32.v) : ToFloats(f32.v));
  }
  EXPECT_NE(rounded(f32.m), ToFloats(f32.m));  // the rounding was real
}

// bf16 gradients (--main_grads_dtype=bf16): every op that writes a gradient takes a bf16 output
// and writes the f32 result rounded once: from a bf16-representable starting value, bit for bit
// the f32 output's result rounded to nearest even, for = and +=. The norm and AdamW read bf16
// gradients widened: the same results as the widened values in f32.
TEST_F(CpuOpsTest, Bf16GradientsAreTheF32ResultRoundedOnce) {
  const auto rounded = [](std::vector<float> values) {
    for (float& x : values) x = BFloat16ToFloat(FloatToBFloat16(x));
    return values;
  };
  // Runs write(out) on an f32 and a bf16 output that start from the same bf16-representable values.
  const auto expect_rounded_once = [&](const std::string& what, const Shape& shape,
                                       const std::function<void(const Tensor&)>& write) {
    SCOPED_TRACE(what);
    const std::vector<float> start = rounded(ToFloats(Random(shape)));
    const Tensor f32 = FromFloats(start, shape, DType::kF32, device_);
    const Tensor bf16 = FromFloats(start, shape, DType::kBF16, device_);
    write(f32);
    write(bf16);
    EXPECT_EQ(bf16.dtype(), DType::kBF16);
    EXPECT_EQ(ToFloats(bf16), rounded(ToFloats(f32)));
    EXPECT_NE(rounded(ToFloats(f32)), ToFloats(f32)) << "nothing needed rounding";
  };
  const int64_t k = 5, n = 4, rows = 9, vocab = 6;
  const Tensor a = Random({rows, n}), b = Random({rows, k});
  for (const float beta : {0.0f, 1.0f}) {
    expect_rounded_once("matmul beta " + std::to_string(beta), {n, k}, [&](const Tensor& out) {
      ops::Matmul(a, b, out, /*transpose_a=*/true, /*transpose_b=*/false, beta);
    });
  }
  const Tensor dy = Random({kGroupedRows, n}), x = Random({kGroupedRows, k});
  for (const bool accumulate : {true, false}) {
    expect_rounded_once(accumulate ? "grouped +=" : "grouped =", {kGroups, n, k},
                        [&](const Tensor& dw) {
                          ops::GroupedMatmulWeightGrad(dy, x, Ints(kGroupOffsets, {kGroups + 1}),
                                                       {}, dw, accumulate);
                        });
  }
  const Tensor norm_x = Random({rows, k}), norm_dy = Random({rows, k}), weight = Random({k});
  const Tensor rstd = Poisoned({rows}), norm_y = Poisoned({rows, k}), dx = Poisoned({rows, k});
  ops::RmsNormForward(norm_x, weight, 1e-5f, norm_y, rstd);
  expect_rounded_once("rmsnorm dweight", {k}, [&](const Tensor& dweight) {
    ops::RmsNormBackward(norm_dy, norm_x, weight, rstd, dx, dweight);
  });
  const Tensor ids = Ints(RandomInts(rows, vocab), {rows});
  expect_rounded_once("embedding dtable", {vocab, k},
                      [&](const Tensor& dtable) { ops::EmbeddingBackward(ids, b, dtable); });

  const std::vector<float> g = rounded(ToFloats(Random({1000})));
  const Tensor g32 = FromFloats(g, {1000}, DType::kF32, device_);
  const Tensor g16 = FromFloats(g, {1000}, DType::kBF16, device_);
  Tensor norm32 = Poisoned({1}), norm16 = Poisoned({1});
  ops::GlobalL2Norm(std::vector<Tensor>{g32}, norm32);
  ops::GlobalL2Norm(std::vector<Tensor>{g16}, norm16);
  EXPECT_EQ(ToFloats(norm16), ToFloats(norm32));
  ops::AdamWConfig config;
  config.lr = 0.01f;
  config.step = 2;
  const std::vector<float> w0 = ToFloats(Random({1000}));
  const auto updated_master = [&](const Tensor& grad) {
    const ops::AdamWTensors e{Floats(w0, {1000}), grad, Zeros({1000}), Zeros({1000}), Tensor()};
    ops::AdamWUpdate(std::vector<ops::AdamWTensors>{e}, config);
    return ToFloats(e.master);
  };
  EXPECT_EQ(updated_master(g16), updated_master(g32));
}

}  // namespace
}  // namespace moe
