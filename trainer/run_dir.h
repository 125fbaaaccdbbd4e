// A run's output directory (run.dir): created at start, holding the effective config as
// `config.toml` next to the metrics, traces and checkpoints the run writes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/run_lock.h"
#include "trainer/config/config.h"

namespace freeride {

// Creates run.dir, locks it against a second run (held until the lock is destroyed), and
// writes the effective config to run.dir/config.toml (atomically).
absl::StatusOr<DirectoryLock> PrepareRunDir(const Config& config);

// Creates `dir` if needed and proves that files can be created in it, so that a checkpoint
// directory nobody can write is found before training instead of at its first checkpoint.
// `key` names the config key the directory came from.
absl::Status CheckWritableDirectory(const std::string& dir, const std::string& key);

}  // namespace freeride
