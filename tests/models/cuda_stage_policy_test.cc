// The CUDA backend's first-contact decisions, checked on the CPU (models/cuda/stage_policy.h):
// where the GELU is fused by default, which attention path runs, the alignments cuBLASLt is told
// and the key its algorithms are cached under, the launch-check switch, launch-site names and the
// device memory check.
#include <cstdlib>
#include <map>

#include "gtest/gtest.h"
#include "models/cuda/stage_policy.h"

namespace freeride::cuda {
namespace {

TEST(GeluFusion, AutoFusesInBf16Only) {
  EXPECT_TRUE(FuseGelu(GeluFusionMode::kAuto, /*bf16=*/true));
  EXPECT_FALSE(FuseGelu(GeluFusionMode::kAuto, /*bf16=*/false));
  for (bool bf16 : {false, true}) {
    EXPECT_TRUE(FuseGelu(GeluFusionMode::kOn, bf16));
    EXPECT_FALSE(FuseGelu(GeluFusionMode::kOff, bf16));
  }
}

TEST(GeluFusion, ParsesTheConfigValues) {
  EXPECT_EQ(*ParseGeluFusionMode("auto"), GeluFusionMode::kAuto);
  EXPECT_EQ(*ParseGeluFusionMode("on"), GeluFusionMode::kOn);
  EXPECT_EQ(*ParseGeluFusionMode("off"), GeluFusionMode::kOff);
  absl::StatusOr<GeluFusionMode> bad = ParseGeluFusionMode("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"yes\""), std::string::npos) << bad.status();
}

TEST(AttentionPath, FlashInBf16WhereTheKernelsTakeTheShape) {
  EXPECT_TRUE(UseFlashAttention(AttentionMode::kAuto, /*bf16=*/true, 8, 12, 64, 1024));
  EXPECT_TRUE(UseFlashAttention(AttentionMode::kAuto, true, 4, 4, 16, 33));  // any T
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kAuto, /*bf16=*/false, 8, 12, 64, 1024));
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kReference, true, 8, 12, 64, 1024));
  EXPECT_TRUE(UseFlashAttention(AttentionMode::kAuto, true, 12, 16, 128, 1024));  // 1B config
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kReference, true, 12, 16, 128, 1024));
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kAuto, true, 8, 8, 256, 1024));  // head size
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kAuto, true, 8, 16, 96, 1024));
  EXPECT_FALSE(UseFlashAttention(AttentionMode::kAuto, true, 8, 3, 24, 1024));
}

TEST(AttentionPath, ParsesTheConfigValues) {
  EXPECT_EQ(*ParseAttentionMode("auto"), AttentionMode::kAuto);
  EXPECT_EQ(*ParseAttentionMode("reference"), AttentionMode::kReference);
  absl::StatusOr<AttentionMode> bad = ParseAttentionMode("flash");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"flash\""), std::string::npos) << bad.status();
}

TEST(AttentionPath, FlashNeedsTheDevicesSharedMemory) {
  // The H100's 227 KiB and the A100's 163 KiB take every head size; 99 KiB (sm_86/sm_89) not
  // hs 128's dK/dV kernel (152.5 KiB).
  for (int64_t hs : {16, 32, 64, 128}) {
    EXPECT_TRUE(CheckFlashSharedMemory(hs, 227 * 1024, 0).ok()) << hs;
    EXPECT_TRUE(CheckFlashSharedMemory(hs, 163 * 1024, 0).ok()) << hs;
  }
  absl::Status small = CheckFlashSharedMemory(128, 99 * 1024, 1);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(small.message().find("cuda:1 offers 99 KiB"), std::string::npos) << small;
  EXPECT_NE(small.message().find("need 153 KiB"), std::string::npos) << small;
  EXPECT_NE(small.message().find("runtime.attention = \"reference\""), std::string::npos);
}

