// The checkpoint's model shape: which fields must agree (all of them, or for --finetune those that
// set parameter shapes), the message that names the others, the model read back from it, and
// the flagfile that gives it.
#include "modules/model_shape.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

TEST(ModelShapeTest, TheSameModelFits) {
  const GptConfig c = testing::TinyModel();
  EXPECT_EQ(ModelShapeDifferences(ModelShapeJson(c), c), "");
}

TEST(ModelShapeTest, NamesEveryDifferingFieldWithBothValues) {
  const GptConfig c = testing::TinyModel();
  nlohmann::json saved = ModelShapeJson(c);
  saved["num_layers"] = 4;
  saved["vocab_size"] = 100;
  EXPECT_EQ(ModelShapeDifferences(saved, c),
            "--num_layers (checkpoint 4, this run 2), --vocab_size (checkpoint 100, this run 64)");
  saved = ModelShapeJson(c);
  saved.erase("seq_length");
  saved["rotary_dim"] = 8;
  EXPECT_EQ(
      ModelShapeDifferences(saved, c),
      "--seq_length (checkpoint none, this run 16), rotary_dim (checkpoint 8, unknown to this "
      "build)");
}

// A preset that once set --ffn_hidden_size for a model without dense layers (as
// qwen3_moe_8layer.flags did) still loads into the same model without it; with a dense layer the
// field matters again. The expert fields matter only with MoE layers.
TEST(ModelShapeTest, FieldsThatCannotChangeTheModelAreNotCompared) {
  GptConfig all_moe = testing::TinyModel();
  all_moe.first_dense_layers = 0;
  nlohmann::json saved = ModelShapeJson(all_moe);
  saved["ffn_hidden_size"] = 6144;
  EXPECT_EQ(ModelShapeDifferences(saved, all_moe), "");
  GptConfig with_dense = all_moe;
  with_dense.first_dense_layers = 1;
  saved["first_dense_layers"] = 1;
  EXPECT_EQ(ModelShapeDifferences(saved, with_dense),
            "--ffn_hidden_size (checkpoint 6144, this run 64)");

  GptConfig all_dense = testing::TinyModel();
  all_dense.first_dense_layers = all_dense.num_layers;
  saved = ModelShapeJson(all_dense);
  saved["num_experts"] = 64;
  saved["moe_ffn_hidden_size"] = 1;
  EXPECT_EQ(ModelShapeDifferences(saved, all_dense), "");
}

// A checkpoint written before kv_channels, the query/key norm, rotary_base, norm_epsilon and
// moe_router_pre_softmax existed holds none of them: it fits the model with that build's values
// (head dim hidden / heads, base 10000, epsilon 1e-5, no norm, renormalised gates), no other.
TEST(ModelShapeTest, ACheckpointFromBeforeTheLaterFieldsHasTheirOldValues) {
  const GptConfig c = testing::TinyModel();
  nlohmann::json saved = ModelShapeJson(c);
  for (const char* key : {"kv_channels", "qk_layernorm", "qk_layernorm_across_heads", "rotary_base",
                          "norm_epsilon", "moe_router_pre_softmax"}) {
    ASSERT_TRUE(saved.contains(key)) << key;
    saved.erase(key);
  }
  EXPECT_EQ(ModelShapeDifferences(saved, c), "");
  GptConfig explicit_head = c;
  explicit_head.kv_channels = c.hidden_size / c.num_attention_heads;
  EXPECT_EQ(ModelShapeDifferences(saved, explicit_head), "");

  GptConfig qwen3_like = c;
  qwen3_like.kv_channels = 2 * c.head_dim();
  qwen3_like.qk_layernorm = true;
  qwen3_like.rotary_base = 1e6f;
  EXPECT_EQ(ModelShapeDifferences(saved, qwen3_like),
            "--kv_channels (checkpoint " + std::to_string(c.head_dim()) + ", this run " +
                std::to_string(2 * c.head_dim()) +
                "), --qk_layernorm (checkpoint false, this run true), --rotary_base (checkpoint "
                "10000.0, this run 1000000.0)");
}

// --finetune compares what sets the parameters' names and shapes, nothing else.
TEST(ModelShapeTest, AFinetuneComparesOnlyTheFieldsThatSetParameters) {
  const GptConfig c = testing::TinyModel();
  GptConfig other = c;
  other.seq_length = 4 * c.seq_length;
  other.rotary_base = 5e5f;
  other.norm_epsilon = 1e-6f;
  other.moe_router_topk = 4;
  other.moe_router_pre_softmax = true;
  EXPECT_EQ(ModelShapeDifferences(ModelShapeJson(c), other, ShapeFields::kParameters), "");
  EXPECT_NE(ModelShapeDifferences(ModelShapeJson(c), other), "");
  other.num_experts = 8;
  other.qk_layernorm = true;
  EXPECT_EQ(ModelShapeDifferences(ModelShapeJson(c), other, ShapeFields::kParameters),
            "--num_experts (checkpoint 4, this run 8), --qk_layernorm (checkpoint false, this run "
            "true)");
}

TEST(ModelShapeTest, TheModelReadsBackFromItsShape) {
  GptConfig c = testing::TinyModel();
  c.kv_channels = 16;
  c.rotary_base = 1e6f;
  c.norm_epsilon = 1e-6f;
  StatusOr<GptConfig> back = GptConfigFromModelShape(ModelShapeJson(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ModelShapeJson(*back), ModelShapeJson(c));
  EXPECT_EQ(back->rotary_base, 1e6f);
  EXPECT_EQ(back->norm_epsilon, 1e-6f);
  nlohmann::json saved = ModelShapeJson(c);
  saved["num_layers"] = "2";
  EXPECT_EQ(GptConfigFromModelShape(saved).status().message(),
            "the model shape has no integer \"num_layers\"");
}

TEST(ModelShapeTest, TheFlagfileGivesTheFieldsThatMatterShortest) {
  GptConfig c = testing::TinyModel();
  c.first_dense_layers = 0;
  c.norm_epsilon = 1e-6f;
  c.rotary_base = 1e6f;
  const std::string flags = ModelShapeFlagfile(c);
  EXPECT_NE(flags.find("--norm_epsilon=1e-06\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--rotary_base=1e+06\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--first_dense_layers=0\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--qk_layernorm=false\n"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--kv_channels=8\n"), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--ffn_hidden_size"), std::string::npos) << flags;
  c.first_dense_layers = c.num_layers;
  const std::string dense = ModelShapeFlagfile(c);
  EXPECT_NE(dense.find("--ffn_hidden_size=64\n"), std::string::npos) << dense;
  EXPECT_EQ(dense.find("--num_experts"), std::string::npos) << dense;
  EXPECT_EQ(std::count(flags.begin(), flags.end(), '\n'), 16);  // 17 fields, ffn_hidden_size out
}

}  // namespace
}  // namespace moe
