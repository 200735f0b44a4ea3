// The Hugging Face tensor map: for every type, layout and mix of dense and MoE layers, the runs
// tile each parameter the model builds (GptModel::StageParameterSpecs) exactly once; the names,
// shapes and offsets of a few, spelled out; the layout found from the names.
#include "modules/hf_tensor_map.h"

#include <gtest/gtest.h>

#include <map>

#include "modules/gpt_model.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

GptConfig ModelOf(HfModelType type, bool dense_layer) {
  GptConfig c = testing::TinyModel();  // hidden 32, 4 heads of 8 over 2 groups, 4 experts
  c.first_dense_layers = dense_layer ? 1 : 0;
  c.qk_layernorm = type != HfModelType::kMixtral;
  c.qk_layernorm_across_heads = type == HfModelType::kOlmoe;
  if (type == HfModelType::kQwen3Moe) c.kv_channels = 16;  // q_dim 64 != hidden
  return c;
}

const HfTensorSlice* Find(const std::vector<HfTensorSlice>& slices, const std::string& name) {
  for (const HfTensorSlice& s : slices) {
    if (s.hf_name == name) return &s;
  }
  return nullptr;
}

// Every element of every parameter covered by exactly one run; no run outside a parameter.
void ExpectTiling(const GptConfig& config, HfModelType type, HfExpertLayout layout) {
  const std::vector<ParameterSpec> specs =
      GptModel::StageParameterSpecs(config, GptStage{0, config.num_layers, true, true});
  std::map<std::string, std::vector<int>> hits;
  for (const ParameterSpec& spec : specs) hits[spec.name].assign(NumElements(spec.shape), 0);
  for (const HfTensorSlice& s : HfTensorSlices(config, type, layout)) {
    ASSERT_TRUE(hits.count(s.ours)) << s.hf_name << " -> " << s.ours;
    std::vector<int>& h = hits[s.ours];
    ASSERT_LE(s.offset + NumElements(s.hf_shape), static_cast<int64_t>(h.size())) << s.hf_name;
    for (int64_t i = 0; i < NumElements(s.hf_shape); ++i) ++h[s.offset + i];
  }
  for (const auto& [name, h] : hits) {
    for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], 1) << name << " element " << i;
  }
}

TEST(HfTensorMapTest, RunsTileEveryParameterTheModelBuildsOnce) {
  for (const HfModelType type :
       {HfModelType::kMixtral, HfModelType::kQwen3Moe, HfModelType::kOlmoe}) {
    for (const bool dense : {false, true}) {
      for (const HfExpertLayout layout : {HfExpertLayout::kPerExpert, HfExpertLayout::kStacked}) {
        GptConfig config = ModelOf(type, dense);
        SCOPED_TRACE(std::string(HfModelTypeName(type)) + (dense ? " with a dense layer" : "") +
                     (layout == HfExpertLayout::kStacked ? ", stacked" : ", per expert"));
        if (!CheckModel(config).ok()) {
          // Until this build has the query/key norm, the same without it: the rest of the map.
          config.qk_layernorm = config.qk_layernorm_across_heads = false;
        }
        ExpectTiling(config, type, layout);
      }
    }
  }
}

// Run once the modules build the query/key norm (CheckModel accepts --qk_layernorm): the norms'
// tensors tile their parameters too.
TEST(HfTensorMapTest, QueryKeyNormsTileTheirParameters) {
  for (const HfModelType type : {HfModelType::kQwen3Moe, HfModelType::kOlmoe}) {
    const GptConfig config = ModelOf(type, false);
    if (!CheckModel(config).ok()) {
      GTEST_SKIP() << "this build has no query/key norm yet: " << CheckModel(config).message();
    }
    ExpectTiling(config, type, HfExpertLayout::kPerExpert);
  }
}

