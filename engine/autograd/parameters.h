// Parameters and their optimizer state.
//
// A Parameter has
//   value   what compute reads: bf16 on CUDA, f32 on the CPU (flagged is_parameter);
//   master  the f32 weights the optimizer updates (on the CPU the same tensor as value);
//   grad    f32 or bf16 (OptimizerDTypes::grad), accumulated (+=) by backward over
//           micro-batches, zeroed after each step.
//           Zeroing is lazy: ZeroGrads only marks grad_pending_zero, and the first backward
//           write after it stores (=) instead of adding, so a step's first micro-batch neither
//           clears nor reads the gradients (for the experts' f32 gradients that halves the
//           weight-gradient GEMMs' memory traffic). bf16 gradients are added in f32 and rounded
//           at every write (each op's own accumulation stays f32). Code that writes or reads grad
//           goes through BeginGradWrite or MaterializedGrad below, never the tensor alone;
//   exp_avg, exp_avg_sq   AdamW moments, f32 or bf16 each (OptimizerDTypes).
// Initial values are drawn on the host from (seed, name), in fixed chunks of 2^20 elements
// generated in parallel, so they depend neither on the order of creation, nor on the device,
// nor on the thread count: CPU and CUDA runs of one seed start from the same weights. A
// parameter that is part of a bigger tensor (ParameterSpec::whole_shape: a rank's experts out of
// all of them) starts from exactly those elements of the whole's initial values, bit for bit. They
// reach the device through one reused 64 MiB host buffer, whatever the model's size. Without
// optimizer state (benchmarks, evaluation) only value and grad exist.
//
// Stacks (CreateStack): 2-D parameters with equal columns laid out back to back as the row blocks
// of one matrix of each kind, so that one GEMM can use them as one weight; each stays a Parameter
// of its own (name, initial values, checkpoint entry), and the optimizer updates a stack as one
// unit (OwnedSlices).
//
// Storage. A plain set allocates each parameter's (or stack's) tensors in Create (CreateStack),
// one buffer per kind of which the parameters' tensors are views. A deferred set (the
// trainer's) only records them in Create; AllocateBuckets then lays the parameters out in
// buckets (parameter_buckets.h): per bucket one value buffer and one gradient buffer of which
// the parameters' value and grad are views, and the optimizer state of the part of the bucket
// this rank owns: master, exp_avg, exp_avg_sq of shard_numel elements (on the CPU the master is
// the owned rows of the value buffer, as value is master). Each bucket holds parameters of one
// replica group (replica_group.h) and is sharded over that group's ranks (BucketSharding). With
// one shard a rank owns the bucket whole and each parameter's master and moments are views of
// the bucket's. Sharded over `shards` ranks (the distributed optimizer), a rank holds the state of
// its 1/shards of the bucket only: its parameters' exp_avg and exp_avg_sq are undefined, and so
// is master on CUDA (on the CPU master stays value); OwnedSlices lists what the rank updates.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/autograd/parameter_buckets.h"
#include "engine/core/tensor.h"

