// Child processes a rank owns (side-task workers, `command` programs). Each program runs under a
// small supervisor that the rank forks and that ends the program's whole process tree with it,
// however the tree escapes (new process groups or sessions, double forks):
// - where the rank may create PID namespaces (root, CAP_SYS_ADMIN), the supervisor is PID 1 of
//   its own namespace: the kernel kills every process in it when the supervisor ends, and the
//   supervisor ends with the thread that started it (PR_SET_PDEATHSIG SIGKILL) however the rank
//   dies, SIGKILL included;
// - elsewhere it is a subreaper (PR_SET_CHILD_SUBREAPER: orphaned descendants become its
//   children) whose parent-death signal is SIGCONT (it wakes even when paused) and that then
//   kills every descendant before it exits.
// The supervisor and the program share one process group, paused and resumed as a group
// (SIGSTOP/SIGCONT); the tree is killed on every exit path the rank itself survives (Kill, or the
// destructor) and on a stop signal (KillChildProcessGroups). The program may carry a cap on its
// data segment (RLIMIT_DATA: heap and private mappings) and may write its output to a file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace freeride {

// How a child's process tree is bound to the rank (see the file comment).
enum class Containment { kPidNamespace, kSubreaper };

struct ChildOptions {
  std::vector<std::string> argv;     // argv[0] is looked up on PATH
  std::string working_dir;           // empty: the parent's
  std::vector<std::string> env;      // "NAME=value" added to (or replacing in) the environment
  int64_t data_limit_bytes = 0;      // RLIMIT_DATA of the program; 0: none
  bool start_stopped = false;        // nothing runs until the first Continue
  // The program runs in SCHED_IDLE (else nice 19; core/sched_class.h), its threads and children
  // with it: side work that gets a core only when no normal thread wants one.
  bool idle_class = false;
  int pass_fd = -1;                  // becomes fd 3 of the child; every other fd above 2 closes
  // Non-empty: the program's stdout and stderr append to this file and its stdin is /dev/null,
  // so nothing it leaves behind holds the rank's descriptors (mpirun waits for those to close).
  std::string output_path;
  // kPidNamespace: a namespace where the kernel permits one, else the subreaper; kSubreaper:
  // the subreaper always (how tests reach the fallback where namespaces are permitted).
  Containment containment = Containment::kPidNamespace;
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

  // The supervisor's pid, which leads the process group.
  pid_t pid() const { return pid_; }
  // The program's pid as this process sees it (for /proc); pid() before it has started.
  pid_t ProgramPid() const;
  Containment containment() const { return containment_; }
  bool running() const { return pid_ > 0 && !ended_; }
  // Pauses the whole group; returns once the supervisor has stopped (or ended: then false).
  bool Stop();
  void Continue();
  // True once the program has ended and the supervisor with it (reaped without blocking).
  bool Ended();
  // How the program ended: "exited with status 3",
  // "was killed by signal 11 (SIGSEGV: Segmentation fault)".
  std::string EndDescription() const;
  bool EndedCleanly() const;  // exit status 0
  // Ends the whole tree (a paused one too) and reaps the supervisor. Idempotent.
  void Kill();

 private:
  void Reap(int status);

  pid_t pid_ = -1;
  int status_fd_ = -1;  // the supervisor writes the program's wait status here
  Containment containment_ = Containment::kPidNamespace;
  bool ended_ = false;
  bool stopped_ = false;
  int status_ = 0;
};

// Ends every live child's tree; async-signal-safe. The stop handlers call it: mpirun follows its
// SIGTERM with SIGKILL a second later.
void KillChildProcessGroups();

// A waitpid status in words, as EndDescription() gives it.
std::string DescribeWaitStatus(int status);

}  // namespace freeride
