// Learning-rate schedules against their closed forms, and a resume whose train.steps differs
// from the checkpoint's: refused (status 2 on the command line) with the jump it would make,
// unless optim.reshape_schedule.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/optimizer.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

OptimConfig Schedule(const std::string& kind) {
  OptimConfig o;
  o.lr = 1.0;
  o.warmup_steps = 4;
  o.min_lr_ratio = 0.1;
  o.schedule = kind;
  return o;
}

TEST(LearningRateTest, LinearDecaysStraightToTheMinimumAtTheLastStep) {
  const OptimConfig o = Schedule("linear");
  // 13 steps: warm-up 0..3, then 1 − p with p = (step − 4) / 8.
  EXPECT_DOUBLE_EQ(LearningRate(o, 1, 13), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4, 13), 1.0);
  EXPECT_NEAR(LearningRate(o, 6, 13), 0.1 + 0.75 * 0.9, 1e-12);
  EXPECT_NEAR(LearningRate(o, 8, 13), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 12, 13), 0.1, 1e-12);
  for (int64_t s = 4; s < 12; ++s) {
    EXPECT_NEAR(LearningRate(o, s, 13) - LearningRate(o, s + 1, 13), 0.9 / 8, 1e-12) << s;
  }
}

TEST(LearningRateTest, WsdHoldsThePeakThenDecaysOverTheLastFraction) {
  OptimConfig o = Schedule("wsd");
  o.decay_fraction = 0.25;
  // 20 steps: warm-up 0..3, stable through step 15 (20 − 5), linear to 0.1 at step 19.
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 20), 0.25);
  for (int64_t s = 4; s <= 15; ++s) EXPECT_DOUBLE_EQ(LearningRate(o, s, 20), 1.0) << s;
  EXPECT_NEAR(LearningRate(o, 16, 20), 1.0 - 0.9 / 4, 1e-12);
  EXPECT_NEAR(LearningRate(o, 17, 20), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 19, 20), 0.1, 1e-12);
  // A decay longer than what follows the warm-up starts right after it.
  o.decay_fraction = 1.0;
  EXPECT_DOUBLE_EQ(LearningRate(o, 4, 20), 1.0);
  EXPECT_NEAR(LearningRate(o, 19, 20), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(o, 5, 20), 1.0 - 0.9 / 15, 1e-12);
  // No decay: the peak to the end.
  o.decay_fraction = 0.0;
  EXPECT_DOUBLE_EQ(LearningRate(o, 19, 20), 1.0);
}

TEST(LearningRateTest, CosineAndConstantKeepTheirShape) {
  OptimConfig o = Schedule("cosine");
  for (int64_t s = 4; s < 13; ++s) {
    const double p = (s - 4) / 8.0;
    EXPECT_NEAR(LearningRate(o, s, 13), 0.1 + 0.45 * (1 + std::cos(M_PI * p)), 1e-12) << s;
  }
  o.schedule = "constant";
  EXPECT_DOUBLE_EQ(LearningRate(o, 2, 13), 0.75);
  EXPECT_DOUBLE_EQ(LearningRate(o, 12, 13), 1.0);
}

