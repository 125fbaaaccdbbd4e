// The SideTaskExecutor: one per rank, in the training process. At each BUBBLE it runs steps of
// the highest-priority runnable task that fits the bubble's remaining predicted time, until the
// awaited input is ready (or, where that cannot be polled, until the predicted end less the
// margin: the bubble's deadline) or nothing fits, then hands the rank back. Tasks run in this
// process or in worker processes (task_host.h): a worker's step is paused at the deadline or
// the ready input and resumed in a later bubble, so it may start whenever time is left; an
// in-process step starts only if its predicted time fits, and one whose steps overrun
// repeatedly is demoted, then failed. Bubble durations are predicted per bubble (its identity in
// the stage's schedule, pipeline::BubbleKey): the schedule's own figure (SetSchedule) from the
// first step, then corrected by each measurement; task step times from a calibration run at
// start, corrected online. A failing task (error, exception, crash, hang,
// memory) is FAILED with its reason; training never sees it. A latency-sensitive task (serve)
// whose requests wait goes before every other, and a reserve of the bubble is kept for it
// (docs/side_tasks.md#classes-of-side-work).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "freeride/bubble_predictor.h"
#include "freeride/side_task.h"
#include "freeride/task_host.h"
#include "pipeline/stage_executor.h"

namespace freeride {

// Less than this left of a bubble is not offered to a task that runs until a deadline (a worker
// or an imperative task): the switch would cost more than the work.
inline constexpr double kMinSideSliceS = 2e-4;

struct ExecutorOptions {
  int rank = 0;
  int stage = 0;
  double margin = 0.1;         // fraction of a bubble's predicted time left unharvested
  int calibration_steps = 3;   // standalone steps per task at start
  std::string results_dir;     // tasks write under results_dir/<name>_r<rank>/
  double step_timeout_s = 60;  // a worker's step (or create, load) running longer: hung, FAILED
  int demote_after = 3;        // in-process overruns before demotion; twice as many: FAILED
  std::string worker_path;     // empty: SideWorkerPath()
  // Share of each predicted bubble kept for latency-sensitive tasks (serve) while their
  // requests wait; 0: one predicted step of the latency-sensitive task.
  double serve_reserve = 0;
  // What bubbles, steps and deadlines are timed on (not owned); null: the system clock. The
  // bubbles handed to OnBubble and OnBubbleEnd must be on the same clock.
  Clock* clock = nullptr;
};

struct TaskReport {
  std::string name, type, state, reason, unit, summary, isolation;
  int64_t steps = 0;              // steps run inside bubbles (finished ones)
  double units = 0;               // units of work done inside bubbles
  double harvested_s = 0;         // time of those steps
  double standalone_step_s = 0;   // mean step time alone (calibration)
  double standalone_unit_s = 0;   // seconds per unit of work alone
  double overrun_s = 0;           // bound on the delay its side work caused training
  int64_t overruns = 0;           // in-process steps that ran well past their bubble
  int64_t pauses = 0;             // worker steps paused at a bubble's end
  int64_t restarts = 0;           // times it was done and began again on fresh input (repeat)
  int64_t calibration_steps = 0;  // steps run alone before its first bubble (its work too)
  double calibration_units = 0;   // the units they did
  double total_units = 0;         // SideTask::TotalUnits: its whole work; 0: unknown
  int64_t memory_peak_bytes = 0;  // its arena's peak, or its worker's peak resident set
  std::string memory_peak_note;   // what that counts, and how memory_limit capped it
};

struct SideStepEvent {
  int task = 0;
  int bubble = 0;                 // index of the BUBBLE instruction
  double start_s = 0, end_s = 0;  // on the executor's clock
};

// One BUBBLE as it happened: the duration predicted when it began (< 0: none, neither the
// schedule's nor a measurement), the measured one (start to the awaited instruction's end of
// waiting), and the side work run in it.
struct BubbleRecord {
  int stage = 0;
  int index = 0;  // the BUBBLE instruction's place in the stage's list
  pipeline::BubbleKind kind = pipeline::BubbleKind::kNone;
  double predicted_s = -1, measured_s = 0, harvested_s = 0;
  int anchor = -1;  // its pipeline::BubbleKey's: the same bubble in every placement (-1 unknown)
};

struct HarvestReport {
  int rank = 0, stage = 0;
  int64_t bubbles = 0;
  std::array<double, pipeline::kNumBubbleKinds> bubble_s{}, harvested_s{}, overrun_s{};
  std::vector<TaskReport> tasks;
  double total_bubble_s() const;
  double total_harvested_s() const;
  double total_overrun_s() const;
};

class SideTaskExecutor : public pipeline::BubbleHook {
 public:
  // Creates, loads and calibrates every task; an error in any stops the run before training.
  static absl::StatusOr<std::unique_ptr<SideTaskExecutor>> Create(
      const std::vector<SideTaskSpec>& specs, const ExecutorOptions& options);
  ~SideTaskExecutor() override;

  void OnBubble(const pipeline::Instr& bubble, int index, double start_s,
                const std::function<bool()>& input_ready) override;
  void OnBubbleEnd(int index, double end_s) override;
  // The stage's instructions as the schedule placed its BUBBLEs, again after a re-placement
  // (BubblePredictor::SetSchedule: the schedule's figures seed the predictions; `free_bytes`,
  // the rank's memory plan, where a BUBBLE has none).
  void SetSchedule(const std::vector<pipeline::Instr>& instrs, double seconds_per_ms,
                   int64_t free_bytes);
  // The device memory free in BUBBLE `index`, as the schedule or the memory plan say (< 0:
  // unknown).
  int64_t free_bytes(int index) const { return predictor_.free_bytes(index); }

