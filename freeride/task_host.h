// Where a side task's code runs. In process: the rank calls the task directly (switching costs a
// function call; an in-process step cannot be interrupted, and a crash takes the rank down). In
// a worker process: the rank starts `freeride_side_worker` (its own process group, killed with
// the rank, its data segment capped at memory_limit) and sends it requests over a socket; a step
// still running when the bubble ends is paused (SIGSTOP) and resumed in the next bubble, and a
// crash, abort, hang or memory overrun fails that task alone.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "freeride/task_args.h"

namespace freeride {

// How often a rank waiting for its awaited input looks at it, in either host.
inline constexpr double kAwaitPollS = 100e-6;

struct SideTaskSpec {
  std::string type, name, plugin;
  int64_t priority = 0;
  int64_t memory_limit_bytes = 0;
  TaskArgs args;
  std::string isolation = "inprocess";  // "inprocess" | "process"
  bool repeat = false;  // restart on fresh input once done, instead of finishing
};

struct HostOptions {
  int rank = 0;
  int stage = 0;
  std::string results_dir;       // the task's own output directory
  double step_timeout_s = 60;    // a worker's request (create, load, one step) running longer hangs
  std::string worker_path;       // empty: SideWorkerPath()
  Clock* clock = nullptr;        // steps and deadlines are timed on it; null: the system clock
};

struct HostStep {
  enum class Kind { kDone, kPaused, kFailed };
  Kind kind = Kind::kDone;
  double units = 0;        // work of a step that ended
  bool finished = false;   // the task has nothing left to do (never with repeat)
  bool restarted = false;  // the task was done and restarted (repeat) before this step
  double restart_s = 0;    // of ran_s, the time the restart took
  std::string reason;      // kFailed: why
  double ran_s = 0;        // how long the task ran in this call
  double late_s = 0;       // paused at a ready input: bound on how long it ran past it
  bool idle = false;       // the step found no work and only waited (SideTaskContext::idle)
};

class TaskHost {
 public:
  virtual ~TaskHost() = default;
  // Arguments and host state. An error whose code is Unavailable means the task crashed or hung
  // (FAILED, training goes on); any other is the config's (the run stops before training).
  virtual absl::Status Create() = 0;
  // Working memory (capped). An error fails the task, not the run.
  virtual absl::Status Load() = 0;
  // Runs one step (or resumes the paused one) until it ends, until `deadline_s`
  // (on the host's clock), or until input_ready(): a pausable host pauses the task there; an
  // in-process step runs to its end whatever the time. A done task with spec.repeat is
  // restarted first, within the same call (a worker's restart is paused like a step).
  virtual HostStep Step(double deadline_s, const std::function<bool()>& input_ready) = 0;
  // A step measured alone, its caller waiting for it whatever it takes (calibration, before
  // training or at the step boundary that admits a fill job): at the caller's scheduling class
  // where the host can, since at the idle class it would take as long as other processes kept
  // the cores busy, and its time would price the task at that. A host that cannot runs Step.
  virtual HostStep StepAlone(double deadline_s) {
    return Step(deadline_s, [] { return false; });
  }
  // Unloads the task and ends whatever process it has. Idempotent.
  virtual void Release() = 0;
  // Kills it now (a failure): no Unload.
  virtual void Abandon() = 0;

  virtual bool pausable() const = 0;
  virtual bool fills_bubble() const = 0;
  virtual double declared_step_s() const = 0;
  virtual std::string unit_name() const = 0;
  virtual double total_units() const = 0;  // SideTask::TotalUnits
  virtual std::string summary() const = 0;
  virtual int64_t memory_peak_bytes() const = 0;  // arena peak, or the worker's peak RSS
  // What memory_peak_bytes counts and whether (and how) memory_limit capped it, for the report.
  virtual std::string memory_peak_note() const = 0;
  virtual bool done() const = 0;  // with repeat: done until the next Step restarts it
  virtual bool latency_sensitive() const = 0;  // SideTask::LatencySensitive
  // SideTask::HasPendingWork, asked between steps or while one runs (on the side thread or
  // paused).
  virtual bool has_pending_work() const = 0;
};

// A task's class as `freeride jobs` names it: SideTask::LatencySensitive, or throughput.
inline const char* SideTaskClassName(bool latency_sensitive) {
  return latency_sensitive ? "latency" : "throughput";
}

// In this process: CreateSideTask (built-in registry or plugin); its errors are the config's.
absl::StatusOr<std::unique_ptr<TaskHost>> MakeInProcessHost(const SideTaskSpec& spec,
                                                            const HostOptions& options);
// In a new worker process.
absl::StatusOr<std::unique_ptr<TaskHost>> MakeWorkerHost(const SideTaskSpec& spec,
                                                         const HostOptions& options);
absl::StatusOr<std::unique_ptr<TaskHost>> MakeTaskHost(const SideTaskSpec& spec,
                                                       const HostOptions& options);

// The worker binary: $FREERIDE_SIDE_WORKER, else `freeride_side_worker` beside this
// executable, else the one this tree built.
std::string SideWorkerPath();

}  // namespace freeride
