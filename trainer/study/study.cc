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
#include "core/status.h"
#include "core/stop_request.h"
#include "trainer/run_dir.h"
#include "trainer/study/study_blocks.h"
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
  int stage = 0;
};

Snapshot Take(const SideTaskExecutor* side, const Config& config) {
  Snapshot s;
  s.units.assign(config.side_tasks.size(), 0.0);
  s.harvested_by_task.assign(config.side_tasks.size(), 0.0);
  if (side == nullptr) return s;
  const HarvestReport r = side->Report();
  s.stage = r.stage;
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
  const size_t tasks = config.side_tasks.size(), pp = static_cast<size_t>(config.parallel.pp);
  const size_t width = kFixedFields + tasks + pp;
  std::vector<double> flat(blocks.size() * width);
  for (size_t b = 0; b < blocks.size(); ++b) {
    double* row = &flat[b * width];
    const BlockRecord& r = blocks[b];
    row[0] = r.step_s, row[1] = r.bubble, row[2] = r.harvested, row[3] = r.overrun, row[4] = r.work;
    for (size_t t = 0; t < tasks; ++t) row[kFixedFields + t] = r.units[t];
    for (size_t st = 0; st < pp && st < r.stage_bubble.size(); ++st) {
      row[kFixedFields + tasks + st] = r.stage_bubble[st];
    }
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
    r.stage_bubble.assign(row + kFixedFields + tasks, row + width);
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

// "45s", "3m05s", "1h02m": elapsed and left, as a person reads them.
std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

// What a refusal names (collective: each task's step alone is averaged over the ranks that
// run it).
absl::StatusOr<RefusalFacts> Facts(Trainer& trainer, const Config& config,
                                   const SideTaskExecutor* side) {
  RefusalFacts facts;
  const size_t tasks = config.side_tasks.size();
  if (config.runtime.emulate_peers) {
    facts.measured_stages = {trainer.layout().stage};
  } else {
    for (int st = 0; st < config.parallel.pp; ++st) facts.measured_stages.push_back(st);
  }
  std::vector<double> steps(2 * tasks, 0.0);  // sums of the step alone, then of ranks
  facts.task_ended.assign(tasks, "");
  for (size_t i = 0; i < tasks; ++i) {
    facts.task_stages.push_back(config.side_tasks[i].stages);
    if (side == nullptr) continue;
    for (const TaskReport& t : side->Report().tasks) {
      if (t.name != TaskName(config.side_tasks[i])) continue;
      if (t.standalone_step_s > 0) steps[i] += t.standalone_step_s, steps[tasks + i] += 1;
      if (t.state == "FINISHED" || t.state == "FAILED") {
        facts.task_ended[i] = t.reason.empty() ? t.state : t.state + ": " + t.reason;
      }
    }
  }
  FR_RETURN_IF_ERROR(trainer.transport().AllReduceSum(
      steps.data(), static_cast<int64_t>(steps.size()), trainer.transport().AllRanks(),
      config.runtime.comm_timeout_s));
  for (size_t i = 0; i < tasks; ++i) {
    facts.task_step_s.push_back(steps[tasks + i] > 0 ? steps[i] / steps[tasks + i] : 0);
  }
  return facts;
}

// Each task's throughput on this rank's stage between two snapshots: inside bubbles against
// alone.
std::vector<TaskThroughput> Throughput(const Config& config, const SideTaskExecutor* side,
                                       const Snapshot& start, const Snapshot& end) {
  std::vector<TaskThroughput> out;
  if (side == nullptr) return out;
  const HarvestReport r = side->Report();
  for (size_t i = 0; i < config.side_tasks.size(); ++i) {
    for (const TaskReport& t : r.tasks) {
      if (t.name != TaskName(config.side_tasks[i])) continue;
      const double units = end.units[i] - (i < start.units.size() ? start.units[i] : 0);
      TaskThroughput tp{t.name, t.unit, units};
      const double time = end.harvested_by_task[i] -
                          (i < start.harvested_by_task.size() ? start.harvested_by_task[i] : 0);
      tp.per_s_in_bubbles = time > 0 ? tp.units / time : 0;
      tp.per_s_alone = t.standalone_unit_s > 0 ? 1.0 / t.standalone_unit_s : 0;
      out.push_back(tp);
    }
  }
  return out;
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
  const int most = StudyRoundsAtMost(options);
  const int arms = static_cast<int>(run.arms.size());
  const std::string blocks_path = StudyBlocksPath(
      config.run.dir, config.runtime.emulate_peers ? 0 : trainer.transport().rank());

  std::vector<BlockRecord> blocks;
  size_t complete = 0;  // blocks of the rounds completed
  // Every rank draws the same order from the same seed; a resumed study replays the rounds
  // it has, so that its order is the one it would have had in one go.
  std::mt19937_64 rng(static_cast<uint64_t>(config.run.seed));
  int last = 0;
  if (options.resume) {
    absl::StatusOr<SavedStudy> saved =
        LoadStudyBlocks(blocks_path, options.block_steps, run.arms, config.side_tasks.size());
    if (!saved.ok()) return saved.status();
    // Every rank goes on from the rounds all of them saved (one killed mid-write has fewer).
    std::vector<double> have(static_cast<size_t>(most) + 1, 0.0);
    for (int r = 0; r <= std::min(saved->rounds, most); ++r) have[static_cast<size_t>(r)] = 1;
    if (absl::Status s = trainer.transport().AllReduceSum(
            have.data(), static_cast<int64_t>(have.size()), world, config.runtime.comm_timeout_s);
        !s.ok()) {
      return s;
    }
    int rounds = 0;
    while (rounds + 1 < static_cast<int>(have.size()) && have[rounds + 1] == real_ranks) ++rounds;
    if (config.runtime.emulate_peers) rounds = std::min(saved->rounds, most);
    if (rounds > 0) {
      blocks.assign(saved->blocks.begin(),
                    saved->blocks.begin() + static_cast<ptrdiff_t>(saved->round_ends[rounds - 1]));
    }
    complete = blocks.size();
    run.rounds = rounds;
    run.resumes = saved->parts;
    for (int r = 0; r < rounds; ++r) last = ShuffledRound(arms, last, rng).back();
    FR_LOG(PROGRESS) << absl::StrFormat("study: resuming after %d saved round%s (%s)", rounds,
                                        rounds == 1 ? "" : "s", blocks_path);
  }
  if (!options.resume) {
    // A fresh study starts a fresh file (the command refused or removed any earlier study).
    std::error_code ec;
    std::filesystem::remove(blocks_path, ec);
  }
  const int rounds_before = run.rounds;
  size_t saved_blocks = blocks.size();

  // Progress at every block, at every log level but error: a study runs for minutes.
  Clock& clock = trainer.clock();
  const double started = clock.Now();
  const int64_t first_step = trainer.step();
  auto planned_steps = [&]() -> int64_t {
    const int rounds = std::max(options.rounds, run.rounds + 1) - rounds_before;
    return 2 + static_cast<int64_t>(arms - 2) * options.block_steps +
           (1 + static_cast<int64_t>(std::max(rounds, 0)) * (arms - 1) * 2) * options.block_steps;
  };
  auto progress = [&](const std::string& what) {
    const double elapsed = clock.Now() - started;
    const int64_t done = trainer.step() - first_step, planned = planned_steps();
    const double left = done > 0 ? elapsed / static_cast<double>(done) *
                                       static_cast<double>(std::max<int64_t>(planned - done, 0))
                                 : 0;
    const std::string more =
        options.target_ci > 0
            ? absl::StrFormat(" (more rounds while an interval is wider than ±%.2f%%, at most %d)",
                              100 * options.target_ci, most)
            : "";
    FR_LOG(PROGRESS) << absl::StrFormat("study: %s; step %d of %d, %s elapsed, about %s left%s",
                                        what, done, planned, Duration(elapsed), Duration(left),
                                        more);
  };

  // OK, or Cancelled with the step when a stop was asked for (every rank learns it in the
  // same step).
  auto run_block = [&](int arm, int steps, bool measured) -> absl::Status {
    if (side != nullptr) side->set_active_tasks(run.arms[arm].tasks);
    const Snapshot before = Take(side, config);
    double total = 0;
    for (int i = 0; i < steps; ++i) {
      absl::StatusOr<StepStats> s = trainer.Step();
      if (!s.ok()) return s.status();
      if (s->stop_requested) return absl::CancelledError(absl::StrCat(trainer.step()));
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
    r.stage_bubble.assign(static_cast<size_t>(config.parallel.pp), 0.0);
    if (trainer.layout().stage < config.parallel.pp) {
      r.stage_bubble[static_cast<size_t>(trainer.layout().stage)] = r.bubble;
    }
    blocks.push_back(std::move(r));
    return absl::OkStatus();
  };
  Snapshot start = Take(side, config);
  auto measure = [&]() -> absl::Status {
    if (run.rounds >= options.rounds && options.target_ci <= 0) return absl::OkStatus();
    // Warm-up: the first step re-places the bubbles, the second measures them; then every
    // task starts (first allocations, caches) before anything counts.
    FR_RETURN_IF_ERROR(run_block(kAlone, 2, false));
    for (int a = kAA + 1; a < arms; ++a) {
      FR_RETURN_IF_ERROR(run_block(a, options.block_steps, false));
      progress(absl::StrFormat("warm-up block '%s' done (not counted)", run.arms[a].name));
    }
    start = Take(side, config);
    FR_RETURN_IF_ERROR(run_block(kAlone, options.block_steps, true));
    while (true) {
      if (run.rounds >= most) return absl::OkStatus();
      const std::vector<int> order = ShuffledRound(arms, last, rng);
      for (size_t i = 0; i < order.size(); ++i) {
        FR_RETURN_IF_ERROR(run_block(order[i], options.block_steps, true));
        FR_RETURN_IF_ERROR(run_block(kAlone, options.block_steps, true));
        progress(absl::StrFormat("round %d of %d, arm %d of %d ('%s') and its plain block done",
                                 run.rounds + 1, std::max(options.rounds, run.rounds + 1), i + 1,
                                 order.size(), run.arms[order[i]].name));
      }
      last = order.back();
      ++run.rounds;
      complete = blocks.size();
      const std::vector<BlockRecord> round(blocks.begin() + static_cast<ptrdiff_t>(saved_blocks),
                                           blocks.end());
      FR_RETURN_IF_ERROR(
          AppendStudyRound(blocks_path, run.rounds, options.block_steps, run.arms, round));
      saved_blocks = blocks.size();
      if (run.rounds < options.rounds) continue;
      if (options.target_ci <= 0) return absl::OkStatus();
      absl::StatusOr<std::vector<BlockRecord>> reduced =
          Reduce(trainer, config, blocks, real_ranks);
      if (!reduced.ok()) return reduced.status();
      // Every rank computed the same figures from the same sums; the decision is summed too,
      // so that no rank could go on alone.
      double go_on = Unsettled(Figures(run.arms, *reduced, options.block_steps, run.device_ranks,
                                       RefusalFacts{}),
                               options.target_ci)
                             .empty()
                         ? 0
                         : 1;
      FR_RETURN_IF_ERROR(
          trainer.transport().AllReduceSum(&go_on, 1, world, config.runtime.comm_timeout_s));
      if (go_on == 0) return absl::OkStatus();
    }
  };
  absl::Status measured = measure();
  const Snapshot end = Take(side, config);
  std::string stopped;
  if (absl::IsCancelled(measured)) {
    if (side != nullptr) side->Finish();
    const int signal = StopRequestedBy();
    stopped =
        absl::StrFormat("stopped by %s after step %s of the study",
                        signal != 0 ? StopSignalName(signal) : "a signal", measured.message());
    if (run.rounds == 0) {
      return absl::CancelledError(absl::StrFormat(
          "%s, before its first round was complete: no report (a round is the least one "
          "needs); run the study again",
          stopped));
    }
    blocks.resize(complete);
    run.partial = true;
  } else if (!measured.ok()) {
    return measured;
  }
  absl::StatusOr<std::vector<BlockRecord>> reduced = Reduce(trainer, config, blocks, real_ranks);
  if (!reduced.ok()) return reduced.status();
  absl::StatusOr<RefusalFacts> facts = Facts(trainer, config, side);
  if (!facts.ok()) return facts.status();
  run.figures = Figures(run.arms, *reduced, options.block_steps, run.device_ranks, *facts);
  run.machine.load_end = LoadAverage();
  std::string md;
  if (trainer.leader()) {  // one process emulating writes, whatever its stage
    run.throughput = Throughput(config, side, start, end);
    md = StudyMarkdown(run);
    const std::filesystem::path dir(config.run.dir);
    FR_RETURN_IF_ERROR(WriteFileAtomically((dir / "study.md").string(), md));
    FR_RETURN_IF_ERROR(WriteFileAtomically((dir / "study.json").string(), StudyJson(run)));
  }
  if (run.partial) {
    return absl::CancelledError(absl::StrFormat(
        "%s; wrote the report of the %d round%s it completed, marked partial, to %s/study.md. "
        "The same command with --resume measures the remaining rounds",
        stopped, run.rounds, run.rounds == 1 ? "" : "s", config.run.dir));
  }
  return md;
}

}  // namespace freeride
