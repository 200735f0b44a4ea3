#include "modules/pipeline_executor.h"

#include <glog/logging.h>

#include <map>
#include <utility>

#include "engine/kernels/ops.h"
#include "engine/runtime/device_context.h"
#include "engine/runtime/step_timeline.h"

namespace moe {
namespace {

using Key = std::pair<int, int>;  // (microbatch, chunk)
using Kind = Action::Kind;

class StepRun {
 public:
  StepRun(const std::vector<std::unique_ptr<GptModel>>& chunks, Communicator* pipeline,
          const std::function<Microbatch(int)>& microbatch, const PipelineStepOptions& options)
      : chunks_(chunks),
        pipeline_(pipeline),
        microbatch_(microbatch),
        options_(options),
        device_(options.device) {
    totals_.loss_sum = Tensor::Empty({1}, DType::kF32, device_);
    totals_.aux_loss = Tensor::Empty({1}, DType::kF32, device_);
    ops::Fill(totals_.loss_sum, 0.0f);
    ops::Fill(totals_.aux_loss, 0.0f);
  }

  void CreateContexts(const RankActions& actions) {
    std::vector<const SavedTensors*> order;
    for (const MicrobatchChunk& mc : BackwardOrder(actions)) {
      auto& saved = saved_[{mc.microbatch, mc.chunk}];
      saved = std::make_unique<SavedTensors>(/*training=*/true, options_.offload);
      order.push_back(saved.get());
    }
    if (options_.offload != nullptr) options_.offload->SetBackwardOrder(std::move(order));
  }

  void Forward(int m, int c) {
    const GptModel& chunk = *chunks_.at(c);
    Microbatch data;
    if (chunk.stage().first || chunk.stage().last) data = microbatch_(m);
    const Tensor input = chunk.stage().first ? data.ids : Take(received_activations_, {m, c});
    SavedTensors forward_only(/*training=*/false);
    SavedTensors& saved = options_.training ? *saved_.at({m, c}) : forward_only;
    const ForwardResult result = chunks_[c]->Forward(saved, input, data.targets, options_.loss_grad,
                                                     options_.weights_needed);
    if (chunk.stage().last) {
      ops::Axpy(1.0f, result.loss_sum, totals_.loss_sum);
    } else {
      outputs_[{m, c}] = result.output;
    }
    ops::Axpy(1.0f, result.aux_loss, totals_.aux_loss);
  }

  // last: the step's last backward of chunk c, after which its gradients are complete.
  void Backward(int m, int c, bool last) {
    CHECK(options_.training) << "Backward(m" << m << ",c" << c << ") in a forward-only run";
    auto it = saved_.find({m, c});
    CHECK(it != saved_.end()) << "Backward(m" << m << ",c" << c << ") twice or without forward";
    const Tensor output_grad =
        chunks_.at(c)->stage().last ? Tensor() : Take(received_grads_, {m, c});
    const Tensor input_grad =
        chunks_[c]->Backward(*it->second, output_grad, options_.aux_grad, last,
                             last ? options_.grads_final : GradsFinal());
    CHECK(it->second->empty()) << "backward left saved tensors behind, e.g. "
                               << it->second->keys().front();
    saved_.erase(it);
    if (!chunks_[c]->stage().first) input_grads_[{m, c}] = input_grad;
  }

  // Posts one batch of adjacent communication actions; compute after it waits for all of them.
  void Communicate(const Action* begin, const Action* end) {
    CHECK(pipeline_ != nullptr) << begin->ToString() << " without a pipeline group";
    StepTimeline* timeline = DeviceContext::Get(device_).timeline();
    if (timeline != nullptr) timeline->SetPhase(StepPhase::kPipelineWait);
    EnqueueBetween(*pipeline_, DeviceContext::Get(device_).compute_stream(), [&] {
      int span = -1;
      if (timeline != nullptr && timeline->tracing()) {
        std::string name;
        for (const Action* a = begin; a != end; ++a)
          name += (name.empty() ? "" : ", ") + a->ToString();
        span = timeline->BeginSpan(TraceTrack::kPipelineComm, pipeline_->stream(), name);
      }
      pipeline_->GroupStart();
      for (const Action* a = begin; a != end; ++a) {
        const Key key{a->microbatch, a->chunk};
        switch (a->kind) {
          case Kind::kSendActivation:
            pipeline_->Send(Take(outputs_, key), a->peer_rank);
            break;
          case Kind::kSendGrad:
            pipeline_->Send(Take(input_grads_, key), a->peer_rank);
            break;
          case Kind::kRecvActivation:
            pipeline_->Recv(Receive(received_activations_, key), a->peer_rank);
            break;
          case Kind::kRecvGrad:
            pipeline_->Recv(Receive(received_grads_, key), a->peer_rank);
            break;
          default:
            LOG(FATAL) << a->ToString() << " is not communication";
        }
      }
      pipeline_->GroupEnd();
      if (span >= 0) timeline->EndSpan(span, pipeline_->stream());
    });
  }

