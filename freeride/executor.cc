#include "freeride/executor.h"

#include <algorithm>
#include <exception>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/timer.h"

namespace freeride {
namespace {

constexpr double kStepAlpha = 0.3;    // weight of a new step-time measurement
constexpr double kBubbleAlpha = 0.5;  // weight of a new bubble measurement
constexpr size_t kMaxEvents = 100000;

}  // namespace

struct SideTaskExecutor::Task {
  SideTaskSpec spec;
  std::unique_ptr<SideTask> impl;
  std::unique_ptr<CappedArena> arena;
  SideTaskContext ctx;
  TaskState state = TaskState::kSubmitted;
  double predicted_step_s = 0;
  TaskReport report;
};

double HarvestReport::total_bubble_s() const {
  double s = 0;
  for (double v : bubble_s) s += v;
  return s;
}
double HarvestReport::total_harvested_s() const {
  double s = 0;
  for (double v : harvested_s) s += v;
  return s;
}
double HarvestReport::total_overrun_s() const {
  double s = 0;
  for (double v : overrun_s) s += v;
  return s;
}

SideTaskExecutor::SideTaskExecutor(const ExecutorOptions& options) : options_(options) {}
SideTaskExecutor::~SideTaskExecutor() = default;

void SideTaskExecutor::Fail(Task& task, const std::string& reason) {
  task.state = TaskState::kFailed;
  task.report.reason = reason;
  task.arena->Reset();
  FR_LOG(WARN) << "side task '" << task.spec.name << "' FAILED: " << reason
               << " (training goes on)";
}

// Runs one step of `task`, accounting for it; false when the task failed.
bool SideTaskExecutor::RunStep(Task& task, double deadline,
                               const std::function<bool()>& input_ready) {
  task.ctx.deadline_s = deadline;
  task.ctx.input_ready = input_ready;
  const TaskState before = task.state;
  task.state = TaskState::kRunning;
  const double start = MonotonicSeconds();
  absl::StatusOr<double> units = absl::InternalError("no result");
  try {
    units = task.impl->Step(task.ctx);
  } catch (const std::exception& e) {
    units = absl::InternalError(absl::StrFormat("threw %s", e.what()));
  } catch (...) {
    units = absl::InternalError("threw a non-standard exception");
  }
  const double end = MonotonicSeconds();
  if (!units.ok()) {
    Fail(task, std::string(units.status().message()));
    return false;
  }
  task.state = task.impl->Done() ? TaskState::kFinished : before;
  if (task.state == TaskState::kFinished) {
    FR_LOG(INFO) << "side task '" << task.spec.name << "' FINISHED";
    (void)task.impl->Unload(task.ctx);
    task.arena->Reset();
  }
  const double took = end - start;
  if (!task.impl->FillsBubble()) {
    task.predicted_step_s = (1 - kStepAlpha) * task.predicted_step_s + kStepAlpha * took;
  }
  task.report.steps += 1;
  task.report.units += *units;
  task.report.harvested_s += took;
  open_.harvested += took;
  if (events_.size() < kMaxEvents) {
    int which = 0;
    while (tasks_[which].get() != &task) ++which;
    events_.push_back({which, open_.index, start, end});
  }
  return true;
}

absl::StatusOr<std::unique_ptr<SideTaskExecutor>> SideTaskExecutor::Create(
    const std::vector<SideTaskSpec>& specs, const ExecutorOptions& options) {
  std::unique_ptr<SideTaskExecutor> ex(new SideTaskExecutor(options));
  ex->report_.rank = options.rank;
  ex->report_.stage = options.stage;
  for (const SideTaskSpec& spec : specs) {
    auto task = std::make_unique<Task>();
    task->spec = spec;
    absl::StatusOr<std::unique_ptr<SideTask>> impl = CreateSideTask(spec.type, spec.plugin);
    if (!impl.ok()) {
      return absl::Status(impl.status().code(), absl::StrFormat("side task '%s': %s", spec.name,
                                                                impl.status().message()));
    }
    task->impl = *std::move(impl);
    task->arena = std::make_unique<CappedArena>(spec.memory_limit_bytes);
    task->ctx.name = spec.name;
    task->ctx.rank = options.rank;
    task->ctx.stage = options.stage;
    task->ctx.args = &task->spec.args;
    task->ctx.arena = task->arena.get();
    task->ctx.results_dir = (std::filesystem::path(options.results_dir) /
                             absl::StrFormat("%s_r%d", spec.name, options.rank)).string();
    task->ctx.input_ready = [] { return false; };
    task->report.name = spec.name;
    task->report.type = spec.type;
    task->report.unit = task->impl->UnitName();
    // Create and Load errors are configuration errors: they stop the run before training.
    if (absl::Status s = task->impl->Create(task->ctx); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("side task '%s' (%s): create: %s", spec.name,
                                                    spec.type, s.message()));
    }
    task->state = TaskState::kCreated;
    if (absl::Status s = MakeDirectories(task->ctx.results_dir); !s.ok()) return s;
    if (absl::Status s = task->impl->Load(task->ctx); !s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("side task '%s' (%s): load: %s", spec.name,
                                                    spec.type, s.message()));
    }
    task->state = TaskState::kLoaded;
    // Calibration: steps alone, before training, for the step-time prediction and for
    // `reclaimed` (work in seconds of the task run alone).
    double declared = task->impl->DeclaredStepSeconds(), took = 0, units = 0;
    int steps = 0;
    if (!task->impl->FillsBubble()) {
      for (; steps < options.calibration_steps && !task->impl->Done(); ++steps) {
        task->ctx.deadline_s = MonotonicSeconds() + 3600;
        const double start = MonotonicSeconds();
        absl::StatusOr<double> u = task->impl->Step(task->ctx);
        if (!u.ok()) {
          return absl::Status(u.status().code(), absl::StrFormat(
              "side task '%s' (%s): calibration step: %s", spec.name, spec.type,
              u.status().message()));
        }
        took += MonotonicSeconds() - start;
        units += *u;
      }
    }
    task->report.standalone_step_s = steps > 0 ? took / steps : declared;
    task->report.standalone_unit_s = units > 0 ? took / units : 0;
    task->predicted_step_s = declared > 0 ? declared : task->report.standalone_step_s;
    FR_LOG(INFO) << absl::StrFormat(
        "side task '%s' (%s) LOADED on stage %d: %.3f ms per step alone", spec.name, spec.type,
        options.stage, task->report.standalone_step_s * 1e3);
    ex->tasks_.push_back(std::move(task));
  }
  // Higher priority first; the order among equals is the config's.
  std::stable_sort(ex->tasks_.begin(), ex->tasks_.end(), [](const auto& a, const auto& b) {
    return a->spec.priority > b->spec.priority;
  });
  return ex;
}

