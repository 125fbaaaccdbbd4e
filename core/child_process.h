// Child processes a rank owns (side-task workers, `command` programs). Each starts in its own
// process group, dies with the thread that started it (PR_SET_PDEATHSIG, so a rank killed by
// mpirun or a crash takes it along), may carry a cap on its data segment (RLIMIT_DATA: heap and
// private mappings), is paused and resumed as a group (SIGSTOP/SIGCONT) and killed as a group on
// every exit path the rank itself survives (Kill, or the destructor) and on a stop signal
// (KillChildProcessGroups).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

struct ChildOptions {
  std::vector<std::string> argv;     // argv[0] is looked up on PATH
  std::string working_dir;           // empty: the parent's
  std::vector<std::string> env;      // "NAME=value" added to (or replacing in) the environment
  int64_t data_limit_bytes = 0;      // RLIMIT_DATA of the program; 0: none
  bool start_stopped = false;        // stopped just before exec; the first Continue runs it
  int pass_fd = -1;                  // becomes fd 3 of the child; every other fd above 2 closes
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Kill(); }
  ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Errors name the program; a program that cannot be executed shows as exit status 127 later.
  static absl::StatusOr<ChildProcess> Start(const ChildOptions& options);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !ended_; }
  // Pauses the whole group; returns once the leader has stopped (or ended: then false).
  bool Stop();
  void Continue();
  // True once the leader has ended (reaped without blocking).
  bool Ended();
  // How it ended: "exited with status 3", "was killed by signal 11 (SIGSEGV: Segmentation fault)".
  std::string EndDescription() const;
  bool EndedCleanly() const;  // exit status 0
  // SIGKILL to the whole group (a paused one too) and reaps the leader. Idempotent.
  void Kill();

 private:
  void Reap(int status);

  pid_t pid_ = -1;
  bool ended_ = false;
  bool stopped_ = false;
  int status_ = 0;
};

// SIGKILL to every live child's process group; async-signal-safe. The stop handlers call it:
// mpirun follows its SIGTERM with SIGKILL a second later, and a program's own children (outside
// PR_SET_PDEATHSIG's reach) must not outlive the rank.
void KillChildProcessGroups();

// A waitpid status in words, as EndDescription() gives it.
std::string DescribeWaitStatus(int status);

}  // namespace freeride
