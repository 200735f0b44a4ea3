// hf_convert as a user meets it, and moe_train --finetune from what it imports: an import trains
// from step 0 with the imported weights and a fresh optimizer; a weights-only checkpoint without
// --finetune, --finetune without --load, onto --load itself or into another model's parameters is
// one line and exit 2; so is every careless hf_convert command line, with nothing created or
// changed; an export writes a directory the import reads back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "engine/io/safetensors.h"
#include "tests/testing/command.h"
#include "tests/testing/hf_checkpoints.h"
#include "tests/testing/moe_train_run.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunCommand;
using testing::ScopedTempDir;

CommandResult HfConvert(const std::string& args) {
  return RunCommand(std::string(HF_CONVERT_BINARY) + " " + args);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An imported tiny Mixtral (tests/testing/hf_checkpoints.h) in dir/ckpt, its source in dir/hf.
testing::HfModelFiles ImportTinyMixtral(const ScopedTempDir& dir) {
  testing::HfModelFiles hf = testing::TinyMixtral(false, 21);
  testing::WriteHfDirectory(dir.Path("hf"), hf, 2, DType::kBF16);
  const CommandResult r = HfConvert("import --hf_dir=" + dir.Path("hf") +
                                    " --out=" + dir.Path("ckpt") + " --seq_length=16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("imported MixtralForCausalLM from " + dir.Path("hf") +
                          ": 41 tensors in 2 files (BF16)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("moe_train --flagfile=" + dir.Path("ckpt") +
                          "/model.flags --load=" + dir.Path("ckpt") + " --finetune"),
            std::string::npos)
      << r.output;
  return hf;
}

const char* kTrain =
    " --device=cpu --train_steps=3 --micro_batch_size=2 --global_batch_size=4 --log_interval=1";

