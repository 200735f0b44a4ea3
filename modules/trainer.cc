#include "modules/trainer.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/kernels/ops.h"

namespace moe {

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const GptConfig& config,
                                                   const TrainerOptions& options, Device device,
                                                   const TokenSource* source) {
  ASSIGN_OR_RETURN(BatchSampler sampler, BatchSampler::Create(source, config.seq_length,
                                                              options.micro_batch_size, options.seed));
  return std::unique_ptr<Trainer>(new Trainer(config, options, device, std::move(sampler)));
}

Trainer::Trainer(const GptConfig& config, const TrainerOptions& options, Device device,
                 BatchSampler sampler)
    : config_(config),
      options_(options),
      device_(device),
      parameters_(device, device.is_cuda() ? DType::kBF16 : DType::kF32, options.seed),
      model_(config_, parameters_),
      optimizer_(options.adamw),
      sampler_(std::move(sampler)) {
  if (options_.offload) offload_ = std::make_unique<OffloadManager>(device_, *options_.offload);
}

void Trainer::Upload(const std::vector<int32_t>& windows, int64_t rows, Tensor* ids,
                     Tensor* targets) const {
  const int64_t seq = config_.seq_length;
  std::vector<int32_t> inputs(rows * seq), shifted(rows * seq);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* window = windows.data() + r * (seq + 1);
    std::copy(window, window + seq, inputs.data() + r * seq);
    std::copy(window + 1, window + seq + 1, shifted.data() + r * seq);
  }
  *ids = Tensor::Empty({rows * seq}, DType::kI32, device_);
  *targets = Tensor::Empty({rows * seq}, DType::kI32, device_);
  ops::CopyFromHost(inputs.data(), *ids);
  ops::CopyFromHost(shifted.data(), *targets);
}

StepStats Trainer::TrainStep() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t micro_batches = options_.global_batch_size / options_.micro_batch_size;
  const int64_t tokens = options_.global_batch_size * config_.seq_length;
  Tensor loss_total = Tensor::Empty({1}, DType::kF32, device_);
  Tensor aux_total = Tensor::Empty({1}, DType::kF32, device_);
  ops::Fill(loss_total, 0.0f);
  ops::Fill(aux_total, 0.0f);

  std::vector<int32_t> windows(options_.micro_batch_size * sampler_.window_length());
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    sampler_.NextTrainBatch(windows);
    Tensor ids, targets;
    Upload(windows, options_.micro_batch_size, &ids, &targets);
    SavedTensors saved(/*training=*/true, offload_.get());
    const ForwardResult result = model_.Forward(saved, ids, targets);
    model_.Backward(saved, 1.0f / static_cast<float>(tokens), 1.0f / static_cast<float>(micro_batches));
    CHECK(saved.empty()) << "backward left saved tensors behind, e.g. " << saved.keys().front();
    ops::Axpy(1.0f, result.loss_sum, loss_total);
    ops::Axpy(1.0f, result.aux_loss, aux_total);
  }

  StepStats stats;
  stats.lr = LearningRate(step_, options_.lr, options_.min_lr, options_.warmup_steps,
                          options_.train_steps);
  stats.grad_norm = optimizer_.Step(parameters_, stats.lr).grad_norm;
  parameters_.ZeroGrads();
  float loss_sum = 0, aux_sum = 0;
  ops::CopyToHost(loss_total, &loss_sum);
  ops::CopyToHost(aux_total, &aux_sum);
  if (offload_) stats.offload = offload_->EndStep();
  stats.loss = loss_sum / static_cast<double>(tokens);
  stats.aux_loss = aux_sum / static_cast<double>(micro_batches);
  stats.tokens = tokens;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++step_;
  return stats;
}

double Trainer::Evaluate() {
  const int64_t rows = options_.micro_batch_size;
  std::vector<int32_t> windows(rows * sampler_.window_length());
  Tensor loss_total = Tensor::Empty({1}, DType::kF32, device_);
  ops::Fill(loss_total, 0.0f);
  for (int64_t batch = 0; batch < options_.eval_steps; ++batch) {
    sampler_.ValidationBatch(batch, windows);
    Tensor ids, targets;
    Upload(windows, rows, &ids, &targets);
    SavedTensors forward_only(/*training=*/false);
    ops::Axpy(1.0f, model_.Forward(forward_only, ids, targets).loss_sum, loss_total);
  }
  float loss_sum = 0;
  ops::CopyToHost(loss_total, &loss_sum);
  return loss_sum / static_cast<double>(options_.eval_steps * rows * config_.seq_length);
}

