#include "modules/moe_layer.h"

#include <glog/logging.h>

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "engine/runtime/step_timeline.h"
#include "modules/expert_route.h"

namespace moe {

namespace {

ExpertShard ShardOf(const GptConfig& config, const ExpertParallel* expert_parallel) {
  if (expert_parallel == nullptr) return {};
  const Communicator* group = expert_parallel->group;
  CHECK(config.num_experts % group->size() == 0)
      << config.num_experts << " experts over an expert group of " << group->size();
  const int64_t local = config.num_experts / group->size();
  return {group->rank() * local, local, group->size(), expert_parallel->expert_data};
}

}  // namespace

MoeLayer::MoeLayer(ParameterSet& parameters, const std::string& name, const GptConfig& config,
                   int layer, ExpertParallel* expert_parallel)
    : name_(name),
      config_(config),
      layer_(layer),
      expert_parallel_(expert_parallel),
      router_(parameters, name + ".router", config),
      experts_(MakeGroupedMlp(parameters, name + ".experts", config, layer,
                              ShardOf(config, expert_parallel))) {}

Tensor MoeLayer::Forward(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss) {
  if (!config_.recompute_in(layer_).moe || !saved.training()) {
    return ForwardSaving(saved, x, aux_loss);
  }
  SavedTensors nothing_saved(/*training=*/false);
  const Tensor y = ForwardSaving(nothing_saved, x, aux_loss);
  saved.Save(name_ + ".input", x);
  return y;
}

Tensor MoeLayer::Backward(SavedTensors& saved, const Tensor& dy, float aux_grad,
                          bool last_of_step) {
  if (!config_.recompute_in(layer_).moe) return BackwardSaved(saved, dy, aux_grad, last_of_step);
  const Tensor x = saved.Load(name_ + ".input");
  SavedTensors replay(/*training=*/true);
  Tensor aux_loss = Tensor::Empty({1}, DType::kF32, x.device());
  ops::Fill(aux_loss, 0.0f);
  ForwardSaving(replay, x, aux_loss);
  const Tensor dx = BackwardSaved(replay, dy, aux_grad, last_of_step);
  CHECK(replay.empty()) << name_ << " recompute left saved tensors behind";
  return dx;
}

Tensor MoeLayer::ForwardSaving(SavedTensors& saved, const Tensor& x, const Tensor& aux_loss) {
  const int64_t tokens = x.dim(0), k = config_.moe_router_topk, rows = tokens * k;
  const Device device = x.device();
  const Routing routing = router_.Forward(saved, x);
  ops::Add(aux_loss, routing.aux_loss, aux_loss);

  Tensor source_rows = Tensor::Empty({rows}, DType::kI32, device);
  Tensor inverse = Tensor::Empty({rows}, DType::kI32, device);
  ops::InvertPermutation(routing.order, k, source_rows, inverse);
  Tensor weights = Tensor::Empty({rows, 1}, DType::kF32, device);
  ops::GatherRows(routing.weights.View({rows, 1}), routing.order, weights);
  saved.Save(name_ + ".source_rows", source_rows);
  saved.Save(name_ + ".inverse", inverse);

  const Tensor expert_out =
      ExpertsForward(saved, PermutedRows(x, source_rows), routing.offsets, weights.View({rows}));
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), device);
  ops::GatherSumRows(expert_out, inverse.View({tokens, k}), y);
  return y;
}

Tensor MoeLayer::BackwardSaved(SavedTensors& saved, const Tensor& dy, float aux_grad,
                               bool last_of_step) {
  const int64_t tokens = dy.dim(0), k = config_.moe_router_topk, rows = tokens * k;
  const Device device = dy.device();
  const Tensor source_rows = saved.Load(name_ + ".source_rows");
  const Tensor inverse = saved.Load(name_ + ".inverse");

  const GroupedMlp::Grads grads =
      ExpertsBackward(saved, PermutedRows(dy, source_rows), last_of_step);

  Tensor dx = Tensor::Empty(dy.shape(), dy.dtype(), device);
  ops::GatherSumRows(grads.dx, inverse.View({tokens, k}), dx);
  Tensor dweights = Tensor::Empty({rows, 1}, DType::kF32, device);
  ops::GatherRows(grads.dweights.View({rows, 1}), inverse, dweights);
  router_.Backward(saved, dweights.View({tokens, k}), aux_grad, dx);
  return dx;
}

