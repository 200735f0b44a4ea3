// hf_convert: Hugging Face checkpoints in and out of the trainer (modules/hf_import.h,
// modules/hf_export.h: what is read, written and refused).
//
//   hf_convert import --hf_dir=D --out=CKPT [--seq_length=N]
//       a Qwen3MoeForCausalLM, MixtralForCausalLM or OlmoeForCausalLM directory into a weights-only
//       checkpoint and CKPT/model.flags; then
//       moe_train --flagfile=CKPT/model.flags --load=CKPT --finetune ...
//   hf_convert export --load=CKPT --out=D [--model_type=qwen3_moe|mixtral|olmoe]
//                     [--dtype=bf16|fp32] [--max_shard_gib=5]
//       a checkpoint of ours (a --save root: its newest step; or a step directory) into a
//       directory transformers' from_pretrained() loads
//
// The command line is read as moe_train's is (apps/common/command_line.h), after the command word.
// Every input is used or refused before any work, in one line on stderr and exit code 2: a flag
// of the other command, a missing or out-of-range flag, an output that exists and is not an
// empty directory (nothing is overwritten), a missing file, a model that cannot be represented,
// a tensor of another shape. A failure while writing is one line and exit code 1; either way the
// output directory is not created (it is written under a temporary name and renamed when done).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/common/command_line.h"
#include "apps/common/output_checks.h"
#include "engine/core/byte_units.h"
#include "engine/io/staged_directory.h"
#include "modules/hf_export.h"
#include "modules/hf_import.h"

DEFINE_string(hf_dir, "",
              "import: the Hugging Face model directory (config.json, and model.safetensors or "
              "model.safetensors.index.json with its shards)");
DEFINE_string(out, "",
              "the directory to create (absent or empty): import, the checkpoint; export, the "
              "Hugging Face directory");
DEFINE_int64(seq_length, 0,
             "import: the --seq_length model.flags gives (0: config.json's "
             "max_position_embeddings); moe_train's own --seq_length overrides it");
DEFINE_string(load, "",
              "export: the checkpoint (a --save root: its newest complete step; or a step "
              "directory)");
DEFINE_string(model_type, "",
              "export: qwen3_moe | mixtral | olmoe (default: from the model's query/key norm: "
              "across heads olmoe, per head qwen3_moe, none mixtral)");
DEFINE_string(dtype, "bf16", "export: the weights' dtype: bf16 (rounded to nearest even) | fp32");
DEFINE_double(max_shard_gib, 5, "export: the most tensor data per safetensors file, in GiB");

