#include "core/child_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/sched_class.h"
#include "core/timer.h"

extern char** environ;

namespace freeride {
namespace {

// Supervisors of live children, for KillChildProcessGroups() in a signal handler: a fixed array
// of lock-free slots (0: free). A positive pid is a namespace's init, which SIGKILL to its group
// ends with its namespace; a negative one is a subreaper, asked by SIGTERM (and SIGCONT, should
// it be paused) so that it kills its descendants before it goes.
constexpr int kMaxGroups = 256;
std::atomic<pid_t> g_groups[kMaxGroups];
std::atomic<bool> g_groups_killed{false};
static_assert(std::atomic<pid_t>::is_always_lock_free, "signal handlers read these");

void RegisterGroup(pid_t slot_value) {
  for (auto& slot : g_groups) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, slot_value)) return;
  }
}

void UnregisterGroup(pid_t slot_value) {
  for (auto& slot : g_groups) {
    pid_t expected = slot_value;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

// Async-signal-safe: asks a supervisor to end its tree.
void EndTree(pid_t slot_value) {
  if (slot_value > 0) {
    kill(-slot_value, SIGKILL);
  } else if (slot_value < 0) {
    kill(-slot_value, SIGTERM);
    kill(-slot_value, SIGCONT);
  }
}

// Everything the supervisor and the program need, prepared before the fork: between it and
// exec only async-signal-safe calls are allowed (the rank has BLAS, OpenMP and MPI threads), so
// both processes are made by the raw clone system call (no atfork handlers) and use no malloc.
struct Prepared {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, env;
  const ChildOptions* options = nullptr;
  pid_t parent = -1;
  int status_write = -1;  // the supervisor's "ready" byte, then the program's wait status
  int go_read = -1;       // EOF: the supervisor may start the program
  int status_read = -1, go_write = -1;  // the rank's ends, closed in the supervisor
  int output_fd = -1;
  bool in_namespace = false;
};

Prepared Prepare(const ChildOptions& options) {
  Prepared p;
  p.options = &options;
  p.argv_storage = options.argv;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& add : options.env) replaced |= add.substr(0, add.find('=')) == name;
    if (!replaced) p.env_storage.push_back(entry);
  }
  for (const std::string& add : options.env) p.env_storage.push_back(add);
  for (std::string& a : p.argv_storage) p.argv.push_back(a.data());
  p.argv.push_back(nullptr);
  for (std::string& e : p.env_storage) p.env.push_back(e.data());
  p.env.push_back(nullptr);
  return p;
}

pid_t RawFork(unsigned long flags) {
  return static_cast<pid_t>(syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0));
}

// False when the reader is gone (EPIPE: a namespace's init ignores the SIGPIPE).
bool WriteAll(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void RunProgram(const Prepared& p) {
  const ChildOptions& options = *p.options;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // with the supervisor
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (p.output_fd >= 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd < 0 || dup2(null_fd, 0) < 0) _exit(125);
    if (dup2(p.output_fd, 1) < 0 || dup2(p.output_fd, 2) < 0) _exit(125);
  }
  if (options.pass_fd >= 0) {
    if (options.pass_fd != 3 && dup2(options.pass_fd, 3) < 0) _exit(125);
    fcntl(3, F_SETFD, 0);
  }
  const unsigned first_closed = options.pass_fd >= 0 ? 4 : 3;
  syscall(SYS_close_range, first_closed, ~0U, 0);
  if (options.data_limit_bytes > 0) {
    const rlimit limit{static_cast<rlim_t>(options.data_limit_bytes),
                       static_cast<rlim_t>(options.data_limit_bytes)};
    if (setrlimit(RLIMIT_DATA, &limit) != 0) _exit(125);
  }
  if (options.idle_class) LowerThisProcessAfterFork();
  if (!options.working_dir.empty() && chdir(options.working_dir.c_str()) != 0) _exit(126);
  execvpe(p.argv[0], const_cast<char* const*>(p.argv.data()),
          const_cast<char* const*>(p.env.data()));
  _exit(127);
}

// SIGKILL to each child listed in /proc/thread-self/children (the subreaper is single-threaded),
// parsed without allocating. False where the list cannot be read (no /proc, a kernel without
// CONFIG_PROC_CHILDREN).
bool KillListedChildren() {
  const int fd = open("/proc/thread-self/children", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[512];
  pid_t pid = 0;
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] >= '0' && buffer[i] <= '9') {
        pid = pid * 10 + (buffer[i] - '0');
      } else {
        if (pid > 0) kill(pid, SIGKILL);
        pid = 0;
      }
    }
  }
  if (pid > 0) kill(pid, SIGKILL);
  close(fd);
  return true;
}

