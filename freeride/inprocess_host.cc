// A side task run by the rank itself: the fastest switch (a function call), no protection. A
// thrown exception or an error status fails the task; a crash or a hang is the rank's.
#include <exception>
#include <new>

#include "absl/strings/str_format.h"
#include "core/arena.h"
#include "core/clock.h"
#include "core/host_memory.h"
#include "freeride/side_task.h"
#include "freeride/task_host.h"

namespace freeride {
namespace {

constexpr double kUntimedStepS = 10e-6;

class InProcessHost : public TaskHost {
 public:
  InProcessHost(const SideTaskSpec& spec, const HostOptions& options,
                std::unique_ptr<SideTask> impl)
      : spec_(spec), impl_(std::move(impl)), arena_(spec.memory_limit_bytes) {
    ctx_.name = spec_.name;
    ctx_.rank = options.rank;
    ctx_.stage = options.stage;
    ctx_.args = &spec_.args;
    ctx_.arena = &arena_;
    ctx_.results_dir = options.results_dir;
    ctx_.input_ready = [] { return false; };
    ctx_.clock = &ClockOr(options.clock);
  }
  ~InProcessHost() override { Release(); }

  absl::Status Create() override { return Guard("create", [&] { return impl_->Create(ctx_); }); }
  absl::Status Load() override {
    loaded_ = true;
    return Guard("load", [&] { return impl_->Load(ctx_); });
  }

  HostStep Step(double deadline_s, const std::function<bool()>& input_ready) override {
    ctx_.deadline_s = deadline_s;
    ctx_.input_ready = input_ready;
    HostStep out;
    const double start = ctx_.clock->Now();
    if (spec_.repeat && impl_->Done()) {
      if (absl::Status s = Restart(); !s.ok()) {
        out.kind = HostStep::Kind::kFailed;
        out.reason = absl::StrFormat("restart %d: %s", ctx_.restarts, s.message());
        out.ran_s = ctx_.clock->Now() - start;
        return out;
      }
      out.restarted = true;
      out.restart_s = ctx_.clock->Now() - start;
    }
    absl::StatusOr<double> units = absl::InternalError("no result");
    const double clock_before = ctx_.clock->Now();
    ctx_.idle = false;
    try {
      units = impl_->Step(ctx_);
    } catch (const std::bad_alloc&) {
      units = absl::ResourceExhaustedError("ran out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
      units = absl::InternalError(absl::StrFormat("threw %s", e.what()));
    } catch (...) {
      units = absl::InternalError("threw a non-standard exception");
    }
    // A task that keeps no time on a simulated clock (its work is real: an image, PageRank)
    // takes kUntimedStepS of it, whatever its real time was: a step of no time would let the
    // executor start steps without end, and its real time would make the test depend on the
    // machine's load.
    if (ctx_.clock->simulated() && ctx_.clock->Now() == clock_before) {
      ctx_.clock->Busy(kUntimedStepS);
    }
    out.ran_s = ctx_.clock->Now() - start;
    if (!units.ok()) {
      out.kind = HostStep::Kind::kFailed;
      out.reason = std::string(units.status().message());
      return out;
    }
    out.units = *units;
    out.idle = ctx_.idle;
    out.finished = impl_->Done() && !spec_.repeat;
    return out;
  }

  void Release() override {
    if (loaded_) (void)impl_->Unload(ctx_);
    loaded_ = false;
    arena_.Reset();
  }
  void Abandon() override {
    loaded_ = false;  // its state is not trusted: no Unload, only the memory back
    arena_.Reset();
  }

  bool pausable() const override { return false; }
  bool fills_bubble() const override { return impl_->FillsBubble(); }
  double declared_step_s() const override { return impl_->DeclaredStepSeconds(); }
  std::string unit_name() const override { return impl_->UnitName(); }
  std::string summary() const override { return impl_->Summary(); }
  int64_t memory_peak_bytes() const override { return arena_.peak(); }
  std::string memory_peak_note() const override {
    if (spec_.memory_limit_bytes <= 0) return "what ctx.arena handed out; no memory_limit: no cap";
    return absl::StrFormat(
        "what ctx.arena handed out, capped at memory_limit %s; the task's allocations outside "
        "the arena are neither counted nor capped",
        FormatBytes(spec_.memory_limit_bytes));
  }
  bool done() const override { return impl_->Done(); }

 private:
  // In place where the task can; else its results are written (Unload) and a fresh object of
  // its type begins on the next input.
  absl::Status Restart() {
    ctx_.restarts += 1;
    if (impl_->RestartsInPlace()) return Guard("restart", [&] { return impl_->Restart(ctx_); });
    Release();
    absl::StatusOr<std::unique_ptr<SideTask>> fresh = CreateSideTask(spec_.type, spec_.plugin);
    if (!fresh.ok()) return fresh.status();
    impl_ = *std::move(fresh);
    if (absl::Status s = Create(); !s.ok()) return s;
    return Load();
  }

  absl::Status Guard(const char* what, const std::function<absl::Status()>& call) {
    try {
      return call();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrFormat("%s threw %s", what, e.what()));
    } catch (...) {
      return absl::InternalError(absl::StrFormat("%s threw a non-standard exception", what));
    }
  }

  SideTaskSpec spec_;
  std::unique_ptr<SideTask> impl_;
  CappedArena arena_;
  SideTaskContext ctx_;
  bool loaded_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TaskHost>> MakeInProcessHost(const SideTaskSpec& spec,
                                                            const HostOptions& options) {
  absl::StatusOr<std::unique_ptr<SideTask>> impl = CreateSideTask(spec.type, spec.plugin);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<TaskHost>(new InProcessHost(spec, options, *std::move(impl)));
}

absl::StatusOr<std::unique_ptr<TaskHost>> MakeTaskHost(const SideTaskSpec& spec,
                                                       const HostOptions& options) {
  // A `command` task's program is its own process already: the rank drives it directly.
  const bool command = spec.type == "command" && spec.plugin.empty();
  return spec.isolation == "process" && !command ? MakeWorkerHost(spec, options)
                                                 : MakeInProcessHost(spec, options);
}

}  // namespace freeride
