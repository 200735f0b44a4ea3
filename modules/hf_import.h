// Import of a Hugging Face checkpoint directory (config.json and model.safetensors, or the shards
// that model.safetensors.index.json lists) of a qwen3_moe, mixtral or olmoe model into a
// weights-only checkpoint of ours (checkpoint_state.h), which moe_train starts from with
// --finetune:
//
//   OUT/latest, OUT/step_00000000/{model.safetensors, optimizer.safetensors (empty), state.json}
//   OUT/model.flags   the model's moe_train flags (model_shape.h: ModelShapeFlagfile), so that
//                     `moe_train --flagfile=OUT/model.flags --load=OUT --finetune ...` runs it
//
// Memory: the files are read one at a time, and each tensor a few MiB at a time, widened to f32
// (BF16 and F16 exactly) and written at its place in our model.safetensors, whose header is
// written first and whose size is set before any tensor (SafetensorsWriter): the model is never
// held in memory, not even once.
//
// Checked before anything is written: config.json (hf_config.h's refusals; a model this build
// cannot train, CheckModel, is refused too), the index (each file it names present, every tensor
// in the file the index gives), that the checkpoint holds exactly the tensors the config implies
// (hf_tensor_map.h: per-expert or stacked experts, found from the names) with their shapes, as
// float tensors. Values must be finite. Each refusal is one line. OUT is built under a temporary
// name and renamed into place when complete (StagedDirectory): an existing OUT must be an empty
// directory, and nothing is left behind on an error.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "modules/gpt_config.h"
#include "modules/hf_config.h"

namespace moe {

inline constexpr const char* kModelFlagsFile = "model.flags";

struct HfImportOptions {
  std::string hf_dir;
  std::string out;
  int64_t seq_length = 0;  // 0: config.json's max_position_embeddings
};

struct HfImportSummary {
  HfModelType type;
  GptConfig config;
  int files = 0;           // safetensors files read
  int64_t tensors = 0;     // Hugging Face tensors
  int64_t parameters = 0;  // elements
  std::string dtypes;      // the stored dtypes, e.g. "BF16"
};

StatusOr<HfImportSummary> ImportHfCheckpoint(const HfImportOptions& options);

}  // namespace moe
