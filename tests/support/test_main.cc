// main() of the CPU test suites: gtest's, with the hang watchdog (watchdog.h).
#include <cstdlib>

#include "core/logging.h"
#include "gtest/gtest.h"
#include "tests/support/watchdog.h"

int main(int argc, char** argv) {
  // The suites read log lines, their own and those of the processes they start: a
  // FREERIDE_LOG_LEVEL in the caller's environment (`error` in a quiet shell) would hide them.
  // Every suite starts from the default level, and so does every process it starts.
  unsetenv("FREERIDE_LOG_LEVEL");
  freeride::SetLogLevel(freeride::LogLevel::kInfo);
  testing::InitGoogleTest(&argc, argv);
  freeride::testing::StartWatchdog(argc, argv);
  return RUN_ALL_TESTS();
}
