// The stage ring of the Hopper grouped GEMMs (design: ../grouped_gemm_sm90.cuh): kStages operand
// stages (A 128 x 64, B 256 x 64 bf16) in 1024-byte-aligned dynamic shared memory, and their
// full / empty / landed mbarriers, released by the consumers of every CTA of the cluster.
#pragma once

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"

namespace moe::cuda::sm90::detail {

// Bytes of a stage ring's mbarriers (StageBarriers): three per stage.
template <int kStages>
constexpr int kStageBarrierBytes = 3 * kStages * 8;

// The mbarriers of the stage ring: full[s] (operands landed), empty[s] (consumers done), and
// landed[s] (the bf16 weight gradient only: the TMA bytes of a stage the producer still has to
// mask).
// A stage is filled by every CTA of the cluster (multicast), so it is empty once the consumers
// of all of them are done: each consumer warp releases it in every CTA, in kArrivalsPerWarp
// arrivals (1: its leader's; 32: every lane's).
template <int kStages, int kCluster, int kArrivalsPerWarp = 1>
struct StageBarriers {
  uint32_t base;  // shared address of full[0]; empty and landed follow, kStages each

  __device__ uint32_t Full(int stage) const { return base + 8 * stage; }
  __device__ uint32_t Empty(int stage) const { return base + 8 * (kStages + stage); }
  __device__ uint32_t Landed(int stage) const { return base + 8 * (2 * kStages + stage); }

  __device__ void Init() const {
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(Full(s), 1);
      MbarrierInit(Empty(s), kConsumerWarps * kArrivalsPerWarp * kCluster);
      MbarrierInit(Landed(s), 1);
    }
    FenceBarrierInit();
  }

  // One arrival on empty[stage] (a warp's leader's, or a lane's where kArrivalsPerWarp is 32), in
  // every CTA of the cluster; without a cluster, a local arrival.
  __device__ void Release(int stage) const {
    if constexpr (kCluster == 1) {
      MbarrierArrive(Empty(stage));
    } else {
#pragma unroll
      for (int rank = 0; rank < kCluster; ++rank) MbarrierArriveInCta(Empty(stage), rank);
    }
  }
};

// Dynamic shared memory, 1024-byte aligned for the swizzle atoms: stage s's A at
// A(s), its B at B(s), then the barriers, then what each kernel adds.
template <int kStages>
struct StageRing {
  uint8_t* base;

  __device__ explicit StageRing(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                        ~uintptr_t{1023})) {}

  __device__ uint8_t* APointer(int stage) const { return base + stage * kStageABytes; }
  __device__ uint8_t* BPointer(int stage) const {
    return base + kStages * kStageABytes + stage * kStageBBytes;
  }
  __device__ uint32_t A(int stage) const { return SmemAddress(APointer(stage)); }
  __device__ uint32_t B(int stage) const { return SmemAddress(BPointer(stage)); }
  template <int kCluster>
  __device__ StageBarriers<kStages, kCluster> Barriers() const {
    return {SmemAddress(base) + kStages * kStageBytes};
  }
  // Bytes past the barriers, for the kernel's own use (1024-byte aligned).
  __device__ uint8_t* Extra() const {
    return base + kStages * kStageBytes + ((kStageBarrierBytes<kStages> + 1023) & ~1023);
  }
  static constexpr int kBytesBeforeExtra =
      1023 + kStages * kStageBytes + ((kStageBarrierBytes<kStages> + 1023) & ~1023);
};

}  // namespace moe::cuda::sm90::detail
