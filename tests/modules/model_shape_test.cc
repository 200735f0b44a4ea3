// The checkpoint's model shape: which fields must agree, and the message that names the others.
#include "modules/model_shape.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace moe
