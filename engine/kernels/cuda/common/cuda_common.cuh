// Helpers shared by the CUDA kernels (include only from .cu files).
//   Host:   StreamOf, Ptr, DispatchFloat (f32 / bf16 -> a C++ type), DispatchVec (vector width
//           1 or 8), BlocksFor / RowThreads (launch sizes for grid-stride loops).
//   Device: ToFloat / FromFloat (f32, bf16, and integer outputs), Floats<N> with LoadFloats /
//           StoreFloats (N = 8: one 16-byte access for bf16, two for f32), ShuffleXor,
//           WarpReduce / BlockReduce / BlockSum / BlockMax, MOE_DEVICE_CHECK.
// Conventions: arithmetic is fp32 whatever the storage; blocks are a multiple of 32 threads (at
// most 1024); reductions combine in a fixed order, so results are bit-identical run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "engine/core/cuda_check.h"
#include "engine/core/tensor.h"
#include "engine/runtime/device_context.h"

// A broken precondition inside a kernel (e.g. an index out of range): prints the condition and
// traps, so the launch fails and the next MOE_CUDA_CALL on the stream reports it.
#define MOE_DEVICE_CHECK(condition)                                               \
  do {                                                                            \
    if (!(condition)) {                                                           \
      printf("%s:%d: device check failed: %s\n", __FILE__, __LINE__, #condition); \
      __trap();                                                                   \
    }                                                                             \
  } while (0)

namespace moe::cuda {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------- host

// The compute stream of t's device (getting it also makes that device current).
inline cudaStream_t StreamOf(const Tensor& t) {
  return static_cast<cudaStream_t>(DeviceContext::Get(t.device()).compute_stream().native_handle());
}

// t's elements as T* (nullptr for an undefined tensor); the caller has dispatched on the dtype.
template <typename T>
T* Ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

template <typename T>
struct TypeTag {};

// Calls f(TypeTag<float>{}) or f(TypeTag<bf16>{}); use with [&]<typename T>(TypeTag<T>) {...}.
template <typename F>
void DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(TypeTag<float>{});
      return;
    case DType::kBF16:
      f(TypeTag<bf16>{});
      return;
    default:
      LOG(FATAL) << "expected an f32 or bf16 tensor, got " << DTypeName(dtype);
  }
}

__host__ __device__ inline bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <int N>
struct VecTag {};

// Calls f(VecTag<8>{}) when rows of `row_length` elements can be walked 8 at a time (the length
// is a multiple of 8 and every base pointer is 16-byte aligned; an absent one, nullptr, is), else
// f(VecTag<1>{}). Use with [&]<int kVec>(VecTag<kVec>) {...}.
template <typename F>
void DispatchVec(int64_t row_length, std::initializer_list<const void*> pointers, F&& f) {
  bool vectorise = row_length % 8 == 0;
  for (const void* p : pointers) vectorise = vectorise && Aligned16(p);
  if (vectorise) {
    f(VecTag<8>{});
  } else {
    f(VecTag<1>{});
  }
}

// Blocks for a grid-stride loop over `items`, `items_per_block` per block per step: enough to
// fill the GPU, capped (the loop covers the rest), at least 1.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
inline int BlocksFor(int64_t items, int64_t items_per_block) {
  return static_cast<int>(
      std::clamp<int64_t>((items + items_per_block - 1) / items_per_block, 1, kMaxBlocks));
}

// Threads of a block that walks rows of `items` work items: a multiple of 32 in [32, max].
inline int RowThreads(int64_t items, int max_threads = 256) {
  return static_cast<int>(std::clamp<int64_t>((items + 31) / 32 * 32, 32, max_threads));
}

// ---------------------------------------------------------------- conversions and vectors

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(bf16 v) { return __bfloat162float(v); }

// Round to nearest even for bf16; truncation toward zero for integer types.
template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16(v);
  } else {
    return static_cast<T>(v);
  }
}

template <int N>
struct Floats {
  float v[N];
};

// N elements of T as stored: aligned to their size, at most 16 bytes (so 8 floats load as two
// 16-byte accesses).
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Packed {
  T v[N];
};

// Loads p[0..N) as floats; p must be aligned to min(16, N * sizeof(T)) bytes.
template <int N, typename T>
__device__ __forceinline__ Floats<N> LoadFloats(const T* p) {
  const Packed<T, N> packed = *reinterpret_cast<const Packed<T, N>*>(p);
  Floats<N> out;
#pragma unroll
  for (int j = 0; j < N; ++j) out.v[j] = ToFloat(packed.v[j]);
  return out;
}

template <int N, typename T>
__device__ __forceinline__ void StoreFloats(T* p, const Floats<N>& in) {
  Packed<T, N> packed;
#pragma unroll
  for (int j = 0; j < N; ++j) packed.v[j] = FromFloat<T>(in.v[j]);
  *reinterpret_cast<Packed<T, N>*>(p) = packed;
}

// ---------------------------------------------------------------- reductions

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// __shfl_xor_sync for any trivially copyable T made of 4-byte words.
template <typename T>
__device__ __forceinline__ T ShuffleXor(T value, int lane_mask) {
  static_assert(sizeof(T) % 4 == 0 && std::is_trivially_copyable_v<T>);
  uint32_t words[sizeof(T) / 4];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 4); ++i) {
    words[i] = __shfl_xor_sync(0xffffffffu, words[i], lane_mask);
  }
  memcpy(&value, words, sizeof(T));
  return value;
}

// Butterfly reduction over the full warp; every lane gets the same result when op is
// commutative.
template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, ShuffleXor(value, offset));
  return value;
}

// Reduction over the whole block; every thread gets the result. Every thread of the block must
// call it (it synchronises), and it may be called repeatedly (e.g. once per row).
template <typename T, typename Op>
__device__ __forceinline__ T BlockReduce(T value, Op op, T identity) {
  __shared__ T warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = WarpReduce(value, op);
  __syncthreads();  // an earlier call's readers are done with warp_results
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / 32) ? warp_results[lane] : identity;
  return WarpReduce(value, op);
}

template <typename T>
__device__ __forceinline__ T BlockSum(T value) {
  return BlockReduce(value, SumOp{}, T{0});
}

__device__ __forceinline__ float BlockMax(float value) {
  return BlockReduce(value, MaxOp{}, -INFINITY);
}

}  // namespace moe::cuda
