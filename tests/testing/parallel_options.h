// The trainer options the parallel tests (trainer_parallel_mpi_test, expert_parallel_mpi_test)
// share: micro-batch 1 and global batch 8 (several micro-batches on each replica of 2, 4 or 8
// ranks), `steps` steps with one of warmup, 4 validation batches, gradient buckets of 16 KiB
// (several, some of several parameters), and with `offload` every group offloaded (the routed
// ones outside the pinned pool, no size floor).
#pragma once

#include <string>

#include "modules/offload_groups.h"
#include "modules/trainer.h"

namespace moe::testing {

inline TrainerOptions ParallelTestOptions(int64_t steps, bool offload) {
  TrainerOptions o;
  o.micro_batch_size = 1;
  o.global_batch_size = 8;
  o.train_steps = steps;
  o.warmup_steps = 1;
  o.eval_steps = 4;
  o.bucket_bytes = 16 << 10;
  if (offload) {
    OffloadOptions options;
    for (const std::string& group : OffloadGroupNames()) options.groups.insert(group);
    options.unpooled_groups = RoutedOffloadGroups();
    options.min_tensor_bytes = 0;
    o.offload = options;
  }
  return o;
}

}  // namespace moe::testing
