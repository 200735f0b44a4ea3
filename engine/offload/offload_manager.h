// OffloadManager: fine-grained activation offloading. Moves the tensors that selected groups of
// a SavedTensors context saved to pinned host memory during forward, and brings them back ahead
// of backward. It is a SavedTensorHooks: pass it to each training context
// (SavedTensors(true, &manager)); forward-only contexts never call it. Group names are plain
// strings here; which names exist and which have routed (data-dependent) shapes is the caller's
// configuration (OffloadOptions).
//
// Forward, at a group's commit (OnCommit), if the policy offloads the group:
//   - the D2H stream waits on the compute stream (an event); compute never waits on D2H;
//   - each eligible tensor is copied to pinned memory (pooled, or unpooled for the routed
//     groups), the device tensor is RecordStream(d2h)'d and the saved entry is Replace()d by the
//     host tensor, so the device block is freed in stream order once the copy has read it;
//   - an event marks the group's D2H completion;
//   - the host then waits for the copies out of the groups committed before at lower layers of
//     this context, and of every other context. The allocator counts a block that another stream
//     still reads as allocated until that stream's event has completed (caching_allocator.h), so
//     a host that ran ahead of the device would see no offloaded block freed and offloading would
//     lower no peak; waiting keeps the host about one layer ahead, the device busy with the work
//     already queued. When backward starts on a context, the host waits for its remaining copies
//     out (the last layer's) the same way.
//   Skipped (left on the device): parameters, tensors not in this device's memory, tensors marked
//   do_not_offload, tensors under min_tensor_bytes. Saves of one storage twice in a group are
//   copied once. A saved tensor must not be written after it is saved (as in autograd).
// Backward (BeforeLoad):
//   - Backward order: within one context, the reverse of its commit order. Across contexts, the
//     order given by SetBackwardOrder (a pipeline schedule's backward actions, as data); a context
//     not listed has no cross-context prefetch.
//   - Reloads run on the H2D stream, prefetch_layers layers ahead: when backward starts on a
//     context, groups of the first prefetch_layers layers (in backward order) are issued; when a
//     group of layer slot s is first loaded, every offloaded group up to slot s + prefetch_layers
//     is issued (0: on demand). Layer slots count changes of SavedGroup::layer along the backward
//     order, continuing into the next context of SetBackwardOrder.
//   - Each reload first waits (on the H2D stream) for its group's D2H event, allocates the device
//     tensor on the H2D stream (Tensor::EmptyOnStream), copies, RecordStream(compute)s it (its
//     later free is ordered after compute's use) and Replace()s the saved entry.
//   - The first Load of an offloaded tensor of a group makes the compute stream Wait on the
//     group's reload event. Pinned buffers are released once their H2D copy has completed.
// Policy (which groups move):
//   - Candidates: committed groups whose name is in `groups` and that have eligible bytes, as
//     (layer, name) pairs in forward order.
//   - The first training step is the warm-up: every candidate is offloaded and observed. At the
//     end of it (EndStep), the policy is fixed: first pp_rank x pp_delta_bytes bytes are kept
//     resident from the last candidate backwards (whole groups, until at least that many bytes
//     are kept), then of the remaining candidates the earliest floor(fraction x n) stay offloaded
//     and the rest are kept resident.
//   - With options.planned, the policy is that set from the first step on (SetPlanned replaces
//     it between steps); the first step still observes every candidate for the summary.
//   - summary()/SummaryTable() report the policy per group name after the first step (the
//     table for every pipeline rank when given their summaries).
// Step timeline (engine/runtime/step_timeline.h), when the device has one: the compute stream's
// wait for a reload is phase kOffloadWait (the step's breakdown is where that time is reported);
// a traced step gets, per offloaded group, a "commit" instant on the compute track, an "offload
// copy" span on the D2H track, a "reload" span on the H2D track and a "reloaded" instant where
// compute first waits for it, joined as one flow.
// EndStep() ends an optimizer step: it synchronises the copy streams, releases pinned buffers,
// collects the step's statistics (copy times from timing events) and fixes the policy after the
// first step. Not thread-safe: call from the thread that runs forward and backward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/saved_tensors.h"
#include "engine/core/device.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/runtime/step_timeline.h"

namespace moe {

struct OffloadOptions {
  std::set<std::string> groups;           // group names to offload
  std::set<std::string> unpooled_groups;  // group names whose pinned buffers bypass the pool
  int64_t min_tensor_bytes = 1 << 20;     // smaller tensors stay on the device
  double fraction = 1.0;                  // of candidate groups kept offloaded, earliest first
  int64_t pp_delta_bytes = 0;             // pipeline rank r keeps r x this many bytes resident
  int prefetch_layers = 1;                // reload distance in layers (0: on demand)
  // Set (a memory planner's plan): exactly these (layer, group) pairs are offloaded, from the
  // first step on (no warm-up); fraction and pp_delta_bytes are then unused.
  std::optional<std::set<std::pair<int, std::string>>> planned;
};

// What one optimizer step moved. Copy times are the sums, over groups, of the time between
// events around each group's copies (timing events): the copy streams' busy time.
struct OffloadStepStats {
  int64_t offloaded_bytes = 0;
  int64_t offloaded_tensors = 0;
  int64_t reloaded_bytes = 0;
  int64_t reloaded_tensors = 0;
  double d2h_ms = 0;
  double h2d_ms = 0;

