// `freeride report RUN_A RUN_B ...`: several runs on one page, on shared axes: train and
// validation loss against step and against tokens, throughput, step time, MFU and memory; a
// table of each run's key figures and one of the config keys whose values differ between them.
// Run i is drawn in SeriesColor(i) and named "run i" in legends, the table saying which
// directory that is.
#pragma once

#include <string>
#include <vector>

#include "trainer/report/report_data.h"

namespace freeride {

std::string RenderComparison(const std::vector<RunFiles>& runs);

}  // namespace freeride
