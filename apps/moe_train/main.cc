// moe_train: trains a Mixture-of-Experts GPT. Flags: run_flags.cc; output: run_log.cc.
// `mpirun -np N moe_train ...` trains on N ranks (pipeline x data parallel); started without
// mpirun it is one rank. Every rank checks the flags, and every check is agreed over all ranks
// (World::AllAgree), so a problem is one line on stderr from each rank and all exit together:
// code 2 for flags (before any work), 1 for runtime errors a user can cause (data, checkpoints).
// Only rank 0 prints the log and writes metrics and checkpoints; --trace_file is written by every
// rank (run_flags.h, TraceFilePath).
//
// Before any work: the command line is read strictly (apps/common/command_line.h: every argument
// and flagfile line used or refused), every rank's configuration is compared with rank 0's
// (config_digest.h: a mismatch is one line from rank 0), every flag, file and output is checked
// (run_flags.h), and the run's estimated memory is checked against the device (memory_check.h);
// only then does rank 0 lock the --save directory (engine/io/directory_lock.h: a directory
// another run holds is refused, exit 2) and remove the temporaries of interrupted saves there
// (engine/io/checkpoint_scan.h), and are the metrics file and checkpoints created. During the run:
// a step whose loss, aux loss or gradient norm is not finite stops the run (exit 1) before
// anything of that step is saved, so the last checkpoint holds finite weights; a device or host
// allocation that fails is one line and exit 1 (apps/common/out_of_memory_exit.h, installed here),
// not an abort; so is a communicator that fails or times out (comm_failure_exit.h). SIGTERM, SIGINT
// and SIGUSR1, --exit_interval and --exit_duration_in_mins stop every rank at the same step, which
// is saved, with exit code 75 (run_stop.h); a second signal ends the process at once.
// `--dry_run` (dry_run.h) is none of this: one process checks the flags for
// --dry_run_world_size ranks, prints what the layout needs and exits, before MPI or a device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "apps/common/command_line.h"
#include "apps/common/out_of_memory_exit.h"
#include "apps/common/output_checks.h"
#include "apps/moe_train/comm_failure_exit.h"
#include "apps/moe_train/config_digest.h"
#include "apps/moe_train/dry_run.h"
#include "apps/moe_train/flag_table.h"
#include "apps/moe_train/memory_check.h"
#include "apps/moe_train/memory_replan.h"
#include "apps/moe_train/run_flags.h"
#include "apps/moe_train/run_log.h"
#include "apps/moe_train/run_stop.h"
#include "engine/core/check.h"
#include "engine/distributed/process_groups.h"
#include "engine/distributed/world.h"
#include "engine/io/checkpoint.h"
#include "engine/io/checkpoint_scan.h"
#include "engine/io/chrome_trace.h"
#include "engine/io/directory_lock.h"
#include "engine/memory/caching_allocator.h"
#include "engine/memory/raw_memory.h"
#include "engine/runtime/device_context.h"
#include "engine/runtime/stop_signal.h"
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

std::string NotFinite(double value) {
  return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
}

// "loss is nan", "gradient norm is inf", ... for the step's non-finite statistics; "" if none.
std::string NonFiniteStatistics(const StepStats& stats) {
  std::string out;
  for (const auto& [name, value] : {std::pair<const char*, double>{"loss", stats.loss},
                                    {"aux loss", stats.aux_loss},
                                    {"gradient norm", stats.grad_norm}}) {
    if (std::isfinite(value)) continue;
    out += std::string(out.empty() ? "" : ", ") + name + " is " + NotFinite(value);
  }
  return out;
}

nlohmann::json RunDescription(const RunConfig& run) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  nlohmann::json out;
  for (const auto& flag : flags) {
    if (flag.filename.find("apps/moe_train") != std::string::npos) {
      out[flag.name] = FlagValueText(flag.name);
    }
  }
  return {{"flags", out}, {"device", run.device.ToString()}};
}

// The device of this rank: the flag's, or under mpirun on CUDA the GPU of its local rank.
StatusOr<Device> RankDevice(const World& world, Device device) {
  if (world.size() == 1 || !device.is_cuda()) return device;
  return world.SelectDevice(device.type);
}

