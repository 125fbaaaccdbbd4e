// `freeride prepare`: text files to GPT-2 token shards (llm.c format) for training.
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> PrepareFlags();
int PrepareCommand(const ParsedFlags& flags);

}  // namespace freeride
