#include "modules/hf_import.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/staged_directory.h"
#include "modules/checkpoint_state.h"
#include "modules/gpt_model.h"
#include "modules/hf_tensor_map.h"
#include "modules/model_shape.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

StatusOr<nlohmann::json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return NotFound("'" + path.string() + "' does not exist or cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

// Which file holds each tensor: the index's weight_map, or every tensor of model.safetensors.
struct WeightFiles {
  std::map<std::string, std::string> file_of;  // Hugging Face name -> file name in the directory
  std::vector<std::string> files;              // each once, sorted
};

StatusOr<WeightFiles> FindWeightFiles(const fs::path& dir) {
  WeightFiles out;
  std::set<std::string> files;
  std::error_code error;
  if (fs::exists(dir / kIndexFile, error)) {
    MOE_ASSIGN_OR_RETURN(const nlohmann::json index, ReadJson(dir / kIndexFile));
    const std::string where = "'" + (dir / kIndexFile).string() + "'";
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return InvalidArgument(where + " has no \"weight_map\" object");
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      const bool plain = file.is_string() && !file.get<std::string>().empty() &&
                         file.get<std::string>().find('/') == std::string::npos &&
                         file.get<std::string>() != "." && file.get<std::string>() != "..";
      if (!plain) {
        return InvalidArgument(where + ": weight_map gives '" + name + "' the file " + file.dump() +
                               ", not a file name in the directory");
      }
      out.file_of[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
  } else if (fs::exists(dir / kSingleFile, error)) {
    MOE_ASSIGN_OR_RETURN(const auto reader, SafetensorsReader::Open((dir / kSingleFile).string()));
    for (const auto& t : reader->tensors()) out.file_of[t.name] = kSingleFile;
    files.insert(kSingleFile);
  } else {
    return NotFound("'" + dir.string() + "' has neither " + kSingleFile + " nor " + kIndexFile +
                    " (hf_convert reads safetensors checkpoints)");
  }
  out.files.assign(files.begin(), files.end());
  return out;
}

// Every expected tensor in the files, none other, with its shape and a float dtype; returns the
// dtypes seen ("BF16", ...).
StatusOr<std::set<std::string>> CheckTensors(const fs::path& dir, const WeightFiles& weights,
                                             const std::vector<HfTensorSlice>& slices,
                                             const std::string& model) {
  std::map<std::string, const HfTensorSlice*> expected;
  for (const HfTensorSlice& s : slices) expected[s.hf_name] = &s;
  int64_t missing = 0;
  std::string first_missing;
  for (const auto& [name, slice] : expected) {
    if (weights.file_of.count(name)) continue;
    if (missing++ == 0) first_missing = name;
  }
  if (missing > 0) {
    return InvalidArgument("'" + dir.string() + "' has no tensor '" + first_missing + "' (" +
                           std::to_string(missing) + " of the " + std::to_string(expected.size()) +
                           " tensors of " + model + " are missing)");
  }
  int64_t unexpected = 0;
  std::string first_unexpected;
  for (const auto& [name, file] : weights.file_of) {
    if (expected.count(name)) continue;
    if (unexpected++ == 0) first_unexpected = name + "' (in " + file + ")";
  }
  if (unexpected > 0) {
    return InvalidArgument("'" + dir.string() + "' holds tensor '" + first_unexpected + ", which " +
                           model + " has no place for (" + std::to_string(unexpected) +
                           " such tensors)");
  }
  std::set<std::string> dtypes;
  for (const std::string& file : weights.files) {
    MOE_ASSIGN_OR_RETURN(const auto reader, SafetensorsReader::Open((dir / file).string()));
    for (const auto& [name, in_file] : weights.file_of) {
      if (in_file != file) continue;
      const SafetensorsReader::TensorInfo* info = reader->Find(name);
      if (info == nullptr) {
        return InvalidArgument("'" + reader->path() + "' has no tensor '" + name + "', which " +
                               kIndexFile + " puts there");
      }
      const Shape& want = expected.at(name)->hf_shape;
      if (info->shape != want) {
        return InvalidArgument("tensor '" + name + "' in '" + reader->path() + "' has shape " +
                               ShapeString(info->shape) + "; " + model + " needs " +
                               ShapeString(want));
      }
      if (info->dtype != "F32" && info->dtype != "BF16" && info->dtype != "F16") {
        return InvalidArgument("tensor '" + name + "' in '" + reader->path() + "' is " +
                               info->dtype + ", not a float (F32, BF16 or F16)");
      }
      dtypes.insert(info->dtype);
    }
  }
  return dtypes;
}

// The runs tile every parameter the model creates exactly once (hf_tensor_map.h's promise).
void CheckTiling(const std::vector<ParameterSpec>& specs,
                 const std::vector<HfTensorSlice>& slices) {
  std::map<std::string, int64_t> covered;
  for (const HfTensorSlice& s : slices) covered[s.ours] += NumElements(s.hf_shape);
  CHECK_EQ(covered.size(), specs.size()) << "Hugging Face tensors map to other parameters";
  for (const ParameterSpec& spec : specs) {
    CHECK_EQ(covered[spec.name], NumElements(spec.shape)) << spec.name;
  }
}

}  // namespace

StatusOr<HfImportSummary> ImportHfCheckpoint(const HfImportOptions& options) {
  MOE_RETURN_IF_ERROR(StagedDirectory::CheckUnused(options.out));
  const fs::path dir(options.hf_dir);
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return NotFound("'" + dir.string() + "' is not a directory");
  }
  MOE_ASSIGN_OR_RETURN(const nlohmann::json config_json, ReadJson(dir / kConfigFile));
  StatusOr<HfModel> read = HfModelFromConfig(config_json);
  if (!read.ok()) {
    return Status(read.status().code(), dir.string() + "/" + read.status().message());
  }
  HfModel hf = std::move(read).value();
  GptConfig& config = hf.config;
  config.seq_length = options.seq_length > 0 ? options.seq_length : hf.max_position_embeddings;
  const std::string model =
      std::string("the ") + HfModelTypeName(hf.type) + " model of " + (dir / kConfigFile).string();
  if (const Status trainable = CheckModel(config); !trainable.ok()) {
    return InvalidArgument(model + " is one this build cannot train: " + trainable.message());
  }

  MOE_ASSIGN_OR_RETURN(const WeightFiles weights, FindWeightFiles(dir));
  std::vector<std::string> names;
  for (const auto& [name, file] : weights.file_of) names.push_back(name);
  const std::vector<HfTensorSlice> slices =
      HfTensorSlices(config, hf.type, HfExpertLayoutOf(names));
  MOE_ASSIGN_OR_RETURN(const std::set<std::string> dtypes,
                       CheckTensors(dir, weights, slices, model));
  const std::vector<ParameterSpec> specs =
      GptModel::StageParameterSpecs(config, GptStage{0, config.num_layers, true, true});
  CheckTiling(specs, slices);

  const ModelFileWriter write_model = [&](const std::string& path,
                                          const SafetensorsMetadata& metadata) -> Status {
    std::vector<SafetensorsWriter::TensorSpec> ours;
    for (const ParameterSpec& spec : specs) ours.push_back({spec.name, DType::kF32, spec.shape});
    MOE_ASSIGN_OR_RETURN(const auto writer, SafetensorsWriter::Create(path, ours, metadata));
    for (const std::string& file : weights.files) {  // one file open at a time
      MOE_ASSIGN_OR_RETURN(const auto reader, SafetensorsReader::Open((dir / file).string()));
      for (const HfTensorSlice& s : slices) {
        if (weights.file_of.at(s.hf_name) != file) continue;
        MOE_RETURN_IF_ERROR(CopySafetensorsElements(*reader, s.hf_name, 0, *writer, s.ours,
                                                    s.offset, NumElements(s.hf_shape),
                                                    NonFiniteValues::kRefuse));
      }
    }
    return writer->Finish();
  };
  const nlohmann::json run = {{"imported_by", "hf_convert import"},
                              {"hf_dir", fs::absolute(dir).lexically_normal().string()},
                              {"hf_model_type", HfModelTypeName(hf.type)},
                              {"hf_config", config_json}};
  MOE_ASSIGN_OR_RETURN(StagedDirectory staged, StagedDirectory::Create(options.out));
  MOE_RETURN_IF_ERROR(SaveCheckpointWith(staged.path(), 0, write_model, {},
                                         WeightsOnlyCheckpointState(config, run)));
  MOE_RETURN_IF_ERROR(staged.WriteFile(
      kModelFlagsFile, std::string("# the model of ") + HfModelTypeName(hf.type) + " checkpoint " +
                           dir.string() + " (hf_convert import)\n" + ModelShapeFlagfile(config)));
  MOE_RETURN_IF_ERROR(staged.Publish());

  HfImportSummary summary{
      hf.type, config, static_cast<int>(weights.files.size()), static_cast<int64_t>(slices.size()),
      0,       ""};
  for (const ParameterSpec& spec : specs) summary.parameters += NumElements(spec.shape);
  for (const std::string& d : dtypes) summary.dtypes += (summary.dtypes.empty() ? "" : ", ") + d;
  return summary;
}

}  // namespace moe
