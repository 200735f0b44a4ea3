#include "modules/checkpoint_state.h"

#include <utility>

#include "modules/model_shape.h"

namespace moe {
namespace {

constexpr const char* kWeightsOnly = "weights_only";

}  // namespace

nlohmann::json TrainingCheckpointState(int64_t step, int64_t optimizer_step,
                                       int64_t consumed_train_samples, uint64_t seed,
                                       const GptConfig& config, nlohmann::json run) {
  return {{"step", step},
          {"optimizer_step", optimizer_step},
          {"consumed_train_samples", consumed_train_samples},
          {"seed", seed},
          {"model", ModelShapeJson(config)},
          {"run", std::move(run)}};
}

nlohmann::json WeightsOnlyCheckpointState(const GptConfig& config, nlohmann::json run) {
  return {{"step", 0},
          {"optimizer_step", 0},
          {"consumed_train_samples", 0},
          {"model", ModelShapeJson(config)},
          {"run", std::move(run)},
          {kWeightsOnly, true}};
}

bool IsWeightsOnlyCheckpoint(const nlohmann::json& state) {
  return state.is_object() && state.contains(kWeightsOnly) && state[kWeightsOnly] == true;
}

}  // namespace moe
