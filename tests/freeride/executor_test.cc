// The side-task executor fed synthetic bubbles (no pipeline): it measures a bubble first, then
// fills it with steps that fit, stops when the input is ready, follows priorities, and marks
// failing tasks FAILED while the others go on. On simulated time: a spin step takes exactly
// its step_ms, a bubble exactly its length, so every figure below is exact under any load.
#include "freeride/executor.h"

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "core/clock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using pipeline::BubbleKind;
using pipeline::Instr;
using pipeline::Op;

// Test-only task types for failure injection.
class ThrowingTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext&) override { return absl::OkStatus(); }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ctx.clock->Busy(1e-3);
    if (++calls_ > 3) throw std::runtime_error("boom");  // calibration (3 steps) passes
    return 1.0;
  }
  int calls_ = 0;
};
FREERIDE_REGISTER_SIDE_TASK(ThrowingTask, "test_throwing");

class ErroringTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext&) override { return absl::OkStatus(); }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ctx.clock->Busy(1e-3);
    if (++calls_ > 3) return absl::DataLossError("lost the data");
    return 1.0;
  }
  int calls_ = 0;
};
FREERIDE_REGISTER_SIDE_TASK(ErroringTask, "test_erroring");

// Takes 1 MiB more on every step: exceeds a small memory limit after a few.
class GrowingTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext&) override { return absl::OkStatus(); }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ctx.clock->Busy(1e-3);
    absl::StatusOr<void*> p = ctx.arena->Allocate(1 << 20, "growing buffer");
    if (!p.ok()) return p.status();
    return 1.0;
  }
};
FREERIDE_REGISTER_SIDE_TASK(GrowingTask, "test_growing");

// A server with no request for `idle_steps` steps (each waits 1 ms for one and says it only
// waited), then one that works 1 ms per step.
class WaitingTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    absl::StatusOr<int64_t> idle = ArgReader(ctx.name, *ctx.args).Int("idle_steps", 0, 0, 1 << 30);
    idle_steps_ = idle.ok() ? *idle : 0;
    return idle.status();
  }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ctx.clock->Busy(1e-3);
    if (++calls_ <= 3) return 1.0;  // calibration
    if (calls_ - 3 <= idle_steps_) {
      ctx.idle = true;
      return 0.0;
    }
    return 1.0;
  }
  int64_t idle_steps_ = 0, calls_ = 0;
};
FREERIDE_REGISTER_SIDE_TASK(WaitingTask, "test_waiting");

std::string ResultsDir() {
  return (std::filesystem::path(::testing::TempDir()) / "side_results").string();
}

// The time every executor below runs on.
SimulatedClock& TestClock() {
  static SimulatedClock clock;
  return clock;
}

std::unique_ptr<SideTaskExecutor> MakeExecutor(const std::vector<SideTaskSpec>& specs) {
  ExecutorOptions options;
  options.results_dir = ResultsDir();
  options.margin = 0.1;
  options.clock = &TestClock();
  auto ex = SideTaskExecutor::Create(specs, options);
  EXPECT_TRUE(ex.ok()) << ex.status();
  return ex.ok() ? *std::move(ex) : nullptr;
}

SideTaskSpec Spin(const std::string& name, double step_ms, int64_t priority = 0,
                  int64_t steps = 0) {
  SideTaskSpec spec{"spin", name, "", priority, 0, {{"step_ms", step_ms}}};
  if (steps > 0) spec.args["steps"] = steps;
  return spec;
}

// One synthetic bubble of `length_s` at BUBBLE index `index`; the input is ready after
// `ready_after_s` (never when negative).
// Returns how long the executor kept the rank.
double Bubble(SideTaskExecutor& ex, int index, double length_s, double ready_after_s = -1) {
  Instr bubble;
  bubble.op = Op::kBubble;
  bubble.bubble = BubbleKind::kSteady;
  SimulatedClock& clock = TestClock();
  const double start = clock.Now();
  ex.OnBubble(bubble, index, start,
              [&] { return ready_after_s >= 0 && clock.Now() >= start + ready_after_s; });
  const double held = clock.Now() - start;
  clock.SpinUntil(start + length_s);
  ex.OnBubbleEnd(index, std::max(clock.Now(), start + length_s));
  return held;
}

