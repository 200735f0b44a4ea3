// Import of Hugging Face checkpoints: every tensor lands where tests/testing/hf_checkpoints.h's
// independent list says (Mixtral per expert and stacked; Qwen3-MoE with a dense layer once the
// build has the query/key norm), BF16 widened exactly, several shards the same bytes as one file,
// the checkpoint weights-only at step 0 with model.flags; each refusal one line, nothing written.
#include "modules/hf_import.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "engine/io/checkpoint.h"
#include "modules/checkpoint_state.h"
#include "modules/model_shape.h"
#include "tests/testing/command.h"
#include "tests/testing/hf_checkpoints.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using ::moe::testing::HfModelFiles;
using ::moe::testing::ReadAllTensors;
using ::moe::testing::ScopedTempDir;
using ::moe::testing::ToFloats;
using ::moe::testing::WriteHfDirectory;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<float> Hf(const HfModelFiles& files, const std::string& name) {
  for (const NamedTensor& t : files.tensors) {
    if (t.name == name) return ToFloats(t.tensor);
  }
  ADD_FAILURE() << "no " << name;
  return {};
}

std::vector<float> Part(const std::vector<float>& v, int64_t begin, int64_t count) {
  return std::vector<float>(v.begin() + begin, v.begin() + begin + count);
}

// Imports `dir` into `out`, expecting success.
HfImportSummary Import(const std::string& dir, const std::string& out, int64_t seq_length = 0) {
  StatusOr<HfImportSummary> imported = ImportHfCheckpoint({dir, out, seq_length});
  EXPECT_TRUE(imported.ok()) << imported.status().ToString();
  return imported.ok() ? *imported : HfImportSummary{};
}

constexpr int64_t kF = 24, kH = 32;  // hf_checkpoints.h's expert width and hidden size

TEST(HfImportTest, MixtralPerExpertTensorsLandInPlace) {
  ScopedTempDir temp;
  const HfModelFiles hf = testing::TinyMixtral(/*stacked=*/false, 7);
  WriteHfDirectory(temp.Path("hf"), hf);
  const HfImportSummary summary = Import(temp.Path("hf"), temp.Path("ckpt"));
  EXPECT_EQ(summary.type, HfModelType::kMixtral);
  EXPECT_EQ(summary.files, 1);
  EXPECT_EQ(summary.tensors, static_cast<int64_t>(hf.tensors.size()));
  EXPECT_EQ(summary.dtypes, "F32");
  const auto ours = ReadAllTensors(temp.Path("ckpt/step_00000000"));
  EXPECT_EQ(ours.at("embedding.weight"), Hf(hf, "model.embed_tokens.weight"));
  EXPECT_EQ(ours.at("lm_head.weight"), Hf(hf, "lm_head.weight"));
  EXPECT_EQ(ours.at("final_norm.weight"), Hf(hf, "model.norm.weight"));
  EXPECT_EQ(ours.at("layers.1.attn_norm.weight"), Hf(hf, "model.layers.1.input_layernorm.weight"));
  EXPECT_EQ(ours.at("layers.0.mlp_norm.weight"),
            Hf(hf, "model.layers.0.post_attention_layernorm.weight"));
  EXPECT_EQ(ours.at("layers.1.attention.k_proj.weight"),
            Hf(hf, "model.layers.1.self_attn.k_proj.weight"));
  EXPECT_EQ(ours.at("layers.0.attention.o_proj.weight"),
            Hf(hf, "model.layers.0.self_attn.o_proj.weight"));
  EXPECT_EQ(ours.at("layers.1.moe.router.weight"),
            Hf(hf, "model.layers.1.block_sparse_moe.gate.weight"));
  const std::vector<float>& fc1 = ours.at("layers.1.moe.experts.fc1.weight");
  const std::vector<float>& fc2 = ours.at("layers.1.moe.experts.fc2.weight");
  for (int e = 0; e < 4; ++e) {
    const std::string x = "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".";
    EXPECT_EQ(Part(fc1, e * 2 * kF * kH, kF * kH), Hf(hf, x + "w1.weight")) << e;  // gate
    EXPECT_EQ(Part(fc1, e * 2 * kF * kH + kF * kH, kF * kH), Hf(hf, x + "w3.weight")) << e;
    EXPECT_EQ(Part(fc2, e * kH * kF, kH * kF), Hf(hf, x + "w2.weight")) << e;
  }
}

