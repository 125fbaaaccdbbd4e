#include "trainer/study.h"

#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/logging.h"

namespace freeride {
namespace {

struct Arm {
  std::string name;
  std::vector<std::string> tasks;  // active side tasks; none for "training alone"
  // Summed over this arm's blocks.
  int64_t steps = 0;
  double step_s = 0;
  double bubble_s = 0, harvested_s = 0, overrun_s = 0, work_s = 0;  // this rank; then all ranks
  double reference_s = 0;  // sum over its blocks of the mean step of the plain blocks around
  int64_t reference_blocks = 0;
};

struct Snapshot {
  double bubble = 0, harvested = 0, overrun = 0, work = 0;
  std::vector<double> units, harvested_by_task;
};

Snapshot Take(const SideTaskExecutor* side) {
  Snapshot s;
  if (side == nullptr) return s;
  const HarvestReport r = side->Report();
  s.bubble = r.total_bubble_s();
  s.harvested = r.total_harvested_s();
  s.overrun = r.total_overrun_s();
  for (const TaskReport& t : r.tasks) {
    s.work += t.units * t.standalone_unit_s;
    s.units.push_back(t.units);
    s.harvested_by_task.push_back(t.harvested_s);
  }
  return s;
}

std::vector<Arm> Arms(const Config& config) {
  std::vector<Arm> arms{{"training alone", {}}};
  std::vector<std::string> all;
  for (const SideTaskConfig& t : config.side_tasks) {
    const std::string name = t.name.empty() ? t.type : t.name;
    arms.push_back({"+ " + name, {name}});
    all.push_back(name);
  }
  if (all.size() > 1) arms.push_back({"+ all", all});
  return arms;
}

}  // namespace

int64_t StudySteps(const Config& config, const StudyOptions& options) {
  const int64_t task_arms = static_cast<int64_t>(Arms(config).size()) - 1;
  // Per round: a plain block before each task arm's block; one plain block closes the study.
  return 2 + (static_cast<int64_t>(options.rounds) * task_arms * 2 + 1) * options.block_steps;
}

absl::StatusOr<std::string> RunStudy(Trainer& trainer, const Config& config,
                                     const StudyOptions& options) {
  if (config.side_tasks.empty() || !config.freeride.enabled) {
    return absl::InvalidArgumentError(
        "a study compares side tasks: set freeride.enabled = true and configure [[side_tasks]]");
  }
  SideTaskExecutor* side = trainer.side_tasks();
  std::vector<Arm> arms = Arms(config);
  auto activate = [&](const Arm& arm) {
    if (side != nullptr) side->set_active_tasks(arm.tasks);
  };
  auto run_block = [&](Arm& arm, int steps) -> absl::StatusOr<double> {
    activate(arm);
    const Snapshot before = Take(side);
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
    const Snapshot after = Take(side);
    arm.steps += steps;
    arm.step_s += total;
    arm.bubble_s += after.bubble - before.bubble;
    arm.harvested_s += after.harvested - before.harvested;
    arm.overrun_s += after.overrun - before.overrun;
    arm.work_s += after.work - before.work;
    return total / steps;
  };
  // Warm-up: the first step re-places the bubbles, the second measures them.
  Arm warmup{"warm-up", {}};
  if (absl::StatusOr<double> s = run_block(warmup, 2); !s.ok()) return s.status();
  const Snapshot start = Take(side);
  // Blocks: plain, arm, plain, arm, ..., plain. Each arm block is compared with the mean of
  // the plain blocks on either side of it.
  std::vector<double> plain_means;
  std::vector<size_t> arm_order;
  for (int round = 0; round < options.rounds; ++round) {
    for (size_t a = 1; a < arms.size(); ++a) {
      absl::StatusOr<double> plain = run_block(arms[0], options.block_steps);
      if (!plain.ok()) return plain.status();
      plain_means.push_back(*plain);
      if (absl::StatusOr<double> s = run_block(arms[a], options.block_steps); !s.ok()) {
        return s.status();
      }
      arm_order.push_back(a);
    }
  }
  absl::StatusOr<double> closing = run_block(arms[0], options.block_steps);
  if (!closing.ok()) return closing.status();
  plain_means.push_back(*closing);
  for (size_t k = 0; k < arm_order.size(); ++k) {
    arms[arm_order[k]].reference_s += (plain_means[k] + plain_means[k + 1]) / 2;
    ++arms[arm_order[k]].reference_blocks;
  }
  const Snapshot end = Take(side);
  // Every rank's harvest adds up; step times are the pipeline's, the same on every rank.
  std::vector<double> sums;
  for (const Arm& arm : arms) {
    for (double v : {arm.bubble_s, arm.harvested_s, arm.overrun_s, arm.work_s}) sums.push_back(v);
  }
  const std::vector<int> world = trainer.transport().AllRanks();
  if (absl::Status s = trainer.transport().AllReduceSum(sums.data(),
                                                        static_cast<int64_t>(sums.size()), world,
                                                        config.runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  for (size_t a = 0; a < arms.size(); ++a) {
    arms[a].bubble_s = sums[4 * a], arms[a].harvested_s = sums[4 * a + 1];
    arms[a].overrun_s = sums[4 * a + 2], arms[a].work_s = sums[4 * a + 3];
  }
  if (!trainer.leader()) return std::string();  // one process emulating writes, whatever its stage

  const int ranks = static_cast<int>(world.size());
  std::string md = absl::StrFormat(
      "# Harvest study\n\n%s schedule, pp = %d, %d micro-batches%s; %d rounds of %d-step blocks, "
      "each task arm after a block of training alone; %s.\n\n"
      "| arm | steps | step s | overhead | bubble s | harvested s | utilisation | overrun s | "
      "reclaimed |\n|---|---|---|---|---|---|---|---|---|\n",
      config.parallel.schedule, config.parallel.pp, config.train.microbatches,
      config.runtime.emulate_peers
          ? absl::StrFormat(" (stage %d real, peers emulated)", config.runtime.emulated_stage)
          : "",
      options.rounds, options.block_steps,
      config.runtime.emulate_peers
          ? absl::StrFormat("one process; device-seconds count all %d stages", ranks)
          : absl::StrFormat("%d ranks", ranks));
  std::vector<std::string> json_arms;
  for (const Arm& arm : arms) {
    const double mean = arm.steps > 0 ? arm.step_s / arm.steps : 0;
    const double reference = arm.reference_blocks > 0 ? arm.reference_s / arm.reference_blocks : 0;
    const double overhead = reference > 0 ? mean / reference - 1 : 0;
    const double util = arm.bubble_s > 0 ? arm.harvested_s / arm.bubble_s : 0;
    const double reclaimed = arm.step_s > 0 ? arm.work_s / (arm.step_s * ranks) : 0;
    const bool plain = arm.tasks.empty();
    absl::StrAppendFormat(&md, "| %s | %d | %.4f | %s | %.3f | %.3f | %s | %.4f | %s |\n",
                          arm.name, arm.steps, mean,
                          plain ? "—" : absl::StrFormat("%+.2f%%", 100 * overhead), arm.bubble_s,
                          arm.harvested_s, plain ? "—" : absl::StrFormat("%.1f%%", 100 * util),
                          arm.overrun_s, plain ? "—" : absl::StrFormat("%.2f%%", 100 * reclaimed));
    json_arms.push_back(absl::StrFormat(
        "{\"arm\": \"%s\", \"steps\": %d, \"step_s\": %.6f, \"overhead\": %.6f, \"bubble_s\": %.6f, "
        "\"harvested_s\": %.6f, \"utilisation\": %.6f, \"overrun_s\": %.6f, \"reclaimed\": %.6f}",
        arm.name, arm.steps, mean, plain ? 0.0 : overhead, arm.bubble_s, arm.harvested_s, util,
        arm.overrun_s, reclaimed));
  }
  std::vector<std::string> json_tasks;
  if (side != nullptr) {
    absl::StrAppend(&md, absl::StrFormat("\nSide-task throughput on stage %d, inside bubbles "
                                         "against alone:\n\n", trainer.layout().stage),
                    "| task | units in bubbles | per second in bubbles | per second alone | "
                    "ratio |\n|---|---|---|---|---|\n");
    const HarvestReport r = side->Report();
    for (size_t i = 0; i < r.tasks.size(); ++i) {
      const TaskReport& t = r.tasks[i];
      const double units = end.units[i] - start.units[i];
      const double time = end.harvested_by_task[i] - start.harvested_by_task[i];
      const double in_bubbles = time > 0 ? units / time : 0;
      const double alone = t.standalone_unit_s > 0 ? 1.0 / t.standalone_unit_s : 0;
      absl::StrAppendFormat(&md, "| %s | %.6g %s | %.6g | %.6g | %.2f |\n", t.name, units, t.unit,
                            in_bubbles, alone, alone > 0 ? in_bubbles / alone : 0);
      json_tasks.push_back(absl::StrFormat(
          "{\"task\": \"%s\", \"units\": %.6g, \"unit\": \"%s\", \"per_s_in_bubbles\": %.6g, "
          "\"per_s_alone\": %.6g}",
          t.name, units, t.unit, in_bubbles, alone));
    }
  }
  absl::StrAppend(&md, "\nOverhead: mean step of the arm's blocks over the mean of the plain "
                       "blocks on either side of them, minus 1. Reclaimed: side work in seconds of "
                       "the tasks alone over the arm's training device-seconds. The timeline of a "
                       "measured step is run.dir/timeline.svg.\n");
  const std::string json = absl::StrFormat("{\"arms\": [%s], \"tasks\": [%s]}\n",
                                           absl::StrJoin(json_arms, ", "),
                                           absl::StrJoin(json_tasks, ", "));
  const std::filesystem::path dir(config.run.dir);
  if (absl::Status s = WriteFileAtomically((dir / "study.md").string(), md); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically((dir / "study.json").string(), json); !s.ok()) return s;
  return md;
}

}  // namespace freeride