// Kills every descendant and reaps them all, recording the program's status when it is among
// them. In a namespace, kill(-1) reaches exactly the namespace's other processes; a subreaper
// kills its children, whose own children then become its children, until none is left. A
// subreaper that cannot list its children kills the program, reaps what has ended and leaves
// the rest of the group to the rank's SIGKILL (ChildProcess::Kill).
void EndDescendants(const Prepared& p, pid_t program, int* program_status,
                    bool* program_ended) {
  for (;;) {
    if (p.in_namespace) {
      kill(-1, SIGKILL);
    } else if (!KillListedChildren()) {
      int status = 0;
      if (!*program_ended && kill(program, SIGKILL) == 0 &&
          waitpid(program, &status, 0) == program) {
        *program_status = status;
        *program_ended = true;
      }
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      return;
    }
    int status = 0;
    const pid_t reaped = waitpid(-1, &status, 0);
    if (reaped < 0 && errno == EINTR) continue;
    if (reaped < 0) return;  // ECHILD: no descendant left
    if (reaped == program) {
      *program_status = status;
      *program_ended = true;
    }
  }
}

void Ignore(int) {}

// Whether the rank is gone, for a subreaper. A namespace's init sees its parent as pid 0, and
// needs no such test: its parent-death signal is SIGKILL.
bool ParentGone(const Prepared& p) { return !p.in_namespace && getppid() != p.parent; }

// A teardown request: SIGTERM from the rank, or the parent-death signal of a subreaper
// (SIGCONT, which also comes with every resume).
bool IsTeardown(int signal_number, const Prepared& p) {
  return signal_number == SIGTERM || (signal_number == SIGCONT && ParentGone(p));
}

[[noreturn]] void Supervise(const Prepared& p) {
  close(p.status_read);
  close(p.go_write);
  setpgid(0, 0);
  // Taken by sigwaitinfo. The handlers matter in a namespace: its init receives only the
  // signals it handles. SIGHUP comes (with SIGCONT) when the rank dies while the group is
  // paused (the group is orphaned) and must not end the supervisor before its teardown.
  sigset_t watched;
  sigemptyset(&watched);
  for (int s : {SIGCHLD, SIGTERM, SIGCONT, SIGHUP}) {
    sigaddset(&watched, s);
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = Ignore;
    sigaction(s, &action, nullptr);
  }
  sigprocmask(SIG_SETMASK, &watched, nullptr);
  prctl(PR_SET_PDEATHSIG, p.in_namespace ? SIGKILL : SIGCONT);
  if (!p.in_namespace) prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The rank went before the parent-death signal was set: no reader, or a new parent.
  const char ready = 'r';
  if (!WriteAll(p.status_write, &ready, 1) || ParentGone(p)) _exit(125);
  for (char byte;;) {
    const ssize_t n = read(p.go_read, &byte, 1);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  close(p.go_read);
  sigset_t pending;
  sigpending(&pending);
  if (sigismember(&pending, SIGTERM) || ParentGone(p)) _exit(125);
  const pid_t program = RawFork(0);
  if (program < 0) _exit(125);
  if (program == 0) RunProgram(p);
  int program_status = 0;
  bool program_ended = false;
  while (!program_ended) {
    siginfo_t info;
    const int signal_number = sigwaitinfo(&watched, &info);
    if (signal_number == SIGCHLD) {
      int status = 0;
      pid_t reaped;
      while ((reaped = waitpid(-1, &status, WNOHANG)) > 0) {
        if (reaped == program) {
          program_status = status;
          program_ended = true;
        }
      }
    } else if (signal_number > 0 && IsTeardown(signal_number, p)) {
      break;
    }
  }
  EndDescendants(p, program, &program_status, &program_ended);
  if (program_ended) WriteAll(p.status_write, &program_status, sizeof(program_status));
  _exit(0);
}

}  // namespace

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    status_fd_ = other.status_fd_;
    containment_ = other.containment_;
    ended_ = other.ended_;
    status_ = other.status_;
    stopped_ = other.stopped_;
    other.pid_ = -1;
    other.status_fd_ = -1;
  }
  return *this;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no program to start");
  const std::string program = absl::StrJoin(options.argv, " ");
  Prepared prepared = Prepare(options);
  if (!options.output_path.empty()) {
    prepared.output_fd =
        open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (prepared.output_fd < 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot start `%s`: cannot open its output log '%s': %s", program,
          options.output_path, strerror(errno)));
    }
  }
  int status_pipe[2], go_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) status_pipe[0] = -1;
  if (status_pipe[0] < 0 || pipe2(go_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    if (status_pipe[0] >= 0) {
      close(status_pipe[0]);
      close(status_pipe[1]);
    }
    if (prepared.output_fd >= 0) close(prepared.output_fd);
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot start `%s`: pipe failed: %s", program, strerror(error)));
  }
  prepared.parent = getpid();
  prepared.status_write = status_pipe[1];
  prepared.go_read = go_pipe[0];
  prepared.status_read = status_pipe[0];
  prepared.go_write = go_pipe[1];
  Containment containment = options.containment;
  pid_t pid = -1;
  if (containment == Containment::kPidNamespace) {
    prepared.in_namespace = true;
    pid = RawFork(CLONE_NEWPID);
    // Not permitted (no CAP_SYS_ADMIN, a seccomp filter, the namespace limit): the subreaper.
    if (pid < 0) containment = Containment::kSubreaper;
  }
  if (containment == Containment::kSubreaper) {
    prepared.in_namespace = false;
    pid = RawFork(0);
  }
  if (pid == 0) Supervise(prepared);
  const int fork_error = errno;
  close(status_pipe[1]);
  close(go_pipe[0]);
  if (prepared.output_fd >= 0) close(prepared.output_fd);
  if (pid < 0) {
    close(status_pipe[0]);
    close(go_pipe[1]);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot start `%s`: fork failed: %s", program, strerror(fork_error)));
  }
  setpgid(pid, pid);  // also here: signals to the group must not race the child's own call
  RegisterGroup(containment == Containment::kPidNamespace ? pid : -pid);
  ChildProcess child;
  child.pid_ = pid;
  child.status_fd_ = status_pipe[0];
  child.containment_ = containment;
  // Once the supervisor is ready (its parent-death signal set), it may be paused; the program
  // starts only when the go pipe closes and the supervisor runs.
  char ready = 0;
  ssize_t got;
  while ((got = read(child.status_fd_, &ready, 1)) < 0 && errno == EINTR) {
  }
  if (options.start_stopped && got == 1) {
    kill(pid, SIGSTOP);
    int status = 0;
    if (waitpid(pid, &status, WUNTRACED) == pid && !WIFSTOPPED(status)) {
      child.Reap(status);
    } else {
      child.stopped_ = true;
    }
  }
  close(go_pipe[1]);
  fcntl(child.status_fd_, F_SETFL, O_NONBLOCK);
  return child;
}

