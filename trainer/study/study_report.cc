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

bool RunsOn(const std::vector<int64_t>& stages, int stage) {
  return stages.empty() || std::find(stages.begin(), stages.end(), stage) != stages.end();
}

// Why an arm's tasks did no work in its block, in plain words: a task that ended says how; one
// that could still work names the bubble it had on each stage it runs on against the step it
// needs, since a task steps only inside a bubble its step fits in.
std::string Refusal(const Arm& arm, const BlockRecord& block, int64_t block_number, int block_steps,
                    const RefusalFacts& facts) {
  std::vector<std::string> ended, starved;
  for (size_t i = 0; i < arm.tasks.size(); ++i) {
    const size_t t = static_cast<size_t>(arm.task_index[i]);
    const std::string& name = arm.tasks[i];
    if (t < facts.task_ended.size() && !facts.task_ended[t].empty()) {
      ended.push_back(absl::StrFormat("'%s' now %s", name, facts.task_ended[t]));
      continue;
    }
    std::vector<std::string> bubbles;
    for (int stage : facts.measured_stages) {
      if (t < facts.task_stages.size() && !RunsOn(facts.task_stages[t], stage)) continue;
      const double bubble = static_cast<size_t>(stage) < block.stage_bubble.size()
                                ? block.stage_bubble[static_cast<size_t>(stage)]
                                : 0;
      bubbles.push_back(absl::StrFormat(
          "stage %d had %s of bubble in the block's %d steps (%s a "
          "step)",
          stage, HumanSeconds(bubble), block_steps, HumanSeconds(bubble / block_steps)));
    }
    const double need = t < facts.task_step_s.size() ? facts.task_step_s[t] : 0;
    starved.push_back(absl::StrFormat(
        "'%s' needs %s a step (alone)%s%s", name,
        need > 0 ? "about " + HumanSeconds(need) : "an unknown time", bubbles.empty() ? "" : "; ",
        bubbles.empty() ? "no stage it runs on is measured here" : absl::StrJoin(bubbles, ", ")));
  }
  std::string why;
  if (!ended.empty()) {
    absl::StrAppend(&why, " (", absl::StrJoin(ended, "; "),
                    "): a task that finished or failed has no work (repeat = true restarts a "
                    "finished one)");
  }
  if (!starved.empty()) {
    absl::StrAppend(&why, ": ", absl::StrJoin(starved, "; "),
                    ". A task steps only inside a bubble its step fits in: longer bubbles (more "
                    "stages or micro-batches) or shorter task steps let it work");
  }
  const std::string who =
      arm.tasks.size() == 1
          ? "task '" + arm.tasks[0] + "' did no work"
          : "none of its tasks (" + absl::StrJoin(arm.tasks, ", ") + ") did any work";
  return absl::StrFormat("%s in the arm's block %d%s", who, block_number, why);
}

}  // namespace

