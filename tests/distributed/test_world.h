// The World of a test binary run under mpirun: made before the first test and destroyed after
// the last, which finalises MPI. Each binary registers it once, at namespace scope:
//   const auto* const kWorld = ::testing::AddGlobalTestEnvironment(new moe::testing::TestWorld);
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "engine/distributed/world.h"

namespace moe::testing {

class TestWorld : public ::testing::Environment {
 public:
  void SetUp() override {
    StatusOr<std::unique_ptr<World>> world = World::Init();
    ASSERT_TRUE(world.ok()) << world.status().message();
    world_ = std::move(world).value();
    instance_ = world_.get();
  }
  void TearDown() override {
    instance_ = nullptr;
    world_.reset();
  }

  static World& Get() {
    CHECK(instance_ != nullptr) << "register TestWorld with AddGlobalTestEnvironment";
    return *instance_;
  }

 private:
  std::unique_ptr<World> world_;
  static inline World* instance_ = nullptr;
};

}  // namespace moe::testing
