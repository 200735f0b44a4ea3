#include "modules/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "engine/core/byte_units.h"
#include "engine/distributed/gradient_sync.h"
#include "engine/distributed/host_collectives.h"
#include "engine/distributed/state_gather.h"
#include "engine/distributed/weight_gather.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/kernels/ops.h"
#include "engine/pipeline/layout.h"
#include "engine/runtime/device_context.h"
#include "engine/runtime/step_timeline.h"
#include "modules/checkpoint_state.h"
#include "modules/grouped_mlp.h"
#include "modules/model_shape.h"
#include "modules/offload_groups.h"

namespace moe {

namespace {

int GroupSize(const Communicator* group) { return group != nullptr ? group->size() : 1; }
int GroupRank(const Communicator* group) { return group != nullptr ? group->rank() : 0; }

}  // namespace

Status CheckBatchSplit(const TrainerOptions& options, int data_size) {
  if (options.micro_batch_size >= 1 &&
      options.global_batch_size % (options.micro_batch_size * data_size) == 0) {
    return Status::Ok();
  }
  return InvalidArgument(
      "--global_batch_size=" + std::to_string(options.global_batch_size) +
      " is not a multiple of --micro_batch_size=" + std::to_string(options.micro_batch_size) +
      " x data-parallel size " + std::to_string(data_size));
}

Status CheckExpertParallel(const GptConfig& config, int expert_size) {
  if (expert_size == 1) return Status::Ok();
  const std::string flag = "--expert_model_parallel_size=" + std::to_string(expert_size);
  if (config.num_moe_layers() == 0) {
    return InvalidArgument(flag + " needs MoE layers (--first_dense_layers=" +
                           std::to_string(config.first_dense_layers) +
                           " of --num_layers=" + std::to_string(config.num_layers) + ")");
  }
  if (config.num_experts % expert_size != 0) {
    return InvalidArgument(flag +
                           " does not divide --num_experts=" + std::to_string(config.num_experts));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const GptConfig& config,
                                                   const TrainerOptions& options, Device device,
                                                   const TokenSource* source,
                                                   const ProcessGroups* groups) {
  Communicator* pipeline = groups != nullptr ? groups->pipeline.get() : nullptr;
  const int pipeline_size = GroupSize(pipeline);
  const int data_size = GroupSize(groups != nullptr ? groups->data.get() : nullptr);
  if (options.virtual_pipeline < 1) {
    return InvalidArgument("--virtual_pipeline=" + std::to_string(options.virtual_pipeline) +
                           " must be positive");
  }
  MOE_RETURN_IF_ERROR(CheckBatchSplit(options, data_size));
  MOE_RETURN_IF_ERROR(
      CheckExpertParallel(config, GroupSize(groups != nullptr ? groups->expert.get() : nullptr)));
  PartitionOptions layout;
  layout.num_layers = static_cast<int>(config.num_layers);
  layout.pipeline_size = pipeline_size;
  layout.virtual_chunks = options.virtual_pipeline;
  layout.first_stage_layers = options.first_stage_layers;
  layout.last_stage_layers = options.last_stage_layers;
  MOE_ASSIGN_OR_RETURN(
      PipelineLayout pipeline_layout,
      PipelineLayout::Create(layout, static_cast<int>(options.global_batch_size /
                                                      (options.micro_batch_size * data_size))));
  MOE_ASSIGN_OR_RETURN(
      BatchSampler sampler,
      BatchSampler::Create(source, config.seq_length, options.micro_batch_size, options.seed));
  return std::unique_ptr<Trainer>(
      new Trainer(config, options, device, std::move(sampler), groups, pipeline_layout.partition,
                  std::move(pipeline_layout.schedule[GroupRank(pipeline)])));
}

Trainer::Trainer(const GptConfig& config, const TrainerOptions& options, Device device,
                 BatchSampler sampler, const ProcessGroups* groups, const LayerPartition& partition,
                 RankActions train_actions)
    : config_(config),
      options_(options),
      device_(device),
      pipeline_(groups != nullptr ? groups->pipeline.get() : nullptr),
      data_(groups != nullptr ? groups->data.get() : nullptr),
      expert_parallel_{groups != nullptr ? groups->expert.get() : nullptr,
                       groups != nullptr ? groups->expert_data.get() : nullptr,
                       {}},
      parameters_(ParameterSet::Deferred(device, device.is_cuda() ? DType::kBF16 : DType::kF32,
                                         options.seed, options.optimizer_dtypes)),
      partition_(partition),
      train_actions_(std::move(train_actions)),
      optimizer_(options.adamw),
      sampler_(std::move(sampler)),
      timeline_(std::make_unique<StepTimeline>(device)) {
  const int rank = GroupRank(pipeline_);
  chunk_parameters_.push_back(0);
  for (int chunk = 0; chunk < partition.virtual_chunks(); ++chunk) {
    const int stage = StageIndex(rank, chunk, partition.pipeline_size());
    chunks_.push_back(std::make_unique<GptModel>(
        config_, parameters_, StageOf(stage),
        expert_parallel_.group != nullptr ? &expert_parallel_ : nullptr));
    chunk_parameters_.push_back(parameters_.all().size());
  }
  const bool sharded = options_.use_distributed_optimizer && GroupSize(data_) > 1;
  const ReplicaCommunicators groups_of = replica_groups();
  BucketSharding sharding;
  for (const ReplicaGroup group : kReplicaGroups) {
    if (sharded) sharding[group] = {GroupSize(groups_of[group]), GroupRank(groups_of[group])};
  }
  parameters_.AllocateBuckets(sharding, options_.bucket_bytes);
  if (sharded) {
    weight_gather_ = std::make_unique<WeightGather>(replica_groups(), parameters_,
                                                    DeviceContext::Get(device_).compute_stream());
  }
  if (options_.offload)
    offload_ = std::make_unique<OffloadManager>(device_, *options_.offload, rank);
}

Microbatch Trainer::Upload(const std::vector<int32_t>& windows, int64_t rows) const {
  const int64_t seq = config_.seq_length;
  std::vector<int32_t> inputs(rows * seq), shifted(rows * seq);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* window = windows.data() + r * (seq + 1);
    std::copy(window, window + seq, inputs.data() + r * seq);
    std::copy(window + 1, window + seq + 1, shifted.data() + r * seq);
  }
  Microbatch batch{Tensor::Empty({rows * seq}, DType::kI32, device_),
                   Tensor::Empty({rows * seq}, DType::kI32, device_)};
  ops::CopyFromHost(inputs.data(), batch.ids);
  ops::CopyFromHost(shifted.data(), batch.targets);
  return batch;
}

int64_t Trainer::RankSamples() const { return options_.global_batch_size / GroupSize(data_); }

int64_t Trainer::FirstSampleOfStep() const {
  return sampler_.consumed_train_samples() + GroupRank(data_) * RankSamples();
}

std::vector<int32_t> Trainer::ReadWindows(int64_t first_sample) const {
  std::vector<int32_t> windows(RankSamples() * sampler_.window_length());
  sampler_.ReadSamples(Split::kTrain, first_sample, windows);
  return windows;
}

std::vector<int32_t> Trainer::StepWindows() {
  const int64_t first_sample = FirstSampleOfStep();
  if (read_ahead_first_sample_ != first_sample) return ReadWindows(first_sample);
  read_ahead_first_sample_ = -1;
  return std::move(read_ahead_windows_);
}

PipelineStepOptions Trainer::StepOptions(bool training) const {
  PipelineStepOptions step;
  step.device = device_;
  step.training = training;
  step.activation_shape = {options_.micro_batch_size * config_.seq_length, config_.hidden_size};
  step.activation_dtype = parameters_.compute_dtype();
  return step;
}

GptStage Trainer::StageOf(int stage) const {
  const LayerRange& layers = partition_.stage_layers(stage);
  return GptStage{layers.begin, layers.end, partition_.is_first_stage(stage),
                  partition_.is_last_stage(stage)};
}

ReplicaCommunicators Trainer::shard_groups() const {
  ReplicaCommunicators shards = replica_groups();
  for (const ReplicaGroup group : kReplicaGroups) {
    if (parameters_.shards(group) == 1) shards[group] = nullptr;
  }
  return shards;
}

void Trainer::WaitForWeights() {
  if (weight_gather_) weight_gather_->WaitAll();
}

Trainer::~Trainer() { WaitForWeights(); }

bool Trainer::whole_model() const {
  return chunks_.size() == 1 && chunks_[0]->stage().first && chunks_[0]->stage().last;
}

StepStats Trainer::TrainStep(bool trace) {
  const auto start = std::chrono::steady_clock::now();
  DeviceContext& context = DeviceContext::Get(device_);
  context.allocator().ResetPeakStats();  // StepStats::peak_device_mib is this step's
  timeline_->BeginStep(trace);
  expert_parallel_.traffic = {};  // this step's alone (evaluation adds to it too)
  context.set_timeline(timeline_.get());
  const int step_span = timeline_->BeginSpan(TraceTrack::kCompute, context.compute_stream(),
                                             "step " + std::to_string(step_ + 1));
  const int64_t micro = options_.micro_batch_size;
  const int64_t micro_batches = options_.global_batch_size / micro;  // of the global batch
  const int64_t tokens = options_.global_batch_size * config_.seq_length;
  // This rank's micro-batches go to the device now, in one copy, while the device is idle (the
  // last step ended by reading its statistics). Uploading each as its forward began waited for
  // all the work queued before it, so every forward started on an empty device queue.
  const bool reads_data = std::any_of(chunks_.begin(), chunks_.end(), [](const auto& chunk) {
    return chunk->stage().first || chunk->stage().last;
  });
  Microbatch batches;
  if (reads_data) batches = Upload(StepWindows(), RankSamples());
  const auto microbatch = [&](int m) {
    const int64_t begin = m * micro * config_.seq_length, end = begin + micro * config_.seq_length;
    return Microbatch{batches.ids.Rows(begin, end), batches.targets.Rows(begin, end)};
  };
  PipelineStepOptions step = StepOptions(/*training=*/true);
  step.loss_grad = 1.0f / static_cast<float>(tokens);
  step.aux_grad = 1.0f / static_cast<float>(micro_batches);
  step.offload = offload_.get();
  std::optional<GradientSync> gradient_sync;  // data parallel: all-reduces overlap backward
  if (GroupSize(data_) > 1) {
    ReplicaCommunicators reduce = replica_groups();
    if (ExpertGradsSummedByModule(device_, expert_parallel_.group != nullptr)) {
      reduce.expert_data = nullptr;  // the grouped MLPs have summed them in data-rank order
    }
    gradient_sync.emplace(reduce, parameters_, context.compute_stream());
    step.grads_final = [&](const std::string& prefix) { gradient_sync->GradsFinal(prefix); };
  }
  if (weight_gather_) {  // the last step's weights arrive as the forward needs them
    step.weights_needed = [&](const std::string& prefix) { weight_gather_->WaitFor(prefix); };
  }
  const PipelineStepTotals totals =
      RunPipelineStep(train_actions_, chunks_, pipeline_, microbatch, step);
  sampler_.SkipTrainSamples(options_.global_batch_size);
  if (gradient_sync) {
    timeline_->SetPhase(StepPhase::kDataParallelWait);
    gradient_sync->Finish();
  }

  StepStats stats;
  stats.lr = LearningRate(step_, options_.lr, options_.min_lr, options_.warmup_steps,
                          options_.train_steps);
  timeline_->SetPhase(StepPhase::kOptimizer);
  {
    const TraceSpan span(device_, "optimizer (grad norm, clip, AdamW, zero grads)");
    WaitForWeights();  // the update writes the owned values
    const NormGroups norm_groups{
        .model = pipeline_, .shard = shard_groups(), .expert = expert_parallel_.group};
    stats.grad_norm = optimizer_.Step(parameters_, stats.lr, norm_groups).grad_norm;
    parameters_.ZeroGrads();
  }
  // The host has waited for the device twice by now (RunPipelineStep reads its actions' timing
  // events, the optimizer the gradient norm); AdamW keeps the device busy for a while (a
  // bandwidth-bound pass over every parameter's state), so the next step's samples are read
  // meanwhile. Read at the step's start, the device idled while the host sampled them; read
  // before the optimizer, it idled there instead (tests/results/training_speed.md).
  if (reads_data && step_ + 1 < options_.train_steps) {
    read_ahead_first_sample_ = FirstSampleOfStep();
    read_ahead_windows_ = ReadWindows(read_ahead_first_sample_);
  }
  timeline_->SetPhase(StepPhase::kOther);
  if (offload_) stats.offload = offload_->EndStep();
  timeline_->EndSpan(step_span, context.compute_stream());
  context.set_timeline(nullptr);
  TimelineStep timed = timeline_->EndStep();
  stats.trace = std::move(timed.trace);
  stats.expert_traffic = std::move(expert_parallel_.traffic);

  // One all-reduce over the world: loss, aux loss, bubble, the breakdown (mean over ranks), the
  // offload copies' GiB and busy ms (sums); then every rank's peak, gathered.
  constexpr int kCopies = 3 + kNumStepPhases;
  const int ranks = GroupSize(pipeline_) * GroupSize(data_);
  std::vector<float> sums(kCopies + 2, 0.0f);
  ops::CopyToHost(totals.loss_sum, &sums[0]);
  ops::CopyToHost(totals.aux_loss, &sums[1]);
  if (totals.span_ms > 0) sums[2] = (1.0 - totals.busy_ms / totals.span_ms) / ranks;
  for (int i = 0; i < kNumStepPhases; ++i) sums[3 + i] = timed.breakdown.ms[i] / ranks;
  sums[kCopies] = (stats.offload.offloaded_bytes + stats.offload.reloaded_bytes) / kGiB;
  sums[kCopies + 1] = stats.offload.d2h_ms + stats.offload.h2d_ms;
  AllReduceHostValues(pipeline_, sums);
  AllReduceHostValues(data_, sums);
  stats.loss = sums[0] / static_cast<double>(tokens);
  stats.aux_loss = sums[1] / static_cast<double>(micro_batches);
  stats.pipeline_bubble = sums[2];
  for (int i = 0; i < kNumStepPhases; ++i) stats.breakdown.ms[i] = sums[3 + i];
  if (sums[kCopies + 1] > 0)
    stats.copy_bytes_per_s = sums[kCopies] * kGiB / (sums[kCopies + 1] / 1e3);
  const std::vector<int64_t> own_peak = {context.allocator().stats().peak_allocated_bytes};
  // By data rank within this stage, then by stage: world order.
  for (int64_t peak : AllGatherHost(pipeline_, AllGatherHost(data_, own_peak))) {
    stats.peak_device_mib.push_back(static_cast<double>(peak) / kMiB);
  }
  stats.tokens = tokens;
  // After the statistics' collectives, so the gathers overlap the next step's forward, not them.
  if (weight_gather_) weight_gather_->Start();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++step_;
  return stats;
}

std::vector<std::vector<OffloadGroupSummary>> Trainer::OffloadPolicyByPipelineRank() const {
  CHECK(offload_ != nullptr && offload_->policy_fixed()) << "no offload policy yet";
  // One row per group name, gathered over the pipeline group: its place in its rank's table
  // (1-based; 0: not listed) and its figures.
  struct Row {
    int64_t place, candidates, offloaded, tensors, bytes, skipped;
  };
  const std::vector<std::string>& names = OffloadGroupNames();
  std::vector<Row> own(names.size(), Row{});
  const std::vector<OffloadGroupSummary>& summary = offload_->summary();
  for (size_t place = 0; place < summary.size(); ++place) {
    const OffloadGroupSummary& s = summary[place];
    const auto name = std::find(names.begin(), names.end(), s.name);
    CHECK(name != names.end()) << "unknown offload group " << s.name;
    own[name - names.begin()] = {
        static_cast<int64_t>(place + 1), s.candidates, s.offloaded, s.tensors, s.bytes, s.skipped};
  }
  const std::vector<Row> all = AllGatherHost(pipeline_, own);
  std::vector<std::vector<OffloadGroupSummary>> by_rank(GroupSize(pipeline_));
  for (size_t rank = 0; rank < by_rank.size(); ++rank) {
    std::vector<OffloadGroupSummary>& rows = by_rank[rank];
    for (size_t i = 0; i < names.size(); ++i) {
      const Row& r = all[rank * names.size() + i];
      if (r.place == 0) continue;
      if (rows.size() < static_cast<size_t>(r.place)) rows.resize(r.place);
      rows[r.place - 1] = {names[i],
                           static_cast<int>(r.candidates),
                           static_cast<int>(r.offloaded),
                           r.tensors,
                           r.bytes,
                           r.skipped};
    }
  }
  return by_rank;
}

void Trainer::SetMemoryPlan(const MemoryPlan& plan) {
  config_.recompute_by_layer = plan.recompute_by_layer;
  for (auto& chunk : chunks_) chunk->SetRecomputeByLayer(plan.recompute_by_layer);
  if (offload_ == nullptr) return;
  CHECK(offload_->options().planned) << "offloading without a plan";
  offload_->SetPlanned(plan.offload);
  std::vector<std::pair<std::string, size_t>> buffers;
  for (const SavedTensorSize& s : plan.ranks[GroupRank(pipeline_)].host_buffers) {
    buffers.emplace_back(s.group, static_cast<size_t>(s.bytes));
  }
  offload_->ReserveHostBuffers(buffers);
}

double Trainer::Evaluate() {
  WaitForWeights();
  const int64_t rows = options_.micro_batch_size;
  std::vector<int32_t> windows(rows * sampler_.window_length());
  const auto microbatch = [&](int batch) {
    sampler_.ValidationBatch(batch, windows);
    return Upload(windows, rows);
  };
  const RankActions actions =
      BuildForwardOnlySchedule(GroupSize(pipeline_), static_cast<int>(chunks_.size()),
                               static_cast<int>(options_.eval_steps))[GroupRank(pipeline_)];
  const PipelineStepTotals totals =
      RunPipelineStep(actions, chunks_, pipeline_, microbatch, StepOptions(/*training=*/false));
  std::vector<float> sums(1);
  ops::CopyToHost(totals.loss_sum, sums.data());
  AllReduceHostValues(pipeline_, sums);
  return sums[0] / static_cast<double>(options_.eval_steps * rows * config_.seq_length);
}

nlohmann::json Trainer::ModelConfig() const {
  nlohmann::json config = ModelShapeJson(config_);
  config["moe_aux_loss_coeff"] = config_.moe_aux_loss_coeff;
  config["moe_z_loss_coeff"] = config_.moe_z_loss_coeff;
  return config;
}

namespace {

void CollectTensor(const WholeParameterState& p, std::vector<NamedTensor>* model,
                   std::vector<NamedTensor>* optimizer) {
  model->push_back({p.name, p.master});
  optimizer->push_back({p.name + ".exp_avg", p.exp_avg});
  optimizer->push_back({p.name + ".exp_avg_sq", p.exp_avg_sq});
}

}  // namespace

std::vector<WholeParameterState> Trainer::GatherWholeState() {
  WaitForWeights();
  const auto& all = parameters_.all();
  // Each bucket's state whole over its group's shards, on rank 0 of that group.
  std::vector<WholeParameterState> state(all.size());
  for (size_t b = 0; b < parameters_.buckets().size(); ++b) {
    const BucketLayout& layout = parameters_.buckets()[b].layout;
    if (layout.shards == 1) {
      for (size_t i = layout.begin; i < layout.end; ++i) {
        const Parameter& p = *all[i];
        state[i] = {p.name, p.master, p.exp_avg, p.exp_avg_sq};
      }
      continue;
    }
    WholeBucketState whole = GatherBucketState(replica_groups(), parameters_, b, /*root=*/0);
    for (size_t i = 0; i < whole.parameters.size(); ++i) {
      state[layout.begin + i] = std::move(whole.parameters[i]);
    }
  }
  // The experts of the stage out of expert group 0's parts (expert-data rank 0 is data rank < E).
  if (expert_parallel_.group != nullptr && GroupRank(expert_parallel_.expert_data) == 0)
    GatherExperts(state);
  if (GroupRank(data_) != 0) state.clear();
  return state;
}

void Trainer::GatherExperts(std::vector<WholeParameterState>& state) {
  Communicator& group = *expert_parallel_.group;
  std::vector<WholeParameterState> parts;
  std::vector<size_t> index;
  for (size_t i = 0; i < state.size(); ++i) {
    const ParameterSpec& spec = parameters_.specs()[i];
    if (spec.whole_shape.empty()) continue;
    parts.push_back(
        std::exchange(state[i], parameters_.NewWholeState(spec.name, spec.whole_shape)));
    index.push_back(i);
  }
  EnqueueBetween(group, DeviceContext::Get(device_).compute_stream(), [&] {
    for (size_t n = 0; n < parts.size(); ++n) {
      const WholeParameterState& whole = state[index[n]];
      group.AllGather(parts[n].master, whole.master);
      group.AllGather(parts[n].exp_avg, whole.exp_avg);
      group.AllGather(parts[n].exp_avg_sq, whole.exp_avg_sq);
    }
  });
}

Status Trainer::Save(const std::string& root, const nlohmann::json& description) {
  const std::vector<WholeParameterState> own = GatherWholeState();
  if (GroupRank(data_) != 0) return Status::Ok();
  const int rank = GroupRank(pipeline_);
  const int pipeline_size = GroupSize(pipeline_);
  Stream& compute = DeviceContext::Get(device_).compute_stream();
  if (rank != 0) {  // send this rank's state to pipeline rank 0, in parameters_ order
    EnqueueBetween(*pipeline_, compute, [&] {
      for (const WholeParameterState& p : own) {
        for (const Tensor* t : {&p.master, &p.exp_avg, &p.exp_avg_sq}) pipeline_->Send(*t, 0);
      }
    });
    return Status::Ok();
  }

  // The parameters of every stage, in stage order: this rank's own, and receive buffers for the
  // others' (their specs from the model, in the order the peer sends them; allocated on compute
  // before the transfers are enqueued).
  const int chunks = static_cast<int>(chunks_.size());
  std::vector<std::vector<const WholeParameterState*>> stages(
      static_cast<size_t>(pipeline_size * chunks));
  std::vector<WholeParameterState> received;  // in issue order
  std::vector<int> received_peer;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    for (size_t i = chunk_parameters_[chunk]; i < chunk_parameters_[chunk + 1]; ++i) {
      stages[StageIndex(0, chunk, pipeline_size)].push_back(&own[i]);
    }
  }
  std::vector<int> received_stage;
  for (int peer = 1; peer < pipeline_size; ++peer) {
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int stage = StageIndex(peer, chunk, pipeline_size);
      for (const ParameterSpec& spec : GptModel::StageParameterSpecs(config_, StageOf(stage))) {
        received.push_back(parameters_.NewWholeState(spec.name, spec.shape));
        received_peer.push_back(peer);
        received_stage.push_back(stage);
      }
    }
  }
  for (size_t s = 0; s < received.size(); ++s) stages[received_stage[s]].push_back(&received[s]);
  if (!received.empty()) {
    EnqueueBetween(*pipeline_, compute, [&] {
      for (size_t s = 0; s < received.size(); ++s) {
        for (const Tensor* t :
             {&received[s].master, &received[s].exp_avg, &received[s].exp_avg_sq}) {
          pipeline_->Recv(*t, received_peer[s]);
        }
      }
    });
  }
  std::vector<NamedTensor> model, optimizer;
  for (const auto& stage : stages) {
    for (const WholeParameterState* p : stage) CollectTensor(*p, &model, &optimizer);
  }
  const nlohmann::json state =
      TrainingCheckpointState(step_, optimizer_.step(), sampler_.consumed_train_samples(),
                              options_.seed, config_, description);
  return SaveCheckpoint(root, step_, model, optimizer, state, /*overwrite=*/true);
}

