// Tensor handles: allocation, views, flags, dtypes; Status; bf16 conversion.
#include "engine/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/core/status.h"
#include "engine/runtime/device_context.h"

namespace moe {
namespace {

TEST(TensorTest, EmptyAllocatesFromTheDeviceArena) {
  CachingAllocator& allocator = DeviceContext::Get(Device::CPU()).allocator();
  const int64_t before = allocator.stats().allocated_bytes;
  {
    Tensor t = Tensor::Empty({4, 1024}, DType::kF32, Device::CPU());
    EXPECT_EQ(t.nbytes(), 4u * 1024 * 4);
    EXPECT_EQ(t.space(), MemorySpace::kDevice);
    EXPECT_EQ(allocator.stats().allocated_bytes - before, 16384);
  }
  EXPECT_EQ(allocator.stats().allocated_bytes, before);
}

TEST(TensorTest, PinnedTensorsComeFromThePool) {
  Tensor t = Tensor::Empty({100}, DType::kBF16, Device::CPU(), MemorySpace::kPinnedHost);
  EXPECT_EQ(t.space(), MemorySpace::kPinnedHost);
  EXPECT_EQ(t.nbytes(), 200u);
}

TEST(TensorTest, RowsAndViewShareStorage) {
  Tensor t = Tensor::Empty({6, 4}, DType::kI32, Device::CPU());
  for (int i = 0; i < 24; ++i) t.data<int32_t>()[i] = i;
  Tensor rows = t.Rows(2, 5);
  EXPECT_EQ(rows.shape(), (Shape{3, 4}));
  EXPECT_EQ(rows.data<int32_t>()[0], 8);
  EXPECT_TRUE(rows.SharesStorageWith(t));
  Tensor flat = rows.View({12});
  EXPECT_EQ(flat.data<int32_t>()[11], 19);
  EXPECT_EQ(t.dim(-1), 4);
}

TEST(TensorTest, FlagsTravelWithViews) {
  Tensor t = Tensor::Empty({4, 4}, DType::kF32, Device::CPU());
  EXPECT_FALSE(t.is_parameter());
  t.set_is_parameter(true);
  t.set_do_not_offload(true);
  EXPECT_TRUE(t.Rows(1, 2).is_parameter());
  EXPECT_TRUE(t.View({16}).do_not_offload());
}

TEST(TensorTest, DTypeSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kE4M3), 1u);
  EXPECT_STREQ(DTypeName(DType::kE4M3), "e4m3");
  EXPECT_FALSE(IsFloating(DType::kE4M3));  // storage for quantised operands, not arithmetic
}

TEST(TensorDeathTest, WrongTypedAccessDies) {
  Tensor t = Tensor::Empty({2}, DType::kBF16, Device::CPU());
  EXPECT_DEATH(t.data<float>(), "accessed as f32");
}

TEST(TensorDeathTest, RowsOutOfRangeDies) {
  Tensor t = Tensor::Empty({2, 2}, DType::kF32, Device::CPU());
  EXPECT_DEATH(t.Rows(1, 3), "rows");
}

TEST(BFloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-2.5f)), -2.5f);
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status ok = Status::Ok();
  EXPECT_TRUE(ok.ok());
  Status bad = InvalidArgument("--hidden_size must be positive");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--hidden_size must be positive");
  StatusOr<int> value = 3;
  EXPECT_EQ(*value, 3);
  StatusOr<int> error = NotFound("data.bin");
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), StatusCode::kNotFound);
}

StatusOr<int> Doubled(StatusOr<int> input) {
  MOE_ASSIGN_OR_RETURN(int v, std::move(input));
  return 2 * v;
}

TEST(StatusTest, MacrosPropagateErrors) {
  EXPECT_EQ(*Doubled(21), 42);
  EXPECT_EQ(Doubled(DataLoss("truncated")).status().message(), "truncated");
}

}  // namespace
}  // namespace moe