TEST(HfTensorMapTest, NamesShapesAndOffsets) {
  const GptConfig mixtral = ModelOf(HfModelType::kMixtral, false);
  const int64_t f = 32, h = 32;
  std::vector<HfTensorSlice> slices =
      HfTensorSlices(mixtral, HfModelType::kMixtral, HfExpertLayout::kPerExpert);
  EXPECT_EQ(slices.front().hf_name, "model.embed_tokens.weight");
  EXPECT_EQ(slices.back().hf_name, "lm_head.weight");
  const HfTensorSlice* up = Find(slices, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->ours, "layers.1.moe.experts.fc1.weight");
  EXPECT_EQ(up->hf_shape, (Shape{f, h}));
  EXPECT_EQ(up->offset, 2 * 2 * f * h + f * h);  // expert 2, after its gate rows
  const HfTensorSlice* down = Find(slices, "model.layers.0.block_sparse_moe.experts.3.w2.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ours, "layers.0.moe.experts.fc2.weight");
  EXPECT_EQ(down->hf_shape, (Shape{h, f}));
  EXPECT_EQ(down->offset, 3 * h * f);
  ASSERT_NE(Find(slices, "model.layers.0.block_sparse_moe.gate.weight"), nullptr);
  EXPECT_EQ(Find(slices, "model.layers.0.block_sparse_moe.gate.weight")->ours,
            "layers.0.moe.router.weight");
  EXPECT_EQ(Find(slices, "model.layers.0.self_attn.q_norm.weight"), nullptr);

  slices = HfTensorSlices(mixtral, HfModelType::kMixtral, HfExpertLayout::kStacked);
  ASSERT_NE(Find(slices, "model.layers.1.mlp.experts.gate_up_proj"), nullptr);
  EXPECT_EQ(Find(slices, "model.layers.1.mlp.experts.gate_up_proj")->hf_shape,
            (Shape{4, 2 * f, h}));
  EXPECT_EQ(Find(slices, "model.layers.1.mlp.experts.down_proj")->hf_shape, (Shape{4, h, f}));
  EXPECT_EQ(Find(slices, "model.layers.1.mlp.gate.weight")->ours, "layers.1.moe.router.weight");

  const GptConfig qwen3 = ModelOf(HfModelType::kQwen3Moe, true);
  slices = HfTensorSlices(qwen3, HfModelType::kQwen3Moe, HfExpertLayout::kPerExpert);
  EXPECT_EQ(Find(slices, "model.layers.0.self_attn.q_proj.weight")->hf_shape, (Shape{64, 32}));
  EXPECT_EQ(Find(slices, "model.layers.0.self_attn.o_proj.weight")->hf_shape, (Shape{32, 64}));
  EXPECT_EQ(Find(slices, "model.layers.0.self_attn.q_norm.weight")->hf_shape, (Shape{16}));
  EXPECT_EQ(Find(slices, "model.layers.0.self_attn.k_norm.weight")->ours,
            "layers.0.attention.k_norm.weight");
  const HfTensorSlice* dense_up = Find(slices, "model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(dense_up, nullptr);
  EXPECT_EQ(dense_up->ours, "layers.0.mlp.fc1.weight");
  EXPECT_EQ(dense_up->offset, 64 * 32);  // after the 64 gate rows
  EXPECT_EQ(Find(slices, "model.layers.1.mlp.experts.0.gate_proj.weight")->ours,
            "layers.1.moe.experts.fc1.weight");

  const GptConfig olmoe = ModelOf(HfModelType::kOlmoe, false);
  slices = HfTensorSlices(olmoe, HfModelType::kOlmoe, HfExpertLayout::kPerExpert);
  EXPECT_EQ(Find(slices, "model.layers.1.self_attn.q_norm.weight")->hf_shape, (Shape{32}));
  EXPECT_EQ(Find(slices, "model.layers.1.self_attn.k_norm.weight")->hf_shape, (Shape{16}));
}

TEST(HfTensorMapTest, TheLayoutIsFoundFromTheNames) {
  EXPECT_EQ(HfExpertLayoutOf({"model.layers.0.mlp.gate.weight",
                              "model.layers.0.mlp.experts.0.gate_proj.weight"}),
            HfExpertLayout::kPerExpert);
  EXPECT_EQ(HfExpertLayoutOf(
                {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj"}),
            HfExpertLayout::kStacked);
  EXPECT_EQ(HfExpertLayoutOf({}), HfExpertLayout::kPerExpert);
}

}  // namespace
}  // namespace moe
