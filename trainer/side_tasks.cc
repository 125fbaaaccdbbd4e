// The trainer's side tasks: this rank's executor, created from the config, and the harvest
// report at the end of a run: per stage and bubble kind the measured bubble, harvested and
// overrun time, utilisation; per task its state and work; the overhead (alternating blocks)
// and the reclaimed fraction. Gathered over every rank,
// printed and written by rank 0 (metrics.jsonl), task records by each rank.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "core/json_string.h"
#include "core/logging.h"
#include "trainer/config/side_task_check.h"
#include "trainer/jobs/job_runner.h"
#include "trainer/study_stats.h"
#include "trainer/tensorboard.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

// The lines of `path` (a side_tasks_rankNNN.jsonl) written by earlier parts of this run: at or
// before `resumed_at`. A line that does not parse (cut short by a kill) is dropped.
std::string EarlierSideTaskRecords(const std::string& path, int64_t resumed_at) {
  std::string kept;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return kept;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_discarded() || !r.is_object()) continue;
    if (JsonIntOr(r, "step", resumed_at + 1) <= resumed_at) absl::StrAppend(&kept, line, "\n");
  }
  return kept;
}

// Runs of steps with the same state are the blocks, each its mean step time.
std::vector<Block> AlternatingBlocks(const std::vector<std::pair<bool, double>>& steps) {
  std::vector<Block> blocks;
  std::vector<int> counts;
  for (const auto& [harvesting, step_s] : steps) {
    const int arm = harvesting ? 1 : 0;
    if (blocks.empty() || blocks.back().arm != arm) {
      blocks.push_back({arm, 0});
      counts.push_back(0);
    }
    blocks.back().step_s += step_s;
    ++counts.back();
  }
  for (size_t b = 0; b < blocks.size(); ++b) blocks[b].step_s /= counts[b];
  // Only blocks with a plain block on either side: the run's first block holds its warm-up
  // (caches, the bubbles re-placed after step 1) and biased short runs upwards (+14% over 5
  // blocks of the quickstart's 40 steps), and its last may be cut short. The overhead guard
  // pairs the same way.
  if (!blocks.empty() && blocks.back().arm == 1) blocks.pop_back();
  if (!blocks.empty() && blocks.front().arm == 1) blocks.erase(blocks.begin());
  return blocks;
}

}  // namespace

std::optional<Estimate> AlternatingOverhead(const std::vector<std::pair<bool, double>>& steps) {
  // Paired as a study pairs them (trainer/study_stats.h).
  const std::vector<double> ratios = PairedRatios(AlternatingBlocks(steps), 2)[1];
  if (ratios.empty()) return std::nullopt;
  return MeanWithInterval(ratios);
}

std::optional<OverheadFigure> AlternatingOverheadFigure(
    const std::vector<std::pair<bool, double>>& steps, double budget) {
  const std::optional<Estimate> estimate = AlternatingOverhead(steps);
  if (!estimate) return std::nullopt;
  return OverheadFigure{*estimate, PlainBlockNoise(AlternatingBlocks(steps)), budget};
}

absl::Status Trainer::CreateSideTasks() {
  if (!config_.freeride.enabled) return absl::OkStatus();
  if (absl::Status s = CheckSideTaskPlacement(config_, SideRooms(memory_plans_)); !s.ok()) {
    return s;
  }
  std::vector<SideTaskSpec> specs;
  for (const SideTaskConfig& task : config_.side_tasks) {
    const bool here = task.stages.empty() ||
                      std::find(task.stages.begin(), task.stages.end(), layout_.stage) !=
                          task.stages.end();
    if (here) specs.push_back(SpecOf(task));
  }
  // With fill jobs, every rank has an executor: a job may be placed on any stage.
  if (specs.empty() && !config_.freeride.jobs) return absl::OkStatus();
  ExecutorOptions options;
  options.rank = transport_->rank();
  options.stage = layout_.stage;
  options.margin = config_.freeride.margin;
  options.calibration_steps = static_cast<int>(config_.freeride.calibration_steps);
  options.step_timeout_s = config_.freeride.step_timeout_s;
  options.demote_after = static_cast<int>(config_.freeride.demote_after);
  options.serve_reserve = config_.freeride.serve_reserve;
  options.results_dir = (std::filesystem::path(config_.run.dir) / "side_tasks").string();
  options.clock = clock_;
  absl::StatusOr<std::unique_ptr<SideTaskExecutor>> side = SideTaskExecutor::Create(specs, options);
  if (!side.ok()) return side.status();
  side_ = *std::move(side);
  executor_->set_bubble_hook(side_.get());
  SeedBubblePredictions();
  if (config_.freeride.overhead_check != "off") {
    OverheadGuardOptions guard;
    guard.budget = config_.freeride.max_overhead;
    guard.strict = config_.freeride.overhead_check == "strict";
    if (const int64_t every = config_.freeride.alternate_every; every > 0) {
      guard.plain_steps = guard.harvest_steps = every;
    }
    guard_ = std::make_unique<OverheadGuard>(guard);
  }
  return absl::OkStatus();
}

