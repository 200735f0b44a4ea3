// The split last wave of the Hopper grouped GEMMs' plain products (grouped_gemm_tiles.h's
// TailSplit; design: ../grouped_gemm_sm90.cuh): the workspace of the pieces' partial
// accumulators and flags, its allocation, and the pieces' exchange through it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"

namespace moe::cuda::sm90 {

// The plain products' (GroupedMatmulSm90's) workspace for their split tail tiles
// (grouped_gemm_tiles.h, TailSplit): per slot, each CTA rank's and consumer warpgroup's partial
// accumulators (thread-major: value i of thread j at i * kWarpgroupThreads + j), and a flag each
// that they are written: 0 before a launch, and every launch leaves them 0 (its reader of a flag
// clears it), so only a new workspace is cleared (AllocateSplitWorkspace). slots 0: no split.
// SplitSlots(SMs) slots suffice on a device of that many SMs (a split's writer pieces number fewer
// than the clusters).
struct SplitWorkspace {
  float* partials;  // slots x kSplitSlotParts x kSplitPartFloats
  int* flags;       // slots x kSplitSlotParts
  int slots;
};
constexpr int kSplitSlotParts = kForwardCluster * kConsumers;
constexpr int kSplitPartFloats = kAccumulators * kWarpgroupThreads;
inline int SplitSlots(int sm_count) { return sm_count / kForwardCluster; }
// A workspace for the SMs of `device` (the current device) in new device memory (cudaMalloc; the
// caller keeps it), its flags cleared (cudaMemset: ready for its first launch).
inline cudaError_t AllocateSplitWorkspace(int device, SplitWorkspace* workspace) {
  int sm_count = 0;
  cudaError_t status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  const int slots = SplitSlots(sm_count);
  const int64_t partial_floats = int64_t{slots} * kSplitSlotParts * kSplitPartFloats;
  const size_t flag_bytes = sizeof(int) * slots * kSplitSlotParts;
  void* bytes = nullptr;
  status = cudaMalloc(&bytes, partial_floats * sizeof(float) + flag_bytes);
  if (status != cudaSuccess) return status;
  float* const partials = static_cast<float*>(bytes);
  *workspace = {partials, reinterpret_cast<int*>(partials + partial_floats), slots};
  return cudaMemset(workspace->flags, 0, flag_bytes);
}

namespace detail {

// This consumer warpgroup's part (CTA rank, consumer) of a split slot.
__device__ __forceinline__ int SplitPart(int slot, int rank, int consumer) {
  return (slot * kForwardCluster + rank) * kConsumers + consumer;
}

// A writer piece's accumulators to its slot, then its flag (release); the warpgroup calls it.
__device__ __forceinline__ void StorePartial(const Accumulators& acc, const SplitWorkspace& split,
                                             int slot, int rank, int consumer, int barrier_id) {
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int part = SplitPart(slot, rank, consumer);
  float* const out = split.partials + int64_t{part} * kSplitPartFloats + thread;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) __stcg(out + i * kWarpgroupThreads, acc[i]);
  NamedBarrierSync(barrier_id, kWarpgroupThreads);  // every thread's stores before the flag
  if (thread == 0) {
    __threadfence();
    StoreRelease(split.flags + part, 1);
  }
}

// Piece 0's accumulators += the partials of the pieces - 1 writer slots from first_slot, in slot
// order (each waited for by its flag, which it clears); the warpgroup calls it.
__device__ __forceinline__ void AddPartials(Accumulators& acc, const SplitWorkspace& split,
                                            int first_slot, int pieces, int rank, int consumer,
                                            int barrier_id) {
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  for (int slot = first_slot; slot < first_slot + pieces - 1; ++slot) {
    const int part = SplitPart(slot, rank, consumer);
    if (thread == 0) TakeFlagAcquire(split.flags + part);
    NamedBarrierSync(barrier_id, kWarpgroupThreads);
    const float* const in = split.partials + int64_t{part} * kSplitPartFloats + thread;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] += __ldcg(in + i * kWarpgroupThreads);
  }
}

}  // namespace detail

}  // namespace moe::cuda::sm90
