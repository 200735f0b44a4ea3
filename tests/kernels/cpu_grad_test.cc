// Every backward op of the CPU backend against central finite differences (grad_check.h) of a
// scalar loss L = sum(forward output * R), R random: the backward op gets dout = R, and each
// input's analytic gradient must match the numeric one to kGradTolerance (1e-3) in relative
// error over up to 48 sampled elements (GradCheckOptions' eps) on inputs of scale ~1. Outputs
// written with = are poisoned first; outputs accumulated with += start from random values and the
// increment is what is checked, so an op that overwrites fails. Fresh random inputs each run
// (seed in the failure trace, MOE_TEST_SEED repeats it).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "engine/kernels/ops.h"
#include "tests/testing/grad_check.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::RelativeError;
using testing::ToFloats;
using testing::WeightedSum;

class CpuGradTest : public testing::OpTest {
 protected:
  // Elementwise after - before: what a += output received.
  static std::vector<float> Increment(const Tensor& after, const std::vector<float>& before) {
    std::vector<float> out = ToFloats(after);
    for (size_t i = 0; i < out.size(); ++i) out[i] -= before[i];
    return out;
  }
};

TEST_F(CpuGradTest, MatmulGradientsAreTransposedMatmuls) {
  const int64_t m = 5, k = 4, n = 6;
  for (int64_t batches : {0, 3}) {  // 0: plain 2-D
    SCOPED_TRACE("batches " + std::to_string(batches));
    auto shape = [&](int64_t rows, int64_t cols) {
      return batches ? Shape{batches, rows, cols} : Shape{rows, cols};
    };
    Tensor a = Random(shape(m, k)), b = Random(shape(k, n)), dout = Random(shape(m, n));
    Tensor out = Poisoned(shape(m, n));
    const std::vector<float> r = ToFloats(dout);
    auto loss = [&] {
      ops::Matmul(a, b, out, false, false);
      return WeightedSum(out, r);
    };
    Tensor da = Poisoned(shape(m, k)), db = Poisoned(shape(k, n));
    ops::Matmul(dout, b, da, false, true);  // da = dout b^T
    ops::Matmul(a, dout, db, true, false);  // db = a^T dout
    ExpectGradient("da", a, ToFloats(da), loss);
    ExpectGradient("db", b, ToFloats(db), loss);
  }
}

TEST_F(CpuGradTest, GroupedMatmulGradientsAreGroupedMatmuls) {
  // 4 groups over 9 rows, one of them empty.
  const int64_t rows = 9, groups = 4, k = 4, n = 6;
  const Tensor offsets = Ints({0, 4, 4, 5, 9}, {groups + 1});
  for (bool transpose_w : {false, true}) {
    SCOPED_TRACE(transpose_w ? "y = x w^T" : "y = x w");
    const Shape w_shape = transpose_w ? Shape{groups, n, k} : Shape{groups, k, n};
    Tensor x = Random({rows, k}), w = Random(w_shape), dy = Random({rows, n});
    Tensor y = Poisoned({rows, n});
    const std::vector<float> r = ToFloats(dy);
    auto loss = [&] {
      ops::GroupedMatmul(x, w, offsets, {}, y, transpose_w);
      return WeightedSum(y, r);
    };
    // dx = dy op(w_g)^T; dw_g += dy_g^T x_g for (n, k) matrices, x_g^T dy_g for (k, n) ones.
    Tensor dx = Poisoned({rows, k}), dw = Random(w_shape);
    const std::vector<float> dw_before = ToFloats(dw);
    ops::GroupedMatmul(dy, w, offsets, {}, dx, !transpose_w);
    if (transpose_w) {
      ops::GroupedMatmulWeightGrad(dy, x, offsets, {}, dw, /*accumulate=*/true);
    } else {
      ops::GroupedMatmulWeightGrad(x, dy, offsets, {}, dw, /*accumulate=*/true);
    }
    ExpectGradient("dx", x, ToFloats(dx), loss);
    ExpectGradient("dw increment", w, Increment(dw, dw_before), loss);
  }
}

