// The offload manager on hand-made saved-tensor contexts (no model): the skip rules, what moves
// and when it comes back (prefetch distance, backward order across contexts), the waits (with
// the CPU copy-latency knob turned up), the pinned pool, the policy (fraction, pipeline-rank
// delta), forward-only contexts and abandoned ones.
#include "engine/offload/offload_manager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "engine/runtime/device_context.h"
#include "tests/testing/copy_latency.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

using testing::FromFloats;
using testing::ToFloats;

const Device kCpu = Device::CPU();

std::vector<float> Values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  return testing::RandomFloats(n, rng);
}

Tensor DeviceTensor(int64_t n, uint32_t seed) {
  return FromFloats(Values(n, seed), {n}, DType::kF32, kCpu);
}

bool OnHost(const SavedTensors& saved, const std::string& key) {
  return saved.Peek(key).space() == MemorySpace::kPinnedHost;
}

OffloadOptions Options(std::set<std::string> groups, int64_t min_bytes = 0) {
  OffloadOptions o;
  o.groups = std::move(groups);
  o.min_tensor_bytes = min_bytes;
  return o;
}

// Saves one tensor of `n` floats per (layer, group) under "<group>.<layer>", forward order.
void ForwardLayers(SavedTensors& saved, int layers, const std::vector<std::string>& groups,
                   int64_t n, uint32_t seed = 1) {
  for (int layer = 0; layer < layers; ++layer) {
    for (const std::string& group : groups) {
      ScopedSaveGroup scope(saved, group, layer);
      saved.Save(group + "." + std::to_string(layer), DeviceTensor(n, seed + 100 * layer));
    }
  }
}

TEST(OffloadManagerTest, SkipRules) {
  OffloadManager manager(kCpu, Options({"g"}, /*min_bytes=*/4096));
  {
    SavedTensors saved(true, &manager);
    Tensor parameter = DeviceTensor(2048, 2);
    parameter.set_is_parameter(true);
    Tensor pinned = Tensor::Empty({2048}, DType::kF32, kCpu, MemorySpace::kPinnedHost);
    Tensor marked = DeviceTensor(2048, 3);
    marked.set_do_not_offload(true);
    const std::vector<float> big = Values(2048, 4), edge = Values(1024, 5);
    {
      ScopedSaveGroup group(saved, "g", 0);
      saved.Save("big", FromFloats(big, {32, 64}, DType::kF32, kCpu));  // 8 KiB
      saved.Save("edge", FromFloats(edge, {1024}, DType::kF32, kCpu));  // exactly 4 KiB
      saved.Save("parameter", parameter);
      saved.Save("pinned", pinned);
      saved.Save("marked", marked);
      saved.Save("small", DeviceTensor(1023, 6));  // 4 bytes short
    }
    {
      ScopedSaveGroup group(saved, "not_selected", 0);
      saved.Save("other_group", DeviceTensor(2048, 7));
    }
    saved.Save("outside", DeviceTensor(2048, 8));

    EXPECT_TRUE(OnHost(saved, "big"));
    EXPECT_TRUE(OnHost(saved, "edge"));
    for (const char* key : {"parameter", "marked", "small", "other_group", "outside"}) {
      EXPECT_EQ(saved.Peek(key).space(), MemorySpace::kDevice) << key;
    }
    EXPECT_TRUE(saved.Peek("parameter").SharesStorageWith(parameter));
    EXPECT_TRUE(saved.Peek("pinned").SharesStorageWith(pinned));

    const Tensor big_back = saved.Load("big");
    EXPECT_EQ(big_back.space(), MemorySpace::kDevice);
    EXPECT_EQ(big_back.shape(), (Shape{32, 64}));
    EXPECT_EQ(ToFloats(big_back), big);
    EXPECT_EQ(ToFloats(saved.Load("edge")), edge);
    for (const char* key : {"parameter", "pinned", "marked", "small", "other_group", "outside"}) {
      saved.Load(key);
    }
  }
  const OffloadStepStats stats = manager.EndStep();
  EXPECT_EQ(stats.offloaded_tensors, 2);
  EXPECT_EQ(stats.offloaded_bytes, 8192 + 4096);
  EXPECT_EQ(stats.reloaded_bytes, 8192 + 4096);
  EXPECT_EQ(manager.last_step_offloaded_keys(), (std::vector<std::string>{"big", "edge"}));
  ASSERT_EQ(manager.summary().size(), 1u);
  EXPECT_EQ(manager.summary()[0].skipped, 4);
}

