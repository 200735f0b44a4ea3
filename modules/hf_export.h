// Export of one of our checkpoints (a root: its newest complete step directory; or a step
// directory) to a Hugging Face directory that transformers loads with no missing or unexpected
// key:
//
//   OUT/config.json                          hf_config.h: HfConfigFor
//   OUT/model-00001-of-0000N.safetensors     per-expert names (hf_tensor_map.h), in model order,
//   ...                                      each file at most max_shard_bytes of tensor data (a
//                                            larger tensor alone in its file); metadata format pt
//   OUT/model.safetensors.index.json         {"metadata": {"total_size": bytes}, "weight_map"}
//
// Values: our f32 master weights, as f32 or rounded to bf16 (nearest even). The model type is
// the one asked for, else DefaultHfModelType of the checkpoint's model (its query/key norm).
// Memory: each tensor is copied a few MiB at a time from our model.safetensors into its shard
// (SafetensorsReader, SafetensorsWriter), never the model at once.
//
// Refused, one line each: a model the type cannot express (hf_config.h), a checkpoint whose
// state.json has no model shape, a model.safetensors without exactly the model's parameters and
// shapes, an OUT that exists and is not an empty directory. OUT is built under a temporary name
// and renamed into place when complete (StagedDirectory).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "modules/hf_config.h"

namespace moe {

struct HfExportOptions {
  std::string checkpoint;
  std::string out;
  std::optional<HfModelType> model_type;  // none: DefaultHfModelType
  DType dtype = DType::kBF16;             // kBF16 or kF32
  int64_t max_shard_bytes = int64_t{5} << 30;
};

struct HfExportSummary {
  HfModelType type;
  std::string checkpoint_dir;  // the step directory read
  int shards = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;  // tensor data written
};

StatusOr<HfExportSummary> ExportHfCheckpoint(const HfExportOptions& options);

}  // namespace moe