// One synthetic bubble that ends at a sum (nothing to poll): the peers arrive `peers_s` after
// its start, the sum then takes `sum_s`; side work that runs past the peers' arrival delays it.
// Returns how late the sum ended against the peers' arrival plus `sum_s`.
double SumBubble(SideTaskExecutor& ex, int index, double peers_s, double sum_s) {
  Instr bubble;
  bubble.op = Op::kBubble;
  bubble.bubble = BubbleKind::kCooldown;
  SimulatedClock& clock = TestClock();
  const double start = clock.Now();
  ex.OnBubble(bubble, index, start, nullptr);
  const double done = std::max(clock.Now(), start + peers_s) + sum_s;
  clock.SpinUntil(done);
  ex.OnBubbleEnd(index, done);
  return done - (start + peers_s + sum_s);
}

TEST(SideTaskExecutorTest, MeasuresFirstThenFillsWithinTheBubble) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  EXPECT_EQ(Bubble(*ex, 0, 0.030), 0);  // first sight: measured, not harvested
  EXPECT_TRUE(ex->events().empty());
  const double start = TestClock().Now();
  for (int i = 0; i < 5; ++i) {
    // 1 ms steps up to the predicted end less the 10% margin: 27 of them, 3 ms left.
    EXPECT_NEAR(Bubble(*ex, 0, 0.030), 0.027, 0.0011) << i;
  }
  const HarvestReport r = ex->Report();
  EXPECT_EQ(r.bubbles, 6);
  EXPECT_NEAR(r.total_bubble_s(), 6 * 0.030, 1e-9);
  EXPECT_NEAR(r.total_harvested_s(), 5 * 0.027, 5 * 0.0011);
  EXPECT_EQ(r.total_overrun_s(), 0);
  // Every step starts inside a bubble, takes its 1 ms and ends before the bubble's predicted
  // end less the margin.
  for (const SideStepEvent& e : ex->events()) {
    EXPECT_GE(e.start_s, start);
    EXPECT_NEAR(e.end_s - e.start_s, 0.001, 1e-9);
    EXPECT_LE(std::fmod(e.end_s - start + 1e-9, 0.030), 0.027 + 2e-9);
  }
  EXPECT_EQ(r.tasks[0].state, "LOADED");
}

TEST(SideTaskExecutorTest, StopsWhenTheInputIsReady) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  Bubble(*ex, 0, 0.040);
  const size_t before = ex->events().size();
  const double start = TestClock().Now();
  // The input lands 4.5 ms in: the fifth 1 ms step was running, it ends, and the rank is
  // handed back at once.
  EXPECT_NEAR(Bubble(*ex, 0, 0.040, /*ready_after_s=*/0.0045), 0.005, 1e-9);
  ASSERT_EQ(ex->events().size(), before + 5);
  EXPECT_NEAR(ex->events().back().end_s - start, 0.005, 1e-9);
}

TEST(SideTaskExecutorTest, HigherPriorityFirstThenTheRest) {
  auto ex = MakeExecutor({Spin("low", 1.0, 0), Spin("high", 1.0, 5, /*steps=*/8)});
  Bubble(*ex, 0, 0.030);
  for (int i = 0; i < 4; ++i) Bubble(*ex, 0, 0.030);
  const HarvestReport r = ex->Report();
  ASSERT_EQ(r.tasks.size(), 2u);
  // The report and the events name tasks in the order they came: "low" is 0, "high" 1.
  EXPECT_EQ(r.tasks[1].name, "high");
  EXPECT_EQ(r.tasks[1].state, "FINISHED");
  EXPECT_EQ(r.tasks[1].steps, 8 - 3);  // 3 ran in calibration
  EXPECT_GT(r.tasks[0].steps, 0);
  // "low" ran only after "high" was done.
  const auto& events = ex->events();
  size_t last_high = 0, first_low = events.size();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].task == 1) last_high = i;
    if (events[i].task == 0 && first_low == events.size()) first_low = i;
  }
  EXPECT_LT(last_high, first_low);
}

