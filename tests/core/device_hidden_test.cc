// Runs with CUDA_VISIBLE_DEVICES set empty (see tests/CMakeLists.txt): discovery must degrade
// to "no CUDA devices" with a reason, exactly as on a machine without a driver.
#include <cstdlib>

#include "core/device.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

TEST(DeviceHiddenTest, NoCudaDevicesAndAReason) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  ASSERT_NE(visible, nullptr);
  ASSERT_STREQ(visible, "");
  DeviceInventory inventory = DiscoverDevices();
  EXPECT_TRUE(inventory.cuda.empty());
  EXPECT_FALSE(inventory.cuda_unavailable.empty());
#ifdef FREERIDE_WITH_CUDA
  EXPECT_TRUE(inventory.cuda_built);
  // Either no device visible (driver present) or the driver's absence, in words; the runtime's
  // own error is kept for `devices --verbose`.
  EXPECT_NE(inventory.cuda_unavailable.find(": CPU only"), std::string::npos)
      << inventory.cuda_unavailable;
  EXPECT_NE(inventory.cuda_detail.find("CUDA error"), std::string::npos) << inventory.cuda_detail;
#endif
  EXPECT_FALSE(inventory.cpu.name.empty());
}

}  // namespace
}  // namespace freeride
