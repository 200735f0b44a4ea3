// What a checkpoint's state.json holds (engine/io/checkpoint.h stores it verbatim), written by the
// trainer (Trainer::Save) and by importers of other formats (hf_import.h): the one home of its
// keys.
//   step, optimizer_step,    integers >= 0: where a resumed run continues (the trainer's step,
//   consumed_train_samples   AdamW's step, the samples read)
//   seed                     the run's seed, which keys its data order (absent: weights only)
//   model                    the model shape (model_shape.h)
//   run                      what the writer says of itself (moe_train: its flags and device)
//   weights_only             true: model.safetensors holds the weights and nothing else holds
//                            any state (no optimizer moments, step 0): a run starts from it with
//                            --finetune and cannot resume it
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "modules/gpt_config.h"

namespace moe {

nlohmann::json TrainingCheckpointState(int64_t step, int64_t optimizer_step,
                                       int64_t consumed_train_samples, uint64_t seed,
                                       const GptConfig& config, nlohmann::json run);
nlohmann::json WeightsOnlyCheckpointState(const GptConfig& config, nlohmann::json run);
bool IsWeightsOnlyCheckpoint(const nlohmann::json& state);

}  // namespace moe
