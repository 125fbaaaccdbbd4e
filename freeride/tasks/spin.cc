// `spin`: calibrated busy work (tests and benchmarks). Each step keeps the core busy for
// args.step_ms; args.steps > 0 ends the task after that many; args.memory bytes are taken from
// the task's arena at Load (to exercise memory limits).
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/timer.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

class SpinTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"step_ms", "steps", "memory"}); !s.ok()) return s;
    absl::StatusOr<double> ms = args.Number("step_ms", 1.0, 1e-3, 1e4);
    absl::StatusOr<int64_t> steps = args.Int("steps", 0, 0, int64_t{1} << 40);
    absl::StatusOr<int64_t> memory = args.Int("memory", 0, 0, int64_t{1} << 40);
    for (const absl::Status& s : {ms.status(), steps.status(), memory.status()}) {
      if (!s.ok()) return s;
    }
    step_s_ = *ms * 1e-3;
    limit_ = *steps;
    memory_ = *memory;
    return absl::OkStatus();
  }
  absl::Status Load(SideTaskContext& ctx) override {
    if (memory_ == 0) return absl::OkStatus();
    return ctx.arena->Allocate(memory_, "spin working memory").status();
  }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ++done_;
    if (Clock& clock = ClockOr(ctx.clock); clock.simulated()) {
      clock.Busy(step_s_);
      return 1.0;
    }
    const double until = MonotonicSeconds() + step_s_;
    volatile double sink = 0;
    while (MonotonicSeconds() < until) {
      for (int i = 0; i < 64; ++i) sink = sink + 1e-9 * i;
    }
    return 1.0;
  }
  bool Done() const override { return limit_ > 0 && done_ >= limit_; }
  double TotalUnits() const override { return static_cast<double>(limit_); }
  double DeclaredStepSeconds() const override { return step_s_; }
  std::string UnitName() const override { return "spins"; }
  std::string Summary() const override { return absl::StrFormat("%d spins", done_); }

 private:
  double step_s_ = 1e-3;
  int64_t limit_ = 0, memory_ = 0, done_ = 0;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(SpinTask, "spin");

}  // namespace freeride