TEST(OffloadManagerTest, ATensorSavedTwiceInAGroupIsCopiedOnce) {
  OffloadManager manager(kCpu, Options({"g"}));
  const std::vector<float> values = Values(512, 9);
  {
    SavedTensors saved(true, &manager);
    {
      const Tensor t = FromFloats(values, {512}, DType::kF32, kCpu);
      ScopedSaveGroup group(saved, "g", 0);
      saved.Save("a", t);
      saved.Save("b", t);
    }
    EXPECT_TRUE(OnHost(saved, "a"));
    EXPECT_TRUE(saved.Peek("a").SharesStorageWith(saved.Peek("b")));
    const Tensor a = saved.Load("a"), b = saved.Load("b");
    EXPECT_TRUE(a.SharesStorageWith(b));
    EXPECT_EQ(ToFloats(b), values);
  }
  EXPECT_EQ(manager.EndStep().offloaded_tensors, 1);
}

// Forward then backward, the copy streams slowed down: a reload that did not wait for its copy
// out, or a load that did not wait for its reload, would read garbage.
TEST(OffloadManagerTest, ReloadsAndLoadsWaitForTheCopiesWithSlowCopyStreams) {
  testing::LatencyKnob knob(std::chrono::milliseconds(3));
  for (int prefetch : {0, 1, 3}) {
    OffloadOptions options = Options({"a", "b"});
    options.prefetch_layers = prefetch;
    OffloadManager manager(kCpu, options);
    for (int step = 0; step < 2; ++step) {
      {
        SavedTensors saved(true, &manager);
        ForwardLayers(saved, 3, {"a", "b"}, 4096, /*seed=*/10 + step);
        for (int layer = 2; layer >= 0; --layer) {
          for (const char* group : {"b", "a"}) {
            const std::string key = std::string(group) + "." + std::to_string(layer);
            EXPECT_EQ(ToFloats(saved.Load(key)), Values(4096, 10 + step + 100 * layer))
                << key << " prefetch " << prefetch << " step " << step;
          }
        }
      }
      EXPECT_EQ(manager.EndStep().reloaded_tensors, 6);
    }
  }
}

TEST(OffloadManagerTest, ReloadsRunPrefetchLayersAhead) {
  for (int prefetch : {0, 1, 2}) {
    OffloadOptions options = Options({"g"});
    options.prefetch_layers = prefetch;
    OffloadManager manager(kCpu, options);
    {
      SavedTensors saved(true, &manager);
      ForwardLayers(saved, 4, {"g"}, 256);
      saved.Save("head", DeviceTensor(16, 1));  // outside any group, read first in backward
      for (int layer = 0; layer < 4; ++layer)
        EXPECT_TRUE(OnHost(saved, "g." + std::to_string(layer)));
      saved.Load("head");  // backward starts: the first `prefetch` layers are issued
      for (int layer = 3; layer >= 0; --layer) {
        const int first_issued_ahead = 4 - prefetch;  // layers >= this one are issued at the start
        EXPECT_EQ(OnHost(saved, "g." + std::to_string(layer)), layer < first_issued_ahead)
            << "prefetch " << prefetch << " layer " << layer;
      }
      for (int layer = 3; layer >= 0; --layer) {
        saved.Load("g." + std::to_string(layer));
        for (int ahead = layer - 1; ahead >= 0; --ahead) {
          EXPECT_EQ(OnHost(saved, "g." + std::to_string(ahead)), ahead < layer - prefetch)
              << "prefetch " << prefetch << " at layer " << layer << ", layer " << ahead;
        }
      }
    }
    manager.EndStep();
  }
}

