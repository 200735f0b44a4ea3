// For the tests of moe_train on a cluster (signals, the --save lock, checkpoints left by
// interrupted runs, ranks started with different flags): a small, fast run's flags, the mpirun
// launcher, and what a run's output and checkpoint root say (MOE_TRAIN_BINARY, defined by
// tests/CMakeLists.txt for tests/apps).
#pragma once

#include <cstdint>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/io/checkpoint_scan.h"

namespace moe::testing {

// moe_train with a small model, logging every step, that never ends by itself: on the CPU, or on
// the GPU in a test's CUDA twin (MOE_TEST_ON_CUDA).
inline std::string SmallEndlessRun() {
#ifdef MOE_TEST_ON_CUDA
  const char* device = " --device=cuda --hidden_size=128";  // head dim 64: CUDA attention's least
#else
  const char* device = " --device=cpu --hidden_size=32";
#endif
  return std::string(MOE_TRAIN_BINARY) + device +
         " --num_layers=2 --seq_length=16 --eval_steps=1 "
         "--eval_interval=0 --warmup_steps=1 --log_interval=1 --train_steps=1000000000";
}

// The launcher of an N-rank job, as root may run it (OpenMPI refuses root without the two
// variables); `env` execs mpirun, so a BackgroundCommand's pid is mpirun's.
inline std::string Mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np " +
         std::to_string(ranks) + " --oversubscribe ";
}

// The last training step the log printed ("step     12 | loss ..."); 0 if none.
inline int64_t LastLoggedStep(const std::string& output) {
  static const std::regex kStep(R"((^|\n)step +(\d+) \|)");
  int64_t last = 0;
  for (std::sregex_iterator it(output.begin(), output.end(), kStep), end; it != end; ++it) {
    last = std::stoll((*it)[2]);
  }
  return last;
}

// The step a resume from `root` takes (its newest complete step directory); 0 if none.
inline int64_t ResumeStep(const std::string& root) {
  StatusOr<CheckpointState> state = ReadCheckpointState(root);
  return state.ok() ? state->state["step"].get<int64_t>() : 0;
}

}  // namespace moe::testing
