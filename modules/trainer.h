// Trainer: the training loop of one GptModel replica (or this rank's pipeline stages of it) on
// one device.
//
// Parallelism (ProcessGroups, engine/distributed/process_groups.h; none: one process). Ranks of the
// pipeline group hold the model chunks of a LayerPartition over pipeline size x
// TrainerOptions::virtual_pipeline stages (the embedding on the first stage, head and loss on
// the last), and run their rank's list of the default schedule (pipeline_executor.h). Ranks of
// the data group are replicas: each trains on its own rows of the global batch.
//
// A step covers global_batch_size sequences, samples [consumed, consumed + global_batch_size) of
// the sampler, which every rank advances alike. Data-parallel rank d of D reads the d-th of D
// equal contiguous slices, as global_batch_size / (micro_batch_size x D) micro-batches. Forward
// and backward accumulate gradients in f32, scaled for the mean over the global batch, into flat
// bucket buffers (ParameterSet::AllocateBuckets, TrainerOptions::bucket_bytes); the data group
// sums them bucket by bucket as backward finishes each (GradientSync: AllReduceSum), then AdamW
// clips by the global gradient norm (summed over the pipeline group) and steps, so replicas stay
// identical.
//
// The distributed optimizer (TrainerOptions::use_distributed_optimizer, Megatron-LM's
// --use-distributed-optimizer) shards the f32 master weights and AdamW moments over the data
// group: data rank r of D owns the r-th 1/D of every bucket. Gradients are reduce-scattered into
// the owners' parts (GradientSync: ReduceScatterSum, overlapped with backward like the
// all-reduce), each rank clips by the global norm (its part's squares summed over the data and
// pipeline groups, adamw.h) and updates its part, and the new values are all-gathered
// (WeightGather: started at the end of the step, overlapped with the next step's forward, which
// waits layer by layer for the buckets it reads; evaluation, checkpoints, Load, parameters() and
// the optimizer wait for all). State per parameter on a rank: CUDA bf16 value 2 + f32 gradient 4
// + (master, moments) 12 / D; CPU f32 value (= master) 4 + gradient 4 + moments 8 / D (plain data
// parallel: 18 and 16; bf16 moments take 4 bytes of the 8, a bf16 gradient 2 of the 4:
// StateBytesPerParameter). Against plain data parallel the
// reduced gradients are bit-identical on the CPU (the same rank-ordered sum, communicator.h); only
// the norm's summation order differs (f32 rounding), so with clipping inactive the weights are
// bit-identical too, and with it active they differ by the clip factor's rounding. With one
// replica the state has one shard and the run is plain. The loss is the mean
// cross-entropy over every target of the global batch; each MoE layer's coefficient-weighted aux
// loss is averaged over the micro-batches; both are summed over every rank, so every rank
// reports the global values. Evaluation runs forward-only passes (nothing saved) over a fixed
// set of validation batches, through the pipeline; every replica evaluates the same batches.
//
// Expert parallelism (ProcessGroups::expert, E > 1 ranks; CheckExpertParallel): the MoE layers of
// a rank hold num_experts / E experts and exchange routed rows over the expert group
// (moe_layer.h). The experts' parameters are the kExpertData replica group: their gradients are
// summed over the expert-data group (the D / E ranks holding the same experts; on the CPU by the
// grouped MLPs themselves, in data-rank order, so GradientSync leaves them: grouped_mlp.h) and,
// under the distributed optimizer, their state is sharded over it; the dense parameters keep the
// data group. The norm adds the experts' squares over the expert group too (adamw.h). Checkpoints
// gather the experts over expert group 0 and load each rank's rows out of the whole tensors, so
// they keep the single-process format and load across expert layouts. StepStats::expert_traffic is
// the step's rows per expert and rank and the bytes this rank sent.
//
// With TrainerOptions::offload set, the trainer owns an OffloadManager (made with the pipeline
// rank) and passes it to each (micro-batch, chunk) saved-tensor context, with the schedule's
// backward order (evaluation passes none); StepStats::offload reports what a step
// moved on this rank, and the manager's policy table exists after the first step.
//
// Each step runs under a StepTimeline (engine/runtime/step_timeline.h) set on the device for
// the step: forward, backward and the pipeline wait are the executor's, the offload wait the
// offload manager's, the data-parallel wait (GradientSync::Finish), the optimizer (norm, clip,
// update, zeroing) and other (the rest: host gaps, data, statistics) the trainer's. A traced step
// also has a "step N" span around it and an optimizer span.
//
// Checkpoints hold the f32 master weights (model.safetensors, by parameter name), the AdamW
// moments in their dtypes (optimizer.safetensors, "<name>.exp_avg" / "<name>.exp_avg_sq", f32 or
// bf16 each: TrainerOptions::optimizer_dtypes) and state.json (step,
// data position, seed, model shape, and whatever run description the caller adds:
// checkpoint_state.h). Everything
// the loop does is a function of that state, so a resumed run repeats an uninterrupted one bit
// for bit. Reference dumps need the whole model on this rank (no pipeline).
//
// Checkpoints under pipeline and data parallelism keep that full-model format, so a checkpoint
// saved with any layout (distributed optimizer or not) loads into any other (of the same model
// shape). Save is collective over every rank of the trainer: data-parallel rank 0 of each stage
// holds the state (replicas are identical; the others return at once; under the distributed
// optimizer it first gathers every bucket's shards, GatherBucketState, holding the stage's whole
// state transiently), pipeline ranks 1.. send their parameters' master
// weights and AdamW moments to pipeline rank 0 (Send/Recv on the pipeline group, stream-ordered),
// and pipeline rank 0 (world rank 0) writes one checkpoint with the stages' tensors in model
// order, as one process would. Rank 0 receives into buffers it allocates for the save from the
// peers' stage parameter specs (GptModel::StageParameterSpecs) and frees afterwards (the whole
// model's state, transiently). Load is per rank: every rank reads the shared checkpoint itself
// and loads only its own parameters by name (LoadCheckpoint's subset mode), plus step and data
// position, which are the same everywhere; under the distributed optimizer bucket by bucket into
// transient whole buffers, keeping its part of the state and every value.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/autograd/parameters.h"
#include "engine/core/status.h"
#include "engine/distributed/process_groups.h"
#include "engine/distributed/weight_gather.h"
#include "engine/io/dataset.h"
#include "engine/offload/offload_manager.h"
#include "engine/optim/adamw.h"
#include "engine/pipeline/partition.h"
#include "engine/pipeline/schedule.h"
#include "engine/runtime/step_timeline.h"
#include "modules/expert_parallel.h"
#include "modules/gpt_config.h"
#include "modules/gpt_model.h"
#include "modules/memory_planner.h"
#include "modules/pipeline_executor.h"

