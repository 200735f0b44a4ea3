// CPU rotary position embedding, f32. RopeTable: table (seq, d/2, 2) = {cos, sin} of angle
// pos * base^(-2i/d), computed in double and rounded to float. RopeQkvForward moves each token's
// heads from the packed qkv (q's heads, k's, v's) into q, k and v; RopeQkvBackward moves them
// back. The position of token row r is r % seq. For i < d/2 the pair (x_i, x_{i+d/2}) of a q or
// k head rotates by its angle:
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin;
// backward applies the inverse rotation (sin negated). v's heads are copied.
#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Moves every head between the packed qkv and q, k, v, rotating q's and k's pairs by their angle
// (to_packed: into qkv, by minus their angle: the gradient's inverse rotation).
void MoveHeads(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& table, bool to_packed) {
  const float direction = to_packed ? -1.0f : 1.0f;
  const int64_t tokens = q.dim(0), heads = q.dim(1), kv_heads = k.dim(1), d = q.dim(2);
  const int64_t half = d / 2, slots = heads + 2 * kv_heads, seq = table.dim(0);
  const float* pt = table.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* rotation = pt + (t % seq) * half * 2;
    for (int64_t slot = 0; slot < slots; ++slot) {
      float* packed = qkv.data<float>() + (t * slots + slot) * d;
      float* split = slot < heads ? q.data<float>() + (t * heads + slot) * d
                     : slot < heads + kv_heads
                         ? k.data<float>() + (t * kv_heads + slot - heads) * d
                         : v.data<float>() + (t * kv_heads + slot - heads - kv_heads) * d;
      const float* from = to_packed ? split : packed;
      float* to = to_packed ? packed : split;
      if (slot >= heads + kv_heads) {
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
  MoveHeads(qkv, q, k, v, table, /*to_packed=*/false);
}

void RopeQkvBackward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& table,
                     const Tensor& dqkv) {
  MoveHeads(dqkv, dq, dk, dv, table, /*to_packed=*/true);
}

}  // namespace moe::cpu