StatusOr<nlohmann::json> Trainer::LoadStates(const std::string& dir,
                                             const std::vector<WholeParameterState>& state,
                                             size_t first_parameter, bool weights_only,
                                             bool subset) {
  std::vector<WholeParameterState> wholes;  // the parts' transient whole tensors, in order
  std::vector<NamedTensor> model, optimizer;
  for (size_t i = 0; i < state.size(); ++i) {
    const ParameterSpec& spec = parameters_.specs()[first_parameter + i];
    if (spec.whole_shape.empty()) {
      CollectTensor(state[i], &model, &optimizer);
      continue;
    }
    wholes.push_back(parameters_.NewWholeState(spec.name, spec.whole_shape));
  }
  for (const WholeParameterState& whole : wholes) CollectTensor(whole, &model, &optimizer);
  nlohmann::json read;
  if (weights_only) {
    MOE_ASSIGN_OR_RETURN(read, LoadCheckpointWeights(dir, model, subset));
  } else {
    MOE_ASSIGN_OR_RETURN(read, LoadCheckpoint(dir, model, optimizer, subset));
  }
  size_t w = 0;
  for (size_t i = 0; i < state.size(); ++i) {
    const ParameterSpec& spec = parameters_.specs()[first_parameter + i];
    if (spec.whole_shape.empty()) continue;
    const WholeParameterState& whole = wholes[w++];
    const int64_t begin = spec.first_row, end = begin + spec.shape[0];
    ops::Copy(whole.master.Rows(begin, end), state[i].master);
    if (weights_only) continue;
    ops::Copy(whole.exp_avg.Rows(begin, end), state[i].exp_avg);
    ops::Copy(whole.exp_avg_sq.Rows(begin, end), state[i].exp_avg_sq);
  }
  return read;
}

