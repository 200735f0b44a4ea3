// The chunked LM head and loss (modules/lm_head_loss.h) in the whole model on the CPU backend:
// chunks of a few rows give the losses and every gradient of one chunk of all tokens within fp32
// rounding, over several micro-batches (the head's gradient stored, then added); a forward-only
// pass gives the same loss in the same chunks and touches no gradient; what the head saves is its
// input gradient, never a (tokens, vocab) tensor; the device peak falls by the logits the chunks
// no longer hold.
#include "modules/lm_head_loss.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/memory/caching_allocator.h"
#include "engine/runtime/device_context.h"
#include "modules/gpt_model.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

const Device kDevice = Device::CPU();

// The tiny model with a vocabulary large enough that the logits dominate the head's memory.
GptConfig Model(int64_t head_chunk_rows) {
  GptConfig c = testing::TinyModel();
  c.vocab_size = 2048;
  c.head_chunk_rows = head_chunk_rows;
  return c;
}

constexpr int64_t kSequences = 3;  // 48 tokens: chunks of 5 rows leave a remainder of 3

struct MicroBatchData {
  Tensor ids, targets;
};

MicroBatchData RandomMicroBatch(const GptConfig& c, uint32_t seed) {
  const int64_t tokens = kSequences * c.seq_length;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> ids(tokens), targets(tokens);
  for (auto& v : ids) v = token(rng);
  for (auto& v : targets) v = token(rng);
  targets[7] = -1;  // ignored
  return {testing::FromInts(ids, {tokens}, kDevice), testing::FromInts(targets, {tokens}, kDevice)};
}

struct StepRun {
  std::vector<float> loss_sums;                     // per micro-batch
  std::vector<float> eval_loss_sums;                // forward-only, per micro-batch
  std::map<std::string, std::vector<float>> grads;  // after every micro-batch
};

constexpr int kStepMicroBatches = 2;  // the gradients' scales are those of a 2-micro-batch step

// Forward and backward of the micro-batches drawn from `seeds` into one step's gradients, each
// also evaluated forward-only before it (which must leave the gradients as they are).
StepRun Train(const GptConfig& config, const std::vector<uint32_t>& seeds) {
  ParameterSet parameters(kDevice, DType::kF32, 7, /*optimizer_state=*/false);
  GptModel model(config, parameters);
  parameters.ZeroGrads();
  StepRun run;
  for (size_t m = 0; m < seeds.size(); ++m) {
    const MicroBatchData data = RandomMicroBatch(config, seeds[m]);
    const float loss_grad = 1.0f / static_cast<float>(kStepMicroBatches * data.ids.numel());
    const auto gradients = [&] {  // pending zeros as they are, written ones bit for bit
      std::map<std::string, std::vector<uint32_t>> out;
      for (const auto& p : parameters.all()) {
        out[p->name] = p->grad_pending_zero ? std::vector<uint32_t>{} : testing::FloatBits(p->grad);
      }
      return out;
    };
    const auto before = gradients();
    SavedTensors forward_only(/*training=*/false);
    run.eval_loss_sums.push_back(testing::ToFloats(
        model.Forward(forward_only, data.ids, data.targets, /*loss_grad=*/0.0f).loss_sum)[0]);
    EXPECT_EQ(gradients(), before) << "evaluation wrote a gradient, micro-batch " << m;
    SavedTensors saved;
    const ForwardResult result = model.Forward(saved, data.ids, data.targets, loss_grad);
    run.loss_sums.push_back(testing::ToFloats(result.loss_sum)[0]);
    model.Backward(saved, Tensor(), /*aux_grad=*/1.0f / kStepMicroBatches);
    EXPECT_TRUE(saved.empty());
  }
  for (const auto& p : parameters.all()) {
    run.grads[p->name] = testing::ToFloats(MaterializedGrad(*p));
  }
  return run;
}

TEST(LmHeadLossTest, ChunkRowsComeFromTheByteBoundUnlessSet) {
  GptConfig c = Model(0);
  c.vocab_size = 32000;
  EXPECT_EQ(HeadChunkRows(c, 2), kLogitsChunkBytes / (32000 * 2));  // 8388
  c.vocab_size = int64_t{1} << 40;
  EXPECT_EQ(HeadChunkRows(c, 4), 1);
  c.head_chunk_rows = 5;
  EXPECT_EQ(HeadChunkRows(c, 4), 5);
}

// fp32 rounding of sums over 48 tokens (the loss) and over chunks and micro-batches (the weight
// gradient): here the largest relative error is 8e-7 (the losses agree to the bit); a wrong row
// offset, a chunk computed twice or missed, or a lost gradient write is O(1).
constexpr double kTolerance = 1e-5;