// Rank 0 locks --save (held until the process ends) and removes the temporaries of interrupted
// saves there, noted in `run`; collective.
StatusOr<std::unique_ptr<DirectoryLock>> LockSaveDirectory(World& world, RunConfig& run) {
  std::unique_ptr<DirectoryLock> lock;
  Status status = Status::Ok();
  if (world.rank() == 0 && !FLAGS_save.empty()) {
    StatusOr<std::unique_ptr<DirectoryLock>> acquired = DirectoryLock::Acquire(FLAGS_save);
    if (acquired.ok()) lock = std::move(acquired).value();
    status = acquired.ok() ? Status::Ok()
                           : Status(acquired.status().code(),
                                    "--save " + acquired.status().message() +
                                        ": wait for it to end, or save to another directory");
  }
  MOE_RETURN_IF_ERROR(world.AllAgree(status));
  if (lock != nullptr && !lock->held()) {
    run.notes.push_back("checkpoints: --save " + FLAGS_save + " is not locked (" +
                        lock->unheld_reason() + "): nothing stops another run from writing there");
  }
  if (lock != nullptr && lock->held()) {
    StatusOr<std::vector<std::string>> removed = RemoveCheckpointTemporaries(FLAGS_save);
    status = removed.status();
    if (removed.ok() && !removed->empty()) {
      std::string names;
      for (const std::string& name : *removed) names += (names.empty() ? "" : ", ") + name;
      run.notes.push_back("checkpoints: removed what interrupted saves left in " + FLAGS_save +
                          ": " + names);
    }
  }
  MOE_RETURN_IF_ERROR(world.AllAgree(status));
  return lock;
}

std::chrono::milliseconds DistributedTimeout() {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(FLAGS_distributed_timeout_minutes * 60000)));
}

// --dry_run (dry_run.h): one process, before MPI and any device; a layout that does not fit is a
// result (exit 0), a flag or layout a run would refuse the same line and exit code 2.
int DryRunMain(const Status& parsed) {
  if (!parsed.ok()) return Fail(parsed, 2);
  const Status done = DryRun();
  return done.ok() ? 0 : Fail(done, 2);
}