StatusOr<nlohmann::json> Trainer::LoadShardedState(const std::string& dir, bool weights_only) {
  nlohmann::json state;
  for (size_t b = 0; b < parameters_.buckets().size(); ++b) {
    const WholeBucketState whole = parameters_.NewWholeBucketState(b);  // zeroed moments
    MOE_ASSIGN_OR_RETURN(state,
                         LoadStates(dir, whole.parameters, parameters_.buckets()[b].layout.begin,
                                    weights_only, /*subset=*/true));
    parameters_.AssignBucketState(b, whole);
  }
  return state;
}

Status Trainer::Load(const std::string& path) { return LoadFrom(path, /*weights_only=*/false); }

Status Trainer::LoadWeights(const std::string& path) {
  return LoadFrom(path, /*weights_only=*/true);
}

Status Trainer::LoadFrom(const std::string& path, bool weights_only) {
  WaitForWeights();
  MOE_ASSIGN_OR_RETURN(const CheckpointState peek, ReadCheckpointState(path));
  const std::string& dir = peek.dir;
  if (!peek.state.is_object() || !peek.state.contains("model")) {
    return DataLoss("checkpoint " + dir + ": state.json has no model shape");
  }
  const std::string differences = ModelShapeDifferences(
      peek.state["model"], config_, weights_only ? ShapeFields::kParameters : ShapeFields::kAll);
  if (!differences.empty()) {
    return InvalidArgument("checkpoint " + dir + ": its model differs in " + differences);
  }
  // The checkpoint holds the whole model; this rank loads its stages' parameters by name (and
  // under the distributed optimizer keeps its shard of their state).
  nlohmann::json state;
  const ReplicaCommunicators shards = shard_groups();
  if (shards.data != nullptr || shards.expert_data != nullptr) {
    MOE_ASSIGN_OR_RETURN(state, LoadShardedState(dir, weights_only));
  } else {
    std::vector<WholeParameterState> own;
    for (const auto& p : parameters_.all())
      own.push_back({p->name, p->master, p->exp_avg, p->exp_avg_sq});
    MOE_ASSIGN_OR_RETURN(state, LoadStates(dir, own, 0, weights_only, /*subset=*/!whole_model()));
    parameters_.SyncValuesFromMasters();
  }
  if (weights_only) return Status::Ok();  // step, AdamW and the data stay at their start
  for (const char* key : {"step", "optimizer_step", "consumed_train_samples"}) {
    if (!state.contains(key) || !state[key].is_number_integer()) {
      return DataLoss("checkpoint " + dir + ": state.json has no integer \"" + key + "\"");
    }
  }
  step_ = state.at("step").get<int64_t>();
  optimizer_.set_step(state.at("optimizer_step").get<int64_t>());
  return sampler_.RestoreConsumedTrainSamples(state.at("consumed_train_samples").get<int64_t>());
}