TEST(OffloadManagerTest, PrefetchFollowsTheGivenBackwardOrderAcrossContexts) {
  for (bool ordered : {false, true}) {
    OffloadManager manager(kCpu, Options({"g"}));  // prefetch 1 layer
    {
      SavedTensors first(true, &manager), second(true, &manager);  // e.g. two micro-batches
      if (ordered) manager.SetBackwardOrder({&second, &first});
      ForwardLayers(first, 2, {"g"}, 256, 1);
      ForwardLayers(second, 2, {"g"}, 256, 2);
      EXPECT_EQ(ToFloats(second.Load("g.1")), Values(256, 102));
      EXPECT_FALSE(OnHost(second, "g.0"));
      EXPECT_TRUE(OnHost(first, "g.1"));
      EXPECT_EQ(ToFloats(second.Load("g.0")), Values(256, 2));
      // The next context in backward order is prefetched only when the order was given.
      EXPECT_EQ(OnHost(first, "g.1"), !ordered);
      EXPECT_TRUE(OnHost(first, "g.0"));
      EXPECT_EQ(ToFloats(first.Load("g.1")), Values(256, 101));
      EXPECT_EQ(ToFloats(first.Load("g.0")), Values(256, 1));
    }
    EXPECT_EQ(manager.EndStep().reloaded_tensors, 4);
  }
}

TEST(OffloadManagerTest, StaticGroupsReuseThePinnedPoolAndRoutedGroupsBypassIt) {
  OffloadOptions options = Options({"static", "routed"});
  options.unpooled_groups = {"routed"};
  OffloadManager manager(kCpu, options);
  PinnedHostPool& pool = DeviceContext::Get(kCpu).pinned_pool();
  const PinnedPoolStats before = pool.stats();
  for (int step = 0; step < 4; ++step) {
    const PinnedPoolStats start = pool.stats();
    {
      SavedTensors saved(true, &manager);
      {
        ScopedSaveGroup group(saved, "static", 0);
        saved.Save("s", DeviceTensor(12345, 1));
      }
      {
        ScopedSaveGroup group(saved, "routed", 0);
        saved.Save("r", DeviceTensor(1000 + 300 * step, 2));  // rows depend on routing
      }
      const PinnedPoolStats during = pool.stats();
      EXPECT_EQ(during.hits + during.misses, start.hits + start.misses + 1) << "step " << step;
      EXPECT_EQ(during.unpooled_allocations, start.unpooled_allocations + 1);
      EXPECT_EQ(during.unpooled_in_use_bytes,
                start.unpooled_in_use_bytes + 4 * (1000 + 300 * step));
      saved.Load("r");
      saved.Load("s");
    }
    manager.EndStep();
    const PinnedPoolStats end = pool.stats();
    EXPECT_EQ(end.unpooled_in_use_bytes, before.unpooled_in_use_bytes) << "step " << step;
    EXPECT_EQ(end.pooled_in_use_bytes, before.pooled_in_use_bytes) << "step " << step;
    if (step > 0) {
      EXPECT_EQ(end.hits, start.hits + 1) << "the static group's buffer is reused";
      EXPECT_EQ(end.pooled_reserved_bytes, start.pooled_reserved_bytes);
    }
  }
}

struct PolicyRun {
  std::vector<std::string> warm_up;  // keys moved in the first step
  std::vector<std::string> keys;     // keys moved in the second
  std::vector<OffloadGroupSummary> summary;
  std::string table;
};

// 4 layers x groups a (1 KiB) and b (3 KiB), two steps.
PolicyRun RunPolicy(double fraction, int pp_rank, int64_t pp_delta_bytes) {
  OffloadOptions options = Options({"a", "b"});
  options.fraction = fraction;
  options.pp_delta_bytes = pp_delta_bytes;
  OffloadManager manager(kCpu, options, pp_rank);
  PolicyRun run;
  for (int step = 0; step < 2; ++step) {
    {
      SavedTensors saved(true, &manager);
      for (int layer = 0; layer < 4; ++layer) {
        for (auto [group, n] : {std::pair{"a", 256}, {"b", 768}}) {
          ScopedSaveGroup scope(saved, group, layer);
          saved.Save(std::string(group) + std::to_string(layer), DeviceTensor(n, 1));
        }
      }
      for (const std::string& key : saved.keys()) saved.Load(key);
    }
    manager.EndStep();
    (step == 0 ? run.warm_up : run.keys) = manager.last_step_offloaded_keys();
  }
  run.summary = manager.summary();
  run.table = manager.SummaryTable();
  return run;
}

std::vector<std::string> KeysAfterWarmUp(double fraction, int pp_rank, int64_t pp_delta_bytes) {
  const PolicyRun run = RunPolicy(fraction, pp_rank, pp_delta_bytes);
  EXPECT_EQ(run.warm_up.size(), 8u) << "the warm-up step moves every candidate";
  return run.keys;
}

