#include "core/device.h"

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

}  // namespace
}  // namespace freeride
