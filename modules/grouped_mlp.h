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
#pragma once

#include <memory>
#include <span>
#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "modules/gpt_config.h"

namespace moe {

class GroupedMlp {
 public:
  struct Grads {
    Tensor dx;
    Tensor dweights;
  };
  // Creates the expert weights name.fc1.weight and name.fc2.weight (shapes above). Public so the
  // implementations can inherit it (an inherited constructor keeps the base's access).
  GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config, int layer);
  virtual ~GroupedMlp() = default;
  virtual Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets,
                         const Tensor& weights) = 0;
  virtual Grads Backward(SavedTensors& saved, const Tensor& dy, bool last_of_step) = 0;

 protected:
  const std::string name_;
  const GptConfig& config_;
  const int layer_;
  Parameter& fc1_;  // (experts, 2 * ffn, hidden)
  Parameter& fc2_;  // (experts, hidden, ffn)
};

std::unique_ptr<GroupedMlp> MakeGroupedMlp(ParameterSet& parameters, const std::string& name,
                                           const GptConfig& config, int layer);

// Shared by the implementations.
// Expert e's matrix of a stacked (experts, out, in) tensor (p's value, grad, ...).
Tensor ExpertMatrix(const Parameter& p, const Tensor& stacked, int64_t expert);
// The offsets array read back to the host (one synchronisation), as a CPU tensor that forward
// saves so that backward needs no second read-back.
Tensor HostOffsets(const Tensor& offsets);
// The values of such a host offsets tensor (none for an undefined tensor).
std::span<const int32_t> OffsetValues(const Tensor& host_offsets);

}  // namespace moe
