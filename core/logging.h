// A small logger: every line carries a UTC timestamp, the rank and the level, so interleaved
// output of several mpirun ranks stays readable:
//   2026-11-22 10:04:05.123 r1 I trainer.cc:42] step 3 loss 10.83
// Use FR_LOG(INFO) << ...; levels DEBUG, INFO, WARN, ERROR, and PROGRESS: a run's progress and
// results (steps, evaluations, checkpoints), printed as INFO lines but kept at every threshold
// but `error`, so FREERIDE_LOG_LEVEL=warn quiets the chatter, not the run. The threshold comes
// from FREERIDE_LOG_LEVEL (debug|info|warn|error) or SetLogLevel; the rank from the launcher's
// environment (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID) until SetLogRank is called.
// Lines go to stderr (SetLogSink) and, once SetLogFile is called, to that file as well.
#pragma once

#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace freeride {

// kProgress is a message's level only (not a threshold): between kWarn and kError.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kProgress = 3, kError = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
void SetLogRank(int rank);
int GetLogRank();  // -1 when the process is not one of several ranks

// Where log lines go; stderr by default. Tests capture lines through this.
void SetLogSink(std::ostream* sink);
// Appends every line from now on to `path` as well (its folder created), until the process
// ends or CloseLogFile; a second call replaces the first file.
absl::Status SetLogFile(const std::string& path);
void CloseLogFile();
// Appends `text` and a newline to that file only (nothing when none is open): what a command
// prints to stderr itself, such as its final error, kept beside the log lines.
void WriteToLogFile(absl::string_view text);

// Formats one line (without the trailing newline); exposed for tests.
std::string FormatLogLine(LogLevel level, absl::string_view file, int line, absl::string_view text,
                          int rank, double unix_seconds);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace freeride

#define FR_LOG_LEVEL_DEBUG ::freeride::LogLevel::kDebug
#define FR_LOG_LEVEL_INFO ::freeride::LogLevel::kInfo
#define FR_LOG_LEVEL_WARN ::freeride::LogLevel::kWarn
#define FR_LOG_LEVEL_PROGRESS ::freeride::LogLevel::kProgress
#define FR_LOG_LEVEL_ERROR ::freeride::LogLevel::kError

namespace freeride {
// Turns FR_LOG's stream into void: `&` binds looser than `<<` and tighter than `?:`, so
// FR_LOG(INFO) << a << b is one expression of type void (abseil's LOG does the same).
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace freeride

// One expression, not an `if`: under an `if` without braces followed by an `else` it can
// neither take the `else` nor draw -Wdangling-else. The stream expression is only evaluated
// when the level is enabled.
#define FR_LOG(level)                                \
  (FR_LOG_LEVEL_##level < ::freeride::GetLogLevel()) \
      ? (void)0                                      \
      : ::freeride::LogVoidify() &                   \
            ::freeride::LogMessage(FR_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
