// What `freeride report` reads from a run directory: metrics.jsonl, side_tasks_rankNNN.jsonl,
// config.toml, run.json, timeline_rankNNN.json, timeline.svg, a study's study.json, and fill
// jobs; and the series and figures its pages draw from them. A run
// still writing may end a file mid-line: such a line is left out with a note, never an error.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/jobs/job_store.h"

namespace freeride {

struct RunFiles {
  std::string dir;
  std::vector<nlohmann::json> metrics;     // metrics.jsonl, in order
  std::vector<nlohmann::json> side_tasks;  // each (rank, task) over the whole run
  std::optional<nlohmann::json> study;     // study.json
  std::optional<nlohmann::json> run_info;  // run.json: how the run was started, where
  std::vector<nlohmann::json> timelines;   // timeline_rankNNN.json, by rank
  std::vector<Job> jobs;                   // fill jobs (jobs/, jobs.jsonl), by id
  std::map<int64_t, std::vector<std::pair<int64_t, JobProgress>>> job_progress;  // by step
  std::string config_toml;
  std::string timeline_svg;
  std::vector<std::string> notes;  // what was left out and why

  // The metrics records of one kind ("train", "val", "bubble", ...).
  std::vector<const nlohmann::json*> Records(const std::string& kind) const;
  const nlohmann::json* Last(const std::string& kind) const;
};

// One side_task record of a task over the whole run from its records of each part (a resumed
// run writes one per part, each with the steps from_step..step it covers): steps, units,
// harvested and overrun time, overruns, pauses and restarts summed, the peak memory the
// largest, state and reason the last part's, and each part's summary after its steps
// ("steps 0–40: ...; steps 40–80: ..."); `parts` says how many.
nlohmann::json WholeRunTaskRecord(const std::vector<nlohmann::json>& parts);

// A record's number field; NaN when absent or not a number (JSON null).
double Num(const nlohmann::json& record, const char* key);

// (step, record[key] × scale) of each record.
std::vector<std::pair<double, double>> StepSeries(const std::vector<const nlohmann::json*>& records,
                                                  const char* key, double scale = 1);

// (tokens seen, loss) of the records of `kind` ("train", "val"): the train records' `tokens`
// at that step, else step × the config's tokens per step.
std::vector<std::pair<double, double>> TokenSeries(const RunFiles& run, const std::string& kind);

// (step, the largest host_peak_bytes of any stage) of the train records.
std::vector<std::pair<double, double>> PeakHostSeries(const RunFiles& run);

// The figures a report and a comparison show of a run; NaN where it has none. Means leave
// out step 1 (it warms up).
struct RunFigures {
  int64_t steps = 0;
  double last_loss = 0, last_val = 0;
  double tokens_per_s = 0, step_s = 0, mfu = 0;  // means
  double host_peak_bytes = 0;                    // the largest of any stage and step
};
RunFigures Figures(const RunFiles& run);

// NotFound when `dir` holds none of metrics.jsonl, study.json or config.toml.
absl::StatusOr<RunFiles> LoadRunFiles(const std::string& dir);

// Every rank's timeline as one Chrome trace (Perfetto opens it): each rank a process named
// "rank R (stage S)", its tracks "stage S" and "stage S side tasks". Ranks of one machine share
// a clock; across machines their steps are each rank's own.
std::string MergedTrace(const RunFiles& run);

}  // namespace freeride
