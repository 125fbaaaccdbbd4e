#include "trainer/study_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "boost/math/distributions/students_t.hpp"

namespace freeride {

double StudentT975(int df) {
  if (df < 1) return std::numeric_limits<double>::infinity();
  return boost::math::quantile(boost::math::students_t_distribution<double>(df), 0.975);
}

Estimate MeanWithInterval(const std::vector<double>& values) {
  Estimate e;
  e.n = static_cast<int>(values.size());
  if (e.n == 0) {
    e.lo = -std::numeric_limits<double>::infinity();
    e.hi = std::numeric_limits<double>::infinity();
    return e;
  }
  double sum = 0;
  for (double v : values) sum += v;
  e.mean = sum / e.n;
  if (e.n < 2) {
    e.lo = -std::numeric_limits<double>::infinity();
    e.hi = std::numeric_limits<double>::infinity();
    return e;
  }
  double squares = 0;
  for (double v : values) squares += (v - e.mean) * (v - e.mean);
  const double sd = std::sqrt(squares / (e.n - 1));
  const double half = StudentT975(e.n - 1) * sd / std::sqrt(static_cast<double>(e.n));
  e.lo = e.mean - half;
  e.hi = e.mean + half;
  return e;
}

std::vector<int> ShuffledRound(int arms, int previous_last, std::mt19937_64& rng) {
  std::vector<int> order(std::max(arms - 1, 0));
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  if (order.size() >= 2 && order.front() == previous_last) {
    // Swapping with a uniformly chosen later place keeps every other order equally likely.
    std::uniform_int_distribution<size_t> pick(1, order.size() - 1);
    std::swap(order.front(), order[pick(rng)]);
  }
  return order;
}

std::vector<std::vector<double>> PairedRatios(const std::vector<Block>& blocks, int arms) {
  std::vector<std::vector<double>> ratios(arms > 0 ? arms : 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int arm = blocks[i].arm;
    if (arm <= 0 || arm >= arms) continue;
    double sum = 0;
    int count = 0;
    if (i > 0 && blocks[i - 1].arm == 0) sum += blocks[i - 1].step_s, ++count;
    if (i + 1 < blocks.size() && blocks[i + 1].arm == 0) sum += blocks[i + 1].step_s, ++count;
    if (count == 0 || sum <= 0) continue;
    ratios[arm].push_back(blocks[i].step_s / (sum / count) - 1);
  }
  return ratios;
}

Estimate PlainBlockNoise(const std::vector<Block>& blocks) {
  std::vector<double> plain;
  for (const Block& b : blocks) {
    if (b.arm == 0) plain.push_back(b.step_s);
  }
  std::vector<double> ratios;
  for (size_t k = 0; k + 2 < plain.size(); k += 3) {
    const double reference = (plain[k] + plain[k + 2]) / 2;
    if (reference > 0) ratios.push_back(plain[k + 1] / reference - 1);
  }
  if (ratios.empty()) return Estimate{};
  return MeanWithInterval(ratios);
}

OverheadFigure::Verdict OverheadFigure::verdict() const {
  if (!estimate.known()) return Verdict::kNoInterval;
  if (estimate.lo > budget) return Verdict::kAbove;
  if (estimate.hi <= budget) return Verdict::kWithin;
  // The interval holds the budget: more blocks narrow it, unless the host's own noise is
  // wider than the budget.
  return noise.known() && noise.half_width() > budget ? Verdict::kUnresolvable
                                                      : Verdict::kUndecided;
}

const char* OverheadVerdictName(OverheadFigure::Verdict verdict) {
  switch (verdict) {
    case OverheadFigure::Verdict::kNoInterval: return "no_interval";
    case OverheadFigure::Verdict::kAbove: return "above";
    case OverheadFigure::Verdict::kWithin: return "within";
    case OverheadFigure::Verdict::kUnresolvable: return "cannot_resolve";
    case OverheadFigure::Verdict::kUndecided: return "undecided";
  }
  return "";
}

std::string DescribeOverhead(const OverheadFigure& figure) {
  using Verdict = OverheadFigure::Verdict;
  const Estimate& e = figure.estimate;
  const Verdict verdict = figure.verdict();
  if (verdict == Verdict::kNoInterval) {
    return absl::StrFormat("%+.2f%% (%s: no interval)", 100 * e.mean,
                           e.n == 1 ? "one pair" : "no pairs");
  }
  const std::string budget = absl::StrFormat("%g%%", 100 * figure.budget);
  std::string says;
  switch (verdict) {
    case Verdict::kAbove:
      says = absl::StrFormat("above the %s budget", budget);
      break;
    case Verdict::kWithin:
      says = absl::StrFormat("within the %s budget", budget);
      break;
    case Verdict::kUndecided:
      says = absl::StrFormat("not shown above or within the %s budget", budget);
      break;
    case Verdict::kUnresolvable:
      says = absl::StrFormat(
          "cannot resolve a %s budget on this host: blocks without side work differ by ±%.2f%%",
          budget, 100 * figure.noise.half_width());
      break;
    case Verdict::kNoInterval:
      break;
  }
  return absl::StrFormat("%+.2f%% [%+.2f%%, %+.2f%%]: %s", 100 * e.mean, 100 * e.lo, 100 * e.hi,
                         says);
}

std::string DescribePercent(const Estimate& fraction, int decimals) {
  if (!fraction.known()) return absl::StrFormat("%.*f%%", decimals, 100 * fraction.mean);
  return absl::StrFormat("%.*f%% [%.*f, %.*f]", decimals, 100 * fraction.mean, decimals,
                         100 * fraction.lo, decimals, 100 * fraction.hi);
}

}  // namespace freeride
