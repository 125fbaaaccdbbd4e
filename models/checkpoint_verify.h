// A checkpoint's files checked against its manifest.json, which records the size and CRC-32C
// of each (trainer/checkpoint_manifest.h writes it): a file changed on disk after it was
// written is refused, by name, instead of resuming, evaluating or serving from corrupt numbers.
// Here, below the trainer, so that whatever loads a checkpoint's file checks it the same way:
// resume, eval, sample, model.init_from, and the side tasks that load a model (serve,
// gpt_infer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace freeride {

inline constexpr char kManifestFileName[] = "manifest.json";

// A checkpoint directory's name ("step_00000150") and back: true for a name CheckpointDirName
// makes ("step_" and digits), with its step.
std::string CheckpointDirName(int64_t step);
bool ParseCheckpointDirName(const std::string& name, int64_t* step);

// Checks `dir`/`file` against the checksum its manifest records. A manifest from before
// checksums (no "checksums" key) has nothing to check against: a warning is logged and the
// file is taken. A mismatch names the file and the previous checkpoint to use instead.
absl::Status VerifyCheckpointFile(const std::string& dir, const std::string& file);

// A model file (eval, sample, model.init_from, a side task's checkpoint): checked as above when
// a manifest lies beside it (it is a checkpoint's model.bin); a bare llm.c file has none and is
// taken as is.
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
