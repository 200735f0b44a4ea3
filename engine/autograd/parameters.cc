#include "engine/autograd/parameters.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include <glog/logging.h>

#include "engine/core/random.h"
#include "engine/kernels/ops.h"

namespace moe {

namespace {

constexpr int64_t kInitChunk = int64_t{1} << 20;

// Fills `out` with the initial values of elements [first, first + out.size()) of the flattened
// whole tensor that parameter `spec` is (part of): chunk c of 2^20 elements of the whole is drawn
// from its own stream (seed, name, c), so chunks can be generated in any order on any thread, and
// only the chunks that `out` meets are (the draws before `first` in its chunk skipped).
void InitialValues(const ParameterSpec& spec, uint64_t seed, int64_t first, std::span<float> out) {
  if (spec.init != Init::kNormal) {
    std::fill(out.begin(), out.end(), spec.init == Init::kOnes ? 1.0f : 0.0f);
    return;
  }
  const int64_t end = first + static_cast<int64_t>(out.size());
  const int64_t first_chunk = first / kInitChunk;
  const size_t chunks = static_cast<size_t>((end + kInitChunk - 1) / kInitChunk - first_chunk);
  const uint64_t stream = StableHash(spec.name);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) {
      const int64_t chunk = first_chunk + static_cast<int64_t>(c);
      Rng rng(seed, stream + kSplitMix64Gamma * static_cast<uint64_t>(chunk));
      const int64_t begin = std::max(first, chunk * kInitChunk);
      rng.SkipNormals(static_cast<uint64_t>(begin - chunk * kInitChunk));
      for (int64_t i = begin; i < std::min(end, (chunk + 1) * kInitChunk); ++i) {
        out[static_cast<size_t>(i - first)] = static_cast<float>(rng.Normal() * spec.init_std);
      }
    }
  };
  const size_t threads =
      std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& thread : pool) thread.join();
}

// Writes parameters' initial values into f32 tensors on any device through one host buffer of
// at most kPiece elements, reused: the host never holds a whole parameter set (the
// DeepSeek-V3-like expert weights are 45 GB in f32), and the buffer's pages are first-touched
// once. (Drawing a whole set into one host buffer first-touched every page of it, which took
// longer than a benchmark's timed passes: tests/results/moe_block.md.)
class InitialValueWriter {
 public:
  explicit InitialValueWriter(uint64_t seed) : seed_(seed) {}

  // dst: f32, spec's element count (any shape).
  void Write(const ParameterSpec& spec, const Tensor& dst) {
    CHECK(dst.dtype() == DType::kF32) << spec.name << ": initial values are written in f32";
    const int64_t numel = dst.numel();
    CHECK_EQ(numel, moe::NumElements(spec.shape)) << spec.name;
    const Tensor flat = dst.View({numel});
    // Where the parameter begins in its whole tensor, flattened.
    const int64_t offset = spec.first_row == 0 ? 0 : spec.first_row * (numel / spec.shape[0]);
    for (int64_t begin = 0; begin < numel; begin += kPiece) {
      const int64_t end = std::min(numel, begin + kPiece);
      float* host = Buffer(end - begin);
      InitialValues(spec, seed_, offset + begin, std::span(host, static_cast<size_t>(end - begin)));
      ops::CopyFromHost(host, flat.Rows(begin, end));  // synchronous: the buffer is free again
    }
  }

 private:
  static constexpr int64_t kPiece = 16 * kInitChunk;  // 64 MiB of f32

  // Room for `numel` values, not zeroed (InitialValues writes every element, on its threads,
  // which then also take the pages' first touch).
  float* Buffer(int64_t numel) {
    if (numel > capacity_) {
      host_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(numel));
      capacity_ = numel;
    }
    return host_.get();
  }

  uint64_t seed_;
  std::unique_ptr<float[]> host_;
  int64_t capacity_ = 0;
};

// Elements [offset, offset + |shape|) of the 1-D `buffer`, viewed as `shape`: a parameter's
// place in a bucket buffer.
Tensor ParameterView(const Tensor& buffer, int64_t offset, const Shape& shape) {
  return buffer.Rows(offset, offset + moe::NumElements(shape)).View(shape);
}

