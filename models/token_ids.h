// Token ids checked at the model's door. The embedding gathers a row per token and the loss
// reads one logit per target; an id outside [0, vocabulary) reads or writes past those
// tensors, on the device without a word. The data loader checks its shards once; this check
// covers every other way in (side tasks, inference prompts, tests) for an O(n) scan of ids
// the step then reads anyway.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace freeride {

// InvalidArgument naming `what`, the first bad position and its value unless every id of
// `ids[0, n)` is in [0, vocab_size).
absl::Status CheckTokenIds(const int32_t* ids, int64_t n, int64_t vocab_size, const char* what);

}  // namespace freeride
