// moe_train's activation-memory flags (offload and recompute): every validation rule is one clear
// line naming the flag(s); good values become the manager's options (routed groups bypass the
// pinned pool) and the model's recompute set.
#include "apps/moe_train/offload_flags.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moe {
namespace {

GptConfig Model(GroupedMlpKind kind) {
  GptConfig c;
  c.num_layers = 4;
  c.moe_grouped_mlp = kind;
  return c;
}

OffloadFlagValues Modules(const std::string& modules) {
  OffloadFlagValues v;
  v.modules = modules;
  return v;
}

struct BadFlags {
  OffloadFlagValues values;
  GroupedMlpKind kind;
  std::string message;  // must appear in the error
};

void PrintTo(const BadFlags& bad, std::ostream* os) {
  *os << "--offload_modules=" << bad.values.modules
      << (bad.kind == GroupedMlpKind::kFused ? " (fused)" : " (unfused)");
}

class OffloadFlagsErrorTest : public ::testing::TestWithParam<BadFlags> {};

TEST_P(OffloadFlagsErrorTest, IsOneLineNamingTheFlag) {
  const auto result = MakeOffloadOptions(GetParam().values, Model(GetParam().kind));
  ASSERT_FALSE(result.ok());
  const std::string& message = result.status().message();
  EXPECT_NE(message.find(GetParam().message), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.rfind("--offload_", 0), 0u) << "must start with the flag: " << message;
}

OffloadFlagValues With(void (*set)(OffloadFlagValues&)) {
  OffloadFlagValues v = Modules("core_attn");
  set(v);
  return v;
}

const auto kUnfused = GroupedMlpKind::kUnfused;
const auto kFused = GroupedMlpKind::kFused;

INSTANTIATE_TEST_SUITE_P(
    Rules, OffloadFlagsErrorTest,
    ::testing::Values(
        BadFlags{Modules("core_attn,mlp"), kUnfused,
                 "unknown module \"mlp\"; choose from attn_norm, "
                 "qkv_linear, core_attn, attn_proj, mlp_norm, "
                 "expert_fc1, moe_act, fused_group_mlp"},
        BadFlags{Modules("Core_Attn"), kUnfused, "unknown module \"Core_Attn\""},
        BadFlags{Modules("core_attn,,mlp_norm"), kUnfused, "has an empty entry"},
        BadFlags{Modules("core_attn,"), kUnfused, "has an empty entry"},
        BadFlags{Modules("core_attn,core_attn"), kUnfused, "lists core_attn twice"},
        BadFlags{Modules("attn_proj"), kUnfused, "attn_proj needs core_attn"},
        BadFlags{Modules("attn_proj,mlp_norm"), kFused, "attn_proj needs core_attn"},
        BadFlags{Modules("fused_group_mlp"), kUnfused,
                 "--offload_modules=fused_group_mlp needs --moe_grouped_mlp=fused"},
        BadFlags{Modules("fused_group_mlp,expert_fc1"), kFused,
                 "fused_group_mlp cannot be combined with expert_fc1"},
        BadFlags{Modules("moe_act,fused_group_mlp"), kFused,
                 "fused_group_mlp cannot be combined with moe_act"},
        BadFlags{Modules("fused_group_mlp,moe_act"), kUnfused,
                 "fused_group_mlp cannot be combined with moe_act"},
        BadFlags{Modules("expert_fc1"), kFused,
                 "--offload_modules=expert_fc1 does not exist with --moe_grouped_mlp=fused: "
                 "offload fused_group_mlp instead, or use --moe_grouped_mlp=unfused"},
        BadFlags{Modules("core_attn,moe_act"), kFused,
                 "--offload_modules=moe_act does not exist with --moe_grouped_mlp=fused"},
        BadFlags{With([](OffloadFlagValues& v) { v.min_tensor_bytes = -1; }), kUnfused,
                 "--offload_min_tensor_bytes=-1 must not be negative"},
        BadFlags{With([](OffloadFlagValues& v) { v.fraction = 1.5; }), kUnfused,
                 "--offload_fraction=1.5 must be in [0, 1]"},
        BadFlags{With([](OffloadFlagValues& v) { v.fraction = -0.1; }), kUnfused,
                 "--offload_fraction=-0.1 must be in [0, 1]"},
        BadFlags{With([](OffloadFlagValues& v) { v.fraction = std::nan(""); }), kUnfused,
                 "--offload_fraction=nan must be in [0, 1]"},
        BadFlags{With([](OffloadFlagValues& v) { v.pp_delta_bytes = -5; }), kUnfused,
                 "--offload_pp_delta_bytes=-5 must not be negative"},
        BadFlags{With([](OffloadFlagValues& v) { v.prefetch_layers = -1; }), kUnfused,
                 "--offload_prefetch_layers=-1 must be in [0, --num_layers=4]"},
        BadFlags{With([](OffloadFlagValues& v) { v.prefetch_layers = 5; }), kUnfused,
                 "--offload_prefetch_layers=5 must be in [0, --num_layers=4]"},
        // Knobs are checked even when nothing is offloaded.
        BadFlags{[] {
                   OffloadFlagValues v;
                   v.fraction = 2;
                   return v;
                 }(),
                 kUnfused, "--offload_fraction=2 must be in [0, 1]"}));

TEST(OffloadFlagsTest, NoModulesMeansNoOffloading) {
  const auto result = MakeOffloadOptions(OffloadFlagValues{}, Model(kUnfused));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_FALSE(result.value().has_value());
}

TEST(OffloadFlagsTest, GoodFlagsBecomeOptions) {
  OffloadFlagValues v = Modules("moe_act,core_attn,attn_proj,expert_fc1,attn_norm");
  v.min_tensor_bytes = 0;
  v.fraction = 0.25;
  v.pp_delta_bytes = 1 << 20;
  v.prefetch_layers = 2;
  const auto result = MakeOffloadOptions(v, Model(kUnfused));
  ASSERT_TRUE(result.ok()) << result.status().message();
  const OffloadOptions& o = *result.value();
  EXPECT_EQ(o.groups, (std::set<std::string>{"attn_norm", "attn_proj", "core_attn", "expert_fc1",
                                             "moe_act"}));
  EXPECT_EQ(o.unpooled_groups, (std::set<std::string>{"expert_fc1", "moe_act"}));
  EXPECT_EQ(o.min_tensor_bytes, 0);
  EXPECT_EQ(o.fraction, 0.25);
  EXPECT_EQ(o.pp_delta_bytes, 1 << 20);
  EXPECT_EQ(o.prefetch_layers, 2);
}

TEST(OffloadFlagsTest, FusedGroupedMlpOffloadsItsOneGroupUnpooled) {
  const auto result = MakeOffloadOptions(Modules("fused_group_mlp,mlp_norm"), Model(kFused));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result.value()->groups, (std::set<std::string>{"fused_group_mlp", "mlp_norm"}));
  EXPECT_EQ(result.value()->unpooled_groups, (std::set<std::string>{"fused_group_mlp"}));
}

