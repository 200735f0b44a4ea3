// CPU rotary position embedding, f32. RopeTable: table (seq, d/2, 2) = {cos, sin} of angle
// pos * base^(-2i/d), computed in double and rounded to float. RopeQkvForward moves each token's
// heads from the packed qkv (q's heads, k's, v's) into q, k and v; RopeQkvBackward moves them
// back; RopeForward and RopeBackward rotate one (tokens, heads, d) tensor, whose layout is a packed
// one with q's heads only. The position of token row r is r % seq. For i < d/2 the pair (x_i,
// x_{i+d/2}) of a q or k head rotates by its angle:
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin;
// backward applies the inverse rotation (sin negated). v's heads are copied, and so is every head
// without a table.
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// The separate side of a move: q's heads, then k's and v's (kv_heads each, none for a lone
// tensor), each (tokens, that many heads, d).
struct SplitHeads {
  float* q;
  float* k;
  float* v;
  int64_t heads, kv_heads;

  // Token t's head `slot` of heads + 2 kv_heads.
  float* Head(int64_t t, int64_t slot, int64_t d) const {
    if (slot < heads) return q + (t * heads + slot) * d;
    slot -= heads;
    if (slot < kv_heads) return k + (t * kv_heads + slot) * d;
    return v + (t * kv_heads + slot - kv_heads) * d;
  }
};

// Moves every head between `packed` (tokens, heads + 2 kv_heads, d) and `split`, rotating q's
// and k's pairs by their angle when there is a table (to_packed: into packed, by minus their
// angle: the gradient's inverse rotation). Each pair is read before it is written: the two sides
// may be one buffer.
void MoveHeads(float* packed, const SplitHeads& split, int64_t tokens, int64_t d,
               const Tensor& table, bool to_packed) {
  const float direction = to_packed ? -1.0f : 1.0f;
  const int64_t half = d / 2, slots = split.heads + 2 * split.kv_heads;
  const int64_t rotated = table.defined() ? split.heads + split.kv_heads : 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* rotation =
        table.defined() ? table.data<float>() + (t % table.dim(0)) * half * 2 : nullptr;
    for (int64_t slot = 0; slot < slots; ++slot) {
      float* packed_head = packed + (t * slots + slot) * d;
      float* split_head = split.Head(t, slot, d);
      const float* from = to_packed ? split_head : packed_head;
      float* to = to_packed ? packed_head : split_head;
      if (slot >= rotated) {
        std::copy(from, from + d, to);
        continue;
      }
      for (int64_t i = 0; i < half; ++i) {
        const float c = rotation[2 * i], s = direction * rotation[2 * i + 1];
        const float lo = from[i], hi = from[i + half];
        to[i] = lo * c - hi * s;
        to[i + half] = hi * c + lo * s;
      }
    }
  }
}

SplitHeads QkvHeads(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.data<float>(), k.data<float>(), v.data<float>(), q.dim(1), k.dim(1)};
}

SplitHeads LoneHeads(const Tensor& x) { return {x.data<float>(), nullptr, nullptr, x.dim(1), 0}; }

}  // namespace

void RopeTable(float base, const Tensor& table) {
  const int64_t seq = table.dim(0), half = table.dim(1), d = 2 * half;
  float* out = table.data<float>();
  for (int64_t pos = 0; pos < seq; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * std::pow(static_cast<double>(base), -2.0 * i / d);
      out[(pos * half + i) * 2] = static_cast<float>(std::cos(angle));
      out[(pos * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

void RopeQkvForward(const Tensor& qkv, const Tensor& table, const Tensor& q, const Tensor& k,
                    const Tensor& v) {
  MoveHeads(qkv.data<float>(), QkvHeads(q, k, v), q.dim(0), q.dim(2), table, /*to_packed=*/false);
}

void RopeQkvBackward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& table,
                     const Tensor& dqkv) {
  MoveHeads(dqkv.data<float>(), QkvHeads(dq, dk, dv), dq.dim(0), dq.dim(2), table,
            /*to_packed=*/true);
}

void RopeForward(const Tensor& x, const Tensor& table, const Tensor& y) {
  MoveHeads(x.data<float>(), LoneHeads(y), x.dim(0), x.dim(2), table, /*to_packed=*/false);
}

void RopeBackward(const Tensor& dy, const Tensor& table, const Tensor& dx) {
  MoveHeads(dx.data<float>(), LoneHeads(dy), dy.dim(0), dy.dim(2), table, /*to_packed=*/true);
}

}  // namespace moe::cpu
