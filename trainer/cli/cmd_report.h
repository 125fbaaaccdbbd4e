// `freeride report RUN_DIR [--out FILE.html]`: a run as one HTML page (trainer/report/report.h), and
// every rank's timeline merged into RUN_DIR/trace.json.
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> ReportFlags();
int ReportCommand(const ParsedFlags& flags);

}  // namespace freeride