TEST_F(CpuGradTest, RmsNormDxAndAccumulatedDweight) {
  const int64_t rows = 6, h = 16;
  const float eps = 1e-5f;
  Tensor x = Random({rows, h}), w = Random({h}), dy = Random({rows, h});
  Tensor y = Poisoned({rows, h}), rstd = Poisoned({rows});
  const std::vector<float> r = ToFloats(dy);
  auto loss = [&] {
    ops::RmsNormForward(x, w, eps, y, rstd);
    return WeightedSum(y, r);
  };
  loss();
  Tensor dx = Poisoned({rows, h}), dw = Random({h});
  const std::vector<float> dw_before = ToFloats(dw);
  ops::RmsNormBackward(dy, x, w, rstd, dx, dw);
  ExpectGradient("dx", x, ToFloats(dx), loss);
  ExpectGradient("dweight increment", w, Increment(dw, dw_before), loss);

  // A residual gradient is added to dx, also in place; dweight is as without it.
  const Tensor residual = Random({rows, h});
  const std::vector<float> residual_values = ToFloats(residual);
  Tensor dx_plus = Poisoned({rows, h}), dw_plus = Random({h});
  const std::vector<float> dw_plus_before = ToFloats(dw_plus);
  ops::RmsNormBackward(dy, x, w, rstd, dx_plus, dw_plus, residual);
  ops::RmsNormBackward(dy, x, w, rstd, residual, dw_plus, residual);
  const std::vector<float> dx_values = ToFloats(dx), dx_plus_values = ToFloats(dx_plus);
  const std::vector<float> in_place = ToFloats(residual);
  for (size_t i = 0; i < dx_values.size(); ++i) {
    EXPECT_EQ(dx_plus_values[i], dx_values[i] + residual_values[i]) << i;
    EXPECT_EQ(in_place[i], dx_values[i] + residual_values[i]) << i;
  }
  const std::vector<float> increments = Increment(dw_plus, dw_plus_before);
  const std::vector<float> expected = Increment(dw, dw_before);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(increments[i], 2 * expected[i], 1e-5f);
}

TEST_F(CpuGradTest, Softmax) {
  const int64_t rows = 4, cols = 7;
  Tensor x = Random({rows, cols}, 2.0f), dy = Random({rows, cols}), y = Poisoned({rows, cols});
  const std::vector<float> r = ToFloats(dy);
  auto loss = [&] {
    ops::SoftmaxForward(x, y);
    return WeightedSum(y, r);
  };
  loss();
  Tensor dx = Poisoned({rows, cols});
  ops::SoftmaxBackward(dy, y, dx);
  ExpectGradient("dx", x, ToFloats(dx), loss);
}

TEST_F(CpuGradTest, Silu) {
  Tensor x = Random({5, 9}, 2.0f), dy = Random({5, 9}), y = Poisoned({5, 9});
  const std::vector<float> r = ToFloats(dy);
  auto loss = [&] {
    ops::SiluForward(x, y);
    return WeightedSum(y, r);
  };
  Tensor dx = Poisoned({5, 9});
  ops::SiluBackward(dy, x, dx);
  ExpectGradient("dx", x, ToFloats(dx), loss);
}

TEST_F(CpuGradTest, SwigluWithAndWithoutScale) {
  const int64_t rows = 5, f = 6;
  for (bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "scaled" : "unscaled");
    Tensor x = Random({rows, 2 * f}, 1.5f), dy = Random({rows, f}), y = Poisoned({rows, f});
    Tensor scale = scaled ? Random({rows}) : Tensor();
    const std::vector<float> r = ToFloats(dy);
    auto loss = [&] {
      ops::SwigluForward(x, scale, y);
      return WeightedSum(y, r);
    };
    Tensor dx = Poisoned({rows, 2 * f});
    Tensor dscale = scaled ? Poisoned({rows}) : Tensor();
    ops::SwigluBackward(dy, x, scale, dx, dscale);
    ExpectGradient("dx", x, ToFloats(dx), loss);
    if (scaled) ExpectGradient("dscale", scale, ToFloats(dscale), loss);
  }
}

