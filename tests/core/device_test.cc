#include "core/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

TEST(DeviceTest, CpuIsAlwaysDiscovered) {
  DeviceInventory inventory = DiscoverDevices();
  EXPECT_EQ(inventory.cpu.kind, DeviceKind::kCpu);
  EXPECT_FALSE(inventory.cpu.name.empty());
  EXPECT_GE(inventory.cpu.parallel_units, 1);
  EXPECT_GT(inventory.cpu.total_memory_bytes, 0u);
  EXPECT_NE(DescribeDevice(inventory.cpu).find("threads"), std::string::npos);
}

TEST(DeviceTest, CudaListAndReasonAgree) {
  DeviceInventory inventory = DiscoverDevices();
  // Either devices are listed, or the inventory says why none are: never both, never neither.
  EXPECT_NE(inventory.cuda.empty(), inventory.cuda_unavailable.empty())
      << inventory.cuda_unavailable;
#ifndef FREERIDE_WITH_CUDA
  EXPECT_FALSE(inventory.cuda_built);
  EXPECT_TRUE(inventory.cuda.empty());
#endif
}

// A machine without a GPU is told so in a person's words, not with the runtime's error name
// (`freeride devices` printed a bare cudaErrorInsufficientDriver there).
TEST(DeviceTest, WhyNoCudaIsSaidPlainly) {
  EXPECT_EQ(CudaUnavailableReason("cudaErrorInsufficientDriver"), "no NVIDIA driver: CPU only");
  EXPECT_EQ(CudaUnavailableReason("cudaErrorStubLibrary"), "no NVIDIA driver: CPU only");
  EXPECT_THAT(CudaUnavailableReason("cudaErrorNoDevice"),
              testing::StartsWith("no CUDA device visible"));
  EXPECT_EQ(CudaUnavailableReason("cudaErrorDevicesUnavailable"),
            "CUDA unavailable (cudaErrorDevicesUnavailable): CPU only");
}

}  // namespace
}  // namespace freeride
