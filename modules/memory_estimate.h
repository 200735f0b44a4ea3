// How much device memory a training run needs: the figures moe_train checks against the device
// at start (and a memory planner can reuse). All in bytes, as doubles (the products of absurd
// flag values overflow int64; a double only rounds).
//
// What it counts, for the busiest pipeline rank (one replica; data parallelism does not change
// a rank's memory, expert parallelism does):
// - State: per parameter StateBytesPerParameter: f32 master + f32 gradient + two AdamW moments
//   (16 bytes with f32 moments, 12 with bf16); on CUDA also the bf16 copy compute reads (18); under
//   the distributed optimizer the master (CUDA) and moments count 1 / state_shards. The rank's
//   parameters are those of its layers plus the embedding (first stage) and the head and final norm
//   (last stage); with one stage, all of them (GptConfig::total_parameters, recomputed in doubles).
// - Expert parallelism over E ranks (expert_parallel): each MoE layer's experts (their fc1 and
//   fc2, GptConfig::expert_parameters each) count 1 / E on a rank (RankParameters::expert), and
//   under the distributed optimizer their master and moments are sharded over the expert-data
//   group, state_shards / E ranks (RankStateBytes); the router, attention, norms, embedding and
//   head are unchanged. On the CPU backend with E > 1 the experts' gradients also have one slot per
//   source rank (E more copies: modules/grouped_mlp.h; not counted: the transient gather of one
//   weight's D partial gradients at a layer's last backward).
// - Activations: the tensors forward saves for backward, per layer per micro-batch
//   (ActivationBytesPerLayer, in compute bytes: 4 on the CPU, 2 on CUDA; routing tensors f32/i32),
//   less what GptConfig::recompute drops: attention: norm input, its input (the norm output),
//   the query and key norms' inputs and rstd (where it has them), q, k, v, output,
//   log-sum-exp; dense MLP: norm input, input, fc1 output; MoE: norm input, router
//   input, logits and probabilities, permuted rows, fc1 output per routed row (tokens x top-k)
//   and, on the fused path, the activation, routing indices and weights. The embedding and
//   head (HeadActivationBytes): ids, the final norm's input and rstd, and the head's input
//   gradient (the head runs its backward in its forward: modules/lm_head_loss.h).
//   Micro-batches in flight: 1 without a pipeline (forward then backward per micro-batch),
//   min(p, m) on 1F1B's first rank, min(2(p - 1) + (v - 1)p + 1, v m) chunk passes on the
//   interleaved first rank (engine/pipeline/schedule.h).
// - The expert side under E > 1: the rows a rank's experts receive vary with the routing, step by
//   step and rank by rank, around tokens x top-k per micro-batch (their mean). What the grouped MLP
//   saves per received row (its input, fc1 output, activation, the rows' weights), the weight-
//   gradient operands it holds and one layer's backward count kExpertRowsMargin times the mean
//   (ExpertRows). The margin covers the 99th percentile of the rows one rank received in one layer
//   per micro-batch training moe_train's default model with E = 2 and 4 (the distribution:
//   tests/results/memory_and_offload.md, "Expert parallelism: rows per rank";
//   tests/modules/expert_memory_mpi_test.cc checks it), not the rare larger ones: a micro-batch
//   above it is not an error (the allocator still works); only memory truly running out is (its
//   one-line message).
// - Workspace: what is allocated beside the saved tensors at the peak, the larger of: the head's
//   forward (HeadForwardWorkspace: its input, one chunk of logits, losses and lse), and one
//   layer's backward, its gradients of its saved tensors (as large as its activations without
//   recompute: a recomputed layer holds them all again while its backward runs).
// How close the count comes to the allocator's measured peak on a GPU, with and without
// recompute, and what the chunked head changed: tests/results/memory_and_offload.md.
// - Pending weight-gradient operands (PendingWeightGradBytes), counted with the activations:
//   every MoE layer of the rank holds them from its backward of one micro-batch to a later one.
// - No other margin, and no offloading: with --offload_modules the activations are an upper bound.
// - Not counted: each model chunk's RoPE table (RopeTableBytes; 2 MiB at sequence 4096 and head
//   dim 128), which the memory planner counts.
// The counted bytes were 1.03-1.25x the allocator's measured peak on CPU runs
// of the tiny shapes (micro-batches 4 to 64; tests/modules/memory_estimate_test.cc checks that
// they lie within [1, 2]x) without recompute. With recompute it can fall below the CPU's peak: a
// recomputed layer's backward holds its re-run's dropped tensors beside the gradients the
// workspace counts (tests/results/memory_and_offload.md has the figures, CPU and GPU). It is meant
// to refuse runs that cannot fit, not to predict peaks to the megabyte; CUDA peaks are not checked
// by a test here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "modules/gpt_config.h"

