// The study's statistics on synthetic block times: the t quantile against the integrated
// density, a known effect recovered through drift and noise and covered by its interval, the
// A/A arm's interval covering 0, and the interval's coverage near 95% over many replicates.
#include "trainer/study_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "gtest/gtest.h"

namespace freeride {
namespace {

// P(0 < T < t) for Student's t with `df` degrees of freedom, by Simpson's rule on its density.
double TMass(double t, int df) {
  const double v = df;
  const double c = std::exp(std::lgamma((v + 1) / 2) - std::lgamma(v / 2)) / std::sqrt(v * M_PI);
  auto pdf = [&](double x) { return c * std::pow(1 + x * x / v, -(v + 1) / 2); };
  const int n = 200000;
  const double h = t / n;
  double sum = pdf(0) + pdf(t);
  for (int i = 1; i < n; ++i) sum += (i % 2 ? 4 : 2) * pdf(i * h);
  return sum * h / 3;
}

TEST(StudyStatsTest, TQuantileHoldsTwoAndAHalfPercentInEachTail) {
  for (int df : {1, 2, 3, 4, 7, 12, 29, 30, 31, 35, 45, 60, 120, 500}) {
    EXPECT_NEAR(TMass(StudentT975(df), df), 0.475, 2e-5) << "df " << df;
  }
  EXPECT_TRUE(std::isinf(StudentT975(0)));
}

TEST(StudyStatsTest, TQuantileMatchesPublishedValues) {
  // qt(0.975, df) to 15 digits, as R and SciPy give them.
  EXPECT_NEAR(StudentT975(1), 12.706204736174707, 1e-9);
  EXPECT_NEAR(StudentT975(2), 4.302652729749464, 1e-9);
  EXPECT_NEAR(StudentT975(3), 3.182446305284263, 1e-9);
  EXPECT_NEAR(StudentT975(10), 2.228138851986274, 1e-9);
  EXPECT_NEAR(StudentT975(30), 2.042272456301238, 1e-9);
  EXPECT_NEAR(StudentT975(100), 1.983971518523552, 1e-9);
}

TEST(StudyStatsTest, MeanWithIntervalMatchesTheFormula) {
  const Estimate e = MeanWithInterval({1.0, 2.0, 3.0, 4.0});
  EXPECT_EQ(e.n, 4);
  EXPECT_DOUBLE_EQ(e.mean, 2.5);
  // s = sqrt(5/3), t(3) = 3.182446305284263
  const double half = 3.182446305284263 * std::sqrt(5.0 / 3.0) / 2;
  EXPECT_NEAR(e.lo, 2.5 - half, 1e-9);
  EXPECT_NEAR(e.hi, 2.5 + half, 1e-9);
  const Estimate one = MeanWithInterval({0.7});
  EXPECT_FALSE(one.known());
  EXPECT_DOUBLE_EQ(one.mean, 0.7);
  EXPECT_TRUE(one.covers(100));
}

TEST(StudyStatsTest, ReferencesAreThePlainBlocksOnEitherSide) {
  // arm 1 between plain 1.0 and 3.0: reference 2.0; arm 2 at the end: reference 3.0 alone;
  // arm 1 after arm 2 has no plain neighbour and is left out.
  const std::vector<Block> blocks = {{0, 1.0}, {1, 2.2}, {0, 3.0}, {2, 3.3}, {1, 9.0}};
  const auto ratios = PairedRatios(blocks, 3);
  ASSERT_EQ(ratios.size(), 3u);
  EXPECT_TRUE(ratios[0].empty());
  ASSERT_EQ(ratios[1].size(), 1u);
  EXPECT_NEAR(ratios[1][0], 0.1, 1e-12);
  ASSERT_EQ(ratios[2].size(), 1u);
  EXPECT_NEAR(ratios[2][0], 0.1, 1e-12);
}

// A study's block sequence: plain, then per round each arm (in ShuffledRound's order) followed
// by a plain block. Step times drift (slowly, 20% over the run, and with a slow wave) and carry
// multiplicative noise of `noise` (one standard deviation of a block mean); arm a's true
// effect is effects[a].
std::vector<Block> Synthetic(const std::vector<double>& effects, int rounds, double noise,
                             std::mt19937_64& rng) {
  std::normal_distribution<double> gauss(0.0, noise);
  const int total = 1 + rounds * 2 * (static_cast<int>(effects.size()) - 1);
  int t = 0;
  auto step = [&](int arm) {
    const double x = static_cast<double>(t++) / total;
    const double drift = 0.25 * (1 + 0.2 * x + 0.05 * std::sin(6.0 * x));
    return Block{arm, drift * (1 + effects[arm]) * (1 + gauss(rng))};
  };
  std::vector<Block> blocks = {step(0)};
  int last = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int arm : ShuffledRound(static_cast<int>(effects.size()), last, rng)) {
      blocks.push_back(step(arm));
      blocks.push_back(step(0));
      last = arm;
    }
  }
  return blocks;
}

