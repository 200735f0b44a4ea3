#include "engine/optim/parameters.h"

#include <glog/logging.h>

#include "engine/core/random.h"
#include "engine/kernels/ops.h"

namespace moe {

ParameterSet::ParameterSet(Device device, DType compute_dtype, uint64_t seed)
    : device_(device), compute_dtype_(compute_dtype), seed_(seed) {
  CHECK(IsFloating(compute_dtype));
  CHECK(device.is_cuda() || compute_dtype == DType::kF32) << "the CPU backend computes in f32";
}

Parameter& ParameterSet::Create(const ParameterSpec& spec) {
  for (const auto& p : parameters_) CHECK(p->name != spec.name) << "parameter twice: " << spec.name;
  auto p = std::make_unique<Parameter>();
  p->name = spec.name;
  p->weight_decay = spec.weight_decay;

  std::vector<float> host(moe::NumElements(spec.shape));
  Rng rng(seed_, StableHash(spec.name));
  for (float& v : host) {
    v = spec.init == Init::kNormal ? static_cast<float>(rng.Normal() * spec.init_std)
                                   : (spec.init == Init::kOnes ? 1.0f : 0.0f);
  }
  p->master = Tensor::Empty(spec.shape, DType::kF32, device_);
  ops::CopyFromHost(host.data(), p->master);
  if (compute_dtype_ == DType::kF32) {
    p->value = p->master;
  } else {
    p->value = Tensor::Empty(spec.shape, compute_dtype_, device_);
    ops::Cast(p->master, p->value);
  }
  p->value.set_is_parameter(true);
  p->grad = Tensor::Empty(spec.shape, DType::kF32, device_);
  p->exp_avg = Tensor::Empty(spec.shape, DType::kF32, device_);
  p->exp_avg_sq = Tensor::Empty(spec.shape, DType::kF32, device_);
  for (const Tensor* t : {&p->grad, &p->exp_avg, &p->exp_avg_sq}) ops::Fill(*t, 0.0f);
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
  for (const auto& p : parameters_) n += p->master.numel();
  return n;
}

void ParameterSet::ZeroGrads() {
  for (auto& p : parameters_) ops::Fill(p->grad, 0.0f);
}

void ParameterSet::SyncValuesFromMasters() {
  if (compute_dtype_ == DType::kF32) return;
  for (auto& p : parameters_) ops::Cast(p->master, p->value);
}

}  // namespace moe
