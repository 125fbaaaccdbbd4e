#include "trainer/study/study_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_string.h"

namespace freeride {
namespace {

std::string JsonInterval(const Estimate& e) {
  if (!e.known()) return "null";
  return absl::StrFormat("[%.6f, %.6f]", e.lo, e.hi);
}

std::string Refusal(const SideTaskExecutor* side, const std::vector<std::string>& tasks,
                    int64_t block) {
  std::vector<std::string> states;
  if (side != nullptr) {
    for (const TaskReport& r : side->Report().tasks) {
      if (std::find(tasks.begin(), tasks.end(), r.name) == tasks.end()) continue;
      states.push_back(absl::StrFormat("'%s' now %s%s", r.name, r.state,
                                       r.reason.empty() ? "" : ": " + r.reason));
    }
  }
  return absl::StrFormat(
      "%s did no work in the arm's block %d%s; an arm whose tasks are not working measures "
      "nothing (their bubbles may be too short for a step, or they finished: repeat = true "
      "restarts them)",
      tasks.size() == 1 ? "task '" + tasks[0] + "'" : "none of its tasks", block,
      states.empty() ? "" : " (" + absl::StrJoin(states, "; ") + ")");
}

}  // namespace

std::vector<ArmFigures> Figures(const std::vector<Arm>& arms,
                                const std::vector<BlockRecord>& blocks,
                                int block_steps, int device_ranks, const SideTaskExecutor* side) {
  std::vector<ArmFigures> figures(arms.size());
  std::vector<Block> sequence;
  std::vector<std::vector<double>> utilisation(arms.size()), reclaimed(arms.size());
  for (const BlockRecord& b : blocks) {
    sequence.push_back({b.arm, b.step_s});
    ArmFigures& f = figures[b.arm];
    f.steps += block_steps;
    f.blocks += 1;
    f.step_s += b.step_s;
    f.bubble += b.bubble, f.harvested += b.harvested, f.overrun += b.overrun;
    if (b.bubble > 0) utilisation[b.arm].push_back(b.harvested / b.bubble);
    if (b.step_s > 0) reclaimed[b.arm].push_back(b.work / (b.step_s * block_steps * device_ranks));
    // Together: in "+ all" a lower-priority task may rightly get no bubble.
    double units = 0;
    for (int t : arms[b.arm].task_index) units += b.units[t];
    if (!arms[b.arm].tasks.empty() && units <= 0 && f.refused.empty()) {
      f.refused = Refusal(side, arms[b.arm].tasks, f.blocks);
    }
  }
  const std::vector<std::vector<double>> ratios =
      PairedRatios(sequence, static_cast<int>(arms.size()));
  for (size_t a = 0; a < arms.size(); ++a) {
    ArmFigures& f = figures[a];
    if (f.blocks > 0) f.step_s /= f.blocks;
    f.overhead = MeanWithInterval(ratios[a]);
    f.utilisation = MeanWithInterval(utilisation[a]);
    f.reclaimed = MeanWithInterval(reclaimed[a]);
    // Fractions of time: an interval past their bounds says no more than the bound.
    if (f.utilisation.known()) {
      f.utilisation.lo = std::max(f.utilisation.lo, 0.0);
      f.utilisation.hi = std::min(f.utilisation.hi, 1.0);
    }
    if (f.reclaimed.known()) f.reclaimed.lo = std::max(f.reclaimed.lo, 0.0);
  }
  return figures;
}

std::vector<size_t> Unsettled(const std::vector<ArmFigures>& figures, double target) {
  std::vector<size_t> wide;
  for (size_t a = kAA; a < figures.size(); ++a) {
    if (figures[a].refused.empty() && !(figures[a].overhead.half_width() <= target)) {
      wide.push_back(a);
    }
  }
  return wide;
}

std::string CpuList(const std::vector<bool>& cpus) {
  std::vector<std::string> ranges;
  for (size_t i = 0; i < cpus.size();) {
    if (!cpus[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1]) ++j;
    ranges.push_back(i == j ? absl::StrCat(i) : absl::StrCat(i, "-", j));
    i = j + 1;
  }
  return ranges.empty() ? "?" : absl::StrJoin(ranges, ",");
}

std::string TargetOutcome(const StudyRun& run) {
  const double target = run.options.target_ci;
  if (target <= 0) return "";
  const std::vector<size_t> wide = Unsettled(run.figures, target);
  if (wide.empty()) {
    return absl::StrFormat("Target ±%.2f%%: every overhead interval is within it after %d rounds.",
                           100 * target, run.rounds);
  }
  size_t widest = wide.front();
  for (size_t a : wide) {
    if (run.figures[a].overhead.half_width() > run.figures[widest].overhead.half_width()) {
      widest = a;
    }
  }
  const Estimate& e = run.figures[widest].overhead;
  // An interval narrows as 1/√n: the rounds this noise would need.
  const std::string needed =
      e.known() ? absl::StrFormat("; at this noise about %d rounds would reach it",
                                  static_cast<int>(std::ceil(
                                      run.rounds * std::pow(e.half_width() / target, 2))))
                : "";
  return absl::StrFormat(
      "Target ±%.2f%% NOT reached in %d rounds (--max_rounds %d): the widest interval is "
      "'%s' at ±%.2f%%%s.",
      100 * target, run.rounds, run.options.max_rounds, run.arms[widest].name,
      100 * e.half_width(), needed);
}

std::string StudyMarkdown(const StudyRun& run) {
  const Config& config = *run.config;
  const Machine& m = run.machine;
  std::vector<std::string> ranks;
  for (size_t r = 0; r < m.rank_cpus.size(); ++r) {
    ranks.push_back(config.runtime.emulate_peers
                        ? "the process on CPUs " + m.rank_cpus[r]
                        : absl::StrFormat("rank %d on CPUs %s", r, m.rank_cpus[r]));
  }
  std::string md = absl::StrFormat(
      "# Harvest study\n\n%s schedule, pp = %d, %d micro-batches%s; %d rounds of %d-step blocks, "
      "the arms in an order shuffled each round (seed %d), each arm block between two blocks of "
      "training alone; warm-up (2 steps, one block of each task arm) not counted; %s.\n\n"
      "Machine: %d CPUs; %d OpenMP threads per rank; %s (OMP_PLACES %s, OMP_PROC_BIND %s); "
      "load average %.2f at the start, %.2f at the end.\n\n",
      config.parallel.schedule, config.parallel.pp, config.train.microbatches,
      config.runtime.emulate_peers
          ? absl::StrFormat(" (stage %d real, peers emulated)", config.runtime.emulated_stage)
          : "",
      run.rounds, run.options.block_steps, config.run.seed,
      config.runtime.emulate_peers
          ? absl::StrFormat("one process; device-seconds count all %d stages", run.device_ranks)
          : absl::StrFormat("%d ranks", run.device_ranks),
      m.cpus, m.threads, absl::StrJoin(ranks, ", "), m.omp_places, m.omp_bind, m.load_start,
      m.load_end);
  const Estimate& floor = run.figures[kAA].overhead;
  absl::StrAppendFormat(&md, "Noise floor (A/A: training alone measured as an arm): %s.\n\n",
                        floor.known() ? absl::StrFormat("±%.2f%% (mean %+.2f%%)",
                                                        100 * floor.half_width(), 100 * floor.mean)
                                      : "unknown (fewer than two pairs)");
  absl::StrAppend(&md,
                  "| arm | steps | step s | overhead (95% CI) | bubble s | harvested s | "
                  "utilisation (95% CI) | overrun s | reclaimed (95% CI) |\n"
                  "|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> refusals;
  for (size_t a = 0; a < run.arms.size(); ++a) {
    const ArmFigures& f = run.figures[a];
    const bool tasks = !run.arms[a].tasks.empty();
    std::string overhead = a == kAlone ? "—" : DescribeOverhead(f.overhead);
    if (!f.refused.empty()) {
      overhead = "refused (see below)";
      refusals.push_back(absl::StrFormat("- %s: %s.", run.arms[a].name, f.refused));
    }
    absl::StrAppendFormat(&md, "| %s | %d | %.4f | %s | %.3f | %.3f | %s | %.4f | %s |\n",
                          run.arms[a].name, f.steps, f.step_s, overhead, f.bubble, f.harvested,
                          tasks ? DescribePercent(f.utilisation, 1) : "—", f.overrun,
                          tasks ? DescribePercent(f.reclaimed, 2) : "—");
  }
  if (!refusals.empty()) {
    absl::StrAppend(&md, "\nRefused arms:\n", absl::StrJoin(refusals, "\n"), "\n");
  }
  if (const std::string target = TargetOutcome(run); !target.empty()) {
    absl::StrAppend(&md, "\n", target, "\n");
  }
  if (!run.throughput.empty()) {
    absl::StrAppendFormat(&md,
                          "\nSide-task throughput on stage %d, inside bubbles against alone:\n\n"
                          "| task | units in bubbles | per second in bubbles | per second alone | "
                          "ratio |\n|---|---|---|---|---|\n",
                          run.stage);
    for (const TaskThroughput& t : run.throughput) {
      absl::StrAppendFormat(&md, "| %s | %.6g %s | %.6g | %.6g | %.2f |\n", t.name, t.units,
                            t.unit, t.per_s_in_bubbles, t.per_s_alone,
                            t.per_s_alone > 0 ? t.per_s_in_bubbles / t.per_s_alone : 0);
    }
  }
  absl::StrAppend(
      &md,
      "\nOverhead: per arm block, its mean step over the mean of the plain blocks on either side, "
      "minus 1; the figure is the mean over the arm's blocks and the interval a 95% Student t "
      "interval over them (an interval holding 0 reads \"no measurable overhead\"). Utilisation: "
      "harvested over bubble time, per block. Reclaimed: side work in seconds of the tasks alone "
      "over the block's training device-seconds. The timeline of a measured step is "
      "run.dir/timeline.svg.\n");
  return md;
}

std::string StudyJson(const StudyRun& run) {
  const Config& config = *run.config;
  const Machine& m = run.machine;
  std::vector<std::string> arms;
  for (size_t a = 0; a < run.arms.size(); ++a) {
    const ArmFigures& f = run.figures[a];
    const bool plain = a == kAlone;
    arms.push_back(absl::StrFormat(
        "{\"arm\": %s, \"steps\": %d, \"blocks\": %d, \"step_s\": %.6f, \"overhead\": %.6f, "
        "\"overhead_ci\": %s, \"bubble_s\": %.6f, \"harvested_s\": %.6f, \"utilisation\": %.6f, "
        "\"utilisation_ci\": %s, \"overrun_s\": %.6f, \"reclaimed\": %.6f, \"reclaimed_ci\": %s, "
        "\"refused\": %s}",
        JsonString(run.arms[a].name), f.steps, f.blocks, f.step_s,
        plain ? 0.0 : f.overhead.mean, plain ? "null" : JsonInterval(f.overhead), f.bubble,
        f.harvested, f.utilisation.mean, JsonInterval(f.utilisation), f.overrun,
        f.reclaimed.mean, JsonInterval(f.reclaimed),
        f.refused.empty() ? "null" : JsonString(f.refused)));
  }
  std::vector<std::string> tasks;
  for (const TaskThroughput& t : run.throughput) {
    tasks.push_back(absl::StrFormat(
        "{\"task\": %s, \"units\": %.6g, \"unit\": %s, \"per_s_in_bubbles\": %.6g, "
        "\"per_s_alone\": %.6g}",
        JsonString(t.name), t.units, JsonString(t.unit), t.per_s_in_bubbles, t.per_s_alone));
  }
  std::vector<std::string> rank_cpus;
  for (const std::string& c : m.rank_cpus) rank_cpus.push_back(JsonString(c));
  const Estimate& floor = run.figures[kAA].overhead;
  const std::string target =
      run.options.target_ci > 0
          ? absl::StrFormat("{\"ci\": %.6f, \"max_rounds\": %d, \"reached\": %s}",
                            run.options.target_ci, run.options.max_rounds,
                            Unsettled(run.figures, run.options.target_ci).empty() ? "true"
                                                                                  : "false")
          : "null";
  return absl::StrFormat(
      "{\"rounds\": %d, \"block_steps\": %d, \"seed\": %d, \"noise_floor\": %s, \"target\": %s, "
      "\"machine\": {\"cpus\": %d, \"threads_per_rank\": %d, \"rank_cpus\": [%s], "
      "\"omp_places\": %s, \"omp_proc_bind\": %s, \"load_start\": %.2f, \"load_end\": %.2f}, "
      "\"arms\": [%s], \"tasks\": [%s]}\n",
      run.rounds, run.options.block_steps, config.run.seed,
      floor.known() ? absl::StrFormat("%.6f", floor.half_width()) : "null", target, m.cpus,
      m.threads, absl::StrJoin(rank_cpus, ", "), JsonString(m.omp_places),
      JsonString(m.omp_bind), m.load_start, m.load_end, absl::StrJoin(arms, ",\n  "),
      absl::StrJoin(tasks, ", "));
}

}  // namespace freeride
