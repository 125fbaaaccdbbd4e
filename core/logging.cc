#include "core/logging.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace freeride {
namespace {

LogLevel LevelFromEnvironment() {
  const char* text = std::getenv("FREERIDE_LOG_LEVEL");
  if (text == nullptr) return LogLevel::kInfo;
  auto level = ParseLogLevel(text);
  return level.ok() ? *level : LogLevel::kInfo;
}

int RankFromEnvironment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    int rank = 0;
    const char* text = std::getenv(name);
    if (text != nullptr && absl::SimpleAtoi(text, &rank)) return rank;
  }
  return -1;
}

std::atomic<int>& LevelStore() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnvironment())};
  return level;
}

std::atomic<int>& RankStore() {
  static std::atomic<int> rank{RankFromEnvironment()};
  return rank;
}

std::mutex& SinkMutex() {
  static std::mutex mutex;
  return mutex;
}

std::ostream*& Sink() {
  static std::ostream* sink = &std::cerr;
  return sink;
}

// The log file; guarded by SinkMutex.
std::unique_ptr<std::ofstream>& File() {
  static auto* file = new std::unique_ptr<std::ofstream>();
  return *file;
}

}  // namespace

void SetLogLevel(LogLevel level) { LevelStore() = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(LevelStore().load()); }
void SetLogRank(int rank) { RankStore() = rank; }
int GetLogRank() { return RankStore().load(); }

void SetLogSink(std::ostream* sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = sink == nullptr ? &std::cerr : sink;
}

absl::Status SetLogFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  auto file = std::make_unique<std::ofstream>(path, std::ios::app);
  if (!*file) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write the log file ", path, ": ", std::strerror(errno)));
  }
  std::lock_guard<std::mutex> lock(SinkMutex());
  File() = std::move(file);
  return absl::OkStatus();
}

void CloseLogFile() {
  std::lock_guard<std::mutex> lock(SinkMutex());
  File().reset();
}

void WriteToLogFile(absl::string_view text) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (File() == nullptr) return;
  const std::string record = absl::StrCat(text, "\n");
  File()->write(record.data(), static_cast<std::streamsize>(record.size()));
  File()->flush();
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warn" || lower == "warning") return LogLevel::kWarn;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "'; expected debug, info, warn or error"));
}

std::string FormatLogLine(LogLevel level, absl::string_view file, int line, absl::string_view text,
                          int rank, double unix_seconds) {
  // Progress lines read as information.
  static constexpr char kLetters[] = {'D', 'I', 'W', 'I', 'E'};
  const long long total_millis = std::llround(unix_seconds * 1000.0);
  std::time_t whole = static_cast<std::time_t>(total_millis / 1000);
  int millis = static_cast<int>(total_millis % 1000);
  std::tm utc{};
  gmtime_r(&whole, &utc);
  if (auto slash = file.rfind('/'); slash != absl::string_view::npos) file.remove_prefix(slash + 1);
  std::string rank_text = rank >= 0 ? absl::StrCat(" r", rank) : "";
  return absl::StrFormat("%04d-%02d-%02d %02d:%02d:%02d.%03d%s %c %s:%d] %s", utc.tm_year + 1900,
                         utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis,
                         rank_text, kLetters[static_cast<int>(level)], file, line, text);
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  double now = std::chrono::duration<double>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  // One write of the whole record, newline included: each rank's stderr is a pipe that mpirun
  // copies out as it reads, so a line written in two parts could come out with another rank's
  // line between them.
  const std::string record =
      FormatLogLine(level_, file_, line_, stream_.str(), GetLogRank(), now) + '\n';
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink()->write(record.data(), static_cast<std::streamsize>(record.size()));
  Sink()->flush();
  if (File() != nullptr) {
    File()->write(record.data(), static_cast<std::streamsize>(record.size()));
    File()->flush();
  }
}

}  // namespace freeride