namespace moe {

struct TrainerOptions {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 8;
  int64_t train_steps = 100;
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  int64_t warmup_steps = 10;
  AdamWOptions adamw;
  int64_t eval_steps = 4;  // validation batches (of micro_batch_size) per evaluation
  uint64_t seed = 1234;
  int virtual_pipeline = 1;                               // model chunks per pipeline rank
  int first_stage_layers = PartitionOptions::kEvenSplit;  // layer partition overrides
  int last_stage_layers = PartitionOptions::kEvenSplit;
  std::optional<OffloadOptions> offload;  // fine-grained activation offloading (off if unset)
  // Gradient buckets (parameter_buckets.h): f32 gradient bytes that close a bucket (Megatron-LM's
  // 40M elements).
  int64_t bucket_bytes = int64_t{40'000'000} * 4;
  // The distributed optimizer: master weights and AdamW moments sharded over the data group (see
  // the top). With one replica the one shard is the whole state: the same as without.
  bool use_distributed_optimizer = false;
  // The storage dtypes of the gradients and the AdamW moments (f32 or bf16 each). Checkpoints hold
  // the moments in these dtypes; a checkpoint of either loads into either (LoadSafetensors
  // converts). Gradients are never saved, so their dtype does not matter to checkpoints.
  OptimizerDTypes optimizer_dtypes;
};

// The global batch splits into whole micro-batches on each of `data_size` replicas, else the
// error (naming the flags) that Trainer::Create gives.
Status CheckBatchSplit(const TrainerOptions& options, int data_size);
// Expert parallelism over `expert_size` ranks suits the model: it has MoE layers and expert_size
// divides num_experts; else the error (naming the flags).
Status CheckExpertParallel(const GptConfig& config, int expert_size);

struct StepStats {
  double loss = 0;      // mean cross-entropy over the global batch
  double aux_loss = 0;  // summed over MoE layers, averaged over the global batch's micro-batches
  float lr = 0;
  float grad_norm = 0;
  int64_t tokens = 0;  // of the global batch
  double seconds = 0;  // wall time of the step, device work included
  // Mean over ranks of 1 - (forward + backward compute time) / (pipeline step span); 0 without a
  // pipeline schedule's idle time (one stage: only host gaps between kernels).
  double pipeline_bubble = 0;
  // The allocator's peak during the step (weights and state included), by world rank (pipeline
  // rank x data size + data rank).
  std::vector<double> peak_device_mib;
  OffloadStepStats offload;  // this rank's; zero without offloading
  // Every rank's offload copies, both directions: bytes / the copy streams' busy time (0: none).
  double copy_bytes_per_s = 0;
  // Where the step's time went on the compute stream, ms, mean over ranks: the phases add up to
  // the compute stream's span of the step, which is `seconds` less the step's closing all-reduce
  // of these statistics.
  StepBreakdown breakdown;
  std::vector<TraceEvent> trace;  // this rank's traced events (TrainStep(trace=true) only)
  // Under expert parallelism (else empty): what this rank's MoE layers routed and exchanged in the
  // step, its expert group's rows per expert and per rank and its own bytes sent
  // (expert_parallel.h).
  ExpertTraffic expert_traffic;
};

// The two files of Trainer::DumpReferenceCase (read by tests/reference/torch_reference.py).
inline constexpr const char* kReferenceCaseTensors = "reference.safetensors";
inline constexpr const char* kReferenceCaseConfig = "config.json";

class Trainer {
 public:
  // Errors (naming the flags) when the layers do not split over the stages, the global batch
  // does not split over micro-batches and replicas, or the schedule does not fit. `groups`
  // (nullptr: one process) must outlive the trainer.
  static StatusOr<std::unique_ptr<Trainer>> Create(const GptConfig& config,
                                                   const TrainerOptions& options, Device device,
                                                   const TokenSource* source,
                                                   const ProcessGroups* groups = nullptr);
  ~Trainer();  // waits for the weights still being gathered

