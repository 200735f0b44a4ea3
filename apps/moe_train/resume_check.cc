#include "apps/moe_train/resume_check.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include <gflags/gflags.h>

#include "apps/common/output_checks.h"
#include "apps/moe_train/flag_table.h"
#include "engine/io/checkpoint.h"
#include "engine/io/checkpoint_scan.h"
#include "modules/checkpoint_state.h"
#include "modules/model_shape.h"

namespace moe {
namespace {

// The checkpoint's value of flag `name` as its run recorded it ("" if it did not).
std::string RecordedFlag(const nlohmann::json& state, const char* name) {
  const nlohmann::json* flags = nullptr;
  if (state.contains("run") && state["run"].is_object() && state["run"].contains("flags")) {
    flags = &state["run"]["flags"];
  }
  if (flags == nullptr || !flags->is_object() || !flags->contains(name)) return "";
  const nlohmann::json& value = (*flags)[name];
  return value.is_string() ? value.get<std::string>() : "";
}

// The resume notes on the data stream (resume_check.h); takes the checkpoint's seed when --seed
// is not given (FLAGS_seed too, so that the run's description and its checkpoints record it).
void ContinueDataStream(const nlohmann::json& state, int64_t step, RunConfig* run) {
  const std::string at = " from step " + std::to_string(step);
  if (state.contains("seed") && state["seed"].is_number_integer() &&
      state["seed"].get<uint64_t>() <= std::numeric_limits<int64_t>::max()) {
    const uint64_t seed = state["seed"].get<uint64_t>();
    if (seed != run->trainer.seed && gflags::GetCommandLineFlagInfoOrDie("seed").is_default) {
      FLAGS_seed = static_cast<int64_t>(seed);
      run->trainer.seed = seed;
      run->data.synthetic.seed = seed;
      run->notes.push_back("resume: --seed=" + std::to_string(seed) +
                           ", the checkpoint's (--seed not given): its data order continues");
    } else if (seed != run->trainer.seed) {
      run->notes.push_back("resume: --seed=" + std::to_string(FLAGS_seed) +
                           " differs from the checkpoint's " + std::to_string(seed) +
                           ": a new data order" + at +
                           (run->data.format == "synthetic" ? " (and a new synthetic chain)" : ""));
    }
  }
  const std::string format = RecordedFlag(state, "data_format");
  const std::string path = RecordedFlag(state, "data_path");
  if (!format.empty() && (format != run->data.format || path != run->data.path)) {
    const auto source = [](const std::string& f, const std::string& p) {
      return "--data_format=" + f + (p.empty() ? "" : " --data_path=" + p);
    };
    run->notes.push_back("resume: the checkpoint trained on " + source(format, path) +
                         "; this run reads " + source(run->data.format, run->data.path) + at);
  }
}

// Flags that set what the resumed steps compute: the optimizer and its schedule, the batch, the
// losses' coefficients, the precision of gradients and moments.
constexpr const char* kTrainingFlags[] = {"lr",
                                          "min_lr",
                                          "warmup_steps",
                                          "train_steps",
                                          "weight_decay",
                                          "clip_grad",
                                          "adam_beta1",
                                          "adam_beta2",
                                          "adam_eps",
                                          "global_batch_size",
                                          "micro_batch_size",
                                          "moe_aux_loss_coeff",
                                          "moe_z_loss_coeff",
                                          "exp_avg_dtype",
                                          "exp_avg_sq_dtype",
                                          "main_grads_dtype"};

// Whether this run's value of `name` differs from the checkpoint's run's `recorded` one (doubles
// by value: a checkpoint may have written another form of the same number).
bool DiffersFromRecorded(const char* name, const std::string& recorded) {
  const gflags::CommandLineFlagInfo info = gflags::GetCommandLineFlagInfoOrDie(name);
  if (info.type != "double") return recorded != info.current_value;
  char* end = nullptr;
  const double value = std::strtod(recorded.c_str(), &end);
  return end == recorded.c_str() || *end != '\0' ||
         value != std::strtod(info.current_value.c_str(), nullptr);
}

// One note naming the training flags (kTrainingFlags) whose value differs from the one the
// checkpoint's run recorded: the user's choice, but a mistyped one would change the run unseen.
void NoteChangedTrainingFlags(const nlohmann::json& state, int64_t step, RunConfig* run) {
  std::string changed;
  int count = 0;
  for (const char* name : kTrainingFlags) {
    const std::string recorded = RecordedFlag(state, name);
    if (recorded.empty() || !DiffersFromRecorded(name, recorded)) continue;
    changed += std::string(count++ == 0 ? "" : ", ") + "--" + name + "=" + FlagValueText(name) +
               " (checkpoint " + recorded + ")";
  }
  if (count == 0) return;
  run->notes.push_back("resume: " + changed + (count == 1 ? " differs" : " differ") +
                       " from the checkpoint's run; from step " + std::to_string(step) +
                       " this run's values apply");
}

// --finetune: the checkpoint's parameters are this model's; the rest of its model may differ
// (noted), and nothing else of it is used.
Status CheckFinetune(const nlohmann::json& state, const std::string& dir, RunConfig* run) {
  const std::string shapes =
      ModelShapeDifferences(state["model"], run->model, ShapeFields::kParameters);
  if (!shapes.empty()) {
    return InvalidArgument("--load " + dir + " --finetune: the checkpoint's parameters differ in " +
                           shapes);
  }
  const std::string others = ModelShapeDifferences(state["model"], run->model);
  run->finetune = true;
  run->notes.push_back(
      "finetune: the weights of " + dir + " at step 0, a fresh optimizer, the data from the start" +
      (others.empty()
           ? ""
           : "; the checkpoint's model differs in " + others + ": this run's values apply"));
  return Status::Ok();
}

}  // namespace

Status CheckResume(RunConfig* run) {
  if (FLAGS_load.empty()) return Status::Ok();
  if (FLAGS_finetune && !FLAGS_save.empty() && SamePath(FLAGS_load, FLAGS_save)) {
    return InvalidArgument("--finetune trains afresh from --load's weights: --save " + FLAGS_save +
                           " must be another directory (a restart resumes with --load=" +
                           FLAGS_save + " and no --finetune)");
  }
  if (!FLAGS_save.empty() && SamePath(FLAGS_load, FLAGS_save)) {
    const CheckpointRootEntries entries = ListCheckpointRoot(FLAGS_load);
    if (entries.step_dirs.empty() && !entries.latest) {
      run->notes.push_back("resume: --load " + FLAGS_load +
                           " holds no checkpoint yet (it is --save): training from step 0");
      return Status::Ok();
    }
  }
  StatusOr<CheckpointState> read = ReadCheckpointState(FLAGS_load);
  if (!read.ok()) return InvalidArgument("--load " + FLAGS_load + ": " + read.status().message());
  const std::string& dir = read->dir;
  if (!read->note.empty()) run->notes.push_back("resume: " + read->note);
  run->resume_dir = dir;
  const nlohmann::json& state = read->state;
  if (!state.is_object() || !state.contains("model") || !state["model"].is_object()) {
    return InvalidArgument("--load " + dir + ": state.json has no model shape");
  }
  if (FLAGS_finetune) return CheckFinetune(state, dir, run);
  if (IsWeightsOnlyCheckpoint(state)) {
    return InvalidArgument("--load " + dir +
                           " holds model weights only (no optimizer state, e.g. an hf_convert "
                           "import): add --finetune to train from them with a fresh optimizer");
  }
  const std::string differences = ModelShapeDifferences(state["model"], run->model);
  if (!differences.empty()) {
    return InvalidArgument("--load " + dir + ": the checkpoint's model differs in " + differences);
  }
  // The counters the trainer restores: the step, AdamW's step (its bias correction) and the
  // samples read, as a checkpoint writes them (0 <= optimizer_step <= step).
  for (const char* key : {"step", "optimizer_step", "consumed_train_samples"}) {
    if (!state.contains(key) || !state[key].is_number_integer() || state[key].get<int64_t>() < 0) {
      return InvalidArgument("--load " + dir + ": state.json's \"" + key +
                             "\" is not an integer >= 0");
    }
  }
  const int64_t step = state["step"].get<int64_t>();
  // A directory named as Save names step directories must hold that step: one holding another
  // was renamed or damaged, and would resume at a step it does not say.
  const std::string name = std::filesystem::path(dir).filename().string();
  if (IsCheckpointStepDirName(name) && name != CheckpointStepDirName(step)) {
    return InvalidArgument("--load " + dir + ": state.json's \"step\" " + std::to_string(step) +
                           " is not its directory's (" + name + ": renamed or damaged?)");
  }
  if (state["optimizer_step"].get<int64_t>() > step) {
    return InvalidArgument("--load " + dir + ": state.json's \"optimizer_step\" " +
                           state["optimizer_step"].dump() + " is beyond its step " +
                           std::to_string(step));
  }
  if (run->trainer.train_steps <= step && FLAGS_dump_reference_case.empty()) {
    return InvalidArgument("--train_steps=" + std::to_string(run->trainer.train_steps) +
                           " is not beyond step " + std::to_string(step) + " of --load " + dir +
                           ": nothing to train (--train_steps counts from step 0)");
  }
  const auto [trace_first, trace_last] = run->trace_steps;
  if (trace_last >= trace_first && trace_first <= step) {
    return InvalidArgument("--trace_steps=" + FLAGS_trace_steps + " starts at or before step " +
                           std::to_string(step) + " of --load " + dir + ", where the run resumes");
  }
  ContinueDataStream(state, step, run);
  NoteChangedTrainingFlags(state, step, run);
  return Status::Ok();
}

}  // namespace moe