namespace moe {

// The storage dtypes of the gradients and the AdamW moments, f32 or bf16 each (Megatron-LM's
// precision-aware optimizer: --main_grads_dtype, --exp_avg_dtype, --exp_avg_sq_dtype). bf16
// halves their memory and the traffic of every pass over them (the weight-gradient GEMMs'
// output, the gradient all-reduce, the norm, the optimizer); all arithmetic stays f32
// (ops::AdamWUpdate, the weight-gradient ops), each bf16 store rounded to nearest.
struct OptimizerDTypes {
  DType grad = DType::kF32;
  DType exp_avg = DType::kF32;
  DType exp_avg_sq = DType::kF32;
  int64_t grad_bytes() const { return static_cast<int64_t>(DTypeSize(grad)); }
  int64_t moment_bytes() const {
    return static_cast<int64_t>(DTypeSize(exp_avg) + DTypeSize(exp_avg_sq));
  }
};

// One of those dtypes by the name the flags use: "fp32" or "bf16"; nullopt for any other name.
inline constexpr const char* kOptimizerDTypeNames = "fp32 or bf16";
std::optional<DType> OptimizerDTypeFromName(const std::string& name);

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

// A stack: 2-D parameters with the same number of columns whose rows lie back to back, in
// creation order, in one matrix of each kind (value, grad, and master and moments where the set
// holds them), so that one GEMM can use them as one weight (say the Q, K and V projections).
// Each member stays a Parameter of its own: its name, initial values and checkpoint entry are
// those it would have if created alone.
struct ParameterStack {
  std::vector<Parameter*> members;  // row order = creation order
  Tensor value;  // (rows of all members, cols): the members' values as one matrix
  Tensor grad;   // likewise their gradients
};

// Starts a backward op's write of the whole stack's grad: BeginGradWrite of every member (they
// must agree, CHECKed) and returns it.
bool BeginGradWrite(ParameterStack& stack);

enum class Init { kNormal, kOnes, kZeros };

struct ParameterSpec {
  std::string name;
  Shape shape;
  Init init = Init::kNormal;
  float init_std = 0.02f;    // for kNormal
  bool weight_decay = true;  // false for norms
  ReplicaGroup replicas = ReplicaGroup::kData;
  // A part of a bigger tensor: rows [first_row, first_row + shape[0]) of a tensor of whole_shape
  // (the same trailing dimensions), whose initial values it starts from. Empty: the parameter is
  // whole (first_row 0).
  Shape whole_shape = {};
  int64_t first_row = 0;

  // The tensor the parameter is (part of): whole_shape, or shape.
  const Shape& WholeShape() const { return whole_shape.empty() ? shape : whole_shape; }
};

// A bucket of a deferred set after AllocateBuckets (see the top).
struct ParameterBucket {
  BucketLayout layout;
  int shard = 0;  // this rank's part of the buffers
  Tensor value;   // (numel) compute dtype: the parameters' values are views of it
  Tensor grad;    // (numel) OptimizerDTypes::grad: the parameters' gradients are views of it;
                  // padding 0
  Tensor master, exp_avg, exp_avg_sq;  // (shard_numel) f32, moments': the owned elements' state

  int64_t owned_begin() const { return layout.shard_begin(shard); }
  int64_t owned_end() const { return owned_begin() + layout.shard_numel(); }
};

// What this rank's optimizer updates of one parameter, or of one stack as a whole: all of it, or
// under a sharded state the elements inside its bucket's owned part. Every tensor is a 1-D view of
// the same elements.
struct OwnedSlice {
  Parameter* parameter = nullptr;  // the first parameter with elements in the slice
  // How many consecutive parameters (creation order) have elements in it: more than one only for
  // a stack's members.
  int parameters = 1;
  ReplicaGroup replicas = ReplicaGroup::kData;  // the parameters'
  Tensor master, grad, exp_avg, exp_avg_sq;
  Tensor value;  // the compute copy of the same elements (on the CPU the master itself)
};

// A parameter's optimizer state whole, as one process holds it (checkpoints): its shape, the
// master f32, the moments in the set's OptimizerDTypes.
struct WholeParameterState {
  std::string name;
  Tensor master, exp_avg, exp_avg_sq;
};

// One bucket's state whole: (numel) buffers laid out as the bucket's (master f32, moments in the
// set's OptimizerDTypes), padding included, and its parameters' views of them in creation order.
struct WholeBucketState {
  Tensor master, exp_avg, exp_avg_sq;
  std::vector<WholeParameterState> parameters;
};

class ParameterSet {
 public:
  // `compute_dtype` is the dtype of Parameter::value (f32 or bf16).
  ParameterSet(Device device, DType compute_dtype, uint64_t seed, bool optimizer_state = true,
               OptimizerDTypes dtypes = {});
  // A set that only records what is created: its parameters have a name and no tensors (to
  // list a model's parameter specs without memory; modules must not read tensors while built).
  static ParameterSet SpecsOnly();
  // A set with optimizer state whose tensors exist from AllocateBuckets on (see the top).
  static ParameterSet Deferred(Device device, DType compute_dtype, uint64_t seed,
                               OptimizerDTypes dtypes = {});

