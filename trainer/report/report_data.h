// What `freeride report` reads from a run directory: metrics.jsonl, side_tasks_rankNNN.jsonl,
// config.toml, timeline_rankNNN.json, timeline.svg, a study's study.json, and fill jobs. A run
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
  std::vector<nlohmann::json> side_tasks;  // the last record of each (rank, task)
  std::optional<nlohmann::json> study;     // study.json
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

// NotFound when `dir` holds none of metrics.jsonl, study.json or config.toml.
absl::StatusOr<RunFiles> LoadRunFiles(const std::string& dir);

// Every rank's timeline as one Chrome trace (Perfetto opens it): each rank a process named
// "rank R (stage S)", its tracks "stage S" and "stage S side tasks". Ranks of one machine share
// a clock; across machines their steps are each rank's own.
std::string MergedTrace(const RunFiles& run);

}  // namespace freeride
