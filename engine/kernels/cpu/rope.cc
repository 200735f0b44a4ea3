// CPU rotary position embedding, f32. RopeTable: table (seq, d/2, 2) = {cos, sin} of angle
// pos * base^(-2i/d), computed in double and rounded to float. x, y (batch * seq, heads, d); the
// position of row r is r % seq. For i < d/2 the pair (x_i, x_{i+d/2}) rotates by its angle:
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward applies the inverse rotation (sin negated). Output may alias input: each pair is read
// before it is written.
#include <cmath>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Rotates every pair by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(const Tensor& x, const Tensor& table, float direction, const Tensor& y) {
  const int64_t tokens = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  const int64_t seq = table.dim(0);
  const float* px = x.data<float>();
  const float* pt = table.data<float>();
  float* py = y.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* rotation = pt + (t % seq) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t row = (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float c = rotation[2 * i], s = direction * rotation[2 * i + 1];
        const float lo = px[row + i], hi = px[row + i + half];
        py[row + i] = lo * c - hi * s;
        py[row + i + half] = hi * c + lo * s;
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

void RopeForward(const Tensor& x, const Tensor& table, const Tensor& y) {
  Rotate(x, table, 1.0f, y);
}

void RopeBackward(const Tensor& dy, const Tensor& table, const Tensor& dx) {
  Rotate(dy, table, -1.0f, dx);
}

}  // namespace moe::cpu