namespace moe {
namespace {

constexpr const char* kProgram = "hf_convert";
constexpr const char* kUsage =
    "usage: hf_convert import --hf_dir=D --out=CKPT [--seq_length=N]\n"
    "       hf_convert export --load=CKPT --out=D [--model_type=qwen3_moe|mixtral|olmoe] "
    "[--dtype=bf16|fp32] [--max_shard_gib=5]\n";

struct Command {
  const char* name;
  std::vector<const char*> required;
  std::vector<const char*> optional;
};
const Command kCommands[] = {
    {"import", {"hf_dir", "out"}, {"seq_length"}},
    {"export", {"load", "out"}, {"model_type", "dtype", "max_shard_gib"}},
};

int Fail(const Status& status) {
  fprintf(stderr, "%s: %s\n", kProgram, status.message().c_str());
  return status.code() == StatusCode::kInternal ? 1 : 2;
}

void PrintHelp() {
  printf("%s\nflags:\n", kUsage);
  for (const Command& command : kCommands) {
    for (const auto* list : {&command.required, &command.optional}) {
      for (const char* name : *list) {
        const gflags::CommandLineFlagInfo info = gflags::GetCommandLineFlagInfoOrDie(name);
        printf("  %s --%s (default '%s'): %s\n", command.name, name, info.default_value.c_str(),
               info.description.c_str());
      }
    }
  }
}

// Every flag set belongs to `command`, and its required ones are set.
Status CheckFlagsOf(const Command& command) {
  std::set<std::string> own(command.required.begin(), command.required.end());
  own.insert(command.optional.begin(), command.optional.end());
  for (const Command& other : kCommands) {
    for (const auto* list : {&other.required, &other.optional}) {
      for (const char* name : *list) {
        if (own.count(name) || gflags::GetCommandLineFlagInfoOrDie(name).is_default) continue;
        return InvalidArgument(std::string("--") + name + " is a flag of hf_convert " + other.name +
                               ", not of " + command.name);
      }
    }
  }
  for (const char* name : command.required) {
    if (gflags::GetCommandLineFlagInfoOrDie(name).current_value.empty()) {
      return InvalidArgument(std::string("hf_convert ") + command.name + " needs --" + name);
    }
  }
  return Status::Ok();
}

Status CheckOutput() {
  MOE_RETURN_IF_ERROR(CheckOutputDirectory("out", FLAGS_out));
  const Status unused = StagedDirectory::CheckUnused(FLAGS_out);
  if (!unused.ok()) return InvalidArgument("--out " + unused.message());
  return Status::Ok();
}

int Import() {
  if (FLAGS_seq_length < 0) {
    return Fail(InvalidArgument("--seq_length=" + std::to_string(FLAGS_seq_length) +
                                " must be >= 0 (0: config.json's max_position_embeddings)"));
  }
  if (const Status output = CheckOutput(); !output.ok()) return Fail(output);
  StatusOr<HfImportSummary> imported =
      ImportHfCheckpoint({FLAGS_hf_dir, FLAGS_out, FLAGS_seq_length});
  if (!imported.ok()) return Fail(imported.status());
  const GptConfig& c = imported->config;
  printf(
      "imported %s from %s: %lld tensors in %d file%s (%s) -> %s: %.2fM parameters (f32), "
      "%lld layers (%lld dense), hidden %lld, %lld experts top-%lld, seq_length %lld\n",
      HfArchitecture(imported->type), FLAGS_hf_dir.c_str(), (long long)imported->tensors,
      imported->files, imported->files == 1 ? "" : "s", imported->dtypes.c_str(), FLAGS_out.c_str(),
      imported->parameters / 1e6, (long long)c.num_layers,
      (long long)std::min(c.num_layers, c.first_dense_layers), (long long)c.hidden_size,
      (long long)c.num_experts, (long long)c.moe_router_topk, (long long)c.seq_length);
  printf(
      "train from it (step 0, fresh optimizer): moe_train --flagfile=%s/%s --load=%s "
      "--finetune ...\n",
      FLAGS_out.c_str(), kModelFlagsFile, FLAGS_out.c_str());
  return 0;
}

int Export() {
  HfExportOptions options{FLAGS_load, FLAGS_out, std::nullopt, DType::kBF16, 0};
  if (!FLAGS_model_type.empty()) {
    options.model_type = HfModelTypeNamed(FLAGS_model_type);
    if (!options.model_type) {
      return Fail(
          InvalidArgument("--model_type=" + FLAGS_model_type + " must be " + kHfModelTypeNames));
    }
  }
  if (FLAGS_dtype != "bf16" && FLAGS_dtype != "fp32") {
    return Fail(InvalidArgument("--dtype=" + FLAGS_dtype + " must be bf16 or fp32"));
  }
  options.dtype = FLAGS_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  if (!(FLAGS_max_shard_gib > 0 && FLAGS_max_shard_gib <= 1024)) {  // NaN too
    return Fail(InvalidArgument(
        "--max_shard_gib=" + gflags::GetCommandLineFlagInfoOrDie("max_shard_gib").current_value +
        " must be in (0, 1024]"));
  }
  options.max_shard_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(FLAGS_max_shard_gib * kGiB)));
  if (const Status output = CheckOutput(); !output.ok()) return Fail(output);
  StatusOr<HfExportSummary> exported = ExportHfCheckpoint(options);
  if (!exported.ok()) return Fail(exported.status());
  printf("exported %s as %s%s to %s: %lld tensors, %.3f GiB %s in %d file%s\n",
         exported->checkpoint_dir.c_str(), HfArchitecture(exported->type),
         FLAGS_model_type.empty() ? " (--model_type from its query/key norm)" : "",
         FLAGS_out.c_str(), (long long)exported->tensors, exported->bytes / kGiB,
         FLAGS_dtype.c_str(), exported->shards, exported->shards == 1 ? "" : "s");
  return 0;
}

int Run(int argc, char** argv) {
  const std::string word = argc > 1 ? argv[1] : "";
  if (word == "-h" || word == "--help" || word == "-help" || word == "help") {
    PrintHelp();
    return 0;
  }
  const Command* command = nullptr;
  for (const Command& c : kCommands) {
    if (word == c.name) command = &c;
  }
  if (command == nullptr) {
    fprintf(stderr, "%s: the first argument must be import or export, not '%s' (--help)\n",
            kProgram, word.c_str());
    return 2;
  }
  std::vector<char*> args = {argv[0]};
  args.insert(args.end(), argv + 2, argv + argc);
  StatusOr<HelpRequest> parsed = ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (!parsed.ok()) return Fail(parsed.status());
  if (*parsed != HelpRequest::kNone) {
    PrintHelp();
    return 0;
  }
  if (const Status flags = CheckFlagsOf(*command); !flags.ok()) return Fail(flags);
  return command == &kCommands[0] ? Import() : Export();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  gflags::SetUsageMessage(moe::kUsage);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return moe::Run(argc, argv);
}
