#include "modules/hf_export.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/staged_directory.h"
#include "modules/gpt_model.h"
#include "modules/hf_tensor_map.h"
#include "modules/model_shape.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// model-00001-of-00003.safetensors, as transformers names shards.
std::string ShardName(int index, int count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index + 1, count);
  return name;
}

// Our model.safetensors holds exactly the parameters `specs` lists, with their shapes.
Status CheckParameters(const SafetensorsReader& reader, const std::vector<ParameterSpec>& specs) {
  std::set<std::string> expected;
  for (const ParameterSpec& spec : specs) {
    expected.insert(spec.name);
    const SafetensorsReader::TensorInfo* info = reader.Find(spec.name);
    if (info == nullptr) {
      return InvalidArgument("'" + reader.path() + "' has no tensor '" + spec.name +
                             "', a parameter of the model its state.json describes");
    }
    if (info->shape != spec.shape) {
      return InvalidArgument("tensor '" + spec.name + "' in '" + reader.path() + "' has shape " +
                             ShapeString(info->shape) + "; the model its state.json describes " +
                             "needs " + ShapeString(spec.shape));
    }
  }
  for (const SafetensorsReader::TensorInfo& t : reader.tensors()) {
    if (!expected.count(t.name)) {
      return InvalidArgument("'" + reader.path() + "' holds tensor '" + t.name +
                             "', which the model its state.json describes does not have");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<HfExportSummary> ExportHfCheckpoint(const HfExportOptions& options) {
  CHECK(options.dtype == DType::kF32 || options.dtype == DType::kBF16);
  CHECK_GT(options.max_shard_bytes, 0);
  MOE_RETURN_IF_ERROR(StagedDirectory::CheckUnused(options.out));
  MOE_ASSIGN_OR_RETURN(const CheckpointState checkpoint, ReadCheckpointState(options.checkpoint));
  const std::string& dir = checkpoint.dir;
  if (!checkpoint.state.is_object() || !checkpoint.state.contains("model")) {
    return InvalidArgument("checkpoint '" + dir + "': state.json has no model shape");
  }
  StatusOr<GptConfig> read = GptConfigFromModelShape(checkpoint.state["model"]);
  if (!read.ok()) {
    return InvalidArgument("checkpoint '" + dir + "': state.json: " + read.status().message());
  }
  const GptConfig config = *read;
  if (const Status known = CheckModel(config); !known.ok()) {
    return InvalidArgument("checkpoint '" + dir +
                           "' holds a model this build cannot read: " + known.message());
  }
  const HfModelType type = options.model_type.value_or(DefaultHfModelType(config));
  const std::string dtype_name = options.dtype == DType::kBF16 ? "bfloat16" : "float32";
  MOE_ASSIGN_OR_RETURN(const nlohmann::json hf_config, HfConfigFor(config, type, dtype_name));

  MOE_ASSIGN_OR_RETURN(const auto reader,
                       SafetensorsReader::Open((fs::path(dir) / kCheckpointModelFile).string()));
  MOE_RETURN_IF_ERROR(CheckParameters(
      *reader, GptModel::StageParameterSpecs(config, GptStage{0, config.num_layers, true, true})));

  // Shards in model order, each up to max_shard_bytes (a larger tensor alone in one).
  const std::vector<HfTensorSlice> slices =
      HfTensorSlices(config, type, HfExpertLayout::kPerExpert);
  std::vector<std::vector<const HfTensorSlice*>> shards;
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const HfTensorSlice& s : slices) {
    const int64_t bytes = NumElements(s.hf_shape) * static_cast<int64_t>(DTypeSize(options.dtype));
    if (shards.empty() || (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&s);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  MOE_ASSIGN_OR_RETURN(StagedDirectory staged, StagedDirectory::Create(options.out));
  nlohmann::json weight_map = nlohmann::json::object();
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    const std::string name = ShardName(i, count);
    std::vector<SafetensorsWriter::TensorSpec> specs;
    for (const HfTensorSlice* s : shards[i]) {
      specs.push_back({s->hf_name, options.dtype, s->hf_shape});
      weight_map[s->hf_name] = name;
    }
    MOE_ASSIGN_OR_RETURN(const auto writer,
                         SafetensorsWriter::Create((fs::path(staged.path()) / name).string(), specs,
                                                   {{"format", "pt"}}));
    for (const HfTensorSlice* s : shards[i]) {
      MOE_RETURN_IF_ERROR(CopySafetensorsElements(*reader, s->ours, s->offset, *writer, s->hf_name,
                                                  0, NumElements(s->hf_shape),
                                                  NonFiniteValues::kRefuse));
    }
    MOE_RETURN_IF_ERROR(writer->Finish());
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                {"weight_map", weight_map}};
  MOE_RETURN_IF_ERROR(staged.WriteFile("model.safetensors.index.json", index.dump(2) + "\n"));
  MOE_RETURN_IF_ERROR(staged.WriteFile("config.json", hf_config.dump(2) + "\n"));
  MOE_RETURN_IF_ERROR(staged.Publish());
  return HfExportSummary{type, dir, count, static_cast<int64_t>(slices.size()), total_bytes};
}

}  // namespace moe