  Parameter& Create(const ParameterSpec& spec);
  // Creates `specs` (>= 1; each 2-D, equal columns, equal weight_decay and replicas; CHECKed) as
  // consecutive parameters laid out as one stack (above). The reference stays valid for the set's
  // lifetime.
  // Plain sets allocate the stack at once; a deferred set sets value and grad in AllocateBuckets;
  // a SpecsOnly set leaves them undefined.
  ParameterStack& CreateStack(std::span<const ParameterSpec> specs);
  const std::vector<std::unique_ptr<Parameter>>& all() const { return parameters_; }
  const std::vector<ParameterSpec>& specs() const { return specs_; }  // in creation order
  Parameter& Get(const std::string& name);
  int64_t NumElements() const;

  // grad = 0 for every parameter (lazily: marks grad_pending_zero).
  void ZeroGrads();
  // value = master (after loading master weights from a checkpoint). Not under a sharded state.
  void SyncValuesFromMasters();

  // Deferred sets, once every parameter is created: allocates and initialises the buckets that
  // PlanBuckets plans for the parameters and their stacks (their replica groups, the sharding's
  // shard counts, bucket_bytes), this rank owning part sharding[group].shard of each bucket of
  // that group, and sets the stacks' value and grad.
  void AllocateBuckets(const BucketSharding& sharding, int64_t bucket_bytes);
  // In backward order; empty for a plain set.
  const std::vector<ParameterBucket>& buckets() const { return buckets_; }
  // The ranks of `group` that its buckets' optimizer state is sharded over (1: this rank holds
  // all of it; always 1 for a plain set).
  int shards(ReplicaGroup group) const { return sharding_[group].shards; }
  // Bucket b's whole state: new zeroed buffers (e.g. to load a checkpoint or gather shards into).
  WholeBucketState NewWholeBucketState(size_t b) const;
  // A new whole state of `shape` in this set's dtypes (f32 master, optimizer_dtypes()), not
  // initialised (e.g. to receive another rank's parameter into).
  WholeParameterState NewWholeState(const std::string& name, const Shape& shape) const;
  // Bucket b's state = this rank's part of `whole`, and its values = the whole masters (all of
  // the bucket, in the compute dtype).
  void AssignBucketState(size_t b, const WholeBucketState& whole);
  // What this rank updates: every parameter (a stack as one slice) in creation order, or for a
  // bucketed set bucket by bucket (backward order), each bucket's parameters in creation order,
  // empty parts left out.
  std::vector<OwnedSlice> OwnedSlices() const;

  // A count of the writes to the parameters' values: the optimizer's update, a checkpoint's
  // weights (SyncValuesFromMasters, AssignBucketState). What is derived from the values (the
  // FP8 recipe's quantised weights) is current while the count it was made at is.
  uint64_t values_version() const { return values_version_; }
  void MarkValuesChanged() { ++values_version_; }

  Device device() const { return device_; }
  DType compute_dtype() const { return compute_dtype_; }
  const OptimizerDTypes& optimizer_dtypes() const { return dtypes_; }

 private:
  Device device_;
  DType compute_dtype_;
  uint64_t seed_;
  bool optimizer_state_;
  OptimizerDTypes dtypes_;
  enum class Storage { kPerParameter, kSpecsOnly, kDeferred };
  Storage storage_ = Storage::kPerParameter;
  std::vector<std::unique_ptr<Parameter>> parameters_;
  std::vector<ParameterSpec> specs_;
  std::vector<ParameterBucket> buckets_;
  BucketSharding sharding_;  // AllocateBuckets'
  std::vector<std::unique_ptr<ParameterStack>> stacks_;
  std::vector<ParameterStack*> stack_of_;  // by creation index; nullptr: created alone
  std::vector<OwnedSlice> plain_slices_;   // a plain set's OwnedSlices: one per Create(Stack)
  uint64_t values_version_ = 0;

  // Records `specs` as the next parameters, the members of `stack` (nullptr: one parameter created
  // alone), and in a plain set allocates them (see the top).
  void Add(std::span<const ParameterSpec> specs, ParameterStack* stack);
  // The end of the parameters laid out as one with parameter `first`: its stack's, or first + 1.
  size_t StackEnd(size_t first) const;
};

}  // namespace moe
