// Export to Hugging Face directories: import(export(checkpoint)) gives back the checkpoint's
// weights bit for bit in f32; bf16 is each weight rounded to nearest even; shards stay under
// their size with an index that covers them; config.json reads back as the model; the type is
// inferred from the query/key norm; each refusal one line, nothing written.
#include "modules/hf_export.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/io/checkpoint.h"
#include "modules/checkpoint_state.h"
#include "modules/gpt_model.h"
#include "modules/hf_import.h"
#include "modules/model_shape.h"
#include "tests/testing/command.h"
#include "tests/testing/hf_checkpoints.h"
#include "tests/testing/tensor_testing.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using ::moe::testing::ReadAllTensors;
using ::moe::testing::ScopedTempDir;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A Mixtral-like model of ours (no query/key norm, every layer MoE).
GptConfig Model() {
  GptConfig c = testing::TinyModel();
  c.first_dense_layers = 0;
  c.rotary_base = 1e6f;
  c.norm_epsilon = 1e-6f;
  return c;
}

// A checkpoint of `config` at step 7 with random weights and moments, as the trainer saves one.
std::map<std::string, std::vector<float>> SaveCheckpointOf(const GptConfig& config,
                                                           const std::string& root) {
  std::mt19937 rng(::moe::testing::TestSeed());
  std::vector<NamedTensor> model, optimizer;
  std::map<std::string, std::vector<float>> values;
  for (const ParameterSpec& spec :
       GptModel::StageParameterSpecs(config, GptStage{0, config.num_layers, true, true})) {
    model.push_back(
        {spec.name, testing::RandomTensor(spec.shape, DType::kF32, Device::CPU(), rng)});
    optimizer.push_back({spec.name + ".exp_avg",
                         testing::RandomTensor(spec.shape, DType::kF32, Device::CPU(), rng)});
    values[spec.name] = testing::ToFloats(model.back().tensor);
  }
  CHECK(SaveCheckpoint(root, 7, model, optimizer,
                       TrainingCheckpointState(7, 7, 112, 1234, config, {{"flags", {}}}))
            .ok());
  return values;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

// Exports `config`'s checkpoint in f32 (type inferred, several small shards), checks the files,
// imports them back and expects the checkpoint's weights bit for bit.
void ExpectRoundTrip(const GptConfig& config, HfModelType type) {
  ScopedTempDir temp;
  const auto ours = SaveCheckpointOf(config, temp.Path("run"));
  HfExportOptions options{temp.Path("run"), temp.Path("hf"), std::nullopt, DType::kF32, 20000};
  StatusOr<HfExportSummary> exported = ExportHfCheckpoint(options);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->type, type);
  EXPECT_EQ(exported->checkpoint_dir, temp.Path("run/step_00000007"));
  EXPECT_GT(exported->shards, 3);
  // The shards: named as transformers names them, each at most 20000 bytes of tensors unless one
  // tensor alone, covered by the index.
  const nlohmann::json index = ReadJson(temp.Path("hf/model.safetensors.index.json"));
  int64_t total = 0;
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file);
  EXPECT_EQ(static_cast<int>(files.size()), exported->shards);
  for (int i = 1; i <= exported->shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", i, exported->shards);
    ASSERT_TRUE(files.count(name)) << name;
    StatusOr<SafetensorsContents> shard = ReadSafetensors(temp.Path("hf/") + name);
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ(shard->metadata.at("format"), "pt");
    int64_t bytes = 0;
    for (const auto& [tensor, t] : shard->tensors) {
      bytes += static_cast<int64_t>(t.bytes.size());
      EXPECT_EQ(index["weight_map"][tensor], name);
    }
    EXPECT_TRUE(bytes <= 20000 || shard->tensors.size() == 1) << name << " " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(exported->bytes, total);

  const nlohmann::json hf_config = ReadJson(temp.Path("hf/config.json"));
  EXPECT_EQ(hf_config["torch_dtype"], "float32");
  StatusOr<HfModel> back = HfModelFromConfig(hf_config);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  back->config.seq_length = back->max_position_embeddings;
  EXPECT_EQ(back->type, type);
  EXPECT_EQ(ModelShapeDifferences(ModelShapeJson(back->config), config), "");

  StatusOr<HfImportSummary> imported = ImportHfCheckpoint({temp.Path("hf"), temp.Path("again"), 0});
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  const auto again = ReadAllTensors(temp.Path("again/step_00000000"));
  ASSERT_EQ(again.size(), ours.size());
  for (const auto& [name, values] : ours) EXPECT_EQ(Bits(again.at(name)), Bits(values)) << name;
}

TEST(HfExportTest, ImportOfTheF32ExportIsTheCheckpointBitForBit) {
  ExpectRoundTrip(Model(), HfModelType::kMixtral);  // no query/key norm
}

