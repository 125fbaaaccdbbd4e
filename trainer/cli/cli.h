// The `freeride` command line: subcommands, each a function of its arguments returning the
// process exit status (0 success, 1 failure of the work, 2 bad usage).
#pragma once

#include <string>
#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

int RunCli(const std::vector<std::string>& args);

// Exit statuses shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
// Stopped on SIGTERM, SIGINT or SIGUSR1 at a step boundary, with a checkpoint to resume from.
inline constexpr int kExitStopped = 3;

// Writes `text` to the file --out names (atomically), else to standard output; the exit code.
int EmitOutput(const ParsedFlags& flags, const std::string& text);

}  // namespace freeride
