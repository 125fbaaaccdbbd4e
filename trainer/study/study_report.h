// What a harvest study measured, turned into figures with intervals (trainer/study_stats.h) and
// written as study.md and study.json (trainer/study/study.h runs the blocks).
#pragma once

#include <string>
#include <vector>

#include "freeride/executor.h"
#include "trainer/config/config.h"
#include "trainer/study/study.h"
#include "trainer/study_stats.h"

namespace freeride {

inline constexpr int kAlone = 0;  // the plain blocks between arms
inline constexpr int kAA = 1;     // training alone measured as an arm: the noise floor

struct Arm {
  std::string name;
  std::vector<std::string> tasks;  // active side tasks; none for training alone and A/A
  std::vector<int> task_index;     // their places in config.side_tasks
};

inline std::string TaskName(const SideTaskConfig& t) { return t.name.empty() ? t.type : t.name; }

// One measured block: its mean step, and (summed over ranks) the bubble, harvested and overrun
// seconds, the side work in seconds of the tasks alone, and each config task's units.
struct BlockRecord {
  int arm = 0;
  double step_s = 0;
  double bubble = 0, harvested = 0, overrun = 0, work = 0;
  std::vector<double> units;
  std::vector<double> stage_bubble;  // per stage (replicas summed): what a refusal names
};

// What a refusal says about an arm whose tasks did no work: the stages whose bubbles this
// study measures (an emulating process measures one), and per config.side_tasks entry its
// stages (empty: every stage), its step alone (0: unknown) and its state where it ended
// ("FINISHED", "FAILED: reason"; empty while it can still work).
struct RefusalFacts {
  std::vector<int> measured_stages;
  std::vector<std::vector<int64_t>> task_stages;
  std::vector<double> task_step_s;
  std::vector<std::string> task_ended;
};

struct ArmFigures {
  int64_t steps = 0, blocks = 0;
  double step_s = 0;  // mean step
  double bubble = 0, harvested = 0, overrun = 0;
  Estimate overhead, utilisation, reclaimed;
  std::string refused;  // why the arm's figures say nothing (a task did no work in a block)
};

// Per arm, from the measured blocks in order. `device_ranks` stages count in reclaimed's
// device-seconds; `facts` say why a refused arm's tasks did no work.
std::vector<ArmFigures> Figures(const std::vector<Arm>& arms,
                                const std::vector<BlockRecord>& blocks, int block_steps,
                                int device_ranks, const RefusalFacts& facts);

// "0 µs", "850 µs", "1.20 ms", "2.50 s": a bubble or a step in the unit a person reads.
std::string HumanSeconds(double seconds);

// The arms (A/A and task arms, refused ones left out) whose overhead interval is wider than
// ±target, or unknown.
std::vector<size_t> Unsettled(const std::vector<ArmFigures>& figures, double target);

// "0-3,6" for CPUs 0, 1, 2, 3 and 6.
std::string CpuList(const std::vector<bool>& cpus);

struct Machine {
  int cpus = 0, threads = 0;           // CPUs configured; OpenMP threads per rank
  std::vector<std::string> rank_cpus;  // the CPUs each rank may run on
  std::string omp_places, omp_bind;
  double load_start = 0, load_end = 0;  // 1-minute load average
};

struct TaskThroughput {
  std::string name, unit;
  double units = 0, per_s_in_bubbles = 0, per_s_alone = 0;
};

struct StudyRun {
  const Config* config = nullptr;
  StudyOptions options;
  int rounds = 0;        // rounds run
  bool partial = false;  // stopped before its last round: the figures of the rounds completed
  int resumes = 0;       // times it was continued from its saved blocks (--resume)
  int device_ranks = 0;  // stages (real or emulated) times replicas
  int stage = 0;         // whose side-task throughput is shown
  std::vector<Arm> arms;
  std::vector<ArmFigures> figures;
  Machine machine;
  std::vector<TaskThroughput> throughput;
};

// What came of the target: "" without one.
std::string TargetOutcome(const StudyRun& run);
// A partial study's title and what it says: how many rounds, and how to add the rest.
std::string PartialNote(const StudyRun& run);
std::string StudyMarkdown(const StudyRun& run);
std::string StudyJson(const StudyRun& run);

}  // namespace freeride
