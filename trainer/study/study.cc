#include "trainer/study/study.h"

#include <omp.h>
#include <sched.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/logging.h"
#include "trainer/run_dir.h"
#include "trainer/study/study_report.h"
#include "trainer/study_stats.h"

namespace freeride {
namespace {

std::vector<Arm> Arms(const Config& config) {
  std::vector<Arm> arms{{"training alone", {}, {}}, {"A/A: training alone", {}, {}}};
  Arm all{"+ all", {}, {}};
  for (size_t i = 0; i < config.side_tasks.size(); ++i) {
    const std::string name = TaskName(config.side_tasks[i]);
    arms.push_back({"+ " + name, {name}, {static_cast<int>(i)}});
    all.tasks.push_back(name);
    all.task_index.push_back(static_cast<int>(i));
  }
  if (all.tasks.size() > 1) arms.push_back(all);
  return arms;
}

// The executor's running totals; per config.side_tasks entry where they are a task's.
struct Snapshot {
  double bubble = 0, harvested = 0, overrun = 0, work = 0;
  std::vector<double> units, harvested_by_task;
};

Snapshot Take(const SideTaskExecutor* side, const Config& config) {
  Snapshot s;
  s.units.assign(config.side_tasks.size(), 0.0);
  s.harvested_by_task.assign(config.side_tasks.size(), 0.0);
  if (side == nullptr) return s;
  const HarvestReport r = side->Report();
  s.bubble = r.total_bubble_s();
  s.harvested = r.total_harvested_s();
  s.overrun = r.total_overrun_s();
  for (const TaskReport& t : r.tasks) {
    s.work += t.units * t.standalone_unit_s;
    for (size_t i = 0; i < config.side_tasks.size(); ++i) {
      if (TaskName(config.side_tasks[i]) != t.name) continue;
      s.units[i] = t.units;
      s.harvested_by_task[i] = t.harvested_s;
    }
  }
  return s;
}

constexpr int kFixedFields = 5;

absl::StatusOr<std::vector<BlockRecord>> Reduce(Trainer& trainer, const Config& config,
                                                std::vector<BlockRecord> blocks, int contributors) {
  const size_t tasks = config.side_tasks.size(), width = kFixedFields + tasks;
  std::vector<double> flat(blocks.size() * width);
  for (size_t b = 0; b < blocks.size(); ++b) {
    double* row = &flat[b * width];
    const BlockRecord& r = blocks[b];
    row[0] = r.step_s, row[1] = r.bubble, row[2] = r.harvested, row[3] = r.overrun, row[4] = r.work;
    for (size_t t = 0; t < tasks; ++t) row[kFixedFields + t] = r.units[t];
  }
  if (absl::Status s = trainer.transport().AllReduceSum(
          flat.data(), static_cast<int64_t>(flat.size()), trainer.transport().AllRanks(),
          config.runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    const double* row = &flat[b * width];
    BlockRecord& r = blocks[b];
    r.step_s = row[0] / contributors;
    r.bubble = row[1], r.harvested = row[2], r.overrun = row[3], r.work = row[4];
    for (size_t t = 0; t < tasks; ++t) r.units[t] = row[kFixedFields + t];
  }
  return blocks;
}

double LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

absl::StatusOr<Machine> DescribeMachine(Trainer& trainer, const Config& config, int real_ranks) {
  Machine m;
  m.cpus = get_nprocs_conf();
  m.threads = omp_get_max_threads();
  const char* places = std::getenv("OMP_PLACES");
  const char* bind = std::getenv("OMP_PROC_BIND");
  m.omp_places = places != nullptr ? places : "unset";
  m.omp_bind = bind != nullptr ? bind : "unset";
  m.load_start = LoadAverage();
  // Every rank's affinity mask, gathered by a sum of one row per rank.
  std::vector<double> masks(static_cast<size_t>(real_ranks) * m.cpus, 0.0);
  const int row = config.runtime.emulate_peers ? 0 : trainer.transport().rank();
  // The CPUs of every OpenMP thread of this rank: with OMP_PROC_BIND each thread has its own
  // place, and the calling thread's mask alone would show one core.
  double* mine = &masks[static_cast<size_t>(row) * m.cpus];
  const int cpus = std::min(m.cpus, CPU_SETSIZE);
#pragma omp parallel
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
#pragma omp critical
      for (int c = 0; c < cpus; ++c) {
        if (CPU_ISSET(c, &set)) mine[c] = 1;
      }
    }
  }
  if (absl::Status s = trainer.transport().AllReduceSum(
          masks.data(), static_cast<int64_t>(masks.size()), trainer.transport().AllRanks(),
          config.runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  for (int r = 0; r < real_ranks; ++r) {
    std::vector<bool> cpus(m.cpus);
    for (int c = 0; c < m.cpus; ++c) cpus[c] = masks[static_cast<size_t>(r) * m.cpus + c] > 0;
    m.rank_cpus.push_back(CpuList(cpus));
  }
  return m;
}

}  // namespace

int StudyRoundsAtMost(const StudyOptions& options) {
  return options.target_ci > 0 ? std::max(options.rounds, options.max_rounds) : options.rounds;
}

int64_t StudySteps(const Config& config, const StudyOptions& options) {
  const int64_t arms = static_cast<int64_t>(Arms(config).size());
  const int64_t task_arms = arms - 2;
  // Warm-up: two steps and a block of each task arm. Then one plain block, and per round each
  // arm (A/A included) followed by a plain block.
  return 2 + task_arms * options.block_steps +
         (1 + static_cast<int64_t>(StudyRoundsAtMost(options)) * (arms - 1) * 2) *
             options.block_steps;
}

void PrepareStudyConfig(Config& config, const StudyOptions& options) {
  // Its own directory: a study beside a training run must not replace that run's config,
  // timelines or side-task records. Checkpoints stay where the config put them, so that
  // checkpoint.resume = "latest" still names the training run's.
  config.checkpoint.dir = CheckpointDirOf(config);
  config.run.dir = (std::filesystem::path(config.run.dir) / "study").string();
  config.train.steps = StudySteps(config, options);
  config.freeride.alternate_every = 0;
  config.freeride.overhead_check = "off";  // a study measures every arm itself
  config.eval.every = 0;
  for (SideTaskConfig& task : config.side_tasks) {
    if (!task.repeat) task.repeat = true;
  }
}

absl::Status CheckStudyConfig(const Config& config) {
  if (config.side_tasks.empty() || !config.freeride.enabled) {
    return absl::InvalidArgumentError(
        "a study compares side tasks: set freeride.enabled = true and configure [[side_tasks]]");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RunStudy(Trainer& trainer, const Config& config,
                                     const StudyOptions& options) {
  if (absl::Status s = CheckStudyConfig(config); !s.ok()) return s;
  SideTaskExecutor* side = trainer.side_tasks();
  StudyRun run;
  run.config = &config;
  run.options = options;
  run.arms = Arms(config);
  run.stage = trainer.layout().stage;
  const std::vector<int> world = trainer.transport().AllRanks();
  run.device_ranks = static_cast<int>(world.size());
  // Ranks measuring for real: an emulating process stands alone.
  const int real_ranks = config.runtime.emulate_peers ? 1 : run.device_ranks;
  absl::StatusOr<Machine> machine = DescribeMachine(trainer, config, real_ranks);
  if (!machine.ok()) return machine.status();
  run.machine = *std::move(machine);

  std::vector<BlockRecord> blocks;
  auto run_block = [&](int arm, int steps, bool measured) -> absl::Status {
    if (side != nullptr) side->set_active_tasks(run.arms[arm].tasks);
    const Snapshot before = Take(side, config);
    double total = 0;
    for (int i = 0; i < steps; ++i) {
      absl::StatusOr<StepStats> s = trainer.Step();
      if (!s.ok()) return s.status();
      if (s->stop_requested) {
        if (side != nullptr) side->Finish();
        return absl::CancelledError(absl::StrFormat(
            "stopped by a signal after step %d of the study; a study is measured in one go, so "
            "it wrote no report",
            trainer.step()));
      }
      total += s->step_s;
    }
    if (!measured) return absl::OkStatus();
    const Snapshot after = Take(side, config);
    BlockRecord r;
    r.arm = arm;
    r.step_s = total / steps;
    r.bubble = after.bubble - before.bubble;
    r.harvested = after.harvested - before.harvested;
    r.overrun = after.overrun - before.overrun;
    r.work = after.work - before.work;
    for (size_t t = 0; t < after.units.size(); ++t) r.units.push_back(after.units[t] - before.units[t]);
    blocks.push_back(std::move(r));
    return absl::OkStatus();
  };
  // Warm-up: the first step re-places the bubbles, the second measures them; then every task
  // starts (first allocations, caches) before anything counts.
  if (absl::Status s = run_block(kAlone, 2, false); !s.ok()) return s;
  for (size_t a = kAA + 1; a < run.arms.size(); ++a) {
    if (absl::Status s = run_block(static_cast<int>(a), options.block_steps, false); !s.ok()) {
      return s;
    }
  }
  const Snapshot start = Take(side, config);
  if (absl::Status s = run_block(kAlone, options.block_steps, true); !s.ok()) return s;
  // Every rank draws the same order from the same seed.
  std::mt19937_64 rng(static_cast<uint64_t>(config.run.seed));
  int last = 0;
  const int most = StudyRoundsAtMost(options);
  while (true) {
    for (int arm : ShuffledRound(static_cast<int>(run.arms.size()), last, rng)) {
      if (absl::Status s = run_block(arm, options.block_steps, true); !s.ok()) return s;
      if (absl::Status s = run_block(kAlone, options.block_steps, true); !s.ok()) return s;
      last = arm;
    }
    ++run.rounds;
    if (run.rounds < options.rounds) continue;
    absl::StatusOr<std::vector<BlockRecord>> reduced = Reduce(trainer, config, blocks, real_ranks);
    if (!reduced.ok()) return reduced.status();
    run.figures =
        Figures(run.arms, *reduced, options.block_steps, run.device_ranks, side);
    if (options.target_ci <= 0 || run.rounds >= most) break;
    // Every rank computed the same figures from the same sums; the decision is summed too, so
    // that no rank could go on alone.
    double go_on = Unsettled(run.figures, options.target_ci).empty() ? 0 : 1;
    if (absl::Status s = trainer.transport().AllReduceSum(&go_on, 1, world,
                                                          config.runtime.comm_timeout_s);
        !s.ok()) {
      return s;
    }
    if (go_on == 0) break;
  }
  const Snapshot end = Take(side, config);
  run.machine.load_end = LoadAverage();
  if (!trainer.leader()) return std::string();  // one process emulating writes, whatever its stage

  if (side != nullptr) {
    const HarvestReport r = side->Report();
    for (size_t i = 0; i < config.side_tasks.size(); ++i) {
      for (const TaskReport& t : r.tasks) {
        if (t.name != TaskName(config.side_tasks[i])) continue;
        TaskThroughput tp{t.name, t.unit, end.units[i] - start.units[i]};
        const double time = end.harvested_by_task[i] - start.harvested_by_task[i];
        tp.per_s_in_bubbles = time > 0 ? tp.units / time : 0;
        tp.per_s_alone = t.standalone_unit_s > 0 ? 1.0 / t.standalone_unit_s : 0;
        run.throughput.push_back(tp);
      }
    }
  }
  const std::string md = StudyMarkdown(run);
  const std::filesystem::path dir(config.run.dir);
  if (absl::Status s = WriteFileAtomically((dir / "study.md").string(), md); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically((dir / "study.json").string(), StudyJson(run));
      !s.ok()) {
    return s;
  }
  return md;
}

}  // namespace freeride
