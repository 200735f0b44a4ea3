// The training loop on the CPU: the loss falls, and resuming from a checkpoint repeats an
// uninterrupted run bit for bit (losses, gradient norms and final weights); bf16 optimizer state
// and the FP8 recipe train like f32, and their checkpoints load across the choice.
#include "modules/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <utility>

#include "engine/core/bfloat16.h"
#include "engine/io/safetensors.h"
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
                                    TrainerOptions options = SmallOptions(),
                                    const GptConfig& model = testing::TinyModel()) {
  return std::move(Trainer::Create(model, options, Device::CPU(), source)).value();
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

TrainerOptions Bf16MomentOptions() {
  TrainerOptions o = SmallOptions();
  o.optimizer_dtypes.exp_avg = DType::kBF16;
  o.optimizer_dtypes.exp_avg_sq = DType::kBF16;
  return o;
}

TrainerOptions Bf16GradientOptions(TrainerOptions o = SmallOptions()) {
  o.optimizer_dtypes.grad = DType::kBF16;
  return o;
}

// With f32 and with bf16 AdamW moments (saved as bf16: the resumed run reads back exactly what the
// uninterrupted one holds), and with bf16 gradients too (never saved: a step starts from none).
TEST(TrainerTest, ResumeIsBitIdentical) {
  auto source = Synthetic(64);
  for (const TrainerOptions& options :
       {SmallOptions(), Bf16MomentOptions(), Bf16GradientOptions(Bf16MomentOptions())}) {
    SCOPED_TRACE(DTypeName(options.optimizer_dtypes.exp_avg) + std::string(" moments, ") +
                 DTypeName(options.optimizer_dtypes.grad) + " gradients");
    const std::string root =
        ::testing::TempDir() + "/resume_" + std::to_string(testing::TestSeed());
    std::filesystem::remove_all(root);

    auto straight = NewTrainer(source.get(), options);
    std::vector<StepStats> expected;
    for (int step = 0; step < 6; ++step) expected.push_back(straight->TrainStep());

    auto first_half = NewTrainer(source.get(), options);
    for (int step = 0; step < 3; ++step) first_half->TrainStep();
    ASSERT_TRUE(first_half->Save(root, {{"test", true}}).ok());

    auto resumed = NewTrainer(source.get(), options);
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
      EXPECT_EQ(got[i]->exp_avg.dtype(), options.optimizer_dtypes.exp_avg);
      EXPECT_EQ(testing::ToFloats(got[i]->exp_avg_sq), testing::ToFloats(want[i]->exp_avg_sq))
          << want[i]->name;
    }
    std::filesystem::remove_all(root);
  }
}

// A trainer reads each next step's samples while the device runs the current one's optimizer; a
// checkpoint of an earlier step loaded into it mid-run trains on the checkpoint's samples, not on
// those it read ahead.
TEST(TrainerTest, LoadMidRunTrainsOnTheCheckpointsSamples) {
  auto source = Synthetic(64);
  const std::string root = ::testing::TempDir() + "/mid_run_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);
  auto straight = NewTrainer(source.get());
  std::vector<StepStats> expected;
  for (int step = 0; step < 4; ++step) expected.push_back(straight->TrainStep());

  auto trainer = NewTrainer(source.get());
  trainer->TrainStep();
  ASSERT_TRUE(trainer->Save(root, {}).ok());
  for (int step = 1; step < 3; ++step) trainer->TrainStep();  // holds step 4's samples now
  const Status loaded = trainer->Load(root);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  ASSERT_EQ(trainer->step(), 1);
  for (int step = 1; step < 4; ++step) {
    EXPECT_EQ(trainer->TrainStep().loss, expected[step].loss) << "step " << step;
  }
  std::filesystem::remove_all(root);
}

