// The head of a run's report, and what a comparison of runs reads from each: when, where and
// how the run was made (run.json, which the trainer writes at each start: command line, the
// --set overrides, config file, host, commit), its wall time, and its config as the keys that
// differ from the defaults, the full file folded below them.
#pragma once

#include <map>
#include <string>

#include "trainer/report/report_data.h"

namespace freeride {

// The run's first start (its first `start` record, else run.json's time), ISO 8601 UTC; empty
// when neither says.
std::string RunDate(const RunFiles& run);

// Training time of the run: the last train record's elapsed_s (carried across resumes), NaN
// without one.
double WallSeconds(const RunFiles& run);

// A table: date, commit, host, command line, overrides, config file and wall time, each row
// left out where the run did not record it.
std::string RunHeader(const RunFiles& run);

// A TOML text as "section.key" -> value as TOML writes it (arrays of tables as
// "side_tasks[0].name"); empty when the text does not parse.
std::map<std::string, std::string> FlattenToml(const std::string& text);

// The keys of the run's config.toml that differ from the defaults (a key a config leaves out
// takes), as a table, and the whole file in a folded <details>.
std::string ConfigSection(const RunFiles& run);

}  // namespace freeride
