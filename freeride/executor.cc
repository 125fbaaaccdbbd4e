#include "freeride/executor.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/nvtx.h"

namespace freeride {
namespace {

constexpr double kStepAlpha = 0.3;    // weight of a new step-time measurement
constexpr size_t kMaxEvents = 100000;
// Where the input can be polled, a task that runs until a deadline keeps going while the input
// has not landed, up to this many times the predicted bubble: past that something else is
// wrong (a peer gone), and the rank must reach its receive and its comm_timeout_s.
constexpr double kPollableBubbleLimit = 4.0;

const std::function<bool()> kNever = [] { return false; };

// How much of a demoted task's worst step is left each time it is passed over for not fitting.
constexpr double kWorstStepDecay = 0.9;

}  // namespace

struct SideTaskExecutor::Task {
  SideTaskSpec spec;
  std::unique_ptr<TaskHost> host;
  TaskState state = TaskState::kSubmitted;
  double predicted_step_s = 0;
  double worst_step_s = 0;  // a demoted task is offered only bubbles its worst step fits
  // What a restart (repeat) takes, as last measured; unknown (0) before the first, which
  // cannot be told in advance: in place it may cost nothing, as a fresh object a Create.
  double restart_s = 0;
  bool demoted = false;
  // Overruns since steps last fitted `demote_after` times in a row, which forgive them (and
  // lift a demotion): a burst of work must not bar a task for good.
  int64_t recent_overruns = 0;
  int64_t fitted_in_a_row = 0;
  TaskReport report;
  bool runs_until_deadline() const { return host->pausable() || host->fills_bubble(); }
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

SideTaskExecutor::SideTaskExecutor(const ExecutorOptions& options)
    : options_(options), predictor_(options.margin) {}
SideTaskExecutor::~SideTaskExecutor() = default;  // hosts kill their workers

void SideTaskExecutor::Fail(Task& task, const std::string& reason) {
  task.state = TaskState::kFailed;
  task.report.reason = reason;
  task.host->Abandon();
  FR_LOG(WARN) << "side task '" << task.spec.name << "' FAILED: " << reason
               << " (training goes on)";
}

// An in-process step cannot be interrupted: one that ran well past its prediction and past the
// bubble's predicted end is an overrun. Repeated ones demote the task (only bubbles its worst
// step fits, after every other task), then fail it; `demote_after` steps in a row that fit
// forgive them and lift the demotion.
void SideTaskExecutor::CountInProcessOverrun(Task& task, double took, double predicted_before,
                                             double end) {
  task.worst_step_s = std::max(task.worst_step_s, took);
  if (task.host->fills_bubble()) return;
  if (end <= open_.predicted_end || took <= 2 * predicted_before) {
    if (++task.fitted_in_a_row < options_.demote_after) return;
    if (task.demoted) {
      FR_LOG(INFO) << absl::StrFormat(
          "side task '%s' no longer demoted: %d steps in a row fitted their bubbles",
          task.spec.name, task.fitted_in_a_row);
    }
    task.demoted = false;
    task.recent_overruns = 0;
    task.worst_step_s = std::max(task.predicted_step_s, took);
    return;
  }
  task.fitted_in_a_row = 0;
  task.report.overruns += 1;
  const int64_t n = ++task.recent_overruns;
  if (n >= 2 * options_.demote_after) {
    Fail(task,
         absl::StrFormat(
             "its in-process steps overran their bubbles %d times (the last took %.1f ms against "
             "%.1f ms predicted); in-process steps cannot be paused: isolation = \"process\" can",
             n, took * 1e3, predicted_before * 1e3));
  } else if (n >= options_.demote_after && !task.demoted) {
    task.demoted = true;
    FR_LOG(WARN) << absl::StrFormat(
        "side task '%s' demoted: %d in-process steps overran their bubbles; it now runs last, "
        "only where its worst step (%.1f ms) fits",
        task.spec.name, n, task.worst_step_s * 1e3);
  }
}

bool SideTaskExecutor::RunStep(int which, double deadline,
                               const std::function<bool()>& input_ready) {
  Task& task = *tasks_[which];
  const double predicted_before = task.predicted_step_s;
  const double start = clock().Now();
  // A task that stops itself at the ready input (an imperative one, in process) is watched: its
  // last poll that found nothing bounds how long it ran past the input.
  double last_not_ready = start;
  bool saw_ready = false;
  const bool watch = !task.host->pausable() && task.host->fills_bubble();
  const std::function<bool()> watched = [&] {
    if (input_ready()) return saw_ready = true;
    last_not_ready = clock().Now();
    return false;
  };
  // On Nsight's timeline, inside the bubble's range (to this function's end: its bookkeeping
  // is microseconds).
  FR_NVTX_RANGE(absl::StrCat("side task ", task.spec.name));
  const HostStep out = task.host->Step(deadline, watch ? watched : input_ready);
  const double end = start + out.ran_s;
  if (saw_ready) {
    open_.late = std::max(0.0, clock().Now() - last_not_ready);
    open_.late_known = true;
  }
  // A step that only waited for work (SideTaskContext::idle) used the bubble for nothing: it
  // is neither harvested time, nor a step, nor on the timeline.
  const double worked_s = out.idle ? 0.0 : out.ran_s;
  task.report.harvested_s += worked_s;
  open_.harvested += worked_s;
  if (out.restarted) {
    task.report.restarts += 1;
    task.restart_s = out.restart_s;
  }
  open_.last_task = which;
  if (!out.idle && events_.size() < kMaxEvents) {
    events_.push_back({which, open_.index, start, end});
  }
  if (out.kind == HostStep::Kind::kFailed) {
    Fail(task, out.reason);
    return false;
  }
  if (out.kind == HostStep::Kind::kPaused) {
    task.report.pauses += 1;
    if (out.late_s > 0) {
      open_.late = out.late_s;
      open_.late_known = true;
    }
    return false;
  }
  if (!out.idle) task.report.steps += 1;
  task.report.units += out.units;
  if (!task.runs_until_deadline()) {
    // A restart is not the step's own time: Pick adds restart_s where one comes first.
    const double step_s = out.ran_s - out.restart_s;
    task.predicted_step_s = (1 - kStepAlpha) * task.predicted_step_s + kStepAlpha * step_s;
    CountInProcessOverrun(task, step_s, predicted_before, end);
    if (task.state == TaskState::kFailed) return false;
  }
  if (out.finished) {
    task.state = TaskState::kFinished;
    task.host->Release();
    FR_LOG(INFO) << "side task '" << task.spec.name << "' FINISHED";
  }
  return true;
}

void SideTaskExecutor::Calibrate(Task& task) {
  // Steps alone, before training, for the step-time prediction and for `reclaimed` (work in
  // seconds of the task run alone).
  const double declared = task.host->declared_step_s();
  double took = 0, units = 0;
  int steps = 0;
  std::vector<double> step_times;
  if (!task.host->fills_bubble()) {
    for (; steps < options_.calibration_steps && !task.host->done(); ++steps) {
      FR_NVTX_RANGE(absl::StrCat("side task ", task.spec.name, " calibration"));
      const HostStep out = task.host->StepAlone(clock().Now() + 2 * options_.step_timeout_s);
      if (out.kind != HostStep::Kind::kDone) {
        Fail(task, "calibration step: " + (out.reason.empty() ? "did not finish" : out.reason));
        return;
      }
      took += out.ran_s;
      units += out.units;
      step_times.push_back(out.ran_s);
    }
  }
  task.report.calibration_steps = steps;
  task.report.calibration_units = units;
  task.report.standalone_step_s = steps > 0 ? took / steps : declared;
  task.report.standalone_unit_s = units > 0 ? took / units : 0;
  // The prediction starts from the median: one step descheduled on a busy machine would
  // otherwise make the task look too slow for every bubble, and it would never run to learn
  // better. (The mean stays the standalone figure that `reclaimed` is priced at.)
  double median = task.report.standalone_step_s;
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + step_times.size() / 2,
                     step_times.end());
    median = step_times[step_times.size() / 2];
  }
  task.predicted_step_s = declared > 0 ? declared : median;
  task.worst_step_s = task.predicted_step_s;
  FR_LOG(INFO) << absl::StrFormat(
      "side task '%s' (%s, %s) LOADED on stage %d: %.3f ms per step alone", task.spec.name,
      task.spec.type, task.spec.isolation, options_.stage, task.report.standalone_step_s * 1e3);
  if (task.host->done() && !task.spec.repeat) {
    task.state = TaskState::kFinished;
    task.host->Release();
  }
}