TEST_F(CpuGradTest, RopeQkvBackwardIsTheGradientAndTheInverse) {
  const int64_t seq = 4, tokens = 2 * seq, heads = 2, kv_heads = 1, d = 8;
  const float base = 100.0f;  // large angles within a short sequence
  const Shape qkv_shape = {tokens, (heads + 2 * kv_heads) * d};
  const Shape q_shape = {tokens, heads, d}, kv_shape = {tokens, kv_heads, d};
  Tensor qkv = Random(qkv_shape), q = Poisoned(q_shape), k = Poisoned(kv_shape),
         v = Poisoned(kv_shape);
  Tensor dq = Random(q_shape), dk = Random(kv_shape), dv = Random(kv_shape);
  Tensor table = Poisoned({seq, d / 2, 2});
  ops::RopeTable(base, table);
  const std::vector<float> rq = ToFloats(dq), rk = ToFloats(dk), rv = ToFloats(dv);
  auto loss = [&] {
    ops::RopeQkvForward(qkv, table, q, k, v);
    return WeightedSum(q, rq) + WeightedSum(k, rk) + WeightedSum(v, rv);
  };
  Tensor dqkv = Poisoned(qkv_shape);
  ops::RopeQkvBackward(dq, dk, dv, table, dqkv);
  ExpectGradient("dqkv", qkv, ToFloats(dqkv), loss);

  loss();
  Tensor back = Poisoned(qkv_shape);
  ops::RopeQkvBackward(q, k, v, table, back);
  EXPECT_LT(RelativeError(ToFloats(back), ToFloats(qkv)), 1e-6);
}

TEST_F(CpuGradTest, RopeBackwardIsTheGradientAndTheInverse) {
  const int64_t seq = 3, tokens = 2 * seq, heads = 2, d = 6;
  Tensor table = Poisoned({seq, d / 2, 2});
  ops::RopeTable(100.0f, table);
  Tensor x = Random({tokens, heads, d}), dy = Random({tokens, heads, d});
  Tensor y = Poisoned({tokens, heads, d});
  const std::vector<float> r = ToFloats(dy);
  auto loss = [&] {
    ops::RopeForward(x, table, y);
    return WeightedSum(y, r);
  };
  Tensor dx = Poisoned({tokens, heads, d});
  ops::RopeBackward(dy, table, dx);
  ExpectGradient("dx", x, ToFloats(dx), loss);

  loss();
  ops::RopeBackward(y, table, y);  // in place
  EXPECT_LT(RelativeError(ToFloats(y), ToFloats(x)), 1e-6);
}

TEST_F(CpuGradTest, AttentionWithGroupedKvHeads) {
  const int64_t batch = 2, seq = 5, heads = 4, kv_heads = 2, d = 8;
  const Shape q_shape = {batch, seq, heads, d}, kv_shape = {batch, seq, kv_heads, d};
  Tensor q = Random(q_shape), k = Random(kv_shape), v = Random(kv_shape), dout = Random(q_shape);
  Tensor out = Poisoned(q_shape), lse = Poisoned({batch, heads, seq});
  const std::vector<float> r = ToFloats(dout);
  auto loss = [&] {
    ops::AttentionForward(q, k, v, out, lse);
    return WeightedSum(out, r);
  };
  loss();
  Tensor dq = Poisoned(q_shape), dk = Poisoned(kv_shape), dv = Poisoned(kv_shape);
  ops::AttentionBackward(dout, q, k, v, out, lse, dq, dk, dv);
  ExpectGradient("dq", q, ToFloats(dq), loss);
  ExpectGradient("dk", k, ToFloats(dk), loss);
  ExpectGradient("dv", v, ToFloats(dv), loss);
}

