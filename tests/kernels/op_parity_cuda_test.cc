// The op harness: every op runs on the CPU reference and on CUDA from the same fresh random
// inputs, with every output poisoned first, and each output (values and gradients) is compared
// by relative error ||cuda - cpu|| / ||cpu||: about 1e-5 when CUDA computes in f32, about 1e-2
// when it stores bf16 (then the CPU gets the same bf16-rounded inputs, in f32). NaN never passes.
// At the end the largest error seen per op and dtype is printed as a table.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>

#include "engine/core/cuda_check.h"
#include "engine/kernels/cuda/attention/attention_sm90.h"
#include "engine/kernels/cuda/grouped_gemm/grouped_matmul_sm90.h"
#include "engine/kernels/fp8_scaling.h"
#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::FromFloats;
using testing::FromInts;
using testing::PoisonedTensor;
using testing::RandomFloats;

using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;

// While it lives, the fused SwiGLU backward kernel takes every k: the tests' k lie below
// cuda::kFusedSwigluBackwardMinK, where the op would otherwise run its two ops.
struct SwigluBackwardFusedAtAnyK {
  SwigluBackwardFusedAtAnyK() { cuda::FuseSwigluBackwardAtAnyK(true); }
  ~SwigluBackwardFusedAtAnyK() { cuda::FuseSwigluBackwardAtAnyK(false); }
};

// Inputs for one run of a case: the same seed gives the same values on every device. Float
// tensors are `dtype` on CUDA and f32 on the CPU, holding values already rounded to `dtype`.
class OpRun {
 public:
  OpRun(Device device, DType dtype, uint32_t seed) : device_(device), dtype_(dtype), rng_(seed) {}

  Device device() const { return device_; }
  // A float tensor in the run's dtype (f32 on the CPU, holding the same rounded values).
  Tensor In(const Shape& shape, float scale = 1.0f) {
    return Make(shape, scale, storage_dtype(), /*round_to_run_dtype=*/true);
  }
  // Always f32 (routing probabilities, statistics, optimizer state).
  Tensor InF32(const Shape& shape, float scale = 1.0f) {
    return Make(shape, scale, DType::kF32, /*round_to_run_dtype=*/false);
  }
  // A gradient as --main_grads_dtype=bf16 keeps it in bf16 runs: the run's dtype on every device
  // (the CPU writes bf16 gradients too, rounding its f32 results).
  Tensor InGrad(const Shape& shape) {
    return Make(shape, 1.0f, dtype_, /*round_to_run_dtype=*/true);
  }
  Tensor OutGrad(const Shape& shape) { return PoisonedTensor(shape, dtype_, device_); }
  Tensor Ints(const std::vector<int32_t>& values, const Shape& shape) {
    return FromInts(values, shape, device_);
  }
  Tensor F32(const std::vector<float>& values, const Shape& shape) {
    return FromFloats(values, shape, DType::kF32, device_);
  }
  std::vector<int32_t> RandomInts(int64_t n, int32_t bound) {
    std::uniform_int_distribution<int32_t> uniform(0, bound - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = uniform(rng_);
    return v;
  }
  Tensor Out(const Shape& shape) { return PoisonedTensor(shape, storage_dtype(), device_); }
  Tensor OutF32(const Shape& shape) { return PoisonedTensor(shape, DType::kF32, device_); }
  Tensor OutI32(const Shape& shape) { return PoisonedTensor(shape, DType::kI32, device_); }
  Tensor OutE4M3(const Shape& shape) { return PoisonedTensor(shape, DType::kE4M3, device_); }

  void Read(const std::string& name, const Tensor& t) {
    if (t.dtype() == DType::kI32) {
      std::vector<int32_t> ints = testing::ToInts(t);
      outputs_.emplace_back(name, std::vector<float>(ints.begin(), ints.end()));
    } else {
      outputs_.emplace_back(name, testing::ToFloats(t));
    }
  }
  Outputs TakeOutputs() { return std::move(outputs_); }

 private:
  DType storage_dtype() const { return device_.is_cuda() ? dtype_ : DType::kF32; }
  Tensor Make(const Shape& shape, float scale, DType storage, bool round_to_run_dtype) {
    std::vector<float> values = RandomFloats(NumElements(shape), rng_, scale);
    if (dtype_ == DType::kBF16 && round_to_run_dtype) {
      for (float& v : values) v = BFloat16ToFloat(FloatToBFloat16(v));
    }
    return FromFloats(values, shape, storage, device_);
  }

  Device device_;
  DType dtype_;
  std::mt19937 rng_;
  Outputs outputs_;
};

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, d;
};

// Causal attention forward and backward on fresh inputs of shape `s`; reads out, lse, dq, dk, dv.
void RunAttention(OpRun& r, const AttentionShape& s) {
  Tensor q = r.In({s.batch, s.seq, s.heads, s.d});
  Tensor k = r.In({s.batch, s.seq, s.kv_heads, s.d});
  Tensor v = r.In({s.batch, s.seq, s.kv_heads, s.d});
  Tensor dout = r.In({s.batch, s.seq, s.heads, s.d});
  Tensor out = r.Out(q.shape()), lse = r.OutF32({s.batch, s.heads, s.seq});
  ops::AttentionForward(q, k, v, out, lse);
  Tensor dq = r.Out(q.shape()), dk = r.Out(k.shape()), dv = r.Out(v.shape());
  ops::AttentionBackward(dout, q, k, v, out, lse, dq, dk, dv);
  r.Read("out", out);
  r.Read("lse", lse);
  r.Read("dq", dq);
  r.Read("dk", dk);
  r.Read("dv", dv);
}

struct OpCase {
  std::string name;
  std::function<void(OpRun&)> body;
  double f32_tolerance = 1e-5;
  double bf16_tolerance = 1e-2;
};

// `offsets` as host offsets where the grouped GEMMs with weights like w need them on r's device,
// else empty: on a Hopper GPU the bf16 runs then take the sm90 kernels (or fail).
std::span<const int32_t> HostOffsetsWhereNeeded(const OpRun& r, const std::vector<int32_t>& offsets,
                                                const Tensor& w) {
  return ops::GroupedMatmulNeedsHostOffsets(r.device(), w.dtype(), w.shape())
             ? std::span<const int32_t>(offsets)
             : std::span<const int32_t>();
}

// The router's gate forward and backward on `experts` columns, top k. The logits of a row are a
// shuffled ladder (steps of 0.05), so no two probabilities lie within rounding of each other and
// both devices pick the same experts.
void RunRouterGate(OpRun& r, int64_t experts, int64_t k, bool renormalize) {
  const int64_t tokens = 333;
  std::vector<float> ladder(tokens * experts);
  const std::vector<int32_t> shuffle = r.RandomInts(tokens * experts, 1 << 30);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> rank(experts);
    std::iota(rank.begin(), rank.end(), 0);
    std::sort(rank.begin(), rank.end(), [&](int32_t a, int32_t b) {
      return shuffle[t * experts + a] < shuffle[t * experts + b];
    });
    for (int64_t c = 0; c < experts; ++c) ladder[t * experts + c] = 0.05f * rank[c] - 3.0f;
  }
  Tensor logits = r.F32(ladder, {tokens, experts}), probs = r.OutF32({tokens, experts});
  Tensor values = r.OutF32({tokens, k}), weights = r.OutF32({tokens, k});
  Tensor indices = r.OutI32({tokens, k});
  ops::RouterGateForward(logits, renormalize, probs, values, weights, indices);
  Tensor order = r.OutI32({tokens * k}), offsets = r.OutI32({experts + 1});
  ops::SortByKey(indices.View({tokens * k}), experts, order, offsets);
  Tensor dlogits = r.Out({tokens, experts});
  ops::RouterGateBackward(r.InF32({tokens, k}), values, indices, probs, offsets, 0.3f, renormalize,
                          dlogits);
  r.Read("probs", probs);
  r.Read("values", values);
  r.Read("weights", weights);
  r.Read("indices", indices);
  r.Read("dlogits", dlogits);
}

// The RoPE cases' tensors: 2 sequences of 300 tokens, 6 query heads and `kv_heads` of head dim d;
// the table (its base differs with d), packed qkv and split q, k, v, and their gradients.
struct RopeTensors {
  static constexpr int64_t kSeq = 300, kHeads = 6, kTokens = 2 * kSeq;
  RopeTensors(OpRun& r, int64_t d, int64_t kv_heads)
      : table(Table(r, d)),
        qkv(r.In({kTokens, (kHeads + 2 * kv_heads) * d})),
        q(r.Out({kTokens, kHeads, d})),
        k(r.Out({kTokens, kv_heads, d})),
        v(r.Out({kTokens, kv_heads, d})),
        dq(r.In(q.shape())),
        dk(r.In(k.shape())),
        dv(r.In(k.shape())),
        dqkv(r.Out(qkv.shape())) {}
  static Tensor Table(OpRun& r, int64_t d) {
    Tensor table = r.OutF32({kSeq, d / 2, 2});
    ops::RopeTable(d == 64 ? 10000.0f : 500000.0f, table);
    return table;
  }
  Tensor table, qkv, q, k, v, dq, dk, dv, dqkv;
};

// An activation x (77, 300) and stacked weights w (3, 200, 300) quantised in FP8 tiles and blocks
// (k and n off multiples of 128; the blocks also transposed), with tiles that test the scale rule:
// a row of zeros, one of negative zeros, an outlier, a row scaled by 2^10 and one by 2^-70 (below
// the amax floor), a zero block and an outlier in a partial block; each exact in bf16, so every
// device quantises the same values.
struct Fp8Operands {
  explicit Fp8Operands(OpRun& r)
      : xq(r.OutE4M3({77, 300})),
        x_scales(r.OutF32({77, 3})),
        wq(r.OutE4M3({3, 200, 300})),
        w_scales(r.OutF32({3, 2, 3})),
        wq_t(r.OutE4M3({3, 300, 200})),
        w_scales_t(r.OutF32({3, 3, 2})) {
    const Tensor x = r.In(xq.shape()), w = r.In(wq.shape());
    const Tensor x_flat = x.View({x.numel()}), w_flat = w.View({w.numel()});
    ops::Fill(x.Rows(3, 4), 0.0f);
    ops::Fill(x.Rows(4, 5), -0.0f);
    ops::Fill(x_flat.Rows(5 * 300 + 140, 5 * 300 + 141), -16384.0f);
    ops::Scale(x.Rows(6, 7), std::ldexp(1.0f, 10), x.Rows(6, 7));
    ops::Scale(x.Rows(7, 8), std::ldexp(1.0f, -70), x.Rows(7, 8));
    ops::Fill(w.Rows(1, 2).View({200, 300}).Rows(0, 128), 0.0f);
    const int64_t outlier = (2 * 200 + 129) * 300 + 7;
    ops::Fill(w_flat.Rows(outlier, outlier + 1), 16384.0f);
    ops::QuantizeRowTiles(x, xq, x_scales);
    ops::QuantizeBlocks(w, wq, w_scales, wq_t, w_scales_t);
  }
  Tensor xq, x_scales, wq, w_scales, wq_t, w_scales_t;  // _t: QuantizeBlocks' transposed
};

