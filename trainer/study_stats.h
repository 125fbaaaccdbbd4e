// The statistics of a harvest study: what a block pattern says about an arm, with its 95%
// confidence interval.
//
// A study runs blocks of steps: plain (training alone), then an arm's block, then plain again,
// and so on. Each arm block is compared with the mean of the plain blocks on either side of it,
// which cancels drifts slower than a block (the machine warming, another tenant arriving): the
// pair gives one ratio, arm / reference − 1. An arm's overhead is the mean of its ratios, and
// its interval a Student t-interval over them. Two blocks of one arm must never share a plain
// neighbour: their ratios would be correlated through it and the interval too narrow (one arm
// alone, every pair sharing, covers ~91% instead of 95%). So the arm order, shuffled every
// round, never starts a round with the arm that ended the one before. The A/A arm — training alone measured exactly like a task arm — gives the
// noise floor: its interval is what "no effect" looks like on this machine.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace freeride {

// A mean and its two-sided 95% interval. With fewer than two values the interval is unknown:
// lo = −inf, hi = +inf.
struct Estimate {
  double mean = 0;
  double lo = 0, hi = 0;
  int n = 0;
  double half_width() const { return (hi - lo) / 2; }
  bool covers(double v) const { return lo <= v && v <= hi; }
  bool known() const { return n >= 2; }
};

// The 97.5% quantile of Student's t with `df` >= 1 degrees of freedom (Boost.Math); +inf below.
double StudentT975(int df);

// Mean of `values` with the t-interval mean ± t(n−1) · s / √n.
Estimate MeanWithInterval(const std::vector<double>& values);

struct Block {
  int arm = 0;        // 0: plain (training alone); > 0: an arm's block
  double step_s = 0;  // the block's mean step time
};

// One round's order of the arms 1..arms−1, shuffled by `rng`; when there are at least two, the
// first is not `previous_last` (the arm that ended the round before; 0: none).
std::vector<int> ShuffledRound(int arms, int previous_last, std::mt19937_64& rng);

// For each arm 1..arms−1, in block order, its blocks' ratios to their references minus 1: the
// mean of the plain blocks right before and right after (the one that exists, at an end).
// An arm block with no plain neighbour has no reference and is left out.
std::vector<std::vector<double>> PairedRatios(const std::vector<Block>& blocks, int arms);

// Plain blocks against plain blocks, as an A/A arm would be: the blocks without side work,
// taken in disjoint triples of consecutive ones, each middle block against the mean of its two
// neighbours (disjoint, so that no two ratios share a block). What "no effect" looks like on
// this host when a run has no A/A arm; none (n = 0) with fewer than three plain blocks.
Estimate PlainBlockNoise(const std::vector<Block>& blocks);

// The overhead of side work as every place states it (the log's end line, harvest_summary,
// both report tables, the study): the paired estimate and its 95% interval against the budget,
// beside what blocks without side work differ by on this host.
struct OverheadFigure {
  Estimate estimate;
  Estimate noise;  // an A/A arm, or PlainBlockNoise; n = 0: not measured
  double budget = 0.01;
  enum class Verdict {
    kNoInterval,    // fewer than two pairs
    kAbove,         // the interval lies above the budget
    kWithin,        // the interval lies within it
    kUnresolvable,  // the interval holds the budget, and the host's noise exceeds it
    kUndecided,     // the interval holds the budget: more blocks may tell
  };
  Verdict verdict() const;
};
// "above", "within", "cannot_resolve", "undecided", "no_interval".
const char* OverheadVerdictName(OverheadFigure::Verdict verdict);
// The one wording, "+2.70% [-0.90%, +6.30%]: " then "above the 1% budget", "within the 1%
// budget", "not shown above or within the 1% budget", or "cannot resolve a 1% budget on this
// host: blocks without side work differ by ±3.80%"; "+1.20% (one pair: no interval)" with
// fewer than two pairs.
std::string DescribeOverhead(const OverheadFigure& figure);
// "88.1% [87.2%, 89.0%]" (a fraction as a percentage with its interval).
std::string DescribePercent(const Estimate& fraction, int decimals);

}  // namespace freeride