int Run(const Status& parsed, std::chrono::steady_clock::time_point started) {
  // Declared first: the World outlives every communicator below.
  StatusOr<std::unique_ptr<World>> initialized = World::Init();
  if (!initialized.ok()) return Fail(initialized.status(), 2);
  World& world = **initialized;
  Status agreed = world.AllAgree(parsed);
  if (!agreed.ok()) return Fail(agreed, 2);
  // Before the flags are checked, so that a rank that differs is named as such, not by whatever
  // check its flags then fail; one line, from rank 0.
  agreed = world.AllAgree(CompareWithRankZero(world, ConfigDigest()));
  if (!agreed.ok()) return world.rank() == 0 ? Fail(agreed, 2) : 2;
  StatusOr<RunConfig> validated = ValidateFlags(world.size());
  agreed = world.AllAgree(validated.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  RunConfig run = std::move(validated).value();
  // What each rank resolved alone: --load (a root another run writes to could differ between
  // them) and --device=auto (a host without a GPU).
  agreed = world.AllAgree(
      CompareWithRankZero(world, {{"the checkpoint --load resumes from", run.resume_dir},
                                  {"the device type --device=" + FLAGS_device + " gives",
                                   run.device.is_cuda() ? "cuda" : "cpu"}}));
  if (!agreed.ok()) return world.rank() == 0 ? Fail(agreed, 2) : 2;
  StatusOr<Device> device = RankDevice(world, run.device);
  agreed = world.AllAgree(device.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  run.device = *device;
  StatusOr<LayoutMemoryEstimate> estimate = EstimateRunMemory(run);
  agreed = world.AllAgree(estimate.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  // CPU ranks of one host share its memory; each CUDA rank has its own GPU.
  const size_t capacity = DeviceContext::Get(run.device).allocator().capacity_bytes();
  agreed = world.AllAgree(
      CheckMemoryFits(run, *estimate, capacity, run.device.is_cuda() ? 1 : world.local_size()));
  if (!agreed.ok()) return Fail(agreed, 2);
  std::optional<MemoryPlan> plan;
  std::optional<MemoryReplanner> replanner;
  if (run.memory_budget) {
    const MemoryPlanRequest request = MemoryPlanRequestFor(run);
    StatusOr<MemoryPlan> planned = PlanMemory(request);
    agreed = world.AllAgree(planned.status());
    if (!agreed.ok()) return Fail(agreed, 2);
    plan = std::move(planned).value();
    agreed = world.AllAgree(
        CheckPinnedFits(run, *plan, NewHostRawMemory()->CapacityBytes(), world.local_size()));
    if (!agreed.ok()) return Fail(agreed, 2);
    ApplyMemoryPlan(*plan, run);
    replanner.emplace(request, run.data_parallel);
  }
  ExitOnOutOfMemory("moe_train",
                    "the run does not fit (reduce --micro_batch_size, --seq_length or the model)");
  ExitOnCommFailure("moe_train");
  StatusOr<std::unique_ptr<DirectoryLock>> save_lock = LockSaveDirectory(world, run);
  if (!save_lock.ok()) return Fail(save_lock.status(), 2);

  StatusOr<std::unique_ptr<TokenSource>> data = OpenTokenSource(run.data);
  agreed = world.AllAgree(data.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  const std::unique_ptr<Stream> comm_stream = DeviceContext::Get(run.device).CreateSideStream();
  const std::unique_ptr<Communicator> world_comm =
      world.NewCommunicator(*comm_stream, DistributedTimeout());
  const ProcessGroups groups =
      SplitProcessGroups(*world_comm, run.pipeline_parallel, run.expert_parallel);
  StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(run.model, run.trainer, run.device, data->get(), &groups);
  agreed = world.AllAgree(created.status());
  if (!agreed.ok()) return Fail(agreed, 2);
  Trainer& trainer = **created;
  if (plan) trainer.SetMemoryPlan(*plan);  // reserves the offloads' pinned buffers
  if (!run.resume_dir.empty()) {
    const Status loaded =
        run.finetune ? trainer.LoadWeights(run.resume_dir) : trainer.Load(run.resume_dir);
    agreed = world.AllAgree(
        loaded.ok() ? loaded
                    : Status(loaded.code(), "--load " + FLAGS_load + ": " + loaded.message()));
    if (!agreed.ok()) return Fail(agreed, 1);
  }

  if (!FLAGS_dump_reference_case.empty()) {
    const Status dumped = trainer.DumpReferenceCase(FLAGS_dump_reference_case);
    if (!dumped.ok()) return Fail(dumped, 1);
    printf("wrote %s/%s and %s\n", FLAGS_dump_reference_case.c_str(), kReferenceCaseTensors,
           kReferenceCaseConfig);
    return 0;
  }

  std::unique_ptr<ChromeTraceWriter> trace;
  const auto [trace_first, trace_last] = run.trace_steps;
  if (!FLAGS_trace_file.empty()) {  // --trace_steps lie after a resumed step (resume_check.h)
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
    for (const std::string& note : run.notes) printf("%s\n", note.c_str());
    printf("%s\n", MemoryEstimateLine(*estimate, run.trainer.virtual_pipeline).c_str());
    fflush(stdout);
    if (plan) log->Plan(*plan, /*table=*/true);
  }
  const auto floor = (*data)->CrossEntropyFloor(run.model.seq_length);
  const nlohmann::json description = RunDescription(run);
  bool offload_policy_reported = false;
  const int64_t first_step = trainer.step();
  // The step whose checkpoint --save holds: the one resumed from, when it lies there.
  int64_t saved_step =
      !run.resume_dir.empty() &&
              SamePath(std::filesystem::path(run.resume_dir).parent_path(), FLAGS_save)
          ? first_step
          : -1;
  const auto save = [&] {  // collective
    const Status saved = world.AllAgree(trainer.Save(FLAGS_save, description));
    if (!saved.ok()) return saved;
    saved_step = trainer.step();
    if (leader) {
      printf("saved checkpoint %s/%s\n", FLAGS_save.c_str(),
             CheckpointStepDirName(saved_step).c_str());
    }
    return Status::Ok();
  };
  // A stop asked for (run_stop.h): the step reached is saved unless it is already, one line says
  // why, and the run ends with kExitStoppedEarly. Collective.
  const auto stop_early = [&](const std::string& why) {
    const int64_t step = trainer.step();
    const bool saving = !FLAGS_save.empty() && step > 0;
    if (saving && step != saved_step) {
      const Status saved = save();
      if (!saved.ok()) return Fail(saved, 1);
    }
    if (leader) {
      const std::string outcome =
          saving ? "checkpoint " + FLAGS_save + "/" + CheckpointStepDirName(step) +
                       ": continue with --load=" + FLAGS_save
                 : (FLAGS_save.empty() ? "nothing saved (no --save)" : "nothing to save");
      printf("stopped at step %lld: %s; %s (exit code %d)\n", (long long)step, why.c_str(),
             outcome.c_str(), kExitStoppedEarly);
    }
    fflush(stdout);
    return kExitStoppedEarly;
  };
  RunStop stop(world_comm.get(), started, first_step);
  while (trainer.step() < run.trainer.train_steps) {
    SetCommFailureStep(trainer.step());
    const std::string why = stop.Check(trainer.step());  // collective
    if (!why.empty()) return stop_early(why);
    SetCommFailureStep(trainer.step() + 1);
    const bool traced =
        trace != nullptr && trainer.step() + 1 >= trace_first && trainer.step() + 1 <= trace_last;
    const StepStats stats = trainer.TrainStep(traced);
    const int64_t step = trainer.step();
    // Global values, the same on every rank: every rank stops here together.
    const std::string non_finite = NonFiniteStatistics(stats);
    if (!non_finite.empty()) {
      fflush(stdout);
      return Fail(InvalidArgument("step " + std::to_string(step) + ": " + non_finite +
                                  "; stopped before saving anything of it (lower --lr, or keep "
                                  "--clip_grad on)"),
                  1);
    }
    if (log) log->Step(step, stats);
    if (replanner) {
      StatusOr<MemoryReplanner::Update> update = replanner->AfterStep(stats, *plan);
      if (!update.ok()) return Fail(update.status(), 1);
      if (update->changed) trainer.SetMemoryPlan(*plan);
      if (log && !update->note.empty()) {
        printf("%s\n", update->note.c_str());
        log->Plan(*plan, /*table=*/update->changed);
      }
    }
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
      const auto by_rank = trainer.OffloadPolicyByPipelineRank();            // collective
      if (log) log->OffloadPolicy(*trainer.offload_manager(), by_rank);
      offload_policy_reported = true;
    }
    const bool last = step == run.trainer.train_steps;
    if (last || (FLAGS_eval_interval > 0 && step % FLAGS_eval_interval == 0)) {
      const double loss = trainer.Evaluate();
      if (log) log->Eval(step, loss, floor);
    }
    if (!FLAGS_save.empty() &&
        (last || (FLAGS_save_interval > 0 && step % FLAGS_save_interval == 0))) {
      agreed = save();
      if (!agreed.ok()) return Fail(agreed, 1);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();  // --exit_duration_in_mins counts from it
  moe::InstallStopSignalHandlers();  // first: a signal during the start stops before step 1
  gflags::SetUsageMessage("trains a Mixture-of-Experts GPT (see README.md)");
  gflags::SetArgv(argc, const_cast<const char**>(argv));  // the program name gflags' help shows
  FLAGS_logtostderr = true;  // a default: --logtostderr=false still wins
  moe::StatusOr<moe::HelpRequest> parsed = moe::ParseCommandLine(argc, argv);
  if (parsed.ok() && *parsed != moe::HelpRequest::kNone) {
    switch (*parsed) {
      case moe::HelpRequest::kHelp:
      case moe::HelpRequest::kHelpShort:
        printf("%s", moe::FlagHelp("moe_train", *parsed == moe::HelpRequest::kHelpShort).c_str());
        return 0;
      case moe::HelpRequest::kHelpFull:
        printf("%s\n", moe::FlagHelp("moe_train", false).c_str());
        gflags::ShowUsageWithFlags(argv[0]);
        return 0;
      default:
        gflags::HandleCommandLineHelpFlags();  // gflags' --helpxml, --version, ...: exits
        return 0;
    }
  }
  google::InitGoogleLogging(argv[0], &moe::LogPrefix);
  return FLAGS_dry_run ? moe::DryRunMain(parsed.status()) : moe::Run(parsed.status(), started);
}
