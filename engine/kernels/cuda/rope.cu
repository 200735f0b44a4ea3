// CUDA rotary position embedding (contracts: engine/kernels/op_declarations.inc). x, y
// (batch * seq, heads, d), f32 or bf16; position of row r is r % seq_len; rotate-half pairs
// (i, i + d/2), i < d/2, turn by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward is the inverse rotation (sin negated). The angles are computed in double, like the
// CPU reference (a float angle loses ~1e-4 rad at positions in the thousands), into a
// (seq_len, d/2) table of {cos, ±sin} floats; then one thread rotates one pair. Each pair is
// read before it is written, so y may alias x.
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

__global__ void RopeTableKernel(int64_t seq_len, int64_t half, double base, float direction,
                                float2* table) {
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < seq_len * half;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t pos = idx / half, i = idx % half;
    const double angle = static_cast<double>(pos) * pow(base, -2.0 * i / (2 * half));
    double sin_angle, cos_angle;
    sincos(angle, &sin_angle, &cos_angle);
    table[idx] =
        make_float2(static_cast<float>(cos_angle), direction * static_cast<float>(sin_angle));
  }
}

template <typename T>
__global__ void RopeKernel(const T* x, int64_t tokens, int64_t heads, int64_t half, int64_t seq_len,
                           const float2* table, T* y) {
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < tokens * heads * half;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half, token_head = idx / half, token = token_head / heads;
    const float2 rotation = table[(token % seq_len) * half + i];
    const int64_t lo_at = token_head * 2 * half + i, hi_at = lo_at + half;
    const float lo = ToFloat(x[lo_at]), hi = ToFloat(x[hi_at]);
    y[lo_at] = FromFloat<T>(lo * rotation.x - hi * rotation.y);
    y[hi_at] = FromFloat<T>(hi * rotation.x + lo * rotation.y);
  }
}

// Rotates every pair by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(const Tensor& x, int64_t seq_len, float base, float direction, const Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t tokens = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  const cudaStream_t stream = StreamOf(x);
  Tensor table = Tensor::Empty({seq_len, half, 2}, DType::kF32, x.device());
  constexpr int kThreads = 256;
  RopeTableKernel<<<BlocksFor(seq_len * half, kThreads), kThreads, 0, stream>>>(
      seq_len, half, base, direction, Ptr<float2>(table));
  MOE_CUDA_CHECK_LAUNCH();
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    RopeKernel<T><<<BlocksFor(tokens * heads * half, kThreads), kThreads, 0, stream>>>(
        Ptr<const T>(x), tokens, heads, half, seq_len, Ptr<const float2>(table), Ptr<T>(y));
    MOE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void RopeForward(const Tensor& x, int64_t seq_len, float base, const Tensor& y) {
  Rotate(x, seq_len, base, 1.0f, y);
}

void RopeBackward(const Tensor& dy, int64_t seq_len, float base, const Tensor& dx) {
  Rotate(dy, seq_len, base, -1.0f, dx);
}

}  // namespace moe::cuda
