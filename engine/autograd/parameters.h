// Parameters and their optimizer state.
//
// A Parameter has
//   value   what compute reads: bf16 on CUDA, f32 on the CPU (flagged is_parameter);
//   master  the f32 weights the optimizer updates (on the CPU the same tensor as value);
//   grad    f32, accumulated (+=) by backward over micro-batches, zeroed after each step.
//           Zeroing is lazy: ZeroGrads only marks grad_pending_zero, and the first backward
//           write after it stores (=) instead of adding, so a step's first micro-batch neither
//           clears nor reads the gradients (for the experts' f32 gradients that halves the
//           weight-gradient GEMMs' memory traffic). Code that writes or reads grad goes through
//           BeginGradWrite or MaterializedGrad below, never the tensor alone;
//   exp_avg, exp_avg_sq   AdamW moments, f32.
// Initial values are drawn on the host from (seed, name), in fixed chunks of 2^20 elements
// generated in parallel, so they depend neither on the order of creation, nor on the device,
// nor on the thread count: CPU and CUDA runs of one seed start from the same weights.
// Without optimizer state (benchmarks, evaluation) only value and grad exist.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace moe {

struct Parameter {
  std::string name;
  Tensor value;
  Tensor master;
  Tensor grad;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  bool weight_decay = true;
  bool grad_pending_zero = true;  // grad is zero, its memory not yet written (see above)
};

// Starts a backward op's write of p.grad (from here on grad counts as written, its pending zero
// cleared) and says how: true, add (+=); false (grad was pending zero), store (=) every element,
// groups without rows included.
bool BeginGradWrite(Parameter& p);
// p.grad with a pending zero written out: for ops that can only add, and for readers
// (gradient all-reduce, norm, optimizer, dumps).
const Tensor& MaterializedGrad(Parameter& p);

enum class Init { kNormal, kOnes, kZeros };

struct ParameterSpec {
  std::string name;
  Shape shape;
  Init init = Init::kNormal;
  float init_std = 0.02f;    // for kNormal
  bool weight_decay = true;  // false for norms
};

class ParameterSet {
 public:
  // `compute_dtype` is the dtype of Parameter::value (f32 or bf16).
  ParameterSet(Device device, DType compute_dtype, uint64_t seed, bool optimizer_state = true);
  // A set that only records what is created: its parameters have a name and no tensors (to
  // list a model's parameter specs without memory; modules must not read tensors while built).
  static ParameterSet SpecsOnly();

  Parameter& Create(const ParameterSpec& spec);
  const std::vector<std::unique_ptr<Parameter>>& all() const { return parameters_; }
  const std::vector<ParameterSpec>& specs() const { return specs_; }  // in creation order
  Parameter& Get(const std::string& name);
  int64_t NumElements() const;

  // grad = 0 for every parameter (lazily: marks grad_pending_zero).
  void ZeroGrads();
  // value = master (after loading master weights from a checkpoint).
  void SyncValuesFromMasters();

  Device device() const { return device_; }
  DType compute_dtype() const { return compute_dtype_; }

 private:
  Device device_;
  DType compute_dtype_;
  uint64_t seed_;
  bool optimizer_state_;
  bool allocate_ = true;
  std::vector<std::unique_ptr<Parameter>> parameters_;
  std::vector<ParameterSpec> specs_;
};

}  // namespace moe