absl::StatusOr<int> SideTaskExecutor::AddTask(const SideTaskSpec& spec,
                                              const std::string& results_dir) {
  auto owned = std::make_unique<Task>();
  Task& task = *owned;
  task.spec = spec;
  task.report.name = spec.name;
  task.report.type = spec.type;
  task.report.isolation = spec.isolation;
  HostOptions host;
  host.rank = options_.rank;
  host.stage = options_.stage;
  host.results_dir =
      (std::filesystem::path(results_dir) / absl::StrFormat("%s_r%d", spec.name, options_.rank))
          .string();
  host.step_timeout_s = options_.step_timeout_s;
  host.worker_path = options_.worker_path;
  host.clock = options_.clock;
  if (absl::Status s = MakeDirectories(host.results_dir); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<TaskHost>> made = MakeTaskHost(spec, host);
  if (!made.ok()) {
    return absl::Status(made.status().code(),
                        absl::StrFormat("side task '%s': %s", spec.name, made.status().message()));
  }
  task.host = *std::move(made);
  // Argument errors are the config's: they stop the run before training. A crash, a hang or a
  // failing Load is the task's: it is FAILED and training goes on.
  if (absl::Status s = task.host->Create(); !s.ok() && !absl::IsUnavailable(s)) {
    task.host->Release();
    return absl::Status(s.code(), absl::StrFormat("side task '%s' (%s): create: %s", spec.name,
                                                  spec.type, s.message()));
  } else if (!s.ok()) {
    Fail(task, absl::StrFormat("create: %s", s.message()));
  } else {
    task.state = TaskState::kCreated;
    task.report.unit = task.host->unit_name();
    task.report.total_units = task.host->total_units();
    if (absl::Status load = task.host->Load(); !load.ok()) {
      Fail(task, absl::StrFormat("load: %s", load.message()));
    } else {
      task.state = TaskState::kLoaded;
      Calibrate(task);
    }
  }
  const int id = static_cast<int>(tasks_.size());
  const int64_t priority = spec.priority;
  tasks_.push_back(std::move(owned));
  // After the tasks of its priority and above, before the lower ones.
  order_.insert(
      std::upper_bound(order_.begin(), order_.end(), priority,
                       [&](int64_t p, int other) { return p > tasks_[other]->spec.priority; }),
      id);
  return id;
}

void SideTaskExecutor::StopTask(int id) {
  Task& task = *tasks_[id];
  if (task.state == TaskState::kFailed || task.state == TaskState::kFinished) return;
  task.host->Release();
  task.state = TaskState::kStopped;
  FR_LOG(INFO) << "side task '" << task.spec.name << "' STOPPED";
}

TaskState SideTaskExecutor::task_state(int id) const { return tasks_[id]->state; }

TaskReport SideTaskExecutor::task_report(int id) const {
  const Task& task = *tasks_[id];
  TaskReport report = task.report;
  report.state = TaskStateName(task.state);
  report.summary = task.host->summary();
  report.memory_peak_bytes = task.host->memory_peak_bytes();
  report.memory_peak_note = task.host->memory_peak_note();
  return report;
}

bool SideTaskExecutor::fills_bubble(int id) const { return tasks_[id]->host->fills_bubble(); }

double SideTaskExecutor::LongestPredictedBubble() const {
  return predictor_.Longest(harvesting_);
}

void SideTaskExecutor::SetSchedule(const std::vector<pipeline::Instr>& instrs,
                                   double seconds_per_ms, int64_t free_bytes) {
  predictor_.SetSchedule(instrs, seconds_per_ms, free_bytes);
}

absl::StatusOr<std::unique_ptr<SideTaskExecutor>> SideTaskExecutor::Create(
    const std::vector<SideTaskSpec>& specs, const ExecutorOptions& options) {
  std::unique_ptr<SideTaskExecutor> ex(new SideTaskExecutor(options));
  ex->report_.rank = options.rank;
  ex->report_.stage = options.stage;
  // Higher priority first; the order among equals is the config's (order_).
  for (const SideTaskSpec& spec : specs) {
    if (absl::StatusOr<int> id = ex->AddTask(spec, options.results_dir); !id.ok()) {
      return id.status();
    }
  }
  return ex;
}

void SideTaskExecutor::set_offer(double share, int stride) {
  offer_share_ = std::clamp(share, 0.0, 1.0);
  offer_stride_ = std::max(1, stride);
}

void SideTaskExecutor::set_benched(int id, bool benched) {
  if (benched_.size() < tasks_.size()) benched_.resize(tasks_.size(), false);
  benched_[id] = benched;
}

void SideTaskExecutor::set_active_tasks(const std::vector<std::string>& names) {
  active_.assign(tasks_.size(), false);
  for (size_t i = 0; i < tasks_.size(); ++i) {
    active_[i] = std::find(names.begin(), names.end(), tasks_[i]->spec.name) != names.end();
  }
}

double SideTaskExecutor::StepNeeds(const Task& task) {
  const double step = task.demoted ? task.worst_step_s : task.predicted_step_s;
  return step + (task.host->done() ? task.restart_s : 0.0);  // done with repeat: restarts first
}

bool SideTaskExecutor::Offered(size_t index) const {
  return tasks_[index]->state == TaskState::kLoaded &&
         (active_.empty() || (index < active_.size() && active_[index])) &&
         !(index < benched_.size() && benched_[index]);
}

bool SideTaskExecutor::Fits(const Task& task, double remaining, bool pollable) {
  return task.runs_until_deadline() ? pollable || remaining > kMinSideSliceS
                                    : StepNeeds(task) <= remaining;
}

double SideTaskExecutor::Reserve() const {
  double step = -1;  // the longest predicted step of a latency-sensitive task; < 0: none
  for (size_t index = 0; index < tasks_.size(); ++index) {
    if (Offered(index) && tasks_[index]->host->latency_sensitive()) {
      step = std::max(step, StepNeeds(*tasks_[index]));
    }
  }
  if (step < 0) return 0;
  return options_.serve_reserve > 0 ? options_.serve_reserve * std::max(0.0, open_.predicted)
                                    : step;
}

double SideTaskExecutor::ReserveStart(const Task& task, double stop_at) const {
  const double start = stop_at - Reserve();
  if (task.host->latency_sensitive() || !task.runs_until_deadline() || start >= stop_at ||
      clock().Now() >= start) {
    return std::numeric_limits<double>::infinity();
  }
  return start;
}

bool SideTaskExecutor::LatencyWorkWaits() const {
  for (size_t index = 0; index < tasks_.size(); ++index) {
    const TaskHost& host = *tasks_[index]->host;
    if (Offered(index) && host.latency_sensitive() && host.has_pending_work()) return true;
  }
  return false;
}

bool SideTaskExecutor::latency_sensitive(int id) const {
  return tasks_[id]->host->latency_sensitive();
}

SideTaskExecutor::Task* SideTaskExecutor::Pick(const Window& latency, const Window& work) {
  // Latency-sensitive work with requests waiting goes first, whatever the priorities (a fill
  // job's included) and the demotions: a client waits on each of its steps, and a throughput
  // task only loses time it gets back in a later bubble.
  bool waiting = false;
  for (const bool demoted : {false, true}) {
    if (!latency.open) break;
    for (const int index : order_) {
      Task& t = *tasks_[index];
      if (!Offered(index) || t.demoted != demoted || !t.host->latency_sensitive() ||
          !t.host->has_pending_work()) {
        continue;
      }
      waiting = true;
      if (Fits(t, latency.remaining, latency.until_input)) return &t;
    }
  }
  if (!work.open) return nullptr;
  double remaining = work.remaining;
  bool pollable = work.until_input;
  // While requests wait, throughput work starts only where it ends before the reserve, which
  // is measured from the predicted end even where the input can be polled.
  if (waiting) {
    remaining -= Reserve();
    pollable = false;
  }
  // Among runnable tasks of the highest priority that has one that fits, rotate; demoted tasks
  // come after all others.
  for (const bool demoted : {false, true}) {
    for (size_t i = 0; i < order_.size();) {
      const int64_t priority = tasks_[order_[i]]->spec.priority;
      size_t j = i;
      while (j < order_.size() && tasks_[order_[j]]->spec.priority == priority) ++j;
      const size_t n = j - i;
      for (size_t k = 0; k < n; ++k) {
        const size_t index = order_[i + (round_robin_ + k) % n];
        Task& t = *tasks_[index];
        if (!Offered(index) || t.demoted != demoted) continue;
        const bool fits = Fits(t, remaining, pollable);
        // A demoted task passed over decays its worst step towards its prediction, so that it
        // meets a bubble again where its steps can show that they fit.
        if (demoted && !fits) {
          t.worst_step_s = std::max(t.predicted_step_s, kWorstStepDecay * t.worst_step_s);
        }
        if (fits) {
          round_robin_ = (round_robin_ + k + 1) % n;
          return &t;
        }
      }
      i = j;
    }
  }
  return nullptr;
}

void SideTaskExecutor::OnBubble(const pipeline::Instr& bubble, int index, double start_s,
                                const std::function<bool()>& input_ready) {
  open_ = Open{};
  open_.index = index;
  open_.kind = bubble.bubble;
  open_.start = open_.harvest_end = open_.predicted_end = start_s;
  open_.pollable = static_cast<bool>(input_ready);
  open_.harvesting = harvesting_;
  open_.begun = predictor_.Begin(index, bubble.bubble, harvesting_);
  const double predicted = open_.begun.predicted_s;
  open_.predicted = predicted;
  if (predicted <= 0 || tasks_.empty()) return;  // measure first
  // Throughput work runs in harvesting blocks, in the bubbles the overhead guard's level
  // offers. Requests that wait are served in every bubble (plain blocks, the guard's paused
  // level and the bubbles it leaves out included): a client would otherwise wait out a whole
  // plain block, seconds on a busy host, whatever its target.
  const bool throughput = harvesting_ && offered_++ % offer_stride_ == 0;
  if (!throughput && !LatencyWorkWaits()) return;
  const double share = throughput ? offer_share_ : 1.0;
  const std::function<bool()>& ready = open_.pollable ? input_ready : kNever;
  open_.predicted_end = start_s + predicted;
  // The deadlines: the predicted end less the margin, of the share the guard offers throughput
  // work (waiting requests have the whole bubble). Where the input can be polled, a task that
  // can be paused (or stops itself) runs until it lands instead, unless the guard offers
  // throughput work only a share.
  const double full_stop = start_s + predicted * (1.0 - options_.margin);
  const double stop_at = start_s + predicted * (1.0 - options_.margin) * share;
  const bool until_input = open_.pollable && share >= 1.0;
  bool ran_since_poll = false;
  while (true) {
    const double now = clock().Now();
    if (open_.pollable && ready()) {
      open_.overran = ran_since_poll;
      break;
    }
    const Window latency{full_stop - now, open_.pollable, open_.pollable || now < full_stop};
    const Window work{stop_at - now, until_input, throughput && (until_input || now < stop_at)};
    if (!latency.open && !work.open) break;
    ran_since_poll = false;
    Task* task = Pick(latency, work);
    if (task == nullptr) break;
    int which = 0;
    while (tasks_[which].get() != task) ++which;
    const bool latency_task = task->host->latency_sensitive();
    double deadline = now + StepNeeds(*task);
    if (task->runs_until_deadline()) {
      deadline = (latency_task ? latency.until_input : until_input)
                     ? start_s + kPollableBubbleLimit * predicted
                     : (latency_task ? full_stop : stop_at);
    }
    const double reserve_start = ReserveStart(*task, stop_at);
    deadline = std::min(deadline, reserve_start);
    const bool go_on = RunStep(which, deadline, ready);
    // Paused: the bubble is over, unless at the reserve's start, where requests may wait.
    if (!go_on && task->state != TaskState::kFailed && deadline != reserve_start) break;
    ran_since_poll = go_on;
  }
  open_.harvest_end = clock().Now();
}

void SideTaskExecutor::OnBubbleEnd(int index, double end_s) {
  if (open_.index != index) return;
  const double measured = end_s - open_.start;
  const int kind = static_cast<int>(open_.kind);
  // Bounds on the delay side work caused: a paused worker ran at most `late` past the input; an
  // in-process step still running when the input landed delayed training by at most that step;
  // where the input cannot be polled, the time past the predicted end counts.
  double overrun = 0;
  if (open_.harvested > 0) {
    if (open_.late_known) {
      overrun = std::min(open_.late, measured);
    } else if (open_.overran && !events_.empty()) {
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
    if (open_.last_task >= 0) tasks_[open_.last_task]->report.overrun_s += overrun;
  }
  records_.push_back({options_.stage, index, open_.kind,
                      open_.predicted > 0 ? open_.predicted : -1.0, measured, open_.harvested});
  // Only a bubble whose end side work did not hide tells its duration; a paused worker hides it
  // by at most `late`. Where the input cannot be polled (a sum), side work that ran to the
  // deadline hides when the peers arrived: a wait after it shorter than half the margin says
  // they were waiting already, by an unknown time, so the prediction drops below what was
  // measured rather than averaging toward it (which let side work come late to every sum).
  const bool end_hidden = !open_.pollable && open_.harvested > 0 &&
                          end_s - open_.harvest_end < 0.5 * options_.margin * open_.predicted;
  predictor_.Learn(index, open_.kind, open_.harvesting, open_.begun, measured, overrun, end_hidden,
                   open_.late_known);
  open_ = Open{};
}

void SideTaskExecutor::Finish() {
  for (auto& t : tasks_) {
    if (t->state == TaskState::kFailed || t->state == TaskState::kFinished) continue;
    t->host->Release();
    t->state = t->host->done() ? TaskState::kFinished : TaskState::kStopped;
    FR_LOG(INFO) << "side task '" << t->spec.name << "' " << TaskStateName(t->state);
  }
}

HarvestReport SideTaskExecutor::Report() const {
  HarvestReport r = report_;
  for (size_t id = 0; id < tasks_.size(); ++id) {
    r.tasks.push_back(task_report(static_cast<int>(id)));
  }
  return r;
}

}  // namespace freeride
