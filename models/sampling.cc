#include "models/sampling.h"

#include <algorithm>
#include <cmath>

namespace freeride {

int32_t TokenSampler::Next(const float* logits, int64_t vocab) {
  candidates_.resize(static_cast<size_t>(vocab));
  for (int32_t v = 0; v < vocab; ++v) candidates_[v] = {logits[v], v};
  if (temperature_ == 0) return std::max_element(candidates_.begin(), candidates_.end())->second;
  const int64_t k = top_k_ == 0 ? vocab : std::min<int64_t>(top_k_, vocab);
  std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  weights_.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    weights_[i] = std::exp((candidates_[i].first - candidates_[0].first) / temperature_);
  }
  return candidates_[std::discrete_distribution<int64_t>(weights_.begin(), weights_.end())(rng_)]
      .second;
}

}  // namespace freeride