TEST(SideTaskExecutorTest, FailuresAreIsolated) {
  SideTaskSpec growing{"test_growing", "growing", "", 3, 5 << 20, {}};
  auto ex = MakeExecutor({SideTaskSpec{"test_throwing", "throwing", "", 2, 0, {}},
                          SideTaskSpec{"test_erroring", "erroring", "", 2, 0, {}}, growing,
                          Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  Bubble(*ex, 0, 0.030);
  for (int i = 0; i < 4; ++i) Bubble(*ex, 0, 0.030);
  const HarvestReport r = ex->Report();
  std::map<std::string, TaskReport> by_name;
  for (const TaskReport& t : r.tasks) by_name[t.name] = t;
  EXPECT_EQ(by_name["throwing"].state, "FAILED");
  EXPECT_NE(by_name["throwing"].reason.find("threw boom"), std::string::npos);
  EXPECT_EQ(by_name["erroring"].state, "FAILED");
  EXPECT_NE(by_name["erroring"].reason.find("lost the data"), std::string::npos);
  EXPECT_EQ(by_name["growing"].state, "FAILED");
  EXPECT_NE(by_name["growing"].reason.find("exceeds the memory limit of 5242880 bytes"),
            std::string::npos)
      << by_name["growing"].reason;
  EXPECT_EQ(by_name["spin"].state, "LOADED");
  EXPECT_GT(by_name["spin"].steps, 0);  // the healthy task keeps the bubbles
  ex->Finish();
  EXPECT_EQ(ex->Report().tasks.back().state, "STOPPED");
}

TEST(SideTaskExecutorTest, HarvestingOffMeasuresButRunsNothing) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ex->set_harvesting(false);
  for (int i = 0; i < 3; ++i) Bubble(*ex, 0, 0.010);
  EXPECT_TRUE(ex->events().empty());
  EXPECT_EQ(ex->Report().bubbles, 0);
  ex->set_harvesting(true);
  Bubble(*ex, 0, 0.010);
  EXPECT_FALSE(ex->events().empty());  // the prediction was learnt while off
}

// Alternating blocks: a bubble that lasts 12 ms while harvesting and 4 ms otherwise (as a
// last stage's does when its peer harvests too) is predicted from its own state's history, not
// from an average of both; the first harvesting sighting borrows the plain prediction.
TEST(SideTaskExecutorTest, PredictsEachHarvestingStateFromItsOwnBubbles) {
  auto ex = MakeExecutor({Spin("spin", 0.5)});
  ASSERT_NE(ex, nullptr);
  std::vector<BubbleRecord> on, off;
  for (int block = 0; block < 4; ++block) {
    const bool harvesting = block % 2 == 1;
    ex->set_harvesting(harvesting);
    for (int i = 0; i < 4; ++i) {
      Bubble(*ex, 0, harvesting ? 0.012 : 0.004);
      for (const BubbleRecord& r : ex->TakeBubbleRecords()) (harvesting ? on : off).push_back(r);
    }
  }
  ASSERT_EQ(on.size(), 8u);
  EXPECT_NEAR(on[0].predicted_s, 0.004, 1e-9);  // borrowed from the plain blocks
  // From then on its own measurement (side work ended before the bubble did: nothing hid it);
  // the second harvesting block starts from what the first one learnt, not from the plain.
  for (size_t i = 1; i < on.size(); ++i) EXPECT_NEAR(on[i].predicted_s, 0.012, 1e-9) << i;
  // Nor do the harvesting blocks move the plain predictions.
  ASSERT_EQ(off.size(), 8u);
  EXPECT_LT(off[0].predicted_s, 0);  // first sight: measured
  for (size_t i = 1; i < off.size(); ++i) EXPECT_NEAR(off[i].predicted_s, 0.004, 1e-9) << i;
}

// A sum's bubble first seen long (20 ms, a slow first step), then 5 ms: side work that runs to
// the deadline cannot see the peers arrive, so the prediction must come down by itself and side
// work stop delaying the sum, while still filling most of the bubble.
TEST(SideTaskExecutorTest, ASumsBubbleIsLearntDownWhenSideWorkHidItsEnd) {
  auto ex = MakeExecutor({Spin("spin", 0.2)});
  ASSERT_NE(ex, nullptr);
  SumBubble(*ex, 0, 0.020, 0.0001);
  std::vector<double> late;
  for (int i = 0; i < 16; ++i) late.push_back(SumBubble(*ex, 0, 0.005, 0.0001));
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 17u);
  EXPECT_NEAR(records.back().predicted_s, 0.005, 0.0015);
  for (size_t i = 12; i < late.size(); ++i) EXPECT_LT(late[i], 0.0008) << i;  // ≤ ~a step
  double harvested = 0, measured = 0;
  for (size_t i = 12; i < records.size(); ++i) {
    harvested += records[i].harvested_s;
    measured += records[i].measured_s;
  }
  EXPECT_GT(harvested / measured, 0.6);
}

