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

}  // namespace
}  // namespace moe
