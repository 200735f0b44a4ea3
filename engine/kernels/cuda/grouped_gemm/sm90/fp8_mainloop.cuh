// What the Hopper FP8 grouped GEMM's kernels share (design: ../fp8_grouped_gemm_sm90.cuh): the
// tile and stage sizes, the stage ring in shared memory, a consumer's multiplication of one stage
// (one 128-deep K tile: up to four m64nNk32 e4m3 wgmmas into fresh accumulators, N the stage's B
// rows: the forward's and the clustered weight gradient's 192, the unclustered one's 128).
#pragma once

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/mainloop.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/pipeline.cuh"

namespace moe::cuda::sm90 {

constexpr int kFp8BlockM = 128;        // output rows per tile: 64 per consumer warpgroup
constexpr int kFp8BlockN = 128;        // a weight scale block's columns; weight-gradient tiles'
constexpr int kFp8ForwardTileN = 192;  // forward output columns per tile: 1.5 scale blocks
constexpr int kFp8BlockK = 128;        // e4m3 per stage: one 128-byte swizzle row, one scale tile
constexpr int kFp8WgmmaK = 32;         // m64nNk32: 4 K slices per stage
constexpr int kFp8ForwardStages = 5;   // of 40 KiB, beside the offsets and the output staging
constexpr int kFp8WeightGradTileN = 192;  // the clustered weight gradient's dw columns per tile
constexpr int kFp8WeightGradStages = 5;   // of 32 or 40 KiB, beside the output staging and scales
constexpr int kFp8BoxRows = 64;           // a TMA box of an operand, and a consumer's rows of A
constexpr int kFp8BoxBytes = kFp8BoxRows * kFp8BlockK;     // 8 KiB
constexpr int kFp8OperandBytes = kFp8BlockM * kFp8BlockK;  // A of a stage: 16 KiB

static_assert(kFp8BlockK == kSwizzleRowBytes && kFp8BoxRows * kConsumers == kFp8BlockM);
static_assert(kFp8WgmmaK == kKMajorSliceBytes, "KMajorDescriptor's slices are 32 bytes");

namespace detail {

// Shared memory of kStages stages: stage s's A (128 rows of 128 e4m3) at A(s), its B (kBRows
// rows) at B(s), 1024-byte aligned; the stages' barriers (released by the consumers of every CTA of
// a cluster of kCluster); then the kernel's own bytes (Extra(), 16-byte aligned, kExtraOffset from
// the base; a kernel that needs them 1024-byte aligned starts at kExtraOffset rounded up, and its
// dynamic shared memory adds the base's alignment slack, 1023 bytes).
template <int kStages, int kBRows = kFp8BlockN>
struct Fp8Ring {
  static constexpr int kStageBytes = (kFp8BlockM + kBRows) * kFp8BlockK;
  // A consumer's f32 of one 64 x kBRows product (WgmmaE4m3's m64nNk32 forms: N 128 or 192).
  static constexpr int kAccumulators = 64 * kBRows / kWarpgroupThreads;
  static_assert(kStageBytes % 1024 == 0 && (kBRows == 128 || kBRows == 192));
  static constexpr int kExtraOffset =
      kStages * kStageBytes + (kStageBarrierBytes<kStages> + 15) / 16 * 16;
  uint8_t* base;

  __device__ explicit Fp8Ring(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                        ~uintptr_t{1023})) {}

  __device__ uint32_t A(int stage) const { return SmemAddress(base + stage * kStageBytes); }
  __device__ uint32_t B(int stage) const { return A(stage) + kFp8OperandBytes; }
  template <int kCluster>
  __device__ StageBarriers<kStages, kCluster, 32> Barriers() const {
    return {SmemAddress(base + kStages * kStageBytes)};
  }
  __device__ uint8_t* Extra() const { return base + kExtraOffset; }
};

// A stage's K slices: m64nNk32 wgmmas over its 128 K.
constexpr int kFp8StageSlices = kFp8BlockK / kFp8WgmmaK;
static_assert(kFp8StageSlices == 4, "IssueSlices issues up to 4 slices");

// Waits until `state`'s stage is full, then issues part (64 x kBRows) = its 64 rows of A (from
// byte a_offset) times B^T over the stage's first stage_slices(stage) 32-deep K slices (called
// once the stage is full, so it may read what the producer wrote beside the operands;
// warp-uniform, 0 to kFp8StageSlices: 0 issues nothing) as wgmmas into fresh accumulators, one
// commit group, and returns without waiting for them.
template <int kStages, int kBRows, typename StageSlices>
__device__ __forceinline__ void IssueFp8Stage(
    float (&part)[Fp8Ring<kStages, kBRows>::kAccumulators], const Fp8Ring<kStages, kBRows>& ring,
    const PipelineState<kStages>& state, uint32_t a_offset, StageSlices stage_slices) {
  MbarrierWait(ring.template Barriers<1>().Full(state.stage), state.phase);
  const int slices = stage_slices(state.stage);
  if (slices == 0) return;
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

// This thread's release of `stage` once its wgmmas have read it (every consumer thread arrives on
// empty, in every CTA of its cluster of kCluster); the thread's reads of the stage precede it.
// Every thread arrives because each reads the stage's scales with loads of its own (bf16's
// consumers read a stage only through their wgmmas): an arrival orders only its own thread's
// reads before the producer's next write of the stage.
template <int kCluster, int kStages, int kBRows>
__device__ __forceinline__ void ReleaseFp8Stage(const Fp8Ring<kStages, kBRows>& ring, int stage) {
  ring.template Barriers<kCluster>().Release(stage);
}

// One consumer warpgroup's pass over the next stage, waiting for its products: IssueFp8Stage
// (part's old values are dropped; the slices after the issued ones are skipped, whatever they
// hold), then, once the wgmmas are done, use_stage(stage) (all threads, whether they issued or
// not) while the stage is still held (what a kernel reads from it besides the operands), then
// ReleaseFp8Stage.
template <int kCluster, int kStages, int kBRows, typename StageSlices, typename UseStage>
__device__ __forceinline__ void MultiplyFp8Stage(
    float (&part)[Fp8Ring<kStages, kBRows>::kAccumulators], const Fp8Ring<kStages, kBRows>& ring,
    PipelineState<kStages>& state, uint32_t a_offset, StageSlices stage_slices,
    UseStage use_stage) {
  IssueFp8Stage(part, ring, state, a_offset, stage_slices);
  // Also when nothing was issued (returns at once), so that every path to the accumulators' next
  // use passes a wait.
  WgmmaWaitGroup<0>();
  FenceAccumulators(part);
  use_stage(state.stage);
  ReleaseFp8Stage<kCluster>(ring, state.stage);
  state.Advance();
}

}  // namespace detail

}  // namespace moe::cuda::sm90
