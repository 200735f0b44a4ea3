// Checkpoint directories: save/load round trip, `latest` following the newest save, leftovers of
// a crashed save ignored, refusal to overwrite, and clear errors for mismatched or missing
// tensors and bad roots.
#include "engine/io/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "engine/kernels/ops.h"
#include "tests/testing/tensor_testing.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using ::moe::testing::PoisonedTensor;
using ::moe::testing::RandomTensor;

std::vector<uint8_t> HostBytes(const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  ops::CopyToHost(t, bytes.data());
  return bytes;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Quoted(const fs::path& path) { return std::string("'") + path.string() + "'"; }

std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// A tiny model and optimizer state, freshly random.
struct Snapshot {
  std::vector<NamedTensor> model;
  std::vector<NamedTensor> optimizer;
};

Snapshot RandomSnapshot(std::mt19937& rng) {
  Tensor stacked = RandomTensor({4, 8}, DType::kF32, Device::CPU(), rng);
  Tensor step = Tensor::Empty({1}, DType::kI64, Device::CPU());
  const int64_t step_value = static_cast<int64_t>(rng());
  ops::CopyFromHost(&step_value, step);
  return {{{"embedding.weight", RandomTensor({16, 8}, DType::kBF16, Device::CPU(), rng)},
           {"layers.0.attn.q_proj.weight", stacked.Rows(0, 2)},
           {"layers.0.mlp.router.weight", RandomTensor({4, 8}, DType::kF32, Device::CPU(), rng)}},
          {{"adam.m.embedding.weight", RandomTensor({16, 8}, DType::kF32, Device::CPU(), rng)},
           {"adam.step", step}}};
}

// Poisoned tensors of the same names, shapes and dtypes.
std::vector<NamedTensor> Like(const std::vector<NamedTensor>& tensors) {
  std::vector<NamedTensor> out;
  for (const NamedTensor& t : tensors) {
    out.push_back({t.name, PoisonedTensor(t.tensor.shape(), t.tensor.dtype(), Device::CPU())});
  }
  return out;
}

void ExpectSameBits(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(HostBytes(got[i].tensor), HostBytes(want[i].tensor)) << want[i].name;
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "checkpoint_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    root_ = (dir_ / "run" / "checkpoints").string();  // created by the first save
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads from `path` into fresh tensors shaped like `like`; expects success.
  nlohmann::json LoadOk(const std::string& path, const Snapshot& like, Snapshot* loaded) {
    loaded->model = Like(like.model);
    loaded->optimizer = Like(like.optimizer);
    StatusOr<nlohmann::json> state = LoadCheckpoint(path, loaded->model, loaded->optimizer);
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? state.value() : nlohmann::json();
  }

  std::mt19937 rng_{::moe::testing::TestSeed()};
  fs::path dir_;
  std::string root_;
};

TEST_F(CheckpointTest, SaveThenLoadKeepsEveryBit) {
  const Snapshot saved = RandomSnapshot(rng_);
  const nlohmann::json state = {
      {"step", 100}, {"lr", 3e-4}, {"data", {{"epoch", 1}, {"offset", 42}}}};
  const Status status = SaveCheckpoint(root_, 100, saved.model, saved.optimizer, state);
  ASSERT_TRUE(status.ok()) << status.ToString();

  EXPECT_EQ(Entries(root_), (std::set<std::string>{"latest", "step_00000100"}));
  EXPECT_EQ(ReadFile(fs::path(root_) / "latest"), "step_00000100\n");
  const fs::path step_dir = fs::path(root_) / "step_00000100";
  EXPECT_EQ(Entries(step_dir),
            (std::set<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));

  for (const std::string& path : {root_, step_dir.string()}) {
    SCOPED_TRACE(path);
    Snapshot loaded;
    EXPECT_EQ(LoadOk(path, saved, &loaded), state);
    ExpectSameBits(loaded.model, saved.model);
    ExpectSameBits(loaded.optimizer, saved.optimizer);
  }
}

TEST_F(CheckpointTest, LatestNamesTheNewestSave) {
  const Snapshot first = RandomSnapshot(rng_);
  const Snapshot second = RandomSnapshot(rng_);
  ASSERT_TRUE(SaveCheckpoint(root_, 100, first.model, first.optimizer, {{"step", 100}}).ok());
  ASSERT_TRUE(SaveCheckpoint(root_, 200, second.model, second.optimizer, {{"step", 200}}).ok());

  EXPECT_EQ(ReadFile(fs::path(root_) / "latest"), "step_00000200\n");
  StatusOr<std::string> dir = ResolveCheckpointDir(root_);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(dir.value(), (fs::path(root_) / "step_00000200").string());

  Snapshot loaded;
  EXPECT_EQ(LoadOk(root_, first, &loaded)["step"], 200);
  ExpectSameBits(loaded.model, second.model);
  EXPECT_EQ(LoadOk((fs::path(root_) / "step_00000100").string(), first, &loaded)["step"], 100);
  ExpectSameBits(loaded.optimizer, first.optimizer);
}

TEST_F(CheckpointTest, LeftoversOfACrashedSaveAreIgnored) {
  const Snapshot first = RandomSnapshot(rng_);
  ASSERT_TRUE(SaveCheckpoint(root_, 100, first.model, first.optimizer, {{"step", 100}}).ok());
  // A save of step 200 by another process died mid-way: half a directory, and a latest.tmp
  // that was never renamed.
  const fs::path crashed = fs::path(root_) / ".step_00000200.tmp-999999";
  fs::create_directory(crashed);
  std::ofstream(crashed / "model.safetensors") << "half";
  std::ofstream(crashed / "state.json") << R"({"step": 200})";
  std::ofstream(fs::path(root_) / "latest.tmp") << ".step_00000200.tmp-999999\n";

  StatusOr<std::string> dir = ResolveCheckpointDir(root_);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(dir.value(), (fs::path(root_) / "step_00000100").string());
  Snapshot loaded;
  EXPECT_EQ(LoadOk(root_, first, &loaded)["step"], 100);
  ExpectSameBits(loaded.model, first.model);

  // The next save is not disturbed, and replaces latest.tmp.
  const Snapshot second = RandomSnapshot(rng_);
  ASSERT_TRUE(SaveCheckpoint(root_, 200, second.model, second.optimizer, {{"step", 200}}).ok());
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"latest", "step_00000100", "step_00000200",
                                                   ".step_00000200.tmp-999999"}));
  EXPECT_EQ(LoadOk(root_, first, &loaded)["step"], 200);
  ExpectSameBits(loaded.model, second.model);
}

