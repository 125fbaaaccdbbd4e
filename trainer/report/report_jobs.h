// The fill jobs of a run in `freeride report` (docs/side_tasks.md#fill-jobs): a table of every
// job as `freeride jobs` gives it, and each one's bubble time over the training steps.
#pragma once

#include <string>

#include "trainer/report/report_data.h"

namespace freeride {

// Empty when the run has no jobs.
std::string JobsSection(const RunFiles& run);

}  // namespace freeride
