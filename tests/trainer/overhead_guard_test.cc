// The overhead guard's decisions (trainer/overhead_guard.h) on step times made up by the test:
// exact and the same under any load. A side-work cost is a factor on the harvesting blocks'
// steps that depends on the level the guard has set, with noise from a fixed seed.
#include "trainer/overhead_guard.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace freeride {
namespace {

struct Trace {
  std::vector<GuardDecision> decisions;
  std::vector<int> steps_at_level = std::vector<int>(kNumSideLevels, 0);
};

// `steps` steps of 1 s ± `noise` (uniform), harvesting ones slowed by cost[level].
Trace Simulate(OverheadGuard& guard, int64_t steps, const std::vector<double>& cost, double noise,
          uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> jitter(-noise, noise);
  Trace trace;
  for (int64_t step = 0; step < steps; ++step) {
    const int level = static_cast<int>(guard.level());
    double step_s = 1.0 + jitter(rng);
    if (guard.Harvesting(step)) {
      step_s *= 1.0 + cost[level];
      trace.steps_at_level[level] += 1;
    }
    if (std::optional<GuardDecision> d = guard.Observe(step, step_s)) {
      trace.decisions.push_back(*d);
    }
  }
  return trace;
}

TEST(OverheadGuardTest, CyclesAreHarvestingThenPlainBlocks) {
  OverheadGuard guard({});
  std::vector<bool> pattern;
  for (int64_t step = 0; step < 16; ++step) pattern.push_back(guard.Harvesting(step));
  const std::vector<bool> expected = {true, true, true, true, true, true, false, false,
                                      true, true, true, true, true, true, false, false};
  EXPECT_EQ(pattern, expected);
  // alternate_every = 4: the blocks of freeride.alternate_every, harvesting first.
  OverheadGuardOptions every4;
  every4.plain_steps = every4.harvest_steps = 4;
  OverheadGuard alternating(every4);
  EXPECT_TRUE(alternating.Harvesting(3));
  EXPECT_FALSE(alternating.Harvesting(4));
  EXPECT_TRUE(alternating.Harvesting(8));
}

TEST(OverheadGuardTest, SideWorkThatCostsNothingIsNeverBackedOff) {
  OverheadGuard guard({});
  // 100 cycles with ±2% noise per step and no cost.
  const Trace trace = Simulate(guard, 800, {0, 0, 0, 0, 0}, 0.02);
  EXPECT_TRUE(trace.decisions.empty()) << trace.decisions.front().Describe(0.01);
  EXPECT_EQ(guard.level(), SideLevel::kFull);
  const Estimate run = guard.RunOverhead();
  EXPECT_EQ(run.n, 99);  // every cycle but the first (no plain block before it) made a pair
  EXPECT_TRUE(run.covers(0.0));
}

TEST(OverheadGuardTest, ATaskThatCostsTenPercentIsBackedOffWithinThreePairs) {
  OverheadGuard guard({});
  // 10% at full; the levels cost less and less; nothing when paused.
  const Trace trace = Simulate(guard, 400, {0.10, 0.10, 0.10, 0.10, 0}, 0.01);
  ASSERT_FALSE(trace.decisions.empty());
  const GuardDecision& first = trace.decisions.front();
  EXPECT_TRUE(first.backed_off());
  EXPECT_EQ(first.from, SideLevel::kFull);
  EXPECT_EQ(first.to, SideLevel::kShorter);
  EXPECT_GT(first.overhead.lo, 0.01);
  // Harvesting 6 + plain 2: pairs complete after steps 16, 24 and 32 (1-based); the third
  // at the latest decides.
  EXPECT_LE(first.step, 32);
  EXPECT_NE(first.Describe(0.01).find("budget 1.0%: backing off to shorter bubbles"),
            std::string::npos)
      << first.Describe(0.01);
  // Every level but "paused" costs 10% here: the guard reaches it, and the probes up from it
  // come ever more rarely, so most harvesting steps run with no side work.
  int reached_paused = 0;
  for (const GuardDecision& d : trace.decisions) reached_paused += d.to == SideLevel::kPaused;
  EXPECT_GT(reached_paused, 0);
  EXPECT_GT(trace.steps_at_level[static_cast<int>(SideLevel::kPaused)],
            trace.steps_at_level[static_cast<int>(SideLevel::kFull)] +
                trace.steps_at_level[static_cast<int>(SideLevel::kShorter)]);
}

TEST(OverheadGuardTest, ItSettlesAtTheLevelThatKeepsTheBudgetAndProbesBackUp) {
  OverheadGuard guard({});
  // Full costs 8%, shorter bubbles 4%, fewer bubbles 0.2%: the guard backs off twice, then
  // stays at "fewer bubbles" most of the time, probing "shorter" ever more rarely.
  const Trace trace = Simulate(guard, 2400, {0.08, 0.04, 0.002, 0.0, 0.0}, 0.01);
  ASSERT_GE(trace.decisions.size(), 2u);
  EXPECT_EQ(trace.decisions[0].to, SideLevel::kShorter);
  EXPECT_EQ(trace.decisions[1].to, SideLevel::kFewer);
  int probes = 0;
  for (const GuardDecision& d : trace.decisions) {
    EXPECT_NE(d.to, SideLevel::kPaused) << d.Describe(0.01);  // never needed
    probes += !d.backed_off();
  }
  EXPECT_GT(probes, 0);  // it tried to give side work more again
  const int fewer = trace.steps_at_level[static_cast<int>(SideLevel::kFewer)];
  EXPECT_GT(fewer, 3 * (trace.steps_at_level[static_cast<int>(SideLevel::kFull)] +
                        trace.steps_at_level[static_cast<int>(SideLevel::kShorter)]));
}

TEST(OverheadGuardTest, ABudgetAboveTheCostKeepsEverything) {
  OverheadGuardOptions loose;
  loose.budget = 0.2;
  OverheadGuard guard(loose);
  const Trace trace = Simulate(guard, 800, {0.10, 0.10, 0.10, 0.10, 0}, 0.01);
  EXPECT_TRUE(trace.decisions.empty());
  EXPECT_NEAR(guard.RunOverhead().mean, 0.10, 0.01);
}

OverheadGuardOptions Strict() {
  OverheadGuardOptions strict;
  strict.strict = true;
  return strict;
}

TEST(OverheadGuardTest, StrictKeepsOnlyWhatItShowsWithinTheBudget) {
  // 0.5% a step, under 2% noise: "on" sees no harm and keeps full offers; "strict" cannot show
  // the cost within 1% from a few pairs and backs off.
  const std::vector<double> cost = {0.005, 0.005, 0.005, 0.005, 0};
  OverheadGuard on({});
  EXPECT_TRUE(Simulate(on, 800, cost, 0.02).decisions.empty());
  OverheadGuard strict(Strict());
  const Trace trace = Simulate(strict, 800, cost, 0.02);
  ASSERT_FALSE(trace.decisions.empty());
  const GuardDecision& first = trace.decisions.front();
  EXPECT_TRUE(first.backed_off());
  EXPECT_LE(first.overhead.lo, 0.01);  // no harm shown...
  EXPECT_GT(first.overhead.hi, 0.01);  // ...and none ruled out
  EXPECT_EQ(first.overhead.n, 3);      // after the level's min_pairs, not before
  EXPECT_NE(first.Describe(0.01).find("not shown within the budget of 1.0% (strict): backing "
                                      "off to shorter bubbles"),
            std::string::npos)
      << first.Describe(0.01);
  // On a quiet host (0.1% noise) a 0.3% cost is shown within the budget: kept by strict too.
  OverheadGuard quiet(Strict());
  EXPECT_TRUE(Simulate(quiet, 800, {0.003, 0.003, 0.003, 0.003, 0}, 0.001).decisions.empty());
  EXPECT_LE(quiet.LevelOverhead().hi, 0.01);
}

TEST(OverheadGuardTest, StrictOnANoisyHostEndsPausedAndItsNoiseSaysWhy) {
  // Steps vary by ±30% (two busy processes beside a 2-core run) and side work costs nothing:
  // nothing can be shown within 1%, so strict pauses, and the plain-against-plain pairs it
  // measures there are wider than the budget: the reason, not a cost.
  OverheadGuard strict(Strict());
  const Trace trace = Simulate(strict, 800, {0, 0, 0, 0, 0}, 0.30);
  EXPECT_EQ(strict.level(), SideLevel::kPaused);
  int harvesting_levels = 0;
  for (int level = 0; level < kNumSideLevels - 1; ++level) {
    harvesting_levels += trace.steps_at_level[level];
  }
  EXPECT_GT(trace.steps_at_level[static_cast<int>(SideLevel::kPaused)], 3 * harvesting_levels);
  const Estimate noise = strict.LevelOverhead();
  ASSERT_TRUE(noise.known());
  EXPECT_TRUE(noise.covers(0.0));
  EXPECT_GT(noise.hi, 0.01);
}

}  // namespace
}  // namespace freeride