// CHECKs that `spec` is whole, or rows of its whole_shape (ParameterSpec).
void CheckPart(const ParameterSpec& spec) {
  if (spec.whole_shape.empty()) {
    CHECK_EQ(spec.first_row, 0) << spec.name << ": rows of no whole tensor";
    return;
  }
  const Shape& whole = spec.whole_shape;
  CHECK_EQ(spec.shape.size(), whole.size()) << spec.name << ": a part of another rank";
  CHECK(!whole.empty());
  CHECK(std::equal(spec.shape.begin() + 1, spec.shape.end(), whole.begin() + 1))
      << spec.name << ": a part's trailing dimensions differ from its whole's";
  CHECK(spec.first_row >= 0 && spec.first_row + spec.shape[0] <= whole[0])
      << spec.name << ": rows [" << spec.first_row << ", " << spec.first_row + spec.shape[0]
      << ") of a whole of " << whole[0];
}

// The matrix that a stack of `specs` forms: their rows, their columns.
Shape StackShape(std::span<const ParameterSpec> specs) {
  int64_t rows = 0;
  for (const ParameterSpec& spec : specs) rows += spec.shape[0];
  return {rows, specs.front().shape[1]};
}

}  // namespace

std::optional<DType> OptimizerDTypeFromName(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  return std::nullopt;
}

ParameterSet::ParameterSet(Device device, DType compute_dtype, uint64_t seed, bool optimizer_state,
                           OptimizerDTypes dtypes)
    : device_(device),
      compute_dtype_(compute_dtype),
      seed_(seed),
      optimizer_state_(optimizer_state),
      dtypes_(dtypes) {
  CHECK(IsFloating(compute_dtype));
  CHECK(IsFloating(dtypes.grad) && IsFloating(dtypes.exp_avg) && IsFloating(dtypes.exp_avg_sq));
  CHECK(device.is_cuda() || compute_dtype == DType::kF32) << "the CPU backend computes in f32";
}

ParameterSet ParameterSet::SpecsOnly() {
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/0, /*optimizer_state=*/false);
  set.storage_ = Storage::kSpecsOnly;
  return set;
}

ParameterSet ParameterSet::Deferred(Device device, DType compute_dtype, uint64_t seed,
                                    OptimizerDTypes dtypes) {
  ParameterSet set(device, compute_dtype, seed, /*optimizer_state=*/true, dtypes);
  set.storage_ = Storage::kDeferred;
  return set;
}

Parameter& ParameterSet::Create(const ParameterSpec& spec) {
  Add({&spec, 1}, /*stack=*/nullptr);
  return *parameters_.back();
}

ParameterStack& ParameterSet::CreateStack(std::span<const ParameterSpec> specs) {
  CHECK(!specs.empty()) << "a stack of no parameters";
  for (const ParameterSpec& spec : specs) {
    CHECK_EQ(spec.shape.size(), 2u) << "stack member " << spec.name << " is not 2-D";
    CHECK_EQ(spec.shape[1], specs.front().shape[1])
        << "stack member " << spec.name << ": columns differ from " << specs.front().name << "'s";
    CHECK_EQ(spec.weight_decay, specs.front().weight_decay)
        << "stack member " << spec.name << ": weight decay differs from " << specs.front().name
        << "'s";
    CHECK(spec.replicas == specs.front().replicas)
        << "stack member " << spec.name << ": replica group differs from " << specs.front().name
        << "'s";
  }
  ParameterStack& stack = *stacks_.emplace_back(std::make_unique<ParameterStack>());
  Add(specs, &stack);
  if (storage_ == Storage::kPerParameter) {
    const Shape shape = StackShape(specs);
    stack.value = plain_slices_.back().value.View(shape);
    stack.grad = plain_slices_.back().grad.View(shape);
  }
  return stack;
}

