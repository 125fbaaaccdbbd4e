// A hung test fails fast and says where it hung. Given a number of seconds (ctest passes
// --freeride_watchdog_s a little under each entry's TIMEOUT; FREERIDE_TEST_WATCHDOG_S by hand),
// a thread waits that long; if the process is still
// running then, it prints the running test's name and every thread's stack (gdb, where
// installed), kills the processes the test started (abort runs no destructors, and a child left
// holding ctest's output pipe would hang ctest itself), and aborts: the log shows what the test
// waited on instead of ctest's bare "Timeout".
#pragma once

namespace freeride::testing {

// Starts the watchdog when argv holds --freeride_watchdog_s=S or the environment
// FREERIDE_TEST_WATCHDOG_S=S (S seconds > 0); call after InitGoogleTest.
void StartWatchdog(int argc, char** argv);

}  // namespace freeride::testing
