// The model shape a checkpoint records (state.json "model"; field names are the moe_train flags')
// and the comparison that decides whether a checkpoint fits a model: the one home of both.
//
// A field that cannot change the model is not compared: ffn_hidden_size without dense layers, and
// the expert fields (num_experts, moe_router_topk, moe_ffn_hidden_size, moe_router_pre_softmax)
// without MoE layers. So a checkpoint written when a preset still set such a field loads into the
// same model without it. A checkpoint written before a field existed (kv_channels, the query/key
// norm, rotary_base, norm_epsilon, moe_router_pre_softmax) is read as having that build's value.
// A run that starts from a checkpoint's weights alone (--finetune) compares only the fields that
// set the parameters' names and shapes: it may change seq_length, rotary_base, norm_epsilon,
// moe_router_topk and moe_router_pre_softmax.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"

#include "modules/gpt_config.h"

namespace moe {

// Every shape field of `config`.
nlohmann::json ModelShapeJson(const GptConfig& config);
// The model a checkpoint's "model" describes (its later fields missing: their old values), with
// GptConfig's defaults for what the shape does not hold; DataLoss naming a field that is
// missing or of the wrong type.
StatusOr<GptConfig> GptConfigFromModelShape(const nlohmann::json& saved);

enum class ShapeFields {
  kAll,         // the whole model: a resumed run
  kParameters,  // the parameters' names and shapes: a run from the weights alone (--finetune)
};
// Empty when `saved` (a checkpoint's "model") fits `config`; otherwise the differing fields, as
// "--num_layers (checkpoint 4, this run 2), ...", and saved fields this build does not know.
std::string ModelShapeDifferences(const nlohmann::json& saved, const GptConfig& config,
                                  ShapeFields compared = ShapeFields::kAll);

// A moe_train flagfile that gives `config`'s shape: one --name=value line per field that matters
// to it (the fields above; not ffn_hidden_size without dense layers, nor the expert fields
// without MoE layers), floats written as the shortest text that reads back as the same float.
std::string ModelShapeFlagfile(const GptConfig& config);

}  // namespace moe