absl::Status Trainer::CreateJobRunner() {
  if (!side_ || !config_.freeride.jobs) return absl::OkStatus();
  JobRunner::Options options;
  options.config = &config_;
  options.transport = transport_;
  options.layout = layout_;
  options.leader = leader();
  options.executor = side_.get();
  const RankMemoryPlan& memory = memory_plans_[layout_.stage];
  options.device_bytes = memory.device_bytes;
  options.planned_peak_bytes = memory.peak_bytes;
  absl::StatusOr<std::unique_ptr<JobRunner>> jobs = JobRunner::Create(options);
  if (!jobs.ok()) return jobs.status();
  jobs_ = *std::move(jobs);
  return absl::OkStatus();
}

void Trainer::SeedBubblePredictions() {
  if (!side_) return;
  const RankMemoryPlan& memory = memory_plans_[layout_.stage];
  side_->SetSchedule(executor_->schedule().per_stage[layout_.stage], schedule_seconds_per_ms_,
                     memory.device_bytes > 0 ? memory.side_bytes : -1);
}

void Trainer::IndexBubbles() {
  bubble_slots_.clear();
  if (!config_.freeride.enabled) return;
  const pipeline::Schedule& schedule = executor_->schedule();
  for (int st = 0; st < layout_.pp; ++st) {
    for (size_t i = 0; i < schedule.per_stage[st].size(); ++i) {
      if (schedule.per_stage[st][i].op == pipeline::Op::kBubble) {
        bubble_slots_.emplace_back(st, static_cast<int>(i));
      }
    }
  }
}

