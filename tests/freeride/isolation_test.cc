// Process isolation and hard deadlines (issue 17), with synthetic bubbles: a worker's crash,
// abort, exit, exception, hang or memory overrun fails that task alone with its reason; a step
// still running at the bubble's end is paused there and resumed later; a bubble whose input
// cannot be polled ends at its deadline whatever runs in it; in-process overruns demote, then
// fail, a task, and a demotion lifts once its steps fit again; no process a task started
// outlives it.
//
// Deadlines, demotion and hangs are tested on simulated time (exact, under any load). A worker's
// own work runs on real time, so the tests where its steps must end (a worker's reports, pauses
// and resumes, failures) give it bubbles until what they check has happened, up to a cap far
// beyond what an idle machine needs, and assert no duration: how fast the rank gets back from a
// paused worker is measured in bench/side_switch_bench.cc.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/child_process.h"
#include "core/clock.h"
#include "freeride/executor.h"
#include "freeride/worker_protocol.h"
#include "gtest/gtest.h"
#include "tests/freeride/synthetic_bubbles.h"

namespace freeride {
namespace {

using testing::Bubble;
using testing::BubblesUntil;

// A worker's start, create and load have step_timeout_s of real time: 30 s is far more than they
// take even on a loaded machine (tens of ms), and only a hang reaches it.
std::unique_ptr<SideTaskExecutor> MakeIsolatedExecutor(const std::vector<SideTaskSpec>& specs,
                                                       double step_timeout_s = 30.0,
                                                       Clock* clock = nullptr) {
  ExecutorOptions options;
  options.clock = clock;
  options.results_dir = (std::filesystem::path(::testing::TempDir()) / "isolation").string();
  options.margin = 0.1;
  options.calibration_steps = 2;
  options.step_timeout_s = step_timeout_s;
  auto ex = SideTaskExecutor::Create(specs, options);
  EXPECT_TRUE(ex.ok()) << ex.status();
  return ex.ok() ? *std::move(ex) : nullptr;
}

SideTaskSpec Misbehave(const std::string& name, const std::string& mode, int64_t after = 0,
                       const std::string& isolation = "process") {
  SideTaskSpec spec{"misbehave", name, FREERIDE_MISBEHAVE_PLUGIN, 0, 0,
                    {{"mode", mode}, {"after", after}}};
  spec.isolation = isolation;
  return spec;
}

SideTaskSpec Spin(const std::string& name, double step_ms, const std::string& isolation) {
  SideTaskSpec spec{"spin", name, "", 0, 0, {{"step_ms", step_ms}}};
  spec.isolation = isolation;
  return spec;
}

std::map<std::string, TaskReport> ByName(const HarvestReport& r) {
  std::map<std::string, TaskReport> out;
  for (const TaskReport& t : r.tasks) out[t.name] = t;
  return out;
}

// Whether `pid` is gone: no such process, or a zombie that nobody has reaped yet (in a
// container, init may not reap at once).
bool Gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

TEST(WorkerProtocolTest, SpecsRoundTrip) {
  WorkerSpec spec;
  spec.task = SideTaskSpec{"pagerank", "pr \"x\"", "/a b/p.so", 3, 1 << 20,
                           {{"b", true}, {"i", int64_t{-4}}, {"d", 0.25}, {"s", std::string("q\"\n")},
                            {"li", std::vector<int64_t>{1, 2}}, {"ld", std::vector<double>{0.5}},
                            {"ls", std::vector<std::string>{"sh", "-c", "x y"}}}};
  spec.rank = 5;
  spec.stage = 2;
  spec.results_dir = "/tmp/r";
  absl::StatusOr<WorkerSpec> back = DecodeWorkerSpec(EncodeWorkerSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->task.type, spec.task.type);
  EXPECT_EQ(back->task.name, spec.task.name);
  EXPECT_EQ(back->task.plugin, spec.task.plugin);
  EXPECT_EQ(back->task.memory_limit_bytes, spec.task.memory_limit_bytes);
  EXPECT_EQ(back->task.args, spec.task.args);
  EXPECT_EQ(back->rank, 5);
  EXPECT_EQ(back->stage, 2);
  EXPECT_EQ(back->results_dir, "/tmp/r");
  EXPECT_FALSE(back->task.repeat);
  spec.task.repeat = true;
  back = DecodeWorkerSpec(EncodeWorkerSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->task.repeat);
  // Quotes that a TOML literal string cannot hold, a byte-order mark, tabs and DEL (toml++'s own
  // writer chose a multi-line literal string for the first and could not read it back).
  spec.task.plugin =
      "ap\n\n\xEF\xBB\xBF\n[\nt\n\n\n\n\n\n\nt=''''' \"' 'p'' \n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n"
      "\t\t\t\"pager\nk\"\nn'p'amk = x\"\n\n";
  spec.task.name = "'''\x7f";
  back = DecodeWorkerSpec(EncodeWorkerSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << EncodeWorkerSpec(spec);
  EXPECT_EQ(back->task.plugin, spec.task.plugin);
  EXPECT_EQ(back->task.name, spec.task.name);
}

// A field of the wrong type is refused by name, never converted: a float rank past int64_t's
// range was an undefined cast inside toml++ (found by fuzz_worker_spec).
TEST(WorkerProtocolTest, FieldsOfTheWrongTypeAreRefusedByName) {
  for (const auto& [text, refusal] : std::vector<std::pair<std::string, std::string>>{
           {"type = \"x\"\nrank = 1e69\n", "worker spec: rank: not an integer"},
           {"type = \"x\"\nstage = 2.0\n", "worker spec: stage: not an integer"},
           {"type = \"x\"\nrank = 4294967296\n", "worker spec: rank: 4294967296 is out of range"},
           {"type = \"x\"\nmemory_limit = \"1\"\n", "worker spec: memory_limit: not an integer"},
           {"type = 3\n", "worker spec: type: not a string"},
           {"type = \"x\"\nrepeat = 1\n", "worker spec: repeat: not a boolean"}}) {
    absl::StatusOr<WorkerSpec> spec = DecodeWorkerSpec(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().message(), refusal) << text;
  }
}

// A task that is done restarts (repeat) in its next step, in either host, and keeps the bubbles
// busy; without repeat it finishes and the bubbles stay empty.
TEST(IsolationTest, ARepeatingTaskRestartsInsteadOfFinishing) {
  for (const std::string isolation : {"inprocess", "process"}) {
    SideTaskSpec repeating = Spin("repeating", 1.0, isolation);
    repeating.args["steps"] = int64_t{3};
    repeating.repeat = true;
    SideTaskSpec once = Spin("once", 1.0, isolation);
    once.args["steps"] = int64_t{3};
    for (const SideTaskSpec& spec : {repeating, once}) {
      auto ex = MakeIsolatedExecutor({spec});
      ASSERT_NE(ex, nullptr);
      // 8 bubbles, or (a worker on a loaded machine) as many as three restarts take.
      for (int i = 0; i < 8; ++i) Bubble(*ex, 0.030);
      if (spec.repeat) {
        BubblesUntil(*ex, 0.030, -1, 400, [&] { return ex->Report().tasks[0].restarts >= 3; });
      }
      const TaskReport t = ex->Report().tasks[0];
      if (spec.repeat) {
        EXPECT_EQ(t.state, "LOADED") << isolation;
        EXPECT_GE(t.restarts, 3) << isolation;
        EXPECT_GT(t.units, 3 * t.restarts - 2) << isolation;  // 3 spins per start, 2 calibrating
        // The bubbles kept busy: at least a fifth of the first 8 × 30 ms. What counts is the
        // time the rank gave the task, which a slow machine does not shorten.
        EXPECT_GT(ex->Report().total_harvested_s(), 0.05) << isolation;
      } else {
        EXPECT_EQ(t.state, "FINISHED") << isolation;
        EXPECT_EQ(t.restarts, 0);
        EXPECT_EQ(t.units, 1) << isolation;  // what calibration left
      }
    }
  }
}

TEST(IsolationTest, AWorkerRunsTheTaskAndReportsItsWork) {
  auto ex = MakeIsolatedExecutor({Spin("spin", 1.0, "process")});
  ASSERT_NE(ex, nullptr);
  for (int i = 0; i < 6; ++i) Bubble(*ex, 0.030);
  EXPECT_TRUE(BubblesUntil(*ex, 0.030, -1, 500, [&] { return ex->Report().tasks[0].steps > 10; }));
  // The rank waits on its worker from a bubble's start until the input lands: what it counts as
  // harvested is most of each bubble, however slowly the worker got through its steps.
  const HarvestReport r = ex->Report();
  const double util = r.total_harvested_s() / r.total_bubble_s();
  EXPECT_GT(util, 0.5) << r.total_harvested_s() << " of " << r.total_bubble_s();
  ex->Finish();
  const TaskReport t = ex->Report().tasks[0];
  EXPECT_EQ(t.state, "STOPPED");
  EXPECT_EQ(t.isolation, "process");
  EXPECT_GT(t.steps, 10);
  EXPECT_NE(t.summary.find("spins"), std::string::npos) << t.summary;  // from the worker
  EXPECT_GT(t.memory_peak_bytes, 0);
  // What that peak is, and that no cap applied to it.
  EXPECT_EQ(t.memory_peak_note,
            "the worker process's peak resident set, its code and libraries included; no "
            "memory_limit: no cap");
}

TEST(IsolationTest, EveryFailureStaysWithItsTask) {
  SideTaskSpec over_cap = Spin("over_cap", 1.0, "process");
  over_cap.memory_limit_bytes = 1 << 20;
  over_cap.args["memory"] = int64_t{8} << 20;  // asks for more than its cap at load
  SideTaskSpec hog = Misbehave("hog", "hog");
  hog.memory_limit_bytes = 32 << 20;
  auto ex =
      MakeIsolatedExecutor({Misbehave("segfault", "segfault", 3), Misbehave("abort", "abort", 3),
                            Misbehave("exit", "exit", 3), Misbehave("throw", "throw", 3),
                            Misbehave("throw_inprocess", "throw", 3, "inprocess"), hog, over_cap,
                            Spin("healthy", 1.0, "process")});
  ASSERT_NE(ex, nullptr);
  // Until the seven have failed (each after its third step), and the healthy one has run.
  BubblesUntil(*ex, 0.030, -1, 400, [&] {
    auto t = ByName(ex->Report());
    int failed = 0;
    for (const auto& [name, report] : t) failed += report.state == "FAILED";
    return failed == 7 && t["healthy"].steps > 0;
  });
  auto tasks = ByName(ex->Report());
  auto expect_failed = [&](const std::string& name, const std::string& reason) {
    EXPECT_EQ(tasks[name].state, "FAILED") << name;
    EXPECT_NE(tasks[name].reason.find(reason), std::string::npos)
        << name << ": " << tasks[name].reason;
  };
  expect_failed("segfault", "was killed by signal 11 (SIGSEGV");
  expect_failed("abort", "was killed by signal 6 (SIGABRT");
  expect_failed("exit", "exited with status 7");
  expect_failed("throw", "threw misbehave: thrown on purpose");
  expect_failed("throw_inprocess", "threw misbehave: thrown on purpose");
  expect_failed("hog", "exceeded its memory limit of 32.0 MiB");
  expect_failed("over_cap", "load: spin working memory");
  EXPECT_EQ(tasks["healthy"].state, "LOADED");
  EXPECT_GT(tasks["healthy"].steps, 0);
  // The report says how each cap applied: the worker's data segment, the in-process arena.
  EXPECT_NE(tasks["hog"].memory_peak_note.find("its data segment capped at "), std::string::npos)
      << tasks["hog"].memory_peak_note;
  EXPECT_NE(tasks["hog"].memory_peak_note.find(", memory_limit 32.0 MiB and 16.0 MiB for its "
                                               "runtime"),
            std::string::npos)
      << tasks["hog"].memory_peak_note;
  EXPECT_EQ(tasks["throw_inprocess"].memory_peak_note,
            "what ctx.arena handed out; no memory_limit: no cap");
}

TEST(IsolationTest, AStepRunningAtTheBubblesEndIsPausedThenResumed) {
  // 25 ms steps in 10 ms bubbles whose input arrives after 8 ms: every step spans bubbles.
  SideTaskSpec slow = Misbehave("slow", "ok");
  slow.args["step_ms"] = 25.0;
  auto ex = MakeIsolatedExecutor({slow});
  ASSERT_NE(ex, nullptr);
  // A step cannot end inside one bubble unless the rank itself is held off the CPU for most of
  // a step, so pauses come with nearly every step; 20 × ~8 ms of bubble make several steps on
  // an idle machine, a loaded one takes more bubbles.
  EXPECT_TRUE(BubblesUntil(*ex, 0.010, 0.008, 400, [&] {
    const TaskReport t = ex->Report().tasks[0];
    return t.pauses > 10 && t.steps >= 3;
  }));
  // No more than that: how many pauses a step takes depends on how the machine shares its
  // cores between the rank and the worker (a loaded one held the rank off the CPU for whole
  // steps: 18 steps, 11 pauses, once under flake_check.sh).
  EXPECT_EQ(ex->Report().tasks[0].state, "LOADED");
}

TEST(IsolationTest, ABubbleThatCannotBePolledEndsAtItsDeadline) {
  // A command that ignores SIGTERM and never ends, in bubbles ending at a sum (no poll): the
  // rank is handed back at the predicted end less the margin, every time.
  // The command writes its pid into its working directory (the task's results directory): the
  // test follows that process, not a command line. The pid as this process sees it: `$$` is
  // its PID namespace's, /proc the machine's (cut's parent in its /proc/self/stat).
  const std::filesystem::path pid_file =
      std::filesystem::path(::testing::TempDir()) / "isolation" / "busy_r0" / "pid";
  std::filesystem::remove(pid_file);
  SideTaskSpec command{
      "command", "busy", "", 0, 0,
      {{"argv", std::vector<std::string>{
                    "sh", "-c",
                    "cut -d' ' -f4 /proc/self/stat > pid; trap '' TERM; while :; do :; done"}}}};
  command.isolation = "process";
  SideTaskSpec hung = Misbehave("hung", "hang", 2);
  pid_t pid = -1;
  {
    // On simulated time: neither task ever ends a step by itself, so what decides is the clock.
    SimulatedClock clock;
    auto ex = MakeIsolatedExecutor({command, hung}, /*step_timeout_s=*/0.15, &clock);
    ASSERT_NE(ex, nullptr);
    Bubble(*ex, 0.020, -1, /*pollable=*/false, 0, clock);
    double worst_held = 0;
    for (int i = 0; i < 30; ++i) {
      worst_held = std::max(worst_held, Bubble(*ex, 0.020, -1, /*pollable=*/false, 0, clock));
    }
    EXPECT_LE(worst_held, 0.020 * (1 - 0.1) + 1e-9);  // the predicted end less the margin
    auto tasks = ByName(ex->Report());
    EXPECT_EQ(tasks["busy"].state, "LOADED");
    EXPECT_GT(tasks["busy"].harvested_s, 0.1);
    EXPECT_EQ(tasks["hung"].state, "FAILED");
    EXPECT_NE(tasks["hung"].reason.find("hung"), std::string::npos) << tasks["hung"].reason;
    // The command runs only inside bubbles; more of them until it has written its line (the
    // first ones, unless the machine kept the shell off the CPU).
    auto written = [&] {
      std::ifstream in(pid_file);
      return static_cast<bool>(in >> pid);
    };
    for (int i = 0; i < 20000 && !written(); ++i) Bubble(*ex, 0.020, -1, false, 0, clock);
    ASSERT_TRUE(written());
    EXPECT_FALSE(Gone(pid));
  }
  // The executor's end killed the command's supervisor, and with it the command (the kernel
  // ends a PID namespace with its init): gone at once, up to a cap for a loaded machine.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!Gone(pid) && std::chrono::steady_clock::now() < give_up) usleep(1000);
  EXPECT_TRUE(Gone(pid));
}

TEST(IsolationTest, InProcessOverrunsDemoteThenFailTheTask) {
  // Steps of 1 ms in calibration, then 30, 60, 120, 240 ms: each overruns its bubble.
  SideTaskSpec slow = Misbehave("slow", "slow", 2, "inprocess");
  slow.args["slow_ms"] = 30.0;
  slow.args["growth"] = 2.0;
  ExecutorOptions options;
  options.results_dir = (std::filesystem::path(::testing::TempDir()) / "isolation").string();
  options.calibration_steps = 2;
  options.demote_after = 2;
  SimulatedClock clock;  // the steps take exactly their time
  options.clock = &clock;
  auto made = SideTaskExecutor::Create({slow, Spin("steady", 1.0, "inprocess")}, options);
  ASSERT_TRUE(made.ok()) << made.status();
  SideTaskExecutor& ex = **made;
  for (int i = 0; i < 12; ++i) Bubble(ex, 0.020, -1, /*pollable=*/false, 0, clock);
  auto tasks = ByName(ex.Report());
  // Two overruns (30 and 60 ms in 20 ms bubbles) demoted it: its worst step fits no bubble here.
  EXPECT_EQ(tasks["slow"].overruns, 2);
  EXPECT_EQ(tasks["slow"].state, "LOADED");
  const int64_t steps_when_demoted = tasks["slow"].steps;
  for (int i = 0; i < 6; ++i) Bubble(ex, 0.020, -1, /*pollable=*/false, 0, clock);
  EXPECT_EQ(ByName(ex.Report())["slow"].steps, steps_when_demoted);
  // Alone, in 300 ms bubbles, its worst step fits again: 120 ms ends in time, 240 and 480 ms
  // overrun.
  ex.set_active_tasks({"slow"});
  for (int i = 0; i < 5; ++i) Bubble(ex, 0.300, -1, /*pollable=*/false, /*index=*/1, clock);
  tasks = ByName(ex.Report());
  EXPECT_EQ(tasks["slow"].state, "FAILED");
  EXPECT_NE(tasks["slow"].reason.find("overran their bubbles 4 times"), std::string::npos)
      << tasks["slow"].reason;
  EXPECT_GT(tasks["steady"].steps, 0);  // it kept the bubbles while "slow" was demoted
}

TEST(IsolationTest, ADemotionLiftsOnceStepsFitAgain) {
  // Steps of 1 ms in calibration, then two of 30 ms (a burst: each overruns a 20 ms bubble),
  // then 1 ms ones again.
  SideTaskSpec burst = Misbehave("burst", "slow", 2, "inprocess");
  burst.args["slow_ms"] = 30.0;
  burst.args["slow_steps"] = int64_t{2};
  ExecutorOptions options;
  options.results_dir = (std::filesystem::path(::testing::TempDir()) / "isolation").string();
  options.calibration_steps = 2;
  options.demote_after = 2;
  SimulatedClock clock;  // the steps take exactly their time
  options.clock = &clock;
  auto made = SideTaskExecutor::Create({burst, Spin("steady", 1.0, "inprocess")}, options);
  ASSERT_TRUE(made.ok()) << made.status();
  SideTaskExecutor& ex = **made;
  auto bubbles = [&](int n) {
    for (int i = 0; i < n; ++i) Bubble(ex, 0.020, -1, /*pollable=*/false, 0, clock);
    return ByName(ex.Report());
  };
  // The two overruns demoted it: beside a task that fills every bubble, it gets no step.
  auto tasks = bubbles(12);
  EXPECT_EQ(tasks["burst"].overruns, 2);
  const int64_t steps_when_demoted = tasks["burst"].steps;
  EXPECT_EQ(bubbles(6)["burst"].steps, steps_when_demoted);
  // Alone, its worst step decays each bubble it is passed over, until a bubble takes a step;
  // `demote_after` steps that fit lift the demotion.
  ex.set_active_tasks({"burst"});
  tasks = bubbles(12);
  EXPECT_GT(tasks["burst"].steps, steps_when_demoted + options.demote_after);
  EXPECT_EQ(tasks["burst"].overruns, 2);  // none since
  // Restored: it shares the bubbles with the other task again.
  ex.set_active_tasks({"burst", "steady"});
  const int64_t steps_restored = tasks["burst"].steps;
  tasks = bubbles(6);
  EXPECT_GT(tasks["burst"].steps, steps_restored + 6);
  EXPECT_EQ(tasks["burst"].state, "LOADED");
  EXPECT_EQ(tasks["burst"].overruns, 2);
}

TEST(ChildProcessTest, AChildDiesWithTheProcessThatStartedIt) {
  // The process in the middle starts the child and tells its pid through a pipe; the test
  // then kills the middle one as mpirun kills a rank (no handler, no destructor) and watches
  // that pid. Whatever happens, the guard kills both and the child's group.
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    close(pipe_fds[0]);
    ChildOptions options;
    // The shell forks `sleep` (a grandchild) and waits; the shell must go by PR_SET_PDEATHSIG.
    options.argv = {"sh", "-c", "trap '' TERM; while :; do sleep 1; done"};
    auto child = ChildProcess::Start(options);
    const pid_t pid = child.ok() ? child->pid() : -1;
    if (write(pipe_fds[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(1);
    pause();  // killed below
    _exit(0);
  }
  close(pipe_fds[1]);
  pid_t child = -1;
  const ssize_t got = read(pipe_fds[0], &child, sizeof(child));
  close(pipe_fds[0]);
  struct Guard {
    pid_t middle, child;
    ~Guard() {
      kill(middle, SIGKILL);
      waitpid(middle, nullptr, 0);
      if (child > 0 && !Gone(child)) kill(-child, SIGKILL);  // it leads its own group
    }
  } guard{middle, child};
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(child)));
  ASSERT_GT(child, 0);
  EXPECT_FALSE(Gone(child));
  kill(middle, SIGKILL);
  waitpid(middle, nullptr, 0);
  // The kernel sends the signal as the middle process exits; the child's end follows at once.
  // 60 s is a cap for a machine under any load, never a figure this waits for.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!Gone(child) && std::chrono::steady_clock::now() < give_up) usleep(1000);
  EXPECT_TRUE(Gone(child));
}

TEST(ChildProcessTest, EndsAreDescribed) {
  ChildOptions options;
  options.argv = {"sh", "-c", "kill -SEGV $$"};
  auto child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok());
  while (!child->Ended()) usleep(1000);
  EXPECT_EQ(child->EndDescription(), "was killed by signal 11 (SIGSEGV: Segmentation fault)");
  options.argv = {"freeride-no-such-program"};
  child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok());
  while (!child->Ended()) usleep(1000);
  EXPECT_EQ(child->EndDescription(), "exited with status 127 (program not found)");
}

TEST(ChildProcessTest, TheDataCapHolds) {
  ChildOptions options;
  // Python-free: dd into a pipe keeps its buffer small; `head -c` of /dev/zero into a shell
  // variable grows the shell's heap.
  options.argv = {"sh", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo ${#x}"};
  options.data_limit_bytes = 16 << 20;
  auto child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok());
  while (!child->Ended()) usleep(1000);
  EXPECT_FALSE(child->EndedCleanly()) << child->EndDescription();
}

}  // namespace
}  // namespace freeride
