#include "engine/offload/offload_manager.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include <glog/logging.h>

#include "engine/core/byte_units.h"
#include "engine/runtime/device_context.h"

namespace moe {

OffloadStepStats& OffloadStepStats::operator+=(const OffloadStepStats& other) {
  offloaded_bytes += other.offloaded_bytes;
  offloaded_tensors += other.offloaded_tensors;
  reloaded_bytes += other.reloaded_bytes;
  reloaded_tensors += other.reloaded_tensors;
  d2h_ms += other.d2h_ms;
  h2d_ms += other.h2d_ms;
  return *this;
}

// One host copy; several keys of a group may share it (the same tensor saved twice).
struct OffloadManager::Copy {
  Tensor host;
  std::vector<std::string> keys;
  int64_t bytes = 0;
};

struct OffloadManager::GroupState {
  size_t index = 0;  // in SavedTensors::groups()
  std::string name;
  int layer = -1;
  int slot = -1;  // layer slot in the context's backward order
  bool offloaded = false;
  bool reload_issued = false;
  bool waited = false;  // by the compute stream, for the reload
  std::vector<Copy> copies;
  int64_t bytes = 0;
  int64_t tensors = 0;
  std::unique_ptr<Event> d2h_start, d2h_done, h2d_start, h2d_done;
  int64_t flow = -1;  // the traced flow: commit, copy out, copy back, first use