// Grouped rows x (rows, k) quantised by QuantizeColumnTiles, with the row tiles or without. The
// offsets hold at least 300 rows; x has a row of negative zeros (row 0), rows 1 .. 127 scaled by
// 2^-70 (below the amax floor), a zero row (130), a row scaled by 2^10 (200) and outliers in the
// first and the last column (rows 260 and 299), each exact in bf16.
struct Fp8ColumnTileCase {
  std::string name;
  std::vector<int32_t> offsets;
  int64_t k;
  bool row_tiles;
  bool through_index = false;  // the grouped rows are x's rows (7 r + 3) mod rows, read in place
};
struct Fp8ColumnTileOperands {
  Fp8ColumnTileOperands(OpRun& r, const Fp8ColumnTileCase& c)
      : groups(static_cast<int64_t>(c.offsets.size()) - 1),
        rows(c.offsets.back()),
        offsets(c.offsets),
        q(r.OutE4M3({c.k, Fp8ColumnTokens(groups, rows)})),
        scales(r.OutF32({Fp8ColumnTileSlots(groups, rows), c.k})),
        row_q(c.row_tiles ? r.OutE4M3({rows, c.k}) : Tensor()),
        row_scales(c.row_tiles ? r.OutF32({rows, Fp8Tiles(c.k)}) : Tensor()) {
    const Tensor x = r.In({rows, c.k}), x_flat = x.View({x.numel()});
    ops::Fill(x.Rows(0, 1), -0.0f);
    ops::Scale(x.Rows(1, 128), std::ldexp(1.0f, -70), x.Rows(1, 128));
    ops::Fill(x.Rows(130, 131), 0.0f);
    ops::Scale(x.Rows(200, 201), std::ldexp(1.0f, 10), x.Rows(200, 201));
    ops::Fill(x_flat.Rows(260 * c.k, 260 * c.k + 1), 16384.0f);
    ops::Fill(x_flat.Rows(300 * c.k - 1, 300 * c.k), -16384.0f);
    Tensor index;
    if (c.through_index) {  // rows is 642 or 300 here: 7 is coprime to it, a permutation
      std::vector<int32_t> permutation(rows);
      for (int64_t i = 0; i < rows; ++i) permutation[i] = static_cast<int32_t>((7 * i + 3) % rows);
      index = r.Ints(permutation, {rows});
    }
    ops::QuantizeColumnTiles(x, r.Ints(c.offsets, {groups + 1}), q, scales, row_q, row_scales,
                             index);
  }
  // Every output: its name and tensor; of q, the tokens the contract specifies (each group's rows
  // and its zeros up to a multiple of kFp8ColumnAlignment), as f32 on the CPU.
  std::vector<std::pair<std::string, Tensor>> Outputs() const {
    const std::vector<float> all = testing::ToFloats(q);
    std::vector<float> specified;
    for (int64_t c = 0; c < q.dim(0); ++c) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t first = c * q.dim(1) + Fp8ColumnStart(g, offsets[g]);
        const int64_t count = Fp8ColumnAligned(offsets[g + 1] - offsets[g]);
        specified.insert(specified.end(), all.begin() + first, all.begin() + first + count);
      }
    }
    const Tensor q_specified =
        FromFloats(specified, {static_cast<int64_t>(specified.size())}, DType::kF32, Device::CPU());
    std::vector<std::pair<std::string, Tensor>> outputs = {{"q", q_specified}, {"scales", scales}};
    if (row_q.defined()) {
      outputs.emplace_back("row_q", row_q);
      outputs.emplace_back("row_scales", row_scales);
    }
    return outputs;
  }
  int64_t groups, rows;
  std::vector<int32_t> offsets;
  Tensor q, scales, row_q, row_scales;
};

// Groups of 0, 1, 127, 128, 129 and 257 rows (642 in all), empty first and last, so that slots
// before, between and after the groups' tiles go unused; all rows in one group (300); groups of
// multiples of 32 rows (no zeros after them), one of them starting off a multiple of 128; k with a
// partial last column tile (208) and k 2048; the tails' rows read through a permutation
// (QuantizeColumnTiles' index); k not a multiple of 4 (read, and its row tiles stored, element by
// element) with groups of 2, 129 and 169 rows; 130 groups, so that a block finds its slot's group
// in two rounds of its warp's search (32 groups a round): every fifth empty, the others of 1 to 61
// rows, several within 128 rows (3296 rows).
std::vector<Fp8ColumnTileCase> Fp8ColumnTileCases() {
  const std::vector<int32_t> tails = {0, 0, 1, 128, 256, 385, 642, 642};
  std::vector<int32_t> many = {0};
  for (int32_t g = 0; g < 130; ++g) {
    many.push_back(many.back() + (g % 5 == 0 ? 0 : g * 37 % 61 + 1));
  }
  return {{"fp8_column_tiles", tails, 208, true},
          {"fp8_column_tiles_k2048", tails, 2048, false},
          {"fp8_column_tiles_one_group", {0, 300}, 208, false},
          {"fp8_column_tiles_one_group_k2048", {0, 300}, 2048, true},
          {"fp8_column_tiles_unpadded", {0, 64, 64, 320}, 208, true},
          {"fp8_column_tiles_through_index", tails, 208, true, true},
          {"fp8_column_tiles_odd_k", {0, 2, 131, 300}, 202, true},
          {"fp8_column_tiles_130_groups", many, 208, true}};
}

// A quantised operand of the FP8 weight gradient: e4m3 values and their scales.
struct Fp8GroupedColumnsOperand {
  Tensor q, scales;
};

// QuantizeColumnTiles' forms of grouped rows (rows, cols) from `offsets`, made by the CPU
// reference (so every device multiplies the same e4m3 values and scales) and placed on r's device.
// The rows hold r's fresh values times 2^(row / 37 % 7 - 3) and 2^(column % 5 - 2), so that
// tiles and columns get different scales and a scale from the wrong tile, row or column errs by a
// factor of 2 or more.
Fp8GroupedColumnsOperand QuantizedColumnsOnCpu(OpRun& r, int64_t rows, int64_t cols,
                                               const std::vector<int32_t>& offsets) {
  std::vector<float> values = testing::ToFloats(r.InF32({rows, cols}));
  for (int64_t i = 0; i < rows * cols; ++i) {
    values[i] = std::ldexp(values[i], static_cast<int>(i / cols / 37 % 7 + i % cols % 5) - 5);
  }
  const Device cpu = Device::CPU();
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  const Tensor q = Tensor::Empty({cols, Fp8ColumnTokens(groups, rows)}, DType::kE4M3, cpu);
  const Tensor scales = Tensor::Empty({Fp8ColumnTileSlots(groups, rows), cols}, DType::kF32, cpu);
  ops::QuantizeColumnTiles(FromFloats(values, {rows, cols}, DType::kF32, cpu),
                           FromInts(offsets, {groups + 1}, cpu), q, scales);
  if (!r.device().is_cuda()) return {q, scales};
  const Tensor device_q = r.OutE4M3(q.shape()), device_scales = r.OutF32(scales.shape());
  ops::CopyFromHost(q.data(), device_q);
  ops::CopyFromHost(scales.data(), device_scales);
  return {device_q, device_scales};
}

