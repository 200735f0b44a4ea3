// Gradient reduction, the gradient norm, the weight and state gathers under expert parallelism
// (replica_group.h), on the MPI communicator with
// CPU tensors (an even number of ranks: 2, where every rank holds other experts, and 4). The
// groups are split from the world as a trainer would: data = the world, expert-parallel groups of
// two consecutive ranks (rank / 2), expert-data = the ranks at the same position in theirs
// (rank % 2). Each rank holds rows [3 * (rank % 2), + 3) of the expert tensors, as parts of them
// (ParameterSpec::whole_shape). GradientSync reduces the dense buckets over the data group and the
// expert buckets over the expert-data group (whole, or into each rank's owned part when the state
// is sharded over each group), a pending-zero gradient reads as zero, even where its group has one
// replica; AdamW's norm over those groups (NormGroups) equals the norm of the whole model's reduced
// gradient on one rank, to f32 rounding, and is the same on every rank. With the state sharded,
// WeightGather gives every rank each bucket's owners' values and GatherBucketState the root of the
// bucket's group its whole state, each over the bucket's group.
#include "engine/distributed/gradient_sync.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/host_collectives.h"
#include "engine/distributed/state_gather.h"
#include "engine/distributed/weight_gather.h"
#include "engine/kernels/ops.h"
#include "engine/optim/adamw.h"
#include "engine/runtime/device_context.h"
#include "tests/distributed/test_world.h"
#include "tests/testing/owned_slices.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new testing::TestWorld);

constexpr int kExpertParallel = 2;
constexpr int64_t kExpertRows = 3;         // per rank
constexpr int64_t kBucketBytes = 130 * 4;  // {router, norm}, {experts.fc2}, {experts.fc1}, {embed}

// The model, whole: its expert tensors hold every rank's rows.
std::vector<ParameterSpec> WholeSpecs() {
  using enum ReplicaGroup;
  const int64_t experts = kExpertParallel * kExpertRows;
  return {{.name = "embed", .shape = {5, 40}},
          {.name = "experts.fc1", .shape = {experts, 40}, .replicas = kExpertData},
          {.name = "experts.fc2", .shape = {experts, 20}, .replicas = kExpertData},
          {.name = "router", .shape = {2, 40}},
          {.name = "norm", .shape = {40}, .weight_decay = false}};
}

// What a rank at `position` of its expert-parallel group holds of it.
std::vector<ParameterSpec> RankSpecs(int position) {
  std::vector<ParameterSpec> specs = WholeSpecs();
  for (ParameterSpec& spec : specs) {
    if (spec.replicas != ReplicaGroup::kExpertData) continue;
    spec.whole_shape = spec.shape;
    spec.shape[0] = kExpertRows;
    spec.first_row = position * kExpertRows;
  }
  return specs;
}

bool Written(const std::string& name) { return name != "experts.fc2"; }  // fc2 stays pending zero

// Rank r's gradient of element j of the whole tensor `name`: multiples of 1/4, so that every sum
// over ranks is exact in f32 whatever its order.
float RankGrad(int r, const std::string& name, int64_t j) {
  return 0.25f * static_cast<float>(r + 1) +
         0.5f * static_cast<float>((j + static_cast<int64_t>(name.size())) % 11) - 2.0f;
}

// The reduced gradient of element j of the whole tensor of `spec`: the sum over the ranks that
// hold the element (all of them for a dense parameter, the expert-data group for an expert's).
float ReducedGrad(const ParameterSpec& spec, int64_t j, int world_size) {
  if (!Written(spec.name)) return 0.0f;
  const int64_t row_numel = NumElements(spec.shape) / spec.shape[0];
  const int position = static_cast<int>(j / row_numel / kExpertRows);
  float sum = 0;
  for (int r = 0; r < world_size; ++r) {
    if (spec.replicas == ReplicaGroup::kData || r % kExpertParallel == position) {
      sum += RankGrad(r, spec.name, j);
    }
  }
  return sum;
}

// Element j of `spec` (a part, or whole) in its whole tensor.
int64_t WholeIndex(const ParameterSpec& spec, int64_t j) {
  return spec.first_row * (NumElements(spec.shape) / spec.shape[0]) + j;
}

const ParameterSpec& SpecOf(const ParameterSet& set, const Parameter& p) {
  for (size_t i = 0; i < set.all().size(); ++i) {
    if (set.all()[i].get() == &p) return set.specs()[i];
  }
  LOG(FATAL) << "not in the set: " << p.name;
}

class ReplicaGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world_.size() % kExpertParallel, 0) << "run under mpirun with an even rank count";
    DeviceContext& context = DeviceContext::Get(device_);
    for (auto& stream : streams_) stream = context.CreateSideStream();
    data_ = world_.NewCommunicator(*streams_[0], std::chrono::seconds(60));
    const int rank = data_->rank();
    expert_data_ = data_->Split(rank % kExpertParallel, rank, *streams_[1]);
    expert_ = data_->Split(rank / kExpertParallel, rank, *streams_[2]);
  }
  void TearDown() override {
    expert_.reset();
    expert_data_.reset();
    data_.reset();
  }

  int position() const { return data_->rank() % kExpertParallel; }

  // This rank's parameters, with the state sharded over each group or not, and its gradients
  // written (all but experts.fc2's).
  ParameterSet RankParameters(bool sharded) const {
    ParameterSet set = ParameterSet::Deferred(device_, DType::kF32, /*seed=*/3);
    for (const ParameterSpec& spec : RankSpecs(position())) set.Create(spec);
    BucketSharding sharding;
    if (sharded) {
      sharding = {.data = {data_->size(), data_->rank()},
                  .expert_data = {expert_data_->size(), expert_data_->rank()}};
    }
    set.AllocateBuckets(sharding, kBucketBytes);
    for (size_t i = 0; i < set.all().size(); ++i) {
      const ParameterSpec& spec = set.specs()[i];
      Parameter& p = *set.all()[i];
      if (!Written(spec.name)) continue;
      std::vector<float> grad(p.grad.numel());
      for (int64_t j = 0; j < p.grad.numel(); ++j) {
        grad[j] = RankGrad(data_->rank(), spec.name, WholeIndex(spec, j));
      }
      BeginGradWrite(p);
      ops::CopyFromHost(grad.data(), p.grad);
    }
    return set;
  }

  ReplicaCommunicators groups() const { return {data_.get(), expert_data_.get()}; }

  World& world_ = testing::TestWorld::Get();
  Device device_ = Device::CPU();
  std::unique_ptr<Stream> streams_[3];
  std::unique_ptr<Communicator> data_, expert_data_, expert_;
};

