#include "trainer/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/build_info.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/status.h"
#include "trainer/run_metrics.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

// A study's saved rounds (trainer/study/study_blocks.h): a study that a later one would mix
// with, even killed before it wrote study.json.
bool IsStudyBlocks(const std::string& name) {
  return absl::StartsWith(name, "study_blocks_rank") && absl::EndsWith(name, ".jsonl");
}

// What a run writes in run.dir besides config.toml; the first three mark a directory as
// holding a run, the rest go with them on --overwrite.
bool IsRunOutput(const std::string& name) {
  return name == "metrics.jsonl" || name == "study.json" || name == "study.md" ||
         name == "timeline.svg" || name == "trace.json" || name == "report.html" ||
         name == "side_tasks" || name == "tensorboard" ||
         (absl::StartsWith(name, "timeline_rank") && absl::EndsWith(name, ".json")) ||
         (absl::StartsWith(name, "side_tasks_rank") && absl::EndsWith(name, ".jsonl")) ||
         IsStudyBlocks(name);
}

bool IsCheckpointEntry(const std::string& name) {
  return name == "latest" || absl::StartsWith(name, "step_");
}

// The entries of `dir` that `keep` selects, sorted; none when it does not exist.
std::vector<fs::path> Entries(const std::string& dir, bool (*keep)(const std::string&)) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (keep(it->path().filename().string())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What in `outputs` and `checkpoints` shows another run was here: a metrics file with rows,
// a study, a checkpoint. Empty when nothing does.
std::vector<std::string> PreviousRun(const std::vector<fs::path>& outputs,
                                     const std::vector<fs::path>& checkpoints) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const fs::path& p : outputs) {
    const std::string name = p.filename().string();
    if ((name == "metrics.jsonl" && fs::file_size(p, ec) > 0 && !ec) || name == "study.json" ||
        IsStudyBlocks(name)) {
      found.push_back(name);
    }
  }
  std::vector<std::string> steps;
  for (const fs::path& p : checkpoints) {
    if (p.filename() != "latest") steps.push_back(p.filename().string());
  }
  if (!steps.empty()) {
    found.push_back(absl::StrFormat("checkpoints %s in %s", absl::StrJoin(steps, ", "),
                                    checkpoints.front().parent_path().string()));
  }
  return found;
}

// This process's command line as it was given (the kernel's copy; empty where there is none).
std::vector<std::string> CommandLine() {
  std::vector<std::string> words;
  absl::StatusOr<std::string> raw = ReadFile("/proc/self/cmdline");
  if (!raw.ok()) return words;
  for (size_t start = 0; start < raw->size();) {
    const size_t end = raw->find('\0', start);
    words.push_back(raw->substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return words;
}

// `earlier`: the starts before this one of the same run (a resume's), oldest first.
std::string RunInfoJson(const RunOrigin& origin, const nlohmann::json& earlier) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  nlohmann::json info = {{"command", CommandLine()},
                         {"config_file", origin.config_file},
                         {"overrides", origin.overrides},
                         {"host", std::string(host)},
                         {"time", Iso8601Utc(std::chrono::system_clock::now())}};
  for (const auto& [name, value] : BuildInfo()) {
    if (name == "version" || name == "commit") info[name] = value;
  }
  if (!earlier.empty()) info["earlier"] = earlier;
  return info.dump(2) + "\n";
}

// The starts recorded in `dir`/run.json (its own and those it kept), oldest first; none when
// it is missing or not a JSON object.
nlohmann::json StartsSoFar(const std::string& dir) {
  nlohmann::json starts = nlohmann::json::array();
  absl::StatusOr<std::string> text = ReadFile(absl::StrCat(dir, "/run.json"));
  if (!text.ok()) return starts;
  nlohmann::json info = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (info.is_discarded() || !info.is_object()) return starts;
  if (info.contains("earlier") && info["earlier"].is_array()) starts = info["earlier"];
  info.erase("earlier");
  starts.push_back(std::move(info));
  return starts;
}

// What another run left where this one would write (its outputs in run.dir, its checkpoints).
struct PreviousOutputs {
  std::vector<fs::path> outputs, checkpoints;
  std::vector<std::string> described;  // empty: no other run there, or a resume continues it
};

PreviousOutputs FindPreviousRun(const Config& config, const RunDirOptions& options) {
  PreviousOutputs found;
  found.outputs = Entries(config.run.dir, IsRunOutput);
  if (options.checkpoints) found.checkpoints = Entries(CheckpointDirOf(config), IsCheckpointEntry);
  // Resuming continues the run that is there (its metrics are appended to), and keeps how
  // each of its earlier parts was started.
  if (config.checkpoint.resume.empty() && !options.keep) {
    found.described = PreviousRun(found.outputs, found.checkpoints);
  }
  return found;
}

absl::Status AnotherRunError(const Config& config, const std::vector<std::string>& previous) {
  return absl::AlreadyExistsError(absl::StrFormat(
      "run.dir = \"%s\" holds another run (%s); a new run there would mix with it. "
      "Continue it with --set checkpoint.resume=latest, give this run its own directory "
      "with --set run.dir=DIR, or replace it with --overwrite",
      config.run.dir, absl::StrJoin(previous, "; ")));
}

}  // namespace

