// The optimizer step around the model: learning-rate schedule and gradient clipping. (The
// per-unit gradient squares and AdamW itself belong to each backend: StageModel.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer/config/config.h"

namespace freeride {

// Learning rate at 0-based `step` of `total_steps`: linear warm-up to optim.lr over
// warmup_steps, then by optim.schedule, with min = lr·min_lr_ratio and the last step
// total_steps − 1:
//   cosine    min + (lr − min)·(1 + cos(π·p))/2, p = (step − warmup)/(last − warmup)
//   linear    min + (lr − min)·(1 − p), the same p
//   wsd       lr until step s = max(warmup, total_steps − round(decay_fraction·total_steps)),
//             then linear from lr at s to min at the last step
//   constant  lr
// (p is clipped to [0, 1], and its denominators are at least 1.)
double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps);

// Refuses (a usage error) a resume at `step` of a checkpoint trained for `saved_steps` when
// this run's `total_steps` would change the learning rate of a step still to train, unless
// optim.reshape_schedule: the message says what the learning rate would jump from and to at the
// first step it changes. `saved_steps` 0 (a checkpoint that did not record it) is never
// refused, nor a resume at or past total_steps (nothing is trained).
absl::Status CheckScheduleOnResume(const OptimConfig& optim, int64_t step, int64_t saved_steps,
                                   int64_t total_steps);

// PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6)); 1 when clip is 0.
double ClipScale(double grad_norm, double clip);

}  // namespace freeride