namespace moe {

struct MemoryEstimateOptions {
  GptConfig model;
  int64_t micro_batch_size = 1;
  int64_t micro_batches = 1;  // per optimizer step on one replica (accumulation steps)
  int64_t pipeline_parallel = 1;
  int64_t virtual_pipeline = 1;
  int64_t first_stage_layers = -1;  // -1: even split
  int64_t last_stage_layers = -1;
  bool cuda = false;
  // The distributed optimizer: master weights and AdamW moments sharded over this many data
  // ranks (1: every rank holds them whole); the experts' over state_shards / expert_parallel.
  int64_t state_shards = 1;
  // Expert parallelism: each MoE layer's experts split over this many ranks (divides num_experts).
  int64_t expert_parallel = 1;
  OptimizerDTypes dtypes;  // of the gradients and the AdamW moments
};

struct MemoryEstimate {
  double parameters = 0;        // on the busiest rank
  double state_bytes = 0;       // weights, gradients, optimizer state
  double activation_bytes = 0;  // saved for backward, every micro-batch in flight
  double workspace_bytes = 0;   // transient: the head's forward or a layer's backward
  double total_bytes = 0;       // the sum of the three
};

// The expert rows a rank plans for under E > 1, as a multiple of their mean (the header's top).
inline constexpr double kExpertRowsMargin = 1.35;

// Bytes of one activation element: bf16 on CUDA, f32 on the CPU.
double ComputeBytes(bool cuda);
// The rows one rank's experts run per micro-batch in one MoE layer: tokens x top-k, times
// kExpertRowsMargin under expert parallelism (E > 1), rounded up to whole rows.
double ExpertRows(const GptConfig& model, int64_t micro_batch_size, int64_t expert_parallel);
// The bytes of `rows` rows of width k in both tile forms of the FP8 recipe (column tiles over the
// experts a rank holds, with their alignment, and row tiles; e4m3 values and f32 scales).
double Fp8TileFormsBytes(const GptConfig& model, int64_t expert_parallel, double rows, int64_t k);
// Bytes of weights, gradient and optimizer state per parameter on a rank whose master weights and
// moments are one of `state_shards` shards (the rest is whole on every rank), gradient and moments
// in `dtypes`: CUDA 2 + grad + (4 + moments) / shards (bf16 value; f32 master and the moments),
// CPU 4 + grad + moments / shards (the f32 value is the master). One shard, all f32: 18 and 16;
// bf16 gradient and moments on CUDA: 12. Bucket padding aside.
double StateBytesPerParameter(bool cuda, int64_t state_shards, const OptimizerDTypes& dtypes);
// A rank's parameters by the group their state is sharded over.
struct RankParameters {
  double dense = 0;   // everything but the experts: replicated over the data group
  double expert = 0;  // the rank's experts (fc1, fc2): replicated over the expert-data group
  double total() const { return dense + expert; }
  RankParameters& operator+=(const RankParameters& other) {
    dense += other.dense;
    expert += other.expert;
    return *this;
  }
};
// The parameters of one transformer layer (dense or MoE) on one rank: a MoE layer's experts
// 1 / options.expert_parallel of them.
RankParameters LayerParameters(const MemoryEstimateOptions& options, bool moe_layer);
// A rank's weights (the copy compute reads), gradients and optimizer state (AdamW moments, on
// CUDA also the f32 master weights): StateBytesPerParameter per dense parameter with
// options.state_shards, per expert parameter with max(1, state_shards / expert_parallel), plus the
// CPU's gradient slots per source rank (the top). Under the FP8 recipe the weights also count the
// experts' quantised forms (2 bytes a parameter, both orientations, and their block scales).
struct StateBytes {
  double weights = 0, gradients = 0, optimizer = 0;
  double total() const { return weights + gradients + optimizer; }
};
StateBytes RankStateBytes(const MemoryEstimateOptions& options, const RankParameters& parameters);
// What a model chunk keeps on the device beside its parameters for the whole run: its layers'
// shared RoPE table, seq_length x head_dim/2 {cos, sin} f32 pairs (modules/attention.h).
double RopeTableBytes(const GptConfig& model);
// One device tensor that forward saves for backward: its bytes and the offload group that holds
// it (offload_groups.h; "" when none). What a layer saves depends on what it recomputes.
struct SavedTensorSize {
  std::string group;
  double bytes = 0;
};
// What one layer saves for one micro-batch when it recomputes `recompute`, tensor by tensor
// (the one home of these sizes; ActivationBytesPerLayer is their sum); the grouped MLP's per
// ExpertRows. Host tensors (the grouped MLP's host offsets, the exchange's counts) are not listed.
std::vector<SavedTensorSize> LayerSaves(const GptConfig& model, int64_t micro_batch_size,
                                        int64_t expert_parallel, bool moe_layer, bool cuda,
                                        const RecomputeModules& recompute);
// What the first stage (embedding: ids) and the last (final norm, head, loss) save.
std::vector<SavedTensorSize> EmbeddingSaves(const GptConfig& model, int64_t micro_batch_size);
std::vector<SavedTensorSize> HeadSaves(const GptConfig& model, int64_t micro_batch_size, bool cuda);
// The bytes of each tensor the last stage's training forward holds at the head beside what it
// saves: the head's input (the final norm's output), one chunk of logits (HeadChunkRows), the
// per-token losses and log-sum-exp.
std::vector<double> HeadForwardWorkspace(const GptConfig& model, int64_t micro_batch_size,
                                         bool cuda);
// Saved activations of one layer for one micro-batch (with model.recompute).
double ActivationBytesPerLayer(const GptConfig& model, int64_t micro_batch_size,
                               int64_t expert_parallel, bool moe_layer, bool cuda);
// Saved activations of the embedding, final norm, head and loss for one micro-batch.
double HeadActivationBytes(const GptConfig& model, int64_t micro_batch_size, bool cuda);
// What `moe_layers` fused MoE layers hold through a step, beside their saved activations, while
// they wait to add weight gradients (GptConfig::moe_wgrad_micro_batches, fused_grouped_mlp.h):
// min(that, micro_batches) - 1 earlier micro-batches' operands per layer, ExpertRows x (2 hidden
// + 3 moe_ffn) elements each (fc2's dy and a, fc1's dh and x; all four as FP8 column tiles under
// the recipe). 0 on the unfused path.
double PendingWeightGradBytes(const GptConfig& model, int64_t micro_batch_size,
                              int64_t expert_parallel, int64_t micro_batches, double moe_layers,
                              bool cuda);

MemoryEstimate EstimateTrainingMemory(const MemoryEstimateOptions& options);

}  // namespace moe
