// moe_train's flag defaults are GptConfig's defaults: with no flag given, the model that
// ValidateFlags builds (apps/moe_train/run_flags.h) equals a default-constructed GptConfig
// (modules/gpt_config.h), field by field.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include "apps/common/command_line.h"
#include "apps/moe_train/run_flags.h"

namespace moe {
namespace {

TEST(MoeTrainFlagsTest, TheDefaultModelIsGptConfigsDefault) {
  const gflags::FlagSaver saver;
  char program[] = "moe_train";
  char* argv[] = {program};
  const StatusOr<HelpRequest> parsed = ParseCommandLine(1, argv);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  StatusOr<RunConfig> run = ValidateFlags(/*world_size=*/1);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const GptConfig& flags = run->model;
  const GptConfig defaults;
  EXPECT_EQ(flags.num_layers, defaults.num_layers);
  EXPECT_EQ(flags.hidden_size, defaults.hidden_size);
  EXPECT_EQ(flags.num_attention_heads, defaults.num_attention_heads);
  EXPECT_EQ(flags.num_query_groups, defaults.num_query_groups);
  EXPECT_EQ(flags.ffn_hidden_size, defaults.ffn_hidden_size);
  EXPECT_EQ(flags.num_experts, defaults.num_experts);
  EXPECT_EQ(flags.moe_router_topk, defaults.moe_router_topk);
  EXPECT_EQ(flags.moe_ffn_hidden_size, defaults.moe_ffn_hidden_size);
  EXPECT_EQ(flags.moe_aux_loss_coeff, defaults.moe_aux_loss_coeff);
  EXPECT_EQ(flags.moe_z_loss_coeff, defaults.moe_z_loss_coeff);
  EXPECT_EQ(flags.moe_grouped_mlp, defaults.moe_grouped_mlp);
  EXPECT_EQ(flags.recompute, defaults.recompute);
  EXPECT_EQ(flags.recompute_num_layers, defaults.recompute_num_layers);
  EXPECT_EQ(flags.recompute_by_layer, defaults.recompute_by_layer);
  EXPECT_EQ(flags.head_chunk_rows, defaults.head_chunk_rows);
  EXPECT_EQ(flags.moe_wgrad_micro_batches, defaults.moe_wgrad_micro_batches);
  EXPECT_EQ(flags.first_dense_layers, defaults.first_dense_layers);
  EXPECT_EQ(flags.seq_length, defaults.seq_length);
  EXPECT_EQ(flags.vocab_size, defaults.vocab_size);
  EXPECT_EQ(flags.rotary_base, defaults.rotary_base);
  EXPECT_EQ(flags.norm_epsilon, defaults.norm_epsilon);
  EXPECT_EQ(flags.init_std, defaults.init_std);
  // And any field added to GptConfig later.
  EXPECT_TRUE(flags == defaults) << "a GptConfig field not compared above differs";
}

}  // namespace
}  // namespace moe