absl::Status Trainer::ReportHarvest() {
  constexpr int K = pipeline::kNumBubbleKinds;
  const int pp = layout_.pp;
  std::vector<double> table(static_cast<size_t>(pp) * 3 * K, 0.0);
  // Work done in bubbles in seconds of the tasks alone, and training device-seconds.
  std::vector<double> totals(2, 0.0);
  for (const auto& [harvesting, step_s] : timed_steps_) totals[1] += step_s;
  const std::vector<int> world = transport_->AllRanks();
  // An executor that never had a task (kept only to place fill jobs) reports nothing: the
  // table stays that of the stages that ran side work.
  if (side_ && !side_->Report().tasks.empty()) {
    const HarvestReport report = side_->Report();
    if (layout_.replica == 0) {
      for (int k = 0; k < K; ++k) {
        table[(layout_.stage * 3 + 0) * K + k] = report.bubble_s[k];
        table[(layout_.stage * 3 + 1) * K + k] = report.harvested_s[k];
        table[(layout_.stage * 3 + 2) * K + k] = report.overrun_s[k];
      }
    }
    const std::string path = (std::filesystem::path(config_.run.dir) /
                              absl::StrFormat("side_tasks_rank%03d.jsonl", transport_->rank()))
                                 .string();
    // A resumed run's file keeps the records of the runs before it (up to the step resumed
    // from: the metrics rows after it are trimmed as well), so that the report sums every
    // part of the run; each record says the steps it covers.
    std::string lines = first_step_ > 0 ? EarlierSideTaskRecords(path, first_step_) : "";
    for (const TaskReport& t : report.tasks) {
      totals[0] += t.units * t.standalone_unit_s;
      FR_LOG(INFO) << absl::StrFormat(
          "side task '%s' (%s, %s): %s, %d steps, %.6g %s in bubbles (%.3f s), alone %.3f "
          "ms/step, overrun %.4f s, %d pauses, %d restarts, memory peak %s (%s)%s%s",
          t.name, t.type, t.isolation, t.state, t.steps, t.units, t.unit, t.harvested_s,
          t.standalone_step_s * 1e3, t.overrun_s, t.pauses, t.restarts,
          FormatByteSize(t.memory_peak_bytes), t.memory_peak_note,
          t.reason.empty() ? "" : "; reason: " + t.reason,
          t.summary.empty() ? "" : "; " + t.summary);
      absl::StrAppendFormat(
          &lines,
          "{\"kind\": \"side_task\", \"step\": %d, \"from_step\": %d, \"rank\": %d, "
          "\"stage\": %d, \"name\": %s, "
          "\"type\": %s, \"isolation\": %s, \"state\": %s, \"steps\": %d, \"units\": %.6g, "
          "\"unit\": %s, \"harvested_s\": %.6f, \"standalone_step_s\": %.6f, \"overrun_s\": %.6f, "
          "\"overruns\": %d, \"pauses\": %d, \"restarts\": %d, \"memory_peak_bytes\": %d, "
          "\"memory_peak_note\": %s, \"reason\": %s, \"summary\": %s}\n",
          step_, first_step_, transport_->rank(), layout_.stage, JsonString(t.name),
          JsonString(t.type), JsonString(t.isolation), JsonString(t.state), t.steps, t.units,
          JsonString(t.unit), t.harvested_s, t.standalone_step_s, t.overrun_s, t.overruns, t.pauses,
          t.restarts, t.memory_peak_bytes, JsonString(t.memory_peak_note), JsonString(t.reason),
          JsonString(t.summary));
    }
    absl::Status s = WriteFileAtomically(path, lines);
    if (!s.ok()) return s;
  }
  for (std::vector<double>* v : {&table, &totals}) {
    absl::Status s = transport_->AllReduceSum(v->data(), static_cast<int64_t>(v->size()), world,
                                              config_.runtime.comm_timeout_s);
    if (!s.ok()) return s;
  }
  if (!leader()) return absl::OkStatus();
  // Every rank's records of this part as TensorBoard scalars (side_task/<name>/rank<R>/*):
  // each rank wrote its file before the sums above, so the leader finds them there (on one
  // machine, or a shared file system).
  if (tensorboard_) {
    std::error_code ec;
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(config_.run.dir, ec)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "side_tasks_rank") && absl::EndsWith(name, ".jsonl")) {
        files.push_back(e.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    for (const std::string& file : files) {
      absl::StatusOr<std::string> text = ReadFile(file);
      if (!text.ok()) continue;
      for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
        const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
        if (r.is_discarded() || JsonIntOr(r, "from_step", -1) != first_step_) continue;
        if (absl::Status s = tensorboard_->AddRows(line); !s.ok()) return s;
      }
    }
  }
  // How far each kind's bubble predictions were from the measured bubbles (median, p95).
  auto error_quantiles = [&](int st, int k) {
    std::vector<double> e = prediction_errors_.empty()
                                ? std::vector<double>{}
                                : prediction_errors_[static_cast<size_t>(st) * K + k];
    std::sort(e.begin(), e.end());
    if (e.empty()) return std::pair<double, double>{NAN, NAN};
    const size_t p95 = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(e.size()))) - 1;
    return std::pair<double, double>{e[(e.size() - 1) / 2], e[p95]};
  };
  FR_LOG(INFO) << "harvest: stage  kind      bubble_s  harvested_s  utilisation  overrun_s  "
                  "pred_err_ms(median p95)";
  for (int st = 0; st < pp; ++st) {
    double bubble = 0, harvested = 0, overrun = 0;
    std::vector<std::string> by_kind;
    for (int k = 1; k < K; ++k) {
      const double b = table[(st * 3 + 0) * K + k], h = table[(st * 3 + 1) * K + k];
      const double o = table[(st * 3 + 2) * K + k];
      bubble += b, harvested += h, overrun += o;
      if (b == 0) continue;
      const std::string kind(pipeline::BubbleKindName(static_cast<pipeline::BubbleKind>(k)));
      const auto [median, p95] = error_quantiles(st, k);
      FR_LOG(INFO) << absl::StrFormat("harvest: %5d  %-8s %9.3f  %11.3f  %10.1f%%  %9.4f  %8.3f %8.3f",
                                      st, kind, b, h, 100 * h / b, o, median * 1e3, p95 * 1e3);
      auto number = [](double v) {
        return std::isfinite(v) ? absl::StrFormat("%.6f", v) : std::string("null");
      };
      by_kind.push_back(absl::StrFormat(
          "\"%s\": {\"bubble_s\": %.6f, \"harvested_s\": %.6f, \"overrun_s\": %.6f, "
          "\"prediction_error_s\": {\"median\": %s, \"p95\": %s}}",
          kind, b, h, o, number(median), number(p95)));
    }
    if (bubble == 0 && harvested == 0) continue;  // no rank there (emulated) or no bubbles
    const double util = bubble > 0 ? harvested / bubble : 0;
    FR_LOG(INFO) << absl::StrFormat("harvest: %5d  %-8s %9.3f  %11.3f  %10.1f%%  %9.4f", st,
                                    "all", bubble, harvested, 100 * util, overrun);
    WriteMetric(absl::StrFormat(
        "{\"kind\": \"harvest\", \"step\": %d, \"stage\": %d, \"bubble_s\": %.6f, "
        "\"harvested_s\": %.6f, \"utilisation\": %.6f, \"overrun_s\": %.6f, \"by_kind\": {%s}}",
        step_, st, bubble, harvested, util, overrun, absl::StrJoin(by_kind, ", ")));
  }
  const double reclaimed = totals[1] > 0 ? totals[0] / totals[1] : 0;
  // One figure, stated alike here, in harvest_summary, the report and TensorBoard.
  std::optional<OverheadFigure> figure = AlternatingOverheadFigure(
      timed_steps_, guard_ ? guard_->options().budget : config_.freeride.max_overhead);
  if (figure && guard_ && guard_->level() == SideLevel::kPaused &&
      guard_->LevelOverhead().known()) {
    // Paused, the blocks still alternate, plain against plain: the host's own noise, at the
    // guard's block lengths.
    figure->noise = guard_->LevelOverhead();
  }
  std::string overhead = "null", interval = "null", noise = "null", verdict = "null",
              text = "null";
  if (figure) {
    const Estimate* e = &figure->estimate;
    overhead = absl::StrFormat("%.6f", e->mean);
    if (e->known()) interval = absl::StrFormat("[%.6f, %.6f]", e->lo, e->hi);
    if (figure->noise.known()) noise = absl::StrFormat("%.6f", figure->noise.half_width());
    verdict = absl::StrFormat("\"%s\"", OverheadVerdictName(figure->verdict()));
    text = JsonString(DescribeOverhead(*figure));
    FR_LOG(INFO) << "overhead: " << DescribeOverhead(*figure)
                 << (e->known()
                         ? absl::StrFormat(" (95%% interval over %d blocks with side tasks, each "
                                           "against the blocks without on either side, as "
                                           "freeride study computes it)",
                                           e->n)
                         : std::string(": indicative only; `freeride study` measures it with an "
                                       "interval, beside an A/A noise floor"));
  }
  FR_LOG(INFO) << absl::StrFormat(
      "reclaimed: %.2f%% (side work worth %.3f s of the tasks alone, over %.3f training "
      "device-seconds)",
      100 * reclaimed, totals[0], totals[1]);
  std::string budget = "null", level = "null";
  if (guard_) {
    const double b = guard_->options().budget;
    budget = absl::StrFormat("%.6f", b);
    level = absl::StrFormat("\"%s\"", SideLevelName(guard_->level()));
    std::string why;
    if (guard_->level() == SideLevel::kPaused) {
      // Paused, the blocks still alternate, plain against plain: the host's own noise.
      const Estimate noise = guard_->LevelOverhead();
      const bool strict = guard_->options().strict;
      why = strict && !(noise.known() && noise.hi > b)
                ? absl::StrFormat(
                      " (no side work: strict, and no level with side work was shown "
                      "within %.1f%% here)",
                      100 * b)
            : strict ? absl::StrFormat(
                           " (no side work: with none, blocks still differ by %+.1f%% [%+.1f%%, "
                           "%+.1f%%] here, so no level with side work can be shown within %.1f%%; "
                           "overhead_check = \"on\" keeps side work until harm is shown)",
                           100 * noise.mean, 100 * noise.lo, 100 * noise.hi, 100 * b)
                     : " (no side work: every level with some cost more than the budget here)";
    }
    FR_LOG(INFO) << absl::StrFormat(
        "overhead budget (%s, %g%%; the overhead line says where the run stands): %d back-offs; "
        "side work ended at level '%s'%s",
        guard_->options().strict ? "strict" : "on", 100 * b, guard_->back_offs(),
        SideLevelName(guard_->level()), why);
  }
  WriteMetric(absl::StrFormat(
      "{\"kind\": \"harvest_summary\", \"step\": %d, \"overhead\": %s, \"overhead_ci\": %s, "
      "\"overhead_noise\": %s, \"overhead_verdict\": %s, \"overhead_text\": %s, "
      "\"reclaimed\": %.6f, \"side_work_s\": %.6f, \"device_s\": %.6f, \"budget\": %s, "
      "\"back_offs\": %d, \"guard_level\": %s, \"check\": \"%s\"}",
      step_, overhead, interval, noise, verdict, text, reclaimed, totals[0], totals[1], budget,
      guard_ ? guard_->back_offs() : 0, level, config_.freeride.overhead_check));
  return absl::OkStatus();
}

}  // namespace freeride
