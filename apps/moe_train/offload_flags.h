// moe_train's activation-memory flags (defined in offload_flags.cc): fine-grained activation
// offloading and selective recompute, and their validation against the model and each other. Every problem is one line naming the flag(s), found before any
// work; see DESIGN.md, "Fine-grained activation offloading".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <gflags/gflags.h>

#include "engine/core/status.h"
#include "engine/offload/offload_manager.h"
#include "modules/gpt_config.h"

DECLARE_string(offload_modules);
DECLARE_int64(offload_min_tensor_bytes);
DECLARE_double(offload_fraction);
DECLARE_int64(offload_pp_delta_bytes);
DECLARE_int64(offload_prefetch_layers);
DECLARE_string(recompute_modules);
DECLARE_int64(recompute_num_layers);

namespace moe {

struct OffloadFlagValues {
  std::string modules;  // comma list of group names; empty: no offloading
  int64_t min_tensor_bytes = 1 << 20;
  double fraction = 1.0;
  int64_t pp_delta_bytes = 0;
  int64_t prefetch_layers = 1;
};

// The manager's options for `values` and `model`, nullopt when no module is listed, or the first
// problem.
StatusOr<std::optional<OffloadOptions>> MakeOffloadOptions(const OffloadFlagValues& values,
                                                           const GptConfig& model);
// The same from the command-line flags.
StatusOr<std::optional<OffloadOptions>> OffloadOptionsFromFlags(const GptConfig& model);

// --recompute_modules's list, checked against the offload options chosen (nullopt: none).
StatusOr<RecomputeModules> MakeRecompute(const std::string& list,
                                         const std::optional<OffloadOptions>& offload);
// The same from the command-line flag.
StatusOr<RecomputeModules> RecomputeFromFlags(const std::optional<OffloadOptions>& offload);
// --recompute_num_layers: -1 (every layer) or a layer count of `model`.
StatusOr<int64_t> RecomputeNumLayers(int64_t value, const GptConfig& model);
StatusOr<int64_t> RecomputeNumLayersFromFlags(const GptConfig& model);

}  // namespace moe