TEST(OffloadFlagsTest, EveryModuleAloneIsValidForItsGroupedMlp) {
  for (const char* name :
       {"attn_norm", "qkv_linear", "core_attn", "mlp_norm", "expert_fc1", "moe_act"}) {
    EXPECT_TRUE(MakeOffloadOptions(Modules(name), Model(kUnfused)).ok()) << name;
  }
  for (const char* name : {"attn_norm", "qkv_linear", "core_attn", "mlp_norm", "fused_group_mlp"}) {
    EXPECT_TRUE(MakeOffloadOptions(Modules(name), Model(kFused)).ok()) << name;
  }
}

TEST(OffloadFlagsTest, DefaultsAreInRange) {
  const auto result = MakeOffloadOptions(Modules("core_attn"), Model(kUnfused));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value()->prefetch_layers, 1);
  EXPECT_EQ(result.value()->fraction, 1.0);
  EXPECT_EQ(result.value()->min_tensor_bytes, 1 << 20);
}

// --recompute_modules, alone and against --offload_modules (fused grouped MLP).
struct BadRecompute {
  std::string recompute;
  std::string offload;
  std::string message;  // must appear in the error
};

void PrintTo(const BadRecompute& bad, std::ostream* os) {
  *os << "--recompute_modules=" << bad.recompute << " --offload_modules=" << bad.offload;
}