void SideTaskExecutor::set_active_tasks(const std::vector<std::string>& names) {
  active_.assign(tasks_.size(), false);
  for (size_t i = 0; i < tasks_.size(); ++i) {
    active_[i] = std::find(names.begin(), names.end(), tasks_[i]->spec.name) != names.end();
  }
}

SideTaskExecutor::Task* SideTaskExecutor::Pick(double remaining) {
  // Among runnable tasks of the highest priority that has one that fits, rotate.
  for (size_t i = 0; i < tasks_.size();) {
    size_t j = i;
    while (j < tasks_.size() && tasks_[j]->spec.priority == tasks_[i]->spec.priority) ++j;
    const size_t n = j - i;
    for (size_t k = 0; k < n; ++k) {
      const size_t index = i + (round_robin_ + k) % n;
      Task& t = *tasks_[index];
      const bool runnable =
          t.state == TaskState::kLoaded && (active_.empty() || active_[index]);
      if (runnable && (t.impl->FillsBubble() || t.predicted_step_s <= remaining)) {
        round_robin_ = (round_robin_ + k + 1) % n;
        return &t;
      }
    }
    i = j;
  }
  return nullptr;
}

void SideTaskExecutor::OnBubble(const pipeline::Instr& bubble, int index, double start_s,
                                const std::function<bool()>& input_ready) {
  if (static_cast<int>(predicted_.size()) <= index) predicted_.resize(index + 1, -1.0);
  open_ = Open{index, bubble.bubble, start_s, start_s, start_s, 0, false, harvesting_};
  const double predicted = predicted_[index];
  if (!harvesting_ || predicted <= 0 || tasks_.empty()) return;  // measure first
  open_.predicted_end = start_s + predicted;
  const double stop_at = start_s + predicted * (1.0 - options_.margin);
  bool ran_since_poll = false;
  while (true) {
    const double now = MonotonicSeconds();
    if (input_ready()) {
      open_.overran = ran_since_poll;
      break;
    }
    ran_since_poll = false;
    Task* task = Pick(stop_at - now);
    if (task == nullptr) break;
    if (!RunStep(*task, task->impl->FillsBubble() ? stop_at : now + task->predicted_step_s,
                 input_ready)) {
      continue;  // FAILED; offer the rest of the bubble to the others
    }
    ran_since_poll = true;
  }
  open_.harvest_end = MonotonicSeconds();
}

void SideTaskExecutor::OnBubbleEnd(int index, double end_s) {
  if (open_.index != index) return;
  const double measured = end_s - open_.start;
  const int kind = static_cast<int>(open_.kind);
  // A side step that was still running when the input landed delayed training by at most
  // that step (reported as the bound). Where the input cannot be polled (waits inside sums),
  // the time past the predicted end counts.
  double overrun = 0;
  if (open_.harvested > 0) {
    if (open_.overran && !events_.empty()) {
      overrun = events_.back().end_s - events_.back().start_s;
    } else if (open_.harvest_end > open_.predicted_end) {
      overrun = std::min(open_.harvest_end - open_.predicted_end, measured);
    }
  }
  if (open_.harvesting) {
    report_.bubbles += 1;
    report_.bubble_s[kind] += measured;
    report_.harvested_s[kind] += open_.harvested;
    report_.overrun_s[kind] += overrun;
  }
  // Only a bubble whose end was not hidden by side work tells its true duration.
  double& p = predicted_[index];
  if (p <= 0) {
    p = measured;
  } else if (overrun == 0) {
    p = (1 - kBubbleAlpha) * p + kBubbleAlpha * measured;
  } else {
    p *= 0.9;
  }
  open_ = Open{};
}

void SideTaskExecutor::Finish() {
  for (auto& t : tasks_) {
    if (t->state == TaskState::kFailed || t->state == TaskState::kFinished) continue;
    (void)t->impl->Unload(t->ctx);
    t->arena->Reset();
    t->state = t->impl->Done() ? TaskState::kFinished : TaskState::kStopped;
    FR_LOG(INFO) << "side task '" << t->spec.name << "' " << TaskStateName(t->state);
  }
}

HarvestReport SideTaskExecutor::Report() const {
  HarvestReport r = report_;
  for (const auto& t : tasks_) {
    TaskReport tr = t->report;
    tr.state = TaskStateName(t->state);
    tr.summary = t->impl->Summary();
    r.tasks.push_back(tr);
  }
  return r;
}

}  // namespace freeride
