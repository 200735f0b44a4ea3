#include "modules/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "engine/core/byte_units.h"
#include "engine/memory/caching_allocator.h"
#include "engine/memory/pinned_host_pool.h"
#include "engine/pipeline/partition.h"
#include "engine/pipeline/schedule.h"
#include "modules/layout_estimate.h"
#include "modules/memory_estimate.h"
#include "modules/offload_groups.h"

namespace moe {
namespace {

double D(int64_t value) { return static_cast<double>(value); }
double Rounded(double bytes) {
  const double round = CachingAllocator::kRoundBytes;
  return std::ceil(bytes / round) * round;
}

// What one layer does: its recompute modules and offloaded groups.
struct LayerChoice {
  RecomputeModules recompute;
  std::set<std::string> offload;
};

bool Recomputes(const RecomputeModules& r, const std::string& name) {
  return r.*RecomputeMember(name);
}
void SetRecompute(RecomputeModules& r, const std::string& name, bool on) {
  r.*RecomputeMember(name) = on;
}
RecomputeModules OnlyModule(const std::string& name) {
  RecomputeModules r;
  SetRecompute(r, name, true);
  return r;
}
bool Conflict(const std::string& module, const std::string& group) {
  return !CheckRecomputeWithOffload(OnlyModule(module), {group}).ok();
}

// Makes `c` valid after `name` was added (offload_groups.h's rules): recompute modules and
// offload groups that conflict with it leave; attn_proj comes with core_attn. False when the
// addition cannot be made valid from the candidates.
bool Repair(LayerChoice& c, const std::string& name, bool is_recompute,
            const std::set<std::string>& offload_candidates) {
  if (is_recompute) {
    if (name == kMoeActRecompute && c.recompute.moe) return false;
    if (name == kMoeRecompute) c.recompute.moe_act = false;
    for (auto it = c.offload.begin(); it != c.offload.end();) {
      it = Conflict(name, *it) ? c.offload.erase(it) : std::next(it);
    }
  } else {
    if (name == kAttnProjGroup && !c.offload.count(kCoreAttnGroup)) {
      if (!offload_candidates.count(kCoreAttnGroup)) return false;
      c.offload.insert(kCoreAttnGroup);
    }
    for (const std::string& module : RecomputeModuleNames()) {
      for (const std::string& group : c.offload) {
        if (Recomputes(c.recompute, module) && Conflict(module, group)) {
          SetRecompute(c.recompute, module, false);
        }
      }
    }
  }
  if (c.offload.count(kAttnProjGroup) && !c.offload.count(kCoreAttnGroup)) {
    c.offload.erase(kAttnProjGroup);
  }
  return true;
}

int RecomputeBits(const RecomputeModules& r) {
  return (r.layernorm ? 1 : 0) | (r.moe_act ? 2 : 0) | (r.moe ? 4 : 0) | (r.core_attn ? 8 : 0);
}

// One pipeline rank's fixed facts and its predictions for a set of choices.
class RankModel {
 public:
  RankModel(const MemoryPlanRequest& request, const LayerPartition& partition,
            const RankActions& actions, int rank)
      : request_(request), actions_(actions) {
    const GptConfig& m = request.run.model;
    RankParameters parameters;
    double moe_layers = 0, tables = 0;
    for (int chunk = 0; chunk < partition.virtual_chunks(); ++chunk) {
      const int stage = StageIndex(rank, chunk, partition.pipeline_size());
      Chunk c;
      c.range = partition.layers(rank, chunk);
      c.first = partition.is_first_stage(stage);
      c.last = partition.is_last_stage(stage);
      for (int l = c.range.begin; l < c.range.end; ++l) {
        layers_.push_back(l);
        parameters += LayerParameters(request.run, m.is_moe_layer(l));
        moe_layers += m.is_moe_layer(l) ? 1 : 0;
      }
      if (c.range.begin < c.range.end) tables += Rounded(RopeTableBytes(m));  // the chunk's
      if (c.first) {
        parameters.dense += D(m.vocab_size) * D(m.hidden_size);
        c.embedding_saves = SumRounded(EmbeddingSaves(m, request.run.micro_batch_size));
      }
      if (c.last) {
        parameters.dense += D(m.vocab_size) * D(m.hidden_size) + D(m.hidden_size);
        c.head_saves = SumRounded(HeadSaves(m, request.run.micro_batch_size, request.run.cuda));
        for (double bytes :
             HeadForwardWorkspace(m, request.run.micro_batch_size, request.run.cuda)) {
          c.head_workspace += Rounded(bytes);
        }
        const double tokens = D(request.run.micro_batch_size) * D(m.seq_length);
        c.norm_input_gradient = Rounded(tokens * D(m.hidden_size) * ComputeBytes(request.run.cuda));
        // The head's forward, logits, input gradient and weight gradient: 3 GEMMs.
        c.head_forward_ms = Ms(3 * 2 * tokens * D(m.hidden_size) * D(m.vocab_size), 0);
      }
      chunks_.push_back(c);
    }
    state_bytes_ = RankStateBytes(request.run, parameters).total() + tables;
    pending_weight_grad_bytes_ =
        Rounded(PendingWeightGradBytes(m, request.run.micro_batch_size, request.run.expert_parallel,
                                       request.run.micro_batches, moe_layers, request.run.cuda));
  }

