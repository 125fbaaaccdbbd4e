#include "trainer/optimizer.h"

#include <cmath>

namespace freeride {

double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps) {
  if (step < optim.warmup_steps) {
    return optim.lr * static_cast<double>(step + 1) / static_cast<double>(optim.warmup_steps);
  }
  if (optim.schedule == "constant") return optim.lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - 1 - optim.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - optim.warmup_steps) / decay_steps);
  const double min_lr = optim.lr * optim.min_lr_ratio;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (optim.lr - min_lr);
}

double ClipScale(double grad_norm, double clip) {
  if (clip <= 0) return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

}  // namespace freeride
