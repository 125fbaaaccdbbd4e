#include "models/checkpoint_verify.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/checksum.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

bool IsFileNameInDirectory(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.size() <= 255 &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

struct Recorded {
  int64_t bytes = 0;
  std::string crc32c;
};

// The manifest's recorded checksums by file name; `*has_checksums` is false for a manifest
// written before checksums were.
absl::StatusOr<std::map<std::string, Recorded>> ReadChecksums(const std::string& dir,
                                                              bool* has_checksums) {
  const std::string path = (fs::path(dir) / kManifestFileName).string();
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<nlohmann::json> json = ParseJsonObject(*text, path);
  // Both lvalues: JsonFields keeps a reference, which a temporary would leave dangling.
  static const nlohmann::json kNone = nlohmann::json::object();
  const JsonFields fields(json.ok() ? *json : kNone, path);
  absl::StatusOr<std::string> format = fields.String("format");
  if (!json.ok() || !format.ok() || *format != "freeride-checkpoint") {
    return absl::DataLossError(
        absl::StrFormat("%s: not a freeride checkpoint manifest (%s)", path,
                        !json.ok()      ? json.status().message()
                        : !format.ok()  ? format.status().message()
                                        : "expected \"format\": \"freeride-checkpoint\""));
  }
  std::map<std::string, Recorded> recorded;
  *has_checksums = fields.Has("checksums");
  if (!*has_checksums) return recorded;
  FR_ASSIGN_OR_RETURN(const nlohmann::json* sums, fields.Object("checksums"));
  for (const auto& [file, entry] : sums->items()) {
    // Names of files inside the checkpoint directory, nothing else: a manifest must not make
    // `verify` read (and print the size and CRC of) a file elsewhere.
    if (!IsFileNameInDirectory(file)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: checksums: \"%s\" is not the name of a file in the checkpoint directory (a "
          "name with no '/', not \".\" or \"..\")",
          path, absl::CHexEscape(file)));
    }
    const JsonFields e(entry, absl::StrFormat("%s: checksums[\"%s\"]", path, file));
    if (!entry.is_object()) {
      return absl::DataLossError(
          absl::StrFormat("%s: expected an object of \"bytes\" and \"crc32c\", found %s",
                          e.where(), DescribeJson(entry)));
    }
    FR_ASSIGN_OR_RETURN(const int64_t bytes, e.Int("bytes", 0));
    FR_ASSIGN_OR_RETURN(std::string crc, e.String("crc32c"));
    recorded[file] = {bytes, std::move(crc)};
  }
  return recorded;
}

// `dir` without a trailing separator, so that its filename is the checkpoint's name.
fs::path Normal(const std::string& dir) {
  const fs::path path = fs::path(dir).lexically_normal();
  return path.has_filename() ? path : path.parent_path();
}

// The newest complete checkpoint beside `dir` older than it, or "" when there is none.
std::string PreviousCheckpoint(const std::string& dir) {
  const fs::path own = Normal(dir);
  int64_t own_step = 0;
  if (!ParseCheckpointDirName(own.filename().string(), &own_step)) return "";
  std::string best;
  int64_t best_step = -1;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(own.parent_path(), ec)) {
    int64_t step = 0;
    if (ParseCheckpointDirName(entry.path().filename().string(), &step) && step < own_step &&
        step > best_step && entry.is_directory(ec)) {
      best = entry.path().string();
      best_step = step;
    }
  }
  return best;
}

absl::Status Mismatch(const std::string& dir, const std::string& file, const std::string& what) {
  const std::string previous = PreviousCheckpoint(dir);
  return absl::DataLossError(absl::StrFormat(
      "%s: %s: the checkpoint is corrupt; %s", (fs::path(dir) / file).string(), what,
      previous.empty() ? absl::StrFormat("no earlier checkpoint is beside it in %s",
                                         Normal(dir).parent_path().string())
                       : absl::StrFormat("use the previous checkpoint, %s", previous)));
}

// `file` in `dir` against what the manifest recorded of it.
FileVerdict Check(const std::string& dir, const std::string& file,
                  const std::map<std::string, Recorded>& recorded) {
  FileVerdict verdict;
  verdict.file = file;
  auto it = recorded.find(file);
  if (it == recorded.end()) {
    verdict.status = Mismatch(dir, file, "the manifest records no checksum of it");
    return verdict;
  }
  absl::StatusOr<FileChecksum> sum = ChecksumFile((fs::path(dir) / file).string());
  if (!sum.ok()) {
    verdict.status = Mismatch(dir, file, std::string(sum.status().message()));
    return verdict;
  }
  verdict.bytes = sum->bytes;
  verdict.crc32c = Crc32cHex(sum->crc32c);
  if (sum->bytes != it->second.bytes || verdict.crc32c != it->second.crc32c) {
    verdict.status =
        Mismatch(dir, file,
                 absl::StrFormat("checksum mismatch: %d bytes with CRC-32C %s, but the manifest "
                                 "recorded %d bytes with %s",
                                 sum->bytes, verdict.crc32c, it->second.bytes, it->second.crc32c));
  }
  return verdict;
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("step_%08d", step); }

bool ParseCheckpointDirName(const std::string& name, int64_t* step) {
  absl::string_view digits(name);
  return absl::ConsumePrefix(&digits, "step_") && !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(digits, step);
}

absl::Status VerifyCheckpointFile(const std::string& dir, const std::string& file) {
  bool has_checksums = false;
  absl::StatusOr<std::map<std::string, Recorded>> recorded = ReadChecksums(dir, &has_checksums);
  if (!recorded.ok()) return recorded.status();
  if (!has_checksums) {
    FR_LOG(WARN) << (fs::path(dir) / file).string()
                 << ": not verified: its manifest was written before checkpoints carried "
                    "checksums";
    return absl::OkStatus();
  }
  return Check(dir, file, *recorded).status;
}

absl::Status VerifyModelFile(const std::string& model_file) {
  const fs::path path(model_file);
  const std::string dir = path.has_parent_path() ? path.parent_path().string() : ".";
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kManifestFileName, ec)) return absl::OkStatus();
  return VerifyCheckpointFile(dir, path.filename().string());
}

absl::StatusOr<std::vector<FileVerdict>> VerifyCheckpoint(const std::string& dir) {
  bool has_checksums = false;
  absl::StatusOr<std::map<std::string, Recorded>> recorded = ReadChecksums(dir, &has_checksums);
  if (!recorded.ok()) return recorded.status();
  if (!has_checksums) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: its manifest records no checksums (written before checkpoints carried them): "
        "nothing to verify against",
        dir));
  }
  std::vector<FileVerdict> verdicts;
  for (const auto& [file, unused] : *recorded) verdicts.push_back(Check(dir, file, *recorded));
  return verdicts;
}

}  // namespace freeride