void ParameterSet::Add(std::span<const ParameterSpec> specs, ParameterStack* stack) {
  CHECK(buckets_.empty()) << "parameter " << specs.front().name << " created after AllocateBuckets";
  const size_t first = parameters_.size();
  for (const ParameterSpec& spec : specs) {
    for (const auto& p : parameters_) {
      CHECK(p->name != spec.name) << "parameter twice: " << spec.name;
    }
    CheckPart(spec);
    auto p = std::make_unique<Parameter>();
    p->name = spec.name;
    p->weight_decay = spec.weight_decay;
    if (stack != nullptr) stack->members.push_back(p.get());
    parameters_.push_back(std::move(p));
    specs_.push_back(spec);
    stack_of_.push_back(stack);
  }
  if (storage_ != Storage::kPerParameter) return;

  // One buffer of each kind for all of `specs`, each parameter's tensors views of its elements.
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  for (const ParameterSpec& spec : specs) {
    offsets.push_back(numel);
    numel += moe::NumElements(spec.shape);
  }
  OwnedSlice buffers;
  buffers.parameter = parameters_[first].get();
  buffers.parameters = static_cast<int>(specs.size());
  buffers.replicas = specs.front().replicas;
  buffers.master = Tensor::Empty({numel}, DType::kF32, device_);
  InitialValueWriter writer(seed_);
  for (size_t i = 0; i < specs.size(); ++i) {
    writer.Write(specs[i], ParameterView(buffers.master, offsets[i], specs[i].shape));
  }
  if (compute_dtype_ == DType::kF32) {
    buffers.value = buffers.master;
  } else {
    buffers.value = Tensor::Empty({numel}, compute_dtype_, device_);
    ops::Cast(buffers.master, buffers.value);
    if (!optimizer_state_) buffers.master = Tensor();
  }
  buffers.value.set_is_parameter(true);
  buffers.grad = Tensor::Empty({numel}, dtypes_.grad, device_);  // pending zero
  if (optimizer_state_) {
    buffers.exp_avg = Tensor::Empty({numel}, dtypes_.exp_avg, device_);
    buffers.exp_avg_sq = Tensor::Empty({numel}, dtypes_.exp_avg_sq, device_);
    ops::Fill(buffers.exp_avg, 0.0f);
    ops::Fill(buffers.exp_avg_sq, 0.0f);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto view = [&](const Tensor& buffer) {
      return buffer.defined() ? ParameterView(buffer, offsets[i], specs[i].shape) : Tensor();
    };
    Parameter& p = *parameters_[first + i];
    p.value = view(buffers.value);
    p.master = view(buffers.master);
    p.grad = view(buffers.grad);
    p.exp_avg = view(buffers.exp_avg);
    p.exp_avg_sq = view(buffers.exp_avg_sq);
  }
  plain_slices_.push_back(std::move(buffers));
}

size_t ParameterSet::StackEnd(size_t first) const {
  const ParameterStack* stack = stack_of_[first];
  if (stack == nullptr) return first + 1;
  CHECK(stack->members.front() == parameters_[first].get()) << parameters_[first]->name;
  return first + stack->members.size();
}

Parameter& ParameterSet::Get(const std::string& name) {
  for (auto& p : parameters_) {
    if (p->name == name) return *p;
  }
  LOG(FATAL) << "no parameter " << name;
}

int64_t ParameterSet::NumElements() const {
  int64_t n = 0;
  for (const auto& p : parameters_) n += p->value.numel();
  return n;
}

void ParameterSet::ZeroGrads() {
  for (auto& p : parameters_) p->grad_pending_zero = true;
}

bool BeginGradWrite(Parameter& p) {
  const bool accumulate = !p.grad_pending_zero;
  p.grad_pending_zero = false;
  return accumulate;
}

bool BeginGradWrite(ParameterStack& stack) {
  const bool accumulate = !stack.members.front()->grad_pending_zero;
  for (Parameter* p : stack.members) {
    CHECK_EQ(BeginGradWrite(*p), accumulate)
        << "stack member " << p->name << "'s gradient and " << stack.members.front()->name
        << "'s differ in being pending zero";
  }
  return accumulate;
}

const Tensor& MaterializedGrad(Parameter& p) {
  if (!BeginGradWrite(p)) ops::Fill(p.grad, 0.0f);
  return p.grad;
}