TEST_F(ReplicaGroupsTest, ReducesEachBucketOverItsReplicaGroup) {
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "whole");
    ParameterSet set = RankParameters(sharded);
    ASSERT_EQ(set.buckets().size(), 4u);
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    GradientSync sync(groups(), set, compute);
    sync.GradsFinal("norm");  // completes no bucket: router's gradient is not final yet
    sync.GradsFinal("router");
    sync.GradsFinal("experts.");
    sync.Finish();
    compute.Synchronize();
    // Unsharded every element; sharded what the rank owns (slices within a parameter).
    for (const OwnedSlice& s : set.OwnedSlices()) {
      const std::vector<float> got = testing::ToFloats(s.grad);
      for (const testing::SlicePart& part : testing::SliceParts(set, s)) {
        const ParameterSpec& spec = SpecOf(set, *part.parameter);
        for (int64_t i = 0; i < part.count; ++i) {
          ASSERT_EQ(got[part.at + i],
                    ReducedGrad(spec, WholeIndex(spec, part.first + i), data_->size()))
              << spec.name << "[" << part.first + i << "]";
        }
      }
    }
  }
}

TEST_F(ReplicaGroupsTest, TheNormWithExpertsSplitIsTheWholeModelsOnEveryRank) {
  // The whole model's reduced gradient on one rank.
  ParameterSet whole(device_, DType::kF32, /*seed=*/3);
  for (const ParameterSpec& spec : WholeSpecs()) {
    Parameter& p = whole.Create(spec);
    std::vector<float> grad(p.grad.numel());
    for (int64_t j = 0; j < p.grad.numel(); ++j) grad[j] = ReducedGrad(spec, j, data_->size());
    BeginGradWrite(p);
    ops::CopyFromHost(grad.data(), p.grad);
  }
  const AdamWOptions options{.clip_grad = 0};
  const float want = AdamW(options).Step(whole, 1e-3f).grad_norm;
  ASSERT_GT(want, 0);

  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "whole");
    ParameterSet set = RankParameters(sharded);
    Stream& compute = DeviceContext::Get(device_).compute_stream();
    GradientSync sync(groups(), set, compute);
    sync.Finish();
    NormGroups norm_groups{.expert = expert_.get()};
    if (sharded) norm_groups.shard = groups();
    const float got = AdamW(options).Step(set, 1e-3f, norm_groups).grad_norm;
    EXPECT_NEAR(got, want, 1e-6 * want);
    for (float norm : AllGatherHost(data_.get(), std::vector<float>{got})) {
      EXPECT_EQ(norm, got) << "ranks clip by different norms";
    }
  }
}

// What shard `shard` of a bucket holds at its element k in the gather tests.
float Marker(int shard, int64_t k) { return static_cast<float>(k % 97) + 1000.0f * shard; }

TEST_F(ReplicaGroupsTest, WeightsAndStateGatherOverEachBucketsGroup) {
  ParameterSet set = RankParameters(/*sharded=*/true);
  Stream& compute = DeviceContext::Get(device_).compute_stream();
  // Every bucket's values: this rank's shard marked, the rest poisoned.
  for (const ParameterBucket& b : set.buckets()) {
    std::vector<float> values(b.layout.numel, -1.0f);
    for (int64_t k = b.owned_begin(); k < b.owned_end(); ++k) values[k] = Marker(b.shard, k);
    ops::CopyFromHost(values.data(), b.value);
    const Tensor owned = b.exp_avg;
    std::vector<float> moments(owned.numel());
    for (int64_t k = 0; k < owned.numel(); ++k) moments[k] = Marker(b.shard, b.owned_begin() + k);
    ops::CopyFromHost(moments.data(), owned);
  }
  WeightGather gather(groups(), set, compute);
  gather.Start();
  gather.WaitAll();
  compute.Synchronize();
  for (size_t i = 0; i < set.buckets().size(); ++i) {
    const ParameterBucket& b = set.buckets()[i];
    const std::vector<float> got = testing::ToFloats(b.value);
    for (int64_t k = 0; k < b.layout.numel; ++k) {
      ASSERT_EQ(got[k], Marker(static_cast<int>(k / b.layout.shard_numel()), k))
          << "bucket " << i << " element " << k;
    }
    const WholeBucketState whole = GatherBucketState(groups(), set, i, /*root=*/0);
    compute.Synchronize();
    ASSERT_EQ(whole.exp_avg.defined(), groups()[b.layout.replicas]->rank() == 0) << i;
    if (!whole.exp_avg.defined()) continue;
    const std::vector<float> state = testing::ToFloats(whole.exp_avg);
    for (int64_t k = 0; k < b.layout.numel; ++k) {
      ASSERT_EQ(state[k], Marker(static_cast<int>(k / b.layout.shard_numel()), k))
          << "bucket " << i << " element " << k;
    }
  }
}

}  // namespace
}  // namespace moe
