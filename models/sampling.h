// The next token from a row of logits, as `freeride sample`, the `gpt_infer` task and the
// `serve` task draw it, so the same checkpoint, prompt and seed give the same text everywhere:
// temperature 0 takes the most likely token; otherwise the top_k most likely (0: all) are
// weighed by exp((logit − max) / temperature) and one is drawn with `rng`.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace freeride {

class TokenSampler {
 public:
  TokenSampler(double temperature, int64_t top_k, uint64_t seed)
      : temperature_(temperature), top_k_(top_k), rng_(seed) {}
  // `logits` holds the vocabulary's `vocab` entries (not the padded rows).
  int32_t Next(const float* logits, int64_t vocab);

 private:
  double temperature_;
  int64_t top_k_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<double> weights_;
};

}  // namespace freeride