TEST_F(CpuGradTest, EmbeddingAccumulatesRepeatedIds) {
  const int64_t vocab = 4, h = 5, tokens = 10;
  std::vector<int32_t> id_values = RandomInts(tokens, vocab);
  id_values[1] = id_values[0];  // a repeat for sure
  Tensor ids = Ints(id_values, {tokens}), table = Random({vocab, h}), dout = Random({tokens, h});
  Tensor out = Poisoned({tokens, h});
  const std::vector<float> r = ToFloats(dout);
  auto loss = [&] {
    ops::EmbeddingForward(ids, table, out);
    return WeightedSum(out, r);
  };
  Tensor dtable = Random({vocab, h});
  const std::vector<float> before = ToFloats(dtable);
  ops::EmbeddingBackward(ids, dout, dtable);
  ExpectGradient("dtable increment", table, Increment(dtable, before), loss);
}

TEST_F(CpuGradTest, CrossEntropyWithAnIgnoredTarget) {
  const int64_t tokens = 5, vocab = 7;
  const float grad_scale = 0.37f;
  std::vector<int32_t> target_values = RandomInts(tokens, vocab);
  target_values[1] = -1;
  Tensor logits = Random({tokens, vocab}, 2.0f), targets = Ints(target_values, {tokens});
  Tensor losses = Poisoned({tokens}), lse = Poisoned({tokens});
  // L = grad_scale * sum(losses): the loss the backward's grad_scale belongs to.
  auto loss = [&] {
    ops::CrossEntropyForward(logits, targets, losses, lse);
    return WeightedSum(losses, std::vector<float>(tokens, grad_scale));
  };
  loss();
  Tensor dlogits = Poisoned({tokens, vocab});
  ops::CrossEntropyBackward(logits, targets, lse, grad_scale, dlogits);
  const std::vector<float> got = ToFloats(dlogits);
  // In place (dlogits aliasing logits, as the chunked LM head runs it): the same values.
  Tensor in_place = Floats(ToFloats(logits), {tokens, vocab});
  ops::CrossEntropyBackward(in_place, targets, lse, grad_scale, /*dlogits=*/in_place);
  EXPECT_EQ(ToFloats(in_place), got);
  ExpectGradient("dlogits", logits, got, loss);  // (rewrites lse)
  EXPECT_EQ(std::vector<float>(got.begin() + vocab, got.begin() + 2 * vocab),
            std::vector<float>(vocab, 0.0f));
}

TEST_F(CpuGradTest, TopKBackwardScattersToTheChosenColumns) {
  const int64_t rows = 4, cols = 8, k = 3;
  // Distinct values 0.1 apart: a perturbation of GradCheckOptions' eps never changes the
  // selection.
  std::vector<float> values(rows * cols);
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<int> rank(cols);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), rng_);
    for (int64_t c = 0; c < cols; ++c) values[row * cols + c] = 0.1f * rank[c];
  }
  Tensor x = Floats(values, {rows, cols});
  Tensor dvalues = Random({rows, k});
  Tensor top = Poisoned({rows, k}), indices = Poisoned({rows, k}, DType::kI32);
  const std::vector<float> r = ToFloats(dvalues);
  auto loss = [&] {
    ops::TopK(x, top, indices);
    return WeightedSum(top, r);
  };
  loss();
  Tensor dx = Poisoned({rows, cols});
  ops::TopKBackward(dvalues, indices, dx);
  ExpectGradient("dx", x, ToFloats(dx), loss);
}