std::string HumanSeconds(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.0f µs", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::vector<ArmFigures> Figures(const std::vector<Arm>& arms,
                                const std::vector<BlockRecord>& blocks, int block_steps,
                                int device_ranks, const RefusalFacts& facts) {
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
      f.refused = Refusal(arms[b.arm], b, f.blocks, block_steps, facts);
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

std::string PartialNote(const StudyRun& run) {
  return absl::StrFormat(
      "# Harvest study (partial)\n\nStopped by a signal after %d of its %d rounds: the figures "
      "are those of the rounds it completed. `freeride study` with the same flags and "
      "`--resume` measures the remaining rounds (the blocks measured so far are saved in "
      "run.dir) and writes the report of all of them; `--resume --rounds R` asks for R in "
      "all.\n\n",
      run.rounds, StudyRoundsAtMost(run.options));
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
  std::string md = run.partial ? PartialNote(run) : "# Harvest study\n\n";
  absl::StrAppendFormat(
      &md,
      "%s schedule, pp = %d, %d micro-batches%s; %d rounds of %d-step blocks, "
      "the arms in an order shuffled each round (seed %d), each arm block between two blocks of "
      "training alone; warm-up (2 steps, one block of each task arm) not counted; %s.\n\n"
      "Machine: %d CPUs; %d OpenMP threads per rank; %s (OMP_PLACES %s, OMP_PROC_BIND %s); "
      "load average %.2f at the start, %.2f at the end.%s\n\n",
      config.parallel.schedule, config.parallel.pp, config.train.microbatches,
      config.runtime.emulate_peers
          ? absl::StrFormat(" (stage %d real, peers emulated)", config.runtime.emulated_stage)
          : "",
      run.rounds, run.options.block_steps, config.run.seed,
      config.runtime.emulate_peers
          ? absl::StrFormat("one process; device-seconds count all %d stages", run.device_ranks)
          : absl::StrFormat("%d ranks", run.device_ranks),
      m.cpus, m.threads, absl::StrJoin(ranks, ", "), m.omp_places, m.omp_bind, m.load_start,
      m.load_end,
      run.resumes > 0
          ? absl::StrFormat(" Continued %d time%s from its saved blocks (--resume): each part "
                            "began with its own warm-up and plain block.",
                            run.resumes, run.resumes == 1 ? "" : "s")
          : "");
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
    std::string overhead =
        a == kAlone ? "—"
                    : DescribeOverhead({f.overhead, floor, run.config->freeride.max_overhead});
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
      "interval over them, against freeride.max_overhead: above or within it where the interval lies "
      "wholly on one side; where it holds the budget and the A/A noise floor is wider than the "
      "budget, this host cannot resolve it, and the table says so. Utilisation: "
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
    // Training alone is the reference, and a refused arm's overhead measures nothing: neither
    // has a figure to show.
    const bool none = a == kAlone || !f.refused.empty();
    arms.push_back(absl::StrFormat(
        "{\"arm\": %s, \"steps\": %d, \"blocks\": %d, \"step_s\": %.6f, \"overhead\": %s, "
        "\"overhead_ci\": %s, \"overhead_text\": %s, \"bubble_s\": %.6f, \"harvested_s\": %.6f, \"utilisation\": %.6f, "
        "\"utilisation_ci\": %s, \"overrun_s\": %.6f, \"reclaimed\": %.6f, \"reclaimed_ci\": %s, "
        "\"refused\": %s}",
        JsonString(run.arms[a].name), f.steps, f.blocks, f.step_s,
        none ? "null" : absl::StrFormat("%.6f", f.overhead.mean),
        none ? "null" : JsonInterval(f.overhead),
        none ? "null"
             : JsonString(DescribeOverhead({f.overhead, run.figures[kAA].overhead,
                                            config.freeride.max_overhead})),
        f.bubble, f.harvested, f.utilisation.mean,
        JsonInterval(f.utilisation), f.overrun, f.reclaimed.mean, JsonInterval(f.reclaimed),
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
      "{\"rounds\": %d, \"partial\": %s, \"resumes\": %d, \"block_steps\": %d, \"seed\": %d, "
      "\"noise_floor\": %s, \"target\": %s, "
      "\"machine\": {\"cpus\": %d, \"threads_per_rank\": %d, \"rank_cpus\": [%s], "
      "\"omp_places\": %s, \"omp_proc_bind\": %s, \"load_start\": %.2f, \"load_end\": %.2f}, "
      "\"arms\": [%s], \"tasks\": [%s]}\n",
      run.rounds, run.partial ? "true" : "false", run.resumes, run.options.block_steps,
      config.run.seed, floor.known() ? absl::StrFormat("%.6f", floor.half_width()) : "null", target,
      m.cpus, m.threads, absl::StrJoin(rank_cpus, ", "), JsonString(m.omp_places),
      JsonString(m.omp_bind), m.load_start, m.load_end, absl::StrJoin(arms, ",\n  "),
      absl::StrJoin(tasks, ", "));
}

}  // namespace freeride
