// The experts' SwiGLU MLPs over tokens already permuted so each expert's rows are contiguous.
//   x (rows, hidden) permuted tokens; offsets (experts + 1) i32 row ranges per expert;
//   weights (rows) f32 routing probability of each row; y (rows, hidden).
//   fc1 (experts, 2 * ffn, hidden) rows [gate | up]; fc2 (experts, hidden, ffn), initialised with
//   std / sqrt(2 * num_layers).
//   y_e = fc2_e (silu(gate_e) * up_e * weight), gate_e | up_e = fc1_e x_e.
// Unfused implementation: per-expert GEMMs for fc1, one activation kernel over all rows,
// per-expert GEMMs for fc2 (the expert row counts are read back to the host once per call).
// Saves: fc1's input x in group expert_fc1 (committed after fc1); the activation inputs h and
// weights in group moe_act (committed after fc2); offsets outside any group. fc2's input is
// recomputed from h in backward.
// Backward: dx (=) and dweights (rows) f32 (=); expert weight grads +=.
#pragma once

#include <string>
#include <vector>

#include "engine/autograd/saved_tensors.h"
#include "engine/optim/parameters.h"
#include "modules/gpt_config.h"

namespace moe {

class GroupedMlp {
 public:
  GroupedMlp(ParameterSet& parameters, const std::string& name, const GptConfig& config, int layer);
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& offsets, const Tensor& weights);
  struct Grads {
    Tensor dx;
    Tensor dweights;
  };
  Grads Backward(SavedTensors& saved, const Tensor& dy);

 private:
  // Row ranges per expert, on the host.
  std::vector<int32_t> HostOffsets(const Tensor& offsets) const;
  Tensor ExpertWeight(const Parameter& p, const Tensor& t, int64_t expert) const;

  std::string name_;
  const GptConfig& config_;
  int layer_;
  Parameter& fc1_;
  Parameter& fc2_;
};

}  // namespace moe