  const std::vector<int>& layers() const { return layers_; }

  struct Prediction {
    double peak = 0;
    double ms = 0;                     // per step: waits for reloads and recompute
    std::map<int, double> exposed_ms;  // per layer, per step: the reload wait
  };

  // Predicted per step: the forward compute of every pass (choices do not change it).
  double ForwardMs() const {
    double ms = 0;
    for (const Action& a : actions_) {
      if (a.kind != Action::Kind::kForward) continue;
      const Chunk& c = chunks_[a.chunk];
      ms += c.head_forward_ms;
      for (int l = c.range.begin; l < c.range.end; ++l) ms += LayerForwardMs(l);
    }
    return ms;
  }

  // The offloaded tensors of the passes in flight when they hold the most bytes.
  std::vector<SavedTensorSize> HostBuffers(const std::vector<LayerChoice>& choices) const {
    std::vector<std::vector<SavedTensorSize>> by_chunk;
    for (const Chunk& c : chunks_) {
      std::vector<SavedTensorSize>& moved = by_chunk.emplace_back();
      for (int l = c.range.begin; l < c.range.end; ++l) {
        for (const SavedTensorSize& s :
             Saves(request_.run.model.is_moe_layer(l), choices[l].recompute)) {
          if (Moves(choices[l], s)) moved.push_back(s);
        }
      }
    }
    std::multiset<int> in_flight;  // chunks of the passes whose forward ran, backward not yet
    std::vector<SavedTensorSize> most;
    double most_bytes = 0;
    for (const Action& a : actions_) {
      if (a.kind == Action::Kind::kBackward) {
        const auto it = in_flight.find(a.chunk);
        if (it != in_flight.end()) in_flight.erase(it);
      }
      if (a.kind != Action::Kind::kForward) continue;
      in_flight.insert(a.chunk);
      std::vector<SavedTensorSize> held;
      double bytes = 0;
      for (int chunk : in_flight) {
        for (const SavedTensorSize& s : by_chunk[chunk]) {
          held.push_back(s);
          bytes += s.bytes;
        }
      }
      if (bytes > most_bytes) {
        most_bytes = bytes;
        most = std::move(held);
      }
    }
    return most;
  }