nlohmann::json Trainer::ModelShape() const {
  return {{"num_layers", config_.num_layers},
          {"hidden_size", config_.hidden_size},
          {"num_attention_heads", config_.num_attention_heads},
          {"num_query_groups", config_.num_query_groups},
          {"ffn_hidden_size", config_.ffn_hidden_size},
          {"num_experts", config_.num_experts},
          {"moe_router_topk", config_.moe_router_topk},
          {"moe_ffn_hidden_size", config_.moe_ffn_hidden_size},
          {"first_dense_layers", config_.first_dense_layers},
          {"seq_length", config_.seq_length},
          {"vocab_size", config_.vocab_size}};
}

nlohmann::json Trainer::ModelConfig() const {
  nlohmann::json config = ModelShape();
  config["moe_aux_loss_coeff"] = config_.moe_aux_loss_coeff;
  config["moe_z_loss_coeff"] = config_.moe_z_loss_coeff;
  config["rope_base"] = config_.rope_base;
  config["norm_eps"] = config_.norm_eps;
  return config;
}

namespace {
void CollectTensors(const ParameterSet& parameters, std::vector<NamedTensor>* model,
                    std::vector<NamedTensor>* optimizer) {
  for (const auto& p : parameters.all()) {
    model->push_back({p->name, p->master});
    optimizer->push_back({p->name + ".exp_avg", p->exp_avg});
    optimizer->push_back({p->name + ".exp_avg_sq", p->exp_avg_sq});
  }
}
}  // namespace

Status Trainer::Save(const std::string& root, const nlohmann::json& description) {
  std::vector<NamedTensor> model, optimizer;
  CollectTensors(parameters_, &model, &optimizer);
  const nlohmann::json state = {{"step", step_},
                                {"optimizer_step", optimizer_.step()},
                                {"consumed_train_samples", sampler_.consumed_train_samples()},
                                {"seed", options_.seed},
                                {"model", ModelShape()},
                                {"run", description}};
  return SaveCheckpoint(root, step_, model, optimizer, state, /*overwrite=*/true);
}

Status Trainer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpointDir(path));
  std::ifstream state_file(dir + "/state.json");
  nlohmann::json peek = nlohmann::json::parse(state_file, nullptr, /*allow_exceptions=*/false);
  if (peek.is_discarded() || !peek.contains("model")) {
    return DataLoss("--load " + dir + ": state.json is missing or not valid JSON");
  }
  if (peek["model"] != ModelShape()) {
    return InvalidArgument("--load " + dir + ": checkpoint model " + peek["model"].dump() +
                           " differs from this run's " + ModelShape().dump());
  }
  std::vector<NamedTensor> model, optimizer;
  CollectTensors(parameters_, &model, &optimizer);
  ASSIGN_OR_RETURN(const nlohmann::json state, LoadCheckpoint(dir, model, optimizer));
  for (const char* key : {"step", "optimizer_step", "consumed_train_samples"}) {
    if (!state.contains(key) || !state[key].is_number_integer()) {
      return DataLoss("--load " + dir + ": state.json has no integer \"" + key + "\"");
    }
  }
  parameters_.SyncValuesFromMasters();
  step_ = state.at("step").get<int64_t>();
  optimizer_.set_step(state.at("optimizer_step").get<int64_t>());
  return sampler_.RestoreConsumedTrainSamples(state.at("consumed_train_samples").get<int64_t>());
}

Status Trainer::DumpReferenceCase(const std::string& dir) {
  std::vector<int32_t> windows(options_.micro_batch_size * sampler_.window_length());
  sampler_.ReadSamples(Split::kTrain, 0, windows);
  Tensor ids, targets;
  Upload(windows, options_.micro_batch_size, &ids, &targets);
  parameters_.ZeroGrads();
  SavedTensors saved(/*training=*/true);
  const ForwardResult result = model_.Forward(saved, ids, targets);
  model_.Backward(saved, 1.0f / static_cast<float>(ids.numel()), 1.0f);
  Tensor loss = Tensor::Empty({1}, DType::kF32, device_);
  ops::Scale(result.loss_sum, 1.0f / static_cast<float>(ids.numel()), loss);

  std::vector<NamedTensor> tensors = {
      {"ids", ids}, {"targets", targets}, {"loss", loss}, {"aux_loss", result.aux_loss}};
  for (const auto& p : parameters_.all()) {
    tensors.push_back({p->name, p->master});
    tensors.push_back({"grad." + p->name, p->grad});
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  RETURN_IF_ERROR(WriteSafetensors(dir + "/reference.safetensors", tensors,
                                   {{"device", device_.ToString()}}));
  std::ofstream config(dir + "/config.json");
  config << ModelConfig().dump(2) << "\n";
  const bool written = static_cast<bool>(config);
  parameters_.ZeroGrads();
  return written ? Status::Ok() : Internal("cannot write " + dir + "/config.json");
}

}  // namespace moe
