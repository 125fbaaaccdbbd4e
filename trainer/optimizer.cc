#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "core/status.h"

namespace freeride {
namespace {

// Where step lies in [begin, last], as a fraction clipped to [0, 1].
double Progress(int64_t step, int64_t begin, int64_t last) {
  const int64_t span = std::max<int64_t>(1, last - begin);
  return std::clamp(static_cast<double>(step - begin) / static_cast<double>(span), 0.0, 1.0);
}

}  // namespace

double LearningRate(const OptimConfig& optim, int64_t step, int64_t total_steps) {
  if (step < optim.warmup_steps) {
    return optim.lr * static_cast<double>(step + 1) / static_cast<double>(optim.warmup_steps);
  }
  if (optim.schedule == "constant") return optim.lr;
  const double min_lr = optim.lr * optim.min_lr_ratio;
  const int64_t last = total_steps - 1;
  if (optim.schedule == "linear") {
    return min_lr + (1.0 - Progress(step, optim.warmup_steps, last)) * (optim.lr - min_lr);
  }
  if (optim.schedule == "wsd") {
    const int64_t decay = std::llround(optim.decay_fraction * static_cast<double>(total_steps));
    const int64_t begin = std::max<int64_t>(optim.warmup_steps, total_steps - decay);
    if (decay <= 0 || step <= begin) return optim.lr;
    return min_lr + (1.0 - Progress(step, begin, last)) * (optim.lr - min_lr);
  }
  // Cosine, written as it always was: results from before the other schedules stay bit-exact.
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - 1 - optim.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - optim.warmup_steps) / decay_steps);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (optim.lr - min_lr);
}

absl::Status CheckScheduleOnResume(const OptimConfig& optim, int64_t step, int64_t saved_steps,
                                   int64_t total_steps) {
  // At or past this run's end no step is trained, so nothing is reshaped (the run says so).
  if (saved_steps <= 0 || saved_steps == total_steps || step >= total_steps ||
      optim.reshape_schedule) {
    return absl::OkStatus();
  }
  // The first step from here whose rate the new length changes (none: constant, a warm-up
  // that outlasts both, a WSD decay of length 0).
  int64_t parts = -1;
  for (int64_t s = step; s < total_steps; ++s) {
    if (LearningRate(optim, s, saved_steps) != LearningRate(optim, s, total_steps)) {
      parts = s;
      break;
    }
  }
  if (parts < 0) return absl::OkStatus();
  std::string change;
  if (parts == step) {
    // The last step the checkpoint ran, under its own length, against the next under ours.
    const int64_t previous = std::max<int64_t>(0, step - 1);
    change = absl::StrFormat("%.3g at step %d → %.3g at step %d (%.3g with train.steps = %d)",
                             LearningRate(optim, previous, saved_steps), previous,
                             LearningRate(optim, step, total_steps), step,
                             LearningRate(optim, step, saved_steps), saved_steps);
  } else {
    change = absl::StrFormat(
        "the same %.3g at step %d, but from step %d %.3g instead of %.3g (train.steps = %d)",
        LearningRate(optim, step, total_steps), step, parts,
        LearningRate(optim, parts, total_steps), LearningRate(optim, parts, saved_steps),
        saved_steps);
  }
  return UsageError(absl::InvalidArgumentError(absl::StrFormat(
      "the checkpoint at step %d was trained with train.steps = %d; this run has train.steps "
      "= %d, which reshapes the %s learning-rate schedule: %s. Resume with --set "
      "train.steps=%d to continue the schedule, or --set optim.reshape_schedule=true to "
      "reshape it",
      step, saved_steps, total_steps, optim.schedule, change, saved_steps)));
}

double ClipScale(double grad_norm, double clip) {
  if (clip <= 0) return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

}  // namespace freeride
