// moe_train: trains a Mixture-of-Experts GPT. Flags: run_flags.cc; output: run_log.cc.
// Every flag is checked before any work; a problem is one line on stderr and exit code 2.
// Runtime errors a user can cause (data, checkpoints) exit with code 1.
#include <cstdio>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/moe_train/run_flags.h"
#include "apps/moe_train/run_log.h"
#include "modules/trainer.h"

namespace moe {
namespace {

int Fail(const Status& status, int code) {
  fprintf(stderr, "moe_train: %s\n", status.message().c_str());
  return code;
}

nlohmann::json RunDescription(const RunConfig& run) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  nlohmann::json out;
  for (const auto& flag : flags) {
    if (flag.filename.find("apps/moe_train") != std::string::npos) out[flag.name] = flag.current_value;
  }
  return {{"flags", out}, {"device", run.device.ToString()}};
}

int Run() {
  StatusOr<RunConfig> validated = ValidateFlags();
  if (!validated.ok()) return Fail(validated.status(), 2);
  const RunConfig run = std::move(validated).value();

  StatusOr<std::unique_ptr<TokenSource>> data = OpenTokenSource(run.data);
  if (!data.ok()) return Fail(data.status(), 2);
  StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(run.model, run.trainer, run.device, data->get());
  if (!created.ok()) return Fail(created.status(), 2);
  Trainer& trainer = **created;
  if (!FLAGS_load.empty()) {
    const Status loaded = trainer.Load(FLAGS_load);
    if (!loaded.ok()) return Fail(loaded, 1);
  }

  if (!FLAGS_dump_reference_case.empty()) {
    const Status dumped = trainer.DumpReferenceCase(FLAGS_dump_reference_case);
    if (!dumped.ok()) return Fail(dumped, 1);
    printf("wrote %s/reference.safetensors and config.json\n", FLAGS_dump_reference_case.c_str());
    return 0;
  }

  RunLog log(run);
  log.Summary(**data, trainer.step());
  const auto floor = (*data)->CrossEntropyFloor(run.model.seq_length);
  const nlohmann::json description = RunDescription(run);
  while (trainer.step() < run.trainer.train_steps) {
    const StepStats stats = trainer.TrainStep();
    const int64_t step = trainer.step();
    log.Step(step, stats);
    log.OffloadPolicy(trainer.offload_manager());
    const bool last = step == run.trainer.train_steps;
    if (last || (FLAGS_eval_interval > 0 && step % FLAGS_eval_interval == 0)) {
      log.Eval(step, trainer.Evaluate(), floor);
    }
    if (!FLAGS_save.empty() && (last || (FLAGS_save_interval > 0 && step % FLAGS_save_interval == 0))) {
      const Status saved = trainer.Save(FLAGS_save, description);
      if (!saved.ok()) return Fail(saved, 1);
      printf("saved checkpoint %s/step_%08lld\n", FLAGS_save.c_str(), (long long)step);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  gflags::SetUsageMessage("trains a Mixture-of-Experts GPT (see README.md)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return moe::Run();
}