// A fill job joins a running executor: calibrated as it is added, offered bubbles by its
// priority among the tasks already there, and out of them once stopped.
TEST(SideTaskExecutorTest, ATaskAddedWhileRunningTakesItsPlaceByPriority) {
  auto ex = MakeExecutor({Spin("low", 1.0, 0)});
  ASSERT_NE(ex, nullptr);
  Bubble(*ex, 0, 0.030);  // measured
  absl::StatusOr<int> job = ex->AddTask(Spin("job", 1.0, 5), ResultsDir() + "/jobs/1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(*job, 1);
  EXPECT_EQ(ex->task_state(*job), TaskState::kLoaded);
  EXPECT_NEAR(ex->task_report(*job).standalone_step_s, 1e-3, 1e-9);  // calibrated
  EXPECT_TRUE(std::filesystem::is_directory(ResultsDir() + "/jobs/1/job_r0"));
  Bubble(*ex, 0, 0.030);
  EXPECT_GT(ex->task_report(*job).steps, 0);
  EXPECT_EQ(ex->task_report(0).steps, 0);  // the higher priority took the whole bubble
  ex->StopTask(*job);
  EXPECT_EQ(ex->task_state(*job), TaskState::kStopped);
  const int64_t job_steps = ex->task_report(*job).steps;
  Bubble(*ex, 0, 0.030);
  EXPECT_EQ(ex->task_report(*job).steps, job_steps);
  EXPECT_GT(ex->task_report(0).steps, 0);
  // An argument error is the job's own: returned, and nothing is left of it.
  SideTaskSpec bad = Spin("bad", -1.0);
  EXPECT_FALSE(ex->AddTask(bad, ResultsDir()).ok());
  EXPECT_EQ(ex->Report().tasks.size(), 2u);
}

TEST(SideTaskExecutorTest, TheLongestBubbleIsOneOfTheLastStep) {
  auto ex = MakeExecutor({});
  ASSERT_NE(ex, nullptr);
  EXPECT_EQ(ex->LongestPredictedBubble(), 0);
  // A step with bubbles at 0 and 5, the next (its schedule re-placed) at 0 and 3 only: the
  // 50 ms once measured at 5 is not a bubble any more.
  Bubble(*ex, 0, 0.002);
  Bubble(*ex, 5, 0.050);
  EXPECT_NEAR(ex->LongestPredictedBubble(), 0.050, 1e-12);
  Bubble(*ex, 0, 0.002);
  Bubble(*ex, 3, 0.004);
  EXPECT_NEAR(ex->LongestPredictedBubble(), 0.004, 1e-12);
}

// A stage's instructions for SetSchedule: "F" a forward, "R" the step's gradient sum, and
// BUBBLEs of a kind and a predicted duration (ms).
Instr Compute(Op op) {
  Instr in;
  in.op = op;
  return in;
}
Instr Planned(BubbleKind kind, double ms) {
  Instr in;
  in.op = Op::kBubble;
  in.bubble = kind;
  in.duration_ms = ms;
  return in;
}

// Step 1 already: the schedule's 30 ms is the first bubble's prediction, so side work fills
// it until the input lands at 20 ms; from then on the measurement corrects it. The memory the
// plan leaves free comes with the bubble.
TEST(SideTaskExecutorTest, TheSchedulesPredictionFillsTheFirstBubbleThenMeasurementCorrectsIt) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  ex->SetSchedule({Compute(Op::kForward), Planned(BubbleKind::kSteady, 30), Compute(Op::kForward)},
                  1e-3, int64_t{1} << 20);
  EXPECT_EQ(ex->free_bytes(1), int64_t{1} << 20);
  EXPECT_EQ(ex->free_bytes(0), -1);  // not a bubble
  // 1 ms steps until the input is found ready: at 20 ms, or after the step running then.
  EXPECT_NEAR(Bubble(*ex, 1, 0.020, /*ready_after_s=*/0.020), 0.0205, 0.0006);
  EXPECT_NEAR(ex->LongestPredictedBubble(), 0.020, 0.0011);
  Bubble(*ex, 1, 0.020, 0.020);
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NEAR(records[0].predicted_s, 0.030, 1e-12);
  EXPECT_GE(records[0].harvested_s, 0.020 - 1e-9);
  // Corrected: the measured 20 ms (less a step that ran past the input, if one did).
  EXPECT_NEAR(records[1].predicted_s, 0.0195, 0.0006);
  EXPECT_GT(records[1].harvested_s, 0.015);
}

