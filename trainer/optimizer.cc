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
    if (step <= begin) return optim.lr;
    return min_lr + (1.0 - Progress(step, begin, last)) * (optim.lr - min_lr);
  }
  // Cosine, written as it always was: results from before the other schedules stay bit-exact.
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - 1 - optim.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - optim.warmup_steps) / decay_steps);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (optim.lr - min_lr);
}

bool ScheduleDependsOnLength(const OptimConfig& optim) { return optim.schedule != "constant"; }

absl::Status CheckScheduleOnResume(const OptimConfig& optim, int64_t step, int64_t saved_steps,
                                   int64_t total_steps) {
  // At or past this run's end no step is trained, so nothing is reshaped (the run says so).
  if (saved_steps <= 0 || saved_steps == total_steps || step >= total_steps ||
      optim.reshape_schedule || !ScheduleDependsOnLength(optim)) {
    return absl::OkStatus();
  }
  // The last step the checkpoint ran, under its own length, against the next one under ours.
  const int64_t previous = std::max<int64_t>(0, step - 1);
  const double from = LearningRate(optim, previous, saved_steps);
  const double to = LearningRate(optim, step, total_steps);
  const double planned = LearningRate(optim, step, saved_steps);
  return UsageError(absl::InvalidArgumentError(absl::StrFormat(
      "the checkpoint at step %d was trained with train.steps = %d; this run has train.steps "
      "= %d, which reshapes the %s learning-rate schedule: %.3g at step %d → %.3g at step %d "
      "(%.3g with train.steps = %d). Resume with --set train.steps=%d to continue the schedule, "
      "or --set optim.reshape_schedule=true to reshape it",
      step, saved_steps, total_steps, optim.schedule, from, previous, to, step, planned,
      saved_steps, saved_steps)));
}

double ClipScale(double grad_norm, double clip) {
  if (clip <= 0) return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

}  // namespace freeride
