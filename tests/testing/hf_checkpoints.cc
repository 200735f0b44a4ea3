#include "tests/testing/hf_checkpoints.h"

#include <filesystem>
#include <fstream>
#include <random>

#include <glog/logging.h>

#include "engine/io/safetensors.h"
#include "tests/testing/tensor_testing.h"

namespace moe::testing {
namespace {

constexpr int64_t kHidden = 32, kHeads = 4, kKvHeads = 2, kExperts = 4, kFfn = 24, kDenseFfn = 40;
constexpr int64_t kVocab = 50, kLayers = 2;

class Builder {
 public:
  explicit Builder(uint32_t seed) : rng_(seed) {}
  void Add(const std::string& name, const Shape& shape) {
    files_.tensors.push_back(
        {name, RandomTensor(shape, DType::kF32, Device::CPU(), rng_,
                            name.find("norm") != std::string::npos ? 1.0f : 0.1f)});
  }
  // Embedding, attention and norms of every layer, calling `mlp(prefix, layer)` between.
  template <typename Mlp>
  void Model(int64_t head_dim, bool qk_norm, Mlp mlp) {
    Add("model.embed_tokens.weight", {kVocab, kHidden});
    for (int64_t i = 0; i < kLayers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      Add(p + "input_layernorm.weight", {kHidden});
      Add(p + "self_attn.q_proj.weight", {kHeads * head_dim, kHidden});
      Add(p + "self_attn.k_proj.weight", {kKvHeads * head_dim, kHidden});
      Add(p + "self_attn.v_proj.weight", {kKvHeads * head_dim, kHidden});
      Add(p + "self_attn.o_proj.weight", {kHidden, kHeads * head_dim});
      if (qk_norm) {
        Add(p + "self_attn.q_norm.weight", {head_dim});
        Add(p + "self_attn.k_norm.weight", {head_dim});
      }
      Add(p + "post_attention_layernorm.weight", {kHidden});
      mlp(p, i);
    }
    Add("model.norm.weight", {kHidden});
    Add("lm_head.weight", {kVocab, kHidden});
  }
  HfModelFiles files_;

 private:
  std::mt19937 rng_;
};

nlohmann::json CommonConfig() {
  return {{"vocab_size", kVocab},
          {"hidden_size", kHidden},
          {"num_hidden_layers", kLayers},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"num_experts_per_tok", 2},
          {"tie_word_embeddings", false},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}};
}

}  // namespace

HfModelFiles TinyMixtral(bool stacked, uint32_t seed) {
  Builder b(seed);
  b.files_.config = CommonConfig();
  b.files_.config.update({{"architectures", {"MixtralForCausalLM"}},
                          {"model_type", "mixtral"},
                          {"num_local_experts", kExperts},
                          {"intermediate_size", kFfn},
                          {"sliding_window", nullptr}});
  b.Model(kHidden / kHeads, false, [&](const std::string& p, int64_t) {
    if (stacked) {
      b.Add(p + "mlp.gate.weight", {kExperts, kHidden});
      b.Add(p + "mlp.experts.gate_up_proj", {kExperts, 2 * kFfn, kHidden});
      b.Add(p + "mlp.experts.down_proj", {kExperts, kHidden, kFfn});
      return;
    }
    b.Add(p + "block_sparse_moe.gate.weight", {kExperts, kHidden});
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      b.Add(x + "w1.weight", {kFfn, kHidden});
      b.Add(x + "w2.weight", {kHidden, kFfn});
      b.Add(x + "w3.weight", {kFfn, kHidden});
    }
  });
  return b.files_;
}

HfModelFiles TinyQwen3Moe(int dense_layers, uint32_t seed) {
  constexpr int64_t kHeadDim = 16;
  Builder b(seed);
  b.files_.config = CommonConfig();
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < dense_layers; ++i) dense.push_back(i);
  b.files_.config.update({{"architectures", {"Qwen3MoeForCausalLM"}},
                          {"model_type", "qwen3_moe"},
                          {"head_dim", kHeadDim},
                          {"num_experts", kExperts},
                          {"moe_intermediate_size", kFfn},
                          {"intermediate_size", kDenseFfn},
                          {"mlp_only_layers", dense},
                          {"norm_topk_prob", true},
                          {"attention_bias", false},
                          {"use_sliding_window", false}});
  b.Model(kHeadDim, true, [&](const std::string& p, int64_t layer) {
    if (layer < dense_layers) {
      b.Add(p + "mlp.gate_proj.weight", {kDenseFfn, kHidden});
      b.Add(p + "mlp.up_proj.weight", {kDenseFfn, kHidden});
      b.Add(p + "mlp.down_proj.weight", {kHidden, kDenseFfn});
      return;
    }
    b.Add(p + "mlp.gate.weight", {kExperts, kHidden});
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      b.Add(x + "gate_proj.weight", {kFfn, kHidden});
      b.Add(x + "up_proj.weight", {kFfn, kHidden});
      b.Add(x + "down_proj.weight", {kHidden, kFfn});
    }
  });
  return b.files_;
}

void WriteHfDirectory(const std::string& dir, const HfModelFiles& files, int shards, DType dtype) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << files.config.dump(2) << "\n";
  std::vector<NamedTensor> stored;
  for (const NamedTensor& t : files.tensors) {
    stored.push_back(
        {t.name, FromFloats(ToFloats(t.tensor), t.tensor.shape(), dtype, Device::CPU())});
  }
  const SafetensorsMetadata metadata = {{"format", "pt"}};
  if (shards == 1) {
    CHECK(WriteSafetensors(dir + "/model.safetensors", stored, metadata).ok());
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  const size_t per_shard = (stored.size() + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<NamedTensor> part;
    for (size_t i = s * per_shard; i < std::min(stored.size(), (s + 1) * per_shard); ++i) {
      part.push_back(stored[i]);
      weight_map[stored[i].name] = name;
    }
    CHECK(WriteSafetensors(dir + "/" + name, part, metadata).ok());
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json({{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}).dump(2);
}

std::map<std::string, std::vector<float>> ReadAllTensors(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    StatusOr<SafetensorsContents> contents = ReadSafetensors(entry.path().string());
    CHECK(contents.ok()) << contents.status().ToString();
    for (const auto& [name, t] : contents->tensors) {
      Tensor tensor = Tensor::Empty(t.shape, t.dtype, Device::CPU());
      std::memcpy(tensor.data(), t.bytes.data(), t.bytes.size());
      out[name] = ToFloats(tensor);
    }
  }
  return out;
}

}  // namespace moe::testing
