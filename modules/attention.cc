#include "modules/attention.h"

#include <cmath>

#include "engine/kernels/ops.h"
#include "modules/linear.h"
#include "modules/offload_groups.h"

namespace moe {

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

Tensor SelfAttention::Forward(SavedTensors& saved, const Tensor& x) {
  const int64_t tokens = x.dim(0), seq = config_.seq_length, batch = tokens / seq;
  const int64_t heads = config_.num_attention_heads, groups = config_.num_query_groups;
  const int64_t d = config_.head_dim();
  Tensor q = Tensor::Empty({tokens, heads, d}, x.dtype(), x.device());
  Tensor k = Tensor::Empty({tokens, groups, d}, x.dtype(), x.device());
  Tensor v = Tensor::Empty({tokens, groups, d}, x.dtype(), x.device());
  {
    ScopedSaveGroup group(saved, kQkvLinearGroup, layer_);
    const Tensor qkv = Tensor::Empty({tokens, qkv_proj_.value.dim(0)}, x.dtype(), x.device());
    LinearForwardInto(x, qkv_proj_.value, qkv);
    ops::RopeQkvForward(qkv, rotary_table_.On(x.device()), q, k, v);
    saved.Save(name_ + ".x", x);
  }
  q = q.View({batch, seq, heads, d});
  k = k.View({batch, seq, groups, d});
  v = v.View({batch, seq, groups, d});
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

  Tensor dq = Tensor::Empty(q.shape(), q.dtype(), q.device());
  Tensor dk = Tensor::Empty(k.shape(), k.dtype(), k.device());
  Tensor dv = Tensor::Empty(v.shape(), v.dtype(), v.device());
  ops::AttentionBackward(dout.View(q.shape()), q, k, v, out.View(q.shape()), lse, dq, dk, dv);
  dout = Tensor();

  const int64_t tokens = dy.dim(0), heads = config_.num_attention_heads;
  const int64_t groups = config_.num_query_groups, d = config_.head_dim();
  Tensor dqkv = Tensor::Empty({tokens, qkv_proj_.value.dim(0)}, dq.dtype(), dq.device());
  ops::RopeQkvBackward(dq.View({tokens, heads, d}), dk.View({tokens, groups, d}),
                       dv.View({tokens, groups, d}), rotary_table_.On(dq.device()), dqkv);
  dq = dk = dv = Tensor();

  const Tensor x = saved.Load(name_ + ".x");
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  LinearBackward(dqkv, x, qkv_proj_.value, qkv_proj_.grad, dx, /*accumulate_dx=*/false,
                 BeginGradWrite(qkv_proj_));
  return dx;
}

}  // namespace moe