  // One optimizer step. `trace`: also record this rank's trace events (StepStats::trace).
  StepStats TrainStep(bool trace = false);
  // Mean validation cross-entropy over options.eval_steps batches.
  double Evaluate();

  int64_t step() const { return step_; }
  // This rank's parameters: all of them, or its stages' without pipeline.
  // (Waits for the weights still being gathered under the distributed optimizer.)
  const ParameterSet& parameters() {
    WaitForWeights();
    return parameters_;
  }
  // nullptr unless TrainerOptions::offload is set.
  const OffloadManager* offload_manager() const { return offload_.get(); }
  // A memory plan from the next step: what each layer recomputes, and, with offloading (made with
  // TrainerOptions::offload->planned), the offloaded groups, with this rank's pinned host buffers
  // reserved for them. Call between steps.
  void SetMemoryPlan(const MemoryPlan& plan);
  // Collective over the pipeline group, after the first step with offloading: every pipeline
  // rank's OffloadManager::summary(), by rank (for OffloadManager::SummaryTable).
  std::vector<std::vector<OffloadGroupSummary>> OffloadPolicyByPipelineRank() const;

  // Collective over the data group: this rank's parameters' whole optimizer state (f32 master
  // weights and AdamW moments, parameter shapes) in creation order, on data rank 0 (under the
  // distributed optimizer gathered from the shards, GatherBucketState); {} on the others.
  std::vector<WholeParameterState> GatherWholeState();

  // Writes root/step_<step>; `description` is stored in state.json under "run". Collective:
  // every rank calls it; the returned status is the write's on world rank 0 (pipeline and data
  // rank 0), Ok elsewhere.
  Status Save(const std::string& root, const nlohmann::json& description);
  // Restores this rank's weights and optimizer state, step and data position. The checkpoint's
  // model shape must equal this trainer's; its layout may differ. Every rank calls it.
  Status Load(const std::string& path);
  // Megatron-LM's --finetune: restores this rank's weights alone (the f32 masters and the values
  // from them) from any checkpoint, also a weights-only one (checkpoint_state.h); the optimizer
  // state, step and data position stay as a new trainer has them (fresh, 0, the start). Only the
  // fields that set parameter names and shapes must match (ShapeFields::kParameters). Every rank
  // calls it, before the first step.
  Status LoadWeights(const std::string& path);

