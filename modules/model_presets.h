// The model presets: every model shape the project names, in one table. Each is a whole GptConfig
// (a field a preset does not set keeps GptConfig's default). Who uses which:
//   tiny                   moe_train's default model: GptConfig{} itself, which equals moe_train's
//                          flag defaults; configs/tiny.flags; tests' DefaultRunModel
//   moe_100m               configs/moe_100m.flags
//   qwen3_moe_8layer       configs/qwen3_moe_8layer.flags; optimizer_bench's default model;
//                          attention_bench's default shape; moe_bench --shapes=qwen3 (one layer)
//   qwen3_30b_a3b          configs/qwen3_30b_a3b.flags: the published model (Hugging Face config)
//   qwen3_30b_a3b_8layer   configs/qwen3_30b_a3b_8layer.flags: its first 8 layers, for one GPU
//   mixtral_8x7b           configs/mixtral_8x7b.flags: the published model
//   olmoe_1b_7b            configs/olmoe_1b_7b.flags: the published model
//   mixtral_moe_layer      moe_bench --shapes=mixtral
//   deepseek_v3_moe_layer  moe_bench --shapes=deepseek
//   tiny_moe_layer         moe_bench --shapes=tiny
// The *_moe_layer presets are one MoE layer at a published model's expert shape (hidden size,
// experts, top-k, expert ffn), what moe_bench times; moe_bench times one MoE layer of the others.
// configs/*.flags set their presets' shapes as flags: tests/apps/presets_test.cc checks that they
// agree with this table and that their header comments quote what moe_train prints for them.
#pragma once

#include <string_view>
#include <vector>

#include "modules/gpt_config.h"

namespace moe {

struct ModelPreset {
  const char* name;
  GptConfig model;
};

const std::vector<ModelPreset>& ModelPresets();

// The preset named `name` (one of ModelPresets(); another name is a bug: CHECK).
const GptConfig& ModelPresetNamed(std::string_view name);

}  // namespace moe