TEST(StudyStatsTest, RecoversAKnownEffectThroughDriftAndNoise) {
  std::mt19937_64 rng(7);
  // arm 1: A/A (no effect); arm 2: +3%; arm 3: −1.5%.
  const std::vector<double> effects = {0, 0, 0.03, -0.015};
  const auto ratios = PairedRatios(Synthetic(effects, 30, 0.01, rng), 4);
  const Estimate aa = MeanWithInterval(ratios[1]);
  const Estimate slower = MeanWithInterval(ratios[2]);
  const Estimate faster = MeanWithInterval(ratios[3]);
  EXPECT_EQ(aa.n, 30);
  EXPECT_TRUE(aa.covers(0)) << aa.lo << " " << aa.hi;
  EXPECT_LT(aa.half_width(), 0.01);
  EXPECT_TRUE(slower.covers(0.03)) << slower.lo << " " << slower.hi;
  EXPECT_FALSE(slower.covers(0));
  EXPECT_TRUE(faster.covers(-0.015)) << faster.lo << " " << faster.hi;
  EXPECT_FALSE(faster.covers(0));
  // Against a 1% budget, with the A/A arm as the noise: +3% is above it, the A/A within.
  const std::string said = DescribeOverhead({slower, aa, 0.01});
  EXPECT_TRUE(said.ends_with(": above the 1% budget")) << said;
  EXPECT_TRUE(DescribeOverhead({aa, aa, 0.01}).ends_with(": within the 1% budget"));
}

TEST(StudyStatsTest, NoArmsBlocksShareAPlainNeighbour) {
  std::mt19937_64 rng(3);
  for (int arms : {3, 4, 6}) {
    int last = 0;
    std::vector<int> sequence;
    for (int r = 0; r < 200; ++r) {
      const std::vector<int> order = ShuffledRound(arms, last, rng);
      std::vector<int> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int a = 1; a < arms; ++a) ASSERT_EQ(sorted[a - 1], a);
      sequence.insert(sequence.end(), order.begin(), order.end());
      last = order.back();
    }
    for (size_t i = 1; i < sequence.size(); ++i) ASSERT_NE(sequence[i], sequence[i - 1]);
  }
  EXPECT_EQ(ShuffledRound(2, 1, rng), std::vector<int>{1});  // one arm: nothing to avoid
}

TEST(StudyStatsTest, IntervalsCoverTheTruthAboutNinetyFivePercentOfTheTime) {
  std::mt19937_64 rng(11);
  // An A/A arm and a +2% arm, as in every study: no arm's pairs share a plain block.
  const std::vector<double> effects = {0, 0, 0.02};
  int covered_aa = 0, covered = 0;
  const int replicates = 2000;
  for (int i = 0; i < replicates; ++i) {
    const auto ratios = PairedRatios(Synthetic(effects, 8, 0.02, rng), 3);
    covered_aa += MeanWithInterval(ratios[1]).covers(0);
    covered += MeanWithInterval(ratios[2]).covers(0.02);
  }
  // Binomial(2000, 0.95): one standard deviation is 0.5%.
  for (int c : {covered_aa, covered}) {
    const double rate = static_cast<double>(c) / replicates;
    EXPECT_GT(rate, 0.935);
    EXPECT_LT(rate, 0.965);
  }
}