// The gate's backward, renormalised and not (pre-softmax), is the gradient of sum(weights * R)
// plus balance_grad times the load-balancing loss at the forward's routing (its counts fixed).
// The logits are a shuffled ladder 0.1 apart, so a perturbation never changes the top k.
TEST_F(CpuGradTest, RouterGateBackwardWithAndWithoutRenormalisation) {
  const int64_t tokens = 5, experts = 6, k = 2;
  const float balance_grad = 0.3f;
  std::vector<float> ladder(tokens * experts);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int> rank(experts);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), rng_);
    for (int64_t e = 0; e < experts; ++e) ladder[t * experts + e] = 0.1f * rank[e] - 0.3f;
  }
  Tensor logits = Floats(ladder, {tokens, experts}), dweights = Random({tokens, k});
  const std::vector<float> r = ToFloats(dweights);
  for (bool renormalize : {true, false}) {
    SCOPED_TRACE(renormalize ? "renormalised" : "pre-softmax");
    Tensor probs = Poisoned({tokens, experts}), values = Poisoned({tokens, k});
    Tensor weights = Poisoned({tokens, k}), indices = Poisoned({tokens, k}, DType::kI32);
    ops::RouterGateForward(logits, renormalize, probs, values, weights, indices);
    Tensor order = Poisoned({tokens * k}, DType::kI32),
           offsets = Poisoned({experts + 1}, DType::kI32);
    ops::SortByKey(indices.View({tokens * k}), experts, order, offsets);
    Tensor balance = Poisoned({1});
    auto loss = [&] {
      ops::RouterGateForward(logits, renormalize, probs, values, weights, indices);
      ops::LoadBalancingLossForward(probs, offsets, k, balance);
      return WeightedSum(weights, r) + balance_grad * ToFloats(balance)[0];
    };
    Tensor dlogits = Poisoned({tokens, experts});
    ops::RouterGateBackward(dweights, values, indices, probs, offsets, balance_grad, renormalize,
                            dlogits);
    ExpectGradient("dlogits", logits, ToFloats(dlogits), loss);
  }
}

TEST_F(CpuGradTest, GatherRowsAndGatherSumRowsAreEachOthersAdjoint) {
  const int64_t n = 6, h = 3, copies = 2;
  // Each of n rows gathered `copies` times, in shuffled order.
  std::vector<int32_t> index(n * copies);
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int32_t>(i % n);
  std::shuffle(index.begin(), index.end(), rng_);
  std::vector<int32_t> sources;  // (n, copies): where row r went
  for (int32_t row = 0; row < n; ++row) {
    for (size_t i = 0; i < index.size(); ++i) {
      if (index[i] == row) sources.push_back(static_cast<int32_t>(i));
    }
  }
  {
    SCOPED_TRACE("gather, backward by gather-sum");
    Tensor x = Random({n, h}), dout = Random({n * copies, h}), out = Poisoned({n * copies, h});
    const std::vector<float> r = ToFloats(dout);
    auto loss = [&] {
      ops::GatherRows(x, Ints(index, {n * copies}), out);
      return WeightedSum(out, r);
    };
    Tensor dx = Poisoned({n, h});
    ops::GatherSumRows(dout, Ints(sources, {n, copies}), dx);
    ExpectGradient("dx", x, ToFloats(dx), loss);
  }
  {
    SCOPED_TRACE("gather-sum, backward by gather");
    // out[r] = sum of x rows sources[r, :]; each x row feeds exactly one output row, index[i].
    Tensor x = Random({n * copies, h}), dout = Random({n, h}), out = Poisoned({n, h});
    const std::vector<float> r = ToFloats(dout);
    auto loss = [&] {
      ops::GatherSumRows(x, Ints(sources, {n, copies}), out);
      return WeightedSum(out, r);
    };
    Tensor dx = Poisoned({n * copies, h});
    ops::GatherRows(dout, Ints(index, {n * copies}), dx);
    ExpectGradient("dx", x, ToFloats(dx), loss);
  }
}

}  // namespace
}  // namespace moe