TEST(HfConvertCliTest, AnImportFinetunesFromStepZeroWithItsWeights) {
  const ScopedTempDir dir;
  const testing::HfModelFiles hf = ImportTinyMixtral(dir);
  const std::string model =
      " --flagfile=" + dir.Path("ckpt/model.flags") + " --load=" + dir.Path("ckpt") + " --finetune";
  // The weights moe_train starts from are the import's (bf16 in the files, f32 here).
  CommandResult r = testing::RunMoeTrain(model + " --device=cpu --micro_batch_size=2 " +
                                         "--dump_reference_case=" + dir.Path("dump"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  StatusOr<SafetensorsContents> dump = ReadSafetensors(dir.Path("dump/reference.safetensors"));
  ASSERT_TRUE(dump.ok());
  const auto stored = testing::ReadAllTensors(dir.Path("hf"));
  const HostTensor& embedding = dump->tensors.at("embedding.weight");
  std::vector<float> values(embedding.bytes.size() / 4);
  std::memcpy(values.data(), embedding.bytes.data(), embedding.bytes.size());
  EXPECT_EQ(values, stored.at("model.embed_tokens.weight"));

  // Another sequence length is this run's choice, noted.
  r = testing::RunMoeTrain(model + kTrain + " --seq_length=8 --save=" + dir.Path("run") +
                           " --metrics_file=" + dir.Path("metrics.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("finetune: the weights of " + dir.Path("ckpt/step_00000000") +
                          " at step 0, a fresh optimizer, the data from the start; the "
                          "checkpoint's model differs in --seq_length (checkpoint 16, this run "
                          "8): this run's values apply"),
            std::string::npos)
      << r.output;
  const std::vector<nlohmann::json> steps = testing::StepRecords(dir.Path("metrics.jsonl"));
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps.front()["step"], 1);
  EXPECT_TRUE(fs::exists(dir.Path("run/step_00000003/optimizer.safetensors")));

  // What it saved is a full checkpoint: it resumes without --finetune, and exports.
  r = HfConvert("export --load=" + dir.Path("run") + " --out=" + dir.Path("out") + " --dtype=fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exported " + dir.Path("run/step_00000003") +
                          " as MixtralForCausalLM (--model_type from its query/key norm)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(dir.Path("out/config.json")));
  EXPECT_TRUE(fs::exists(dir.Path("out/model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(dir.Path("out/model-00001-of-00001.safetensors")));
}

struct Refusal {
  std::string args;  // "$D": the test's directory
  std::string line;  // what the one line holds
};

std::string WithDir(std::string text, const std::string& dir) {
  for (size_t at = text.find("$D"); at != std::string::npos; at = text.find("$D", at + 1)) {
    text.replace(at, 2, dir);
  }
  return text;
}

// The checkpoint flags refused around an import, each in one line with nothing created.
TEST(HfConvertCliTest, MoeTrainRefusesWeightsOnlyMisuseInOneLine) {
  const ScopedTempDir dir;
  ImportTinyMixtral(dir);
  const std::string flags = " --flagfile=$D/ckpt/model.flags --device=cpu";
  const std::vector<Refusal> refusals = {
      {flags + " --load=$D/ckpt",
       "moe_train: --load $D/ckpt/step_00000000 holds model weights only (no optimizer state, "
       "e.g. an hf_convert import): add --finetune to train from them with a fresh optimizer"},
      {flags + " --finetune",
       "moe_train: --finetune=true needs --load: it starts from --load's "
       "weights"},
      {flags + " --load=$D/ckpt --finetune --num_experts=8",
       "moe_train: --load $D/ckpt/step_00000000 --finetune: the checkpoint's parameters differ "
       "in --num_experts (checkpoint 4, this run 8)"},
      {flags + " --load=$D/ckpt --finetune --save=$D/ckpt",
       "--finetune trains afresh from --load's weights: --save $D/ckpt must be another "
       "directory (a restart resumes with --load=$D/ckpt and no --finetune)"},
  };
  for (const Refusal& refusal : refusals) {
    const std::vector<std::string> before = dir.List();
    const CommandResult r = testing::RunMoeTrain(WithDir(refusal.args, dir.path()));
    testing::ExpectRefusedInOneLine(r, WithDir(refusal.line, dir.path()));
    EXPECT_EQ(dir.List(), before) << refusal.args;
  }
}

TEST(HfConvertCliTest, RefusesCarelessCommandLinesInOneLineCreatingNothing) {
  const ScopedTempDir dir;
  testing::WriteHfDirectory(dir.Path("hf"), testing::TinyMixtral(false, 22));
  fs::create_directory(dir.Path("full"));
  std::ofstream(dir.Path("full/keep")) << "mine";
  const std::vector<Refusal> refusals = {
      {"", "hf_convert: the first argument must be import or export, not ''"},
      {"convert --hf_dir=$D/hf", "hf_convert: the first argument must be import or export"},
      {"import --hf_dir=$D/hf", "hf_convert: hf_convert import needs --out"},
      {"import --out=$D/ckpt", "hf_convert: hf_convert import needs --hf_dir"},
      {"import --hf_dir=$D/hf --out=$D/ckpt --dtype=fp32",
       "hf_convert: --dtype is a flag of hf_convert export, not of import"},
      {"export --load=$D/hf --out=$D/x --seq_length=4",
       "hf_convert: --seq_length is a flag of hf_convert import, not of export"},
      {"import --hf_dir=$D/hf --out=$D/ckpt extra", "hf_convert: unexpected argument 'extra'"},
      {"import --hf_dir=$D/hf --out=$D/ckpt --seq_lenght=4",
       "hf_convert: unknown flag --seq_lenght (did you mean --seq_length?)"},
      {"import --hf_dir=$D/hf --out=$D/ckpt --seq_length=-1",
       "hf_convert: --seq_length=-1 must be >= 0"},
      {"import --hf_dir=$D/hf --out=$D/full",
       "hf_convert: --out '$D/full' exists and is not empty: nothing overwritten"},
      {"import --hf_dir=$D/nothing --out=$D/ckpt", "hf_convert: '$D/nothing' is not a directory"},
      {"import --hf_dir=$D/full --out=$D/ckpt",
       "hf_convert: '$D/full/config.json' does not exist or cannot be read"},
      {"export --load=$D/nothing --out=$D/x", "hf_convert: checkpoint '$D/nothing' does not exist"},
      {"export --load=$D/hf --out=$D/x --dtype=fp16",
       "hf_convert: --dtype=fp16 must be bf16 or fp32"},
      {"export --load=$D/hf --out=$D/x --model_type=llama",
       "hf_convert: --model_type=llama must be qwen3_moe, mixtral or olmoe"},
      {"export --load=$D/hf --out=$D/x --max_shard_gib=0",
       "hf_convert: --max_shard_gib=0 must be in (0, 1024]"},
      {"export --load=$D/hf --out=$D/full",
       "hf_convert: --out '$D/full' exists and is not empty: nothing overwritten"},
  };
  for (const Refusal& refusal : refusals) {
    const std::vector<std::string> before = dir.List();
    const CommandResult r = HfConvert(WithDir(refusal.args, dir.path()));
    testing::ExpectRefusedInOneLine(r, WithDir(refusal.line, dir.path()));
    EXPECT_EQ(dir.List(), before) << refusal.args;
  }
  EXPECT_EQ(ReadFile(dir.Path("full/keep")), "mine");
  const CommandResult help = HfConvert("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("usage: hf_convert import --hf_dir=D --out=CKPT"), std::string::npos)
      << help.output;
}

}  // namespace
}  // namespace moe