class RecomputeFlagsErrorTest : public ::testing::TestWithParam<BadRecompute> {};

TEST_P(RecomputeFlagsErrorTest, IsOneLineNamingTheFlags) {
  const BadRecompute& bad = GetParam();
  const GptConfig model = Model(kFused);
  const auto offload = MakeOffloadOptions(Modules(bad.offload), model);
  ASSERT_TRUE(offload.ok()) << offload.status().message();
  const auto result = MakeRecompute(bad.recompute, offload.value());
  ASSERT_FALSE(result.ok());
  const std::string& message = result.status().message();
  EXPECT_NE(message.find(bad.message), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.rfind("--recompute_modules", 0), 0u) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Rules, RecomputeFlagsErrorTest,
    ::testing::Values(
        BadRecompute{"mlp", "",
                     "--recompute_modules: unknown module \"mlp\"; choose from "
                     "layernorm, moe_act, moe, core_attn"},
        BadRecompute{"moe,", "", "--recompute_modules=moe, has an empty entry"},
        BadRecompute{"moe,,core_attn", "", "has an empty entry"},
        BadRecompute{"core_attn,core_attn", "", "--recompute_modules lists core_attn twice"},
        BadRecompute{"moe,moe_act", "", "moe already recomputes moe_act"},
        BadRecompute{"layernorm", "attn_norm",
                     "--recompute_modules=layernorm cannot be combined with "
                     "--offload_modules=attn_norm"},
        BadRecompute{"layernorm", "mlp_norm", "--offload_modules=mlp_norm"},
        BadRecompute{"layernorm", "qkv_linear", "--offload_modules=qkv_linear"},
        BadRecompute{"core_attn", "core_attn",
                     "--recompute_modules=core_attn cannot be combined with "
                     "--offload_modules=core_attn (a module is either recomputed or offloaded)"},
        BadRecompute{"core_attn", "core_attn,attn_proj", "--offload_modules=core_attn"},
        BadRecompute{"moe", "fused_group_mlp",
                     "--recompute_modules=moe cannot be combined with "
                     "--offload_modules=fused_group_mlp"}));

TEST(RecomputeFlagsTest, UnfusedMoeActConflictsWithItsOffloadGroup) {
  const auto offload = MakeOffloadOptions(Modules("expert_fc1,moe_act"), Model(kUnfused));
  ASSERT_TRUE(offload.ok());
  EXPECT_FALSE(MakeRecompute("moe_act", offload.value()).ok());
  EXPECT_FALSE(MakeRecompute("moe", offload.value()).ok());
}

TEST(RecomputeFlagsTest, GoodListsBecomeTheModelsRecomputeSet) {
  const auto none = MakeRecompute("", std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().any());
  const auto offload =
      MakeOffloadOptions(Modules("attn_norm,mlp_norm,fused_group_mlp"), Model(kFused));
  ASSERT_TRUE(offload.ok());
  const auto r = MakeRecompute("core_attn,moe_act", offload.value());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.value().core_attn);
  EXPECT_TRUE(r.value().moe_act);
  EXPECT_FALSE(r.value().layernorm);
  EXPECT_FALSE(r.value().moe);
  const auto all = MakeRecompute("layernorm,moe,core_attn", std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_TRUE(all.value().layernorm && all.value().moe && all.value().core_attn);
}

TEST(RecomputeFlagsTest, NumLayersIsEveryLayerOrALayerCountOfTheModel) {
  const GptConfig model = Model(kFused);  // 4 layers
  for (int64_t good : {-1, 1, 4}) EXPECT_EQ(RecomputeNumLayers(good, model).value(), good);
  for (int64_t bad : {-2, 0, 5}) {
    const auto result = RecomputeNumLayers(bad, model);
    ASSERT_FALSE(result.ok()) << bad;
    EXPECT_EQ(result.status().message(), "--recompute_num_layers=" + std::to_string(bad) +
                                             " must be -1 (every layer) or in [1, --num_layers=4]");
  }
}

}  // namespace
}  // namespace moe
