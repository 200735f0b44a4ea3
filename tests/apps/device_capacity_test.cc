// UsableBytes and CapacityText: a GPU keeps kCudaHeadroomFraction for the context, libraries and
// the allocator's cache; the CPU backend's device (host memory) is usable whole. The figures are
// an H200's memory (143155 MiB, cudaMemGetInfo's total) and two run estimates either side of what
// runs can use on it.
#include "apps/common/device_capacity.h"

#include <gtest/gtest.h>

#include "engine/core/byte_units.h"

namespace moe {
namespace {

constexpr size_t kH200Bytes = size_t{143155} * kMiB;

TEST(DeviceCapacityTest, AGpuKeepsItsHeadroom) {
  const Device gpu = Device::CUDA(0);
  EXPECT_DOUBLE_EQ(UsableBytes(gpu, kH200Bytes), 0.98 * static_cast<double>(kH200Bytes));
  EXPECT_LE(138303.0 * kMiB, UsableBytes(gpu, kH200Bytes));
  EXPECT_GT(141746.0 * kMiB, UsableBytes(gpu, kH200Bytes));
}

TEST(DeviceCapacityTest, TheHostIsUsableWhole) {
  EXPECT_DOUBLE_EQ(UsableBytes(Device::CPU(), 24 * kGiB), 24.0 * kGiB);
}

TEST(DeviceCapacityTest, TheTextSaysWhatARunCanUse) {
  EXPECT_EQ(CapacityText(Device::CUDA(0), kH200Bytes),
            "cuda:0 has 139.8 GiB, of which runs can use 137.0 GiB (the rest: CUDA context, "
            "libraries, the allocator's cache)");
  EXPECT_EQ(CapacityText(Device::CPU(), 24 * kGiB), "cpu (physical memory) has 24.0 GiB");
}

TEST(DeviceCapacityTest, BytesPicksTheUnit) {
  EXPECT_EQ(Bytes(512), "512.0 B");
  EXPECT_EQ(Bytes(1.5 * kGiB), "1.5 GiB");
  EXPECT_EQ(Bytes(3.0 * kMiB), "3.0 MiB");
}

}  // namespace
}  // namespace moe