TEST_F(CheckpointTest, RefusesToOverwriteUnlessAsked) {
  const Snapshot first = RandomSnapshot(rng_);
  const Snapshot second = RandomSnapshot(rng_);
  ASSERT_TRUE(SaveCheckpoint(root_, 100, first.model, first.optimizer, {{"v", 1}}).ok());

  const Status refused = SaveCheckpoint(root_, 100, second.model, second.optimizer, {{"v", 2}});
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), "checkpoint '" + (fs::path(root_) / "step_00000100").string() +
                                   "' already exists; refusing to overwrite it");
  Snapshot loaded;
  EXPECT_EQ(LoadOk(root_, first, &loaded)["v"], 1);
  ExpectSameBits(loaded.model, first.model);

  const Status replaced =
      SaveCheckpoint(root_, 100, second.model, second.optimizer, {{"v", 2}}, /*overwrite=*/true);
  ASSERT_TRUE(replaced.ok()) << replaced.ToString();
  EXPECT_EQ(LoadOk(root_, first, &loaded)["v"], 2);
  ExpectSameBits(loaded.model, second.model);
  ExpectSameBits(loaded.optimizer, second.optimizer);
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"latest", "step_00000100"}))
      << "no temporary or replaced directory is left behind";
}

TEST_F(CheckpointTest, MismatchedOrMissingTensorsAreClearErrors) {
  const Snapshot saved = RandomSnapshot(rng_);
  ASSERT_TRUE(
      SaveCheckpoint(root_, 5, saved.model, saved.optimizer, nlohmann::json::object()).ok());
  const std::string model_file = (fs::path(root_) / "step_00000005" / "model.safetensors").string();
  const std::string optimizer_file =
      (fs::path(root_) / "step_00000005" / "optimizer.safetensors").string();

  std::vector<NamedTensor> model = Like(saved.model);
  std::vector<NamedTensor> optimizer = Like(saved.optimizer);
  model[1].tensor = Tensor::Empty({4, 8}, DType::kF32, Device::CPU());
  StatusOr<nlohmann::json> state = LoadCheckpoint(root_, model, optimizer);
  EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state.status().message(), "tensor 'layers.0.attn.q_proj.weight' in '" + model_file +
                                          "' has shape [2, 8], expected [4, 8]");

  model = Like(saved.model);
  model.push_back(
      {"layers.1.attn.q_proj.weight", Tensor::Empty({2, 8}, DType::kF32, Device::CPU())});
  state = LoadCheckpoint(root_, model, optimizer);
  EXPECT_EQ(state.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(
      state.status().message(),
      "'" + model_file + "' has no tensor 'layers.1.attn.q_proj.weight' (expected f32[2, 8])");

  model = Like(saved.model);
  optimizer.pop_back();
  state = LoadCheckpoint(root_, model, optimizer);
  EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state.status().message(), "'" + optimizer_file +
                                          "' holds unexpected tensor 'adam.step' (i64[1]; 2 "
                                          "tensors in the file, 1 expected)");
}