absl::Status CheckRunDirFree(const Config& config, const RunDirOptions& options) {
  if (options.overwrite) return absl::OkStatus();
  const std::vector<std::string> previous = FindPreviousRun(config, options).described;
  return previous.empty() ? absl::OkStatus() : AnotherRunError(config, previous);
}

std::string CheckpointDirOf(const Config& config) {
  return config.checkpoint.dir.empty() ? (fs::path(config.run.dir) / "checkpoints").string()
                                       : config.checkpoint.dir;
}

absl::Status CheckWritableDirectory(const std::string& dir, const std::string& key) {
  absl::Status made = MakeDirectories(dir);
  if (made.ok()) {
    const std::string probe = absl::StrCat(dir, "/.write_test.", getpid());
    const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(probe.c_str());
      return absl::OkStatus();
    }
    made = absl::PermissionDeniedError(std::strerror(errno));
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "%s = \"%s\" cannot be written (%s): the run would fail at its first write there; "
      "choose a writable directory",
      key, dir, made.message()));
}

absl::StatusOr<DirectoryLock> PrepareRunDir(const Config& config, const RunDirOptions& options,
                                            const RunOrigin& origin) {
  FR_RETURN_IF_ERROR(CheckWritableDirectory(config.run.dir, "run.dir"));
  absl::StatusOr<DirectoryLock> lock = DirectoryLock::Acquire(config.run.dir);
  if (!lock.ok()) return lock.status();
  // Under the lock, so that no run can start writing between the look and the decision.
  const PreviousOutputs found = FindPreviousRun(config, options);
  const std::vector<std::string>& previous = found.described;
  const bool continues = !config.checkpoint.resume.empty() || options.keep;
  if (!previous.empty()) {
    if (!options.overwrite) return AnotherRunError(config, previous);
    FR_LOG(WARN) << "--overwrite: removing the previous run in " << config.run.dir << " ("
                 << absl::StrJoin(previous, "; ") << ")";
    for (const std::vector<fs::path>* list : {&found.outputs, &found.checkpoints}) {
      for (const fs::path& p : *list) {
        std::error_code ec;
        fs::remove_all(p, ec);
        if (ec) {
          return absl::PermissionDeniedError(
              absl::StrFormat("--overwrite: cannot remove %s (%s)", p.string(), ec.message()));
        }
      }
    }
  }
  FR_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(config.run.dir, "/config.toml"),
                          absl::StrCat("# Effective config of this run, every key spelled "
                                       "out; `freeride config check` reads it back.\n",
                                       ConfigToToml(config))));
  FR_RETURN_IF_ERROR(WriteFileAtomically(
      absl::StrCat(config.run.dir, "/run.json"),
      RunInfoJson(origin, continues ? StartsSoFar(config.run.dir) : nlohmann::json::array())));
  return lock;
}

}  // namespace freeride
