// A side task run by the rank itself: no process switch, no protection. A thrown exception or
// an error status fails the task; a crash is the rank's. On the system clock its steps run on a
// side thread of its own in the idle scheduling class (side_thread.h): the training thread hands
// it each step and waits, without spinning, until the step ends or the bubble does (the awaited
// input landed, the deadline came); a step still running then goes on at the idle class and the
// next bubble collects it, as a paused worker is resumed. Its unload runs there too, not waited
// for; its create and load run on the calling thread (see Create), and its calibration steps on
// a thread of the caller's class (StepAlone). A latency-sensitive task (serve) steps at the
// caller's class inside the bubble, on a thread lowered to the idle class where a step outlives
// it. A step that runs past
// freeride.step_timeout_s fails the task as hung, and training goes on. On a simulated clock
// (tests of the executor's logic) the calls run on the calling thread, whose time is the
// clock's.
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/arena.h"
#include "core/clock.h"
#include "core/host_memory.h"
#include "freeride/side_task.h"
#include "freeride/side_thread.h"
#include "freeride/task_host.h"

namespace freeride {
namespace {

constexpr double kUntimedStepS = 10e-6;

// What the task's code touches, owned jointly by the host and a call running on the side
// thread: a hung step left behind keeps it alive.
struct Core {
  Core(const SideTaskSpec& s, std::unique_ptr<SideTask> task)
      : spec(s), impl(std::move(task)), arena(s.memory_limit_bytes) {}
  SideTaskSpec spec;
  std::unique_ptr<SideTask> impl;
  CappedArena arena;
  SideTaskContext ctx;
  bool loaded = false;
  std::atomic<bool> input_landed{false};  // the training thread saw the awaited input
  HostStep result;                        // of the last step run on the side thread
  // What the training thread may ask while a step runs: as of the last call's end.
  mutable std::mutex mu;
  bool done = false;
  std::string summary;
  int64_t memory_peak = 0;
};

absl::Status Guard(const char* what, const std::function<absl::Status()>& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrFormat("%s threw %s", what, e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrFormat("%s threw a non-standard exception", what));
  }
}

void Snapshot(Core& c) {
  const bool done = c.impl->Done();
  std::string summary = c.impl->Summary();
  const int64_t peak = c.arena.peak();
  std::lock_guard<std::mutex> lock(c.mu);
  c.done = done;
  c.summary = std::move(summary);
  c.memory_peak = peak;
}

absl::Status CreateCore(Core& c) {
  return Guard("create", [&] { return c.impl->Create(c.ctx); });
}

absl::Status LoadCore(Core& c) {
  c.loaded = true;
  return Guard("load", [&] { return c.impl->Load(c.ctx); });
}

void UnloadCore(Core& c) {
  if (c.loaded) (void)Guard("unload", [&] { return c.impl->Unload(c.ctx); });
  c.loaded = false;
  c.arena.Reset();
}

// In place where the task can; else its results are written (Unload) and a fresh object of its
// type begins on the next input.
absl::Status RestartCore(Core& c) {
  c.ctx.restarts += 1;
  if (c.impl->RestartsInPlace()) return Guard("restart", [&] { return c.impl->Restart(c.ctx); });
  UnloadCore(c);
  absl::StatusOr<std::unique_ptr<SideTask>> fresh = CreateSideTask(c.spec.type, c.spec.plugin);
  if (!fresh.ok()) return fresh.status();
  std::unique_ptr<SideTask> old;  // destroyed after the lock is let go
  {
    std::lock_guard<std::mutex> lock(c.mu);  // has_pending_work reads impl from another thread
    old = std::exchange(c.impl, *std::move(fresh));
  }
  if (absl::Status s = CreateCore(c); !s.ok()) return s;
  return LoadCore(c);
}

// One step (a restart first where the task is done and repeats), on whichever thread calls it;
// ran_s is its whole time.
HostStep StepCore(Core& c, double deadline_s, const std::function<bool()>& input_ready) {
  c.ctx.deadline_s = deadline_s;
  c.ctx.input_ready = input_ready;
  HostStep out;
  Clock& clock = *c.ctx.clock;
  const double start = clock.Now();
  if (c.spec.repeat && c.impl->Done()) {
    if (absl::Status s = RestartCore(c); !s.ok()) {
      out.kind = HostStep::Kind::kFailed;
      out.reason = absl::StrFormat("restart %d: %s", c.ctx.restarts, s.message());
      out.ran_s = clock.Now() - start;
      return out;
    }
    out.restarted = true;
    out.restart_s = clock.Now() - start;
  }
  absl::StatusOr<double> units = absl::InternalError("no result");
  const double clock_before = clock.Now();
  c.ctx.idle = false;
  try {
    units = c.impl->Step(c.ctx);
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
  if (clock.simulated() && clock.Now() == clock_before) clock.Busy(kUntimedStepS);
  out.ran_s = clock.Now() - start;
  if (!units.ok()) {
    out.kind = HostStep::Kind::kFailed;
    out.reason = std::string(units.status().message());
    return out;
  }
  out.units = *units;
  out.idle = c.ctx.idle;
  out.finished = c.impl->Done() && !c.spec.repeat;
  return out;
}

class InProcessHost : public TaskHost {
 public:
  InProcessHost(const SideTaskSpec& spec, const HostOptions& options,
                std::unique_ptr<SideTask> impl)
      : core_(std::make_shared<Core>(spec, std::move(impl))),
        step_timeout_s_(options.step_timeout_s) {
    SideTaskContext& ctx = core_->ctx;
    ctx.name = core_->spec.name;
    ctx.rank = options.rank;
    ctx.stage = options.stage;
    ctx.args = &core_->spec.args;
    ctx.arena = &core_->arena;
    ctx.results_dir = options.results_dir;
    ctx.input_ready = [] { return false; };
    ctx.clock = &ClockOr(options.clock);
    if (!ctx.clock->simulated()) thread_ = std::make_unique<SideThread>();
  }
  ~InProcessHost() override { Release(); }

  // Create and Load run on the calling thread: training waits for them either way (before it
  // starts, or at the step boundary that admits a fill job), and at the idle class that wait
  // would last as long as every other process on the host kept the cores busy.
  absl::Status Create() override {
    absl::Status s = CreateCore(*core_);
    Snapshot(*core_);
    if (s.ok()) {
      unit_name_ = core_->impl->UnitName();
      fills_bubble_ = core_->impl->FillsBubble();
      declared_step_s_ = core_->impl->DeclaredStepSeconds();
      latency_sensitive_ = core_->impl->LatencySensitive();
      total_units_ = core_->impl->TotalUnits();
      // A client waits on each of its steps: in the bubble they run at the training's class
      // (the rank's own share of the host, which its training thread leaves while it waits),
      // lowered where one outlives it (Step).
      if (latency_sensitive_ && thread_) thread_ = MakeBubbleThread();
    }
    return s;
  }
  absl::Status Load() override {
    absl::Status s = LoadCore(*core_);
    Snapshot(*core_);
    return s;
  }

  HostStep Step(double deadline_s, const std::function<bool()>& input_ready) override {
    if (!thread_) {
      HostStep out = StepCore(*core_, deadline_s, input_ready);
      Snapshot(*core_);
      return out;
    }
    Clock& clock = *core_->ctx.clock;
    const double start = clock.Now();
    if (unloading_) SettleInFlight();  // a step after a release (never by the executor)
    if (!in_flight_) {
      core_->input_landed = false;
      step_began_ = start;
      // A thread lowered when its step outlived a bubble is spent: a fresh one of the caller's
      // class takes the next step.
      if (latency_sensitive_ && thread_->sched_class() != caller_class_) {
        thread_ = MakeBubbleThread();
      }
      std::shared_ptr<Core> core = core_;
      thread_->Start([core, deadline_s] {
        core->result =
            StepCore(*core, deadline_s, [c = core.get()] { return c->input_landed.load(); });
        Snapshot(*core);
      });
      in_flight_ = true;
    }
    HostStep out;
    double last_poll = start;
    while (true) {
      // Wakes at the deadline itself when it comes before the next poll.
      const double nap = std::clamp(deadline_s - clock.Now(), 0.0, kAwaitPollS);
      if (thread_->WaitFor(nap)) {
        in_flight_ = false;
        out = core_->result;
        out.ran_s = clock.Now() - start;  // the time in this call
        return out;
      }
      const double now = clock.Now();
      if (!fills_bubble_ && now - step_began_ > step_timeout_s_) {
        hung_ = true;  // the thread is left to it; the task is not called again
        out.kind = HostStep::Kind::kFailed;
        out.reason = absl::StrFormat(
            "one step ran %.1f s without finishing (freeride.step_timeout_s): hung",
            now - step_began_);
        out.ran_s = now - start;
        return out;
      }
      const bool ready = input_ready();
      if (ready) core_->input_landed = true;
      if (ready || now >= deadline_s) {
        // The step goes on at the idle class; the next bubble collects it.
        if (latency_sensitive_) thread_->Lower();
        out.kind = HostStep::Kind::kPaused;
        out.ran_s = now - start;
        out.late_s = ready ? now - last_poll : 0;
        return out;
      }
      last_poll = now;
    }
  }

  // On a thread of the caller's class made for it, so that a step that hangs is left behind
  // as on the side thread (a fill job's calibration would otherwise hang training with it).
  HostStep StepAlone(double deadline_s) override {
    if (!thread_) return Step(deadline_s, [] { return false; });
    if (hung_ || !SettleInFlight()) {
      HostStep out;
      out.kind = HostStep::Kind::kFailed;
      out.reason = "a call before it did not end";
      return out;
    }
    Clock& clock = *core_->ctx.clock;
    const double start = clock.Now();
    std::shared_ptr<Core> core = core_;
    SideThread alone(SideThread::Class::kCaller);
    alone.Start([core, deadline_s] {
      core->result = StepCore(*core, deadline_s, [] { return false; });
      Snapshot(*core);
    });
    if (!alone.WaitFor(step_timeout_s_)) {
      hung_ = true;  // the thread is left to it (its destructor detaches it)
      HostStep out;
      out.kind = HostStep::Kind::kFailed;
      out.reason = absl::StrFormat(
          "one step ran %.1f s without finishing (freeride.step_timeout_s): hung",
          clock.Now() - start);
      out.ran_s = clock.Now() - start;
      return out;
    }
    return core_->result;
  }

  void Release() override {
    if (hung_ || !SettleInFlight()) return;
    if (!thread_) {
      UnloadCore(*core_);
      Snapshot(*core_);
      return;
    }
    // Not waited for: at the idle class an unload (a task's results written) may wait long
    // for a core on a busy host, and training must not wait with it (a 3 s step where a
    // finished PageRank unloaded beside two busy processes, 2026-11-26). The next call on this
    // host, or its end, waits for it.
    std::shared_ptr<Core> core = core_;
    thread_->Lower();  // outside any bubble
    thread_->Start([core] {
      UnloadCore(*core);
      Snapshot(*core);
    });
    in_flight_ = true;
    unloading_ = true;
  }
  void Abandon() override {
    // Its state is not trusted: no Unload, only the memory back (once no call uses it).
    if (hung_ || !SettleInFlight()) return;
    core_->loaded = false;
    core_->arena.Reset();
  }

  bool pausable() const override { return thread_ != nullptr; }
  bool fills_bubble() const override { return fills_bubble_; }
  double declared_step_s() const override { return declared_step_s_; }
  double total_units() const override { return total_units_; }
  std::string unit_name() const override { return unit_name_; }
  std::string summary() const override {
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->summary;
  }
  int64_t memory_peak_bytes() const override {
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->memory_peak;
  }
  std::string memory_peak_note() const override {
    if (core_->spec.memory_limit_bytes <= 0) {
      return "what ctx.arena handed out; no memory_limit: no cap";
    }
    return absl::StrFormat(
        "what ctx.arena handed out, capped at memory_limit %s; the task's allocations outside "
        "the arena are neither counted nor capped",
        FormatBytes(core_->spec.memory_limit_bytes));
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->done;
  }
  bool latency_sensitive() const override { return latency_sensitive_; }
  // Asked while a step may run on the side thread: the task reads an atomic, and the lock keeps
  // a restart from replacing the object meanwhile.
  bool has_pending_work() const override {
    if (!latency_sensitive_ || hung_) return false;
    std::lock_guard<std::mutex> lock(core_->mu);
    return core_->impl->HasPendingWork();
  }

 private:
  // A step left running at a bubble's end: waited for (it is at the idle class, and the run is
  // ending or the task stopping) up to the step timeout. False when it did not end.
  bool SettleInFlight() {
    if (!in_flight_) return true;
    if (!thread_->WaitFor(step_timeout_s_)) {
      hung_ = true;
      return false;
    }
    in_flight_ = false;
    unloading_ = false;
    return true;
  }

  std::unique_ptr<SideThread> MakeBubbleThread() {
    auto thread = std::make_unique<SideThread>(SideThread::Class::kCaller);
    caller_class_ = thread->sched_class();
    return thread;
  }

  std::shared_ptr<Core> core_;
  std::unique_ptr<SideThread> thread_;  // null on a simulated clock
  SchedClass caller_class_ = SchedClass::kNormal;  // of a latency-sensitive task's fresh thread
  double step_timeout_s_;
  bool in_flight_ = false;  // a call started on the side thread has not been collected
  bool unloading_ = false;  // that call is Release's unload, not a step
  bool hung_ = false;       // a step outran the timeout: the side thread is left to it
  double step_began_ = 0;
  std::string unit_name_ = "steps";
  bool fills_bubble_ = false;
  double declared_step_s_ = 0, total_units_ = 0;
  bool latency_sensitive_ = false;
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
