// `command`: the imperative interface. Any program (args.argv) runs as a child process of the
// rank (core/child_process.h: under a supervisor that ends its whole process tree with the rank,
// its data segment capped at memory_limit, its stdout and stderr appended to output.log in the
// task's results directory) that is stopped (SIGSTOP) except inside bubbles: a step resumes it
// (SIGCONT), lets it run until the bubble's deadline or until training's input is ready, and
// stops it again. The child's exit ends the task: status 0 FINISHED, anything else FAILED with
// the status or signal; at the end of training its group is killed (STOPPED).

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/child_process.h"
#include "core/clock.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

class CommandTask : public SideTask {
 public:
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

  // Starts the program, stopped: the first bubble lets it run. Its data segment is capped at
  // the task's memory_limit.
  absl::Status Load(SideTaskContext& ctx) override {
    if (child_.running()) return absl::OkStatus();
    ChildOptions options;
    options.argv = argv_;
    options.working_dir = ctx.results_dir;
    options.data_limit_bytes = ctx.arena->cap();
    options.start_stopped = true;
    options.idle_class = true;  // side work: a core only when no training thread wants it
    // Not the rank's descriptors: mpirun waits for those to close, and a process that escaped
    // the program (until the supervisor ends it) must not hold the job open.
    options.output_path = ctx.results_dir + "/output.log";
    absl::StatusOr<ChildProcess> child = ChildProcess::Start(options);
    if (!child.ok()) return child.status();
    child_ = *std::move(child);
    if (child_.Ended()) return Exited();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    Clock& clock = ClockOr(ctx.clock);
    const double start = clock.Now();
    child_.Continue();
    while (clock.Now() < ctx.deadline_s && !ctx.input_ready() && !child_.Ended()) {
      clock.Sleep(std::min(100e-6, ctx.deadline_s - clock.Now()));
    }
    child_.Stop();
    const double ran = clock.Now() - start;
    seconds_ += ran;
    if (child_.Ended()) {
      if (absl::Status s = Exited(); !s.ok()) return s;
      finished_ = true;
    }
    return ran;
  }

  absl::Status Unload(SideTaskContext&) override {
    child_.Kill();
    return absl::OkStatus();
  }
  bool Done() const override { return finished_; }
  bool FillsBubble() const override { return true; }
  std::string UnitName() const override { return "seconds run"; }
  std::string Summary() const override {
    return absl::StrFormat("`%s` ran %.3f s inside bubbles%s", absl::StrJoin(argv_, " "),
                           seconds_, finished_ ? ", exited 0" : "");
  }

 private:
  absl::Status Exited() const {
    if (child_.EndedCleanly()) return absl::OkStatus();
    return absl::InternalError(
        absl::StrFormat("`%s` %s", absl::StrJoin(argv_, " "), child_.EndDescription()));
  }

  std::vector<std::string> argv_;
  ChildProcess child_;  // its whole process tree is killed when the task goes
  bool finished_ = false;
  double seconds_ = 0;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(CommandTask, "command");

}  // namespace freeride
