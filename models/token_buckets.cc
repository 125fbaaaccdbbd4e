#include "models/token_buckets.h"

namespace freeride {

TokenBuckets GroupPositionsByToken(const int32_t* tokens, int64_t n, int64_t vocab_size) {
  // A counting sort: count[v + 1] counts token v, then becomes the start of v + 1.
  std::vector<int64_t> count(vocab_size + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++count[tokens[i] + 1];
  TokenBuckets b;
  for (int64_t v = 0; v < vocab_size; ++v) {
    if (count[v + 1] > 0) {
      b.tokens.push_back(static_cast<int32_t>(v));
      b.starts.push_back(static_cast<int32_t>(count[v]));
    }
    count[v + 1] += count[v];
  }
  b.starts.push_back(static_cast<int32_t>(n));
  b.positions.resize(n);
  for (int64_t i = 0; i < n; ++i) b.positions[count[tokens[i]]++] = static_cast<int32_t>(i);
  return b;
}

}  // namespace freeride
