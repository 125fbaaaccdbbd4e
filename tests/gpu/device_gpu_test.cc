#include "core/cuda_check.h"
#include "core/device.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

TEST(DeviceGpuTest, ReportsRealDeviceProperties) {
  DeviceInventory inventory = DiscoverDevices();
  ASSERT_FALSE(inventory.cuda.empty());
  for (const DeviceInfo& device : inventory.cuda) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.total_memory_bytes, uint64_t{1} << 30);
    EXPECT_LE(device.free_memory_bytes, device.total_memory_bytes);
    EXPECT_GE(device.compute_capability_major, 8);  // the project builds for sm_80 and sm_90
    EXPECT_GT(device.parallel_units, 0);
    EXPECT_NE(DescribeDevice(device).find("cuda:"), std::string::npos);
  }
}

absl::Status AllocateTooMuch() {
  void* pointer = nullptr;
  CUDA_CHECK(cudaMalloc(&pointer, size_t{1} << 50));  // 1 PiB: no device has it
  return absl::OkStatus();
}

TEST(DeviceGpuTest, RealAllocationFailureBecomesResourceExhausted) {
  absl::Status status = AllocateTooMuch();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  cudaGetLastError();  // clear the sticky-free error so later tests start clean
}

}  // namespace
}  // namespace freeride