std::vector<OpCase> Cases() {
  std::vector<OpCase> cases;
  auto add = [&](std::string name, std::function<void(OpRun&)> body, double f32 = 1e-5,
                 double bf16 = 1e-2) {
    cases.push_back({std::move(name), std::move(body), f32, bf16});
  };

  add(
      "cast",
      [](OpRun& r) {
        Tensor x = r.InF32({1000}, 3.0f);
        Tensor y = r.Out({1000});
        ops::Cast(x, y);
        r.Read("y", y);
      },
      1e-7, 4e-3);
  add(
      "fill",
      [](OpRun& r) {
        Tensor y = r.Out({333});
        ops::Fill(y, 1.5f);
        Tensor i = r.OutI32({77});
        ops::Fill(i, 7.0f);
        r.Read("y", y);
        r.Read("i", i);
      },
      0, 0);
  add("add_scale_axpy", [](OpRun& r) {
    Tensor a = r.In({129, 65}), b = r.In({129, 65});
    Tensor sum = r.Out({129, 65}), scaled = r.Out({129, 65});
    ops::Add(a, b, sum);
    ops::Scale(a, -0.75f, scaled);
    Tensor acc = r.InF32({129, 65});
    ops::Axpy(0.5f, b, acc);  // f32 += alpha * (run dtype)
    r.Read("sum", sum);
    r.Read("scaled", scaled);
    r.Read("axpy", acc);
  });
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      add(std::string("matmul_") + (ta ? "t" : "n") + (tb ? "t" : "n"), [ta, tb](OpRun& r) {
        const int64_t m = 37, k = 64, n = 50;
        Tensor a = ta ? r.In({k, m}) : r.In({m, k});
        Tensor b = tb ? r.In({n, k}) : r.In({k, n});
        Tensor out = r.Out({m, n});
        ops::Matmul(a, b, out, ta, tb);
        Tensor acc = r.InF32({m, n});  // f32 accumulation: out += a b
        ops::Matmul(a, b, acc, ta, tb, 1.0f);
        Tensor grad = r.InGrad({m, n});  // the same into a gradient of the run's dtype
        ops::Matmul(a, b, grad, ta, tb, 1.0f);
        r.Read("out", out);
        r.Read("acc", acc);
        r.Read("grad", grad);
      });
    }
  }
  add("matmul_batched", [](OpRun& r) {
    Tensor a = r.In({3, 17, 32}), b = r.In({3, 24, 32});
    Tensor out = r.Out({3, 17, 24});
    ops::Matmul(a, b, out, false, true);
    r.Read("out", out);
  });
  // Groups without rows, with one row, with most or all rows; row counts off the 128-row tiles
  // of the Hopper kernels, k and n multiples of 8 (which they take) with tails past their 64-wide
  // K steps and 256-wide N tiles. Host offsets go only where the op needs them, so on a Hopper GPU
  // the bf16 runs take the sm90 kernels (or fail).
  struct GroupedCase {
    std::string name;
    std::vector<int32_t> offsets;
    int64_t k, n;
  };
  for (const GroupedCase& c : std::vector<GroupedCase>{
           {"grouped_matmul", {0, 0, 1, 261, 261, 290, 300}, 72, 40},
           {"grouped_matmul_all_rows_in_one_group", {0, 0, 0, 389, 389}, 136, 264},
           {"grouped_matmul_wide", {0, 130, 130, 257, 600}, 200, 520},
           // k and n off multiples of 8: cuBLAS in bf16 too (its weight gradient widens a bf16
           // dw to an f32 copy).
           {"grouped_matmul_cublas", {0, 3, 3, 50, 77}, 36, 20}}) {
    add(c.name, [c](OpRun& r) {
      const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1, rows = c.offsets.back();
      Tensor x = r.In({rows, c.k}), w = r.In({groups, c.n, c.k}), dy = r.In({rows, c.n});
      Tensor y = r.Out({rows, c.n}), dx = r.Out({rows, c.k});
      const Tensor offsets = r.Ints(c.offsets, {groups + 1});
      const std::span<const int32_t> host = HostOffsetsWhereNeeded(r, c.offsets, w);
      ops::GroupedMatmul(x, w, offsets, host, y, /*transpose_w=*/true);
      ops::GroupedMatmul(dy, w, offsets, host, dx, /*transpose_w=*/false);
      Tensor dw = r.InF32({groups, c.n, c.k});  // f32 accumulation: dw_g += dy_g^T x_g
      ops::GroupedMatmulWeightGrad(dy, x, offsets, host, dw, /*accumulate=*/true);
      Tensor dw_stored = r.OutF32({groups, c.n, c.k});  // dw_g = dy_g^T x_g, zeros if empty
      ops::GroupedMatmulWeightGrad(dy, x, offsets, host, dw_stored, /*accumulate=*/false);
      Tensor dw_grad = r.InGrad({groups, c.n, c.k});  // both again into the run's dtype
      ops::GroupedMatmulWeightGrad(dy, x, offsets, host, dw_grad, /*accumulate=*/true);
      Tensor dw_grad_stored = r.OutGrad({groups, c.n, c.k});
      ops::GroupedMatmulWeightGrad(dy, x, offsets, host, dw_grad_stored, /*accumulate=*/false);
      r.Read("y", y);
      r.Read("dx", dx);
      r.Read("dw", dw);
      r.Read("dw_stored", dw_stored);
      r.Read("dw_grad", dw_grad);
      r.Read("dw_grad_stored", dw_grad_stored);
    });
  }
  // The weight gradient over parts of rows, each with its own offsets (micro-batches whose
  // gradients one pass sums): parts ending off the 64-row K steps (and on 16-row slices: 32 and
  // 48 rows, whose stages the Hopper kernel does not mask), groups with rows in one part only, an
  // empty part, and more parts than one Hopper launch takes (sm90::kMaxWeightGradParts, so a
  // second launch adds the rest).
  for (const int parts : {2, 10}) {
    add("grouped_matmul_weight_grad_" + std::to_string(parts) + "_parts", [parts](OpRun& r) {
      const std::vector<std::vector<int32_t>> part_offsets = {
          {0, 0, 1, 61, 61, 90, 100},     {0, 70, 70, 71, 200, 200, 203},
          {0, 0, 0, 0, 0, 0, 0},          {0, 1, 2, 3, 4, 5, 6},
          {0, 0, 0, 130, 130, 130, 130},  {0, 64, 64, 64, 128, 129, 300},
          {0, 32, 32, 80, 80, 80, 100},   {0, 0, 0, 0, 0, 0, 65},
          {0, 33, 66, 99, 132, 165, 198}, {0, 0, 128, 128, 128, 128, 128}};
      constexpr int64_t kGroups = 6, kN = 40, kK = 72;
      const Tensor w = r.In({kGroups, kN, kK});  // only to say whether host offsets are needed
      std::vector<ops::GroupedRows> rows;
      for (int p = 0; p < parts; ++p) {
        const std::vector<int32_t>& offsets = part_offsets[p];
        const int64_t count = offsets.back();
        rows.push_back({r.In({count, kN}), r.In({count, kK}), r.Ints(offsets, {kGroups + 1}),
                        HostOffsetsWhereNeeded(r, offsets, w)});
      }
      Tensor dw = r.InF32({kGroups, kN, kK});
      ops::GroupedMatmulWeightGrad(rows, dw, /*accumulate=*/true);
      Tensor dw_stored = r.OutF32({kGroups, kN, kK});
      ops::GroupedMatmulWeightGrad(rows, dw_stored, /*accumulate=*/false);
      Tensor dw_grad = r.InGrad({kGroups, kN, kK});
      ops::GroupedMatmulWeightGrad(rows, dw_grad, /*accumulate=*/true);
      Tensor dw_grad_stored = r.OutGrad({kGroups, kN, kK});
      ops::GroupedMatmulWeightGrad(rows, dw_grad_stored, /*accumulate=*/false);
      r.Read("dw", dw);
      r.Read("dw_stored", dw_stored);
      r.Read("dw_grad", dw_grad);
      r.Read("dw_grad_stored", dw_grad_stored);
    });
  }
  // Blockwise FP8 quantisation: q and the scales bit-identical across devices by contract (the
  // CUDA kernels round with the device's cvt, the CPU emulates it), so also the f32 dequantised
  // values: tolerance 0 (every element equal).
  add(
      "fp8_quantize",
      [](OpRun& r) {
        const Fp8Operands o(r);
        Tensor x_back = r.OutF32(o.xq.shape()), w_back = r.OutF32(o.wq.shape());
        ops::DequantizeRowTiles(o.xq, o.x_scales, x_back);
        ops::DequantizeBlocks(o.wq, o.w_scales, w_back);
        r.Read("xq", o.xq);
        r.Read("x_scales", o.x_scales);
        r.Read("wq", o.wq);
        r.Read("w_scales", o.w_scales);
        r.Read("wq_t", o.wq_t);
        r.Read("w_scales_t", o.w_scales_t);
        r.Read("x_back", x_back);
        r.Read("w_back", w_back);
      },
      0, 0);
  // Blocks of one row and one column at the ends of n and k, in both orientations.
  add(
      "fp8_quantize_block_tails",
      [](OpRun& r) {
        const Tensor w = r.In({2, 129, 257});
        Tensor wq = r.OutE4M3({2, 129, 257}), w_scales = r.OutF32({2, 2, 3});
        Tensor wq_t = r.OutE4M3({2, 257, 129}), w_scales_t = r.OutF32({2, 3, 2});
        ops::QuantizeBlocks(w, wq, w_scales, wq_t, w_scales_t);
        r.Read("wq", wq);
        r.Read("w_scales", w_scales);
        r.Read("wq_t", wq_t);
        r.Read("w_scales_t", w_scales_t);
      },
      0, 0);
  // The weight gradients' operands: bit-identical by contract, as fp8_quantize (tolerance 0).
  for (const Fp8ColumnTileCase& c : Fp8ColumnTileCases()) {
    add(
        c.name,
        [c](OpRun& r) {
          for (const auto& [name, output] : Fp8ColumnTileOperands(r, c).Outputs()) {
            r.Read(name, output);
          }
        },
        0, 0);
  }
  // Dequantised into the run's dtype: bf16 on CUDA, f32 on the CPU (one rounding apart).
  add("fp8_dequantize", [](OpRun& r) {
    const Fp8Operands o(r);
    Tensor x_back = r.Out(o.xq.shape()), w_back = r.Out(o.wq.shape());
    ops::DequantizeRowTiles(o.xq, o.x_scales, x_back);
    ops::DequantizeBlocks(o.wq, o.w_scales, w_back);
    r.Read("x_back", x_back);
    r.Read("w_back", w_back);
  });
  // y = xq · wq_g^T on operands quantised on each device from the same values (bit-identical
  // e4m3 and scales), y in the run's dtype. The CUDA kernel needs k % 16 == 0: k 304 and n 200 (a
  // partial last K tile and column block). x's rows are scaled by 2^-3 .. 2^3 and each row's last
  // K tile again by 2^-2 .. 2^2, w's groups by 2^g and their last rows by 4, so a scale taken from
  // the wrong row, K tile or block shows as an O(1) error. Offsets: an empty first, middle and
  // last group, a group of 140 rows (a last row tile of 12: one consumer idle) and one of 150;
  // then every row in one group.
  // Tolerance (relative error in norm, as for every case): the Hopper tensor cores sum each K
  // tile's 128 e4m3 products with about 14 bits kept (DeepSeek-V3's measure), truncating: over
  // random-signed terms the running sum after j terms is about sqrt(j) sigma, so the error of a
  // tile's sum is at most about 2^-15 sum_j sqrt(j) sigma = 0.03 sigma beside the sum's sqrt(128)
  // sigma = 11 sigma: 2.6e-3, where every term errs the same way; f32 gets 5e-3. bf16 adds y's
  // rounding (2^-9 relative, about 1.1e-3 in norm): 1e-2. A wrong row, tile or scale errs by more
  // than 0.1.
  struct Fp8Case {
    std::string name;
    std::vector<int32_t> offsets;
  };
  for (const Fp8Case& c :
       std::vector<Fp8Case>{{"fp8_grouped_matmul", {0, 0, 140, 140, 150, 300, 300}},
                            {"fp8_grouped_matmul_one_group", {0, 0, 300, 300}}}) {
    add(
        c.name,
        [c](OpRun& r) {
          constexpr int64_t kK = 304, kN = 200;
          const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1;
          const int64_t rows = c.offsets.back();
          const Tensor x = r.InF32({rows, kK}), w = r.InF32({groups, kN, kK});
          const Tensor x_flat = x.View({x.numel()}), w_rows = w.View({groups * kN, kK});
          for (int64_t row = 0; row < rows; ++row) {
            ops::Scale(x.Rows(row, row + 1), std::ldexp(1.0f, row % 7 - 3), x.Rows(row, row + 1));
            const Tensor last_tile = x_flat.Rows(row * kK + 256, (row + 1) * kK);
            ops::Scale(last_tile, std::ldexp(1.0f, row % 5 - 2), last_tile);
          }
          for (int64_t g = 0; g < groups; ++g) {
            ops::Scale(w.Rows(g, g + 1), std::ldexp(1.0f, g), w.Rows(g, g + 1));
            const Tensor last_rows = w_rows.Rows(g * kN + 128, (g + 1) * kN);
            ops::Scale(last_rows, 4.0f, last_rows);
          }
          Tensor xq = r.OutE4M3({rows, kK}), x_scales = r.OutF32({rows, 3});
          Tensor wq = r.OutE4M3({groups, kN, kK}), w_scales = r.OutF32({groups, 2, 3});
          ops::QuantizeRowTiles(x, xq, x_scales);
          ops::QuantizeBlocks(w, wq, w_scales);
          Tensor y = r.Out({rows, kN});
          ops::Fp8GroupedMatmul(xq, x_scales, wq, w_scales, r.Ints(c.offsets, {groups + 1}), y);
          r.Read("y", y);
        },
        5e-3, 1e-2);
  }
  // dw_g (+)= sum over parts of dy_p,g^T x_p,g on QuantizeColumnTiles' forms made on the CPU
  // (QuantizedColumnsOnCpu: both devices multiply the same e4m3 values and scales), n 48 (a
  // partial row tile) and k 160 (a partial column tile). Parts: rows 300 (groups of 0, 1, 129, 0,
  // 160 and 10 rows: an empty first and middle group, tiles that end at and past a group's end)
  // and 213 (off a multiple of 16: padded tokens), then 9 parts (the Hopper kernel's second
  // launch adds the ninth). dw f32 =, f32 += onto fresh values, and the run's dtype (= and +=).
  // Tolerance as fp8_grouped_matmul's (the same tensor-core sums of 128 products).
  add(
      "fp8_grouped_matmul_weight_grad",
      [](OpRun& r) {
        constexpr int64_t kN = 48, kK = 160, kGroups = 6;
        const std::vector<std::vector<int32_t>> part_offsets = {{0, 0, 1, 130, 130, 290, 300},
                                                                {0, 50, 50, 178, 178, 178, 213}};
        std::vector<ops::Fp8GroupedColumns> parts;
        for (const std::vector<int32_t>& offsets : part_offsets) {
          const int64_t rows = offsets.back();
          const Fp8GroupedColumnsOperand dy = QuantizedColumnsOnCpu(r, rows, kN, offsets);
          const Fp8GroupedColumnsOperand x = QuantizedColumnsOnCpu(r, rows, kK, offsets);
          parts.push_back({dy.q, dy.scales, x.q, x.scales, r.Ints(offsets, {kGroups + 1}), rows});
        }
        std::vector<ops::Fp8GroupedColumns> nine_parts;
        for (int p = 0; p < 9; ++p) nine_parts.push_back(parts[p % 2]);
        const std::span<const ops::Fp8GroupedColumns> one_part(parts.data(), 1);
        Tensor dw = r.OutF32({kGroups, kN, kK});
        ops::Fp8GroupedMatmulWeightGrad(one_part, dw, /*accumulate=*/false);
        Tensor dw_sum = r.InF32({kGroups, kN, kK});
        ops::Fp8GroupedMatmulWeightGrad(parts, dw_sum, /*accumulate=*/true);
        Tensor dw_nine = r.OutF32({kGroups, kN, kK});
        ops::Fp8GroupedMatmulWeightGrad(nine_parts, dw_nine, /*accumulate=*/false);
        Tensor dw_grad = r.OutGrad({kGroups, kN, kK});
        ops::Fp8GroupedMatmulWeightGrad(parts, dw_grad, /*accumulate=*/false);
        Tensor dw_grad_sum = r.InGrad({kGroups, kN, kK});
        ops::Fp8GroupedMatmulWeightGrad(parts, dw_grad_sum, /*accumulate=*/true);
        r.Read("dw", dw);
        r.Read("dw += two parts", dw_sum);
        r.Read("dw nine parts", dw_nine);
        r.Read("dw_grad", dw_grad);
        r.Read("dw_grad += two parts", dw_grad_sum);
      },
      5e-3, 1e-2);
  // fc1 with SwiGLU x routing probability, and fc2's input gradient with SwiGLU's backward (each
  // one Hopper kernel in bf16 where f is a multiple of 8, the backward's at any k here; f 136: gate
  // and up tiles past f; f 20: the two ops). n is h's width 2f; fc1's w (groups, 2f, k), fc2's
  // (groups, k, f); scale and dscale f32.
  for (const GroupedCase& c : std::vector<GroupedCase>{
           {"grouped_matmul_swiglu", {0, 0, 1, 261, 261, 290, 300}, 72, 2 * 136},
           {"grouped_matmul_swiglu_two_ops", {0, 3, 3, 50, 77}, 64, 2 * 20}}) {
    add(c.name, [c](OpRun& r) {
      const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1, rows = c.offsets.back();
      Tensor x = r.In({rows, c.k}), w = r.In({groups, c.n, c.k}), scale = r.InF32({rows});
      Tensor h = r.Out({rows, c.n}), a = r.Out({rows, c.n / 2});
      ops::GroupedMatmulSwiglu(x, w, r.Ints(c.offsets, {groups + 1}),
                               HostOffsetsWhereNeeded(r, c.offsets, w), scale, h, a);
      r.Read("h", h);
      r.Read("a", a);
    });
    add(c.name + "_backward", [c](OpRun& r) {
      const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1, rows = c.offsets.back();
      Tensor dy = r.In({rows, c.k}), w = r.In({groups, c.k, c.n / 2}), h = r.In({rows, c.n});
      Tensor scale = r.InF32({rows});
      Tensor dh = r.Out({rows, c.n}), dscale = r.OutF32({rows});
      const SwigluBackwardFusedAtAnyK fused;
      ops::GroupedMatmulSwigluBackward(dy, w, r.Ints(c.offsets, {groups + 1}),
                                       HostOffsetsWhereNeeded(r, c.offsets, w), h, scale, dh,
                                       dscale);
      r.Read("dh", dh);
      r.Read("dscale", dscale);
    });
  }
  // Rows a block holds in registers (h 384; 2048 with several rows a block), and rows wider than
  // a block's vectors (1030: element accesses, each row walked twice); the query/key norm's
  // heads (64 and 128 wide, one warp a row, many rows a backward block).
  for (const auto& [rows, h] :
       {std::pair<int64_t, int64_t>{67, 384}, {1100, 2048}, {600, 1030}, {1500, 64}, {4096, 128}}) {
    const std::string name = h == 384 ? "rmsnorm" : "rmsnorm_" + std::to_string(h);
    add(name, [rows, h](OpRun& r) {
      Tensor x = r.In({rows, h}), w = r.In({h}), dy = r.In({rows, h});
      Tensor y = r.Out({rows, h}), rstd = r.OutF32({rows});
      ops::RmsNormForward(x, w, 1e-5f, y, rstd);
      Tensor dx = r.Out({rows, h}), dw = r.InF32({h});  // dweight accumulates
      ops::RmsNormBackward(dy, x, w, rstd, dx, dw);
      Tensor dw_grad = r.InGrad({h});
      ops::RmsNormBackward(dy, x, w, rstd, dx, dw_grad);
      Tensor residual = r.In({rows, h}), dx_residual = r.Out({rows, h});
      ops::RmsNormBackward(dy, x, w, rstd, dx_residual, dw_grad, residual);
      ops::RmsNormBackward(dy, x, w, rstd, residual, dw_grad, residual);  // in place
      Tensor sum = r.In({rows, h}), y_of_sum = r.Out({rows, h}), rstd_of_sum = r.OutF32({rows});
      ops::RmsNormForward(sum, w, 1e-5f, y_of_sum, rstd_of_sum, /*residual=*/r.In({rows, h}));
      r.Read("y", y);
      r.Read("rstd", rstd);
      r.Read("dx", dx);
      r.Read("dx + residual", dx_residual);
      r.Read("dx + residual in place", residual);
      r.Read("dweight", dw);
      r.Read("dweight_grad", dw_grad);
      r.Read("x + residual", sum);
      r.Read("y of x + residual", y_of_sum);
      r.Read("rstd of x + residual", rstd_of_sum);
    });
  }
  for (int64_t cols : {128, 1000}) {
    add("softmax_" + std::to_string(cols), [cols](OpRun& r) {
      Tensor x = r.In({33, cols}, 2.0f), dy = r.In({33, cols});
      Tensor y = r.Out({33, cols}), dx = r.Out({33, cols});
      ops::SoftmaxForward(x, y);
      ops::SoftmaxBackward(dy, y, dx);
      r.Read("y", y);
      r.Read("dx", dx);
    });
  }
  add("silu", [](OpRun& r) {
    Tensor x = r.In({50, 70}, 3.0f), dy = r.In({50, 70});
    Tensor y = r.Out({50, 70}), dx = r.Out({50, 70});
    ops::SiluForward(x, y);
    ops::SiluBackward(dy, x, dx);
    r.Read("y", y);
    r.Read("dx", dx);
  });
  for (bool scaled : {false, true}) {
    add(scaled ? "swiglu_scaled" : "swiglu", [scaled](OpRun& r) {
      const int64_t rows = 45, f = 96;
      Tensor x = r.In({rows, 2 * f}, 2.0f), dy = r.In({rows, f});
      Tensor scale = scaled ? r.InF32({rows}) : Tensor();
      Tensor y = r.Out({rows, f}), dx = r.Out({rows, 2 * f});
      Tensor dscale = scaled ? r.OutF32({rows}) : Tensor();
      ops::SwigluForward(x, scale, y);
      ops::SwigluBackward(dy, x, scale, dx, dscale);
      r.Read("y", y);
      r.Read("dx", dx);
      if (scaled) r.Read("dscale", dscale);
    });
  }
  // Each device's table from its own RopeTable: the same floats but for the last bit of a few
  // (std::cos and CUDA's sincos may round differently in double).
  add(
      "rope_table",
      [](OpRun& r) {
        Tensor table = r.OutF32({3000, 40, 2});
        ops::RopeTable(10000.0f, table);
        r.Read("table", table);
      },
      0x1p-23, 0x1p-23);
  // d / 2 a multiple of 8 (16-byte accesses) and odd (element accesses); 1 and 3 KV heads.
  for (const int64_t d : {64, 2 * 333}) {
    const int64_t kv_heads = d == 64 ? 1 : 3;
    add(std::string("rope_qkv_") + (d == 64 ? "d64" : "odd_half"), [d, kv_heads](OpRun& r) {
      RopeTensors t(r, d, kv_heads);
      ops::RopeQkvForward(t.qkv, t.table, t.q, t.k, t.v);
      ops::RopeQkvBackward(t.dq, t.dk, t.dv, t.table, t.dqkv);
      r.Read("q", t.q);
      r.Read("k", t.k);
      r.Read("v", t.v);
      r.Read("dqkv", t.dqkv);
    });
    // The query/key norm's path: the split without a table (and its backward), then the
    // rotation of one tensor's heads, apart and in place, each way.
    add(std::string("rope_heads_") + (d == 64 ? "d64" : "odd_half"), [d, kv_heads](OpRun& r) {
      RopeTensors t(r, d, kv_heads);
      ops::RopeQkvForward(t.qkv, Tensor(), t.q, t.k, t.v);
      ops::RopeQkvBackward(t.dq, t.dk, t.dv, Tensor(), t.dqkv);
      Tensor rotated = r.Out(t.q.shape()), unrotated = r.Out(t.q.shape());
      ops::RopeForward(t.q, t.table, rotated);
      ops::RopeBackward(t.dq, t.table, unrotated);
      ops::RopeForward(t.k, t.table, t.k);
      ops::RopeBackward(t.dk, t.table, t.dk);
      r.Read("q", t.q);
      r.Read("v", t.v);
      r.Read("dqkv", t.dqkv);
      r.Read("rotated", rotated);
      r.Read("unrotated", unrotated);
      r.Read("k rotated in place", t.k);
      r.Read("dk unrotated in place", t.dk);
    });
  }
  // Groups of 2, 1, 3 (bf16 dk/dv clusters of 3 blocks: uneven row shares), 4 and 16 (clusters
  // of 8 blocks with 2 query heads each); sequences that are and are not multiples of a tile.
  // Each runs with the Hopper kernels where they run, and again with the mma.sync kernels alone
  // ("_mma"), which are what other GPUs run.
  for (bool hopper : {true, false}) {
    for (AttentionShape s :
         {AttentionShape{2, 37, 4, 2, 64}, AttentionShape{1, 256, 2, 1, 128},
          AttentionShape{2, 130, 4, 4, 64}, AttentionShape{2, 96, 6, 2, 128},
          AttentionShape{1, 256, 8, 2, 128}, AttentionShape{1, 200, 16, 1, 64}}) {
      add(
          "attention_s" + std::to_string(s.seq) + "_h" + std::to_string(s.heads) + "kv" +
              std::to_string(s.kv_heads) + "_d" + std::to_string(s.d) + (hopper ? "" : "_mma"),
          [s, hopper](OpRun& r) {
            cuda::attention::AllowSm90Attention(hopper);
            RunAttention(r, s);
            cuda::attention::AllowSm90Attention(true);
          },
          2e-5, 2e-2);
    }
  }
  add("embedding", [](OpRun& r) {
    const int64_t vocab = 50, tokens = 300, h = 96;
    Tensor ids = r.Ints(r.RandomInts(tokens, vocab), {tokens});
    Tensor table = r.In({vocab, h}), dout = r.In({tokens, h});
    Tensor out = r.Out({tokens, h}), dtable = r.InF32({vocab, h});
    ops::EmbeddingForward(ids, table, out);
    ops::EmbeddingBackward(ids, dout, dtable);
    Tensor dtable_grad = r.InGrad({vocab, h});
    ops::EmbeddingBackward(ids, dout, dtable_grad);
    r.Read("out", out);
    r.Read("dtable", dtable);
    r.Read("dtable_grad", dtable_grad);
  });
  add("cross_entropy", [](OpRun& r) {
    const int64_t tokens = 19, vocab = 1000;
    std::vector<int32_t> targets = r.RandomInts(tokens, vocab);
    targets[5] = -1;  // ignored
    Tensor logits = r.In({tokens, vocab}, 3.0f), t = r.Ints(targets, {tokens});
    Tensor losses = r.OutF32({tokens}), lse = r.OutF32({tokens}), dlogits = r.Out({tokens, vocab});
    ops::CrossEntropyForward(logits, t, losses, lse);
    ops::CrossEntropyBackward(logits, t, lse, 0.25f, dlogits);
    r.Read("losses", losses);
    r.Read("lse", lse);
    r.Read("dlogits", dlogits);
    ops::CrossEntropyBackward(logits, t, lse, 0.25f, /*dlogits=*/logits);  // in place (the head)
    r.Read("dlogits in place", logits);
    // Both at once, in place, as a training head calls it: 16-byte accesses (vocab 1000, 40000)
    // and element accesses (3001).
    for (const int64_t v : {int64_t{1000}, int64_t{3001}, int64_t{40000}}) {
      const int64_t n = v > 10000 ? 3 : tokens;
      std::vector<int32_t> both_targets = r.RandomInts(n, static_cast<int32_t>(v));
      both_targets[1] = -1;
      Tensor both = r.In({n, v}, 3.0f), both_losses = r.OutF32({n}), both_lse = r.OutF32({n});
      ops::CrossEntropyForwardBackward(both, r.Ints(both_targets, {n}), 0.25f, both_losses,
                                       both_lse, /*dlogits=*/both);
      const std::string name = " (fused, vocab " + std::to_string(v) + ")";
      r.Read("losses" + name, both_losses);
      r.Read("lse" + name, both_lse);
      r.Read("dlogits" + name, both);
    }
  });
  for (int64_t cols : {64, 200, 300}) {  // the row in 4 or 8 registers per lane, or re-read
    add(
        "topk_" + std::to_string(cols),
        [cols](OpRun& r) {
          Tensor x = r.InF32({100, cols}), dvalues = r.InF32({100, 8});
          Tensor values = r.OutF32({100, 8}), indices = r.OutI32({100, 8});
          Tensor dx = r.OutF32({100, cols});
          ops::TopK(x, values, indices);
          ops::TopKBackward(dvalues, indices, dx);
          r.Read("values", values);
          r.Read("indices", indices);
          r.Read("dx", dx);
        },
        0, 0);
  }
  add(
      "topk_ties_nan_signed_zero",  // the order's corners; indices only (NaN != NaN in values)
      [](OpRun& r) {
        const int64_t rows = 40, cols = 100;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        const float inf = std::numeric_limits<float>::infinity();
        const std::vector<float> palette = {1.0f, -1.0f, 0.0f, -0.0f, nan, -inf, inf, 1.0f, -nan};
        std::vector<float> x(rows * cols);
        std::vector<int32_t> picks =
            r.RandomInts(rows * cols, static_cast<int32_t>(palette.size()));
        for (size_t i = 0; i < x.size(); ++i) x[i] = palette[picks[i]];
        Tensor values = r.OutF32({rows, 8}), indices = r.OutI32({rows, 8});
        ops::TopK(r.F32(x, {rows, cols}), values, indices);
        r.Read("indices", indices);
      },
      0, 0);
  add(
      "sort_gather",
      [](OpRun& r) {
        const int64_t n = 5000, keys = 128, h = 40;
        std::vector<int32_t> key_values = r.RandomInts(n, keys - 3);  // the last buckets stay empty
        Tensor k = r.Ints(key_values, {n});
        Tensor order = r.OutI32({n}), offsets = r.OutI32({keys + 1});
        ops::SortByKey(k, keys, order, offsets);
        Tensor x = r.In({n, h});
        Tensor permuted = r.Out({n, h});
        ops::GatherRows(x, order, permuted);
        const int64_t wide = 2100;  // rows of 525 words (the narrow ones: 5 or 10)
        Tensor wide_x = r.In({n / 8, wide}), wide_permuted = r.Out({n - 3, wide});
        ops::GatherRows(wide_x, r.Ints(r.RandomInts(n - 3, n / 8), {n - 3}), wide_permuted);
        Tensor pairs = r.Ints(r.RandomInts(2 * (n / 2), n), {n / 2, 2});
        Tensor summed = r.Out({n / 2, h});
        ops::GatherSumRows(x, pairs, summed);
        r.Read("order", order);
        r.Read("offsets", offsets);
        // A sort with more keys than the scatter stages (3000 elements of 1000 keys), and one of
        // more than one scan tile's chunks (70000 of 128).
        for (const auto& [count, buckets] :
             {std::pair<int64_t, int32_t>{3000, 1000}, {70000, 128}}) {
          Tensor more_order = r.OutI32({count}), more_offsets = r.OutI32({buckets + 1});
          ops::SortByKey(r.Ints(r.RandomInts(count, buckets), {count}), buckets, more_order,
                         more_offsets);
          r.Read("order of " + std::to_string(count), more_order);
          r.Read("offsets of " + std::to_string(count), more_offsets);
        }
        r.Read("wide permuted", wide_permuted);
        r.Read("permuted", permuted);
        r.Read("summed", summed);
      },
      1e-7, 4e-3);
  add("router_ops", [](OpRun& r) {
    const int64_t tokens = 300, experts = 16, k = 4;
    std::vector<float> positive = testing::ToFloats(r.InF32({tokens, k}));
    for (float& v : positive) v = std::abs(v) + 0.1f;
    Tensor values = FromFloats(positive, {tokens, k}, DType::kF32, r.device());
    Tensor dweights = r.InF32({tokens, k});
    Tensor normalized = r.OutF32({tokens, k}), dvalues = r.OutF32({tokens, k});
    ops::NormalizeRowsForward(values, normalized);
    ops::NormalizeRowsBackward(dweights, values, dvalues);
    Tensor logits = r.InF32({tokens, experts}, 2.0f), probs = r.OutF32({tokens, experts});
    ops::SoftmaxForward(logits, probs);
    Tensor experts_chosen = r.Ints(r.RandomInts(tokens * k, experts), {tokens * k});
    Tensor order = r.OutI32({tokens * k}), offsets = r.OutI32({experts + 1});
    ops::SortByKey(experts_chosen, experts, order, offsets);
    Tensor balance = r.OutF32({1}), z = r.OutF32({1});
    ops::LoadBalancingLossForward(probs, offsets, k, balance);
    ops::ZLossForward(logits, z);
    Tensor dprobs = r.InF32({tokens, experts});
    ops::LoadBalancingLossBackward(offsets, k, 0.3f, dprobs);
    Tensor dlogits = r.InF32({tokens, experts});
    ops::ZLossBackward(logits, 0.2f, dlogits);
    Tensor source_rows = r.OutI32({tokens * k}), inverse = r.OutI32({tokens * k});
    ops::InvertPermutation(order, k, source_rows, inverse);
    r.Read("normalized", normalized);
    r.Read("dvalues", dvalues);
    r.Read("balance", balance);
    r.Read("z", z);
    r.Read("dprobs", dprobs);
    r.Read("dlogits", dlogits);
    r.Read("source_rows", source_rows);
    r.Read("inverse", inverse);
  });
  // The gate in one kernel a way (experts in 1, 4 and 8 registers a lane, k up to 32) and the
  // separate ops where a row exceeds a warp (300 experts); bf16 runs store dlogits in bf16. Each
  // with the top k renormalised and, "_pre_softmax", without.
  for (const auto& [experts, k] :
       {std::pair<int64_t, int64_t>{20, 4}, {128, 8}, {200, 32}, {300, 8}}) {
    for (const bool renormalize : {true, false}) {
      add("router_gate_" + std::to_string(experts) + "_top" + std::to_string(k) +
              (renormalize ? "" : "_pre_softmax"),
          [experts, k, renormalize](OpRun& r) { RunRouterGate(r, experts, k, renormalize); });
    }
  }
  add("sum_l2norm", [](OpRun& r) {
    Tensor a = r.In({100003}), b = r.In({317, 5});
    // Shifted to mean 1: a zero-mean sum cancels to ~1/300 of its terms' magnitudes, and its
    // relative error would measure that cancellation, not the backends' rounding.
    Tensor ones = r.Out({100003});
    ops::Fill(ones, 1.0f);
    ops::Add(a, ones, a);
    Tensor sum = r.OutF32({1}), norm = r.OutF32({1}), grad_norm = r.OutF32({1});
    ops::Sum(a, sum);
    std::vector<Tensor> both = {a, b};
    ops::GlobalL2Norm(both, norm);
    std::vector<Tensor> grads = {r.InGrad({5000}), r.InF32({77})};  // mixed dtypes in bf16 runs
    ops::GlobalL2Norm(grads, grad_norm);
    r.Read("sum", sum);
    r.Read("norm", norm);
    r.Read("grad_norm", grad_norm);
  });
  // Sizes that end inside a vector, a tile and a launch's table (over 64 entries: two launches),
  // alternating weight decay; moments f32, or bf16 on both sides (a stored moment may differ by
  // one bf16 ulp, 2^-8 to 2^-7 of its value, where the two backends' f32 arithmetic differs by an
  // f32 ulp, e.g. by contracting to an FMA: rare from f32 gradients, frequent from bf16 ones, whose
  // short products often land the new moment exactly on a bf16 tie; the one-element tensor's
  // error is that element's, so up to 2^-7), and
  // bf16 gradients too. Both bf16-moment cases allow that ulp: from f32 gradients it is rare, not
  // impossible (one element of the 37-element tensors alone would exceed 1e-4).
  struct AdamWCase {
    const char* name;
    DType grads, moments;
    double f32_tolerance;
  };
  for (const AdamWCase& c :
       {AdamWCase{"adamw", DType::kF32, DType::kF32, 1e-5},
        AdamWCase{"adamw_bf16_moments", DType::kF32, DType::kBF16, 0x1p-7},
        AdamWCase{"adamw_bf16_grads_and_moments", DType::kBF16, DType::kBF16, 0x1p-7}}) {
    const DType grads = c.grads, moments = c.moments;
    add(
        c.name,
        [grads, moments](OpRun& r) {
          std::vector<int64_t> sizes = {10000, 3, 16389, 1};
          sizes.resize(70, 37);
          std::vector<ops::AdamWTensors> entries;
          for (size_t i = 0; i < sizes.size(); ++i) {
            const int64_t n = sizes[i];
            std::vector<float> m_host = testing::ToFloats(r.InF32({n}, 0.1f));
            std::vector<float> v_host = testing::ToFloats(r.InF32({n}, 0.1f));
            for (float& x : v_host) x = x * x;  // second moments are non-negative
            const Tensor grad = r.InF32({n});
            Tensor grad_stored = Tensor::Empty({n}, grads, r.device());
            ops::Cast(grad, grad_stored);
            entries.push_back(
                {r.InF32({n}), grad_stored, FromFloats(m_host, {n}, moments, r.device()),
                 FromFloats(v_host, {n}, moments, r.device()), r.Out({n}), i % 2 == 0});
          }
          ops::AdamWConfig config;
          config.lr = 1e-2f;
          config.weight_decay = 0.1f;
          config.step = 3;
          config.grad_scale = 0.5f;
          ops::AdamWUpdate(entries, config);
          for (size_t i = 0; i < entries.size(); ++i) {
            const std::string suffix = std::to_string(i);
            r.Read("master" + suffix, entries[i].master);
            r.Read("m" + suffix, entries[i].m);
            r.Read("v" + suffix, entries[i].v);
            r.Read("model" + suffix, entries[i].model);
          }
        },
        c.f32_tolerance);
  }
  return cases;
}