  Prediction Predict(const std::vector<LayerChoice>& choices) const {
    Prediction p;
    std::vector<Pass> passes;
    for (const Chunk& c : chunks_) passes.push_back(SimulatePass(c, choices));
    // Walk the schedule: each backward starts with the other passes in flight holding their
    // resident saves; each forward end holds every pass in flight.
    // A backward's last prefetch_layers layers also reload the top layers of the next backward
    // pass whose forward has run (the offload manager's prefetch across contexts); those stay
    // until that pass's backward.
    std::set<std::pair<int, int>> forwarded;  // (micro-batch, chunk) passes in flight
    double held = 0, prefetched = 0;
    for (size_t index = 0; index < actions_.size(); ++index) {
      const Action& a = actions_[index];
      if (a.kind == Action::Kind::kForward) {
        forwarded.insert({a.microbatch, a.chunk});
        p.peak = std::max(p.peak, held + prefetched + passes[a.chunk].forward_peak);
        held += passes[a.chunk].resident;
      } else if (a.kind == Action::Kind::kBackward) {
        const Pass& pass = passes[a.chunk];
        forwarded.erase({a.microbatch, a.chunk});
        held -= pass.resident;
        prefetched = 0;
        const Pass* next = nullptr;  // none when no other pass is in flight (no need to look)
        for (size_t j = index + 1; j < actions_.size() && next == nullptr && !forwarded.empty();
             ++j) {
          const Action& b = actions_[j];
          if (b.kind == Action::Kind::kBackward && forwarded.count({b.microbatch, b.chunk})) {
            next = &passes[b.chunk];
          }
        }
        double peak = pass.peak;
        const int n = static_cast<int>(pass.layer_held.size());
        for (int i = 0; next != nullptr && i < std::min(request_.prefetch_layers, n); ++i) {
          double reloads = 0;  // of the next pass's top prefetch_layers - i layers
          for (int k = 0; k < request_.prefetch_layers - i && k < (int)next->top_offloaded.size();
               ++k) {
            reloads += next->top_offloaded[k];
          }
          peak = std::max(peak, pass.layer_held[i] + reloads);
          prefetched = std::max(prefetched, reloads);
        }
        p.peak = std::max(p.peak, held + peak);
        p.ms += pass.exposed_ms + pass.recompute_ms;
        for (const auto& [layer, ms] : pass.exposed_by_layer) p.exposed_ms[layer] += ms;
      }
    }
    p.peak += state_bytes_ + pending_weight_grad_bytes_;
    return p;
  }

  // Per micro-batch: bytes offloaded or dropped by `name` in `layer` when chosen as in `c`.
  double CandidateBytes(int layer, const LayerChoice& c, const std::string& name,
                        bool is_recompute) const {
    const bool moe = request_.run.model.is_moe_layer(layer);
    if (is_recompute) {
      RecomputeModules without = c.recompute;
      SetRecompute(without, name, false);
      return SumRounded(Saves(moe, without)) - SumRounded(Saves(moe, c.recompute));
    }
    double bytes = 0;
    for (const SavedTensorSize& s : Saves(moe, c.recompute)) {
      if (s.group == name && s.bytes >= D(request_.min_tensor_bytes)) bytes += Rounded(s.bytes);
    }
    return bytes;
  }

  double RecomputeMs(int layer, const std::string& module) const {
    const GptConfig& m = request_.run.model;
    const bool moe = m.is_moe_layer(layer);
    const double tokens = D(request_.run.micro_batch_size) * D(m.seq_length);
    const double h = D(m.hidden_size), b = ComputeBytes(request_.run.cuda);
    if (module == kLayerNormRecompute) return Ms(0, 4 * tokens * h * b);
    if (module == kCoreAttnRecompute) {
      return Ms(AttentionCoreFlops(), 4 * tokens * D(m.q_dim()) * b);
    }
    if (!moe) return 0;
    const double rows = tokens * D(m.moe_router_topk), f = D(m.moe_ffn_hidden_size);
    if (module == kMoeActRecompute) {
      return m.moe_grouped_mlp == GroupedMlpKind::kFused ? Ms(0, 4 * rows * f * b) : 0;
    }
    return Ms(MoeFlops(),
              SumRounded(Saves(true, {})) - SumRounded(Saves(true, OnlyModule(module))));
  }

 private:
  struct Chunk {
    LayerRange range;
    bool first = false, last = false;
    double embedding_saves = 0, head_saves = 0;
    double head_workspace = 0;       // HeadForwardWorkspace, rounded
    double norm_input_gradient = 0;  // the final norm's backward output
    double head_forward_ms = 0;      // the head's backward included
  };
  struct Pass {
    double resident = 0;      // kept on the device from forward to backward
    double peak = 0;          // during its backward, other passes excluded
    double forward_peak = 0;  // during its forward: its saves so far, the layer's offloaded
                              // groups before their copy out, the copies not yet done
    double exposed_ms = 0, recompute_ms = 0;
    std::map<int, double> exposed_by_layer;
    std::vector<double> layer_held;     // during each layer's backward (by layer in the chunk)
    std::vector<double> top_offloaded;  // offloaded bytes of its layers, last layer first
  };