Status Trainer::DumpReferenceCase(const std::string& dir) {
  CHECK(whole_model()) << "a reference case needs the whole model on this rank";
  std::vector<int32_t> windows(options_.micro_batch_size * sampler_.window_length());
  sampler_.ReadSamples(Split::kTrain, 0, windows);
  const auto [ids, targets] = Upload(windows, options_.micro_batch_size);
  parameters_.ZeroGrads();
  SavedTensors saved(/*training=*/true);
  GptModel& model = *chunks_[0];
  const ForwardResult result =
      model.Forward(saved, ids, targets, /*loss_grad=*/1.0f / static_cast<float>(ids.numel()));
  model.Backward(saved, Tensor(), /*aux_grad=*/1.0f);
  Tensor loss = Tensor::Empty({1}, DType::kF32, device_);
  ops::Scale(result.loss_sum, 1.0f / static_cast<float>(ids.numel()), loss);

  std::vector<NamedTensor> tensors = {
      {"ids", ids}, {"targets", targets}, {"loss", loss}, {"aux_loss", result.aux_loss}};
  for (const auto& p : parameters_.all()) {
    tensors.push_back({p->name, p->master});
    tensors.push_back({"grad." + p->name, MaterializedGrad(*p)});
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  MOE_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + kReferenceCaseTensors, tensors,
                                       {{"device", device_.ToString()}}));
  std::ofstream config(dir + "/" + kReferenceCaseConfig);
  config << ModelConfig().dump(2) << "\n";
  const bool written = static_cast<bool>(config);
  parameters_.ZeroGrads();
  return written ? Status::Ok() : Internal("cannot write " + dir + "/" + kReferenceCaseConfig);
}

}  // namespace moe
