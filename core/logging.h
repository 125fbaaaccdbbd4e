// A small logger: every line carries a UTC timestamp, the rank and the level, so interleaved
// output of several mpirun ranks stays readable:
//   2026-11-22 10:04:05.123 r1 I trainer.cc:42] step 3 loss 10.83
// Use FR_LOG(INFO) << ...; levels DEBUG, INFO, WARN, ERROR. The threshold comes from
// FREERIDE_LOG_LEVEL (debug|info|warn|error) or SetLogLevel; the rank from the launcher's
// environment (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID) until SetLogRank is called.
#pragma once

#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace freeride {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
void SetLogRank(int rank);
int GetLogRank();  // -1 when the process is not one of several ranks

// Where log lines go; stderr by default. Tests capture lines through this.
void SetLogSink(std::ostream* sink);

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
#define FR_LOG_LEVEL_ERROR ::freeride::LogLevel::kError

// The stream expression is only evaluated when the level is enabled.
#define FR_LOG(level)                                                   \
  if (FR_LOG_LEVEL_##level < ::freeride::GetLogLevel()) {               \
  } else                                                                \
    ::freeride::LogMessage(FR_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
