// Mixture-of-Experts MLP: route, permute, run the experts, unpermute and sum over the top-k.
//   x (tokens, hidden) -> y (tokens, hidden); dropless (every choice is computed).
// Permutation: the (tokens, k) choices sorted stably by expert; row i of the permuted batch is
// token source_rows[i] = order[i] / k, and choice (t, j) lands at row inverse[t * k + j]. The
// experts take x and the output gradient as PermutedRows (grouped_mlp.h): the bf16 paths gather
// them, the FP8 recipe quantises them where they lie.
// Saves (no group): source_rows and inverse; the router and the grouped MLP save their own.
// With config.recompute_in(layer).moe the layer saves only its input x: forward runs without
// saving, and backward first runs forward again from x (into a context of its own, aux loss
// discarded), then backward through it: the same kernels on the same input, so the same bits.
// Backward: dx =; returns nothing else (router and expert weight grads +=; with last_of_step
// false the experts' may wait for a later backward: grouped_mlp.h).
//
// Expert parallelism (an expert group of E > 1 ranks, engine/distributed/process_groups.h): the
// rank holds experts [rank * L, (rank + 1) * L), L = num_experts / E (grouped_mlp.h ExpertShard).
// After routing, the permuted rows and their routing weights go to the ranks that own their
// experts (the per-expert counts gathered first, ExpertRoute; then one all-to-all of variable
// sizes, AllToAllRows), the experts run once per source rank's rows, and a second all-to-all brings
// the outputs back into this rank's permuted order; backward mirrors both (the output gradients
// out, the input and weight gradients back); each exchange is the step's expert-parallel wait and a
// span on the expert-parallel comm track, and the layer adds its rows and bytes to the traffic.
// Bytes a rank sends per micro-batch, r rows leaving it for other ranks (r = tokens x top-k x
// (E - 1) / E under even routing), b bytes per activation element: forward r (hidden b + 4) out
// and r hidden b back; backward r hidden b out and r (hidden b + 4) back.
// Saves in addition: the route's counts (a CPU tensor).
// Everything before the first and after the second exchange is this rank's alone (the router and
// its load-balancing loss over the rank's own tokens, as Megatron-LM's default aux loss counts
// them), so losses and gradients are those of one expert-parallel rank (bit for bit on the CPU).
#pragma once

#include <span>
#include <string>

#include "engine/autograd/parameters.h"
#include "engine/autograd/saved_tensors.h"
#include "engine/distributed/all_to_all.h"
#include "modules/expert_parallel.h"
#include "modules/gpt_config.h"
#include "modules/grouped_mlp.h"
#include "modules/router.h"

namespace moe {

class MoeLayer {
 public:
  // expert_parallel: nullptr, or the expert group (E > 1 ranks; E divides num_experts) and the
  // traffic the layer adds to.
  MoeLayer(ParameterSet& parameters, const std::string& name, const GptConfig& config, int layer,
           ExpertParallel* expert_parallel = nullptr);
  // Returns y; adds the coefficient-weighted aux loss to `aux_loss` (1) f32.
  Tensor Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss);
  Tensor Backward(SavedTensors& saved, const Tensor& dy, float aux_grad, bool last_of_step = true);

 private:
  Tensor ForwardSaving(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss);
  Tensor BackwardSaved(SavedTensors& saved, const Tensor& dy, float aux_grad, bool last_of_step);
  // The experts over the permuted rows (rows, hidden: the tokens' rows source_rows[r], which the
  // experts on this rank read in place, and the exchange through the expert group gathers) with
  // their offsets (device) and weights (rows) f32: on this rank, or through the expert group.
  // Returns their output (rows, hidden). Backward likewise, from the output's gradient's rows.
  Tensor ExpertsForward(SavedTensors& saved, const PermutedRows& permuted, const Tensor& offsets,
                        const Tensor& weights);
  GroupedMlp::Grads ExpertsBackward(SavedTensors& saved, const PermutedRows& dexpert_out,
                                    bool last_of_step);
  // One all-to-all of the exchange (`what`: its trace name), in the step's expert-parallel wait.
  void Exchange(const char* what, std::span<const RowExchange> tensors,
                std::span<const int64_t> send_offsets, std::span<const int64_t> recv_offsets);

  std::string name_;
  const GptConfig& config_;
  const int layer_;                  // config_.recompute_in(layer_).moe, read at run time
  ExpertParallel* expert_parallel_;  // nullptr: no expert parallelism
  Router router_;
  std::unique_ptr<GroupedMlp> experts_;
};

}  // namespace moe
