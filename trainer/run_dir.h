// A run's output directory (run.dir): created at start, holding the effective config as
// `config.toml` next to the metrics, traces and checkpoints the run writes.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "trainer/config.h"

namespace freeride {

// Creates run.dir and writes the effective config to run.dir/config.toml (atomically).
absl::Status PrepareRunDir(const Config& config);

}  // namespace freeride
