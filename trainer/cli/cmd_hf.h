// `freeride export --format hf` and `freeride import --format hf`: a model to and from a
// Hugging Face directory (config.json + safetensors, models/hf/), for transformers and back.
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> ExportFlags();
int ExportCommand(const ParsedFlags& flags);
std::vector<FlagSpec> ImportFlags();
int ImportCommand(const ParsedFlags& flags);

}  // namespace freeride
