// Side work runs where it cannot take a core from training (issue 47): an in-process task's code
// on a side thread of its own in SCHED_IDLE, a worker process and a `command` program in
// SCHED_IDLE too, each read back from /proc; the training thread keeps its class. A step that
// outlives its bubble goes on at the idle class and a later bubble collects its work, while
// the rank returns to training when its input lands.
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/sched_class.h"
#include "core/timer.h"
#include "freeride/executor.h"
#include "freeride/side_task.h"
#include "freeride/side_thread.h"
#include "gtest/gtest.h"
#include "tests/freeride/synthetic_bubbles.h"

namespace freeride {
namespace {

using testing::BubblesUntil;

std::string SideClassResultsDir() {
  return (std::filesystem::path(::testing::TempDir()) / "side_class").string();
}

std::unique_ptr<SideTaskExecutor> MakeSideClassExecutor(const std::vector<SideTaskSpec>& specs) {
  ExecutorOptions options;
  options.results_dir = SideClassResultsDir();
  options.calibration_steps = 2;
  options.step_timeout_s = 30;  // far beyond any step here: only a hang reaches it
  auto ex = SideTaskExecutor::Create(specs, options);
  EXPECT_TRUE(ex.ok()) << ex.status();
  return ex.ok() ? *std::move(ex) : nullptr;
}

SideTaskSpec Misbehave(const std::string& name, const std::string& isolation, double step_ms) {
  SideTaskSpec spec{"misbehave", name, FREERIDE_MISBEHAVE_PLUGIN, 0, 0,
                    {{"mode", std::string("ok")}, {"step_ms", step_ms}}};
  spec.isolation = isolation;
  return spec;
}

// A latency-sensitive task with requests always waiting; each step spins `step_ms` of real time
// and records the policy of its thread as it begins and as it ends.
struct Probe {
  std::atomic<int> steps{0};
  std::atomic<int> first_policy{-1}, last_start_policy{-1}, last_end_policy{-1};
  std::atomic<int> ends_lowered{0};    // steps that ended at the idle class
  std::atomic<int> ends_unlowered{0};  // steps that began above the idle class and ended there
};
Probe& TheProbe() {
  static Probe probe;
  return probe;
}
class ProbeServer : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    absl::StatusOr<double> step = ArgReader(ctx.name, *ctx.args).Number("step_ms", 1, 0.01, 1e3);
    if (!step.ok()) return step.status();
    step_s_ = *step / 1e3;
    return absl::OkStatus();
  }
  absl::StatusOr<double> Step(SideTaskContext&) override {
    Probe& p = TheProbe();
    const int start = sched_getscheduler(0);
    if (p.steps.fetch_add(1) == 0) p.first_policy = start;
    p.last_start_policy = start;
    const double until = MonotonicSeconds() + step_s_;
    while (MonotonicSeconds() < until) {
    }
    p.last_end_policy = sched_getscheduler(0);
    if (p.last_end_policy == SCHED_IDLE) p.ends_lowered += 1;
    if (start != SCHED_IDLE && p.last_end_policy == start) p.ends_unlowered += 1;
    return 1.0;
  }
  bool LatencySensitive() const override { return true; }
  bool HasPendingWork() const override { return true; }

 private:
  double step_s_ = 1e-3;
};
FREERIDE_REGISTER_SIDE_TASK(ProbeServer, "class_probe_server");