  // Off: bubbles are still measured (for the predictions), no throughput work runs in them and
  // they stay out of the report (the overhead's reference blocks); requests waiting for a
  // latency-sensitive task are still served there.
  void set_harvesting(bool on) { harvesting_ = on; }
  // How much of the bubbles throughput work is offered (the overhead guard's levels,
  // trainer/overhead_guard.h): `share` of each bubble's predicted time less the margin, even
  // where the input can be polled, and only every `stride`-th bubble; (1, 1) offers all.
  // Waiting requests are served in every bubble, whole.
  void set_offer(double share, int stride);
  // A benched task is offered no bubble until unbenched (the guard's costliest task).
  void set_benched(int id, bool benched);
  // Only the named tasks are offered bubbles (all when never called); an empty set harvests
  // nothing while still measuring and counting the bubbles (a study's "training alone"). Tasks
  // added after the call are not among them.
  void set_active_tasks(const std::vector<std::string>& names);
  // Unloads every task: FINISHED if it was done, else STOPPED (FAILED stays FAILED).
  void Finish();

  // Adds a task while training runs (a fill job): created, loaded and calibrated now, with its
  // outputs under results_dir/<name>_r<rank>/. Returns the id the calls below take. An error
  // of the spec's in Create (arguments, type, plugin) is returned and the task dropped; a
  // crash, hang or failing Load leaves it FAILED with its reason, as at start.
  absl::StatusOr<int> AddTask(const SideTaskSpec& spec, const std::string& results_dir);
  // Unloads task `id` and offers it no more bubbles: STOPPED (FINISHED and FAILED stay).
  void StopTask(int id);
  TaskState task_state(int id) const;
  TaskReport task_report(int id) const;
  // SideTask::LatencySensitive of task `id` (serve).
  bool latency_sensitive(int id) const;
  // Whether task `id` runs until each bubble's end (imperative): it has no step time to fit.
  bool fills_bubble(int id) const;
  // The longest of the bubbles of the last step, as predicted (0 before any).
  double LongestPredictedBubble() const;
  double margin() const { return options_.margin; }
  // Tasks in the order they were added (their ids), as SideStepEvent::task counts them.
  HarvestReport Report() const;
  const std::vector<SideStepEvent>& events() const { return events_; }
  // The bubbles since the last call (a step's, when called once per step), in order.
  std::vector<BubbleRecord> TakeBubbleRecords() { return std::exchange(records_, {}); }

 private:
  struct Task;
  struct Open {
    int index = -1;
    pipeline::BubbleKind kind = pipeline::BubbleKind::kNone;
    double start = 0, harvest_end = 0, predicted_end = 0, harvested = 0;
    double predicted = -1;  // the prediction the bubble began with
    BubblePredictor::Begun begun;  // what the predictor said of it
    bool pollable = false;  // the awaited input can be polled
    bool overran = false;   // the input was found ready right after an in-process step
    double late = 0;        // a worker paused at the ready input ran at most this past it
    bool late_known = false;
    int last_task = -1;       // the task that ran last in this bubble
    bool harvesting = false;  // counted in the report (blocks with harvesting off are not)
  };
  explicit SideTaskExecutor(const ExecutorOptions& options);
  void Calibrate(Task& task);
  // What one class of side work may still use of the open bubble: the time to its deadline,
  // whether it may run on until the input lands instead, and whether it may start at all.
  struct Window {
    double remaining = 0;
    bool until_input = false;
    bool open = false;
  };
  // The next step: a latency-sensitive task with requests waiting, in `latency`'s window (the
  // whole bubble, in every bubble), else a throughput task in `work`'s (the harvesting blocks'
  // bubbles, the share the overhead guard offers).
  Task* Pick(const Window& latency, const Window& work);
  // Whether an offered latency-sensitive task has requests waiting.
  bool LatencyWorkWaits() const;
  // Whether task `index` is loaded and among those offered bubbles.
  bool Offered(size_t index) const;
  // Whether `task`'s next step fits the time left (a task that runs until a deadline needs a
  // slice of it, or an input it can poll).
  static bool Fits(const Task& task, double remaining, bool pollable);
  // The bubble time kept for latency-sensitive tasks while their requests wait
  // (ExecutorOptions::serve_reserve); 0 where none is offered.
  double Reserve() const;
  // Where a throughput task that runs until a deadline stops at the latest: the reserve's
  // start, so that the executor looks for waiting requests there; +inf where no reserve lies
  // ahead.
  double ReserveStart(const Task& task, double stop_at) const;
  // What an in-process task's next step is predicted to take, a restart included.
  static double StepNeeds(const Task& task);
  // Runs (or resumes) one step; false when the bubble is over for side work (a paused worker)
  // or the task failed.
  bool RunStep(int which, double deadline, const std::function<bool()>& input_ready);
  void CountInProcessOverrun(Task& task, double took, double predicted_before, double end);
  void Fail(Task& task, const std::string& reason);
  Clock& clock() const { return ClockOr(options_.clock); }

  ExecutorOptions options_;
  // Ids are places in tasks_ (tasks are only ever appended); order_ lists them by priority,
  // higher first, equals in the order they came.
  std::vector<std::unique_ptr<Task>> tasks_;
  std::vector<int> order_;
  BubblePredictor predictor_;
  std::vector<bool> active_;  // per task (in tasks_ order)
  bool harvesting_ = true;
  double offer_share_ = 1.0;
  int offer_stride_ = 1;
  int64_t offered_ = 0;  // bubbles seen while harvesting, for the stride
  std::vector<bool> benched_;  // per task (in tasks_ order); empty: none
  Open open_;
  size_t round_robin_ = 0;
  HarvestReport report_;
  std::vector<SideStepEvent> events_;
  std::vector<BubbleRecord> records_;
};

}  // namespace freeride
