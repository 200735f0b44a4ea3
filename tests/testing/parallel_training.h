// What the trainer tests under mpirun (trainer_parallel_mpi_test, expert_parallel_mpi_test) share,
// each compiled twice (tests/CMakeLists.txt): on the CPU backend over MPI, and with
// MOE_TEST_ON_CUDA on one GPU per rank over NCCL.
//   kOnCuda, RankDevice(): the CPU, or the GPU of the rank's local rank.
//   ParallelTestModel: TinyModel with 4 layers (to split over 4 stages) and 2 heads over 1 KV
//   group; hidden 128 on CUDA (head dim 64, as the CUDA attention kernels take).
//   ParallelTestOptions: micro-batch 1 and global batch 8 (several micro-batches on each replica
//   of 2, 4 or 8 ranks), `steps` steps with one of warmup, 4 validation batches, gradient buckets
//   of 16 KiB (several, some of several parameters), and with `offload` every group offloaded
//   (the routed ones outside the pinned pool, no size floor).
//   ExpectNear: relative to max(1, |expected|).
//   ExpectWeightsNear: master weights (by name) against a reference's. Each within `tolerance`
//   (relative), except on CUDA, where AdamW turns a gradient element that is pure rounding noise
//   into a full +-lr step whose sign the summation order decides: there up to 0.1% of the weights
//   may differ by up to `noise_bound` (2 lr per step).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "modules/offload_groups.h"
#include "modules/trainer.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/tiny_model.h"

namespace moe::testing {

#if MOE_TEST_ON_CUDA
inline constexpr bool kOnCuda = true;
#else
inline constexpr bool kOnCuda = false;
#endif

inline Device RankDevice() {
  if (!kOnCuda) return Device::CPU();
  StatusOr<Device> device = TestWorld::Get().SelectDevice(DeviceType::kCUDA);
  CHECK(device.ok()) << device.status().message();
  return *device;
}

inline GptConfig ParallelTestModel() {
  GptConfig c = TinyModel();
  c.num_layers = 4;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  if (kOnCuda) c.hidden_size = 128;
  return c;
}

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

inline void ExpectNear(double actual, double expected, const std::string& what, double tolerance) {
  EXPECT_LE(std::abs(actual - expected), tolerance * std::max(1.0, std::abs(expected)))
      << what << ": " << actual << " vs " << expected;
}

inline void ExpectWeightsNear(const std::map<std::string, std::vector<float>>& weights,
                              const std::map<std::string, std::vector<float>>& reference,
                              double tolerance, double noise_bound) {
  ASSERT_FALSE(weights.empty());
  int64_t total = 0, outliers = 0;
  for (const auto& [name, values] : weights) {
    const std::vector<float>& expected = reference.at(name);
    ASSERT_EQ(values.size(), expected.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      const double error = std::abs(values[i] - expected[i]);
      ++total;
      if (error <= tolerance * std::max(1.0f, std::abs(expected[i]))) continue;
      ++outliers;
      ASSERT_TRUE(kOnCuda && error <= noise_bound)
          << name << "[" << i << "]: " << values[i] << " vs " << expected[i];
    }
  }
  EXPECT_LE(outliers, total / 1000) << outliers << " of " << total << " weights differ";
}

}  // namespace moe::testing