TEST(SchedClassTest, ALatencySensitiveStepRunsAtTheCallersClassUntilItOutlivesItsBubble) {
  // A client waits on each step: inside the bubble it takes the rank's own share (the training
  // thread is waiting), and a step still running at the bubble's end goes on at the idle class.
  const absl::StatusOr<ThreadSched> here = ReadThreadSched(getpid(), CurrentThreadId());
  ASSERT_TRUE(here.ok());
  SideTaskSpec spec{"class_probe_server", "probe", "", 0, 0, {{"step_ms", 0.5}}};
  auto ex = MakeSideClassExecutor({spec});
  ASSERT_NE(ex, nullptr);
  Probe& p = TheProbe();
  // 0.5 ms steps in 10 ms bubbles end where they started. Not every one: a host busy enough to
  // keep the step's thread off a core past its bubble lowers that step, as it should, so the
  // bubbles go on until three steps have ended in theirs (on a quiet host, the first three).
  const int fitted = p.ends_unlowered;
  EXPECT_TRUE(
      BubblesUntil(*ex, 0.010, 0.010, 2000, [&] { return p.ends_unlowered >= fitted + 3; }));
  EXPECT_EQ(p.last_start_policy, here->policy);
  ex->Finish();

  // 40 ms steps in bubbles whose input lands after 2 ms: each outlives its bubble.
  spec.args = {{"step_ms", 40.0}};
  ex = MakeSideClassExecutor({spec});
  ASSERT_NE(ex, nullptr);
  const int lowered = p.ends_lowered;
  EXPECT_TRUE(BubblesUntil(*ex, 0.002, 0.002, 5000, [&] { return p.ends_lowered >= lowered + 2; }));
  EXPECT_EQ(p.last_start_policy, here->policy);  // a fresh thread for each step
  ex->Finish();
}

TEST(SchedClassTest, ASideThreadIsInTheIdleClassAndTheCallerKeepsItsOwn) {
  const absl::StatusOr<ThreadSched> before = ReadThreadSched(getpid(), CurrentThreadId());
  ASSERT_TRUE(before.ok()) << before.status();
  SideThread side;
  EXPECT_EQ(side.sched_class(), SchedClass::kIdle) << SchedClassName(side.sched_class());
  const absl::StatusOr<ThreadSched> read = ReadThreadSched(getpid(), side.tid());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->policy, SCHED_IDLE);
  EXPECT_EQ(read->sched_class(), side.sched_class());
  // What runs there runs at that class; the thread that started it is untouched.
  int policy_there = -1;
  side.Start([&] { policy_there = sched_getscheduler(0); });
  while (!side.WaitFor(1.0)) {
  }
  EXPECT_EQ(policy_there, SCHED_IDLE);
  const absl::StatusOr<ThreadSched> after = ReadThreadSched(getpid(), CurrentThreadId());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->policy, before->policy);
  EXPECT_EQ(after->nice, before->nice);
  EXPECT_NE(after->policy, SCHED_IDLE);
}

TEST(SchedClassTest, ACallLeftRunningOutlivesItsHandle) {
  // A hung task's thread is left to end on its own: what its call holds stays alive.
  auto flag = std::make_shared<std::atomic<bool>>(false);
  {
    SideThread side;
    side.Start([flag] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      flag->store(true);
    });
    EXPECT_TRUE(side.busy());
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!flag->load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(flag->load());
}

// The policy and nice value a misbehave task's summary reports ("policy P nice N").
std::pair<int, int> PolicyOf(const TaskReport& t) {
  int policy = -1, nice = 0;
  const size_t at = t.summary.find("policy ");
  if (at != std::string::npos) sscanf(t.summary.c_str() + at, "policy %d nice %d", &policy, &nice);
  return {policy, nice};
}

// The same of its first step, a calibration step ("first step: P nice N").
std::pair<int, int> FirstStepPolicyOf(const TaskReport& t) {
  int policy = -1, nice = 0;
  const size_t at = t.summary.find("first step: ");
  if (at != std::string::npos) sscanf(t.summary.c_str() + at, "first step: %d nice %d", &policy, &nice);
  return {policy, nice};
}

TEST(SchedClassTest, InProcessAndWorkerTasksRunInTheIdleClass) {
  auto ex = MakeSideClassExecutor(
      {Misbehave("inprocess", "inprocess", 0.5), Misbehave("worker", "process", 0.5)});
  ASSERT_NE(ex, nullptr);
  EXPECT_TRUE(BubblesUntil(*ex, 0.010, 0.010, 2000, [&] {
    const HarvestReport r = ex->Report();
    return r.tasks[0].steps > 2 && r.tasks[1].steps > 2;
  }));
  ex->Finish();  // a worker's summary comes with its unload
  const HarvestReport r = ex->Report();
  for (const TaskReport& t : r.tasks) {
    EXPECT_EQ(PolicyOf(t).first, SCHED_IDLE) << t.name << ": " << t.summary;
  }
  const absl::StatusOr<ThreadSched> here = ReadThreadSched(getpid(), CurrentThreadId());
  ASSERT_TRUE(here.ok());
  EXPECT_NE(here->policy, SCHED_IDLE);  // the rank's own thread ran none of it
}

