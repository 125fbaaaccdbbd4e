// The overhead budget, kept online (freeride.max_overhead, freeride.overhead_check = "on" or
// "strict").
//
// Training runs in cycles of a harvesting block and a plain block (no side work: the reference);
// each harvesting block's mean step time is compared with the plain blocks on either side of it,
// as a study pairs them (trainer/study_stats.h), which cancels drifts slower than a cycle (a
// neighbour arriving on the host). The ratios at the current level of side work give a mean
// with a 95% t-interval. When the interval's lower bound is above the budget (under "strict":
// when its upper bound is, once the level has held min_pairs), side work backs off one level: shorter offers of each bubble, then fewer bubbles, then the costliest task
// benched, then no side work at all. A level is probed back up once it has held enough pairs
// whose interval does not exclude the budget (under "strict": whose interval is within it);
// each back-off from a level doubles the pairs the
// level below must hold before that level is tried again, so a level that costs too much is
// retried ever more rarely instead of every few cycles (until a whole window of pairs at it
// keeps the budget: then a back-off from it earlier was noise, or a neighbour since gone).
//
// "on" asks for evidence of harm before it backs off; "strict" for evidence of no harm before
// it keeps a level. On a host whose step times vary by more than the budget between blocks
// (a busy one), strict ends paused, and the plain pairs it still measures there (an A/A
// interval) show why: no level with side work could be shown within the budget.
//
// Every rank feeds it the same step times (the mean over ranks, agreed in the step's sum), so
// every rank takes the same decisions at the same step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/study_stats.h"

namespace freeride {

// How much side work is offered, from all of it to none.
enum class SideLevel { kFull, kShorter, kFewer, kBenched, kPaused };
inline constexpr int kNumSideLevels = 5;
// "full", "shorter bubbles", "fewer bubbles", "costliest task benched", "paused".
const char* SideLevelName(SideLevel level);

struct OverheadGuardOptions {
  double budget = 0.01;        // freeride.max_overhead
  int64_t plain_steps = 2;     // steps per plain (reference) block
  int64_t harvest_steps = 6;   // steps per harvesting block
  int min_pairs = 3;           // pairs a level holds before it is probed up from
  int window = 12;             // the latest pairs at a level that its interval is taken over
  bool strict = false;         // overhead_check = "strict": a level is kept only when shown
};

struct GuardDecision {
  int64_t step = 0;  // the step after which it was taken (1-based, as metrics count)
  SideLevel from = SideLevel::kFull, to = SideLevel::kFull;
  Estimate overhead;  // at `from`, over the pairs that decided
  bool backed_off() const { return static_cast<int>(to) > static_cast<int>(from); }
  // "side work slowed training by +12.0% [+8.0%, +16.0%] over 3 pairs; budget 1.0%: backing
  // off to shorter bubbles".
  std::string Describe(double budget) const;
};

class OverheadGuard {
 public:
  explicit OverheadGuard(const OverheadGuardOptions& options);

  // Whether the step with 0-based index `step` (the one about to run) is in a harvesting block.
  bool Harvesting(int64_t step) const;
  // The time of step `step` (0-based; the same on every rank); returns the decision when the
  // level changes after it. Step 0 warms caches and is not counted.
  std::optional<GuardDecision> Observe(int64_t step, double step_s);

  SideLevel level() const { return level_; }
  const OverheadGuardOptions& options() const { return options_; }
  // Over every pair of the run, whatever the level (what the run cost in all).
  Estimate RunOverhead() const { return MeanWithInterval(all_ratios_); }
  // Over the window of pairs at the current level (paused: plain against plain, the noise).
  Estimate LevelOverhead() const;
  int64_t back_offs() const { return back_offs_; }

 private:
  struct OpenBlock {
    int64_t index = -1;  // step / cycle, and whether harvesting: a block's identity
    bool harvesting = false;
    double sum_s = 0;
    int64_t steps = 0;
    SideLevel level = SideLevel::kFull;
  };
  void Close();
  std::optional<GuardDecision> Judge(int64_t step);

  OverheadGuardOptions options_;
  SideLevel level_ = SideLevel::kFull;
  OpenBlock open_;
  std::vector<OpenBlock> closed_;  // the last three at most: plain, harvesting, plain
  std::vector<double> ratios_;     // at the current level, since it began
  std::vector<double> all_ratios_;
  // Per level: pairs the level below must hold before this one is tried again.
  std::vector<int> required_;
  int64_t back_offs_ = 0;
};

}  // namespace freeride
