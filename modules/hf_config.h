// Hugging Face config.json <-> GptConfig, for the three MoE architectures the trainer's model
// expresses exactly: Qwen3MoeForCausalLM (qwen3_moe: query/key RMSNorm per head, dense layers
// first), MixtralForCausalLM (mixtral: no query/key norm, renormalised top-k) and
// OlmoeForCausalLM (olmoe: one query norm over the whole query projection and one over the keys,
// top-k renormalised or not).
//
// Read (transformers 4 and 5 spellings): the rotary base from rope_parameters.rope_theta (5) or
// rope_theta (4; both present must agree; neither: transformers' default, 1e6 for Mixtral, else
// 10000); the expert count from num_experts or num_local_experts (both present must agree); the
// expert width from moe_intermediate_size (qwen3_moe) or intermediate_size; the head dimension
// from head_dim, else hidden_size / num_attention_heads; num_key_value_heads (absent: the heads);
// norm_topk_prob (false: --moe_router_pre_softmax; Mixtral always renormalises); the dense layers
// of qwen3_moe from mlp_only_layers and decoder_sparse_step (with dense width intermediate_size).
// Refused, each in one line naming the field and its value: an unknown model_type or
// architecture, tied embeddings, attention biases, a sliding window, RoPE scaling (a rope_type
// other than "default", or any further RoPE parameter), clip_qkv, attention dropout or router
// jitter, an activation other than silu, dense layers that are not the first ones, an OLMoE head
// dimension whose query projection is not hidden_size wide (its q_norm spans hidden_size), a
// missing or mistyped field. Ignored, as they change nothing the trainer computes: token ids
// (pad_token_id only zeroes one embedding row's gradient in transformers), use_cache,
// initializer_range, output_router_logits, router_aux_loss_coef (a training choice:
// --moe_aux_loss_coeff), torch_dtype / dtype, max_position_embeddings (returned: the caller
// picks seq_length), and fields unknown here.
//
// Written: model_type, architectures, dtype and torch_dtype (5's and 4's name), the rotary base
// in both spellings, max_position_embeddings = seq_length, initializer_range = init_std, and
// every field above; norm epsilon and rotary base as the shortest decimal of their float.
// Refused, in one line naming the option: a GptConfig the chosen type cannot express (Mixtral
// with a query/key norm, top-k probabilities not renormalised or dense layers; OLMoE without its
// across-heads norm, with dense layers or a query projection other than hidden_size wide;
// Qwen3-MoE without its per-head norm).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "modules/gpt_config.h"

namespace moe {

enum class HfModelType { kQwen3Moe, kMixtral, kOlmoe };

const char* HfModelTypeName(HfModelType type);  // "qwen3_moe", "mixtral", "olmoe"
std::optional<HfModelType> HfModelTypeNamed(const std::string& name);
const char* HfArchitecture(HfModelType type);  // "Qwen3MoeForCausalLM", ...
inline constexpr const char* kHfModelTypeNames = "qwen3_moe, mixtral or olmoe";

struct HfModel {
  HfModelType type;
  GptConfig config;  // seq_length left at its default: the caller's choice
  int64_t max_position_embeddings = 0;
};
// The model of a config.json. It may still be one this build cannot train (CheckModel).
StatusOr<HfModel> HfModelFromConfig(const nlohmann::json& config);

// The type a GptConfig exports as when none is asked for, from its query/key norm (the one
// option that tells the three apart): across heads olmoe, per head qwen3_moe, none mixtral.
HfModelType DefaultHfModelType(const GptConfig& config);

// config.json of `config` as `type`, for weights stored as `dtype_name` ("bfloat16", "float32").
StatusOr<nlohmann::json> HfConfigFor(const GptConfig& config, HfModelType type,
                                     const std::string& dtype_name);

}  // namespace moe