TEST(SchedClassTest, CalibrationStepsRunAtTheCallersClass) {
  // Training waits for a calibration step whatever it costs (before it starts, or at the step
  // boundary that admits a fill job): at the idle class it would last as long as every other
  // process kept the cores busy, and its time would price the task at that. In process and in
  // a worker, the steps measured alone run at the caller's class, and those in bubbles at the
  // idle class.
  auto ex = MakeSideClassExecutor(
      {Misbehave("alone", "inprocess", 0.5), Misbehave("alone_worker", "process", 0.5)});
  ASSERT_NE(ex, nullptr);
  const TaskReport calibrated = ex->Report().tasks[0];
  EXPECT_EQ(calibrated.state, "LOADED");
  EXPECT_EQ(calibrated.steps, 0);  // calibration steps are not the task's harvested steps
  const absl::StatusOr<ThreadSched> here = ReadThreadSched(getpid(), CurrentThreadId());
  ASSERT_TRUE(here.ok());
  const std::pair<int, int> callers = {here->policy, here->nice};
  EXPECT_EQ(PolicyOf(calibrated), callers) << calibrated.summary;
  EXPECT_TRUE(BubblesUntil(*ex, 0.010, 0.010, 2000, [&] {
    const HarvestReport r = ex->Report();
    return r.tasks[0].steps > 0 && r.tasks[1].steps > 0;
  }));
  ex->Finish();  // a worker's summary comes with its unload
  for (const TaskReport& t : ex->Report().tasks) {
    EXPECT_EQ(FirstStepPolicyOf(t), callers) << t.name << ": " << t.summary;
    EXPECT_EQ(PolicyOf(t).first, SCHED_IDLE) << t.name << ": " << t.summary;
  }
}

TEST(SchedClassTest, ACommandsProgramRunsInTheIdleClass) {
  const std::filesystem::path stat_file =
      std::filesystem::path(SideClassResultsDir()) / "cmd_r0" / "stat";
  std::filesystem::remove(stat_file);
  SideTaskSpec command{
      "command", "cmd", "", 0, 0,
      {{"argv", std::vector<std::string>{
                    "sh", "-c", "cat /proc/self/stat > stat.tmp && mv stat.tmp stat; sleep 1000"}}}};
  auto ex = MakeSideClassExecutor({command});
  ASSERT_NE(ex, nullptr);
  // The program runs only inside bubbles: more of them until it has written its line.
  EXPECT_TRUE(
      BubblesUntil(*ex, 0.005, 0.005, 20000, [&] { return std::filesystem::exists(stat_file); }));
  std::ifstream in(stat_file);
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const absl::StatusOr<ThreadSched> read = ParseProcStat(stat);
  ASSERT_TRUE(read.ok()) << read.status() << ": " << stat;
  EXPECT_EQ(read->policy, SCHED_IDLE) << stat;
}

TEST(SchedClassTest, AStepOutlivingItsBubbleGoesOnAndALaterBubbleCollectsIt) {
  // 40 ms steps in bubbles whose input lands after 2 ms: the rank goes back to training at the
  // input (it never waits for the step), and the steps still end and count.
  auto ex = MakeSideClassExecutor({Misbehave("long", "inprocess", 40.0)});
  ASSERT_NE(ex, nullptr);
  EXPECT_TRUE(BubblesUntil(*ex, 0.002, 0.002, 5000, [&] {
    const TaskReport t = ex->Report().tasks[0];
    return t.steps >= 3 && t.pauses >= 3;
  }));
  const TaskReport t = ex->Report().tasks[0];
  EXPECT_EQ(t.state, "LOADED");
  EXPECT_GE(t.units, 3.0);
  EXPECT_EQ(t.overruns, 0);  // nothing held the rank past its input: no in-process overrun
  ex->Finish();
  EXPECT_EQ(ex->Report().tasks[0].state, "STOPPED");
}

}  // namespace
}  // namespace freeride