TEST(KernelPath, ParsesTheConfigValues) {
  EXPECT_EQ(*ParseKernelMode("auto"), KernelMode::kAuto);
  EXPECT_EQ(*ParseKernelMode("reference"), KernelMode::kReference);
  absl::StatusOr<KernelMode> bad = ParseKernelMode("fused");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("kernels \"fused\""), std::string::npos) << bad.status();
}

TEST(PointerAlignment, IsTheLargestPowerOfTwoUpTo256) {
  alignas(512) static char block[1024];
  EXPECT_EQ(PointerAlignment(block), 256u);
  EXPECT_EQ(PointerAlignment(block + 256), 256u);
  EXPECT_EQ(PointerAlignment(block + 64), 64u);
  EXPECT_EQ(PointerAlignment(block + 192), 64u);
  EXPECT_EQ(PointerAlignment(block + 128), 128u);
  EXPECT_EQ(PointerAlignment(block + 4), 4u);
  EXPECT_EQ(PointerAlignment(block + 2), 2u);
  EXPECT_EQ(PointerAlignment(block + 1), 1u);
  EXPECT_EQ(PointerAlignment(nullptr), 256u);
}

TEST(LtKey, AlignmentTellsOtherwiseEqualProductsApart) {
  LtKey a{false, true, 64, 128, 32, 32, 32, 64, 0, 0, 0, 1, true, false, 256, 256, 256};
  LtKey b = a;
  EXPECT_EQ(a, b);
  b.align_b = 64;
  EXPECT_NE(a, b);
  std::map<LtKey, int> cache{{a, 1}};
  EXPECT_EQ(cache.count(b), 0u);
  cache.emplace(b, 2);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.at(a), 1);
}

class CheckLaunchesEnv : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv(kCheckLaunchesVariable); }
};

TEST_F(CheckLaunchesEnv, OffUnlessOne) {
  unsetenv(kCheckLaunchesVariable);
  EXPECT_FALSE(*CheckLaunchesFromEnvironment());
  setenv(kCheckLaunchesVariable, "", 1);
  EXPECT_FALSE(*CheckLaunchesFromEnvironment());
  setenv(kCheckLaunchesVariable, "0", 1);
  EXPECT_FALSE(*CheckLaunchesFromEnvironment());
  setenv(kCheckLaunchesVariable, "1", 1);
  EXPECT_TRUE(*CheckLaunchesFromEnvironment());
}

TEST_F(CheckLaunchesEnv, OtherValuesAreErrorsNamingTheVariable) {
  setenv(kCheckLaunchesVariable, "yes", 1);
  absl::StatusOr<bool> flag = CheckLaunchesFromEnvironment();
  ASSERT_FALSE(flag.ok());
  EXPECT_NE(flag.status().message().find("FREERIDE_CUDA_CHECK_LAUNCHES=\"yes\""), std::string::npos)
      << flag.status();
}

TEST(LaunchSite, NamesTheCallAndTheModelsLayer) {
  EXPECT_EQ(LaunchSite("LayerNormForward", 2, 4), "LayerNormForward in layer 6");
  EXPECT_EQ(LaunchSite("EncoderForward", kEmbedding, 0), "EncoderForward in the embedding");
  EXPECT_EQ(LaunchSite("MatmulForward<T>", kHead, 8), "MatmulForward<T> in the head");
  EXPECT_EQ(LaunchSite("AdamW", kWholeChunk, 8), "AdamW on the whole chunk");
}

TEST(DeviceMemory, KeepsTheHeadroomFree) {
  const int64_t planned = int64_t{1} << 30;
  EXPECT_TRUE(CheckDeviceMemory(planned, planned + kDeviceHeadroomBytes, 0, "plan").ok());
  absl::Status short_by_one =
      CheckDeviceMemory(planned, planned + kDeviceHeadroomBytes - 1, 3, "weights 1.00 GiB");
  EXPECT_EQ(short_by_one.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(short_by_one.message().find("cuda:3"), std::string::npos) << short_by_one;
  EXPECT_NE(short_by_one.message().find("weights 1.00 GiB"), std::string::npos) << short_by_one;
}

}  // namespace
}  // namespace freeride::cuda