// Trains `options` beside the all-f32 defaults for 40 steps: its loss falls by more than 1 and ends
// within 5% of the f32 run's, yet not equal to it (the dtypes changed something). Returns the
// f32 trainer and the other.
std::pair<std::unique_ptr<Trainer>, std::unique_ptr<Trainer>> ExpectTrainsLikeF32(
    const TokenSource* source, const TrainerOptions& options) {
  auto f32 = NewTrainer(source), other = NewTrainer(source, options);
  double first = 0, last_f32 = 0, last_other = 0;
  for (int step = 0; step < 40; ++step) {
    last_f32 = f32->TrainStep().loss;
    last_other = other->TrainStep().loss;
    if (step == 0) first = last_other;
  }
  EXPECT_LT(last_other, first - 1.0);
  EXPECT_NEAR(last_other, last_f32, 0.05 * last_f32);
  EXPECT_NE(last_other, last_f32) << "the dtypes changed nothing";
  return {std::move(f32), std::move(other)};
}

// bf16 moments: the loss falls about as with f32 moments; the checkpoint holds them as bf16,
// and checkpoints of either dtype load into runs of the other (widened exactly, or rounded).
TEST(TrainerTest, Bf16MomentsTrainLikeF32AndCheckpointsCrossDtypes) {
  auto source = Synthetic(64);
  const auto [f32, bf16] = ExpectTrainsLikeF32(source.get(), Bf16MomentOptions());

  const std::string root = ::testing::TempDir() + "/moments_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(bf16->Save(root + "/bf16", {}).ok());
  ASSERT_TRUE(f32->Save(root + "/f32", {}).ok());
  const auto contents = ReadSafetensors(root + "/bf16/step_00000040/optimizer.safetensors");
  ASSERT_TRUE(contents.ok()) << contents.status().message();
  const Parameter& first_parameter = *bf16->parameters().all().front();
  EXPECT_EQ(contents.value().tensors.at(first_parameter.name + ".exp_avg").dtype, DType::kBF16);

  auto widened = NewTrainer(source.get());
  ASSERT_TRUE(widened->Load(root + "/bf16").ok());
  auto rounded = NewTrainer(source.get(), Bf16MomentOptions());
  ASSERT_TRUE(rounded->Load(root + "/f32").ok());
  for (size_t i = 0; i < f32->parameters().all().size(); ++i) {
    const Parameter& from_bf16 = *bf16->parameters().all()[i];
    EXPECT_EQ(testing::ToFloats(widened->parameters().all()[i]->exp_avg),
              testing::ToFloats(from_bf16.exp_avg));
    std::vector<float> want = testing::ToFloats(f32->parameters().all()[i]->exp_avg_sq);
    for (float& x : want) x = BFloat16ToFloat(FloatToBFloat16(x));
    EXPECT_EQ(testing::ToFloats(rounded->parameters().all()[i]->exp_avg_sq), want);
  }
  EXPECT_TRUE(std::isfinite(widened->TrainStep().loss));
  EXPECT_TRUE(std::isfinite(rounded->TrainStep().loss));
  std::filesystem::remove_all(root);
}

// The tiny model with the fused grouped MLP, with or without the FP8 recipe.
GptConfig FusedTinyModel(Fp8Recipe fp8) {
  GptConfig m = testing::TinyModel();
  m.moe_grouped_mlp = GroupedMlpKind::kFused;
  m.fp8_recipe = fp8;
  return m;
}

