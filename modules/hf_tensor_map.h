// Which Hugging Face tensor holds which of our parameters' elements, for the three architectures
// of hf_config.h. Every Hugging Face tensor is one contiguous run of one of our parameters,
// element for element in row-major order, so a converter copies runs and never transposes.
// P = "model.layers.{i}.", L = "layers.{i}.", E experts of width F, hidden H, vocabulary V:
//
//   model.embed_tokens.weight              (V, H)      embedding.weight
//   P input_layernorm.weight               (H)         L attn_norm.weight
//   P self_attn.{q,k,v,o}_proj.weight                  L attention.{q,k,v,o}_proj.weight
//   P self_attn.{q,k}_norm.weight          (qwen3_moe: head_dim each; olmoe: q_dim, kv_dim)
//                                                      L attention.{q,k}_norm.weight
//   P post_attention_layernorm.weight      (H)         L mlp_norm.weight
//   MoE layers, per expert (what save_pretrained writes), qwen3_moe and olmoe | mixtral:
//     P mlp.gate.weight | P block_sparse_moe.gate.weight              (E, H)
//                                                      L moe.router.weight
//     P mlp.experts.{e}.gate_proj.weight | P block_sparse_moe.experts.{e}.w1.weight   (F, H)
//                                                      L moe.experts.fc1.weight[e][0:F]
//     P mlp.experts.{e}.up_proj.weight | P block_sparse_moe.experts.{e}.w3.weight     (F, H)
//                                                      L moe.experts.fc1.weight[e][F:2F]
//     P mlp.experts.{e}.down_proj.weight | P block_sparse_moe.experts.{e}.w2.weight   (H, F)
//                                                      L moe.experts.fc2.weight[e]
//   MoE layers, stacked (transformers 5's modules, all three types; it loads these too):
//     P mlp.gate.weight                    (E, H)      L moe.router.weight
//     P mlp.experts.gate_up_proj           (E, 2F, H)  L moe.experts.fc1.weight
//     P mlp.experts.down_proj              (E, H, F)   L moe.experts.fc2.weight
//   Dense layers (qwen3_moe's first ones, of width F):
//     P mlp.gate_proj.weight               (F, H)      L mlp.fc1.weight[0:F]
//     P mlp.up_proj.weight                 (F, H)      L mlp.fc1.weight[F:2F]
//     P mlp.down_proj.weight               (H, F)      L mlp.fc2.weight
//   model.norm.weight                      (H)         final_norm.weight
//   lm_head.weight                         (V, H)      lm_head.weight
//
// For a model the modules build, the runs tile each parameter GptModel::StageParameterSpecs lists
// exactly once (tests/modules/hf_tensor_map_test.cc holds the two to each other).
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "modules/gpt_config.h"
#include "modules/hf_config.h"

namespace moe {

enum class HfExpertLayout { kPerExpert, kStacked };

struct HfTensorSlice {
  std::string hf_name;
  Shape hf_shape;
  std::string ours;    // our parameter
  int64_t offset = 0;  // where the run starts in it (elements); it is NumElements(hf_shape) long
};

// In model order (embedding, layer by layer, final norm, head): the order of a checkpoint's
// index, and of the shards export writes.
std::vector<HfTensorSlice> HfTensorSlices(const GptConfig& config, HfModelType type,
                                          HfExpertLayout layout);

// The layout a checkpoint's tensor names use: stacked when one of them is a stacked
// "...experts.gate_up_proj", else per expert.
HfExpertLayout HfExpertLayoutOf(const std::vector<std::string>& hf_names);

}  // namespace moe