TEST(HfImportTest, StackedExpertsAndBf16Values) {
  ScopedTempDir temp;
  const HfModelFiles hf = testing::TinyMixtral(/*stacked=*/true, 8);
  WriteHfDirectory(temp.Path("hf"), hf, 1, DType::kBF16);
  EXPECT_EQ(Import(temp.Path("hf"), temp.Path("ckpt")).dtypes, "BF16");
  const auto ours = ReadAllTensors(temp.Path("ckpt/step_00000000"));
  const auto stored = ReadAllTensors(temp.Path("hf"));  // the bf16 values, widened
  EXPECT_EQ(ours.at("layers.0.moe.experts.fc1.weight"),
            stored.at("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(ours.at("layers.0.moe.experts.fc2.weight"),
            stored.at("model.layers.0.mlp.experts.down_proj"));
  EXPECT_EQ(ours.at("layers.0.moe.router.weight"), stored.at("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(ours.at("embedding.weight"), stored.at("model.embed_tokens.weight"));
}

// Needs the query/key norm in this build (CheckModel accepts --qk_layernorm): skipped until then.
TEST(HfImportTest, Qwen3MoeWithADenseLayerLandsInPlace) {
  ScopedTempDir temp;
  const HfModelFiles hf = testing::TinyQwen3Moe(/*dense_layers=*/1, 9);
  WriteHfDirectory(temp.Path("hf"), hf);
  StatusOr<HfImportSummary> imported = ImportHfCheckpoint({temp.Path("hf"), temp.Path("ckpt"), 0});
  if (!imported.ok() &&
      imported.status().message().find("is not implemented in this build") != std::string::npos) {
    GTEST_SKIP() << imported.status().message();
  }
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_EQ(imported->config.first_dense_layers, 1);
  const auto ours = ReadAllTensors(temp.Path("ckpt/step_00000000"));
  EXPECT_EQ(ours.at("layers.0.attention.q_norm.weight"),
            Hf(hf, "model.layers.0.self_attn.q_norm.weight"));
  EXPECT_EQ(ours.at("layers.1.attention.k_norm.weight"),
            Hf(hf, "model.layers.1.self_attn.k_norm.weight"));
  const std::vector<float>& dense_fc1 = ours.at("layers.0.mlp.fc1.weight");
  EXPECT_EQ(Part(dense_fc1, 0, 40 * kH), Hf(hf, "model.layers.0.mlp.gate_proj.weight"));
  EXPECT_EQ(Part(dense_fc1, 40 * kH, 40 * kH), Hf(hf, "model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(ours.at("layers.0.mlp.fc2.weight"), Hf(hf, "model.layers.0.mlp.down_proj.weight"));
  const std::vector<float>& fc1 = ours.at("layers.1.moe.experts.fc1.weight");
  EXPECT_EQ(Part(fc1, 3 * 2 * kF * kH + kF * kH, kF * kH),
            Hf(hf, "model.layers.1.mlp.experts.3.up_proj.weight"));
}

TEST(HfImportTest, ShardsGiveTheBytesOfOneFile) {
  ScopedTempDir temp;
  const HfModelFiles hf = testing::TinyMixtral(false, 10);
  WriteHfDirectory(temp.Path("one"), hf, 1);
  WriteHfDirectory(temp.Path("three"), hf, 3);
  EXPECT_TRUE(fs::exists(temp.Path("three/model-00003-of-00003.safetensors")));
  Import(temp.Path("one"), temp.Path("a"));
  EXPECT_EQ(Import(temp.Path("three"), temp.Path("b")).files, 3);
  EXPECT_EQ(ReadText(temp.Path("a/step_00000000/model.safetensors")),
            ReadText(temp.Path("b/step_00000000/model.safetensors")));
}

TEST(HfImportTest, WritesAWeightsOnlyCheckpointAndItsModelFlags) {
  ScopedTempDir temp;
  WriteHfDirectory(temp.Path("hf"), testing::TinyMixtral(false, 11));
  const HfImportSummary summary = Import(temp.Path("hf"), temp.Path("ckpt"), 16);
  EXPECT_EQ(temp.List(),
            (std::vector<std::string>{
                "ckpt", "ckpt/latest", "ckpt/model.flags", "ckpt/step_00000000",
                "ckpt/step_00000000/model.safetensors", "ckpt/step_00000000/optimizer.safetensors",
                "ckpt/step_00000000/state.json", "hf", "hf/config.json", "hf/model.safetensors"}));
  StatusOr<CheckpointState> state = ReadCheckpointState(temp.Path("ckpt"));
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_TRUE(IsWeightsOnlyCheckpoint(state->state));
  EXPECT_EQ(state->state["step"], 0);
  EXPECT_EQ(ModelShapeDifferences(state->state["model"], summary.config), "");
  EXPECT_EQ(summary.config.seq_length, 16);
  EXPECT_EQ(state->state["run"]["hf_model_type"], "mixtral");
  const std::string flags = ReadText(temp.Path("ckpt/model.flags"));
  EXPECT_NE(flags.find(ModelShapeFlagfile(summary.config)), std::string::npos) << flags;
  EXPECT_NE(flags.find("--first_dense_layers=0\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--norm_epsilon=1e-06\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--rotary_base=1e+06\n"), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--ffn_hidden_size"), std::string::npos) << "no dense layer: " << flags;
}

struct BadDirectory {
  const char* what;
  std::function<void(const std::string& dir)> damage;
  StatusCode code;
  std::string message;
};

TEST(HfImportTest, RefusesInOneLineAndWritesNothing) {
  const HfModelFiles hf = testing::TinyMixtral(false, 12);
  const std::string expert = "model.layers.0.block_sparse_moe.experts.1.w3.weight";
  const auto rewrite = [&](const std::string& dir, const std::function<void(HfModelFiles&)>& edit) {
    HfModelFiles changed = hf;
    edit(changed);
    fs::remove(dir + "/model.safetensors");
    WriteHfDirectory(dir, changed);
  };
  const std::vector<BadDirectory> cases = {
      {"missing tensor",
       [&](const std::string& d) {
         rewrite(d, [&](HfModelFiles& f) {
           std::erase_if(f.tensors, [&](const NamedTensor& t) { return t.name == expert; });
         });
       },
       StatusCode::kInvalidArgument,
       "has no tensor '" + expert + "' (1 of the " + std::to_string(hf.tensors.size()) +
           " tensors of the mixtral model of"},
      {"unexpected tensor",
       [&](const std::string& d) {
         rewrite(d, [&](HfModelFiles& f) {
           f.tensors.push_back({"model.layers.0.self_attn.q_proj.bias", f.tensors[1].tensor});
         });
       },
       StatusCode::kInvalidArgument,
       "holds tensor 'model.layers.0.self_attn.q_proj.bias' (in "
       "model.safetensors), which the mixtral model of"},
      {"shape",
       [&](const std::string& d) {
         rewrite(d, [&](HfModelFiles& f) {
           for (NamedTensor& t : f.tensors) {
             if (t.name == expert) t.tensor = t.tensor.View({kH, kF});
           }
         });
       },
       StatusCode::kInvalidArgument, "tensor '" + expert + "' in '"},
      {"not finite",
       [&](const std::string& d) {
         rewrite(d, [&](HfModelFiles& f) {
           f.tensors.back().tensor =
               testing::FromFloats(std::vector<float>(f.tensors.back().tensor.numel(), NAN),
                                   f.tensors.back().tensor.shape(), DType::kF32, Device::CPU());
         });
       },
       StatusCode::kDataLoss, "tensor 'lm_head.weight' in '"},
      {"no weights", [&](const std::string& d) { fs::remove(d + "/model.safetensors"); },
       StatusCode::kNotFound, "has neither model.safetensors nor model.safetensors.index.json"},
      {"no config", [&](const std::string& d) { fs::remove(d + "/config.json"); },
       StatusCode::kNotFound, "config.json' does not exist or cannot be read"},
      {"config refused",
       [&](const std::string& d) {
         nlohmann::json config = hf.config;
         config["tie_word_embeddings"] = true;
         std::ofstream(d + "/config.json") << config.dump();
       },
       StatusCode::kInvalidArgument, "/config.json: \"tie_word_embeddings\" true is not supported"},
      {"index names a missing file",
       [&](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         WriteHfDirectory(d, hf, 2);
         fs::remove(d + "/model-00002-of-00002.safetensors");
       },
       StatusCode::kNotFound, "model-00002-of-00002.safetensors"},
  };
  for (const BadDirectory& c : cases) {
    SCOPED_TRACE(c.what);
    ScopedTempDir temp;
    WriteHfDirectory(temp.Path("hf"), hf);
    c.damage(temp.Path("hf"));
    const Status status = ImportHfCheckpoint({temp.Path("hf"), temp.Path("ckpt"), 0}).status();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), c.code) << status.ToString();
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status.message();
    EXPECT_EQ(status.message().find('\n'), std::string::npos) << status.message();
    EXPECT_FALSE(fs::exists(temp.Path("ckpt")));
    for (const std::string& entry : temp.List()) EXPECT_EQ(entry.find("ckpt"), std::string::npos);
  }
}

TEST(HfImportTest, AnExistingOutputIsRefusedAndLeftAlone) {
  ScopedTempDir temp;
  WriteHfDirectory(temp.Path("hf"), testing::TinyMixtral(false, 13));
  fs::create_directory(temp.Path("ckpt"));
  std::ofstream(temp.Path("ckpt/notes.txt")) << "mine";
  const Status status = ImportHfCheckpoint({temp.Path("hf"), temp.Path("ckpt"), 0}).status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("exists and is not empty: nothing overwritten"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(ReadText(temp.Path("ckpt/notes.txt")), "mine");
  EXPECT_EQ(temp.List(), (std::vector<std::string>{"ckpt", "ckpt/notes.txt", "hf", "hf/config.json",
                                                   "hf/model.safetensors"}));
}

}  // namespace
}  // namespace moe
