#include "trainer/cli/cmd_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_format.h"
#include "trainer/checkpoint_manifest.h"
#include "trainer/cli/cli.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

// The checkpoints DIR stands for: itself when it holds a manifest, else every complete
// checkpoint (step_NNNNNNNN) in it, oldest first.
std::vector<std::string> CheckpointsIn(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kManifestFileName)) return {dir};
  std::vector<std::string> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    int64_t step = 0;
    if (entry.is_directory(ec) && ParseCheckpointDirName(entry.path().filename().string(), &step)) {
      found.push_back(entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

int CheckpointVerifyCommand(const ParsedFlags& flags) {
  if (flags.positional().empty()) {
    std::cerr << "error: checkpoint verify takes one DIR (a checkpoint or a checkpoint.dir)\n";
    return kExitUsage;
  }
  const std::string dir = flags.positional()[0];
  if (!fs::is_directory(dir)) {
    std::cerr << "error: " << dir << ": not a directory (give a checkpoint or a checkpoint.dir)\n";
    return kExitFailure;
  }
  bool ok = true;
  // `latest` is what resuming follows: it must name a checkpoint inside DIR.
  if (fs::exists(fs::path(dir) / "latest")) {
    absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
    if (latest.ok()) {
      std::cout << absl::StrFormat("%s/latest: %s\n", dir, fs::path(*latest).filename().string());
    } else {
      std::cerr << "error: " << latest.status().message() << "\n";
      ok = false;
    }
  }
  const std::vector<std::string> checkpoints = CheckpointsIn(dir);
  if (checkpoints.empty()) {
    std::cerr << "error: " << dir << ": holds no checkpoint (no manifest.json, no step_* "
              << "directories)\n";
    return kExitFailure;
  }
  for (const std::string& checkpoint : checkpoints) {
    absl::StatusOr<std::vector<FileVerdict>> verdicts = VerifyCheckpoint(checkpoint);
    if (!verdicts.ok()) {
      std::cerr << "error: " << verdicts.status().message() << "\n";
      ok = false;
      continue;
    }
    for (const FileVerdict& v : *verdicts) {
      if (v.status.ok()) {
        std::cout << absl::StrFormat("%s: ok (%d bytes, CRC-32C %s)\n",
                                     (fs::path(checkpoint) / v.file).string(), v.bytes, v.crc32c);
      } else {
        std::cerr << "error: " << v.status.message() << "\n";
        ok = false;
      }
    }
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace freeride