// Largest relative error per (op, dtype), printed after all tests.
std::map<std::string, double>& WorstErrors() {
  static std::map<std::string, double> worst;
  return worst;
}

class ErrorTable : public ::testing::Environment {
 public:
  void TearDown() override {
    printf("\n%-28s %-5s %s\n", "op", "dtype", "max relative error (over outputs)");
    for (const auto& [key, error] : WorstErrors()) printf("%-34s %.3g\n", key.c_str(), error);
  }
};
const auto* const kErrorTable = ::testing::AddGlobalTestEnvironment(new ErrorTable);

class OpParityTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(OpParityTest, CudaMatchesCpu) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  const auto& [name, dtype] = GetParam();
  const std::vector<OpCase> cases = Cases();
  const auto it =
      std::find_if(cases.begin(), cases.end(), [&](const OpCase& c) { return c.name == name; });
  ASSERT_NE(it, cases.end());
  for (int trial = 0; trial < 2; ++trial) {  // fresh inputs each trial
    const uint32_t seed = testing::TestSeed() + 7919u * trial;
    SCOPED_TRACE("seed " + std::to_string(seed));
    OpRun cpu(Device::CPU(), dtype, seed), gpu(Device::CUDA(0), dtype, seed);
    it->body(cpu);
    it->body(gpu);
    const Outputs want = cpu.TakeOutputs(), got = gpu.TakeOutputs();
    ASSERT_EQ(want.size(), got.size());
    const double tolerance = dtype == DType::kF32 ? it->f32_tolerance : it->bf16_tolerance;
    for (size_t i = 0; i < want.size(); ++i) {
      const double error = testing::RelativeError(got[i].second, want[i].second);
      double& worst = WorstErrors()[name + " " + DTypeName(dtype)];
      worst = std::max(worst, error);
      EXPECT_LE(error, tolerance) << name << " output " << want[i].first << " (" << DTypeName(dtype)
                                  << ")";
    }
  }
}