  bool Moves(const std::string& key) const {
    for (const Copy& copy : copies) {
      if (std::find(copy.keys.begin(), copy.keys.end(), key) != copy.keys.end()) return true;
    }
    return false;
  }
};

struct OffloadManager::Record {
  SavedTensors* saved = nullptr;
  std::vector<std::unique_ptr<GroupState>> groups;  // commit order
  std::map<size_t, GroupState*> by_index;
  bool backward_started = false;
  size_t copies_waited = 0;  // groups, in commit order, whose copies out the host waited for
  int cursor = -1;           // highest layer slot backward has reached
  int num_slots = 0;
  size_t slotted = 0;  // groups counted when the slots were assigned
};

struct OffloadManager::Observation {
  int layer = -1;
  std::string name;
  size_t order = 0;  // first commit
  int64_t bytes = 0;
  int64_t tensors = 0;
  int64_t skipped = 0;
};

OffloadManager::OffloadManager(Device device, OffloadOptions options, int pp_rank)
    : device_(device),
      options_(std::move(options)),
      pp_rank_(pp_rank),
      compute_(DeviceContext::Get(device).compute_stream()) {
  CHECK_GE(options_.min_tensor_bytes, 0);
  CHECK(options_.fraction >= 0 && options_.fraction <= 1) << options_.fraction;
  CHECK_GE(options_.pp_delta_bytes, 0);
  CHECK_GE(pp_rank_, 0);
  CHECK_GE(options_.prefetch_layers, 0);
  if (options_.planned) policy_ = *options_.planned;
  DeviceContext& context = DeviceContext::Get(device);
  d2h_ = context.CreateSideStream();
  h2d_ = context.CreateSideStream();
  compute_marker_ = compute_.CreateEvent(false);
}

OffloadManager::~OffloadManager() {
  CHECK(records_.empty()) << records_.size()
                          << " saved-tensor context(s) outlive their offload manager";
  d2h_->Synchronize();
  h2d_->Synchronize();
  ReleaseCompleted(/*wait=*/true);
  finished_.clear();
}

std::unique_ptr<Event> OffloadManager::TakeEvent() {
  if (free_events_.empty()) return h2d_->CreateEvent(/*enable_timing=*/true);
  std::unique_ptr<Event> event = std::move(free_events_.back());
  free_events_.pop_back();
  return event;
}

OffloadManager::Record* OffloadManager::FindRecord(const SavedTensors* saved) {
  auto it = records_.find(saved);
  return it == records_.end() ? nullptr : it->second.get();
}

bool OffloadManager::ShouldOffload(const std::string& name, int layer) const {
  const bool warm_up = !policy_fixed_ && !options_.planned;
  return warm_up || policy_.count({layer, name}) > 0;
}

void OffloadManager::SetPlanned(std::set<std::pair<int, std::string>> planned) {
  CHECK(options_.planned) << "SetPlanned needs a manager made with a planned policy";
  policy_ = std::move(planned);
  if (policy_fixed_) Summarize();
}

void OffloadManager::ReserveHostBuffers(
    const std::vector<std::pair<std::string, size_t>>& tensors) {
  std::vector<size_t> pooled, unpooled;
  for (const auto& [group, bytes] : tensors) {
    (options_.unpooled_groups.count(group) ? unpooled : pooled).push_back(bytes);
  }
  DeviceContext::Get(device_).pinned_pool().Reserve(pooled, std::move(unpooled));
}

void OffloadManager::Observe(const GroupState& group, int64_t eligible_bytes,
                             int64_t eligible_tensors, int64_t skipped) {
  const auto key = std::make_pair(group.layer, group.name);
  if (observed_index_.count(key)) return;  // the first context of the step stands for all
  auto observation = std::make_unique<Observation>();
  observation->layer = group.layer;
  observation->name = group.name;
  observation->order = observed_.size();
  observation->bytes = eligible_bytes;
  observation->tensors = eligible_tensors;
  observation->skipped = skipped;
  observed_index_[key] = observation.get();
  observed_.push_back(std::move(observation));
}

void OffloadManager::OnCommit(SavedTensors& saved, const SavedGroup& group) {
  ReleaseCompleted(/*wait=*/false);
  Record* record = FindRecord(&saved);
  if (record == nullptr) {
    auto created = std::make_unique<Record>();
    created->saved = &saved;
    record = created.get();
    records_[&saved] = std::move(created);
  }
  auto state = std::make_unique<GroupState>();
  GroupState& g = *state;
  g.index = static_cast<size_t>(&group - saved.groups().data());
  g.name = group.name;
  g.layer = group.layer;
  record->by_index[g.index] = state.get();
  record->groups.push_back(std::move(state));
  if (options_.groups.count(group.name)) CopyOut(saved, group, g);
  for (auto& [context, other] : records_) {
    WaitCopiesOut(*other, other.get() == record ? g.layer : std::numeric_limits<int>::max());
  }
}

void OffloadManager::CopyOut(SavedTensors& saved, const SavedGroup& group, GroupState& g) {
  // Sort the group's saves: eligible tensors (one copy per distinct tensor) and skipped ones.
  struct Pending {
    Tensor device;
    std::vector<std::string> keys;
  };
  std::vector<Pending> eligible;
  int64_t skipped = 0, bytes = 0, tensors = 0;
  for (const std::string& key : group.keys) {
    const Tensor t = saved.Peek(key);
    const bool ok = !t.is_parameter() && !t.do_not_offload() && t.space() == MemorySpace::kDevice &&
                    t.device() == device_ && t.nbytes() > 0 &&
                    static_cast<int64_t>(t.nbytes()) >= options_.min_tensor_bytes;
    if (!ok) {
      ++skipped;
      continue;
    }
    auto same = std::find_if(eligible.begin(), eligible.end(), [&](const Pending& p) {
      return p.device.data() == t.data() && p.device.shape() == t.shape() &&
             p.device.dtype() == t.dtype();
    });
    if (same != eligible.end()) {
      same->keys.push_back(key);
      continue;
    }
    eligible.push_back({t, {key}});
    bytes += static_cast<int64_t>(t.nbytes());
    tensors += 1;
  }
  if (!policy_fixed_) Observe(g, bytes, tensors, skipped);
  if (eligible.empty() || !ShouldOffload(g.name, g.layer)) return;

  // Pinned buffers first (pinning new memory is slow host work), so the timed copies hold only
  // copies.
  PinnedHostPool& pool = DeviceContext::Get(device_).pinned_pool();
  const bool pooled = !options_.unpooled_groups.count(g.name);
  std::vector<Tensor> hosts;
  for (const Pending& p : eligible) {
    const size_t n = p.device.nbytes();
    hosts.push_back(Tensor::Wrap(pooled ? pool.Allocate(n) : pool.AllocateUnpooled(n),
                                 p.device.shape(), p.device.dtype()));
  }
  // D2H: after everything compute has enqueued so far; compute does not wait for it.
  compute_marker_->Record(compute_);
  d2h_->Wait(*compute_marker_);
  StepTimeline* timeline = TracingTimeline(device_);
  int span = -1;
  if (timeline != nullptr) {
    g.flow = timeline->NewFlow();
    timeline->Instant(TraceTrack::kCompute, compute_, g.name + " commit", g.layer, g.flow);
    span = timeline->BeginSpan(TraceTrack::kDeviceToHost, *d2h_, g.name + " offload copy", g.layer,
                               g.flow);
  }
  g.d2h_start = TakeEvent();
  g.d2h_start->Record(*d2h_);
  for (size_t i = 0; i < eligible.size(); ++i) {
    Pending& p = eligible[i];
    const size_t n = p.device.nbytes();
    const Tensor& host = hosts[i];
    d2h_->CopyAsync(host.data(), p.device.data(), n);
    p.device.RecordStream(*d2h_);  // the block is reused only after the copy has read it
    for (const std::string& key : p.keys) {
      saved.Replace(key, host);
      step_keys_.push_back(key);
    }
    g.copies.push_back({host, std::move(p.keys), static_cast<int64_t>(n)});
  }
  eligible.clear();  // drop the last device references held here
  // The span ends before the event others wait on, so a trace never shows a reload that starts
  // before its copy out has ended.
  if (timeline != nullptr) timeline->EndSpan(span, *d2h_);
  g.d2h_done = TakeEvent();
  g.d2h_done->Record(*d2h_);
  g.offloaded = true;
  g.bytes = bytes;
  g.tensors = tensors;
  step_.offloaded_bytes += bytes;
  step_.offloaded_tensors += tensors;
}

void OffloadManager::WaitCopiesOut(Record& record, int below_layer) {
  for (; record.copies_waited < record.groups.size(); ++record.copies_waited) {
    GroupState& g = *record.groups[record.copies_waited];
    if (g.layer >= below_layer) return;
    if (g.offloaded) g.d2h_done->Synchronize();
  }
}

void OffloadManager::EnsureSlots(Record& record) {
  if (record.slotted == record.groups.size()) return;
  int slot = -1;
  int previous_layer = 0;
  for (auto it = record.groups.rbegin(); it != record.groups.rend(); ++it) {
    if (slot < 0 || (*it)->layer != previous_layer) ++slot;
    (*it)->slot = slot;
    previous_layer = (*it)->layer;
  }
  record.num_slots = slot + 1;
  record.slotted = record.groups.size();
}

void OffloadManager::IssueSlots(Record& record, int first_slot, int last_slot) {
  for (auto it = record.groups.rbegin(); it != record.groups.rend(); ++it) {
    GroupState& g = **it;
    if (g.slot < first_slot) continue;
    if (g.slot > last_slot) break;
    if (g.offloaded && !g.reload_issued) IssueReload(record, g);
  }
}

void OffloadManager::Prefetch(Record& record, int current_slot) {
  const int last = current_slot + options_.prefetch_layers;
  IssueSlots(record, std::max(current_slot, 0), last);
  int overflow = last - (record.num_slots - 1);  // slots that reach into the next contexts
  if (overflow <= 0) return;
  auto self = std::find(backward_order_.begin(), backward_order_.end(), record.saved);
  if (self == backward_order_.end()) return;
  for (auto it = self + 1; it != backward_order_.end() && overflow > 0; ++it) {
    Record* next = FindRecord(*it);
    if (next == nullptr || next->backward_started) continue;
    EnsureSlots(*next);
    IssueSlots(*next, 0, overflow - 1);
    overflow -= next->num_slots;
  }
}

void OffloadManager::IssueReload(Record& record, GroupState& g) {
  h2d_->Wait(*g.d2h_done);  // never read a host buffer before its copy out has finished
  StepTimeline* timeline = TracingTimeline(device_);
  const int span = timeline == nullptr ? -1
                                       : timeline->BeginSpan(TraceTrack::kHostToDevice, *h2d_,
                                                             g.name + " reload", g.layer, g.flow);
  g.h2d_start = TakeEvent();
  g.h2d_start->Record(*h2d_);
  std::vector<Tensor> hosts;
  for (Copy& copy : g.copies) {
    Tensor device = Tensor::EmptyOnStream(copy.host.shape(), copy.host.dtype(), *h2d_);
    h2d_->CopyAsync(device.data(), copy.host.data(), static_cast<size_t>(copy.bytes));
    device.RecordStream(compute_);  // freed after backward's use on the compute stream
    for (const std::string& key : copy.keys) record.saved->Replace(key, device);
    hosts.push_back(std::move(copy.host));
    copy.host = Tensor();
  }
  if (timeline != nullptr) timeline->EndSpan(span, *h2d_);  // before the event compute waits on
  g.h2d_done = TakeEvent();
  g.h2d_done->Record(*h2d_);
  pending_releases_.push_back({g.h2d_done.get(), std::move(hosts)});
  g.reload_issued = true;
  step_.reloaded_bytes += g.bytes;
  step_.reloaded_tensors += g.tensors;
}

void OffloadManager::BeforeLoad(SavedTensors& saved, const SavedGroup* group,
                                const std::string& key) {
  ReleaseCompleted(/*wait=*/false);
  Record* record = FindRecord(&saved);
  if (record == nullptr) return;
  EnsureSlots(*record);
  if (!record->backward_started) {
    record->backward_started = true;
    WaitCopiesOut(*record, std::numeric_limits<int>::max());
    Prefetch(*record, -1);
  }
  if (group == nullptr) return;
  auto found = record->by_index.find(static_cast<size_t>(group - saved.groups().data()));
  if (found == record->by_index.end()) return;
  GroupState& g = *found->second;
  if (g.slot > record->cursor) {
    record->cursor = g.slot;
    Prefetch(*record, g.slot);
  }
  if (!g.offloaded || !g.Moves(key)) return;
  if (!g.reload_issued) IssueReload(*record, g);  // used earlier than the prefetch expected
  if (!g.waited) {
    const PhaseScope waiting(device_, StepPhase::kOffloadWait);
    compute_.Wait(*g.h2d_done);
    if (StepTimeline* timeline = TracingTimeline(device_)) {
      timeline->Instant(TraceTrack::kCompute, compute_, g.name + " reloaded", g.layer, g.flow);
    }
    g.waited = true;
  }
}

void OffloadManager::OnDestroy(SavedTensors& saved) {
  auto it = records_.find(&saved);
  if (it == records_.end()) return;
  for (auto& g : it->second->groups) {
    if (!g->offloaded) continue;
    if (!g->reload_issued) {  // abandoned before backward: hold the buffers until the copy out
      std::vector<Tensor> hosts;
      for (Copy& copy : g->copies) hosts.push_back(std::move(copy.host));
      pending_releases_.push_back({g->d2h_done.get(), std::move(hosts)});
    }
    finished_.push_back(std::move(g));
  }
  records_.erase(it);
  backward_order_.erase(std::remove(backward_order_.begin(), backward_order_.end(), &saved),
                        backward_order_.end());
}

void OffloadManager::SetBackwardOrder(std::vector<const SavedTensors*> order) {
  backward_order_ = std::move(order);
}

void OffloadManager::ReleaseCompleted(bool wait) {
  auto done = [wait](const PendingRelease& p) {
    if (wait) p.event->Synchronize();
    return wait || p.event->Query();
  };
  pending_releases_.erase(std::remove_if(pending_releases_.begin(), pending_releases_.end(), done),
                          pending_releases_.end());
}

void OffloadManager::Harvest(GroupState& g) {
  if (g.d2h_done) step_.d2h_ms += g.d2h_done->ElapsedMillisecondsSince(*g.d2h_start);
  if (g.h2d_done) step_.h2d_ms += g.h2d_done->ElapsedMillisecondsSince(*g.h2d_start);
  for (auto* event : {&g.d2h_start, &g.d2h_done, &g.h2d_start, &g.h2d_done}) {
    if (*event) free_events_.push_back(std::move(*event));
  }
}

OffloadStepStats OffloadManager::EndStep() {
  d2h_->Synchronize();
  h2d_->Synchronize();
  ReleaseCompleted(/*wait=*/true);
  for (auto& g : finished_) Harvest(*g);
  finished_.clear();
  ++steps_;
  if (!policy_fixed_ && !observed_.empty()) FixPolicy();
  const OffloadStepStats out = step_;
  step_ = {};
  last_step_keys_.swap(step_keys_);
  step_keys_.clear();
  return out;
}

void OffloadManager::FixPolicy() {
  std::vector<const Observation*> candidates;
  for (const auto& o : observed_) {
    if (o->bytes > 0) candidates.push_back(o.get());
  }
  std::sort(candidates.begin(), candidates.end(), [](const Observation* a, const Observation* b) {
    return std::tie(a->layer, a->order) < std::tie(b->layer, b->order);
  });
  warmup_ = step_;
  policy_fixed_ = true;
  if (options_.planned) {  // the plan is the policy already
    Summarize();
    return;
  }
  std::vector<bool> offload(candidates.size(), true);
  // Pipeline rank r keeps r x delta bytes resident, taken from the last groups.
  const int64_t keep_bytes = pp_rank_ * options_.pp_delta_bytes;
  int64_t kept = 0;
  for (size_t i = candidates.size(); i-- > 0 && kept < keep_bytes;) {
    offload[i] = false;
    kept += candidates[i]->bytes;
  }
  // Of the rest, the earliest fraction stays offloaded.
  const auto remaining = std::count(offload.begin(), offload.end(), true);
  const auto keep_offloaded =
      static_cast<int64_t>(std::floor(options_.fraction * static_cast<double>(remaining) + 1e-9));
  int64_t seen = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!offload[i]) continue;
    if (seen++ >= keep_offloaded) offload[i] = false;
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (offload[i]) policy_.insert({candidates[i]->layer, candidates[i]->name});
  }
  Summarize();
}