TEST(StudyStatsTest, DescriptionsSayWhatIsKnown) {
  EXPECT_EQ(DescribeOverhead({MeanWithInterval({0.012}), Estimate{}, 0.01}), "+1.20% (one pair: no interval)");
  EXPECT_EQ(DescribeOverhead({MeanWithInterval({}), Estimate{}, 0.01}), "+0.00% (no pairs: no interval)");
  Estimate e;
  e.mean = 0.02, e.lo = 0.015, e.hi = 0.025, e.n = 5;
  EXPECT_EQ(DescribeOverhead({e, Estimate{}, 0.01}), "+2.00% [+1.50%, +2.50%]: above the 1% budget");
  e.mean = 0.002, e.lo = -0.004, e.hi = 0.008;
  EXPECT_EQ(DescribeOverhead({e, Estimate{}, 0.01}), "+0.20% [-0.40%, +0.80%]: within the 1% budget");
  e.mean = 0.01, e.lo = 0.006, e.hi = 0.014;
  EXPECT_EQ(DescribeOverhead({e, Estimate{}, 0.01}), "+1.00% [+0.60%, +1.40%]: not shown above or within the 1% "
                                   "budget");
  // The interval holds the budget and is wider than it: more blocks may tell, unless blocks
  // without side work differ by more than the budget.
  e.mean = 0.027, e.lo = -0.009, e.hi = 0.063;
  EXPECT_EQ(DescribeOverhead({e, Estimate{}, 0.01}),
            "+2.70% [-0.90%, +6.30%]: not shown above or within the 1% budget");
  Estimate noise;
  noise.mean = 0.001, noise.lo = -0.037, noise.hi = 0.039, noise.n = 4;
  EXPECT_EQ(DescribeOverhead({e, noise, 0.01}),
            "+2.70% [-0.90%, +6.30%]: cannot resolve a 1% budget on this host: blocks without "
            "side work differ by ±3.80%");
  e.mean = 0.881, e.lo = 0.872, e.hi = 0.89;
  EXPECT_EQ(DescribePercent(e, 1), "88.1% [87.2, 89.0]");
}

// Made-up step times of a busy host, where side work costs nothing and plain blocks alone swing
// by ±30% from block to block: the run's own plain blocks say so, and the figure says the host
// cannot resolve the budget, never "no measurable overhead"; the same cost on a quiet host
// (plain blocks within ±0.2%) is shown above the budget.
TEST(StudyStatsTest, AHostTooNoisyForTheBudgetIsSaidToBe) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> swing(0.7, 1.3);
  std::vector<Block> noisy, quiet;
  for (int i = 0; i < 48; ++i) {
    const int arm = i % 2;
    noisy.push_back({arm, swing(rng)});
    quiet.push_back({arm, (arm == 1 ? 1.05 : 1.0) * (i % 4 == 0 ? 1.002 : 0.999)});
  }
  const Estimate noise = PlainBlockNoise(noisy);
  ASSERT_TRUE(noise.known());
  EXPECT_EQ(noise.n, 8);  // 24 plain blocks, in disjoint triples
  EXPECT_GT(noise.half_width(), 0.1);
  const OverheadFigure busy{MeanWithInterval(PairedRatios(noisy, 2)[1]), noise, 0.01};
  EXPECT_EQ(busy.verdict(), OverheadFigure::Verdict::kUnresolvable);
  const std::string said = DescribeOverhead(busy);
  EXPECT_NE(said.find(": cannot resolve a 1% budget on this host: blocks without side work "
                      "differ by ±"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("no measurable"), std::string::npos);
  EXPECT_STREQ(OverheadVerdictName(busy.verdict()), "cannot_resolve");
  const OverheadFigure calm{MeanWithInterval(PairedRatios(quiet, 2)[1]), PlainBlockNoise(quiet),
                            0.01};
  EXPECT_EQ(calm.verdict(), OverheadFigure::Verdict::kAbove) << DescribeOverhead(calm);
  EXPECT_LT(calm.noise.half_width(), 0.01);
  // Fewer than three plain blocks measure no noise.
  EXPECT_FALSE(PlainBlockNoise({{0, 1.0}, {1, 1.1}, {0, 1.0}}).known());
}

}  // namespace
}  // namespace freeride
