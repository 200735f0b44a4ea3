// CUDA rotary position embedding (contracts: engine/kernels/op_declarations.inc). x, y
// (batch * seq, heads, d), f32 or bf16; position of row r is r % seq_len; rotate-half pairs
// (i, i + d/2), i < d/2, turn by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward is the inverse rotation (sin negated). One block per token row: its threads first
// compute the row's d/2 angles in double, like the CPU reference (a float angle loses ~1e-4 rad
// at positions in the thousands), as {cos, sin} floats in shared memory; then each thread rotates
// kVec consecutive pairs of a head (one 16-byte access per half for bf16 when d/2 allows). Each
// pair is read before it is written, so y may alias x.
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kMaxThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    RopeKernel(const T* x, int heads, int half, int64_t seq_len, double base, float direction,
               T* y) {
  extern __shared__ float2 rotation[];  // [half]: {cos, direction * sin} of this row's angles
  const int64_t token = blockIdx.x;
  const double pos = static_cast<double>(token % seq_len);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double sin_angle, cos_angle;
    sincos(pos * pow(base, -2.0 * i / (2 * half)), &sin_angle, &cos_angle);
    rotation[i] =
        make_float2(static_cast<float>(cos_angle), direction * static_cast<float>(sin_angle));
  }
  __syncthreads();
  const int chunks = half / kVec;  // per head
  const int64_t row_at = token * heads * 2 * half;
  for (int c = threadIdx.x; c < heads * chunks; c += blockDim.x) {
    const int head = c / chunks, i0 = c % chunks * kVec;
    const int64_t lo_at = row_at + int64_t{head} * 2 * half + i0, hi_at = lo_at + half;
    const Floats<kVec> lo = LoadFloats<kVec>(x + lo_at), hi = LoadFloats<kVec>(x + hi_at);
    Floats<kVec> y_lo, y_hi;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float2 r = rotation[i0 + j];
      y_lo.v[j] = lo.v[j] * r.x - hi.v[j] * r.y;
      y_hi.v[j] = hi.v[j] * r.x + lo.v[j] * r.y;
    }
    StoreFloats<kVec>(y + lo_at, y_lo);
    StoreFloats<kVec>(y + hi_at, y_hi);
  }
}

// Rotates every pair by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(const Tensor& x, int64_t seq_len, float base, float direction, const Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t tokens = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  CHECK(tokens < (int64_t{1} << 31) && heads * half < (int64_t{1} << 31)) << x.DebugString();
  constexpr int64_t kMaxAngleBytes = 48 * 1024;  // a block's angles, in default shared memory
  CHECK_LE(half * int64_t{sizeof(float2)}, kMaxAngleBytes)
      << "rope: head_dim " << 2 * half << " exceeds " << kMaxAngleBytes / sizeof(float2) * 2;
  const cudaStream_t stream = StreamOf(x);
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(half, {x.data(), y.data()}, [&]<int kVec>(VecTag<kVec>) {
      const int threads = RowThreads(std::max(heads * half / kVec, half), kMaxThreads);
      RopeKernel<T, kVec>
          <<<static_cast<unsigned>(tokens), threads, half * sizeof(float2), stream>>>(
              Ptr<const T>(x), static_cast<int>(heads), static_cast<int>(half), seq_len, base,
              direction, Ptr<T>(y));
      MOE_CUDA_CHECK_LAUNCH();
    });
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
