#include "trainer/report/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/build_info.h"
#include "core/json_fields.h"
#include "trainer/config/config.h"
#include "trainer/report/report_format.h"
#include "trainer/report/report_header.h"
#include "trainer/report/report_jobs.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

using nlohmann::json;

constexpr const char* kStyle = R"(
svg .shade { fill: #fdf0c8; } .swatch { display: inline-block; width: 10px; height: 10px;
  margin-right: 6px; } table.header th { background: none; border: none; color: #666; }
table.header td { border: none; } details { margin: 8px 0; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.state { display: inline-block; padding: 2px 10px; border-radius: 10px; color: white; }
.finished { background: #2ca02c; } .failed { background: #d62728; }
.stopped { background: #ff7f0e; } .running { background: #1f77b4; } .study { background: #9467bd; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ccc;
  padding: 3px 8px; text-align: right; } th { background: #f3f3f3; }
td.text, th.text { text-align: left; } td { white-space: nowrap; } td.text { white-space: normal; } pre { background: #f7f7f7; padding: 10px; overflow: auto; }
.note { color: #666; } .reason { color: #b00; white-space: pre-wrap; }
svg .title { font-size: 13px; font-weight: 600; } svg .tick, svg .legend { font-size: 11px; }
svg .axis { font-size: 12px; } svg .frame { fill: none; stroke: #999; }
svg .grid { stroke: #eee; } svg .diag { stroke: #999; stroke-dasharray: 4 3; }
svg .bar-total { fill: #f6c98e; } svg .bar-part { fill: #3a7dc9; }
.timeline svg { max-width: 100%; height: auto; }
)";

std::string Fmt(double v) { return std::isfinite(v) ? absl::StrFormat("%.4g", v) : "—"; }

std::string Percent(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.1f%%", 100 * v) : "—";
}

std::string Interval(const json& v) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) return "";
  return absl::StrFormat(" [%.1f, %.1f]", 100 * v[0].get<double>(), 100 * v[1].get<double>());
}

// The overhead as the run stated it (harvest_summary's or a study arm's overhead_text: the
// estimate, its interval and where it stands against the budget); records written before that
// field existed show their estimate and interval.
std::string OverheadText(const json& row) {
  if (row.contains("overhead_text") && row["overhead_text"].is_string()) {
    return HtmlEscape(row["overhead_text"].get<std::string>());
  }
  if (!row.contains("overhead") || !row["overhead"].is_number()) return "not measured";
  return Percent(Num(row, "overhead")) + Interval(row.value("overhead_ci", json()));
}

// The run's state from its last record: the end record, else in progress (or killed).
std::string StateBadge(const RunFiles& run) {
  if (const json* end = run.Last("end")) {
    const std::string status = JsonStringOr(*end, "status", "finished");
    std::string out =
        absl::StrFormat("<span class=\"state %s\">%s at step %d</span>", HtmlEscape(status),
                        HtmlEscape(status), JsonIntOr(*end, "step", 0));
    const std::string reason = JsonStringOr(*end, "reason", "");
    if (!reason.empty()) absl::StrAppend(&out, "<p class=\"reason\">", HtmlEscape(reason), "</p>");
    return out;
  }
  if (run.study && run.metrics.empty()) return "<span class=\"state study\">study</span>";
  const json* last = run.Last("train");
  return absl::StrFormat(
      "<span class=\"state running\">in progress, or stopped without a word (killed)</span> "
      "<span class=\"note\">last step recorded: %d</span>",
      last ? JsonIntOr(*last, "step", 0) : 0);
}

// The steps that harvested (train records' `harvesting`) as x intervals of per-step plots:
// side steps fill the bubbles of those steps, so their waiting and step time differ.
std::vector<std::pair<double, double>> HarvestingSteps(const std::vector<const json*>& train) {
  std::vector<std::pair<double, double>> spans;
  for (const json* r : train) {
    if (!JsonBoolOr(*r, "harvesting", false)) continue;
    const double step = Num(*r, "step");
    if (!spans.empty() && spans.back().second >= step - 0.5 - 1e-9) {
      spans.back().second = step + 0.5;
    } else {
      spans.push_back({step - 0.5, step + 0.5});
    }
  }
  return spans;
}

// A per-step plot spec, shaded where the run harvested.
PlotSpec PerStep(const std::string& title, const std::string& y_label,
                 const std::vector<std::pair<double, double>>& harvesting) {
  PlotSpec spec{title, "step", y_label};
  spec.shaded = harvesting;
  spec.shaded_name = "side tasks ran";
  return spec;
}

// One series per stage of a per-stage list field of the train records (`bubble_s`,
// `host_peak_bytes`), each in its stage's colour; `value` turns (record, entry) into y.
template <typename Value>
std::vector<PlotSeries> PerStage(const std::vector<const json*>& train, const char* key,
                                 Value value) {
  std::vector<PlotSeries> out;
  for (const json* r : train) {
    const json list = JsonArrayOr(*r, key);
    for (size_t s = 0; s < list.size(); ++s) {
      if (out.size() <= s) {
        out.push_back({absl::StrFormat("stage %d", s), {}});
        out.back().color = StageColor(static_cast<int>(s));
      }
      out[s].points.push_back(
          {Num(*r, "step"), list[s].is_number() ? value(*r, list[s].get<double>()) : NAN});
    }
  }
  return out;
}

std::string Training(const RunFiles& run, const Config* config) {
  const std::vector<const json*> train = run.Records("train"), val = run.Records("val");
  if (train.empty() && val.empty()) return "";
  std::string html = "<h2>Training</h2>\n";
  const double tokens_per_step =
      config ? static_cast<double>(config->train.batch_size * config->train.seq_len *
                                   config->parallel.dp)
             : std::nan("");
  if (!train.empty()) {
    const RunFigures f = Figures(run);
    absl::StrAppendFormat(
        &html,
        "<table><tr><th>steps</th><th>last loss</th><th>last val loss</th><th>mean tokens/s</th>"
        "<th>mean step time</th><th>mean MFU</th><th>host memory peak</th><th>tokens per "
        "step</th></tr><tr><td>%d%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
        "<td>%s</td><td>%s</td></tr></table>\n"
        "<p class=\"note\">Means leave out step 1 (it warms up).</p>\n",
        f.steps, config ? absl::StrCat(" of ", config->train.steps) : "", Fmt(f.last_loss),
        Fmt(f.last_val), HumanNumber(f.tokens_per_s), HumanNumber(f.step_s, NumberKind::kSeconds),
        HumanNumber(f.mfu, NumberKind::kPercent),
        HumanNumber(f.host_peak_bytes, NumberKind::kBytes), HumanNumber(tokens_per_step));
  }
  html += "<div class=\"plots\">\n";
  std::vector<PlotSeries> loss = {{"train", StepSeries(train, "loss")}};
  if (!val.empty()) loss.push_back({"val", StepSeries(val, "loss"), true});
  html += LinePlot({"Loss", "step", "loss"}, loss);
  std::vector<PlotSeries> by_tokens = {{"train", TokenSeries(run, "train")}};
  if (!val.empty()) by_tokens.push_back({"val", TokenSeries(run, "val"), true});
  html += LinePlot({"Loss against tokens", "tokens", "loss"}, by_tokens);
  if (train.empty()) return html + "</div>\n";
  const std::vector<std::pair<double, double>> harvesting = HarvestingSteps(train);
  PlotSpec throughput = PerStep("Throughput", "tokens/s", harvesting);
  throughput.y_from_zero = true;
  html += LinePlot(throughput, {{"tokens/s", StepSeries(train, "tokens_per_s")}});
  PlotSpec step_time = PerStep("Step time", "step time", harvesting);
  step_time.y_from_zero = true, step_time.y_kind = NumberKind::kSeconds;
  html += LinePlot(step_time, {{"step", StepSeries(train, "step_s")}});
  if (std::any_of(train.begin(), train.end(), [](const json* r) { return r->contains("mfu"); })) {
    PlotSpec mfu = PerStep("MFU", "model FLOPs utilisation", harvesting);
    mfu.y_from_zero = true, mfu.y_kind = NumberKind::kPercent;
    html += LinePlot(mfu, {{"mfu", StepSeries(train, "mfu")}});
  }
  for (const auto& [key, title] :
       {std::pair<const char*, const char*>{"host_peak_bytes", "Host memory peak"},
        {"device_bytes", "Device memory"}}) {
    std::vector<PlotSeries> memory =
        PerStage(train, key, [](const json&, double bytes) { return bytes; });
    if (memory.empty()) continue;
    PlotSpec spec{title, "step", key[0] == 'h' ? "resident set, per stage" : "held, per stage"};
    spec.y_from_zero = true, spec.y_kind = NumberKind::kBytes, spec.legend = true;
    html += LinePlot(spec, memory);
  }
  html += LinePlot({"Learning rate", "step", "lr"}, {{"lr", StepSeries(train, "lr")}});
  html += LinePlot({"Gradient norm (before clipping)", "step", "norm"},
                   {{"norm", StepSeries(train, "grad_norm")}});
  return html + "</div>\n";
}

std::string Bubbles(const RunFiles& run) {
  const std::vector<const json*> train = run.Records("train");
  const std::vector<const json*> harvest = run.Records("harvest");
  const std::vector<const json*> bubbles = run.Records("bubble");
  const std::vector<PlotSeries> waits = PerStage(
      train, "bubble_s", [](const json& r, double wait) { return wait / Num(r, "step_s"); });
  if (waits.size() < 2 && harvest.empty() && bubbles.empty()) return "";  // one stage: no bubbles
  std::string html =
      "<h2>Bubbles</h2>\n<p class=\"note\">Waiting: time a stage's rank waited for its peers "
      "in a step (receives and the arrival part of sums). Bubble and harvested: from each "
      "BUBBLE instruction to the end of the first wait it precedes, and the side-task steps in "
      "it, over the steps with harvesting on. Shaded: steps in which side tasks could run (a "
      "side step fills the bubble, so the receive after it hardly waits). Stage colours are the "
      "same in every plot.</p>\n<div class=\"plots\">\n";
  if (waits.size() > 1) {
    PlotSpec spec = PerStep("Waiting, % of step time", "waiting", HarvestingSteps(train));
    spec.y_from_zero = true, spec.y_kind = NumberKind::kPercent;
    html += LinePlot(spec, waits);
  }
  std::vector<BarRow> rows;
  for (const json* h : harvest) {
    const int stage = JsonIntOr(*h, "stage", 0);
    const json by_kind = JsonObjectOr(*h, "by_kind");
    for (const auto& [kind, k] : by_kind.items()) {
      rows.push_back(
          {absl::StrFormat("stage %d %s", stage, kind), Num(k, "bubble_s"), Num(k, "harvested_s")});
    }
  }
  if (!rows.empty()) {
    html +=
        BarPlot("Bubble and harvested time by stage and kind", "s", "bubble", "harvested", rows);
  }
  std::map<int, PlotSeries> by_stage;  // legends list the stages in order
  for (const json* b : bubbles) {
    const double predicted = Num(*b, "predicted_s");
    if (!std::isfinite(predicted)) continue;
    const int stage = JsonIntOr(*b, "stage", 0);
    if (!by_stage.count(stage)) {
      by_stage[stage] = {absl::StrFormat("stage %d", stage), {}, true, StageColor(stage)};
    }
    by_stage[stage].points.push_back({predicted, Num(*b, "measured_s")});
  }
  std::vector<PlotSeries> scatter;
  for (auto& [stage, series] : by_stage) scatter.push_back(std::move(series));
  if (!scatter.empty()) {
    PlotSpec spec{"Bubbles: predicted against measured", "predicted", "measured"};
    spec.diagonal = true, spec.legend = true;
    spec.x_kind = spec.y_kind = NumberKind::kSeconds;
    html += LinePlot(spec, scatter);
  }
  return html + "</div>\n";
}

// The overhead budget (freeride.overhead_check): the budget, the run's interval against it, and
// every back-off and probe the guard made.
std::string OverheadBudget(const RunFiles& run, const json& summary) {
  std::string html = absl::StrFormat(
      "<h3>Overhead budget</h3>\n<p>Budget %s%s; measured over the run %s; %d back-offs; "
      "side work ended at level <em>%s</em>.</p>\n",
      Percent(Num(summary, "budget")),
      JsonStringOr(summary, "check", "") == "strict"
          ? " (strict: a level kept only while shown within it)"
          : "",
      OverheadText(summary), summary.value("back_offs", 0),
      HtmlEscape(summary.value("guard_level", "")));
  const std::vector<const json*> decisions = run.Records("overhead_guard");
  if (decisions.empty()) return html;
  html +=
      "<table><tr><th>after step</th><th class=\"text\">decision</th><th class=\"text\">from"
      "</th><th class=\"text\">to</th><th>overhead [95%]</th><th>pairs</th></tr>\n";
  for (const json* d : decisions) {
    absl::StrAppendFormat(
        &html,
        "<tr><td>%d</td><td class=\"text\">%s</td><td class=\"text\">%s</td>"
        "<td class=\"text\">%s</td><td>%s %s</td><td>%d</td></tr>\n",
        d->value("step", 0),
        d->value("action", "") == "back_off" ? "backed off" : "probed up",
        HtmlEscape(d->value("from", "")), HtmlEscape(d->value("to", "")),
        Percent(Num(*d, "overhead")), Interval(d->value("overhead_ci", json())),
        d->value("pairs", 0));
  }
  return html + "</table>\n";
}

std::string SideTasks(const RunFiles& run) {
  std::string html;
  if (const json* s = run.Last("harvest_summary")) {
    absl::StrAppendFormat(
        &html,
        "<h2>Overhead and reclaimed work</h2>\n<table><tr><th>overhead</th><th>reclaimed</th>"
        "<th>side work, s</th><th>training device time, s</th></tr><tr><td>%s</td><td>%s</td>"
        "<td>%s</td><td>%s</td></tr></table>\n<p class=\"note\">Overhead: mean step time with "
        "harvesting over mean step time without, minus 1, from blocks that alternate in this "
        "run (freeride.alternate_every; none: not measured). Reclaimed: the side work done in "
        "bubbles, in the seconds the same tasks need alone, over the training's device-seconds "
        "of all ranks. <code>freeride study</code> gives both with 95%% intervals.</p>\n",
        OverheadText(*s),
        Percent(Num(*s, "reclaimed")), Fmt(Num(*s, "side_work_s")), Fmt(Num(*s, "device_s")));
    if ((*s)["budget"].is_number()) html += OverheadBudget(run, *s);
  }
  // A fill job's record is one part's view of it (STOPPED at a stop, where the queue has it
  // PENDING again); the Fill jobs table shows each job once, over the whole run.
  std::set<std::string> configured, jobs;
  if (absl::StatusOr<Config> c = ParseConfig(run.config_toml, "config.toml"); c.ok()) {
    for (const SideTaskConfig& t : c->side_tasks)
      configured.insert(t.name.empty() ? t.type : t.name);
  }
  for (const Job& job : run.jobs) jobs.insert(job.name);
  std::vector<const json*> tasks;
  int job_rows = 0;
  for (const json& t : run.side_tasks) {
    const std::string name = JsonStringOr(t, "name", "");
    if (jobs.count(name) > 0 && configured.count(name) == 0) {
      ++job_rows;
      continue;
    }
    tasks.push_back(&t);
  }
  if (tasks.empty()) return html;
  html +=
      "<h2>Side tasks</h2>\n<table><tr><th>rank</th><th class=\"text\">task</th>"
      "<th class=\"text\">type</th><th class=\"text\">isolation</th><th class=\"text\">state</th>"
      "<th>steps</th><th>work done</th><th>harvested</th><th>overruns</th><th>overrun</th>"
      "<th>restarts</th><th class=\"text\">summary or failure</th></tr>\n";
  for (const json* task : tasks) {
    const json& t = *task;
    const std::string reason = JsonStringOr(t, "reason", "");
    absl::StrAppendFormat(
        &html,
        "<tr><td>%d</td><td class=\"text\">%s</td><td class=\"text\">%s</td>"
        "<td class=\"text\">%s</td><td class=\"text\">%s</td><td>%d</td><td>%s %s</td>"
        "<td>%s</td><td>%d</td><td>%s</td><td>%d</td><td class=\"text%s\">%s</td></tr>\n",
        JsonIntOr(t, "rank", 0), HtmlEscape(JsonStringOr(t, "name", "")), HtmlEscape(JsonStringOr(t, "type", "")),
        HtmlEscape(JsonStringOr(t, "isolation", "")), HtmlEscape(JsonStringOr(t, "state", "")), JsonIntOr(t, "steps", 0),
        HumanNumber(Num(t, "units")), HtmlEscape(JsonStringOr(t, "unit", "")),
        HumanNumber(Num(t, "harvested_s"), NumberKind::kSeconds), JsonIntOr(t, "overruns", 0),
        HumanNumber(Num(t, "overrun_s"), NumberKind::kSeconds), JsonIntOr(t, "restarts", 0),
        reason.empty() ? "" : " reason",
        HtmlEscape(reason.empty() ? JsonStringOr(t, "summary", "") : reason));
  }
  html +=
      "</table>\n<p class=\"note\">Each task over the whole run: a resumed run's parts "
      "summed, with each part's summary after its steps.";
  if (job_rows > 0) html += " Fill jobs are in the Fill jobs table, once each, over the whole run.";
  return html + "</p>\n";
}

std::string Study(const RunFiles& run) {
  if (!run.study || !run.study->contains("arms")) return "";
  const json& study = *run.study;
  std::string html = absl::StrFormat(
      "<h2>Study</h2>\n<p>Rounds: %d, of blocks of %d steps; A/A noise floor: %s.</p>\n"
      "<table><tr><th class=\"text\">arm</th><th>steps</th><th>step s</th>"
      "<th>overhead [95%%]</th><th>utilisation [95%%]</th><th>reclaimed [95%%]</th>"
      "<th class=\"text\">refused</th></tr>\n",
      JsonIntOr(study, "rounds", 0), JsonIntOr(study, "block_steps", 0),
      study.contains("noise_floor") && study["noise_floor"].is_number()
          ? absl::StrFormat("±%.2f%%", 100 * study["noise_floor"].get<double>())
          : "not measured");
  if (JsonBoolOr(study, "partial", false)) {
    html +=
        "<p class=\"note\">Partial: the study was stopped, and these are the figures of the "
        "rounds it completed; the same command with <code>--resume</code> adds the rest.</p>\n";
  }
  std::vector<BarRow> rows;
  for (const json& arm : study["arms"]) {
    const std::string name = JsonStringOr(arm, "arm", "");
    absl::StrAppendFormat(
        &html,
        "<tr><td class=\"text\">%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s%s</td>"
        "<td>%s%s</td><td class=\"text\">%s</td></tr>\n",
        HtmlEscape(name), JsonIntOr(arm, "steps", 0), Fmt(Num(arm, "step_s")),
        arm.contains("overhead") && arm["overhead"].is_number() ? OverheadText(arm) : "—",
        Percent(Num(arm, "utilisation")), Interval(JsonArrayOr(arm, "utilisation_ci")),
        Percent(Num(arm, "reclaimed")), Interval(JsonArrayOr(arm, "reclaimed_ci")),
        arm.contains("refused") && arm["refused"].is_string()
            ? HtmlEscape(arm["refused"].get<std::string>())
            : "");
    rows.push_back({name, Num(arm, "bubble_s"), Num(arm, "harvested_s")});
  }
  html += "</table>\n<div class=\"plots\">\n";
  html += BarPlot("Bubble and harvested time per arm", "s", "bubble", "harvested", rows);
  return html + "</div>\n";
}

}  // namespace

const char* ReportStyle() { return kStyle; }

std::string RenderReport(const RunFiles& run) {
  absl::StatusOr<Config> config = ParseConfig(run.config_toml, "config.toml");
  const Config* cfg = !run.config_toml.empty() && config.ok() ? &*config : nullptr;
  std::string html = absl::StrFormat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<title>freeride report: %s</title>\n<style>%s</style></head><body>\n"
      "<h1>freeride report: %s</h1>\n%s\n",
      HtmlEscape(run.dir), kStyle, HtmlEscape(run.dir), StateBadge(run));
  html += RunHeader(run);
  if (cfg) {
    absl::StrAppendFormat(
        &html,
        "<p>GPT-2 %d layers × %d wide, vocabulary %d; %s on %s, pp %d × dp %d, %d "
        "micro-batches of %d × %d tokens per step; side tasks %s.</p>\n",
        cfg->model.n_layer, cfg->model.n_embd, cfg->model.vocab_size,
        HtmlEscape(cfg->parallel.schedule), HtmlEscape(cfg->runtime.device), cfg->parallel.pp,
        cfg->parallel.dp, cfg->train.microbatches, cfg->train.batch_size / cfg->train.microbatches,
        cfg->train.seq_len, cfg->freeride.enabled ? "on" : "off");
  }
  html += Training(run, cfg);
  html += Bubbles(run);
  html += SideTasks(run);
  html += JobsSection(run);
  html += Study(run);
  if (!run.timeline_svg.empty()) {
    absl::StrAppend(
        &html,
        "<h2>Timeline of a measured step</h2>\n<p class=\"note\">Every rank's "
        "recorded steps, side-task steps on their own tracks: trace.json beside "
        "this page (open it in ui.perfetto.dev).",
        cfg && cfg->runtime.emulate_peers
            ? absl::StrFormat(" Emulated stages (runtime.emulate_peers): one process ran stage "
                              "%d for real and stood in for its peers' messages, so the other "
                              "stages' rows are empty: nothing ran there to measure.",
                              cfg->runtime.emulated_stage)
            : "",
        "</p>\n<div class=\"timeline\">", run.timeline_svg, "</div>\n");
  }
  html += ConfigSection(run);
  if (!run.notes.empty()) {
    absl::StrAppend(
        &html, "<h2>Left out</h2>\n<ul><li>",
        absl::StrJoin(run.notes, "</li><li>",
                      [](std::string* out, const std::string& n) { out->append(HtmlEscape(n)); }),
        "</li></ul>\n");
  }
  std::string made_by = "made by freeride report";
  for (const auto& [name, value] : BuildInfo()) {
    if (name == "version" || name == "commit") absl::StrAppend(&made_by, ", ", name, " ", value);
  }
  absl::StrAppend(&html, "<p class=\"note\">", HtmlEscape(made_by), "</p>\n</body></html>\n");
  return html;
}

}  // namespace freeride
