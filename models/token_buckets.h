// The positions of a micro-batch's tokens grouped by token id, for an embedding backward that
// sums each token's gradient rows in a fixed order (no atomics, the same bits every run):
// positions sorted by token (stable, so ascending within a token), the distinct tokens in
// ascending order, and where each one's positions start (one past the end last).
#pragma once

#include <cstdint>
#include <vector>

namespace freeride {

struct TokenBuckets {
  std::vector<int32_t> positions;  // [n]
  std::vector<int32_t> tokens;     // [distinct]
  std::vector<int32_t> starts;     // [distinct + 1]
};

// `tokens` holds n ids below `vocab_size`.
TokenBuckets GroupPositionsByToken(const int32_t* tokens, int64_t n, int64_t vocab_size);

}  // namespace freeride
