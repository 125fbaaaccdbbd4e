#include "trainer/overhead_guard.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace freeride {

const char* SideLevelName(SideLevel level) {
  switch (level) {
    case SideLevel::kFull:
      return "full";
    case SideLevel::kShorter:
      return "shorter bubbles";
    case SideLevel::kFewer:
      return "fewer bubbles";
    case SideLevel::kBenched:
      return "costliest task benched";
    case SideLevel::kPaused:
      return "paused";
  }
  return "?";
}

std::string GuardDecision::Describe(double budget) const {
  const std::string measured =
      overhead.known() ? absl::StrFormat("%+.1f%% [%+.1f%%, %+.1f%%] over %d pairs",
                                         100 * overhead.mean, 100 * overhead.lo,
                                         100 * overhead.hi, overhead.n)
                       : absl::StrFormat("%+.1f%% (%d pairs)", 100 * overhead.mean, overhead.n);
  if (backed_off() && overhead.lo > budget) {
    return absl::StrFormat("side work slowed training by %s; budget %.1f%%: backing off to %s",
                           measured, 100 * budget, SideLevelName(to));
  }
  if (backed_off()) {  // strict: no harm shown, and none ruled out
    return absl::StrFormat(
        "side work at %s costs %s, not shown within the budget of %.1f%% (strict): backing off "
        "to %s",
        SideLevelName(from), measured, 100 * budget, SideLevelName(to));
  }
  return absl::StrFormat("side work at %s costs %s; budget %.1f%%: probing up to %s",
                         SideLevelName(from), measured, 100 * budget, SideLevelName(to));
}

OverheadGuard::OverheadGuard(const OverheadGuardOptions& options)
    : options_(options), required_(kNumSideLevels, options.min_pairs) {}

bool OverheadGuard::Harvesting(int64_t step) const {
  const int64_t cycle = options_.plain_steps + options_.harvest_steps;
  return step % cycle < options_.harvest_steps;
}

void OverheadGuard::Close() {
  if (open_.steps > 0) closed_.push_back(open_);
  if (closed_.size() > 3) closed_.erase(closed_.begin(), closed_.end() - 3);
  open_ = OpenBlock{};
}

std::optional<GuardDecision> OverheadGuard::Observe(int64_t step, double step_s) {
  const int64_t cycle = options_.plain_steps + options_.harvest_steps;
  const bool harvesting = Harvesting(step);
  const int64_t index = step / cycle;
  if (open_.index != index || open_.harvesting != harvesting) Close();
  open_.index = index;
  open_.harvesting = harvesting;
  open_.level = level_;
  if (step > 0) {  // the first step warms up
    open_.sum_s += step_s;
    open_.steps += 1;
  }
  // A plain block's last step completes a pair: plain, harvesting, plain.
  const bool plain_ends = step % cycle == cycle - 1;
  if (!plain_ends) return std::nullopt;
  Close();
  if (closed_.size() < 3 || closed_[0].harvesting || !closed_[1].harvesting ||
      closed_[2].harvesting) {
    return std::nullopt;
  }
  const double reference =
      (closed_[0].sum_s / closed_[0].steps + closed_[2].sum_s / closed_[2].steps) / 2;
  const double ratio = (closed_[1].sum_s / closed_[1].steps) / reference - 1;
  all_ratios_.push_back(ratio);
  // A pair whose harvesting block began at another level says nothing of this one.
  if (closed_[1].level == level_) ratios_.push_back(ratio);
  return Judge(step + 1);
}

Estimate OverheadGuard::LevelOverhead() const {
  const size_t n = ratios_.size();
  return MeanWithInterval(std::vector<double>(
      ratios_.end() - static_cast<std::ptrdiff_t>(std::min<size_t>(n, options_.window)),
      ratios_.end()));
}

std::optional<GuardDecision> OverheadGuard::Judge(int64_t step) {
  const size_t n = ratios_.size();
  const Estimate e = LevelOverhead();
  const int at = static_cast<int>(level_);
  GuardDecision d;
  d.step = step;
  d.from = level_;
  d.overhead = e;
  const double budget = options_.budget;
  // "on": harm shown (the lower bound above the budget); "strict": no harmlessness shown once
  // the level has had its pairs (the upper bound above it).
  const bool over = options_.strict
                        ? e.known() && static_cast<int>(n) >= options_.min_pairs && e.hi > budget
                        : e.known() && e.lo > budget;
  const bool holds = e.known() && (options_.strict ? e.hi <= budget : e.lo <= budget);
  if (over && level_ != SideLevel::kPaused) {
    d.to = static_cast<SideLevel>(at + 1);
    required_[at] *= 2;  // this level is retried ever more rarely
    ++back_offs_;
  } else if (level_ != SideLevel::kFull && static_cast<int>(n) >= required_[at - 1] && holds) {
    d.to = static_cast<SideLevel>(at - 1);
  } else {
    // A level that has held a whole window of pairs within the budget has shown what it costs:
    // a back-off from it earlier (noise, a neighbour since gone) no longer delays probes to it.
    if (static_cast<int>(n) >= options_.window) required_[at] = options_.min_pairs;
    return std::nullopt;
  }
  level_ = d.to;
  ratios_.clear();
  return d;
}

}  // namespace freeride