TEST_F(CheckpointTest, BadRootsAndPathsAreClearErrors) {
  const Snapshot saved = RandomSnapshot(rng_);
  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "x";
  Status s = SaveCheckpoint(file.string(), 1, saved.model, saved.optimizer, {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "checkpoint root '" + file.string() + "' is not a directory");

  s = SaveCheckpoint((file / "sub").string(), 1, saved.model, saved.optimizer, {});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      s.message().rfind("cannot create checkpoint root '" + (file / "sub").string() + "': ", 0), 0u)
      << s.message();

  const std::string missing = (dir_ / "missing").string();
  EXPECT_EQ(LoadCheckpoint(missing, {}, {}).status().message(),
            "checkpoint '" + missing + "' does not exist");
  EXPECT_EQ(LoadCheckpoint(dir_.string(), {}, {}).status().message(),
            Quoted(dir_) +
                " is neither a checkpoint root (no step directory) nor a step directory (no "
                "'state.json')");

  ASSERT_TRUE(SaveCheckpoint(root_, 3, saved.model, saved.optimizer, {{"k", 1}}).ok());
  const fs::path step_dir = fs::path(root_) / "step_00000003";
  std::ofstream(step_dir / "state.json") << "{\"k\": ";
  StatusOr<nlohmann::json> state = LoadCheckpoint(root_, Like(saved.model), Like(saved.optimizer));
  EXPECT_EQ(state.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(
      state.status().message().rfind(Quoted(step_dir / "state.json") + " is not valid JSON: ", 0),
      0u)
      << state.status().message();

  // A name per line, or a path: not what Save writes, refused rather than half-followed.
  for (const char* latest : {"step_00000003\nstep_00000002\n", "", "../root/step_00000003\n"}) {
    std::ofstream(fs::path(root_) / "latest") << latest;
    EXPECT_EQ(LoadCheckpoint(root_, {}, {}).status().message(),
              "checkpoint root '" + root_ + "': 'latest' does not hold a directory name")
        << latest;
  }
  std::ofstream(fs::path(root_) / "latest") << "step_00000004\n";
  EXPECT_EQ(
      LoadCheckpoint(root_, {}, {}).status().message(),
      "checkpoint root '" + root_ + "': 'latest' names 'step_00000004', which is not a directory");
}

// ReadCheckpointState, the check made before any tensor is allocated, also finds a tensor file
// that is truncated; LoadCheckpoint refuses a NaN among the values.
TEST_F(CheckpointTest, DamagedTensorFilesAreFoundBeforeLoading) {
  const Snapshot saved = RandomSnapshot(rng_);
  ASSERT_TRUE(SaveCheckpoint(root_, 2, saved.model, saved.optimizer, {{"k", 1}}).ok());
  const fs::path optimizer_file = fs::path(root_) / "step_00000002" / "optimizer.safetensors";
  ASSERT_TRUE(ReadCheckpointState(root_).ok());
  const uintmax_t size = fs::file_size(optimizer_file);
  fs::resize_file(optimizer_file, size - 4);
  const Status truncated = ReadCheckpointState(root_).status();
  EXPECT_EQ(truncated.code(), StatusCode::kDataLoss);
  EXPECT_EQ(truncated.message().rfind(Quoted(optimizer_file) + ": tensor '", 0), 0u)
      << truncated.message();
  EXPECT_NE(truncated.message().find("; file truncated?)"), std::string::npos)
      << truncated.message();

  Snapshot poisoned = RandomSnapshot(rng_);
  const std::vector<float> nans(32, std::numeric_limits<float>::quiet_NaN());
  ops::CopyFromHost(nans.data(), poisoned.model[2].tensor);  // the router's f32 [4, 8]
  ASSERT_TRUE(SaveCheckpoint(root_, 3, poisoned.model, poisoned.optimizer, {{"k", 1}}).ok());
  const Status loaded = LoadCheckpoint(root_, Like(saved.model), Like(saved.optimizer)).status();
  EXPECT_EQ(loaded.code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.message().find("holds a non-finite value (NaN or infinity) at element 0"),
            std::string::npos)
      << loaded.message();
}

}  // namespace
}  // namespace moe