// Uniform costs predict nothing (seconds_per_ms 0): the first bubble is measured, as without
// a schedule.
TEST(SideTaskExecutorTest, AScheduleWithoutTimesIsMeasuredFirst) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  ex->SetSchedule({Planned(BubbleKind::kWarmup, 2), Compute(Op::kForward)}, 0, -1);
  EXPECT_EQ(Bubble(*ex, 0, 0.030), 0);
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_LT(records[0].predicted_s, 0);
  EXPECT_EQ(ex->free_bytes(0), -1);
}

// Step 1's measured costs place the bubbles again: the steady bubble before the second
// forward moves from index 1 to index 2 and keeps what was measured of it (20 ms, not the new
// placement's 50), while the new warmup bubble starts from the schedule's figure.
TEST(SideTaskExecutorTest, ABubblePlacedAgainKeepsItsMeasurements) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  const Instr f = Compute(Op::kForward);
  ex->SetSchedule({f, Planned(BubbleKind::kSteady, 30), f, f}, 1e-3, -1);
  Bubble(*ex, 1, 0.020, 0.020);
  ex->SetSchedule({Planned(BubbleKind::kWarmup, 5), f, Planned(BubbleKind::kSteady, 50), f, f},
                  1e-3, -1);
  Bubble(*ex, 0, 0.004, 0.004);
  Bubble(*ex, 2, 0.020, 0.020);
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NEAR(records[1].predicted_s, 0.005, 1e-12);
  EXPECT_EQ(records[2].index, 2);
  EXPECT_NEAR(records[2].predicted_s, 0.020, 1e-9);
}

