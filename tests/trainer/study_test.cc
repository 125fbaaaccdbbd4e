// The harvest study on one emulated stage: every arm runs its blocks (the A/A arm included),
// side-task arms harvest and training alone does not, a task that runs out of work restarts
// (repeat) or its arm is refused, a target adds rounds or says why it was not reached, and the
// table and JSON carry the intervals and the machine's state. On simulated time (compute takes
// its FLOP model's time, a spin step its step_ms): which arms harvest, and whether a step fits
// a bubble, do not depend on the machine's load.
#include "trainer/study/study.h"

#include <filesystem>

#include "core/clock.h"
#include "core/files.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

SideTaskConfig Spin(const std::string& name, double step_ms, int64_t steps = 0) {
  SideTaskConfig spin;
  spin.type = "spin";
  spin.name = name;
  spin.args["step_ms"] = step_ms;
  if (steps > 0) spin.args["steps"] = steps;
  return spin;
}

// The JSON value after `"key": ` following the arm named `arm`.
std::string ArmField(const std::string& json, const std::string& arm, const std::string& key) {
  const size_t at = json.find("\"arm\": \"" + arm + "\"");
  if (at == std::string::npos) return "<no arm " + arm + ">";
  const size_t k = json.find("\"" + key + "\": ", at);
  const size_t start = k + key.size() + 4;
  return json.substr(
      start, json.find_first_of(",}", json[start] == '[' ? json.find(']', start) : start) - start);
}

TEST(StudyTest, ComparesEveryArmWithIntervalsInOneRun) {
  Config config = testing::EmulatedHarvestConfig("study_run");
  SideTaskConfig image;
  image.type = "image";
  // Tiny images: an image step keeps no simulated time, so it is taken to last 10 µs; the
  // real work stays small (8×8).
  image.args["width"] = int64_t{8};
  image.args["height"] = int64_t{8};
  image.args["out_width"] = int64_t{4};
  image.args["out_height"] = int64_t{4};
  image.args["blur_radius"] = int64_t{1};
  // Runs out of work after 3 spins: the study's default repeat keeps it going.
  config.side_tasks = {Spin("spin", 0.1, 3), image};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 2;
  PrepareStudyConfig(config, options);
  // Arms: training alone, A/A, spin, image, all. Warm-up 2 + 3 task blocks; then a plain block
  // and per round 4 arms each followed by a plain block.
  EXPECT_EQ(config.train.steps, 2 + 3 * 2 + (1 + 2 * 4 * 2) * 2);
  ASSERT_TRUE(config.side_tasks[0].repeat.has_value());
  EXPECT_TRUE(*config.side_tasks[0].repeat);
  SimulatedClock clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto table = RunStudy(**trainer, config, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*trainer)->step(), config.train.steps);
  EXPECT_NE(table->find("| training alone | 18 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| A/A: training alone | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + spin | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + all | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("Noise floor (A/A: training alone measured as an arm): ±"),
            std::string::npos)
      << *table;
  EXPECT_NE(table->find("Machine: "), std::string::npos) << *table;
  EXPECT_NE(table->find("load average"), std::string::npos) << *table;
  EXPECT_EQ(table->find("refused"), std::string::npos) << *table;
  auto json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  // Training alone and A/A harvest nothing; the task arms do, with intervals.
  EXPECT_EQ(ArmField(*json, "training alone", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "A/A: training alone", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "training alone", "overhead_ci"), "null");
  for (const std::string arm : {"A/A: training alone", "+ spin", "+ image", "+ all"}) {
    EXPECT_EQ(ArmField(*json, arm, "overhead_ci").front(), '[') << arm << "\n" << *json;
    EXPECT_EQ(ArmField(*json, arm, "refused"), "null") << arm;
  }
  EXPECT_NE(ArmField(*json, "+ spin", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "+ spin", "utilisation_ci").front(), '[');
  EXPECT_NE(json->find("\"noise_floor\": 0."), std::string::npos) << *json;
  EXPECT_NE(json->find("\"rank_cpus\": [\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"target\": null"), std::string::npos) << *json;
  // The spin task restarted rather than finishing.
  const HarvestReport report = (*trainer)->side_tasks()->Report();
  EXPECT_GT(report.tasks[0].restarts, 0);
  EXPECT_EQ(report.tasks[0].state, "LOADED");
}

TEST(StudyTest, RefusesAnArmWhoseTaskRanOutOfWork) {
  Config config = testing::EmulatedHarvestConfig("study_refused");
  config.side_tasks = {Spin("short", 0.1, 2), Spin("long", 0.1)};
  config.side_tasks[0].repeat = false;  // said explicitly: the study keeps it
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 1;
  PrepareStudyConfig(config, options);
  EXPECT_FALSE(*config.side_tasks[0].repeat);
  SimulatedClock clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto table = RunStudy(**trainer, config, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(table->find("| + short | 2 | "), std::string::npos) << *table;
  EXPECT_NE(table->find("- + short: task 'short' did no work in the arm's block 1 ('short' now "
                        "FINISHED)"),
            std::string::npos)
      << *table;
  EXPECT_EQ(table->find("- + long:"), std::string::npos) << *table;
  // "+ all" is measured: its tasks together worked (a task may lose every bubble to another).
  EXPECT_EQ(table->find("- + all:"), std::string::npos) << *table;
}

TEST(StudyTest, ATargetAddsRoundsOrSaysWhyItWasNotReached) {
  Config config = testing::EmulatedHarvestConfig("study_target");
  config.side_tasks = {Spin("spin", 0.1)};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 1;
  options.target_ci = 1e-9;  // unreachable
  options.max_rounds = 3;
  PrepareStudyConfig(config, options);
  // Arms: alone, A/A, spin. Warm-up 2 + 1 block, then 1 + 3 rounds × 2 arms × 2 blocks.
  EXPECT_EQ(config.train.steps, 2 + 1 + 1 + 3 * 2 * 2);
  // Compute 5% either way: blocks vary, so intervals have a width to shrink.
  SimulatedClock clock(1000, 0.05);
  auto trainer = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto table = RunStudy(**trainer, config, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*trainer)->step(), config.train.steps);  // every round it could
  EXPECT_NE(table->find("Target ±0.00% NOT reached in 3 rounds (--max_rounds 3): the widest "
                        "interval is '"),
            std::string::npos)
      << *table;
  EXPECT_NE(table->find("rounds would reach it."), std::string::npos) << *table;

  Config easy = testing::EmulatedHarvestConfig("study_target_easy");
  easy.side_tasks = {Spin("spin", 0.1)};
  options.target_ci = 10.0;  // ±1000%: met by the first evaluation
  PrepareStudyConfig(easy, options);
  SimulatedClock second_clock(1000, 0.05);
  auto second = Trainer::Create(easy, nullptr, &second_clock);
  ASSERT_TRUE(second.ok()) << second.status();
  table = RunStudy(**second, easy, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(table->find("Target ±1000.00%: every overhead interval is within it after 2 rounds."),
            std::string::npos)
      << *table;
  EXPECT_EQ((*second)->step(), 2 + 1 + 1 + 2 * 2 * 2);  // stopped early
  auto json = ReadFile(easy.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"target\": {\"ci\": 10.000000, \"max_rounds\": 3, \"reached\": true}"),
            std::string::npos)
      << *json;
}

TEST(StudyTest, NeedsSideTasks) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 1, 1, 4);
  auto trainer = Trainer::Create(config);
  ASSERT_TRUE(trainer.ok());
  auto table = RunStudy(**trainer, config, StudyOptions{});
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("set freeride.enabled = true"), std::string::npos);
}

}  // namespace
}  // namespace freeride