// The bf16 grouped GEMMs of a Qwen3-30B-A3B expert layer run on the sm90 kernels (no host
// offsets) exactly on a compute capability 9.0 GPU; f32, sizes off multiples of 8 and more
// groups than the forward kernel holds always take cuBLAS.
TEST(GroupedMatmulPathTest, HopperKernelsTakeBf16ExpertLayersOnComputeCapability90) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  cudaDeviceProp properties;
  MOE_CUDA_CALL(cudaGetDeviceProperties(&properties, 0));
  const bool hopper = properties.major == 9 && properties.minor == 0;
  printf("%s (compute capability %d.%d): grouped GEMMs on %s\n", properties.name, properties.major,
         properties.minor, hopper ? "the sm90 kernels" : "cuBLAS");
  const Device gpu = Device::CUDA(0);
  EXPECT_EQ(ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16, {128, 1536, 2048}), !hopper);
  EXPECT_EQ(ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16, {128, 2048, 768}), !hopper);
  EXPECT_TRUE(ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kF32, {128, 1536, 2048}));
  EXPECT_TRUE(ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16, {8, 36, 64}));
  EXPECT_TRUE(ops::GroupedMatmulNeedsHostOffsets(gpu, DType::kBF16, {2048, 64, 64}));
}

// One case of the bit-identity tests below: on cuda:0, in `dtype`, at one size, with the
// generator every case draws from in turn and the case's name (with the seed that reruns it).
struct BitsCase {
  Device gpu;
  DType dtype;
  int64_t size;
  std::mt19937& rng;
  std::string where;
};

