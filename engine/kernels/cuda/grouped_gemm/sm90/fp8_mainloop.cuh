// What the Hopper FP8 grouped GEMM's kernels share (design: ../fp8_grouped_gemm_sm90.cuh): the
// tile and stage sizes, the stage ring in shared memory, a consumer's multiplication of one stage
// (one 128-deep K tile: up to four m64n128k32 e4m3 wgmmas into fresh accumulators).
#pragma once

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"

namespace moe::cuda::sm90 {

constexpr int kFp8BlockM = 128;          // output rows per tile: 64 per consumer warpgroup
constexpr int kFp8BlockN = 128;          // output columns per tile: one scale block
constexpr int kFp8BlockK = 128;          // e4m3 per stage: one 128-byte swizzle row, one scale tile
constexpr int kFp8WgmmaK = 32;           // m64n128k32: 4 K slices per stage
constexpr int kFp8ForwardStages = 6;     // beside the offsets and the output staging
constexpr int kFp8WeightGradStages = 5;  // beside two output boxes a consumer and the scales
constexpr int kFp8Accumulators = 64 * kFp8BlockN / kWarpgroupThreads;  // f32 per thread and set
constexpr int kFp8OperandBytes = kFp8BlockM * kFp8BlockK;              // A or B of a stage: 16 KiB
constexpr int kFp8StageBytes = 2 * kFp8OperandBytes;
constexpr int kFp8HalfBytes = kFp8OperandBytes / 2;  // 64 rows: a consumer's, or a TMA box

static_assert(kFp8BlockK == kSwizzleRowBytes && kFp8BlockM == 64 * kConsumers);
static_assert(kFp8WgmmaK == kKMajorSliceBytes, "KMajorDescriptor's slices are 32 bytes");
static_assert(kFp8BlockN == 128 && kFp8Accumulators == 64, "WgmmaE4m3 is m64n128k32");

namespace detail {

// Shared memory of kStages stages: stage s's A (128 rows of 128 e4m3) at A(s), its B at B(s),
// 1024-byte aligned; the stages' barriers (released by the consumers of every CTA of a cluster of
// kCluster); then the kernel's own bytes (Extra(), 16-byte aligned, kExtraOffset from the base; a
// kernel that needs them 1024-byte aligned starts at kExtraOffset rounded up, and its dynamic
// shared memory adds the base's alignment slack, 1023 bytes).
template <int kStages>
struct Fp8Ring {
  static constexpr int kExtraOffset =
      kStages * kFp8StageBytes + (kStageBarrierBytes<kStages> + 15) / 16 * 16;
  uint8_t* base;

  __device__ explicit Fp8Ring(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                        ~uintptr_t{1023})) {}

  __device__ uint32_t A(int stage) const { return SmemAddress(base + stage * kFp8StageBytes); }
  __device__ uint32_t B(int stage) const { return A(stage) + kFp8OperandBytes; }
  template <int kCluster>
  __device__ StageBarriers<kStages, kCluster> Barriers() const {
    return {SmemAddress(base + kStages * kFp8StageBytes)};
  }
  __device__ uint8_t* Extra() const { return base + kExtraOffset; }
};

// A stage's K slices: m64n128k32 wgmmas over its 128 K.
constexpr int kFp8StageSlices = kFp8BlockK / kFp8WgmmaK;
static_assert(kFp8StageSlices == 4, "IssueSlices issues up to 4 slices");

// Waits until `state`'s stage is full, then, when `active`, issues part (64 x 128) = its 64 rows of
// A (from byte a_offset) times B^T over the stage's first `slices` 32-deep K slices (wgmmas into
// fresh accumulators, one commit group), and returns without waiting for them.
template <int kStages>
__device__ __forceinline__ void IssueFp8Stage(float (&part)[kFp8Accumulators],
                                              const Fp8Ring<kStages>& ring,
                                              const PipelineState<kStages>& state,
                                              uint32_t a_offset, bool active, int slices) {
  MbarrierWait(ring.template Barriers<1>().Full(state.stage), state.phase);
  if (!active) return;
  IssueSlices(slices, [&]<int kSlices>() {
    FenceAccumulators(part);
    WgmmaFence();
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
      WgmmaE4m3(part, KMajorDescriptor(ring.A(state.stage) + a_offset, i),
                KMajorDescriptor(ring.B(state.stage), i), i > 0);
    }
    WgmmaCommitGroup();
  });
}

// This warp's release of `stage` once its wgmmas have read it (each warp arrives once on empty, in
// every CTA of its cluster of kCluster); the warp's reads of the stage precede it.
template <int kCluster, int kStages>
__device__ __forceinline__ void ReleaseFp8Stage(const Fp8Ring<kStages>& ring, int stage) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) ring.template Barriers<kCluster>().Release(stage);
}

// One consumer warpgroup's pass over the next stage, waiting for its products: IssueFp8Stage
// (warp-uniform arguments; 1 <= slices <= kFp8StageSlices; part's old values are dropped; the
// other slices are skipped, whatever they hold), then, once the wgmmas are done,
// use_stage(stage) (all threads, active or not) while the stage is still held (what a kernel
// reads from it besides the operands), then ReleaseFp8Stage.
template <int kCluster, int kStages, typename UseStage>
__device__ __forceinline__ void MultiplyFp8Stage(float (&part)[kFp8Accumulators],
                                                 const Fp8Ring<kStages>& ring,
                                                 PipelineState<kStages>& state, uint32_t a_offset,
                                                 bool active, int slices, UseStage use_stage) {
  IssueFp8Stage(part, ring, state, a_offset, active, slices);
  // Also when inactive (nothing in flight: returns at once), so that every path to the
  // accumulators' next use passes a wait.
  WgmmaWaitGroup<0>();
  FenceAccumulators(part);
  use_stage(state.stage);
  ReleaseFp8Stage<kCluster>(ring, state.stage);
  state.Advance();
}

}  // namespace detail

}  // namespace moe::cuda::sm90