// Two BUBBLEs in a row (a cooldown, then the sum's sync): the stage waits only at the
// instruction after the second, so the first is never ended nor measured. It gets no figure
// of its own, so side work never runs on an uncorrected guess; the second, which is measured
// over the whole wait, predicts both spans.
TEST(SideTaskExecutorTest, BubblesInARowAreOneWaitPredictedByTheLast) {
  auto ex = MakeExecutor({Spin("spin", 1.0)});
  ASSERT_NE(ex, nullptr);
  ex->SetSchedule({Compute(Op::kBackward), Planned(BubbleKind::kCooldown, 4),
                   Planned(BubbleKind::kSync, 6), Compute(Op::kOptimizer)},
                  1e-3, -1);
  const double start = TestClock().Now();
  ex->OnBubble(Planned(BubbleKind::kCooldown, 4), 1, start, nullptr);  // never ended
  EXPECT_EQ(TestClock().Now(), start);  // no figure: nothing ran
  Bubble(*ex, 2, 0.010, 0.010);
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].index, 2);
  EXPECT_NEAR(records[0].predicted_s, 0.010, 1e-12);
  EXPECT_GT(records[0].harvested_s, 0);
}

// A sum's bubble the schedule predicts 30 ms that lasts 10: side work, which cannot poll a sum,
// runs to the schedule's deadline and delays the sum the first time; that first measurement
// hid the end, so the prediction comes down below it, and within a few steps side work stops
// delaying the sum.
TEST(SideTaskExecutorTest, ASumsBubbleTheScheduleOverpredictsIsLearntDown) {
  auto ex = MakeExecutor({Spin("spin", 0.2)});
  ASSERT_NE(ex, nullptr);
  ex->SetSchedule({Compute(Op::kBackward), Planned(BubbleKind::kCooldown, 30),
                   Compute(Op::kReduceGrads)},
                  1e-3, -1);
  std::vector<double> late;
  for (int i = 0; i < 16; ++i) late.push_back(SumBubble(*ex, 1, 0.010, 0.0001));
  EXPECT_GT(late[0], 0.015);  // to 27 ms, the schedule's less the margin
  const std::vector<BubbleRecord> records = ex->TakeBubbleRecords();
  ASSERT_EQ(records.size(), 16u);
  EXPECT_LT(records[1].predicted_s, 0.9 * records[0].measured_s + 1e-12);
  for (size_t i = 12; i < late.size(); ++i) EXPECT_LT(late[i], 0.0008) << i;
}

}  // namespace
}  // namespace freeride

namespace freeride {
namespace {

// Idle polling is not harvested work: a task that only waited for work in a bubble harvested
// none of it (no time, no steps, no timeline events); once it works, its steps count.
TEST(SideTaskExecutorTest, StepsThatOnlyWaitedAreNotHarvested) {
  SideTaskSpec spec{"test_waiting", "server", "", 0, 0, {{"idle_steps", int64_t{1000}}}};
  auto ex = MakeExecutor({spec});
  ASSERT_NE(ex, nullptr);
  Bubble(*ex, 0, 0.05);  // measured
  for (int i = 0; i < 5; ++i) Bubble(*ex, 0, 0.05);
  HarvestReport idle = ex->Report();
  EXPECT_EQ(idle.total_harvested_s(), 0.0);
  EXPECT_GT(idle.total_bubble_s(), 0.2);
  EXPECT_EQ(idle.tasks[0].steps, 0);
  EXPECT_EQ(idle.tasks[0].harvested_s, 0.0);
  EXPECT_TRUE(ex->events().empty());

  spec.args["idle_steps"] = int64_t{0};
  spec.name = "busy";
  auto busy = MakeExecutor({spec});
  ASSERT_NE(busy, nullptr);
  Bubble(*busy, 0, 0.05);
  Bubble(*busy, 0, 0.05);
  const HarvestReport worked = busy->Report();
  EXPECT_GT(worked.total_harvested_s(), 0.03);
  EXPECT_GT(worked.tasks[0].steps, 30);
  EXPECT_EQ(static_cast<int64_t>(busy->events().size()), worked.tasks[0].steps);
}

}  // namespace
}  // namespace freeride
