// A run's output directory (run.dir): created at start, holding the effective config as
// `config.toml` next to the metrics, traces and checkpoints the run writes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/run_lock.h"
#include "trainer/config/config.h"

namespace freeride {

struct RunDirOptions {
  // Replace what another run left in run.dir (its metrics, traces, study, checkpoints)
  // instead of refusing to start there.
  bool overwrite = false;
  // Whether the command writes checkpoints (a study does not, so the checkpoints of the run
  // it may resume from are not another run's output in its way).
  bool checkpoints = true;
  // Continue what is there (`freeride study --resume`): neither refused nor removed.
  bool keep = false;
};

// How the run was asked for, written to run.dir/run.json for its report: the config file
// (empty: the embedded default) and the --set overrides, in order.
struct RunOrigin {
  std::string config_file;
  std::vector<std::string> overrides;
};

// Where a run's checkpoints go: checkpoint.dir, else run.dir/checkpoints.
std::string CheckpointDirOf(const Config& config);

// Creates run.dir, locks it against a second run (held until the lock is destroyed), and
// writes the effective config to run.dir/config.toml and how this start was made to
// run.dir/run.json (command line, config file, overrides, host, commit, time; atomically). A new
// run (no checkpoint.resume) into a directory holding another run's metrics, study or checkpoints
// is refused with AlreadyExists, naming them and the ways out, unless `options.overwrite`, which
// removes them first: two runs' rows in one metrics.jsonl, or a `latest` beside a later
// step_N, would make the directory lie about both.
absl::StatusOr<DirectoryLock> PrepareRunDir(const Config& config, const RunDirOptions& options = {},
                                            const RunOrigin& origin = {});

// Whether a new run of `config` may start in run.dir: OK, or the AlreadyExists error
// PrepareRunDir would give, found without creating, locking or writing anything (launch/run.sh
// asks before it starts the ranks, so that a refusal is one message, not an aborted MPI job).
absl::Status CheckRunDirFree(const Config& config, const RunDirOptions& options = {});

// Creates `dir` if needed and proves that files can be created in it, so that a checkpoint
// directory nobody can write is found before training instead of at its first checkpoint.
// `key` names the config key the directory came from.
absl::Status CheckWritableDirectory(const std::string& dir, const std::string& key);

}  // namespace freeride