void ParameterSet::SyncValuesFromMasters() {
  MarkValuesChanged();
  for (ReplicaGroup group : kReplicaGroups) {
    CHECK_EQ(shards(group), 1) << "a sharded state has no whole masters to copy";
  }
  if (compute_dtype_ == DType::kF32) return;
  for (auto& p : parameters_) ops::Cast(p->master, p->value);
}

void ParameterSet::AllocateBuckets(const BucketSharding& sharding, int64_t bucket_bytes) {
  CHECK(storage_ == Storage::kDeferred) << "AllocateBuckets of a set that is not deferred";
  CHECK(buckets_.empty()) << "AllocateBuckets twice";
  for (ReplicaGroup group : kReplicaGroups) {
    const StateShard& s = sharding[group];
    CHECK(s.shard >= 0 && s.shard < s.shards)
        << ReplicaGroupName(group) << " group: shard " << s.shard << " of " << s.shards;
  }
  sharding_ = sharding;
  const size_t n = specs_.size();
  std::vector<int64_t> numels;
  std::vector<ReplicaGroup> replicas;
  const auto joins_previous = std::make_unique<bool[]>(n);
  for (size_t i = 0; i < n; ++i) {
    numels.push_back(moe::NumElements(specs_[i].shape));
    replicas.push_back(specs_[i].replicas);
    joins_previous[i] = i > 0 && stack_of_[i] != nullptr && stack_of_[i] == stack_of_[i - 1];
  }
  const bool value_is_master = compute_dtype_ == DType::kF32;
  InitialValueWriter writer(seed_);
  for (BucketLayout& layout :
       PlanBuckets(numels, {joins_previous.get(), n}, replicas, sharding, bucket_bytes)) {
    ParameterBucket b;
    b.layout = std::move(layout);
    b.shard = sharding[b.layout.replicas].shard;
    const int64_t owned = b.layout.shard_numel();
    b.value = Tensor::Empty({b.layout.numel}, compute_dtype_, device_);
    b.grad = Tensor::Empty({b.layout.numel}, dtypes_.grad, device_);
    b.master = value_is_master ? b.value.Rows(b.owned_begin(), b.owned_end())
                               : Tensor::Empty({owned}, DType::kF32, device_);
    b.exp_avg = Tensor::Empty({owned}, dtypes_.exp_avg, device_);
    b.exp_avg_sq = Tensor::Empty({owned}, dtypes_.exp_avg_sq, device_);
    for (const Tensor* t : {&b.value, &b.grad, &b.master, &b.exp_avg, &b.exp_avg_sq}) {
      ops::Fill(*t, 0.0f);
    }
    for (size_t i = b.layout.begin; i < b.layout.end; ++i) {
      const ParameterSpec& spec = specs_[i];
      Parameter& p = *parameters_[i];
      const int64_t offset = b.layout.offsets[i - b.layout.begin];
      const int64_t numel = moe::NumElements(spec.shape);
      p.value = ParameterView(b.value, offset, spec.shape);
      p.value.set_is_parameter(true);
      p.grad = ParameterView(b.grad, offset, spec.shape);
      if (b.layout.shards == 1) {
        p.master = ParameterView(b.master, offset, spec.shape);
        p.exp_avg = ParameterView(b.exp_avg, offset, spec.shape);
        p.exp_avg_sq = ParameterView(b.exp_avg_sq, offset, spec.shape);
      } else if (value_is_master) {
        p.master = p.value;
      }
      // The initial values: into value, and the owned part into the bucket's master.
      if (value_is_master) {
        writer.Write(spec, p.value);
        continue;
      }
      Tensor initial = Tensor::Empty({numel}, DType::kF32, device_);
      writer.Write(spec, initial);
      ops::Cast(initial, p.value.View({numel}));
      const ParameterRange mine = IntersectParameter(offset, numel, b.owned_begin(), b.owned_end());
      if (mine.empty()) continue;
      const int64_t at = offset + mine.first - b.owned_begin();
      ops::Copy(initial.Rows(mine.first, mine.last),
                b.master.Rows(at, at + mine.last - mine.first));
    }
    for (size_t i = b.layout.begin; i < b.layout.end; i = StackEnd(i)) {
      ParameterStack* stack = stack_of_[i];
      if (stack == nullptr) continue;
      const Shape shape = StackShape(std::span(specs_).subspan(i, stack->members.size()));
      const int64_t offset = b.layout.offsets[i - b.layout.begin];
      stack->value = ParameterView(b.value, offset, shape);
      stack->value.set_is_parameter(true);
      stack->grad = ParameterView(b.grad, offset, shape);
    }
    buckets_.push_back(std::move(b));
  }
}