  // Whether `s` goes to the host under `choice`.
  bool Moves(const LayerChoice& choice, const SavedTensorSize& s) const {
    return choice.offload.count(s.group) && s.bytes >= D(request_.min_tensor_bytes);
  }
  static double SumRounded(const std::vector<SavedTensorSize>& saves) {
    double total = 0;
    for (const SavedTensorSize& s : saves) total += Rounded(s.bytes);
    return total;
  }
  const std::vector<SavedTensorSize>& Saves(bool moe, const RecomputeModules& r) const {
    auto& entry = saves_cache_[{moe, RecomputeBits(r)}];
    if (entry.empty()) {
      entry = LayerSaves(request_.run.model, request_.run.micro_batch_size,
                         request_.run.expert_parallel, moe, request_.run.cuda, r);
    }
    return entry;
  }
  double Ms(double flops, double bytes) const {
    return 1e3 * (flops / request_.speeds.matmul_flops_per_s +
                  bytes / request_.speeds.memory_bytes_per_s);
  }
  double AttentionCoreFlops() const {  // causal: half of QK^T and PV
    const GptConfig& m = request_.run.model;
    return 2 * D(request_.run.micro_batch_size) * D(m.seq_length) * D(m.seq_length) * D(m.q_dim());
  }
  double MoeFlops() const {
    const GptConfig& m = request_.run.model;
    const double tokens = D(request_.run.micro_batch_size) * D(m.seq_length), h = D(m.hidden_size);
    return 2 * tokens * h * D(m.num_experts) +
           6 * tokens * D(m.moe_router_topk) * h * D(m.moe_ffn_hidden_size);
  }
  // What a layer's backward allocates beside its saves, at its largest: the MLP's gradients of
  // its rows and of the tokens, or the attention's: q, k and v's with their packed copy (the
  // output's gradient, as large as q's, is freed before the copy; the query and key norms'
  // input gradients replace q's and k's before it; the copy outlives q, k and v's to meet the
  // input's, hidden wide). The unfused grouped MLP holds its rows' output, activation, fc1
  // output and input gradients at once, and recomputes its activation (it never saves it); the
  // fused one has the activation's gradient only inside
  // ops::GroupedMatmulSwigluBackward, if at all (output + activation + fc1 output), then output +
  // fc1 output + input.
  double BackwardWorkspace(int layer) const {
    const GptConfig& m = request_.run.model;
    const double tokens = D(request_.run.micro_batch_size) * D(m.seq_length), h = D(m.hidden_size);
    const double b = ComputeBytes(request_.run.cuda), q = D(m.q_dim()), kv = D(m.kv_dim());
    const double attention = tokens * std::max(2 * (q + 2 * kv), q + 2 * kv + h) * b;
    if (!m.is_moe_layer(layer)) {
      return Rounded(std::max(attention, tokens * (2 * h + 3 * D(m.ffn_hidden_size)) * b));
    }
    const double rows = ExpertRows(m, request_.run.micro_batch_size, request_.run.expert_parallel);
    const double f = D(m.moe_ffn_hidden_size);
    double rows_bytes;  // the gradients of the rows
    if (m.moe_grouped_mlp == GroupedMlpKind::kUnfused) {
      rows_bytes = rows * (2 * h + 4 * f) * b;
    } else if (m.fp8_recipe == Fp8Recipe::kNone) {
      rows_bytes = rows * std::max(h + 3 * f, 2 * h + 2 * f) * b;
    } else {
      // FP8: dy (read in place, not gathered) and dh in both tile forms and the rows' weight
      // gradient (f32), beside first da and dh (the CPU op's temporary; CUDA never stores it),
      // then dx.
      const int64_t e = request_.run.expert_parallel;
      rows_bytes = Fp8TileFormsBytes(m, e, rows, m.hidden_size) +
                   Fp8TileFormsBytes(m, e, rows, 2 * m.moe_ffn_hidden_size) + rows * 4 +
                   rows * std::max(request_.run.cuda ? f : 3 * f, h) * b;
    }
    return Rounded(std::max(attention, rows_bytes + tokens * h * b));
  }
  double LayerForwardMs(int layer) const {
    const GptConfig& m = request_.run.model;
    const double tokens = D(request_.run.micro_batch_size) * D(m.seq_length), h = D(m.hidden_size);
    const double q = D(m.q_dim()), kv = D(m.kv_dim());
    double flops = 2 * tokens * (2 * h * q + 2 * h * kv) + AttentionCoreFlops();
    flops += m.is_moe_layer(layer) ? MoeFlops() : 6 * tokens * h * D(m.ffn_hidden_size);
    return Ms(flops, SumRounded(Saves(m.is_moe_layer(layer), {})));
  }

