// A checkpoint's manifest.json: what the checkpoint holds (format, version, step, model shape,
// layout, files) and the size and CRC-32C of each file, so that a file changed on disk after it
// was written is refused, by name, instead of resuming or evaluating from corrupt numbers.
// The llm.c model.bin keeps its own format: its checksum lives here, beside it. Checking the
// files against it is models/checkpoint_verify.h (included: one header for both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/checkpoint_verify.h"
#include "trainer/train_state.h"

namespace freeride {

// Writes `dir`/manifest.json for `state` with the checksums of `files` (names inside `dir`),
// read back from disk: what is recorded is what was written, whichever rank wrote it.
absl::Status WriteCheckpointManifest(const std::string& dir, const RankState& state,
                                     const std::vector<std::string>& files);

}  // namespace freeride
