#include "engine/autograd/parameters.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include <glog/logging.h>

#include "engine/core/random.h"
#include "engine/kernels/ops.h"

namespace moe {

namespace {

// Fills `out` with the initial values of parameter `name`: chunk c of 2^20 elements is drawn from
// its own stream (seed, name, c), so chunks can be generated in any order on any thread.
void InitialValues(const ParameterSpec& spec, uint64_t seed, std::vector<float>& out) {
  if (spec.init != Init::kNormal) {
    std::fill(out.begin(), out.end(), spec.init == Init::kOnes ? 1.0f : 0.0f);
    return;
  }
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t chunks = (out.size() + kChunk - 1) / kChunk;
  const uint64_t stream = StableHash(spec.name);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) {
      Rng rng(seed, stream + 0x9e3779b97f4a7c15ull * c);
      for (size_t i = c * kChunk; i < std::min(out.size(), (c + 1) * kChunk); ++i) {
        out[i] = static_cast<float>(rng.Normal() * spec.init_std);
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

// Elements [offset, offset + |shape|) of the 1-D `buffer`, viewed as `shape`: a parameter's
// place in a bucket buffer.
Tensor ParameterView(const Tensor& buffer, int64_t offset, const Shape& shape) {
  return buffer.Rows(offset, offset + moe::NumElements(shape)).View(shape);
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
  for (const auto& p : parameters_) CHECK(p->name != spec.name) << "parameter twice: " << spec.name;
  auto p = std::make_unique<Parameter>();
  p->name = spec.name;
  p->weight_decay = spec.weight_decay;
  specs_.push_back(spec);
  if (storage_ != Storage::kPerParameter) {
    CHECK(buckets_.empty()) << "parameter " << spec.name << " created after AllocateBuckets";
    parameters_.push_back(std::move(p));
    return *parameters_.back();
  }

  std::vector<float> host(moe::NumElements(spec.shape));
  InitialValues(spec, seed_, host);
  p->master = Tensor::Empty(spec.shape, DType::kF32, device_);
  ops::CopyFromHost(host.data(), p->master);
  if (compute_dtype_ == DType::kF32) {
    p->value = p->master;
  } else {
    p->value = Tensor::Empty(spec.shape, compute_dtype_, device_);
    ops::Cast(p->master, p->value);
    if (!optimizer_state_) p->master = Tensor();
  }
  p->value.set_is_parameter(true);
  p->grad = Tensor::Empty(spec.shape, dtypes_.grad, device_);  // pending zero
  if (optimizer_state_) {
    p->exp_avg = Tensor::Empty(spec.shape, dtypes_.exp_avg, device_);
    p->exp_avg_sq = Tensor::Empty(spec.shape, dtypes_.exp_avg_sq, device_);
    ops::Fill(p->exp_avg, 0.0f);
    ops::Fill(p->exp_avg_sq, 0.0f);
  }
  parameters_.push_back(std::move(p));
  return *parameters_.back();
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

const Tensor& MaterializedGrad(Parameter& p) {
  if (!BeginGradWrite(p)) ops::Fill(p.grad, 0.0f);
  return p.grad;
}

void ParameterSet::SyncValuesFromMasters() {
  CHECK_EQ(shards(), 1) << "a sharded state has no whole masters to copy";
  if (compute_dtype_ == DType::kF32) return;
  for (auto& p : parameters_) ops::Cast(p->master, p->value);
}

void ParameterSet::AllocateBuckets(int shards, int shard, int64_t bucket_bytes) {
  CHECK(storage_ == Storage::kDeferred) << "AllocateBuckets of a set that is not deferred";
  CHECK(buckets_.empty()) << "AllocateBuckets twice";
  CHECK(shard >= 0 && shard < shards) << "shard " << shard << " of " << shards;
  std::vector<int64_t> numels;
  for (const ParameterSpec& spec : specs_) numels.push_back(moe::NumElements(spec.shape));
  const bool value_is_master = compute_dtype_ == DType::kF32;
  for (BucketLayout& layout : PlanBuckets(numels, shards, bucket_bytes)) {
    ParameterBucket b;
    b.layout = std::move(layout);
    b.shard = shard;
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
      if (shards == 1) {
        p.master = ParameterView(b.master, offset, spec.shape);
        p.exp_avg = ParameterView(b.exp_avg, offset, spec.shape);
        p.exp_avg_sq = ParameterView(b.exp_avg_sq, offset, spec.shape);
      } else if (value_is_master) {
        p.master = p.value;
      }
      // The initial values: into value, and the owned part into the bucket's master.
      std::vector<float> host(numel);
      InitialValues(spec, seed_, host);
      if (value_is_master) {
        ops::CopyFromHost(host.data(), p.value);
        continue;
      }
      Tensor initial = Tensor::Empty({numel}, DType::kF32, device_);
      ops::CopyFromHost(host.data(), initial);
      ops::Cast(initial, p.value.View({numel}));
      const ParameterRange mine = IntersectParameter(offset, numel, b.owned_begin(), b.owned_end());
      if (mine.empty()) continue;
      const int64_t at = offset + mine.first - b.owned_begin();
      ops::Copy(initial.Rows(mine.first, mine.last),
                b.master.Rows(at, at + mine.last - mine.first));
    }
    buckets_.push_back(std::move(b));
  }
}

WholeBucketState ParameterSet::NewWholeBucketState(size_t b) const {
  const ParameterBucket& bucket = buckets_.at(b);
  const WholeParameterState flat = NewWholeState("", {bucket.layout.numel});
  WholeBucketState whole{flat.master, flat.exp_avg, flat.exp_avg_sq};
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
  std::vector<OwnedSlice> slices;
  const auto flat = [](const Tensor& t) { return t.View({t.numel()}); };
  if (buckets_.empty()) {
    for (const auto& p : parameters_) {
      slices.push_back({p.get(), flat(p->master), flat(p->grad), flat(p->exp_avg),
                        flat(p->exp_avg_sq), flat(p->value)});
    }
    return slices;
  }
  for (const ParameterBucket& b : buckets_) {
    for (size_t i = b.layout.begin; i < b.layout.end; ++i) {
      const int64_t offset = b.layout.offsets[i - b.layout.begin];
      const ParameterRange mine =
          IntersectParameter(offset, parameters_[i]->value.numel(), b.owned_begin(), b.owned_end());
      if (mine.empty()) continue;
      const int64_t begin = offset + mine.first, end = offset + mine.last;
      const int64_t state_begin = begin - b.owned_begin(), state_end = end - b.owned_begin();
      slices.push_back({parameters_[i].get(), b.master.Rows(state_begin, state_end),
                        b.grad.Rows(begin, end), b.exp_avg.Rows(state_begin, state_end),
                        b.exp_avg_sq.Rows(state_begin, state_end), b.value.Rows(begin, end)});
    }
  }
  return slices;
}

}  // namespace moe
