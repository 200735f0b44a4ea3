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

}  // namespace

ParameterSet::ParameterSet(Device device, DType compute_dtype, uint64_t seed, bool optimizer_state)
    : device_(device),
      compute_dtype_(compute_dtype),
      seed_(seed),
      optimizer_state_(optimizer_state) {
  CHECK(IsFloating(compute_dtype));
  CHECK(device.is_cuda() || compute_dtype == DType::kF32) << "the CPU backend computes in f32";
}

ParameterSet ParameterSet::SpecsOnly() {
  ParameterSet set(Device::CPU(), DType::kF32, /*seed=*/0, /*optimizer_state=*/false);
  set.allocate_ = false;
  return set;
}

Parameter& ParameterSet::Create(const ParameterSpec& spec) {
  for (const auto& p : parameters_) CHECK(p->name != spec.name) << "parameter twice: " << spec.name;
  auto p = std::make_unique<Parameter>();
  p->name = spec.name;
  p->weight_decay = spec.weight_decay;
  specs_.push_back(spec);
  if (!allocate_) {
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
  p->grad = Tensor::Empty(spec.shape, DType::kF32, device_);  // pending zero
  if (optimizer_state_) {
    p->exp_avg = Tensor::Empty(spec.shape, DType::kF32, device_);
    p->exp_avg_sq = Tensor::Empty(spec.shape, DType::kF32, device_);
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
  if (compute_dtype_ == DType::kF32) return;
  for (auto& p : parameters_) ops::Cast(p->master, p->value);
}

}  // namespace moe