// Needs the query/key norm in this build (CheckModel accepts --qk_layernorm): skipped until then.
TEST(HfExportTest, QueryKeyNormModelsRoundTripToo) {
  GptConfig qwen3 = Model();
  qwen3.qk_layernorm = true;
  qwen3.kv_channels = 16;
  qwen3.first_dense_layers = 1;
  qwen3.moe_router_pre_softmax = true;
  GptConfig olmoe = Model();
  olmoe.qk_layernorm = olmoe.qk_layernorm_across_heads = true;
  if (const Status status = CheckModel(qwen3); !status.ok()) GTEST_SKIP() << status.message();
  ExpectRoundTrip(qwen3, HfModelType::kQwen3Moe);
  ExpectRoundTrip(olmoe, HfModelType::kOlmoe);
}

TEST(HfExportTest, Bf16IsEachWeightRoundedToNearestEven) {
  ScopedTempDir temp;
  const auto ours = SaveCheckpointOf(Model(), temp.Path("run"));
  StatusOr<HfExportSummary> exported = ExportHfCheckpoint(
      {temp.Path("run/step_00000007"), temp.Path("hf"), std::nullopt, DType::kBF16, 1 << 30});
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->shards, 1);
  EXPECT_EQ(ReadJson(temp.Path("hf/config.json"))["dtype"], "bfloat16");
  StatusOr<SafetensorsContents> shard =
      ReadSafetensors(temp.Path("hf/model-00001-of-00001.safetensors"));
  ASSERT_TRUE(shard.ok());
  const HostTensor& gate = shard->tensors.at("model.layers.1.block_sparse_moe.experts.2.w1.weight");
  const HostTensor& embedding = shard->tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(gate.dtype, DType::kBF16);
  const int64_t f = 32, h = 32;
  const auto check = [](const HostTensor& t, const std::vector<float>& source, int64_t offset) {
    for (size_t i = 0; i < t.bytes.size() / 2; ++i) {
      uint32_t u;
      std::memcpy(&u, &source[offset + i], 4);
      const uint16_t want = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      uint16_t got;
      std::memcpy(&got, t.bytes.data() + 2 * i, 2);
      ASSERT_EQ(got, want) << i;
    }
  };
  check(gate, ours.at("layers.1.moe.experts.fc1.weight"), 2 * 2 * f * h);
  check(embedding, ours.at("embedding.weight"), 0);
}

TEST(HfExportTest, RefusesInOneLineAndWritesNothing) {
  ScopedTempDir temp;
  GptConfig config = Model();
  SaveCheckpointOf(config, temp.Path("run"));
  config.num_experts = 8;  // a model.safetensors of 4 experts under a state.json of 8
  std::vector<NamedTensor> model;
  for (const ParameterSpec& spec :
       GptModel::StageParameterSpecs(Model(), GptStage{0, config.num_layers, true, true})) {
    model.push_back({spec.name, Tensor::Empty(spec.shape, DType::kF32, Device::CPU())});
  }
  ASSERT_TRUE(
      SaveCheckpoint(temp.Path("wrong"), 1, model, {}, WeightsOnlyCheckpointState(config, {}))
          .ok());
  fs::create_directory(temp.Path("full"));
  std::ofstream(temp.Path("full/keep")) << "mine";
  const std::vector<std::pair<HfExportOptions, std::string>> cases = {
      {{temp.Path("run"), temp.Path("hf"), HfModelType::kOlmoe, DType::kBF16, 1 << 30},
       "--model_type=olmoe cannot express a model without --qk_layernorm_across_heads"},
      {{temp.Path("wrong"), temp.Path("hf"), std::nullopt, DType::kBF16, 1 << 30},
       "tensor 'layers.0.moe.router.weight' in '" + temp.Path("wrong/step_00000001") +
           "/model.safetensors' has shape [4, 32]; the model its state.json describes needs [8, "
           "32]"},
      {{temp.Path("missing"), temp.Path("hf"), std::nullopt, DType::kBF16, 1 << 30},
       "does not exist"},
      {{temp.Path("run"), temp.Path("full"), std::nullopt, DType::kBF16, 1 << 30},
       "exists and is not empty: nothing overwritten"},
  };
  for (const auto& [options, message] : cases) {
    SCOPED_TRACE(message);
    const Status status = ExportHfCheckpoint(options).status();
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find(message), std::string::npos) << status.message();
    EXPECT_EQ(status.message().find('\n'), std::string::npos);
    EXPECT_FALSE(fs::exists(temp.Path("hf")));
  }
  std::ifstream kept(temp.Path("full/keep"));
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(temp.Path("full")), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace moe
