// What a config's run would hold in device memory on the CUDA backend, per pipeline stage, from
// the same plan the backend allocates by (models/device_memory_plan.h): for choosing a
// micro-batch size, a split or a precision before reaching a GPU. `freeride config memory`.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainer/config/config.h"

namespace freeride {

// One header line, then one line per stage: its layers, what it holds, activation slots (the
// schedule's buffers) and the plan by phase.
absl::StatusOr<std::string> DeviceMemoryReport(const Config& config);

}  // namespace freeride
