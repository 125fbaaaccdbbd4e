// A side-task argument from its TOML value: what the config's [side_tasks.args] and the
// worker's spec both hold.
#pragma once

#include <optional>

#include <toml++/toml.h>

#include "freeride/task_args.h"

namespace freeride {

// A boolean, integer, float or string, or a non-empty array of integers, floats or strings;
// nullopt for anything else (tables, empty or mixed arrays).
std::optional<ArgValue> ArgFromToml(const toml::node& node);

}  // namespace freeride