  Pass SimulatePass(const Chunk& c, const std::vector<LayerChoice>& choices) const {
    const double copy = request_.speeds.copy_bytes_per_s / 1e3;  // bytes per ms
    const int prefetch = request_.prefetch_layers;
    const int n = c.range.size();
    std::vector<double> resident(n), offloaded(n), workspace(n), backward_ms(n), d2h_end(n, 0),
        h2d_end(n, 0);
    Pass pass;
    double t = 0, d2h_free = 0;
    for (int i = 0; i < n; ++i) {
      const int layer = c.range.begin + i;
      const LayerChoice& choice = choices[layer];
      const bool moe = request_.run.model.is_moe_layer(layer);
      const double full = SumRounded(Saves(moe, {}));
      for (const SavedTensorSize& s : Saves(moe, choice.recompute)) {
        (Moves(choice, s) ? offloaded : resident)[i] += Rounded(s.bytes);
      }
      const double dropped = full - resident[i] - offloaded[i];
      workspace[i] = BackwardWorkspace(layer) + dropped;
      double recompute_ms = 0;
      for (const std::string& module : RecomputeModuleNames()) {
        if (Recomputes(choice.recompute, module)) recompute_ms += RecomputeMs(layer, module);
      }
      pass.recompute_ms += recompute_ms;
      const double forward_ms = LayerForwardMs(layer);
      backward_ms[i] = 2 * forward_ms + recompute_ms;
      t += forward_ms;
      // The host waits here for the lower layers' copies out; the device, out of queued work
      // at the layer's end, waits with it.
      const double stall = i > 0 ? std::max(0.0, d2h_free - t) : 0;
      if (stall > 0) {
        pass.exposed_ms += stall;
        pass.exposed_by_layer[layer] += stall;
        t += stall;
      }
      if (offloaded[i] > 0) {
        d2h_free = std::max(d2h_free, t) + offloaded[i] / copy;
        d2h_end[i] = d2h_free;
      }
      pass.resident += resident[i];
    }
    const double layer_resident = pass.resident;
    pass.resident += c.embedding_saves + c.head_saves;
    // In the allocator's (the host's) order, a layer's offloaded blocks stay allocated until the
    // host has waited for their copy out: at the next layer's commits, or, for the last layer,
    // when backward starts.
    double so_far = c.embedding_saves;
    for (int i = 0; i < n; ++i) {
      so_far += resident[i];
      const double copying = offloaded[i] + (i > 0 ? offloaded[i - 1] : 0);
      pass.forward_peak = std::max(pass.forward_peak, so_far + copying);
    }
    t += c.head_forward_ms;
    pass.forward_peak = std::max(pass.forward_peak,
                                 pass.resident + (n > 0 ? offloaded[n - 1] : 0) + c.head_workspace);
    double h2d_free = 0;
    std::vector<bool> issued(n, false);
    const auto issue = [&](int i, double when) {
      if (i < 0 || i >= n || issued[i] || offloaded[i] == 0) return;
      issued[i] = true;
      h2d_free = std::max({h2d_free, when, d2h_end[i]}) + offloaded[i] / copy;
      h2d_end[i] = h2d_free;
    };
    const auto reloaded = [&](int low, int high) {  // issued and not yet freed, layers [low, high]
      double bytes = 0;
      for (int i = std::max(low, 0); i <= high; ++i) bytes += issued[i] ? offloaded[i] : 0;
      return bytes;
    };
    for (int k = 0; k < prefetch; ++k) issue(n - 1 - k, t);  // at backward start
    double below = layer_resident;  // resident saves of the layers not yet through backward
    pass.layer_held.assign(n, 0);
    for (int i = n - 1; i >= 0; --i) pass.top_offloaded.push_back(offloaded[i]);
    pass.peak = pass.resident + c.norm_input_gradient + reloaded(0, n - 1);
    for (int i = n - 1; i >= 0; --i) {
      issue(i - prefetch, t);
      issue(i, t);  // on demand, when the prefetch did not reach it
      const double start = std::max(t, h2d_end[i]);
      if (start > t) {
        pass.exposed_ms += start - t;
        pass.exposed_by_layer[c.range.begin + i] += start - t;
      }
      t = start;
      const double held = below + c.embedding_saves + reloaded(i - prefetch, i) + workspace[i];
      pass.peak = std::max(pass.peak, held);
      pass.layer_held[i] = held;
      below -= resident[i];
      t += backward_ms[i];
    }
    return pass;
  }

