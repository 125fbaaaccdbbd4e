// main() for GPU suites: runs the tests when a CUDA device is visible; otherwise prints why
// not and exits 77, which ctest reports as skipped.
#include <iostream>

#include "core/device.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  freeride::DeviceInventory inventory = freeride::DiscoverDevices();
  if (inventory.cuda.empty()) {
    std::cout << "SKIPPED: no CUDA device visible (" << inventory.cuda_unavailable << ")\n";
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
