// `freeride train`, `freeride study`, `freeride sample` and `freeride eval`: training, the
// harvest study, and using checkpoints.
#pragma once

#include <vector>

#include "trainer/config/flags.h"

namespace freeride {

std::vector<FlagSpec> TrainFlags();
int TrainCommand(const ParsedFlags& flags);
std::vector<FlagSpec> StudyFlags();
int StudyCommand(const ParsedFlags& flags);
std::vector<FlagSpec> SampleFlags();
int SampleCommand(const ParsedFlags& flags);
std::vector<FlagSpec> EvalFlags();
int EvalCommand(const ParsedFlags& flags);

}  // namespace freeride
