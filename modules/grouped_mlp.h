// The experts' SwiGLU MLPs over tokens already permuted so each expert's rows are contiguous.
//   x (rows, hidden) permuted tokens; offsets (experts + 1) i32 row ranges per expert (device);
//   weights (rows) f32 routing probability of each row; y (rows, hidden).
//   fc1 (experts, 2 * ffn, hidden) rows [gate | up]; fc2 (experts, hidden, ffn), initialised with
//   std / sqrt(2 * num_layers).
//   y_e = fc2_e (silu(gate_e) * up_e * weight), gate_e | up_e = fc1_e x_e.
// Two implementations compute the same function, chosen by GptConfig::moe_grouped_mlp:
// unfused_grouped_mlp.h and fused_grouped_mlp.h. They differ in kernels and in what they save
// for backward (their headers say which offload groups).
// Backward: dx (=) and dweights (rows) f32 (=); expert weight grads +=. A backward that is not
// the step's last of this layer (last_of_step false) may leave its weight-gradient work to a later
// one (the fused path, GptConfig::moe_wgrad_micro_batches); the last completes every gradient.
//
// Expert parallelism (ExpertShard): this rank holds experts [first, first + count) of the model's,
// as rows [first, first + count) of the whole (num_experts, ...) weights (ParameterSpec part,
// replicated over the expert-data group), and a micro-batch brings its rows in `sources` segments,
// one per rank of the expert group, each run by its own Forward and BackwardSegment (saved apart,
// offsets relative to the segment), so every GEMM has the shape it has on the source rank without
// expert parallelism. On the CPU backend each source's weight gradients stay in a slot of their own
// until the step's last backward, which gathers every slot of the expert-data group (all D source
// ranks' partial gradients, in data-rank order) and sums them in that order into the gradient (=):
// the order and rounding of the data-parallel all-reduce they replace (communicator.h), so
// training is bit-identical to one expert-parallel rank, and the trainer does not reduce the
// experts' gradients again. On CUDA every segment adds into the gradient, which the expert-data
// group then reduces.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "engine/distributed/communicator.h"
#include "modules/gpt_config.h"

namespace moe {

// The experts a rank holds and how many row segments a micro-batch brings (see the top).
struct ExpertShard {
  int64_t first = 0;
  int64_t count = 0;  // 0: all of them (no expert parallelism)
  int sources = 1;
  Communicator* expert_data = nullptr;  // with sources > 1: the ranks holding the same experts
};

// Whether the grouped MLPs on `device` sum the experts' gradients over the expert-data group
// themselves (the CPU under expert parallelism, above): the trainer must not reduce them again.
bool ExpertGradsSummedByModule(Device device, bool expert_parallel);

// The rows a grouped MLP runs (its x, its dy): `values` itself, or with `index` (rows) i32 the
// rows values[index[r]], the MoE layer's permutation, which an implementation gathers (Gathered)
// or reads in place (the FP8 recipe quantises them where they lie).
struct PermutedRows {
  PermutedRows(const Tensor& values) : values(values) {}  // NOLINT: rows as they are
  PermutedRows(const Tensor& values, const Tensor& index) : values(values), index(index) {}
  int64_t rows() const { return index.defined() ? index.dim(0) : values.dim(0); }
  // The rows in memory: `values`, or a new (rows, values' width) tensor gathered from it.
  Tensor Gathered() const;

  Tensor values;
  Tensor index;
};

class GroupedMlp {
 public:
  struct Grads {
    Tensor dx;
    Tensor dweights;
  };
  // Creates the expert weights name.fc1.weight and name.fc2.weight (shapes above, `shard.count`
  // experts). Public so the implementations can inherit it (an inherited constructor keeps the
  // base's access).
  GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config, int layer,
             const ExpertShard& shard = {});
  virtual ~GroupedMlp() = default;
  // One segment's rows: x (rows, hidden), offsets (local experts + 1) from 0, weights (rows);
  // host_offsets: the same offsets as a CPU tensor where the caller has them (then never read
  // back from the device), else undefined.
  virtual Tensor Forward(SavedTensors& saved, const PermutedRows& x, const Tensor& offsets,
                         const Tensor& weights, int segment = 0,
                         const Tensor& host_offsets = Tensor()) = 0;
  // One segment's backward (dy (rows, hidden)), then, after a micro-batch's segments,
  // EndBackward.
  virtual Grads BackwardSegment(SavedTensors& saved, const PermutedRows& dy, int segment) = 0;
  virtual void EndBackward(bool last_of_step) = 0;
  // The one-segment case: BackwardSegment(saved, dy, 0), then EndBackward(last_of_step).
  Grads Backward(SavedTensors& saved, const PermutedRows& dy, bool last_of_step);

 protected:
  // The saved-tensor name of `what` (".x", ...) for `segment`.
  std::string Key(const char* what, int segment) const;
  // Where segment `segment`'s weight gradients of w (fc1_ or fc2_) go, and whether they add (true)
  // or store: w's gradient (BeginGradWrite), or on the CPU under expert parallelism the segment's
  // slot (see the top).
  struct GradTarget {
    Tensor grad;
    bool accumulate;
  };
  GradTarget WeightGradTarget(Parameter& w, int segment);
  // Whether weight gradients go to source slots (CPU, several sources).
  bool UsesGradSlots() const;
  // At the step's last backward: the slots' sum in rank order into the gradients (=). Nothing
  // without slots.
  void SumGradSlots();

  const ParameterSet& parameters_;  // whose values_version says when the weights changed
  const std::string name_;
  const GptConfig& config_;
  const int layer_;
  const ExpertShard shard_;
  Parameter& fc1_;  // (experts, 2 * ffn, hidden)
  Parameter& fc2_;  // (experts, hidden, ffn)

 private:
  struct Slots {
    Tensor all;                 // (sources, w's gradient's numel) in its dtype
    std::vector<Tensor> grads;  // by source: views of `all` in w's gradient's shape
    std::vector<bool> written;  // this step
  };
  // w's slots, allocated on first use.
  Slots& SlotsOf(const Parameter& w);
  Slots fc1_slots_, fc2_slots_;
};

std::unique_ptr<GroupedMlp> MakeGroupedMlp(ParameterSet& parameters, const std::string& name,
                                           const GptConfig& config, int layer,
                                           const ExpertShard& shard = {});

// Shared by the implementations.
// Expert e's matrix of a stacked (experts, out, in) tensor (p's value, grad, ...).
Tensor ExpertMatrix(const Parameter& p, const Tensor& stacked, int64_t expert);
// The offsets array on the host as a CPU tensor that forward saves so that backward needs no
// second read-back: `known` if defined, else read back (one synchronisation).
Tensor HostOffsets(const Tensor& offsets, const Tensor& known = Tensor());
// The values of such a host offsets tensor (none for an undefined tensor).
std::span<const int32_t> OffsetValues(const Tensor& host_offsets);

}  // namespace moe
