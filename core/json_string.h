// A string as a JSON string literal, for the hand-written JSON records (metrics.jsonl,
// study.json, side_tasks_rankNNN.jsonl): quotes, backslashes and control characters escaped.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace freeride {

std::string JsonString(absl::string_view text);

}  // namespace freeride