// Runs body(BitsCase) for bf16 and f32 at each of `sizes` ("<size_name> <size>" in the name), from
// one generator seeded by TestSeed().
void ForEachBitsCase(const char* size_name, std::initializer_list<int64_t> sizes,
                     const std::function<void(const BitsCase&)>& body) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  const uint32_t seed = testing::TestSeed();
  std::mt19937 rng(seed);
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    for (const int64_t size : sizes) {
      body({Device::CUDA(0), dtype, size, rng,
            std::string(DTypeName(dtype)) + ", " + size_name + " " + std::to_string(size) +
                ", MOE_TEST_SEED=" + std::to_string(seed)});
    }
  }
}

// A training head's fused cross-entropy (in place) has the bits of the forward and backward ops
// run one after the other, in bf16 and f32, with 16-byte and element accesses.
TEST(CrossEntropyForwardBackwardTest, HasTheBitsOfTheTwoOps) {
  ForEachBitsCase("vocab", {32000, 3001}, [](const BitsCase& c) {
    const int64_t tokens = 37, vocab = c.size;
    std::vector<int32_t> targets(tokens);
    for (int32_t& t : targets) t = static_cast<int32_t>(c.rng() % vocab);
    targets[3] = -1;  // ignored
    const Tensor t = FromInts(targets, {tokens}, c.gpu);
    const Tensor logits = testing::RandomTensor({tokens, vocab}, c.dtype, c.gpu, c.rng, 4.0f);
    const Tensor losses = PoisonedTensor({tokens}, DType::kF32, c.gpu);
    const Tensor lse = PoisonedTensor({tokens}, DType::kF32, c.gpu);
    const Tensor dlogits = PoisonedTensor({tokens, vocab}, c.dtype, c.gpu);
    ops::CrossEntropyForward(logits, t, losses, lse);
    ops::CrossEntropyBackward(logits, t, lse, 0.125f, dlogits);
    const Tensor fused_losses = PoisonedTensor({tokens}, DType::kF32, c.gpu);
    const Tensor fused_lse = PoisonedTensor({tokens}, DType::kF32, c.gpu);
    ops::CrossEntropyForwardBackward(logits, t, 0.125f, fused_losses, fused_lse, logits);
    EXPECT_EQ(testing::FloatBits(fused_losses), testing::FloatBits(losses)) << c.where;
    EXPECT_EQ(testing::FloatBits(fused_lse), testing::FloatBits(lse)) << c.where;
    EXPECT_EQ(testing::FloatBits(logits), testing::FloatBits(dlogits)) << c.where;
  });
}