pid_t ChildProcess::ProgramPid() const {
  if (pid_ <= 0) return pid_;
  // The supervisor's first child is the program; /proc is this process's view, so the pid is too.
  std::ifstream children(absl::StrFormat("/proc/%d/task/%d/children", pid_, pid_));
  pid_t program = -1;
  if (children >> program && program > 0) return program;
  return pid_;
}

void ChildProcess::Reap(int status) {
  ended_ = true;
  status_ = status;
  // The program's own status, which the supervisor wrote before it exited; without it (the
  // supervisor was killed) the supervisor's.
  int program_status = 0;
  if (status_fd_ >= 0 &&
      read(status_fd_, &program_status, sizeof(program_status)) == sizeof(program_status)) {
    status_ = program_status;
  }
}

bool ChildProcess::Stop() {
  if (!running()) return false;
  if (stopped_) return true;
  kill(-pid_, SIGSTOP);
  // Waits for the stop to land, so the paused task no longer competes for the cores.
  const double give_up = MonotonicSeconds() + 1.0;
  while (MonotonicSeconds() < give_up) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (r == pid_) {
      if (WIFSTOPPED(status)) break;
      Reap(status);
      return false;
    }
    if (r < 0) break;
    std::this_thread::yield();
  }
  stopped_ = true;
  return true;
}

void ChildProcess::Continue() {
  if (!running()) return;
  kill(-pid_, SIGCONT);
  stopped_ = false;
}

bool ChildProcess::Ended() {
  if (pid_ <= 0) return true;
  if (ended_) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) {
    Reap(status);
  }
  return ended_;
}

std::string ChildProcess::EndDescription() const {
  std::string text = DescribeWaitStatus(status_);
  if (WIFSIGNALED(status_) && WTERMSIG(status_) == SIGKILL && g_groups_killed.load()) {
    text += " when the rank was asked to stop";
  }
  return text;
}

bool ChildProcess::EndedCleanly() const {
  return ended_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  const pid_t slot_value = containment_ == Containment::kPidNamespace ? pid_ : -pid_;
  if (!ended_) {
    EndTree(slot_value);
    int status = 0;
    if (waitpid(pid_, &status, 0) == pid_) Reap(status);
  }
  // A backstop for what the supervisor could not reach (a subreaper without /proc).
  kill(-pid_, SIGKILL);
  UnregisterGroup(slot_value);
  if (status_fd_ >= 0) close(status_fd_);
  status_fd_ = -1;
  pid_ = -1;
}

void KillChildProcessGroups() {
  g_groups_killed.store(true);
  for (auto& slot : g_groups) EndTree(slot.load());
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return absl::StrFormat("exited with status %d%s", code,
                           code == 127 ? " (program not found)"
                           : code == 126 ? " (cannot enter its working directory)" : "");
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return absl::StrFormat("was killed by signal %d (SIG%s: %s)", sig,
                           abbrev != nullptr ? abbrev : "?", strsignal(sig));
  }
  return "is still running";
}

}  // namespace freeride