void OffloadManager::Summarize() {
  summary_.clear();
  auto entry = [this](const std::string& name) -> OffloadGroupSummary& {
    for (auto& s : summary_) {
      if (s.name == name) return s;
    }
    summary_.push_back({name});
    return summary_.back();
  };
  for (const auto& o : observed_) {
    OffloadGroupSummary& s = entry(o->name);
    s.skipped += o->skipped;
    if (o->bytes == 0) continue;
    ++s.candidates;
    if (policy_.count({o->layer, o->name})) {
      ++s.offloaded;
      s.tensors += o->tensors;
      s.bytes += o->bytes;
    }
  }
  for (const std::string& name : options_.groups) entry(name);  // named but never committed
}

std::string OffloadManager::SummaryTable(
    const std::vector<std::vector<OffloadGroupSummary>>& by_pipeline_rank) const {
  std::string out;
  char line[256];
  if (options_.planned) {
    snprintf(line, sizeof(line),
             "offload: the memory plan's groups (min tensor %lld bytes, prefetch %d layer(s)), "
             "per micro-batch:\n",
             static_cast<long long>(options_.min_tensor_bytes), options_.prefetch_layers);
  } else {
    snprintf(line, sizeof(line),
             "offload: warm-up step moved %.2f MiB in %lld tensors (every candidate group); "
             "policy from the next step (min tensor %lld bytes, fraction %g, pp rank %d x delta "
             "%lld bytes, prefetch %d layer(s)), per micro-batch:\n",
             warmup_.offloaded_bytes / kMiB, static_cast<long long>(warmup_.offloaded_tensors),
             static_cast<long long>(options_.min_tensor_bytes), options_.fraction, pp_rank_,
             static_cast<long long>(options_.pp_delta_bytes), options_.prefetch_layers);
  }
  out += line;
  snprintf(line, sizeof(line), "  %4s  %-16s %9s %8s %12s %8s  %s\n", "rank", "group", "groups",
           "tensors", "MiB", "skipped", "pinned memory");
  out += line;
  const auto row = [&](int rank, const OffloadGroupSummary& s, const char* pinned) {
    const std::string groups = std::to_string(s.offloaded) + "/" + std::to_string(s.candidates);
    snprintf(line, sizeof(line), "  %4d  %-16s %9s %8lld %12.2f %8lld%s%s\n", rank, s.name.c_str(),
             groups.c_str(), static_cast<long long>(s.tensors), s.bytes / kMiB,
             static_cast<long long>(s.skipped), *pinned ? "  " : "", pinned);
    out += line;
  };
  const auto rank_rows = [&](int rank, const std::vector<OffloadGroupSummary>& summary) {
    OffloadGroupSummary total{"total"};
    for (const OffloadGroupSummary& s : summary) {
      row(rank, s, options_.unpooled_groups.count(s.name) ? "unpooled (routed shapes)" : "pool");
      total.candidates += s.candidates;
      total.offloaded += s.offloaded;
      total.tensors += s.tensors;
      total.bytes += s.bytes;
      total.skipped += s.skipped;
    }
    row(rank, total, "");
  };
  if (by_pipeline_rank.empty()) {
    rank_rows(pp_rank_, summary_);
  } else {
    for (size_t rank = 0; rank < by_pipeline_rank.size(); ++rank) {
      rank_rows(static_cast<int>(rank), by_pipeline_rank[rank]);
    }
  }
  return out;
}

}  // namespace moe
