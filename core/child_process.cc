#include "core/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/timer.h"

extern char** environ;

namespace freeride {
namespace {

// Process groups of live children, for KillChildProcessGroups() in a signal handler: a fixed
// array of lock-free slots (0: free).
constexpr int kMaxGroups = 256;
std::atomic<pid_t> g_groups[kMaxGroups];
std::atomic<bool> g_groups_killed{false};
static_assert(std::atomic<pid_t>::is_always_lock_free, "signal handlers read these");

void RegisterGroup(pid_t pgid) {
  for (auto& slot : g_groups) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pgid)) return;
  }
}

void UnregisterGroup(pid_t pgid) {
  for (auto& slot : g_groups) {
    pid_t expected = pgid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

// Everything the child needs, prepared before fork: between fork and exec only
// async-signal-safe calls are allowed (the rank has BLAS, OpenMP and MPI threads).
struct Prepared {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, env;
};

Prepared Prepare(const ChildOptions& options) {
  Prepared p;
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

[[noreturn]] void RunChild(const ChildOptions& options, Prepared& p, pid_t parent) {
  setpgid(0, 0);
  // Dies with the starting thread; if the parent is already gone, go too.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(125);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
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
  if (!options.working_dir.empty() && chdir(options.working_dir.c_str()) != 0) _exit(126);
  if (options.start_stopped) raise(SIGSTOP);
  execvpe(p.argv[0], p.argv.data(), p.env.data());
  _exit(127);
}

}  // namespace

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    ended_ = other.ended_;
    status_ = other.status_;
    stopped_ = other.stopped_;
    other.pid_ = -1;
  }
  return *this;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no program to start");
  Prepared prepared = Prepare(options);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot start `%s`: fork failed: %s", absl::StrJoin(options.argv, " "), strerror(errno)));
  }
  if (pid == 0) RunChild(options, prepared, parent);
  setpgid(pid, pid);  // also here: signals to the group must not race the child's own call
  RegisterGroup(pid);
  ChildProcess child;
  child.pid_ = pid;
  if (options.start_stopped) {
    int status = 0;
    if (waitpid(pid, &status, WUNTRACED) == pid && !WIFSTOPPED(status)) {
      child.Reap(status);
    } else {
      child.stopped_ = true;
    }
  }
  return child;
}

void ChildProcess::Reap(int status) {
  ended_ = true;
  status_ = status;
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
  // The group too: a paused program's own children, and children of one that already ended.
  kill(-pid_, SIGKILL);
  if (!ended_) {
    int status = 0;
    if (waitpid(pid_, &status, 0) == pid_) Reap(status);
  }
  UnregisterGroup(pid_);
  pid_ = -1;
}

void KillChildProcessGroups() {
  g_groups_killed.store(true);
  for (auto& slot : g_groups) {
    const pid_t pgid = slot.load();
    if (pgid > 0) kill(-pgid, SIGKILL);
  }
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
