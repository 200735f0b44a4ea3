// CUDA rotary position embedding (contracts: engine/kernels/op_declarations.inc). x, y
// (batch * seq, heads, d), f32 or bf16; position of row r is r % seq, seq = table.dim(0);
// rotate-half pairs (i, i + d/2), i < d/2, turn by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward is the inverse rotation (sin negated).
// RopeTable computes the (seq, d/2) {cos, sin} pairs once, one thread each, in double like the
// CPU reference (a float angle loses ~1e-4 rad at positions in the thousands); it runs once per
// module, so its speed does not matter. The rotation only streams: a grid-stride loop over
// (token, head, chunk) items, each kVec consecutive pairs of a head (one 16-byte access per half
// for bf16 when d/2 allows) with their {cos, sin} from the table (16-byte loads too; every head
// of a token reads the same table row, from L1 or L2). Flat items fill every block whatever the
// heads and d (a block per token row has 32 threads for 4 KV heads of 128). (The preset's q and
// k, 4096 tokens of 16 and 4 heads of 128, bf16, under ncu on the H200: 9.8-10.6 and 4.3-4.8 us;
// angles in double in every call, a block per token row: 11.0-12.7 and 8.0-8.5 us.) Each pair is
// read before it is written, so y may alias x.
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    RopeTableKernel(int64_t positions, int half, double base, float2* table) {
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < positions * half;
       n += int64_t{gridDim.x} * blockDim.x) {
    const double pos = static_cast<double>(n / half);
    const int i = static_cast<int>(n % half);
    double sin_angle, cos_angle;
    sincos(pos * pow(base, -2.0 * i / (2 * half)), &sin_angle, &cos_angle);
    table[n] = make_float2(static_cast<float>(cos_angle), static_cast<float>(sin_angle));
  }
}

// items = tokens * heads * (half / kVec); table (positions, half) {cos, sin} pairs.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const T* x, const float* table, uint32_t items, uint32_t heads, uint32_t half,
               uint32_t positions, float direction, T* y) {
  const uint32_t chunks = half / kVec;  // per head
  for (uint32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < items;
       item += gridDim.x * blockDim.x) {
    const uint32_t head_row = item / chunks;  // token * heads + head
    const uint32_t i0 = (item - head_row * chunks) * kVec;
    const uint32_t pos = head_row / heads % positions;
    const int64_t lo_at = int64_t{head_row} * 2 * half + i0, hi_at = lo_at + half;
    const Floats<kVec> lo = LoadFloats<kVec>(x + lo_at), hi = LoadFloats<kVec>(x + hi_at);
    const Floats<2 * kVec> rotation = LoadFloats<2 * kVec>(table + (pos * half + i0) * 2);
    Floats<kVec> y_lo, y_hi;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float c = rotation.v[2 * j], s = direction * rotation.v[2 * j + 1];
      y_lo.v[j] = lo.v[j] * c - hi.v[j] * s;
      y_hi.v[j] = hi.v[j] * c + lo.v[j] * s;
    }
    StoreFloats<kVec>(y + lo_at, y_lo);
    StoreFloats<kVec>(y + hi_at, y_hi);
  }
}

// Rotates every pair by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(const Tensor& x, const Tensor& table, float direction, const Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t heads = x.dim(1), half = x.dim(2) / 2;
  CHECK_LT(x.numel() / 2, int64_t{1} << 31)
      << "rope: too many pairs for 32-bit items " << x.DebugString();
  CHECK_LT(table.numel(), int64_t{1} << 31) << table.DebugString();
  CHECK(reinterpret_cast<uintptr_t>(table.data()) % sizeof(float2) == 0) << table.DebugString();
  const cudaStream_t stream = StreamOf(x);
  DispatchFloat(x.dtype(), [&]<typename T>(TypeTag<T>) {
    DispatchVec(half, {x.data(), y.data(), table.data()}, [&]<int kVec>(VecTag<kVec>) {
      const int64_t items = x.numel() / 2 / kVec;
      RopeKernel<T, kVec><<<BlocksFor(items, kThreads), kThreads, 0, stream>>>(
          Ptr<const T>(x), Ptr<const float>(table), static_cast<uint32_t>(items),
          static_cast<uint32_t>(heads), static_cast<uint32_t>(half),
          static_cast<uint32_t>(table.dim(0)), direction, Ptr<T>(y));
      MOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

void RopeTable(float base, const Tensor& table) {
  const int64_t pairs = table.numel() / 2;
  CHECK_LT(table.dim(1), int64_t{1} << 30) << table.DebugString();  // 2 * half in an int
  RopeTableKernel<<<BlocksFor(pairs, kThreads), kThreads, 0, StreamOf(table)>>>(
      table.dim(0), static_cast<int>(table.dim(1)), base, Ptr<float2>(table));
  MOE_CUDA_CHECK_LAUNCH();
}

void RopeForward(const Tensor& x, const Tensor& table, const Tensor& y) {
  Rotate(x, table, 1.0f, y);
}

void RopeBackward(const Tensor& dy, const Tensor& table, const Tensor& dx) {
  Rotate(dy, table, -1.0f, dx);
}

}  // namespace moe::cuda
