#include "trainer/report/report_jobs.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer/report/svg_plot.h"

namespace freeride {

std::string JobsSection(const RunFiles& run) {
  if (run.jobs.empty()) return "";
  std::string html =
      "<h2>Fill jobs</h2>\n<table><tr><th>id</th><th class=\"text\">name</th>"
      "<th class=\"text\">type</th><th class=\"text\">state</th><th class=\"text\">stages</th>"
      "<th>steps</th><th>work done</th><th>bubble s</th><th>alone s</th>"
      "<th class=\"text\">reason</th></tr>\n";
  std::vector<PlotSeries> series;
  for (const Job& job : run.jobs) {
    const JobProgress& p = job.progress;
    const bool failed = job.state == JobState::kFailed || job.state == JobState::kRefused;
    absl::StrAppendFormat(
        &html,
        "<tr><td>%d</td><td class=\"text\">%s</td><td class=\"text\">%s</td>"
        "<td class=\"text\">%s</td><td class=\"text\">%s</td><td>%d</td><td>%.6g %s</td>"
        "<td>%.4g</td><td>%.4g</td><td class=\"text%s\">%s</td></tr>\n",
        job.id, HtmlEscape(job.name), HtmlEscape(job.type), JobStateName(job.state),
        job.stages.empty() ? "—" : absl::StrJoin(job.stages, ", "), p.steps, p.units,
        HtmlEscape(p.unit), p.bubble_s, p.alone_s, failed ? " reason" : "", HtmlEscape(job.reason));
    auto it = run.job_progress.find(job.id);
    if (it == run.job_progress.end() || it->second.empty()) continue;
    PlotSeries line{absl::StrFormat("%d %s", job.id, job.name), {}};
    for (const auto& [step, progress] : it->second) {
      line.points.emplace_back(static_cast<double>(step), progress.bubble_s);
    }
    series.push_back(std::move(line));
  }
  html +=
      "</table>\n<p class=\"note\">Jobs submitted to the running training with "
      "<code>freeride submit</code>: bubble s is the bubble time their steps used, alone s the "
      "same work in seconds of the job run alone. <code>freeride jobs</code> lists them as they "
      "are now.</p>\n";
  if (series.empty()) return html;
  return absl::StrCat(html, "<div class=\"plots\">\n",
                      LinePlot({"Fill jobs: bubble time used", "step", "s"}, series), "</div>\n");
}

}  // namespace freeride