// The blockwise FP8 recipe trains like the f32 expert GEMMs (40 steps, final loss within 2%, and
// not the same bits); the recipe is not part of the checkpoint: an FP8 run resumes bit for bit
// with it, and its checkpoint trains on without it.
TEST(TrainerTest, Fp8RecipeTrainsLikeF32AndCheckpointsResumeWithAndWithoutIt) {
  auto source = Synthetic(64);
  const GptConfig plain = FusedTinyModel(Fp8Recipe::kNone);
  const GptConfig fp8 = FusedTinyModel(Fp8Recipe::kBlockwise);
  auto f32_run = NewTrainer(source.get(), SmallOptions(), plain);
  auto fp8_run = NewTrainer(source.get(), SmallOptions(), fp8);
  std::vector<StepStats> fp8_steps;
  double first = 0, last_f32 = 0;
  for (int step = 0; step < 40; ++step) {
    last_f32 = f32_run->TrainStep().loss;
    fp8_steps.push_back(fp8_run->TrainStep());
    if (step == 0) first = fp8_steps.back().loss;
  }
  EXPECT_LT(fp8_steps.back().loss, first - 1.0);
  EXPECT_NEAR(fp8_steps.back().loss, last_f32, 0.02 * last_f32);
  EXPECT_NE(fp8_steps.back().loss, last_f32) << "the recipe changed nothing";

  const std::string root = ::testing::TempDir() + "/fp8_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);
  auto first_half = NewTrainer(source.get(), SmallOptions(), fp8);
  for (int step = 0; step < 3; ++step) first_half->TrainStep();
  ASSERT_TRUE(first_half->Save(root, {}).ok());
  auto resumed = NewTrainer(source.get(), SmallOptions(), fp8);
  ASSERT_TRUE(resumed->Load(root).ok());
  for (int step = 3; step < 6; ++step) {
    EXPECT_EQ(resumed->TrainStep().loss, fp8_steps[step].loss) << "step " << step;
  }
  auto without = NewTrainer(source.get(), SmallOptions(), plain);
  ASSERT_TRUE(without->Load(root).ok());
  EXPECT_NEAR(without->TrainStep().loss, fp8_steps[3].loss, 0.02 * fp8_steps[3].loss);
  std::filesystem::remove_all(root);
}

// The floats of a dumped tensor (f32 or bf16).
std::vector<float> DumpedFloats(const HostTensor& t) {
  std::vector<float> out(t.bytes.size() / DTypeSize(t.dtype));
  DispatchStorage(t.dtype, [&]<typename T>(StorageTag<T>) {
    const T* values = reinterpret_cast<const T*>(t.bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = ToFloat(values[i]);
  });
  return out;
}

// bf16 gradients (--main_grads_dtype=bf16): each backward op adds in f32 and rounds once, so after
// one micro-batch (every parameter written by one op here) every gradient is the f32 run's rounded
// to nearest even, bit for bit; the data gradients and the loss are untouched.
TEST(TrainerTest, Bf16GradientsAreTheF32GradientsRoundedOnce) {
  auto source = Synthetic(64);
  const std::string root = ::testing::TempDir() + "/grads_" + std::to_string(testing::TestSeed());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(NewTrainer(source.get())->DumpReferenceCase(root + "/f32").ok());
  ASSERT_TRUE(
      NewTrainer(source.get(), Bf16GradientOptions())->DumpReferenceCase(root + "/bf16").ok());
  const auto f32 = ReadSafetensors(root + "/f32/reference.safetensors");
  const auto bf16 = ReadSafetensors(root + "/bf16/reference.safetensors");
  ASSERT_TRUE(f32.ok() && bf16.ok());
  int gradients = 0;
  for (const auto& [name, want] : f32.value().tensors) {
    const HostTensor& got = bf16.value().tensors.at(name);
    if (name.rfind("grad.", 0) != 0) {
      EXPECT_EQ(got.bytes, want.bytes) << name;
      continue;
    }
    ++gradients;
    EXPECT_EQ(got.dtype, DType::kBF16) << name;
    std::vector<float> rounded = DumpedFloats(want);
    for (float& x : rounded) x = BFloat16ToFloat(FloatToBFloat16(x));
    EXPECT_EQ(DumpedFloats(got), rounded) << name;
  }
  EXPECT_GT(gradients, 10);
  std::filesystem::remove_all(root);
}

// Over many steps bf16 gradients (rounded at every micro-batch's add) train about as f32 ones.
TEST(TrainerTest, Bf16GradientsTrainLikeF32) {
  auto source = Synthetic(64);
  const auto trained = ExpectTrainsLikeF32(source.get(), Bf16GradientOptions());
  for (const auto& p : trained.second->parameters().all()) {
    EXPECT_EQ(p->grad.dtype(), DType::kBF16) << p->name;
  }
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