// RMSNorm's forward with a residual has the bits of Add and then the norm, in bf16 and f32, with
// 16-byte and element accesses.
TEST(RmsNormForwardTest, ResidualHasTheBitsOfAddThenNorm) {
  ForEachBitsCase("h", {2048, 1030}, [](const BitsCase& c) {
    const int64_t rows = 45, h = c.size;
    const Tensor x = testing::RandomTensor({rows, h}, c.dtype, c.gpu, c.rng);
    const Tensor residual = testing::RandomTensor({rows, h}, c.dtype, c.gpu, c.rng);
    const Tensor weight = testing::RandomTensor({h}, c.dtype, c.gpu, c.rng);
    const Tensor sum = PoisonedTensor({rows, h}, c.dtype, c.gpu);
    const Tensor y = PoisonedTensor({rows, h}, c.dtype, c.gpu);
    const Tensor rstd = PoisonedTensor({rows}, DType::kF32, c.gpu);
    ops::Add(x, residual, sum);
    ops::RmsNormForward(sum, weight, 1e-5f, y, rstd);
    const Tensor fused_y = PoisonedTensor({rows, h}, c.dtype, c.gpu);
    const Tensor fused_rstd = PoisonedTensor({rows}, DType::kF32, c.gpu);
    ops::RmsNormForward(x, weight, 1e-5f, fused_y, fused_rstd, residual);  // x = x + residual
    EXPECT_EQ(testing::FloatBits(x), testing::FloatBits(sum)) << c.where;
    EXPECT_EQ(testing::FloatBits(fused_y), testing::FloatBits(y)) << c.where;
    EXPECT_EQ(testing::FloatBits(fused_rstd), testing::FloatBits(rstd)) << c.where;
  });
}

// RopeForward rotates one tensor's heads with RopeQkvForward's kernel: the bits of its q, apart
// and in place, from the heads the split without a table copies out; RopeBackward likewise has
// the bits of RopeQkvBackward's q part. bf16 and f32, 16-byte and element accesses.
TEST(RopeForwardTest, HasTheBitsOfRopeQkvForwardsQueries) {
  ForEachBitsCase("head dim", {128, 2 * 333}, [](const BitsCase& c) {
    const int64_t seq = 70, tokens = 2 * seq, heads = 4, kv_heads = 2, d = c.size;
    const int64_t width = (heads + 2 * kv_heads) * d;
    const Tensor table = PoisonedTensor({seq, d / 2, 2}, DType::kF32, c.gpu);
    ops::RopeTable(1e6f, table);
    const Tensor qkv = testing::RandomTensor({tokens, width}, c.dtype, c.gpu, c.rng);
    const auto heads_of = [&](int64_t n) { return PoisonedTensor({tokens, n, d}, c.dtype, c.gpu); };
    const Tensor q = heads_of(heads), k = heads_of(kv_heads), v = heads_of(kv_heads);
    const Tensor raw_q = heads_of(heads), raw_k = heads_of(kv_heads);
    ops::RopeQkvForward(qkv, table, q, k, v);
    ops::RopeQkvForward(qkv, Tensor(), raw_q, raw_k, v);
    const Tensor rotated = heads_of(heads);
    ops::RopeForward(raw_q, table, rotated);
    ops::RopeForward(raw_q, table, raw_q);
    EXPECT_EQ(testing::FloatBits(rotated), testing::FloatBits(q)) << c.where;
    EXPECT_EQ(testing::FloatBits(raw_q), testing::FloatBits(q)) << c.where;

    const Tensor dq = testing::RandomTensor({tokens, heads, d}, c.dtype, c.gpu, c.rng);
    const Tensor dqkv = PoisonedTensor({tokens, width}, c.dtype, c.gpu);
    ops::RopeQkvBackward(dq, k, v, table, dqkv);
    const Tensor dq_raw = heads_of(heads);
    ops::RopeBackward(dq, table, dq_raw);
    const std::vector<uint32_t> packed = testing::FloatBits(dqkv), got = testing::FloatBits(dq_raw);
    for (int64_t t = 0; t < tokens; ++t) {
      ASSERT_TRUE(std::equal(got.begin() + t * heads * d, got.begin() + (t + 1) * heads * d,
                             packed.begin() + t * width))
          << "token " << t << ", " << c.where;
    }
  });
}

// Grouped SwiGLU GEMMs (hidden k, SwiGLU width f) at row counts that end groups inside and on
// 64-row halves of the 128-row tiles, f on and off the 128-column halves of the tiles, and an
// empty group.
struct GroupedSwigluCase {
  std::vector<int32_t> offsets;
  int64_t k, f;
};

// One run of a grouped SwiGLU test: its case, the offsets on cuda:0, a scale (rows) f32 or
// undefined.
struct GroupedSwigluRun {
  OpRun& r;
  const GroupedSwigluCase& c;
  int64_t groups, rows;
  Tensor scale, offsets;
};

// Calls body on every case, with and without a scale, each in a fresh bf16 OpRun on cuda:0.
void ForEachGroupedSwigluRun(const std::function<void(const GroupedSwigluRun&)>& body) {
  for (const GroupedSwigluCase& c :
       {GroupedSwigluCase{{0, 64, 256, 293, 293, 577}, 128, 128},
        GroupedSwigluCase{{0, 1, 130, 300}, 200, 344}, GroupedSwigluCase{{0, 700}, 64, 1000}}) {
    for (const bool with_scale : {true, false}) {
      SCOPED_TRACE("f " + std::to_string(c.f) + (with_scale ? ", scale" : ", no scale"));
      OpRun r(Device::CUDA(0), DType::kBF16, testing::TestSeed());
      const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1, rows = c.offsets.back();
      body({r, c, groups, rows, with_scale ? r.InF32({rows}) : Tensor(),
            r.Ints(c.offsets, {groups + 1})});
    }
  }
}

// ops::GroupedMatmulSwiglu (on a Hopper GPU one kernel: SwiGLU in fc1's epilogue) gives h and a
// bit for bit as GroupedMatmul then SwigluForward do, with and without a scale.
TEST(GroupedMatmulSwigluTest, MatchesGroupedMatmulThenSwigluBitForBit) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  ForEachGroupedSwigluRun([](const GroupedSwigluRun& run) {
    OpRun& r = run.r;
    const int64_t rows = run.rows, f = run.c.f;
    const Tensor x = r.In({rows, run.c.k}), w = r.In({run.groups, 2 * f, run.c.k});
    const Tensor h = r.Out({rows, 2 * f}), a = r.Out({rows, f});
    const Tensor h_two = r.Out(h.shape()), a_two = r.Out(a.shape());
    ops::GroupedMatmulSwiglu(x, w, run.offsets, HostOffsetsWhereNeeded(r, run.c.offsets, w),
                             run.scale, h, a);
    ops::GroupedMatmul(x, w, run.offsets, HostOffsetsWhereNeeded(r, run.c.offsets, w), h_two,
                       /*transpose_w=*/true);
    ops::SwigluForward(h_two, run.scale, a_two);
    for (const auto& [name, one, two] : {std::tuple{"h", h, h_two}, std::tuple{"a", a, a_two}}) {
      const std::vector<float> got = testing::ToFloats(one), want = testing::ToFloats(two);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << name << " differs from the two ops'";
    }
  });
}

// got and want (rows) f32, two sums of the f32 terms t_j = silu(gate_j) up_j da_j of each row
// (h (rows, 2f) = [gate | up], da (rows, f) as stored) in different orders, agree within twice the
// bound of one order: f 2^-24 sum_j |t_j| of the exact sum to first order (f - 1 additions; an
// FMA may skip a term's rounding); 2f + 2 leaves slack for this host estimate of sum_j |t_j|.
void ExpectDscaleWithinOrderBound(const Tensor& h, const Tensor& da, const Tensor& got,
                                  const Tensor& want) {
  const int64_t rows = da.dim(0), f = da.dim(1);
  const std::vector<float> gate_up = testing::ToFloats(h), d = testing::ToFloats(da);
  const std::vector<float> got_dscale = testing::ToFloats(got);
  const std::vector<float> want_dscale = testing::ToFloats(want);
  for (int64_t i = 0; i < rows; ++i) {
    double magnitude = 0;
    for (int64_t j = 0; j < f; ++j) {
      const double gate = gate_up[i * 2 * f + j], up = gate_up[i * 2 * f + f + j];
      magnitude += std::abs(gate / (1.0 + std::exp(-gate)) * up * d[i * f + j]);
    }
    const double bound = (2.0 * f + 2.0) * std::ldexp(1.0, -24) * magnitude;
    ASSERT_LE(std::abs(static_cast<double>(got_dscale[i]) - want_dscale[i]), bound)
        << "dscale of row " << i << ": " << got_dscale[i] << " vs " << want_dscale[i];
  }
}

