// GptModel::StageParameterSpecs lists, without allocating, exactly the parameters (names, shapes,
// weight decay, in creation order) that building the stage creates: for one stage holding the
// whole model, and for the first, a middle and the last of four.
#include <gtest/gtest.h>

#include "modules/gpt_model.h"
#include "tests/testing/tiny_model.h"

namespace moe {
namespace {

TEST(StageParameterSpecsTest, AreWhatBuildingTheStageCreates) {
  GptConfig config = testing::TinyModel();
  config.num_layers = 4;
  for (const GptStage& stage : {GptStage{0, 4, true, true}, GptStage{0, 1, true, false},
                                GptStage{1, 3, false, false}, GptStage{3, 4, false, true}}) {
    ParameterSet built(Device::CPU(), DType::kF32, 7, /*optimizer_state=*/false);
    const GptModel model(config, built, stage);
    const std::vector<ParameterSpec> specs = GptModel::StageParameterSpecs(config, stage);
    ASSERT_EQ(specs.size(), built.all().size()) << stage.layer_begin << ".." << stage.layer_end;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Parameter& p = *built.all()[i];
      EXPECT_EQ(specs[i].name, p.name);
      EXPECT_EQ(specs[i].shape, p.master.shape()) << p.name;
      EXPECT_EQ(specs[i].weight_decay, p.weight_decay) << p.name;
    }
  }
}

}  // namespace
}  // namespace moe