// Chunks of 5 rows and of 1 row against one chunk of all 48 tokens (the default bound's rows
// exceed them): fp32 rounding apart, the same losses and gradients. Over 2 micro-batches the
// head's gradient is stored by the first chunk of the first and added by every later chunk.
TEST(LmHeadLossTest, ChunksGiveTheWholeLogitsLossesAndGradients) {
  const int64_t tokens = kSequences * Model(0).seq_length;
  ASSERT_GE(HeadChunkRows(Model(0), 4), tokens) << "the reference must be one chunk";
  const std::vector<uint32_t> seeds = {100, 101};
  const StepRun whole = Train(Model(0), seeds);
  // One chunk of exactly every token is the same computation as the default's.
  const StepRun exact = Train(Model(tokens), seeds);
  EXPECT_EQ(exact.loss_sums, whole.loss_sums);
  EXPECT_EQ(exact.grads, whole.grads);
  // A forward-only pass computes the loss as the training forward does.
  EXPECT_EQ(whole.eval_loss_sums, whole.loss_sums);
  for (int64_t rows : {5, 1}) {
    const StepRun chunked = Train(Model(rows), seeds);
    EXPECT_EQ(chunked.eval_loss_sums, chunked.loss_sums) << rows << " rows";
    for (size_t m = 0; m < whole.loss_sums.size(); ++m) {
      EXPECT_NEAR(chunked.loss_sums[m], whole.loss_sums[m], kTolerance * whole.loss_sums[m])
          << rows << " rows, micro-batch " << m;
    }
    for (const auto& [name, want] : whole.grads) {
      EXPECT_LT(testing::RelativeError(chunked.grads.at(name), want), kTolerance)
          << name << ", " << rows << " rows";
    }
  }
}

// Both micro-batches' gradients, chunked, sum to the step's: the second adds to the first.
TEST(LmHeadLossTest, TheStepsGradientsAreTheSumOfItsMicroBatches) {
  const GptConfig config = Model(5);
  const StepRun step = Train(config, {100, 101});
  const StepRun first = Train(config, {100}), second = Train(config, {101});
  for (const auto& [name, got] : step.grads) {
    std::vector<float> want = first.grads.at(name);
    for (size_t i = 0; i < want.size(); ++i) want[i] += second.grads.at(name)[i];
    EXPECT_LT(testing::RelativeError(got, want), kTolerance) << name;
  }
}

// A training forward saves the head's input gradient and the final norm's tensors, never a
// (tokens, vocab) tensor; the device peak of a micro-batch falls by the logits rows the chunks
// no longer hold.
TEST(LmHeadLossTest, SavesNoLogitsAndHoldsOneChunkOfThem) {
  const GptConfig whole_config = Model(0);
  const int64_t tokens = kSequences * whole_config.seq_length, vocab = whole_config.vocab_size;
  CachingAllocator& allocator = DeviceContext::Get(kDevice).allocator();
  const auto peak_bytes = [&](const GptConfig& config) {
    ParameterSet parameters(kDevice, DType::kF32, 7, /*optimizer_state=*/false);
    GptModel model(config, parameters);
    const MicroBatchData data = RandomMicroBatch(config, 3);
    allocator.EmptyCache();
    const int64_t before = allocator.stats().allocated_bytes;
    allocator.ResetPeakStats();
    SavedTensors saved;
    model.Forward(saved, data.ids, data.targets, /*loss_grad=*/1.0f / static_cast<float>(tokens));
    std::map<std::string, Shape> head;
    for (const std::string& key : saved.keys()) {
      EXPECT_NE(saved.Peek(key).numel(), tokens * vocab) << key;
      if (key.rfind("layers.", 0) != 0) head[key] = saved.Peek(key).shape();
    }
    EXPECT_EQ(head, (std::map<std::string, Shape>{{"ids", {tokens}},
                                                  {"final_norm.x", {tokens, config.hidden_size}},
                                                  {"final_norm.rstd", {tokens}},
                                                  {"lm_head.dx", {tokens, config.hidden_size}}}));
    model.Backward(saved, Tensor(), /*aux_grad=*/1.0f);
    return allocator.stats().peak_allocated_bytes - before;
  };
  constexpr int64_t kRows = 8;
  const int64_t whole = peak_bytes(whole_config);
  const int64_t chunked = peak_bytes(Model(kRows));
  const int64_t logits_rows_saved = (tokens - kRows) * vocab * 4;  // 320 KiB
  EXPECT_NEAR(static_cast<double>(whole - chunked), static_cast<double>(logits_rows_saved),
              static_cast<double>(CachingAllocator::kRoundBytes))
      << "peak with one chunk of every token " << whole << ", with chunks of " << kRows << " rows "
      << chunked;
}

}  // namespace
}  // namespace moe
