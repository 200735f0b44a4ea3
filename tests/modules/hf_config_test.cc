// Hugging Face config.json <-> GptConfig: each architecture read as transformers 5 and 4 write it,
// written back and read again to the same model; every refusal one line naming the field (import)
// or the option (export).
#include "modules/hf_config.h"

#include <gtest/gtest.h>

#include "modules/model_shape.h"

namespace moe {
namespace {

// What transformers 5 writes for a tiny Qwen3-MoE (tests/hf/make_fixtures.py's shape).
nlohmann::json Qwen3Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "float32",
    "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 128, "initializer_range": 0.1, "rms_norm_eps": 1e-06,
    "use_cache": false, "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
    "attention_dropout": 0.0, "decoder_sparse_step": 1, "moe_intermediate_size": 32,
    "intermediate_size": 96, "num_experts_per_tok": 2, "num_local_experts": 4,
    "norm_topk_prob": true, "output_router_logits": false, "router_aux_loss_coef": 0.0,
    "mlp_only_layers": [], "pad_token_id": null, "bos_token_id": null, "eos_token_id": null})");
}

// Mixtral as transformers 4 wrote it: the rotary base at the top, no head_dim.
nlohmann::json MixtralConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
    "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
    "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48,
    "router_jitter_noise": 0.0, "tie_word_embeddings": false, "bos_token_id": 1,
    "eos_token_id": 2})");
}

nlohmann::json OlmoeConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": 128,
    "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "hidden_act": "silu", "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null, "num_experts": 4,
    "num_experts_per_tok": 2, "intermediate_size": 32, "norm_topk_prob": false,
    "clip_qkv": null, "attention_bias": false, "pad_token_id": 1, "eos_token_id": 50279})");
}

HfModel Read(const nlohmann::json& config) {
  StatusOr<HfModel> model = HfModelFromConfig(config);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? *model : HfModel{HfModelType::kMixtral, GptConfig(), 0};
}

TEST(HfConfigTest, ReadsQwen3Moe) {
  const HfModel m = Read(Qwen3Config());
  EXPECT_EQ(m.type, HfModelType::kQwen3Moe);
  EXPECT_EQ(m.max_position_embeddings, 128);
  const GptConfig& c = m.config;
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_query_groups, 1);
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_FALSE(c.qk_layernorm_across_heads);
  EXPECT_EQ(c.rotary_base, 1e6f);
  EXPECT_EQ(c.norm_epsilon, 1e-6f);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_hidden_size, 32);
  EXPECT_FALSE(c.moe_router_pre_softmax);
  EXPECT_EQ(c.first_dense_layers, 0);
  EXPECT_EQ(c.vocab_size, 128);
}

TEST(HfConfigTest, ReadsQwen3DenseLayersWhenTheyComeFirst) {
  nlohmann::json j = Qwen3Config();
  j["num_hidden_layers"] = 4;
  j["mlp_only_layers"] = {1, 0};
  j["norm_topk_prob"] = false;
  HfModel m = Read(j);
  EXPECT_EQ(m.config.first_dense_layers, 2);
  EXPECT_EQ(m.config.ffn_hidden_size, 96);
  EXPECT_TRUE(m.config.moe_router_pre_softmax);
  j["mlp_only_layers"] = nlohmann::json::array();
  j["decoder_sparse_step"] = 4;  // layers 0-2 dense, 3 MoE
  EXPECT_EQ(Read(j).config.first_dense_layers, 3);
}

TEST(HfConfigTest, ReadsMixtralAsTransformers4WroteIt) {
  const HfModel m = Read(MixtralConfig());
  EXPECT_EQ(m.type, HfModelType::kMixtral);
  const GptConfig& c = m.config;
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_FALSE(c.qk_layernorm);
  EXPECT_EQ(c.rotary_base, 1e6f);
  EXPECT_EQ(c.norm_epsilon, 1e-5f);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_ffn_hidden_size, 48);
  EXPECT_FALSE(c.moe_router_pre_softmax);  // Mixtral always renormalises
  EXPECT_EQ(c.first_dense_layers, 0);
  nlohmann::json no_base = MixtralConfig();
  no_base.erase("rope_theta");
  EXPECT_EQ(Read(no_base).config.rotary_base, 1e6f);  // MixtralConfig's default
}

