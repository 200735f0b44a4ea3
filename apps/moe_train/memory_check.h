// Whether a run fits the device, checked before any work: the estimate of
// modules/memory_estimate.h for this rank against the device's capacity (CUDA: the GPU's total
// memory; CPU: physical memory, shared by the ranks on this host). A run that does not fit is
// one line naming the estimate, its parts and the capacity.
#pragma once

#include <cstddef>

#include "apps/moe_train/run_flags.h"
#include "engine/core/status.h"

namespace moe {

// `capacity_bytes`: 0 (unknown) passes. `ranks_sharing`: ranks whose memory comes from the same
// capacity (CPU: this host's ranks; CUDA: 1).
Status CheckMemoryFits(const RunConfig& run, size_t capacity_bytes, int ranks_sharing);

}  // namespace moe
