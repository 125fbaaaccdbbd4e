// `freeride checkpoint verify DIR`: a checkpoint's files against the checksums of its manifest.
#pragma once

#include "trainer/config/flags.h"

namespace freeride {

int CheckpointVerifyCommand(const ParsedFlags& flags);

}  // namespace freeride
