// A checkpoint's manifest.json: what the checkpoint holds (format, version, step, model shape,
// layout, files) and the size and CRC-32C of each file, so that a file changed on disk after it
// was written is refused, by name, instead of resuming or evaluating from corrupt numbers.
// The llm.c model.bin keeps its own format: its checksum lives here, beside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/train_state.h"

namespace freeride {

inline constexpr char kManifestFileName[] = "manifest.json";

// Writes `dir`/manifest.json for `state` with the checksums of `files` (names inside `dir`),
// read back from disk: what is recorded is what was written, whichever rank wrote it.
absl::Status WriteCheckpointManifest(const std::string& dir, const RankState& state,
                                     const std::vector<std::string>& files);

// Checks `dir`/`file` against the checksum its manifest records. A manifest from before
// checksums (no "checksums" key) has nothing to check against: a warning is logged and the
// file is taken. A mismatch names the file and the previous checkpoint to use instead.
absl::Status VerifyCheckpointFile(const std::string& dir, const std::string& file);

// A model file for eval, sample or model.init_from: checked as above when a manifest lies
// beside it (it is a checkpoint's model.bin); a bare llm.c file has none and is taken as is.
absl::Status VerifyModelFile(const std::string& model_file);

// One file of a checkpoint, as `freeride checkpoint verify` reports it.
struct FileVerdict {
  std::string file;
  absl::Status status;  // OK: the file matches its recorded checksum
  int64_t bytes = 0;
  std::string crc32c;
};

// Every file the manifest of checkpoint `dir` lists, each checked. An error when `dir` has no
// readable manifest or it records no checksums.
absl::StatusOr<std::vector<FileVerdict>> VerifyCheckpoint(const std::string& dir);

}  // namespace freeride