WholeBucketState ParameterSet::NewWholeBucketState(size_t b) const {
  const ParameterBucket& bucket = buckets_.at(b);
  const WholeParameterState flat = NewWholeState("", {bucket.layout.numel});
  WholeBucketState whole{flat.master, flat.exp_avg, flat.exp_avg_sq, {}};
  for (const Tensor* t : {&whole.master, &whole.exp_avg, &whole.exp_avg_sq}) ops::Fill(*t, 0.0f);
  for (size_t i = bucket.layout.begin; i < bucket.layout.end; ++i) {
    const int64_t offset = bucket.layout.offsets[i - bucket.layout.begin];
    const Shape& shape = specs_[i].shape;
    whole.parameters.push_back({specs_[i].name, ParameterView(whole.master, offset, shape),
                                ParameterView(whole.exp_avg, offset, shape),
                                ParameterView(whole.exp_avg_sq, offset, shape)});
  }
  return whole;
}

WholeParameterState ParameterSet::NewWholeState(const std::string& name, const Shape& shape) const {
  return {name, Tensor::Empty(shape, DType::kF32, device_),
          Tensor::Empty(shape, dtypes_.exp_avg, device_),
          Tensor::Empty(shape, dtypes_.exp_avg_sq, device_)};
}

void ParameterSet::AssignBucketState(size_t b, const WholeBucketState& whole) {
  MarkValuesChanged();
  ParameterBucket& bucket = buckets_.at(b);
  const auto owned = [&](const Tensor& t) {
    return t.Rows(bucket.owned_begin(), bucket.owned_end());
  };
  if (compute_dtype_ == DType::kF32) {
    ops::Copy(whole.master, bucket.value);  // the CPU's master is value's owned part
  } else {
    ops::Copy(owned(whole.master), bucket.master);
    ops::Cast(whole.master, bucket.value);
  }
  ops::Copy(owned(whole.exp_avg), bucket.exp_avg);
  ops::Copy(owned(whole.exp_avg_sq), bucket.exp_avg_sq);
}

std::vector<OwnedSlice> ParameterSet::OwnedSlices() const {
  CHECK(optimizer_state_) << "a set without optimizer state updates nothing";
  if (buckets_.empty()) return plain_slices_;
  std::vector<OwnedSlice> slices;
  for (const ParameterBucket& b : buckets_) {
    // Where parameter i begins and ends in the bucket.
    const auto begin_of = [&](size_t i) { return b.layout.offsets[i - b.layout.begin]; };
    const auto end_of = [&](size_t i) { return begin_of(i) + moe::NumElements(specs_[i].shape); };
    for (size_t i = b.layout.begin; i < b.layout.end; i = StackEnd(i)) {
      // The owned part of the stack (or lone parameter) [i, stack_end): bucket elements
      // [begin, end), which hold (parts of) parameters [first, last).
      const size_t stack_end = StackEnd(i);
      const int64_t begin = std::max(begin_of(i), b.owned_begin());
      const int64_t end = std::min(end_of(stack_end - 1), b.owned_end());
      if (begin >= end) continue;
      size_t first = i;
      while (end_of(first) <= begin) ++first;
      size_t last = first + 1;
      while (last < stack_end && begin_of(last) < end) ++last;
      const int64_t state_begin = begin - b.owned_begin(), state_end = end - b.owned_begin();
      slices.push_back({parameters_[first].get(), static_cast<int>(last - first), b.layout.replicas,
                        b.master.Rows(state_begin, state_end), b.grad.Rows(begin, end),
                        b.exp_avg.Rows(state_begin, state_end),
                        b.exp_avg_sq.Rows(state_begin, state_end), b.value.Rows(begin, end)});
    }
  }
  return slices;
}

}  // namespace moe
