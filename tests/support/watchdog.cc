#include "tests/support/watchdog.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace freeride::testing {
namespace {

// Every thread's stack, by gdb attached to this process from a child (allowed to: Yama's
// ptrace_scope 1 lets only ancestors attach otherwise).
void PrintStacks() {
  const std::string pid = std::to_string(getpid());
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY);
  const pid_t child = fork();
  if (child == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execlp("gdb", "gdb", "-batch", "-nx", "-p", pid.c_str(), "-ex", "thread apply all bt 30",
           static_cast<char*>(nullptr));
    std::fprintf(stderr, "watchdog: no gdb to print the stacks with\n");
    _exit(127);
  }
  if (child > 0) waitpid(child, nullptr, 0);
}

}  // namespace

void StartWatchdog(int argc, char** argv) {
  const std::string flag = "--freeride_watchdog_s=";
  const char* text = std::getenv("FREERIDE_TEST_WATCHDOG_S");
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(flag, 0) == 0) text = argv[i] + flag.size();
  }
  if (text == nullptr) return;
  const double seconds = std::atof(text);
  if (seconds <= 0) return;
  std::thread([seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr,
                 "\nwatchdog: %s.%s still running after %.0f s: hung (its ctest entry has a TIMEOUT "
                 "a little over that). Every thread's stack:\n",
                 test != nullptr ? test->test_suite_name() : "(no test)",
                 test != nullptr ? test->name() : "(between tests)", seconds);
    std::fflush(stderr);
    PrintStacks();
    std::abort();
  }).detach();
}

}  // namespace freeride::testing
