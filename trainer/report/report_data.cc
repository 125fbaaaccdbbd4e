#include "trainer/report/report_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "trainer/config/config.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The records of a JSON-lines file; a line that does not parse is noted and left out (the
// last one, while a run writes it, often does).
std::vector<json> ReadJsonLines(const std::string& path, std::vector<std::string>* notes) {
  std::vector<json> records;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return records;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      notes->push_back(
          absl::StrFormat("%s line %d is not a JSON object (cut short while the "
                          "run writes it?): left out",
                          fs::path(path).filename().string(), line_number));
      continue;
    }
    records.push_back(std::move(record));
  }
  return records;
}

// Files in `dir` named PREFIX + digits + SUFFIX, by their number.
std::vector<std::string> RankFiles(const std::string& dir, const std::string& prefix,
                                   const std::string& suffix) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string digits =
          name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
      if (std::all_of(digits.begin(), digits.end(), ::isdigit)) paths.push_back(e.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

json WholeRunTaskRecord(const std::vector<json>& parts) {
  if (parts.size() == 1) return parts.front();
  json whole = parts.back();  // its state, reason and identity: where the run ended
  for (const char* key : {"steps", "overruns", "pauses", "restarts"}) {
    int64_t sum = 0;
    for (const json& p : parts) sum += JsonIntOr(p, key, 0);
    whole[key] = sum;
  }
  for (const char* key : {"units", "harvested_s", "overrun_s"}) {
    double sum = 0;
    for (const json& p : parts) sum += JsonNumberOr(p, key, 0);
    whole[key] = sum;
  }
  int64_t peak = 0;
  std::vector<std::string> summaries;
  for (const json& p : parts) {
    peak = std::max(peak, JsonIntOr(p, "memory_peak_bytes", 0));
    const std::string summary = JsonStringOr(p, "summary", "");
    if (summary.empty()) continue;
    summaries.push_back(absl::StrFormat("steps %d–%d: %s", JsonIntOr(p, "from_step", 0),
                                        JsonIntOr(p, "step", 0), summary));
  }
  whole["memory_peak_bytes"] = peak;
  whole["summary"] = absl::StrJoin(summaries, "; ");
  whole["from_step"] = JsonIntOr(parts.front(), "from_step", 0);
  whole["parts"] = static_cast<int64_t>(parts.size());
  return whole;
}

std::vector<const json*> RunFiles::Records(const std::string& kind) const {
  std::vector<const json*> out;
  for (const json& r : metrics) {
    if (JsonStringOr(r, "kind", "") == kind) out.push_back(&r);
  }
  return out;
}

const json* RunFiles::Last(const std::string& kind) const {
  for (auto it = metrics.rbegin(); it != metrics.rend(); ++it) {
    if (JsonStringOr(*it, "kind", "") == kind) return &*it;
  }
  return nullptr;
}

absl::StatusOr<RunFiles> LoadRunFiles(const std::string& dir) {
  RunFiles run;
  run.dir = dir;
  const fs::path root(dir);
  std::error_code ec;
  const bool any = fs::exists(root / "metrics.jsonl", ec) || fs::exists(root / "study.json", ec) ||
                   fs::exists(root / "config.toml", ec);
  if (!fs::is_directory(root, ec) || !any) {
    return absl::NotFoundError(absl::StrFormat(
        "%s is not a run directory: expected metrics.jsonl, study.json or config.toml there "
        "(the run.dir of `freeride train` or `freeride study`)",
        dir));
  }
  run.metrics = ReadJsonLines((root / "metrics.jsonl").string(), &run.notes);
  // A resumed run's file holds a record per task per part of the run, in order.
  std::map<std::pair<int, std::string>, std::vector<json>> tasks;
  for (const std::string& path : RankFiles(dir, "side_tasks_rank", ".jsonl")) {
    for (json& r : ReadJsonLines(path, &run.notes)) {
      const std::pair<int, std::string> key{JsonIntOr(r, "rank", 0), JsonStringOr(r, "name", "")};
      tasks[key].push_back(std::move(r));
    }
  }
  for (auto& [key, parts] : tasks) run.side_tasks.push_back(WholeRunTaskRecord(parts));
  if (absl::StatusOr<std::string> text = ReadFile((root / "study.json").string()); text.ok()) {
    json study = json::parse(*text, nullptr, false);
    if (study.is_discarded()) {
      run.notes.push_back("study.json does not parse as JSON: its arms are left out");
    } else {
      run.study = std::move(study);
    }
  }
  for (const std::string& path : RankFiles(dir, "timeline_rank", ".json")) {
    absl::StatusOr<std::string> text = ReadFile(path);
    json trace = text.ok() ? json::parse(*text, nullptr, false) : json();
    if (!trace.is_object() || !trace.contains("traceEvents")) {
      run.notes.push_back(absl::StrCat(fs::path(path).filename().string(),
                                       " is not a Chrome trace: left out of trace.json"));
      continue;
    }
    run.timelines.push_back(std::move(trace));
  }
  if (absl::StatusOr<std::vector<Job>> jobs = LoadJobs(dir); jobs.ok()) {
    for (const Job& job : *jobs) run.job_progress[job.id] = ReadJobProgress(dir, job.id);
    run.jobs = *std::move(jobs);
  }
  if (absl::StatusOr<std::string> t = ReadFile((root / "config.toml").string()); t.ok()) {
    run.config_toml = *t;
  }
  if (absl::StatusOr<std::string> t = ReadFile((root / "run.json").string()); t.ok()) {
    json info = json::parse(*t, nullptr, false);
    if (info.is_object()) {
      run.run_info = std::move(info);
    } else {
      run.notes.push_back("run.json does not parse as a JSON object: the header leaves it out");
    }
  }
  if (absl::StatusOr<std::string> t = ReadFile((root / "timeline.svg").string()); t.ok()) {
    run.timeline_svg = *t;
  }
  return run;
}

double Num(const json& record, const char* key) {
  return record.contains(key) && record[key].is_number() ? record[key].get<double>() : std::nan("");
}

std::vector<std::pair<double, double>> StepSeries(const std::vector<const json*>& records,
                                                  const char* key, double scale) {
  std::vector<std::pair<double, double>> points;
  for (const json* r : records) points.push_back({Num(*r, "step"), Num(*r, key) * scale});
  return points;
}

std::vector<std::pair<double, double>> TokenSeries(const RunFiles& run, const std::string& kind) {
  double per_step = std::nan("");
  if (!run.config_toml.empty()) {
    if (absl::StatusOr<Config> c = ParseConfig(run.config_toml, "config.toml"); c.ok()) {
      per_step = static_cast<double>(c->train.batch_size * c->train.seq_len * c->parallel.dp);
    }
  }
  std::map<double, double> tokens;  // by step
  for (const json* r : run.Records("train")) tokens[Num(*r, "step")] = Num(*r, "tokens");
  std::vector<std::pair<double, double>> points;
  for (const json* r : run.Records(kind)) {
    const double step = Num(*r, "step");
    auto it = tokens.find(step);
    const double seen =
        it != tokens.end() && std::isfinite(it->second) ? it->second : step * per_step;
    points.push_back({seen, Num(*r, "loss")});
  }
  return points;
}

std::vector<std::pair<double, double>> PeakHostSeries(const RunFiles& run) {
  std::vector<std::pair<double, double>> points;
  for (const json* r : run.Records("train")) {
    double peak = std::nan("");
    for (const json& b : JsonArrayOr(*r, "host_peak_bytes")) {
      if (b.is_number())
        peak = std::isfinite(peak) ? std::max(peak, b.get<double>()) : b.get<double>();
    }
    points.push_back({Num(*r, "step"), peak});
  }
  return points;
}

RunFigures Figures(const RunFiles& run) {
  RunFigures f;
  const std::vector<const json*> train = run.Records("train");
  const json* val = run.Last("val");
  f.last_loss = train.empty() ? std::nan("") : Num(*train.back(), "loss");
  f.last_val = val ? Num(*val, "loss") : std::nan("");
  f.steps = train.empty() ? 0 : JsonIntOr(*train.back(), "step", 0);
  double sums[3] = {0, 0, 0};
  int counts[3] = {0, 0, 0};
  for (const json* r : train) {
    if (JsonIntOr(*r, "step", 0) <= 1) continue;
    const double values[3] = {Num(*r, "tokens_per_s"), Num(*r, "step_s"), Num(*r, "mfu")};
    for (int i = 0; i < 3; ++i) {
      if (std::isfinite(values[i])) sums[i] += values[i], ++counts[i];
    }
  }
  double* means[3] = {&f.tokens_per_s, &f.step_s, &f.mfu};
  for (int i = 0; i < 3; ++i) *means[i] = counts[i] ? sums[i] / counts[i] : std::nan("");
  f.host_peak_bytes = std::nan("");
  for (const auto& [step, peak] : PeakHostSeries(run)) {
    if (std::isfinite(peak)) {
      f.host_peak_bytes =
          std::isfinite(f.host_peak_bytes) ? std::max(f.host_peak_bytes, peak) : peak;
    }
  }
  return f;
}

std::string MergedTrace(const RunFiles& run) {
  json events = json::array();
  for (const json& trace : run.timelines) {
    const json other = JsonObjectOr(trace, "otherData");
    const int rank = JsonIntOr(other, "rank", 0), stage = JsonIntOr(other, "stage", 0);
    std::set<int> tids;
    for (const json& e : trace["traceEvents"]) {
      if (e.contains("tid") && e["tid"].is_number_integer()) tids.insert(e["tid"].get<int>());
      events.push_back(e);
    }
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"args", {{"name", absl::StrFormat("rank %d (stage %d)", rank, stage)}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"args", {{"sort_index", rank}}}});
    for (int tid : tids) {
      const std::string name = tid >= 1000 ? absl::StrFormat("stage %d side tasks", tid - 1000)
                                           : absl::StrFormat("stage %d", tid);
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", rank},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
    }
  }
  json out = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return out.dump() + "\n";
}

}  // namespace freeride
