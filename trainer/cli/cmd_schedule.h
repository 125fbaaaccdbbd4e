// `freeride schedule` and `freeride simulate`: build (or load) a pipeline schedule, validate
// it, place its bubbles with the cost model, and print it or its simulated summary.
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

const std::vector<FlagSpec>& ScheduleFlags();
const std::vector<FlagSpec>& SimulateFlags();
int ScheduleCommand(const ParsedFlags& flags);
int SimulateCommand(const ParsedFlags& flags);

}  // namespace freeride