// ops::GroupedMatmulSwigluBackward (on a Hopper GPU one kernel, here at every k: SwiGLU's backward
// in fc2's dgrad epilogue) gives dh bit for bit as GroupedMatmul then SwigluBackward do, and dscale
// within the bound of summing the same terms in another order, with and without a scale (and
// dscale).
TEST(GroupedMatmulSwigluTest, BackwardMatchesGroupedMatmulThenSwigluBackward) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  ForEachGroupedSwigluRun([](const GroupedSwigluRun& run) {
    OpRun& r = run.r;
    const int64_t rows = run.rows, f = run.c.f;
    const Tensor dy = r.In({rows, run.c.k}), w = r.In({run.groups, run.c.k, f});
    const Tensor h = r.In({rows, 2 * f});
    const Tensor dh = r.Out(h.shape()), dh_two = r.Out(h.shape()), da_two = r.Out({rows, f});
    const bool with_scale = run.scale.defined();
    const Tensor dscale = with_scale ? r.OutF32({rows}) : Tensor();
    const Tensor dscale_two = with_scale ? r.OutF32({rows}) : Tensor();
    const SwigluBackwardFusedAtAnyK fused;
    ops::GroupedMatmulSwigluBackward(
        dy, w, run.offsets, HostOffsetsWhereNeeded(r, run.c.offsets, w), h, run.scale, dh, dscale);
    ops::GroupedMatmul(dy, w, run.offsets, HostOffsetsWhereNeeded(r, run.c.offsets, w), da_two,
                       /*transpose_w=*/false);
    ops::SwigluBackward(da_two, h, run.scale, dh_two, dscale_two);
    const std::vector<float> got = testing::ToFloats(dh), want = testing::ToFloats(dh_two);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "dh differs from the two ops'";
    if (with_scale) ExpectDscaleWithinOrderBound(h, da_two, dscale, dscale_two);
  });
}

// The blockwise FP8 quantisation has the CPU reference's bits (the fp8_quantize case compares
// values): q with its signed zeros, and the scales, from f32 and bf16 inputs.
TEST(Fp8QuantizeTest, HasTheCpuReferencesBits) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const uint32_t seed = testing::TestSeed();
    OpRun cpu_run(Device::CPU(), dtype, seed), gpu_run(Device::CUDA(0), dtype, seed);
    const Fp8Operands cpu(cpu_run), gpu(gpu_run);
    EXPECT_EQ(testing::FloatBits(gpu.xq), testing::FloatBits(cpu.xq));
    EXPECT_EQ(testing::FloatBits(gpu.x_scales), testing::FloatBits(cpu.x_scales));
    EXPECT_EQ(testing::FloatBits(gpu.wq), testing::FloatBits(cpu.wq));
    EXPECT_EQ(testing::FloatBits(gpu.w_scales), testing::FloatBits(cpu.w_scales));
    EXPECT_EQ(testing::FloatBits(gpu.wq_t), testing::FloatBits(cpu.wq_t));
    EXPECT_EQ(testing::FloatBits(gpu.w_scales_t), testing::FloatBits(cpu.w_scales_t));
  }
}

// QuantizeColumnTiles has the CPU reference's bits (the fp8_column_tiles cases compare values):
// q with its signed zeros and zero padding, the scales with the unused slots' zeros, and the row
// tiles, from f32 and bf16 inputs.
TEST(Fp8QuantizeColumnTilesTest, HasTheCpuReferencesBits) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Fp8ColumnTileCase& c : Fp8ColumnTileCases()) {
      const uint32_t seed = testing::TestSeed();
      SCOPED_TRACE(c.name + " " + DTypeName(dtype) + ", MOE_TEST_SEED=" + std::to_string(seed));
      OpRun cpu_run(Device::CPU(), dtype, seed), gpu_run(Device::CUDA(0), dtype, seed);
      const auto want = Fp8ColumnTileOperands(cpu_run, c).Outputs();
      const auto got = Fp8ColumnTileOperands(gpu_run, c).Outputs();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(testing::FloatBits(got[i].second), testing::FloatBits(want[i].second))
            << want[i].first;
      }
    }
  }
}

// Calls test(r, offsets, groups, rows, f) on the GPU for f32 and bf16 and each column-tile case
// read without an index (f = its k), each with its own seed.
template <typename Test>
void ForEachSwigluQuantizedCase(Test test) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Fp8ColumnTileCase& c : Fp8ColumnTileCases()) {
      if (c.through_index) continue;
      const uint32_t seed = testing::TestSeed();
      SCOPED_TRACE(c.name + " " + DTypeName(dtype) + ", MOE_TEST_SEED=" + std::to_string(seed));
      OpRun r(Device::CUDA(0), dtype, seed);
      const int64_t groups = static_cast<int64_t>(c.offsets.size()) - 1, rows = c.offsets.back();
      test(r, r.Ints(c.offsets, {groups + 1}), groups, rows, c.k);
    }
  }
}

// Fresh outputs for the FP8 forms of grouped rows (rows, k): q, scales, row_q, row_scales.
std::vector<Tensor> Fp8FormOutputs(OpRun& r, int64_t groups, int64_t rows, int64_t k) {
  return {r.OutE4M3({k, Fp8ColumnTokens(groups, rows)}),
          r.OutF32({Fp8ColumnTileSlots(groups, rows), k}), r.OutE4M3({rows, k}),
          r.OutF32({rows, Fp8Tiles(k)})};
}

// SwigluForwardQuantized on the GPU has the bits of the GPU's SwigluForward, then
// QuantizeColumnTiles of its output (the CPU's SwiGLU rounds differently, so the two backends'
// FP8 forms may differ in a value's last bit before quantisation: compared on one device): both
// tile forms together, and each alone, f32 and bf16 h, with and without the routing scale, on the
// column-tile cases' offsets (f = their k).
TEST(Fp8SwigluForwardQuantizedTest, IsSwigluForwardThenTheQuantisationBitForBit) {
  ForEachSwigluQuantizedCase([](OpRun& r, const Tensor& offsets, int64_t groups, int64_t rows,
                                int64_t f) {
    const Tensor h = r.In({rows, 2 * f}, 4.0f);
    for (const Tensor& scale : {r.InF32({rows}), Tensor()}) {
      const Tensor a = r.Out({rows, f});
      ops::SwigluForward(h, scale, a);
      const std::vector<Tensor> want = Fp8FormOutputs(r, groups, rows, f),
                                both = Fp8FormOutputs(r, groups, rows, f),
                                columns = Fp8FormOutputs(r, groups, rows, f),
                                rows_only = Fp8FormOutputs(r, groups, rows, f);
      ops::QuantizeColumnTiles(a, offsets, want[0], want[1], want[2], want[3]);
      ops::SwigluForwardQuantized(h, scale, offsets, both[0], both[1], both[2], both[3]);
      ops::SwigluForwardQuantized(h, scale, offsets, columns[0], columns[1], Tensor(), Tensor());
      ops::SwigluForwardQuantized(h, scale, offsets, Tensor(), Tensor(), rows_only[2],
                                  rows_only[3]);
      const char* names[] = {"q", "scales", "row_q", "row_scales"};
      for (int i = 0; i < 4; ++i) {
        const std::vector<uint32_t> bits = testing::FloatBits(want[i]);
        EXPECT_EQ(testing::FloatBits(both[i]), bits) << names[i];
        EXPECT_EQ(testing::FloatBits(i < 2 ? columns[i] : rows_only[i]), bits)
            << names[i] << " alone";
      }
    }
  });
}

// SwigluBackwardQuantized on the GPU has the bits of the GPU's SwigluBackward then
// QuantizeColumnTiles of dh (f = the cases' k: dh's 2f columns put gate and up halves in one
// 128-column tile where f is not a multiple of 128), f32 and bf16; its dscale is SwigluBackward's
// bit for bit where f is not a multiple of 128, else within the bound of another order.
TEST(Fp8SwigluBackwardQuantizedTest, IsSwigluBackwardThenTheQuantisationBitForBit) {
  ForEachSwigluQuantizedCase(
      [](OpRun& r, const Tensor& offsets, int64_t groups, int64_t rows, int64_t f) {
        const Tensor h = r.In({rows, 2 * f}, 4.0f), da = r.In({rows, f}), scale = r.InF32({rows});
        const Tensor dh = r.Out({rows, 2 * f}), want_dscale = r.OutF32({rows});
        ops::SwigluBackward(da, h, scale, dh, want_dscale);
        const std::vector<Tensor> want = Fp8FormOutputs(r, groups, rows, 2 * f),
                                  got = Fp8FormOutputs(r, groups, rows, 2 * f);
        ops::QuantizeColumnTiles(dh, offsets, want[0], want[1], want[2], want[3]);
        const Tensor dscale = r.OutF32({rows});
        ops::SwigluBackwardQuantized(da, h, scale, offsets, got[0], got[1], got[2], got[3], dscale);
        const char* names[] = {"q", "scales", "row_q", "row_scales"};
        for (int i = 0; i < 4; ++i) {
          EXPECT_EQ(testing::FloatBits(got[i]), testing::FloatBits(want[i])) << names[i];
        }
        if (f % kFp8TileSize != 0) {
          EXPECT_EQ(testing::FloatBits(dscale), testing::FloatBits(want_dscale)) << "dscale";
        } else {
          ExpectDscaleWithinOrderBound(h, da, dscale, want_dscale);
        }
      });
}

// The bf16 attention kernels (Hopper and mma.sync) accumulate every output element in a fixed
// order, with no atomics: two runs on the same inputs agree bit for bit (the offload and pipeline
// bit-identity tests rely on it), at both head dims and with GQA groups split over clusters.
TEST(AttentionDeterminismTest, TwoRunsAgreeBitForBit) {
  ASSERT_GT(CudaDeviceCount(), 0) << "cuda tests need a GPU: they must not pass without one";
  for (const AttentionShape& s :
       {AttentionShape{1, 300, 8, 2, 128}, AttentionShape{2, 200, 4, 4, 64}}) {
    Outputs runs[2];
    for (Outputs& outputs : runs) {
      OpRun r(Device::CUDA(0), DType::kBF16, 1234);
      RunAttention(r, s);
      outputs = r.TakeOutputs();
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      const std::vector<float>& a = runs[0][i].second;
      const std::vector<float>& b = runs[1][i].second;
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << runs[0][i].first << " differs between runs at head dim " << s.d;
    }
  }
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const OpCase& c : Cases()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpParityTest,
                         ::testing::Combine(::testing::ValuesIn(CaseNames()),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  DTypeName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace moe
