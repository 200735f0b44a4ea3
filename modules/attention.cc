#include "modules/attention.h"

#include <cmath>
#include <utility>

#include "engine/kernels/ops.h"
#include "modules/linear.h"
#include "modules/offload_groups.h"

namespace moe {
namespace {

// The query or key norm (`width`: that projection's q_dim or kv_dim), or none.
std::unique_ptr<RmsNorm> QkNorm(ParameterSet& parameters, const std::string& name,
                                const GptConfig& config, int64_t width) {
  if (!config.qk_layernorm) return nullptr;
  return std::make_unique<RmsNorm>(parameters, name,
                                   config.qk_layernorm_across_heads ? width : config.head_dim(),
                                   config.norm_epsilon);
}

}  // namespace

SelfAttention::SelfAttention(ParameterSet& parameters, const std::string& name,
                             const GptConfig& config, int layer, RotaryTable& rotary_table)
    : name_(name),
      config_(config),
      layer_(layer),
      qkv_proj_(
          parameters.CreateStack(std::vector<ParameterSpec>{{name + ".q_proj.weight",
                                                             {config.q_dim(), config.hidden_size},
                                                             Init::kNormal,
                                                             config.init_std},
                                                            {name + ".k_proj.weight",
                                                             {config.kv_dim(), config.hidden_size},
                                                             Init::kNormal,
                                                             config.init_std},
                                                            {name + ".v_proj.weight",
                                                             {config.kv_dim(), config.hidden_size},
                                                             Init::kNormal,
                                                             config.init_std}})),
      q_norm_(QkNorm(parameters, name + ".q_norm", config, config.q_dim())),
      k_norm_(QkNorm(parameters, name + ".k_norm", config, config.kv_dim())),
      o_proj_(parameters.Create(
          {name + ".o_proj.weight",
           {config.hidden_size, config.q_dim()},
           Init::kNormal,
           config.init_std / std::sqrt(2.0f * static_cast<float>(config.num_layers))})),
      rotary_table_(rotary_table) {}

const Tensor& RotaryTable::On(Device device) {
  if (!table_.defined()) {
    table_ = Tensor::Empty({config_.seq_length, config_.head_dim() / 2, 2}, DType::kF32, device);
    ops::RopeTable(config_.rotary_base, table_);
  }
  return table_;
}

SelfAttention::Heads SelfAttention::EmptyHeads(int64_t tokens, const Tensor& like) const {
  const int64_t d = config_.head_dim();
  const auto empty = [&](int64_t heads) {
    return Tensor::Empty({tokens, heads, d}, like.dtype(), like.device());
  };
  return {empty(config_.num_attention_heads), empty(config_.num_query_groups),
          empty(config_.num_query_groups)};
}

Tensor SelfAttention::NormRows(const Tensor& heads) const {
  return config_.qk_layernorm_across_heads
             ? heads.View({heads.dim(0), heads.dim(1) * heads.dim(2)})
             : heads.View({heads.dim(0) * heads.dim(1), heads.dim(2)});
}

void SelfAttention::SplitHeads(SavedTensors& saved, const Tensor& qkv, Heads& heads) {
  const Tensor& table = rotary_table_.On(qkv.device());
  ops::RopeQkvForward(qkv, q_norm_ ? Tensor() : table, heads.q, heads.k, heads.v);
  if (!q_norm_) return;
  for (auto [raw, norm] :
       {std::pair{&heads.q, q_norm_.get()}, std::pair{&heads.k, k_norm_.get()}}) {
    const Tensor normed = norm->Forward(saved, NormRows(*raw)).View(raw->shape());
    ops::RopeForward(normed, table, normed);
    *raw = normed;
  }
}

Tensor SelfAttention::MergeHeadGradients(SavedTensors& saved, Heads grads) {
  const Tensor& table = rotary_table_.On(grads.q.device());
  if (q_norm_) {  // each rotated back, then through its norm: qkv's heads are then unrotated
    for (auto [grad, norm] :
         {std::pair{&grads.q, q_norm_.get()}, std::pair{&grads.k, k_norm_.get()}}) {
      ops::RopeBackward(*grad, table, *grad);
      *grad = norm->Backward(saved, NormRows(*grad)).View(grad->shape());
    }
  }
  const Tensor dqkv =
      Tensor::Empty({grads.q.dim(0), qkv_proj_.value.dim(0)}, grads.q.dtype(), grads.q.device());
  ops::RopeQkvBackward(grads.q, grads.k, grads.v, q_norm_ ? Tensor() : table, dqkv);
  return dqkv;
}

Tensor SelfAttention::Forward(SavedTensors& saved, const Tensor& x) {
  const int64_t tokens = x.dim(0), seq = config_.seq_length, batch = tokens / seq;
  const int64_t heads = config_.num_attention_heads, groups = config_.num_query_groups;
  const int64_t d = config_.head_dim();
  Heads h = EmptyHeads(tokens, x);
  {
    ScopedSaveGroup group(saved, kQkvLinearGroup, layer_);
    const Tensor qkv = Tensor::Empty({tokens, qkv_proj_.value.dim(0)}, x.dtype(), x.device());
    LinearForwardInto(x, qkv_proj_.value, qkv);
    SplitHeads(saved, qkv, h);
    saved.Save(name_ + ".x", x);
  }
  const Tensor q = h.q.View({batch, seq, heads, d});
  const Tensor k = h.k.View({batch, seq, groups, d});
  const Tensor v = h.v.View({batch, seq, groups, d});
  h = {};
  Tensor out = Tensor::Empty(q.shape(), x.dtype(), x.device());
  {
    ScopedSaveGroup group(saved, kCoreAttnGroup, layer_);
    Tensor lse = Tensor::Empty({batch, heads, seq}, DType::kF32, x.device());
    ops::AttentionForward(q, k, v, out, lse);
    saved.Save(name_ + ".q", q);
    saved.Save(name_ + ".k", k);
    saved.Save(name_ + ".v", v);
    if (!config_.recompute_in(layer_).core_attn) saved.Save(name_ + ".lse", lse);
  }
  ScopedSaveGroup group(saved, kAttnProjGroup, layer_);
  out = out.View({tokens, heads * d});
  if (!config_.recompute_in(layer_).core_attn) saved.Save(name_ + ".out", out);
  return LinearForward(out, o_proj_);
}

Tensor SelfAttention::Backward(SavedTensors& saved, const Tensor& dy) {
  const bool recompute = config_.recompute_in(layer_).core_attn;
  Tensor out = recompute ? Tensor() : saved.Load(name_ + ".out");
  const Tensor q = saved.Load(name_ + ".q");
  const Tensor k = saved.Load(name_ + ".k");
  const Tensor v = saved.Load(name_ + ".v");
  Tensor lse = recompute ? Tensor() : saved.Load(name_ + ".lse");
  if (recompute) {
    out = Tensor::Empty(q.shape(), q.dtype(), q.device());
    lse = Tensor::Empty({q.dim(0), q.dim(2), q.dim(1)}, DType::kF32, q.device());
    ops::AttentionForward(q, k, v, out, lse);
    out = out.View({dy.dim(0), config_.q_dim()});
  }
  Tensor dout = LinearBackward(dy, out, o_proj_);

  Heads grads = EmptyHeads(dy.dim(0), q);
  ops::AttentionBackward(dout.View(q.shape()), q, k, v, out.View(q.shape()), lse,
                         grads.q.View(q.shape()), grads.k.View(k.shape()), grads.v.View(v.shape()));
  dout = Tensor();
  const Tensor dqkv = MergeHeadGradients(saved, std::move(grads));

  const Tensor x = saved.Load(name_ + ".x");
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  LinearBackward(dqkv, x, qkv_proj_.value, qkv_proj_.grad, dx, /*accumulate_dx=*/false,
                 BeginGradWrite(qkv_proj_));
  return dx;
}

}  // namespace moe
