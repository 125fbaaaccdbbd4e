#include "tests/support/watchdog.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/child_process.h"
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

// Every child of this process, and the process groups that ChildProcess gave its own.
void KillChildren() {
  freeride::KillChildProcessGroups();
  const std::string self = std::to_string(getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // "pid (comm) state ppid ...": the parent's pid is the second field after the name.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state, ppid;
    if (rest >> state >> ppid && ppid == self) kill(std::stoi(pid), SIGKILL);
  }
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
    std::fprintf(
        stderr,
        "\nwatchdog: %s.%s still running after %.1f s: hung (its ctest entry has a TIMEOUT "
        "a little over that). Every thread's stack:\n",
        test != nullptr ? test->test_suite_name() : "(no test)",
        test != nullptr ? test->name() : "(between tests)", seconds);
    std::fflush(stderr);
    PrintStacks();
    KillChildren();
    std::abort();
  }).detach();
}

}  // namespace freeride::testing
