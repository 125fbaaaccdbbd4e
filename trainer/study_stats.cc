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

std::string DescribeOverhead(const Estimate& overhead) {
  if (!overhead.known()) {
    return absl::StrFormat("%+.2f%% (%s: no interval)", 100 * overhead.mean,
                           overhead.n == 1 ? "one pair" : "no pairs");
  }
  if (overhead.covers(0)) {
    return absl::StrFormat("no measurable overhead (±%.2f%%)", 100 * overhead.half_width());
  }
  return absl::StrFormat("%+.2f%% [%+.2f%%, %+.2f%%]", 100 * overhead.mean, 100 * overhead.lo,
                         100 * overhead.hi);
}

std::string DescribePercent(const Estimate& fraction, int decimals) {
  if (!fraction.known()) return absl::StrFormat("%.*f%%", decimals, 100 * fraction.mean);
  return absl::StrFormat("%.*f%% [%.*f, %.*f]", decimals, 100 * fraction.mean, decimals,
                         100 * fraction.lo, decimals, 100 * fraction.hi);
}

}  // namespace freeride
