#include "apps/moe_train/resume_check.h"

#include <string>

#include "engine/io/checkpoint.h"
#include "modules/model_shape.h"

namespace moe {
Status CheckResume(const RunConfig& run) {
  if (FLAGS_load.empty()) return Status::Ok();
  StatusOr<CheckpointState> read = ReadCheckpointState(FLAGS_load);
  if (!read.ok()) return InvalidArgument("--load " + FLAGS_load + ": " + read.status().message());
  const std::string& dir = read->dir;
  const nlohmann::json& state = read->state;
  if (!state.is_object() || !state.contains("model") || !state["model"].is_object() ||
      !state.contains("step") || !state["step"].is_number_integer()) {
    return InvalidArgument("--load " + dir + ": state.json has no model shape or step");
  }
  const std::string differences = ModelShapeDifferences(state["model"], run.model);
  if (!differences.empty()) {
    return InvalidArgument("--load " + dir + ": the checkpoint's model differs in " + differences);
  }
  const int64_t step = state["step"].get<int64_t>();
  if (run.trainer.train_steps <= step) {
    return InvalidArgument("--train_steps=" + std::to_string(run.trainer.train_steps) +
                           " is not beyond step " + std::to_string(step) + " of --load " + dir +
                           ": nothing to train (--train_steps counts from step 0)");
  }
  const auto [trace_first, trace_last] = run.trace_steps;
  if (trace_last >= trace_first && trace_first <= step) {
    return InvalidArgument("--trace_steps=" + FLAGS_trace_steps + " starts at or before step " +
                           std::to_string(step) + " of --load " + dir + ", where the run resumes");
  }
  return Status::Ok();
}

}  // namespace moe
