// Fill jobs from the command line (docs/side_tasks.md#fill-jobs):
//   freeride submit RUN_DIR JOB.toml [--name N] [--priority P] [--work SECONDS]
//   freeride jobs RUN_DIR [--format text|json]
//   freeride cancel RUN_DIR ID
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> SubmitFlags();
int SubmitCommand(const ParsedFlags& flags);
std::vector<FlagSpec> JobsFlags();
int JobsCommand(const ParsedFlags& flags);
int CancelCommand(const ParsedFlags& flags);

}  // namespace freeride
