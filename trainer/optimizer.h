// The optimizer step around the model: learning-rate schedule and gradient clipping. (The
// per-unit gradient squares and AdamW itself belong to each backend: StageModel.)
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/config/config.h"

namespace freeride {

// Learning rate at 0-based `step` of `total_steps`: linear warm-up to optim.lr over
// warmup_steps, then cosine decay to lr·min_lr_ratio at the last step, or constant.
double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps);

// PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double ClipScale(double grad_norm, double clip);

}  // namespace freeride
