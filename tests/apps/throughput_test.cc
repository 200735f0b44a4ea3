// MfuPerDevice: the run's training FLOP/s shared over its devices, against one device's peak.
// Figures are hand-computed; a layout of more devices at the same total throughput has a
// proportionally smaller per-device MFU.
#include "apps/moe_train/throughput.h"

#include <gtest/gtest.h>

namespace moe {
namespace {

constexpr double kH100Peak = 989e12;  // bf16 dense FLOP/s, moe_train's --peak_flops default

TEST(ThroughputTest, OneDevice) {
  // 50,000 tokens/s x 6e9 FLOP/token = 3e14 FLOP/s on one device.
  EXPECT_DOUBLE_EQ(MfuPerDevice(50000, 6e9, 1, kH100Peak), 3e14 / 989e12);
  EXPECT_NEAR(MfuPerDevice(50000, 6e9, 1, kH100Peak), 0.303337, 1e-6);
  // A device at exactly its peak.
  EXPECT_DOUBLE_EQ(MfuPerDevice(1e3, 1e9, 1, 1e12), 1.0);
}

TEST(ThroughputTest, PipelineTwoByDataTwoIsAQuarterOfOneDevice) {
  const double one = MfuPerDevice(50000, 6e9, 1, kH100Peak);
  const double four = MfuPerDevice(50000, 6e9, 2 * 2, kH100Peak);
  EXPECT_DOUBLE_EQ(four, 3e14 / (4 * 989e12));
  EXPECT_NEAR(four, 0.0758342, 1e-7);
  EXPECT_DOUBLE_EQ(four, one / 4);
}

TEST(ThroughputTest, EightDevices) {
  // 400,000 tokens/s x 2.5e9 FLOP/token = 1e15 FLOP/s over 8 devices: 1e15 / 7.912e15.
  EXPECT_NEAR(MfuPerDevice(400000, 2.5e9, 8, kH100Peak), 0.126390, 1e-6);
  // Against a 1e14 peak per device: 1e15 / 8e14.
  EXPECT_DOUBLE_EQ(MfuPerDevice(400000, 2.5e9, 8, 1e14), 1.25);
  // Eight devices doing eight times one device's work have its MFU.
  EXPECT_DOUBLE_EQ(MfuPerDevice(8 * 50000, 6e9, 8, kH100Peak),
                   MfuPerDevice(50000, 6e9, 1, kH100Peak));
}

TEST(ThroughputDeathTest, NoDevicesOrNoPeakIsAProgrammerError) {
  EXPECT_DEATH(MfuPerDevice(1, 1, 0, 1), "devices");
  EXPECT_DEATH(MfuPerDevice(1, 1, 1, 0), "peak_flops_per_device");
}

}  // namespace
}  // namespace moe