  // For reference checks against another implementation: one forward and backward of the
  // first training micro-batch, written to dir/kReferenceCaseTensors (the f32 master weights
  // under their names, "grad.<name>" for each gradient of loss = mean cross-entropy + aux
  // losses, "ids", "targets", "loss", "aux_loss") and dir/kReferenceCaseConfig (the model shape
  // and hyper-parameters), replacing them. Changes no trainer state.
  Status DumpReferenceCase(const std::string& dir);

 private:
  Trainer(const GptConfig& config, const TrainerOptions& options, Device device,
          BatchSampler sampler, const ProcessGroups* groups, const LayerPartition& partition,
          RankActions train_actions);
  // Copies a (rows, seq + 1) window batch to the device as ids and targets (rows * seq).
  Microbatch Upload(const std::vector<int32_t>& windows, int64_t rows) const;
  // This rank's share of a global batch (samples), and its first sample in the step about to run.
  int64_t RankSamples() const;
  int64_t FirstSampleOfStep() const;
  // RankSamples() training windows from `first_sample` on.
  std::vector<int32_t> ReadWindows(int64_t first_sample) const;
  // The windows of the step about to run: those read ahead during the last step when they are
  // its samples (not after a checkpoint load, say), else read now.
  std::vector<int32_t> StepWindows();
  PipelineStepOptions StepOptions(bool training) const;
  bool whole_model() const;           // one chunk, first and last stage
  GptStage StageOf(int stage) const;  // of partition_
  // The replica groups' communicators: the data group, and the expert-data group (the data group
  // itself without expert parallelism).
  ReplicaCommunicators replica_groups() const {
    Communicator* expert_data = expert_parallel_.expert_data;
    return {data_, expert_data != nullptr ? expert_data : data_};
  }
  // The ranks each replica group's state is sharded over, or nullptr where it is whole.
  ReplicaCommunicators shard_groups() const;
  // Collective over the expert group (E > 1): the experts' whole state out of this rank's part of
  // each expert parameter in `state` (all of them gathered, rank order, ParameterSpec part rows).
  void GatherExperts(std::vector<WholeParameterState>& state);
  // Reads this rank's parameters' states (`state`, in parameters_ order; moments too unless
  // weights_only) from a checkpoint directory by name; a part of a bigger tensor through a
  // transient whole one whose rows it takes.
  StatusOr<nlohmann::json> LoadStates(const std::string& dir,
                                      const std::vector<WholeParameterState>& state,
                                      size_t first_parameter, bool weights_only, bool subset);
  // Later compute waits for the weights still being gathered (weight_gather_), if any.
  void WaitForWeights();
  Status LoadFrom(const std::string& path, bool weights_only);  // Load, LoadWeights
  // Load of a sharded state: bucket by bucket, the whole bucket read into transient buffers (the
  // moments left zero when weights_only).
  StatusOr<nlohmann::json> LoadShardedState(const std::string& dir, bool weights_only);
  nlohmann::json ModelConfig() const;  // the shape plus every numeric hyper-parameter

  GptConfig config_;
  TrainerOptions options_;
  Device device_;
  Communicator* pipeline_ = nullptr;  // nullptr: one stage
  Communicator* data_ = nullptr;      // nullptr: one replica
  // The expert and expert-data groups and the MoE layers' traffic; group nullptr: no expert
  // parallelism.
  ExpertParallel expert_parallel_;
  ParameterSet parameters_;
  LayerPartition partition_;
  std::vector<std::unique_ptr<GptModel>> chunks_;  // chunk c: stage c * pipeline size + rank
  // Chunk c's parameters are parameters_.all()[chunk_parameters_[c], chunk_parameters_[c + 1]).
  std::vector<size_t> chunk_parameters_;
  RankActions train_actions_;
  AdamW optimizer_;
  BatchSampler sampler_;
  std::unique_ptr<OffloadManager> offload_;
  // Under the distributed optimizer: the all-gather of each step's new weights, started at the
  // end of the step, waited for by the next forward layer by layer (or by WaitForWeights).
  std::unique_ptr<WeightGather> weight_gather_;
  std::unique_ptr<StepTimeline> timeline_;
  int64_t step_ = 0;
  // The next step's windows, read while the device ran the last step's AdamW; -1: none held.
  int64_t read_ahead_first_sample_ = -1;
  std::vector<int32_t> read_ahead_windows_;
};

}  // namespace moe
