// The offload groups the model's modules open in a SavedTensors context (see DESIGN.md,
// "Fine-grained activation offloading"), for configuring the OffloadManager, which knows none of
// them. A group holds exactly what its module saved while it was open:
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

namespace moe {

// Every group name, in forward order within a layer.
const std::vector<std::string>& OffloadGroupNames();
// Groups whose shapes depend on routing: their pinned buffers bypass the pool.
const std::set<std::string>& RoutedOffloadGroups();

}  // namespace moe
