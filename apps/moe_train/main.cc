// moe_train: trains a Mixture-of-Experts GPT. Flags: run_flags.cc; output: run_log.cc.
// `mpirun -np N moe_train ...` trains on N ranks (pipeline x data parallel); started without
// mpirun it is one rank. Every rank checks the flags, and every check is agreed over all ranks
// (World::AllAgree), so a problem is one line on stderr from each rank and all exit together:
// code 2 for flags (before any work), 1 for runtime errors a user can cause (data, checkpoints).
// Only rank 0 prints the log and writes metrics and checkpoints; --trace_file is written by every
// rank (run_flags.h, TraceFilePath).
#include <cstdio>
#include <optional>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/moe_train/run_flags.h"
#include "apps/moe_train/run_log.h"
#include "engine/core/check.h"
#include "engine/dist/process_groups.h"
#include "engine/dist/world.h"
#include "engine/io/chrome_trace.h"
#include "engine/runtime/device_context.h"
#include "modules/trainer.h"

namespace moe {
namespace {

// glog's line prefix, led by this process's rank: "[rank 1] W1129 22:40:01.123456 file.cc:42] ".
void LogPrefix(std::ostream& s, const google::LogMessageInfo& info, void*) {
  char time[32];
  snprintf(time, sizeof(time), "%02d%02d %02d:%02d:%02d.%06d", 1 + info.time.month(),
           info.time.day(), info.time.hour(), info.time.min(), info.time.sec(), info.time.usec());
  s << "[rank " << ProcessRank() << "] " << info.severity[0] << time << ' ' << info.filename << ':'
    << info.line_number << ']';
}

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

// The device of this rank: the flag's, or under mpirun on CUDA the GPU of its local rank.
StatusOr<Device> RankDevice(const World& world, Device device) {
  if (world.size() == 1 || !device.is_cuda()) return device;
  return world.SelectDevice(device.type);
}

int Run() {
  // Declared first: the World outlives every communicator below.
  StatusOr<std::unique_ptr<World>> initialized = World::Init();
  if (!initialized.ok()) return Fail(initialized.status(), 2);
  World& world = **initialized;
  StatusOr<RunConfig> validated = ValidateFlags(world.size());
  Status agreed = world.AllAgree(validated.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  RunConfig run = std::move(validated).value();
  StatusOr<Device> device = RankDevice(world, run.device);
  agreed = world.AllAgree(device.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  run.device = *device;

  StatusOr<std::unique_ptr<TokenSource>> data = OpenTokenSource(run.data);
  agreed = world.AllAgree(data.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  const std::unique_ptr<Stream> comm_stream = DeviceContext::Get(run.device).CreateSideStream();
  const std::unique_ptr<Communicator> world_comm = world.NewCommunicator(*comm_stream);
  const ProcessGroups groups = SplitProcessGroups(*world_comm, run.pipeline_parallel);
  StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(run.model, run.trainer, run.device, data->get(), &groups);
  agreed = world.AllAgree(created.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  Trainer& trainer = **created;
  if (!FLAGS_load.empty()) {
    agreed = world.AllAgree(trainer.Load(FLAGS_load));
    if (!agreed.ok()) return Fail(agreed, 1);
  }

  if (!FLAGS_dump_reference_case.empty()) {
    const Status dumped = trainer.DumpReferenceCase(FLAGS_dump_reference_case);
    if (!dumped.ok()) return Fail(dumped, 1);
    printf("wrote %s/reference.safetensors and config.json\n", FLAGS_dump_reference_case.c_str());
    return 0;
  }

  std::unique_ptr<ChromeTraceWriter> trace;
  const auto [trace_first, trace_last] = run.trace_steps;
  if (!FLAGS_trace_file.empty()) {
    if (trace_last <= trainer.step()) {
      return Fail(InvalidArgument("--trace_steps=" + FLAGS_trace_steps + ": the run resumes after step " +
                                  std::to_string(trainer.step())),
                  2);
    }
    StatusOr<std::unique_ptr<ChromeTraceWriter>> opened =
        ChromeTraceWriter::Create(TraceFilePath(world.rank(), world.size()), world.rank());
    agreed = world.AllAgree(opened.status());
    if (!agreed.ok()) return Fail(agreed, 2);
    trace = std::move(opened).value();
  }

  const bool leader = world.rank() == 0;
  std::optional<RunLog> log;
  if (leader) {
    log.emplace(run);
    log->Summary(**data, trainer.step());
  }
  const auto floor = (*data)->CrossEntropyFloor(run.model.seq_length);
  const nlohmann::json description = RunDescription(run);
  bool offload_policy_reported = false;
  while (trainer.step() < run.trainer.train_steps) {
    const bool traced =
        trace != nullptr && trainer.step() + 1 >= trace_first && trainer.step() + 1 <= trace_last;
    const StepStats stats = trainer.TrainStep(traced);
    const int64_t step = trainer.step();
    if (log) log->Step(step, stats);
    if (traced) {
      trace->AddStep(step, stats.trace);
      if (step == trace_last) {
        trace->Close();
        if (leader) {
          printf("wrote trace of steps %lld-%lld to %s%s\n", (long long)trace_first,
                 (long long)trace_last, TraceFilePath(0, world.size()).c_str(),
                 world.size() > 1 ? " (and one file per further rank)" : "");
        }
      }
    }
    if (trainer.offload_manager() != nullptr && !offload_policy_reported) {  // after the warm-up
      const auto by_rank = trainer.OffloadPolicyByPipelineRank();  // collective
      if (log) log->OffloadPolicy(*trainer.offload_manager(), by_rank);
      offload_policy_reported = true;
    }
    const bool last = step == run.trainer.train_steps;
    if (last || (FLAGS_eval_interval > 0 && step % FLAGS_eval_interval == 0)) {
      const double loss = trainer.Evaluate();
      if (log) log->Eval(step, loss, floor);
    }
    if (!FLAGS_save.empty() && (last || (FLAGS_save_interval > 0 && step % FLAGS_save_interval == 0))) {
      agreed = world.AllAgree(trainer.Save(FLAGS_save, description));  // collective
      if (!agreed.ok()) return Fail(agreed, 1);
      if (leader) printf("saved checkpoint %s/step_%08lld\n", FLAGS_save.c_str(), (long long)step);
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
  google::InitGoogleLogging(argv[0], &moe::LogPrefix);
  return moe::Run();
}