  const MemoryPlanRequest& request_;
  const RankActions& actions_;
  std::vector<Chunk> chunks_;
  std::vector<int> layers_;
  double state_bytes_ = 0;  // weights, gradients, optimizer state; the chunks' RoPE tables
  double pending_weight_grad_bytes_ = 0;  // held through the step (memory_estimate.h)
  mutable std::map<std::pair<bool, int>, std::vector<SavedTensorSize>> saves_cache_;
};

struct Candidate {
  std::string name;
  bool is_recompute;
};

std::vector<Candidate> Candidates(const MemoryPlanRequest& r) {
  std::vector<Candidate> out;
  for (const std::string& g : OffloadGroupNames()) {
    if (r.offload_candidates.count(g)) out.push_back({g, false});
  }
  for (const std::string& m : RecomputeModuleNames()) {
    if (r.recompute_candidates.count(m)) out.push_back({m, true});
  }
  return out;
}

bool Has(const LayerChoice& c, const Candidate& x) {
  return x.is_recompute ? Recomputes(c.recompute, x.name) : c.offload.count(x.name) > 0;
}

// One layer's new choice and the rank's prediction with it.
struct Change {
  int layer = -1;
  LayerChoice choice;
  RankModel::Prediction prediction;
};

// The best single change on the rank's layers: adding (`add`) or removing one candidate in one
// layer (an addition made valid by Repair, a removal of core_attn taking attn_proj along), by
// `score` of its prediction (negative: rejected; ties: the first). Each trial edits its layer in
// `choices` and puts it back.
template <typename Score>
std::optional<Change> BestChange(const RankModel& model, std::vector<LayerChoice>& choices,
                                 const std::vector<Candidate>& candidates, bool add,
                                 const std::set<std::string>& offload_candidates, Score score) {
  std::optional<Change> best;
  double best_score = 0;
  for (int layer : model.layers()) {
    const LayerChoice current = choices[layer];
    for (const Candidate& x : candidates) {
      if (Has(current, x) == add) continue;
      LayerChoice c = current;
      if (x.is_recompute) {
        SetRecompute(c.recompute, x.name, add);
      } else if (add) {
        c.offload.insert(x.name);
      } else {
        c.offload.erase(x.name);
        if (x.name == kCoreAttnGroup) c.offload.erase(kAttnProjGroup);
      }
      if (add && !Repair(c, x.name, x.is_recompute, offload_candidates)) continue;
      choices[layer] = c;
      RankModel::Prediction p = model.Predict(choices);
      choices[layer] = current;
      const double s = score(p);
      if (s < 0 || (best && s <= best_score)) continue;
      best = Change{layer, std::move(c), std::move(p)};
      best_score = s;
    }
  }
  return best;
}

// "1.25 GiB", or "37.5 MiB" below a GiB.
std::string Size(double bytes) {
  char text[32];
  if (bytes >= kGiB) {
    snprintf(text, sizeof(text), "%.2f GiB", bytes / kGiB);
  } else {
    snprintf(text, sizeof(text), "%.1f MiB", bytes / kMiB);
  }
  return text;
}

}  // namespace

PlannerSpeeds PlannerSpeeds::Defaults(bool cuda) {
  // CUDA: the rates the 8-layer Qwen3-shaped preset's forward reached on a Hopper GPU (matmuls,
  // element-wise kernels, pinned copies: tests/results/memory_and_offload.md); CPU: the one-thread
  // backend. Step 2 calibrates them on what it measured (CalibratedSpeeds).
  return cuda ? PlannerSpeeds{3.3e14, 3.0e12, 55e9} : PlannerSpeeds{2e10, 4e9, 4e9};
}

PlannerSpeeds CalibratedSpeeds(const PlannerSpeeds& assumed, double predicted_forward_ms,
                               double measured_forward_ms, double measured_copy_bytes_per_s) {
  PlannerSpeeds out = assumed;
  if (predicted_forward_ms > 0 && measured_forward_ms > 0) {
    const double scale = predicted_forward_ms / measured_forward_ms;
    out.matmul_flops_per_s *= scale;
    out.memory_bytes_per_s *= scale;
  }
  if (measured_copy_bytes_per_s > 0) out.copy_bytes_per_s = measured_copy_bytes_per_s;
  return out;
}

double PlanPinnedBytes(const MemoryPlan& plan, const std::set<std::string>& unpooled_groups) {
  double most = 0;
  for (const RankPlanSummary& rank : plan.ranks) {
    double bytes = 0;
    for (const SavedTensorSize& s : rank.host_buffers) {
      const auto size = static_cast<size_t>(s.bytes);
      bytes += static_cast<double>(unpooled_groups.count(s.group)
                                       ? PinnedHostPool::UnpooledCapacity(size)
                                       : PinnedHostPool::SizeClass(size));
    }
    most = std::max(most, bytes);
  }
  return most;
}

double MemoryPlan::peak_bytes() const {
  double peak = 0;
  for (const RankPlanSummary& r : ranks) peak = std::max(peak, r.peak_bytes);
  return peak;
}

StatusOr<MemoryPlan> PlanMemory(const MemoryPlanRequest& request) {
  MOE_ASSIGN_OR_RETURN(const PipelineLayout layout, MakePipelineLayout(request.run));
  const LayerPartition& partition = layout.partition;
  const std::vector<RankActions>& schedule = layout.schedule;

  const std::vector<Candidate> candidates = Candidates(request);
  MemoryPlan plan;
  plan.budget_bytes = request.budget_bytes;
  std::vector<LayerChoice> choices(request.run.model.num_layers);
  for (int rank = 0; rank < request.run.pipeline_parallel; ++rank) {
    const RankModel model(request, partition, schedule[rank], rank);
    const double excess =
        rank < static_cast<int>(request.excess_bytes.size()) ? request.excess_bytes[rank] : 0;
    const double target = request.budget_bytes * (1 - kPlanMargin) - excess;
    RankPlanSummary summary;
    summary.baseline_peak_bytes = model.Predict(std::vector<LayerChoice>(choices.size())).peak;
    RankModel::Prediction now = model.Predict(choices);
    // Add: the change with the most peak bytes saved per ms added.
    while (now.peak > target) {
      auto change = BestChange(model, choices, candidates, /*add=*/true, request.offload_candidates,
                               [&](const RankModel::Prediction& p) {
                                 const double saved = now.peak - p.peak;
                                 return saved <= 0 ? -1 : saved / std::max(p.ms - now.ms, 1e-6);
                               });
      if (!change) break;
      choices[change->layer] = std::move(change->choice);
      now = std::move(change->prediction);
    }
    if (now.peak > request.budget_bytes - excess) {
      char budget[32];
      snprintf(budget, sizeof(budget), "%g", request.budget_bytes / kGiB);
      return InvalidArgument(
          std::string("--memory_budget_gib=") + budget + ": pipeline rank " + std::to_string(rank) +
          " needs at least " + Size(now.peak + excess) +
          " even with every candidate offloaded or recomputed, " +
          Size(now.peak + excess - request.budget_bytes) +
          " more than the budget (raise it, add candidates to --offload_modules or "
          "--recompute_modules (auto: all), or reduce --micro_batch_size or --seq_length)");
    }
    // Undo: the choice whose removal saves the most time while the peak stays under target.
    for (;;) {
      auto change = BestChange(model, choices, candidates, /*add=*/false,
                               request.offload_candidates, [&](const RankModel::Prediction& p) {
                                 const double gain = now.ms - p.ms;
                                 return p.peak > target || gain < 0 ? -1 : gain;
                               });
      if (!change) break;
      choices[change->layer] = std::move(change->choice);
      now = std::move(change->prediction);
    }
    summary.peak_bytes = now.peak;
    summary.exposed_ms = now.ms;
    summary.forward_ms = model.ForwardMs();
    summary.host_buffers = model.HostBuffers(choices);
    plan.ranks.push_back(summary);
    const double passes = static_cast<double>(request.run.micro_batches);
    for (int layer : model.layers()) {
      const LayerChoice& c = choices[layer];
      const double offloaded = [&] {
        double total = 0;
        for (const std::string& g : c.offload) total += model.CandidateBytes(layer, c, g, false);
        return total;
      }();
      for (const Candidate& x : candidates) {
        PlanRow row{rank, layer, x.name, x.is_recompute};
        row.chosen = Has(c, x);
        row.bytes = model.CandidateBytes(layer, c, x.name, x.is_recompute);
        if (row.bytes == 0 && !row.chosen) continue;  // nothing to move in this layer
        if (row.chosen && x.is_recompute)
          row.exposed_ms = passes * model.RecomputeMs(layer, x.name);
        if (row.chosen && !x.is_recompute && offloaded > 0) {
          const auto wait = now.exposed_ms.find(layer);
          row.exposed_ms = wait == now.exposed_ms.end() ? 0 : wait->second * row.bytes / offloaded;
        }
        plan.rows.push_back(row);
      }
    }
  }
  for (int layer = 0; layer < static_cast<int>(choices.size()); ++layer) {
    plan.recompute_by_layer.push_back(choices[layer].recompute);
    for (const std::string& g : choices[layer].offload) plan.offload.insert({layer, g});
  }
  return plan;
}

std::string MemoryPlanTable(const MemoryPlan& plan) {
  std::string out;
  char line[256];
  snprintf(line, sizeof(line),
           "memory plan for a budget of %s (%.0f%% kept free); MiB per micro-batch, exposed ms "
           "per step:\n  %4s %5s  %-9s %-16s %10s  %-9s %10s\n",
           Size(plan.budget_bytes).c_str(), 100 * kPlanMargin, "rank", "layer", "kind", "candidate",
           "MiB", "decision", "exposed ms");
  out += line;
  for (const PlanRow& row : plan.rows) {
    const char* kind = row.is_recompute ? "recompute" : "offload";
    snprintf(line, sizeof(line), "  %4d %5d  %-9s %-16s %10.2f  %-9s %10.2f\n", row.rank, row.layer,
             kind, row.name.c_str(), row.bytes / kMiB, row.chosen ? kind : "keep", row.exposed_ms);
    out += line;
  }
  for (size_t rank = 0; rank < plan.ranks.size(); ++rank) {
    out += RankPlanLine(plan, static_cast<int>(rank)) + "\n";
  }
  return out;
}

std::string RankPlanLine(const MemoryPlan& plan, int rank) {
  const RankPlanSummary& r = plan.ranks[rank];
  char line[256];
  snprintf(line, sizeof(line),
           "  rank %d: predicted peak %s (%s keeping everything), predicted cost %.1f ms per step",
           rank, Size(r.peak_bytes).c_str(), Size(r.baseline_peak_bytes).c_str(), r.exposed_ms);
  return line;
}

}  // namespace moe
