// CUDA rotary position embedding (contracts: engine/kernels/op_declarations.inc). qkv (batch *
// seq, (heads + 2 kv_heads) d) against q (batch * seq, heads, d) and k, v (batch * seq, kv_heads,
// d), f32 or bf16; position of row r is r % seq, seq = table.dim(0); rotate-half pairs (i, i +
// d/2), i < d/2, of q's and k's heads turn by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin;
// v's heads are copied, and so is every head without a table. Forward moves heads out of qkv,
// backward into it with the inverse rotation (sin negated). RopeForward / RopeBackward rotate one
// (tokens, heads, d) tensor, in place or not: the same kernel, that tensor being a packed one with
// q's heads only (no k or v).
// RopeTable computes the (seq, d/2) {cos, sin} pairs once, one thread each, in double like the
// CPU reference (a float angle loses ~1e-4 rad at positions in the thousands); it runs once per
// model chunk, so its speed does not matter. The move only streams: a grid-stride loop over
// (token, head, chunk) items, each kVec consecutive pairs of a head (one 16-byte access per half
// for bf16 when d/2 allows) with their {cos, sin} from the table (16-byte loads too; every head
// of a token reads the same table row, from L1 or L2). Flat items fill every block whatever the
// heads and d.
#include "engine/kernels/cuda/common/cuda_common.cuh"
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

// q, k and v as the kernel moves heads between them and the packed qkv (k and v null with no
// kv_heads: a lone tensor).
template <typename T>
struct SplitHeads {
  T* q;
  T* k;
  T* v;
  uint32_t heads, kv_heads;
  uint32_t rotated;  // the first slots, q's and k's heads, rotated; 0 without a table

  // Token t's head `slot` of heads + 2 kv_heads: q's, then k's, then v's; d elements each.
  __device__ T* Head(uint32_t t, uint32_t slot, uint32_t d) const {
    if (slot < heads) return q + (int64_t{t} * heads + slot) * d;
    slot -= heads;
    if (slot < kv_heads) return k + (int64_t{t} * kv_heads + slot) * d;
    return v + (int64_t{t} * kv_heads + slot - kv_heads) * d;
  }
};

// items = tokens * (heads + 2 kv_heads) * (half / kVec); table (positions, half) {cos, sin}
// pairs. Moves kVec pairs of one head from qkv to split, rotating those of the first
// split.rotated slots by their angle (kToPacked: back, by minus their angle: the gradient's
// inverse rotation). A thread reads its pairs before it writes them: qkv and split may alias.
template <typename T, int kVec, bool kToPacked>
__global__ void __launch_bounds__(kThreads)
    RopeQkvKernel(T* qkv, SplitHeads<T> split, const float* table, uint32_t items, uint32_t half,
                  uint32_t positions) {
  constexpr float kDirection = kToPacked ? -1.0f : 1.0f;
  const uint32_t chunks = half / kVec;  // per head
  const uint32_t slots = split.heads + 2 * split.kv_heads, d = 2 * half;
  for (uint32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < items;
       item += gridDim.x * blockDim.x) {
    const uint32_t head_row = item / chunks;  // token * slots + slot
    const uint32_t i0 = (item - head_row * chunks) * kVec;
    const uint32_t token = head_row / slots, slot = head_row - token * slots;
    T* packed = qkv + int64_t{head_row} * d + i0;
    T* separate = split.Head(token, slot, d) + i0;
    const T* from = kToPacked ? separate : packed;
    T* to = kToPacked ? packed : separate;
    const Floats<kVec> lo = LoadFloats<kVec>(from), hi = LoadFloats<kVec>(from + half);
    if (slot >= split.rotated) {  // v, or any head without a table: copied
      StoreFloats<kVec>(to, lo);
      StoreFloats<kVec>(to + half, hi);
      continue;
    }
    const Floats<2 * kVec> rotation =
        LoadFloats<2 * kVec>(table + (token % positions * half + i0) * 2);
    Floats<kVec> y_lo, y_hi;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float c = rotation.v[2 * j], s = kDirection * rotation.v[2 * j + 1];
      y_lo.v[j] = lo.v[j] * c - hi.v[j] * s;
      y_hi.v[j] = hi.v[j] * c + lo.v[j] * s;
    }
    StoreFloats<kVec>(to, y_lo);
    StoreFloats<kVec>(to + half, y_hi);
  }
}

// Moves every head between `packed` and q, k, v (k and v undefined: `packed` and q are one
// tensor's heads), rotating q's and k's pairs by their angle where there is a table (to_packed:
// into `packed`, by minus their angle).
void MoveHeads(const Tensor& packed, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& table, bool to_packed) {
  if (packed.numel() == 0) return;
  const int64_t half = q.dim(2) / 2;
  const uint32_t heads = static_cast<uint32_t>(q.dim(1));
  const uint32_t kv_heads = k.defined() ? static_cast<uint32_t>(k.dim(1)) : 0;
  CHECK_LT(packed.numel() / 2, int64_t{1} << 31)
      << "rope: too many pairs for 32-bit items " << packed.DebugString();
  if (table.defined()) {
    CHECK_LT(table.numel(), int64_t{1} << 31) << table.DebugString();
    CHECK(reinterpret_cast<uintptr_t>(table.data()) % sizeof(float2) == 0) << table.DebugString();
  }
  const uint32_t positions = table.defined() ? static_cast<uint32_t>(table.dim(0)) : 1;
  const uint32_t rotated = table.defined() ? heads + kv_heads : 0;
  const cudaStream_t stream = StreamOf(packed);
  DispatchFloat(packed.dtype(), [&]<typename T>(TypeTag<T>) {
    const SplitHeads<T> split{Ptr<T>(q), Ptr<T>(k), Ptr<T>(v), heads, kv_heads, rotated};
    DispatchVec(half, {packed.data(), q.data(), Ptr<T>(k), Ptr<T>(v), Ptr<float>(table)},
                [&]<int kVec>(VecTag<kVec>) {
                  const int64_t items = packed.numel() / 2 / kVec;
                  const auto kernel =
                      to_packed ? RopeQkvKernel<T, kVec, true> : RopeQkvKernel<T, kVec, false>;
                  kernel<<<BlocksFor(items, kThreads), kThreads, 0, stream>>>(
                      Ptr<T>(packed), split, Ptr<const float>(table), static_cast<uint32_t>(items),
                      static_cast<uint32_t>(half), positions);
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

void RopeQkvForward(const Tensor& qkv, const Tensor& table, const Tensor& q, const Tensor& k,
                    const Tensor& v) {
  MoveHeads(qkv, q, k, v, table, /*to_packed=*/false);
}

void RopeQkvBackward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& table,
                     const Tensor& dqkv) {
  MoveHeads(dqkv, dq, dk, dv, table, /*to_packed=*/true);
}

void RopeForward(const Tensor& x, const Tensor& table, const Tensor& y) {
  MoveHeads(x, y, Tensor(), Tensor(), table, /*to_packed=*/false);
}

void RopeBackward(const Tensor& dy, const Tensor& table, const Tensor& dx) {
  MoveHeads(dx, dy, Tensor(), Tensor(), table, /*to_packed=*/true);
}

}  // namespace moe::cuda
