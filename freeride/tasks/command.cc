// `command`: the imperative interface. Any program (args.argv) runs as a child process that is
// stopped (SIGSTOP) except inside bubbles: a step resumes it (SIGCONT), lets it run until the
// bubble's deadline or until training's input is ready, and stops it again. The child's exit
// ends the task: status 0 FINISHED, anything else FAILED with the status; at the end of
// training a child still running is killed (STOPPED).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/timer.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

class CommandTask : public SideTask {
 public:
  ~CommandTask() override { Kill(); }

  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"argv"}); !s.ok()) return s;
    absl::StatusOr<std::vector<std::string>> argv = args.Strings("argv");
    if (!argv.ok()) return argv.status();
    if (argv->empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "side task '%s': args.argv is required: the program and its arguments", ctx.name));
    }
    argv_ = *argv;
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    if (pid_ > 0) return absl::OkStatus();
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError("fork failed");
    if (pid_ == 0) {
      raise(SIGSTOP);  // start stopped: the first bubble lets it run
      std::vector<char*> cargv;
      for (std::string& a : argv_) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      if (chdir(ctx.results_dir.c_str()) != 0) _exit(126);
      execvp(cargv[0], cargv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid_, &status, WUNTRACED);
    if (!WIFSTOPPED(status)) return Exited(status);
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    const double start = MonotonicSeconds();
    kill(pid_, SIGCONT);
    int status = 0;
    bool exited = false;
    while (MonotonicSeconds() < ctx.deadline_s && !ctx.input_ready()) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!exited) {
      kill(pid_, SIGSTOP);
      if (waitpid(pid_, &status, WUNTRACED) == pid_ && !WIFSTOPPED(status)) exited = true;
    }
    const double ran = MonotonicSeconds() - start;
    if (exited) {
      pid_ = -1;
      if (absl::Status s = Exited(status); !s.ok()) return s;
      finished_ = true;
    }
    seconds_ += ran;
    return ran;
  }

  absl::Status Unload(SideTaskContext&) override {
    Kill();
    return absl::OkStatus();
  }
  bool Done() const override { return finished_; }
  bool FillsBubble() const override { return true; }
  std::string UnitName() const override { return "seconds run"; }
  std::string Summary() const override {
    return absl::StrFormat("`%s` ran %.3f s inside bubbles%s", absl::StrJoin(argv_, " "),
                           seconds_, finished_ ? ", exited 0" : "");
  }
  pid_t pid() const { return pid_; }

 private:
  absl::Status Exited(int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
    if (WIFEXITED(status)) {
      return absl::InternalError(absl::StrFormat("`%s` exited with status %d%s",
                                                 absl::StrJoin(argv_, " "), WEXITSTATUS(status),
                                                 WEXITSTATUS(status) == 127 ? " (not found)" : ""));
    }
    return absl::InternalError(absl::StrFormat("`%s` was killed by signal %d",
                                               absl::StrJoin(argv_, " "), WTERMSIG(status)));
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  bool finished_ = false;
  double seconds_ = 0;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(CommandTask, "command");

}  // namespace freeride