  OffloadStepStats& operator+=(const OffloadStepStats& other);
  double d2h_gbps() const { return d2h_ms > 0 ? offloaded_bytes / (d2h_ms * 1e6) : 0.0; }
  double h2d_gbps() const { return h2d_ms > 0 ? reloaded_bytes / (h2d_ms * 1e6) : 0.0; }
};

// The policy for one group name, per context (micro-batch x chunk), after the first step.
struct OffloadGroupSummary {
  std::string name;
  int candidates = 0;   // (layer, name) pairs with eligible tensors
  int offloaded = 0;    // of those, kept offloaded by the policy
  int64_t tensors = 0;  // tensors moved per context by the offloaded pairs
  int64_t bytes = 0;    // bytes moved per context by the offloaded pairs
  int64_t skipped = 0;  // tensors of the named groups left on the device by the skip rules
};

class OffloadManager final : public SavedTensorHooks {
 public:
  // `pp_rank`: this process's pipeline rank (the policy's pp_delta_bytes and the table's rank).
  OffloadManager(Device device, OffloadOptions options, int pp_rank = 0);
  ~OffloadManager() override;
  OffloadManager(const OffloadManager&) = delete;
  OffloadManager& operator=(const OffloadManager&) = delete;

  // SavedTensorHooks.
  void OnCommit(SavedTensors& saved, const SavedGroup& group) override;
  void BeforeLoad(SavedTensors& saved, const SavedGroup* group, const std::string& key) override;
  void OnDestroy(SavedTensors& saved) override;

  // The order in which these contexts will run backward (e.g. a pipeline schedule's backward
  // actions for one step; create the contexts first). Replaces the previous order; destroyed
  // contexts drop out of it.
  void SetBackwardOrder(std::vector<const SavedTensors*> order);

  // Ends an optimizer step (see the top of the file) and returns what it moved.
  OffloadStepStats EndStep();
  // A new plan (for a manager made with options.planned), from the next step on; call between
  // steps.
  void SetPlanned(std::set<std::pair<int, std::string>> planned);
  // Pins host memory ahead of a step for these (group name, bytes) tensors held at once (a plan
  // knows them), pooled or not as their group is: the step's copies then do not wait for pinning.
  void ReserveHostBuffers(const std::vector<std::pair<std::string, size_t>>& tensors);

  bool policy_fixed() const { return policy_fixed_; }
  int64_t steps() const { return steps_; }
  const OffloadOptions& options() const { return options_; }
  int pp_rank() const { return pp_rank_; }
  // Per group name, in order of first commit; empty before the first step has ended.
  const std::vector<OffloadGroupSummary>& summary() const { return summary_; }
  // The policy as a table ("rank | group | offloaded/candidates | tensors | MiB"), one line per
  // group name and a total per rank: this manager's rows (rank pp_rank()), or, given
  // by_pipeline_rank (every pipeline rank's summary(), by rank), all of them.
  std::string SummaryTable(
      const std::vector<std::vector<OffloadGroupSummary>>& by_pipeline_rank = {}) const;
  // Keys moved to the host during the last ended step, in commit order (for tests and logs).
  const std::vector<std::string>& last_step_offloaded_keys() const { return last_step_keys_; }

 private:
  struct Copy;
  struct GroupState;
  struct Record;
  struct Observation;

  Record* FindRecord(const SavedTensors* saved);
  bool ShouldOffload(const std::string& name, int layer) const;
  void Observe(const GroupState& group, int64_t eligible_bytes, int64_t eligible_tensors,
               int64_t skipped);
  void EnsureSlots(Record& record);
  void Prefetch(Record& record, int current_slot);
  void IssueSlots(Record& record, int first_slot, int last_slot);
  void IssueReload(Record& record, GroupState& group);
  void ReleaseCompleted(bool wait);
  // The copy out of a committed group of a named offload group, when the policy offloads it.
  void CopyOut(SavedTensors& saved, const SavedGroup& group, GroupState& g);
  // The host waits for the copies out of `record`'s groups below `below_layer` (commit order).
  void WaitCopiesOut(Record& record, int below_layer);
  void Harvest(GroupState& group);
  void FixPolicy();
  void Summarize();
  std::unique_ptr<Event> TakeEvent();

  const Device device_;
  const OffloadOptions options_;
  const int pp_rank_;
  Stream& compute_;
  std::unique_ptr<Stream> d2h_;
  std::unique_ptr<Stream> h2d_;
  std::unique_ptr<Event> compute_marker_;
  std::vector<std::unique_ptr<Event>> free_events_;

  std::map<const SavedTensors*, std::unique_ptr<Record>> records_;
  std::vector<const SavedTensors*> backward_order_;
  // Groups of destroyed contexts whose timings are read at EndStep.
  std::vector<std::unique_ptr<GroupState>> finished_;
  // Pinned buffers held until an event (their H2D copy, or D2H for never-reloaded groups).
  struct PendingRelease {
    Event* event;
    std::vector<Tensor> host;
  };
  std::vector<PendingRelease> pending_releases_;

  // Warm-up observations: (layer, name) -> sizes, in first-commit order.
  std::map<std::pair<int, std::string>, Observation*> observed_index_;
  std::vector<std::unique_ptr<Observation>> observed_;
  bool policy_fixed_ = false;
  // The offloaded pairs: after the warm-up, or the plan (options.planned, SetPlanned).
  std::set<std::pair<int, std::string>> policy_;
  std::vector<OffloadGroupSummary> summary_;
  OffloadStepStats warmup_;  // what the warm-up step moved

  OffloadStepStats step_;
  std::vector<std::string> step_keys_;
  std::vector<std::string> last_step_keys_;
  int64_t steps_ = 0;
};

}  // namespace moe
