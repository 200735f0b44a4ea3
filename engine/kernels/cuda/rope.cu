// CUDA rotary position embedding (contracts: engine/kernels/op_declarations.inc). Each tensor
// in, out (batch * seq, heads, d), f32 or bf16; position of row r is r % seq_len; rotate-half pairs
// (i, i + d/2), i < d/2, turn by angle pos * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// Backward is the inverse rotation (sin negated). One kernel for all of a call's tensors, one
// block per token row: its threads first compute the row's d/2 angles in double, like the CPU
// reference (a float angle loses ~1e-4 rad at positions in the thousands), as {cos, sin} floats
// in shared memory; then each thread rotates kVec consecutive pairs of a head of one of the
// tensors (one 16-byte access per half for bf16 when d/2 allows). Each pair is read before it is
// written, so out may alias in. (The 8-layer preset's q and k, 4096 tokens, 16 and 4 heads of 128,
// bf16, took 11.5 + 8.2 us as two launches under ncu on the H200.)
#include "engine/kernels/cuda/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kMaxThreads = 256;

// A call's tensors as the kernel sees them.
template <typename T>
struct RopeRows {
  const T* in[kMaxRopeTensors];
  T* out[kMaxRopeTensors];
  int heads[kMaxRopeTensors];
  int total_heads;  // over the tensors
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    RopeKernel(RopeRows<T> rows, int half, int64_t seq_len, double base, float direction) {
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
  for (int c = threadIdx.x; c < rows.total_heads * chunks; c += blockDim.x) {
    int t = 0, item = c / chunks;  // item: a head of one tensor, counted over the tensors
    while (item >= rows.heads[t]) item -= rows.heads[t++];
    const int i0 = c % chunks * kVec;
    const int64_t lo_at = (token * rows.heads[t] + item) * 2 * half + i0, hi_at = lo_at + half;
    const Floats<kVec> lo = LoadFloats<kVec>(rows.in[t] + lo_at);
    const Floats<kVec> hi = LoadFloats<kVec>(rows.in[t] + hi_at);
    Floats<kVec> y_lo, y_hi;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float2 r = rotation[i0 + j];
      y_lo.v[j] = lo.v[j] * r.x - hi.v[j] * r.y;
      y_hi.v[j] = hi.v[j] * r.x + lo.v[j] * r.y;
    }
    StoreFloats<kVec>(rows.out[t] + lo_at, y_lo);
    StoreFloats<kVec>(rows.out[t] + hi_at, y_hi);
  }
}

// Rotates every pair of every tensor by `direction` (+1 forward, -1 inverse) times its angle.
void Rotate(std::span<const RopeTensors> tensors, int64_t seq_len, float base, float direction) {
  const Tensor& first = tensors[0].in;
  if (first.numel() == 0) return;
  const int64_t tokens = first.dim(0), half = first.dim(2) / 2;
  int64_t pairs = 0;  // a token's, over the tensors
  for (const RopeTensors& t : tensors) pairs += t.in.dim(1) * half;
  CHECK(tokens < (int64_t{1} << 31) && pairs < (int64_t{1} << 31)) << first.DebugString();
  constexpr int64_t kMaxAngleBytes = 48 * 1024;  // a block's angles, in default shared memory
  CHECK_LE(half * int64_t{sizeof(float2)}, kMaxAngleBytes)
      << "rope: head_dim " << 2 * half << " exceeds " << kMaxAngleBytes / sizeof(float2) * 2;
  const cudaStream_t stream = StreamOf(first);
  DispatchFloat(first.dtype(), [&]<typename T>(TypeTag<T>) {
    RopeRows<T> rows = {};  // unused entries: null pointers, which DispatchVec takes as aligned
    for (size_t t = 0; t < tensors.size(); ++t) {
      rows.in[t] = Ptr<const T>(tensors[t].in);
      rows.out[t] = Ptr<T>(tensors[t].out);
      rows.heads[t] = static_cast<int>(tensors[t].in.dim(1));
      rows.total_heads += rows.heads[t];
    }
    static_assert(kMaxRopeTensors == 4);
    DispatchVec(half,
                {rows.in[0], rows.out[0], rows.in[1], rows.out[1], rows.in[2], rows.out[2],
                 rows.in[3], rows.out[3]},
                [&]<int kVec>(VecTag<kVec>) {
                  const int threads =
                      RowThreads(std::max(rows.total_heads * half / kVec, half), kMaxThreads);
                  RopeKernel<T, kVec>
                      <<<static_cast<unsigned>(tokens), threads, half * sizeof(float2), stream>>>(
                          rows, static_cast<int>(half), seq_len, base, direction);
                  MOE_CUDA_CHECK_LAUNCH();
                });
  });
}

}  // namespace

void RopeForward(std::span<const RopeTensors> tensors, int64_t seq_len, float base) {
  Rotate(tensors, seq_len, base, 1.0f);
}

void RopeBackward(std::span<const RopeTensors> tensors, int64_t seq_len, float base) {
  Rotate(tensors, seq_len, base, -1.0f);
}

}  // namespace moe::cuda