TEST(HfConfigTest, ReadsOlmoe) {
  const HfModel m = Read(OlmoeConfig());
  EXPECT_EQ(m.type, HfModelType::kOlmoe);
  const GptConfig& c = m.config;
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_TRUE(c.qk_layernorm_across_heads);
  EXPECT_TRUE(c.moe_router_pre_softmax);
  EXPECT_EQ(c.rotary_base, 10000.0f);
  EXPECT_EQ(c.moe_ffn_hidden_size, 32);
}

// Written and read back: the same model, for each type; the fields both transformers versions
// read are there.
TEST(HfConfigTest, WrittenConfigsReadBackAsTheSameModel) {
  for (const nlohmann::json& source : {Qwen3Config(), MixtralConfig(), OlmoeConfig()}) {
    HfModel m = Read(source);
    m.config.seq_length = m.max_position_embeddings;
    SCOPED_TRACE(HfModelTypeName(m.type));
    EXPECT_EQ(DefaultHfModelType(m.config), m.type);
    StatusOr<nlohmann::json> written = HfConfigFor(m.config, m.type, "bfloat16");
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    EXPECT_EQ((*written)["model_type"], HfModelTypeName(m.type));
    EXPECT_EQ((*written)["architectures"], nlohmann::json::array({HfArchitecture(m.type)}));
    EXPECT_EQ((*written)["dtype"], "bfloat16");
    EXPECT_EQ((*written)["torch_dtype"], "bfloat16");
    EXPECT_EQ((*written)["rope_theta"], (*written)["rope_parameters"]["rope_theta"]);
    EXPECT_EQ((*written)["rms_norm_eps"].get<double>(), source["rms_norm_eps"].get<double>());
    HfModel back = Read(*written);
    back.config.seq_length = back.max_position_embeddings;
    EXPECT_EQ(back.type, m.type);
    EXPECT_EQ(ModelShapeJson(back.config), ModelShapeJson(m.config));
  }
  GptConfig dense = Read(Qwen3Config()).config;
  dense.num_layers = 3;
  dense.first_dense_layers = 1;
  dense.ffn_hidden_size = 80;
  StatusOr<nlohmann::json> written = HfConfigFor(dense, HfModelType::kQwen3Moe, "float32");
  ASSERT_TRUE(written.ok());
  EXPECT_EQ((*written)["mlp_only_layers"], nlohmann::json::array({0}));
  EXPECT_EQ((*written)["intermediate_size"], 80);
  const HfModel back = Read(*written);
  EXPECT_EQ(back.config.first_dense_layers, 1);
  EXPECT_EQ(back.config.ffn_hidden_size, 80);
}

struct Refusal {
  const char* what;
  nlohmann::json (*config)();
  const char* key;
  nlohmann::json value;  // null: remove the key
  const char* message;
};