using Keys = std::vector<std::string>;

TEST(OffloadManagerTest, PolicyFractionKeepsTheEarliestGroupsOffloaded) {
  EXPECT_EQ(KeysAfterWarmUp(1.0, 0, 0), (Keys{"a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"}));
  EXPECT_EQ(KeysAfterWarmUp(0.5, 0, 0), (Keys{"a0", "b0", "a1", "b1"}));
  EXPECT_EQ(KeysAfterWarmUp(0.3, 0, 0), (Keys{"a0", "b0"}));  // floor(0.3 x 8) = 2
  EXPECT_EQ(KeysAfterWarmUp(0.0, 0, 0), Keys{});
  const PolicyRun run = RunPolicy(0.5, 0, 0);
  ASSERT_EQ(run.summary.size(), 2u);
  EXPECT_EQ(run.summary[0].name, "a");
  EXPECT_EQ(run.summary[0].candidates, 4);
  EXPECT_EQ(run.summary[0].offloaded, 2);
  EXPECT_EQ(run.summary[0].tensors, 2);
  EXPECT_EQ(run.summary[0].bytes, 2 * 1024);
  EXPECT_EQ(run.summary[1].bytes, 2 * 3072);
  const std::string& table = run.table;
  EXPECT_NE(table.find("2/4"), std::string::npos) << table;
  EXPECT_NE(table.find("total"), std::string::npos) << table;
}

TEST(OffloadManagerTest, PolicyPipelineRankKeepsRankTimesDeltaBytesOfTheLastGroups) {
  const Keys all = {"a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"};
  EXPECT_EQ(KeysAfterWarmUp(1.0, 0, 4096), all) << "rank 0 keeps nothing";
  // Rank 1 keeps >= 4 KiB: b3 (3 KiB) and a3 (1 KiB).
  EXPECT_EQ(KeysAfterWarmUp(1.0, 1, 4096), (Keys{"a0", "b0", "a1", "b1", "a2", "b2"}));
  // Rank 2 keeps >= 8 KiB: b3, a3, b2, then a2 reaches 8 KiB.
  EXPECT_EQ(KeysAfterWarmUp(1.0, 2, 4096), (Keys{"a0", "b0", "a1", "b1"}));
  // Rank 1 keeps >= 1 byte: b3 alone; then half of the 7 remaining (3) stay offloaded.
  EXPECT_EQ(KeysAfterWarmUp(0.5, 1, 1), (Keys{"a0", "b0", "a1"}));
}

TEST(OffloadManagerTest, ForwardOnlyContextsNeitherOffloadNorTouchThePolicy) {
  OffloadManager manager(kCpu, Options({"g"}));
  {
    SavedTensors forward_only(false, &manager);
    ForwardLayers(forward_only, 2, {"g"}, 256);
    EXPECT_TRUE(forward_only.empty());
  }
  const OffloadStepStats stats = manager.EndStep();
  EXPECT_EQ(stats.offloaded_bytes, 0);
  EXPECT_FALSE(manager.policy_fixed());
  {
    SavedTensors saved(true, &manager);
    ForwardLayers(saved, 2, {"g"}, 256);
    EXPECT_TRUE(OnHost(saved, "g.0"));
    saved.Load("g.1");
    saved.Load("g.0");
  }
  EXPECT_EQ(manager.EndStep().offloaded_tensors, 2);
  EXPECT_TRUE(manager.policy_fixed());
}

TEST(OffloadManagerTest, AnAbandonedContextReleasesItsPinnedBuffers) {
  testing::LatencyKnob knob(std::chrono::milliseconds(2));
  OffloadOptions options = Options({"g"});
  options.unpooled_groups = {"g"};
  OffloadManager manager(kCpu, options);
  PinnedHostPool& pool = DeviceContext::Get(kCpu).pinned_pool();
  const int64_t before = pool.stats().unpooled_in_use_bytes;
  {
    SavedTensors saved(true, &manager);
    ForwardLayers(saved, 3, {"g"}, 1000);
    EXPECT_EQ(pool.stats().unpooled_in_use_bytes, before + 3 * 4000);
  }  // no backward
  manager.EndStep();
  EXPECT_EQ(pool.stats().unpooled_in_use_bytes, before);
}

}  // namespace
}  // namespace moe
