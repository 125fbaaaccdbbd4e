// `freeride project`: a training job's bubbles and the side work they could hold, projected to
// many GPUs (trainer/study/projection.h).
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> ProjectFlags();
int ProjectCommand(const ParsedFlags& flags);

}  // namespace freeride
