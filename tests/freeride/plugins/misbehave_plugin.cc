// A side task that misbehaves on purpose, for the isolation tests: after `after` good steps
// (each `step_ms` of busy work) it segfaults, aborts, throws, exits, hangs, grows its memory by
// 16 MiB a step (`hog`), or takes `slow_ms` per step, times `growth` more each step (`slow`;
// `slow_steps` > 0: that many slow steps, then `step_ms` ones again). `mode = "ok"` never
// misbehaves. Its summary says the scheduling policy and nice value of the thread that ran its
// last step, as /proc/thread-self/stat shows them (where side work runs, for the tests).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/timer.h"
#include "freeride/side_task.h"

namespace {

class MisbehaveTask : public freeride::SideTask {
 public:
  absl::Status Create(freeride::SideTaskContext& ctx) override {
    freeride::ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s =
            args.OnlyKnown({"mode", "after", "step_ms", "slow_ms", "growth", "slow_steps"});
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> mode = args.Choice(
        "mode", "ok", {"ok", "segfault", "abort", "throw", "exit", "hang", "hog", "slow"});
    absl::StatusOr<int64_t> after = args.Int("after", 0, 0, int64_t{1} << 40);
    absl::StatusOr<double> step_ms = args.Number("step_ms", 1.0, 0.0, 1e4);
    absl::StatusOr<double> slow_ms = args.Number("slow_ms", 50.0, 0.0, 1e5);
    absl::StatusOr<double> growth = args.Number("growth", 1.0, 1.0, 100.0);
    absl::StatusOr<int64_t> slow_steps = args.Int("slow_steps", 0, 0, int64_t{1} << 40);
    for (const absl::Status& s : {mode.status(), after.status(), step_ms.status(), slow_ms.status(),
                                  growth.status(), slow_steps.status()}) {
      if (!s.ok()) return s;
    }
    mode_ = *mode;
    after_ = *after;
    step_s_ = *step_ms * 1e-3;
    slow_s_ = *slow_ms * 1e-3;
    growth_ = *growth;
    slow_steps_ = *slow_steps;
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(freeride::SideTaskContext& ctx) override {
    ReadOwnSched();
    if (steps_ == 0) first_policy_ = policy_, first_nice_ = nice_;
    if (steps_++ >= after_) Misbehave();
    if (mode_ == "slow" && steps_ > after_ &&
        (slow_steps_ == 0 || steps_ <= after_ + slow_steps_)) {
      Busy(ctx, slow_s_);
      slow_s_ *= growth_;
    } else {
      Busy(ctx, step_s_);
    }
    return 1.0;
  }
  std::string UnitName() const override { return "steps"; }
  std::string Summary() const override {
    return absl::StrFormat("%d steps, policy %d nice %d (first step: %d nice %d)", steps_,
                           policy_, nice_, first_policy_, first_nice_);
  }

 private:
  // On the host's clock: a test on simulated time sees the step take `seconds` of it.
  static void Busy(freeride::SideTaskContext& ctx, double seconds) {
    if (ctx.clock != nullptr && ctx.clock->simulated()) return ctx.clock->Busy(seconds);
    Busy(seconds);
  }
  static void Busy(double seconds) {
    const double until = freeride::MonotonicSeconds() + seconds;
    volatile double sink = 0;
    while (freeride::MonotonicSeconds() < until) sink = sink + 1;
  }

  // Fields 19 (nice) and 41 (policy) of /proc/thread-self/stat, counted after the ')' that
  // closes the command name.
  void ReadOwnSched() {
    std::ifstream in("/proc/thread-self/stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    for (int n = 3; fields >> field && n <= 41; ++n) {
      if (n == 19) nice_ = std::atoi(field.c_str());
      if (n == 41) policy_ = std::atoi(field.c_str());
    }
  }

  void Misbehave() {
    if (mode_ == "segfault") {
      volatile int* nowhere = nullptr;
      *nowhere = 1;
    } else if (mode_ == "abort") {
      std::abort();
    } else if (mode_ == "throw") {
      throw std::runtime_error("misbehave: thrown on purpose");
    } else if (mode_ == "exit") {
      std::exit(7);
    } else if (mode_ == "hang") {
      while (true) Busy(1.0);
    } else if (mode_ == "hog") {
      hoard_.emplace_back(16 << 20);
      std::memset(hoard_.back().data(), 1, hoard_.back().size());
    }
  }

  std::string mode_;
  int64_t after_ = 0, steps_ = 0, slow_steps_ = 0;
  double step_s_ = 1e-3, slow_s_ = 0.05, growth_ = 1;
  int policy_ = -1, nice_ = 0;  // of the last step's thread
  int first_policy_ = -1, first_nice_ = 0;
  std::vector<std::vector<char>> hoard_;
};

}  // namespace

FREERIDE_SIDE_TASK_PLUGIN(MisbehaveTask, "misbehave")
