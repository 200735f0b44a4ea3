// The learning-rate schedule (LearningRate in engine/optim/adamw.h): linear warmup to lr, cosine
// decay to min_lr at total_steps, min_lr after; the values at its joints and its shape between.
#include <gtest/gtest.h>

#include "engine/optim/adamw.h"

namespace moe {
namespace {

TEST(LearningRateTest, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  const float lr = 3e-3f, min_lr = 3e-4f;
  const int64_t warmup = 10, total = 110;
  EXPECT_FLOAT_EQ(LearningRate(0, lr, min_lr, warmup, total), lr / 10);  // step 0 is not 0
  EXPECT_FLOAT_EQ(LearningRate(4, lr, min_lr, warmup, total), lr / 2);
  EXPECT_FLOAT_EQ(LearningRate(9, lr, min_lr, warmup, total), lr);
  EXPECT_FLOAT_EQ(LearningRate(10, lr, min_lr, warmup, total), lr);  // cosine at progress 0
  EXPECT_FLOAT_EQ(LearningRate(60, lr, min_lr, warmup, total), (lr + min_lr) / 2);
  EXPECT_NEAR(LearningRate(109, lr, min_lr, warmup, total), min_lr, 1e-6);
  EXPECT_FLOAT_EQ(LearningRate(110, lr, min_lr, warmup, total), min_lr);
  EXPECT_FLOAT_EQ(LearningRate(1000, lr, min_lr, warmup, total), min_lr);
  for (int64_t step = warmup + 1; step < total; ++step) {
    EXPECT_LE(LearningRate(step, lr, min_lr, warmup, total),
              LearningRate(step - 1, lr, min_lr, warmup, total))
        << step;
  }
}

TEST(LearningRateTest, NoWarmupAndAWarmupAsLongAsTheRun) {
  EXPECT_FLOAT_EQ(LearningRate(0, 1.0f, 0.0f, 0, 100), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(50, 1.0f, 0.0f, 0, 100), 0.5f);
  // warmup == total: the ramp, then min_lr (no division by zero).
  EXPECT_FLOAT_EQ(LearningRate(4, 1.0f, 0.1f, 5, 5), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(5, 1.0f, 0.1f, 5, 5), 0.1f);
}

}  // namespace
}  // namespace moe
