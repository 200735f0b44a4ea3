// The model shape a checkpoint records (state.json "model"; field names are the moe_train flags')
// and the comparison that decides whether a checkpoint fits a model: the one home of both.
//
// A field that cannot change the model is not compared: ffn_hidden_size without dense layers, and
// the expert fields (num_experts, moe_router_topk, moe_ffn_hidden_size, moe_router_pre_softmax)
// without MoE layers. So a checkpoint written when a preset still set such a field loads into the
// same model without it. A checkpoint written before a field existed (kv_channels, the query/key
// norm, rotary_base, norm_epsilon, moe_router_pre_softmax) is read as having that build's value.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "modules/gpt_config.h"

namespace moe {

// Every shape field of `config`.
nlohmann::json ModelShapeJson(const GptConfig& config);
// Empty when `saved` (a checkpoint's "model") fits `config`; otherwise the differing fields, as
// "--num_layers (checkpoint 4, this run 2), ...", and saved fields this build does not know.
std::string ModelShapeDifferences(const nlohmann::json& saved, const GptConfig& config);

}  // namespace moe
