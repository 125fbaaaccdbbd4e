#include "trainer/report/report_compare.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/json_fields.h"
#include "trainer/report/report.h"
#include "trainer/report/report_format.h"
#include "trainer/report/report_header.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

using nlohmann::json;

std::string State(const RunFiles& run) {
  if (const json* end = run.Last("end")) {
    return absl::StrFormat("%s at step %d", JsonStringOr(*end, "status", "finished"),
                           JsonIntOr(*end, "step", 0));
  }
  const json* last = run.Last("train");
  return absl::StrFormat("no end record (running or killed), last step %d",
                         last ? JsonIntOr(*last, "step", 0) : 0);
}

std::string Name(size_t i) { return absl::StrFormat("run %d", i + 1); }

// One plot of every run's series `get` returns, run i in SeriesColor(i).
template <typename Get>
std::string Shared(PlotSpec spec, const std::vector<RunFiles>& runs, Get get) {
  std::vector<PlotSeries> series;
  for (size_t i = 0; i < runs.size(); ++i) {
    PlotSeries s{Name(i), get(runs[i])};
    s.color = SeriesColor(static_cast<int>(i));
    series.push_back(std::move(s));
  }
  return LinePlot(spec, series);
}

std::string FiguresTable(const std::vector<RunFiles>& runs) {
  std::string html =
      "<table><tr><th class=\"text\">run</th><th class=\"text\">directory</th>"
      "<th class=\"text\">state</th><th class=\"text\">date</th><th class=\"text\">commit</th>"
      "<th>last loss</th><th>last val loss</th><th>tokens/s</th><th>step time</th><th>MFU</th>"
      "<th>host memory peak</th><th>wall time</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunFiles& run = runs[i];
    const RunFigures f = Figures(run);
    const json info = run.run_info.value_or(json::object());
    absl::StrAppendFormat(
        &html,
        "<tr><td class=\"text\"><span class=\"swatch\" style=\"background:%s\"></span>%s</td>"
        "<td class=\"text\">%s</td><td class=\"text\">%s</td><td class=\"text\">%s</td>"
        "<td class=\"text\">%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
        "<td>%s</td><td>%s</td></tr>\n",
        SeriesColor(static_cast<int>(i)), Name(i), HtmlEscape(run.dir), HtmlEscape(State(run)),
        HtmlEscape(RunDate(run)), HtmlEscape(JsonStringOr(info, "commit", "—")),
        absl::StrFormat("%.4g", f.last_loss),
        std::isfinite(f.last_val) ? absl::StrFormat("%.4g", f.last_val) : "—",
        HumanNumber(f.tokens_per_s), HumanNumber(f.step_s, NumberKind::kSeconds),
        HumanNumber(f.mfu, NumberKind::kPercent),
        HumanNumber(f.host_peak_bytes, NumberKind::kBytes),
        HumanNumber(WallSeconds(run), NumberKind::kSeconds));
  }
  return html +
         "</table>\n<p class=\"note\">Means of tokens/s, step time and MFU leave out step 1 (it "
         "warms up); memory is the largest resident set of any stage's process.</p>\n";
}

std::string ConfigDifferences(const std::vector<RunFiles>& runs) {
  std::vector<std::map<std::string, std::string>> configs;
  std::set<std::string> keys;
  for (const RunFiles& run : runs) {
    configs.push_back(FlattenToml(run.config_toml));
    for (const auto& [key, value] : configs.back()) keys.insert(key);
  }
  std::string rows;
  for (const std::string& key : keys) {
    // run.dir names each run's own directory: always different, never the point.
    if (key == "run.dir" || key == "checkpoint.dir") continue;
    std::set<std::string> values;
    for (const auto& c : configs) values.insert(c.count(key) ? c.at(key) : "");
    if (values.size() < 2) continue;
    absl::StrAppend(&rows, "<tr><td class=\"text\"><code>", HtmlEscape(key), "</code></td>");
    for (const auto& c : configs) {
      absl::StrAppend(&rows, "<td class=\"text\">",
                      c.count(key) ? HtmlEscape(c.at(key)) : std::string("—"), "</td>");
    }
    rows += "</tr>\n";
  }
  std::string html = "<h2>Config differences</h2>\n";
  if (rows.empty()) return html + "<p>The runs' configs are the same (run.dir aside).</p>\n";
  html += "<table class=\"config-diff\"><tr><th class=\"text\">key</th>";
  for (size_t i = 0; i < runs.size(); ++i)
    absl::StrAppend(&html, "<th class=\"text\">", Name(i), "</th>");
  return absl::StrCat(html, "</tr>\n", rows, "</table>\n");
}

}  // namespace

std::string RenderComparison(const std::vector<RunFiles>& runs) {
  std::string html = absl::StrFormat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<title>freeride comparison of %d runs</title>\n<style>%s</style></head><body>\n"
      "<h1>freeride comparison of %d runs</h1>\n",
      runs.size(), ReportStyle(), runs.size());
  html += FiguresTable(runs);
  html += "<h2>Training</h2>\n<div class=\"plots\">\n";
  html += Shared({"Loss", "step", "loss"}, runs,
                 [](const RunFiles& r) { return StepSeries(r.Records("train"), "loss"); });
  PlotSpec by_tokens{"Loss against tokens", "tokens", "loss"};
  html += Shared(by_tokens, runs, [](const RunFiles& r) { return TokenSeries(r, "train"); });
  html += Shared({"Validation loss", "step", "val loss"}, runs,
                 [](const RunFiles& r) { return StepSeries(r.Records("val"), "loss"); });
  PlotSpec throughput{"Throughput", "step", "tokens/s"};
  throughput.y_from_zero = true;
  html += Shared(throughput, runs,
                 [](const RunFiles& r) { return StepSeries(r.Records("train"), "tokens_per_s"); });
  PlotSpec step_time{"Step time", "step", "step time"};
  step_time.y_from_zero = true, step_time.y_kind = NumberKind::kSeconds;
  html += Shared(step_time, runs,
                 [](const RunFiles& r) { return StepSeries(r.Records("train"), "step_s"); });
  PlotSpec mfu{"MFU", "step", "model FLOPs utilisation"};
  mfu.y_from_zero = true, mfu.y_kind = NumberKind::kPercent;
  html +=
      Shared(mfu, runs, [](const RunFiles& r) { return StepSeries(r.Records("train"), "mfu"); });
  PlotSpec memory{"Host memory peak (largest stage)", "step", "resident set"};
  memory.y_from_zero = true, memory.y_kind = NumberKind::kBytes;
  html += Shared(memory, runs, [](const RunFiles& r) { return PeakHostSeries(r); });
  html += "</div>\n";
  html += ConfigDifferences(runs);
  return html + "<p class=\"note\">made by freeride report</p>\n</body></html>\n";
}

}  // namespace freeride
