// The training loop on the CPU: the loss falls, and resuming from a checkpoint repeats an
// uninterrupted run bit for bit (losses, gradient norms and final weights).
#include "modules/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/testing/tensor_testing.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

TrainerOptions SmallOptions() {
  TrainerOptions o;
  o.micro_batch_size = 4;
  o.global_batch_size = 8;
  o.train_steps = 40;
  o.warmup_steps = 5;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.eval_steps = 2;
  return o;
}

std::unique_ptr<TokenSource> Synthetic(int64_t vocab) {
  DataOptions data;
  data.vocab_size = vocab;
  return std::move(OpenTokenSource(data)).value();
}

std::unique_ptr<Trainer> NewTrainer(const TokenSource* source,
                                    TrainerOptions options = SmallOptions()) {
  return std::move(Trainer::Create(testing::TinyModel(), options, Device::CPU(), source)).value();
}

TEST(TrainerTest, LossFalls) {
  auto source = Synthetic(64);
  auto trainer = NewTrainer(source.get());
  const double first_eval = trainer->Evaluate();
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    const StepStats stats = trainer->TrainStep();
    ASSERT_TRUE(std::isfinite(stats.loss));
    if (step == 0) first = stats.loss;
    last = stats.loss;
  }
  EXPECT_NEAR(first, std::log(64.0), 0.3) << "the untrained model should be near uniform";
  EXPECT_LT(last, first - 1.0);
  EXPECT_LT(trainer->Evaluate(), first_eval - 1.0);
}

TEST(TrainerTest, EvaluationChangesNothing) {
  auto source = Synthetic(64);
  auto a = NewTrainer(source.get()), b = NewTrainer(source.get());
  for (int step = 0; step < 3; ++step) {
    a->TrainStep();
    b->Evaluate();
    EXPECT_EQ(a->Evaluate(), a->Evaluate()) << "evaluation is not repeatable";
    b->TrainStep();
  }
  EXPECT_EQ(a->TrainStep().loss, b->TrainStep().loss);
}

TEST(TrainerTest, ResumeIsBitIdentical) {
  auto source = Synthetic(64);
  const std::string root = ::testing::TempDir() + "/resume_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);

  auto straight = NewTrainer(source.get());
  std::vector<StepStats> expected;
  for (int step = 0; step < 6; ++step) expected.push_back(straight->TrainStep());

  auto first_half = NewTrainer(source.get());
  for (int step = 0; step < 3; ++step) first_half->TrainStep();
  ASSERT_TRUE(first_half->Save(root, {{"test", true}}).ok());

  auto resumed = NewTrainer(source.get());
  const Status loaded = resumed->Load(root);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(resumed->step(), 3);
  for (int step = 3; step < 6; ++step) {
    const StepStats stats = resumed->TrainStep();
    EXPECT_EQ(stats.loss, expected[step].loss) << "step " << step;
    EXPECT_EQ(stats.grad_norm, expected[step].grad_norm) << "step " << step;
  }
  const auto& want = straight->parameters().all();
  const auto& got = resumed->parameters().all();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(testing::ToFloats(got[i]->master), testing::ToFloats(want[i]->master))
        << want[i]->name;
  }
  std::filesystem::remove_all(root);
}

TEST(TrainerTest, LoadingAnotherShapeIsAnError) {
  auto source = Synthetic(64);
  const std::string root = ::testing::TempDir() + "/shape_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(NewTrainer(source.get())->Save(root, {}).ok());

  GptConfig wider = testing::TinyModel();
  wider.hidden_size = 48;
  auto other =
      std::move(Trainer::Create(wider, SmallOptions(), Device::CPU(), source.get())).value();
  const Status loaded = other->Load(root);
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.message().find("--hidden_size (checkpoint 32, this run 48)"), std::string::npos)
      << loaded.message();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace moe