Tensor MoeLayer::ExpertsForward(SavedTensors& saved, const PermutedRows& permuted_rows,
                                const Tensor& offsets, const Tensor& weights) {
  if (expert_parallel_ == nullptr) return experts_->Forward(saved, permuted_rows, offsets, weights);
  const Tensor permuted = permuted_rows.Gathered();
  const Device device = permuted.device();
  const ExpertRoute route = [&] {  // the host waits for the group's counts: compute idles
    const PhaseScope waiting(device, StepPhase::kExpertParallelWait);
    return ExpertRoute::Exchange(*expert_parallel_->group, offsets);
  }();
  route.AddTo(expert_parallel_->traffic);
  saved.Save(name_ + ".expert_counts", route.counts());
  const int64_t received = route.recv_offsets().back(), hidden = permuted.dim(1);
  Tensor rows = Tensor::Empty({received, hidden}, permuted.dtype(), device);
  Tensor row_weights = Tensor::Empty({received}, DType::kF32, device);
  const RowExchange dispatch[] = {{permuted, rows}, {weights, row_weights}};
  Exchange("dispatch", dispatch, route.send_offsets(), route.recv_offsets());

  // Every source's expert offsets in one upload, beside their host copy (no read-back later).
  const Tensor& host_offsets = route.segment_offsets();
  Tensor segment_offsets = Tensor::Empty(host_offsets.shape(), DType::kI32, device);
  ops::CopyFromHost(host_offsets.data(), segment_offsets);
  Tensor outputs = Tensor::Empty({received, hidden}, permuted.dtype(), device);
  for (int source = 0; source < route.sources(); ++source) {
    if (route.rows_from(source) == 0) continue;
    const int64_t begin = route.recv_offsets()[source], end = route.recv_offsets()[source + 1];
    const auto row = [source](const Tensor& t) {
      return t.Rows(source, source + 1).View({t.dim(1)});
    };
    const Tensor y = experts_->Forward(saved, rows.Rows(begin, end), row(segment_offsets),
                                       row_weights.Rows(begin, end), source, row(host_offsets));
    ops::Copy(y, outputs.Rows(begin, end));
  }
  Tensor expert_out = Tensor::Empty(permuted.shape(), permuted.dtype(), device);
  const RowExchange combine[] = {{outputs, expert_out}};
  Exchange("combine", combine, route.recv_offsets(), route.send_offsets());
  return expert_out;
}

GroupedMlp::Grads MoeLayer::ExpertsBackward(SavedTensors& saved, const PermutedRows& dexpert_rows,
                                            bool last_of_step) {
  if (expert_parallel_ == nullptr) return experts_->Backward(saved, dexpert_rows, last_of_step);
  const Tensor dexpert_out = dexpert_rows.Gathered();
  const ExpertRoute route(saved.Load(name_ + ".expert_counts"), expert_parallel_->group->rank());
  const int64_t received = route.recv_offsets().back(), hidden = dexpert_out.dim(1);
  const Device device = dexpert_out.device();
  Tensor dy = Tensor::Empty({received, hidden}, dexpert_out.dtype(), device);
  const RowExchange dispatch[] = {{dexpert_out, dy}};
  Exchange("dispatch gradients", dispatch, route.send_offsets(), route.recv_offsets());

  Tensor dx = Tensor::Empty({received, hidden}, dexpert_out.dtype(), device);
  Tensor dweights = Tensor::Empty({received}, DType::kF32, device);
  for (int source = 0; source < route.sources(); ++source) {
    if (route.rows_from(source) == 0) continue;
    const int64_t begin = route.recv_offsets()[source], end = route.recv_offsets()[source + 1];
    const GroupedMlp::Grads g = experts_->BackwardSegment(saved, dy.Rows(begin, end), source);
    ops::Copy(g.dx, dx.Rows(begin, end));
    ops::Copy(g.dweights, dweights.Rows(begin, end));
  }
  experts_->EndBackward(last_of_step);
  GroupedMlp::Grads grads;
  grads.dx = Tensor::Empty(dexpert_out.shape(), dexpert_out.dtype(), device);
  grads.dweights = Tensor::Empty({dexpert_out.dim(0)}, DType::kF32, device);
  const RowExchange combine[] = {{dx, grads.dx}, {dweights, grads.dweights}};
  Exchange("combine gradients", combine, route.recv_offsets(), route.send_offsets());
  return grads;
}

void MoeLayer::Exchange(const char* what, std::span<const RowExchange> tensors,
                        std::span<const int64_t> send_offsets,
                        std::span<const int64_t> recv_offsets) {
  Communicator& group = *expert_parallel_->group;
  const Device device = group.device();
  const PhaseScope waiting(device, StepPhase::kExpertParallelWait);
  StepTimeline* timeline = TracingTimeline(device);
  const int span = timeline == nullptr ? -1
                                       : timeline->BeginSpan(TraceTrack::kExpertParallelComm,
                                                             group.stream(), what, layer_);
  expert_parallel_->traffic.bytes_sent += AllToAllRows(
      group, DeviceContext::Get(device).compute_stream(), tensors, send_offsets, recv_offsets);
  if (timeline != nullptr) timeline->EndSpan(span, group.stream());
}

}  // namespace moe
