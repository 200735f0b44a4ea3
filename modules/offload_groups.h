// The names of the two activation-memory policies and the rules for combining them: the offload
// groups the model's modules open in a SavedTensors context (see DESIGN.md, "Fine-grained
// activation offloading") and the selective-recompute modules (GptConfig::recompute). The one
// home of these names. The OffloadManager knows none of them; the modules open groups by these
// constants, the flag parsing and the trainer configure the manager with them. A group holds
// exactly what its module saved while it was open:
//   attn_norm        layers.N.attn_norm.{x, rstd}             commits after the residual add
//   qkv_linear       layers.N.attention.x                     (the QKV projections' input)
//   core_attn        layers.N.attention.{q, k, v, lse}
//   attn_proj        layers.N.attention.out                   (core attention's output)
//   mlp_norm         layers.N.mlp_norm.{x, rstd}              commits after the residual add
//   expert_fc1       layers.N.moe.experts.x                   unfused grouped MLP, MoE layers
//   moe_act          layers.N.moe.experts.{h, weights}        unfused; commits after fc2
//   fused_group_mlp  the fused grouped MLP's saves             fused grouped MLP, MoE layers
#pragma once

#include <set>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "modules/gpt_config.h"

namespace moe {

inline constexpr char kAttnNormGroup[] = "attn_norm";
inline constexpr char kQkvLinearGroup[] = "qkv_linear";
inline constexpr char kCoreAttnGroup[] = "core_attn";
inline constexpr char kAttnProjGroup[] = "attn_proj";
inline constexpr char kMlpNormGroup[] = "mlp_norm";
inline constexpr char kExpertFc1Group[] = "expert_fc1";
inline constexpr char kMoeActGroup[] = "moe_act";
inline constexpr char kFusedGroupMlpGroup[] = "fused_group_mlp";

// Every group name, in forward order within a layer.
const std::vector<std::string>& OffloadGroupNames();
// Groups whose shapes depend on routing: their pinned buffers bypass the pool.
const std::set<std::string>& RoutedOffloadGroups();
// Every group that exists with the grouped MLP `mlp` ("auto" for the memory planner).
std::set<std::string> EligibleOffloadGroups(GroupedMlpKind mlp);

// The combination rules for a set of known group names, with the grouped MLP `mlp`: attn_proj
// needs core_attn (core attention's backward reads the output it moves); fused_group_mlp needs
// the fused grouped MLP and excludes expert_fc1 and moe_act (it holds their tensors);
// expert_fc1 and moe_act need the unfused one. The first problem is one line that starts with
// `flag` (e.g. "--offload_modules").
Status CheckOffloadGroups(const std::set<std::string>& groups, GroupedMlpKind mlp,
                          const std::string& flag);

// Recompute modules (Megatron-LM's names), see RecomputeModules in gpt_config.h.
inline constexpr char kLayerNormRecompute[] = "layernorm";
inline constexpr char kMoeActRecompute[] = "moe_act";
inline constexpr char kMoeRecompute[] = "moe";
inline constexpr char kCoreAttnRecompute[] = "core_attn";

const std::vector<std::string>& RecomputeModuleNames();
// The RecomputeModules field a module name sets (a bug for a name not in RecomputeModuleNames).
bool RecomputeModules::*RecomputeMember(const std::string& name);
// `names` (known recompute modules) as flags; a problem starts with `flag`: moe together with
// moe_act (moe already recomputes the activation).
StatusOr<RecomputeModules> MakeRecomputeModules(const std::set<std::string>& names,
                                                const std::string& flag);
// A module both recomputed and offloaded, or an offload group that recompute empties, is an
// error naming both flags' entries: layernorm with attn_norm, mlp_norm or qkv_linear (the norms'
// inputs are read to recompute, qkv_linear holds the output it drops); core_attn with core_attn
// or attn_proj; moe with fused_group_mlp, expert_fc1 or moe_act; moe_act with moe_act.
Status CheckRecomputeWithOffload(const RecomputeModules& recompute,
                                 const std::set<std::string>& offload_groups);

// A comma list of names from `known` (e.g. a flag's value), each at most once, no empty entry;
// problems start with "--<flag>".
StatusOr<std::set<std::string>> ParseNameList(const std::string& list,
                                              const std::vector<std::string>& known,
                                              const std::string& flag);

}  // namespace moe
