// CPU rotary position embedding, f32. x, y (batch * seq, heads, d); the position of row r is
// r % seq_len. For i < d/2 the pair (x_i, x_{i+d/2}) rotates by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward applies the inverse rotation (angle negated). Angles are computed in double. Output
// may alias input: each pair is read before it is written.
#include <cmath>
#include <vector>

#include "engine/kernels/cpu/cpu_ops.h"

namespace moe::cpu {
namespace {

// Rotates every pair by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(const Tensor& x, int64_t seq_len, float base, float direction, const Tensor& y) {
  const int64_t tokens = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  std::vector<float> cos_table(seq_len * half), sin_table(seq_len * half);
  for (int64_t pos = 0; pos < seq_len; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * std::pow(static_cast<double>(base), -2.0 * i / d);
      cos_table[pos * half + i] = static_cast<float>(std::cos(angle));
      sin_table[pos * half + i] = direction * static_cast<float>(std::sin(angle));
    }
  }
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = &cos_table[(t % seq_len) * half];
    const float* s = &sin_table[(t % seq_len) * half];
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t row = (t * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float lo = px[row + i], hi = px[row + i + half];
        py[row + i] = lo * c[i] - hi * s[i];
        py[row + i + half] = hi * c[i] + lo * s[i];
      }
    }
  }
}

}  // namespace

void RopeForward(const Tensor& x, int64_t seq_len, float base, const Tensor& y) {
  Rotate(x, seq_len, base, 1.0f, y);
}

void RopeBackward(const Tensor& dy, int64_t seq_len, float base, const Tensor& dx) {
  Rotate(dy, seq_len, base, -1.0f, dx);
}

}  // namespace moe::cpu