TEST(HfConfigTest, RefusesWhatTheModelCannotRepresentInOneLineNamingTheField) {
  const std::vector<Refusal> refusals = {
      {"model type", Qwen3Config, "model_type", "llama",
       "config.json: \"model_type\" \"llama\" is not supported (hf_convert reads qwen3_moe, "
       "mixtral or olmoe)"},
      {"architecture",
       Qwen3Config,
       "architectures",
       {"Qwen3MoeModel"},
       "\"architectures\" [\"Qwen3MoeModel\"] is not supported"},
      {"tied", MixtralConfig, "tie_word_embeddings", true,
       "config.json: \"tie_word_embeddings\" true is not supported"},
      {"bias", OlmoeConfig, "attention_bias", true, "\"attention_bias\" true is not supported"},
      {"activation", Qwen3Config, "hidden_act", "gelu", "\"hidden_act\" \"gelu\" is not supported"},
      {"dropout", Qwen3Config, "attention_dropout", 0.1, "\"attention_dropout\" 0.1"},
      {"jitter", MixtralConfig, "router_jitter_noise", 0.01, "\"router_jitter_noise\" 0.01"},
      {"clip", OlmoeConfig, "clip_qkv", 8.0, "\"clip_qkv\" 8.0 is not supported"},
      {"qwen window", Qwen3Config, "use_sliding_window", true, "\"use_sliding_window\" true"},
      {"mixtral window", MixtralConfig, "sliding_window", 4096, "\"sliding_window\" 4096"},
      {"rope scaling",
       MixtralConfig,
       "rope_scaling",
       {{"type", "linear"}, {"factor", 2.0}},
       "\"rope_scaling\" {\"factor\": 2.0} is not supported: RoPE scaling"},
      {"rope type",
       Qwen3Config,
       "rope_parameters",
       {{"rope_type", "yarn"}, {"rope_theta", 1e6}},
       "\"rope_parameters\" {\"rope_type\": \"yarn\"} is not supported"},
      {"two bases",
       MixtralConfig,
       "rope_parameters",
       {{"rope_theta", 10000.0}},
       "\"rope_theta\" 1000000.0 and rope_parameters' rope_theta 10000.0 disagree"},
      {"experts disagree", Qwen3Config, "num_experts", 8,
       "\"num_experts\" 8 and \"num_local_experts\" 4 disagree"},
      {"dense not first",
       Qwen3Config,
       "mlp_only_layers",
       {1},
       "config.json: dense layers 1 (\"mlp_only_layers\" [1], \"decoder_sparse_step\" 1) are "
       "not supported"},
      {"olmoe head dim", OlmoeConfig, "head_dim", 32,
       "\"head_dim\" 32 x 2 heads is not supported: OLMoE's q_norm spans hidden_size 128"},
      {"missing", MixtralConfig, "num_experts_per_tok", nullptr,
       "config.json has no \"num_experts_per_tok\""},
      {"zero", MixtralConfig, "num_key_value_heads", 0,
       "config.json: \"num_key_value_heads\" is 0, not an integer >= 1"},
      {"mistyped", MixtralConfig, "hidden_size", "64",
       "config.json: \"hidden_size\" is \"64\", not an integer >= 1"},
      {"negative epsilon", Qwen3Config, "rms_norm_eps", -1e-6,
       "config.json: \"rms_norm_eps\" is -1e-06, not a number in (0, 1.0]"},
      {"zero base", MixtralConfig, "rope_theta", 0.0,
       "config.json: \"rope_theta\" is 0.0, not a number in (0, "},
      {"negative base",
       Qwen3Config,
       "rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", -5.0}},
       "\"rope_parameters\" rope_theta -5.0 is not a number in (0, 1e12]"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.what);
    nlohmann::json config = r.config();
    if (r.value.is_null()) {
      config.erase(r.key);
    } else {
      config[r.key] = r.value;
    }
    const Status status = HfModelFromConfig(config).status();
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find(r.message), std::string::npos) << status.message();
    EXPECT_EQ(status.message().find('\n'), std::string::npos);
  }
}

TEST(HfConfigTest, RefusesToExportWhatTheTypeCannotExpressInOneLine) {
  const GptConfig qwen3 = Read(Qwen3Config()).config;
  const GptConfig mixtral = Read(MixtralConfig()).config;
  const GptConfig olmoe = Read(OlmoeConfig()).config;
  GptConfig pre_softmax = mixtral, dense = mixtral, wide = olmoe;
  pre_softmax.moe_router_pre_softmax = true;
  dense.first_dense_layers = 1;
  wide.kv_channels = 128;
  const std::vector<std::tuple<GptConfig, HfModelType, std::string>> cases = {
      {qwen3, HfModelType::kMixtral, "--model_type=mixtral cannot express --qk_layernorm"},
      {pre_softmax, HfModelType::kMixtral,
       "--model_type=mixtral cannot express --moe_router_pre_softmax"},
      {dense, HfModelType::kMixtral, "--model_type=mixtral cannot express --first_dense_layers=1"},
      {qwen3, HfModelType::kOlmoe,
       "--model_type=olmoe cannot express a model without --qk_layernorm_across_heads"},
      {wide, HfModelType::kOlmoe,
       "--model_type=olmoe cannot express a query projection of 256 (--kv_channels x "
       "--num_attention_heads) on --hidden_size=128"},
      {mixtral, HfModelType::kQwen3Moe,
       "--model_type=qwen3_moe cannot express a model without query/key norm"},
      {olmoe, HfModelType::kQwen3Moe,
       "--model_type=qwen3_moe cannot express a model whose query/key norm spans all heads"},
  };
  for (const auto& [config, type, message] : cases) {
    SCOPED_TRACE(message);
    const Status status = HfConfigFor(config, type, "bfloat16").status();
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find(message), std::string::npos) << status.message();
    EXPECT_EQ(status.message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace moe