TEST(LearningRateTest, ReshapingTheScheduleOnResumeIsRefusedWithTheJump) {
  OptimConfig o = Schedule("cosine");
  o.lr = 6e-3;
  o.warmup_steps = 0;
  // The user's report: another train.steps at step 108 moved the learning rate by 5×.
  absl::Status s = CheckScheduleOnResume(o, 108, 120, 400);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(IsUsageError(s));
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrFormat("%.3g at step 107 → %.3g at step 108",
                                        LearningRate(o, 107, 120), LearningRate(o, 108, 400))));
  EXPECT_THAT(s.message(), HasSubstr("optim.reshape_schedule=true"));
  EXPECT_TRUE(CheckScheduleOnResume(o, 108, 400, 400).ok());
  EXPECT_TRUE(CheckScheduleOnResume(o, 108, 0, 400).ok());    // not recorded (version 2)
  EXPECT_TRUE(CheckScheduleOnResume(o, 120, 400, 120).ok());  // nothing left to train
  o.reshape_schedule = true;
  EXPECT_TRUE(CheckScheduleOnResume(o, 108, 120, 400).ok());
  o.reshape_schedule = false;
  o.schedule = "constant";
  EXPECT_TRUE(CheckScheduleOnResume(o, 108, 120, 400).ok());
  // Inside the warm-up the next rate is the same: the refusal names the step where they part
  // (the first after the peak, which both reach at step 10).
  o.schedule = "cosine";
  o.warmup_steps = 10;
  s = CheckScheduleOnResume(o, 4, 8, 20);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrFormat(
                  "the same %.3g at step 4, but from step 11 %.3g instead of %.3g",
                  LearningRate(o, 4, 20), LearningRate(o, 11, 20), LearningRate(o, 11, 8))));
  // WSD's rate depends on the length only through where its decay starts.
  o.schedule = "wsd";
  o.warmup_steps = 0;
  o.decay_fraction = 0.1;
  EXPECT_FALSE(CheckScheduleOnResume(o, 50, 100, 200).ok());
  o.decay_fraction = 0.0;
  EXPECT_TRUE(CheckScheduleOnResume(o, 50, 100, 200).ok());
}

TEST(ScheduleResumeTest, AnotherTrainStepsIsRefusedUnlessReshapeIsAsked) {
  const std::string shard = WriteRandomShard("reshape.bin", 4000, 64, 21);
  const std::string dir = Temp("reshape");
  std::filesystem::remove_all(dir);
  {
    auto trainer =
        Trainer::Create(MustParse(TinyToml(shard, dir), {"train.steps=10", "checkpoint.every=4"}));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
  }
  const std::string at4 = "checkpoint.resume=\"" + dir + "/checkpoints/step_00000004\"";
  // Cosine from 1e-2 to 1e-3: 7.75e-3 at step 3 of 10, 9.05e-3 at step 4 of 20.
  auto refused = Trainer::Create(MustParse(TinyToml(shard, dir), {"train.steps=20", at4}));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(IsUsageError(refused.status()));
  EXPECT_THAT(refused.status().message(), HasSubstr("0.00775 at step 3 → 0.00905 at step 4"));
  EXPECT_THAT(refused.status().message(), HasSubstr("train.steps = 10"));

  auto same = Trainer::Create(MustParse(TinyToml(shard, dir), {"train.steps=10", at4}));
  ASSERT_TRUE(same.ok()) << same.status();

  const Config reshape =
      MustParse(TinyToml(shard, dir), {"train.steps=20", at4, "optim.reshape_schedule=true"});
  auto reshaped = Trainer::Create(reshape);
  ASSERT_TRUE(reshaped.ok()) << reshaped.status();
  const StepStats step = MustStep(**reshaped);
  EXPECT_EQ(step.step, 5);
  EXPECT_DOUBLE_EQ(step.lr, LearningRate(reshape.optim, 4, 20));
}

TEST(ScheduleResumeTest, TheCommandLineExitsTwoNamingTheWayOut) {
  const std::string shard = WriteRandomShard("reshape_cli.bin", 4000, 64, 22);
  const std::string dir = Temp("reshape_cli");
  std::filesystem::remove_all(dir);
  const std::string config = Temp("reshape_cli.toml");
  std::ofstream(config) << TinyToml(shard, dir);
  ASSERT_EQ(RunCommand({"train", "--config", config, "--set", "checkpoint.every=3"}).status, 0);
  const CliResult r = RunCommand({"train", "--config", config, "--set", "checkpoint.resume=latest",
                                  "--set", "train.steps=12"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("at step 5 →"));
  EXPECT_THAT(r.err, HasSubstr("--set optim.reshape_schedule=true"));
}

}  // namespace
}  // namespace freeride
