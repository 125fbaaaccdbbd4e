// main() of the CPU test suites: gtest's, with the hang watchdog (watchdog.h).
#include "gtest/gtest.h"
#include "tests/support/watchdog.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  freeride::testing::StartWatchdog(argc, argv);
  return RUN_ALL_TESTS();
}