  // Brackets one forward or backward on the compute stream (its input waits are already
  // enqueued, so the span starts once its inputs are there), and marks its phase on the step's
  // timeline: the action's phase inside, kOther after it.
  void BeginCompute(const Action& action) {
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    if (StepTimeline* timeline = DeviceContext::Get(device_).timeline()) {
      timeline->SetPhase(action.kind == Kind::kForward ? StepPhase::kForward
                                                       : StepPhase::kBackward);
      if (timeline->tracing()) {
        action_span_ = timeline->BeginSpan(
            TraceTrack::kCompute, compute,
            std::string(action.kind == Kind::kForward ? "forward" : "backward") + " m" +
                std::to_string(action.microbatch) + " c" + std::to_string(action.chunk));
      }
    }
    spans_.emplace_back(compute.CreateEvent(/*enable_timing=*/true),
                        compute.CreateEvent(/*enable_timing=*/true));
    spans_.back().first->Record(compute);
  }
  void EndCompute() {
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    spans_.back().second->Record(compute);
    if (StepTimeline* timeline = DeviceContext::Get(device_).timeline()) {
      timeline->EndSpan(action_span_, compute);
      timeline->SetPhase(StepPhase::kOther);
    }
  }

  PipelineStepTotals Finish() {
    CHECK(saved_.empty() && outputs_.empty() && input_grads_.empty() &&
          received_activations_.empty() && received_grads_.empty())
        << "the action list left work behind";
    for (const auto& [start, end] : spans_)
      totals_.busy_ms += end->ElapsedMillisecondsSince(*start);
    if (!spans_.empty()) {
      totals_.span_ms = spans_.back().second->ElapsedMillisecondsSince(*spans_.front().first);
    }
    return totals_;
  }

 private:
  static Tensor Take(std::map<Key, Tensor>& tensors, Key key) {
    auto it = tensors.find(key);
    CHECK(it != tensors.end()) << "no tensor for (m" << key.first << ", c" << key.second << ")";
    Tensor t = std::move(it->second);
    tensors.erase(it);
    return t;
  }

  Tensor Receive(std::map<Key, Tensor>& tensors, Key key) {
    Tensor t = Tensor::Empty(options_.activation_shape, options_.activation_dtype, device_);
    CHECK(tensors.emplace(key, t).second)
        << "received (m" << key.first << ", c" << key.second << ") twice";
    return t;
  }

  const std::vector<std::unique_ptr<GptModel>>& chunks_;
  Communicator* pipeline_;
  const std::function<Microbatch(int)>& microbatch_;
  const PipelineStepOptions& options_;
  Device device_;
  std::map<Key, std::unique_ptr<SavedTensors>> saved_;
  std::map<Key, Tensor> outputs_, input_grads_, received_activations_, received_grads_;
  std::vector<std::pair<std::unique_ptr<Event>, std::unique_ptr<Event>>> spans_;
  int action_span_ = -1;  // the traced span of the running forward or backward
  PipelineStepTotals totals_;
};

}  // namespace

PipelineStepTotals RunPipelineStep(const RankActions& actions,
                                   const std::vector<std::unique_ptr<GptModel>>& chunks,
                                   Communicator* pipeline,
                                   const std::function<Microbatch(int)>& microbatch,
                                   const PipelineStepOptions& options) {
  StepRun run(chunks, pipeline, microbatch, options);
  if (options.training) run.CreateContexts(actions);
  std::map<int, size_t> last_backward;  // chunk -> index of its last backward action
  for (size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].kind == Kind::kBackward) last_backward[actions[i].chunk] = i;
  }
  for (size_t i = 0; i < actions.size();) {
    const Action& action = actions[i];
    if (action.kind == Kind::kForward || action.kind == Kind::kBackward) {
      run.BeginCompute(action);
      if (action.kind == Kind::kForward) {
        run.Forward(action.microbatch, action.chunk);
      } else {
        run.Backward(action.microbatch, action.chunk, last_backward.at(action.chunk) == i);
      }
      run.EndCompute();
      ++i;
    } else {
      size_t end = i;
      while (end < actions.size() && actions[end].is_communication()) ++end;
      run.Communicate(actions.data() + i, actions.data() + end);
      i = end;
    }
  }
  return run.Finish();
}

}  // namespace moe
