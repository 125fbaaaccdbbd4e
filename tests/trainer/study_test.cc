// The harvest study on one emulated stage: every arm runs its blocks, side-task arms harvest,
// training alone does not, and the table and JSON are written.
#include "trainer/study.h"

#include <filesystem>

#include "core/files.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

TEST(StudyTest, ComparesEveryArmInOneRun) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 2, 1, 4);
  config.model.vocab_size = 8192;  // a heavier last stage: real bubbles on stage 0
  config.runtime.emulate_peers = true;
  config.freeride.enabled = true;
  config.freeride.calibration_steps = 1;
  config.run.dir = (std::filesystem::path(::testing::TempDir()) / "study_run").string();
  SideTaskConfig spin;
  spin.type = "spin";
  spin.args["step_ms"] = 0.1;
  SideTaskConfig image;
  image.type = "image";
  image.args["width"] = int64_t{32};
  image.args["height"] = int64_t{32};
  image.args["out_width"] = int64_t{16};
  image.args["out_height"] = int64_t{16};
  config.side_tasks = {spin, image};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 2;
  config.train.steps = StudySteps(config, options);
  EXPECT_EQ(config.train.steps, 2 + (2 * 3 * 2 + 1) * 2);  // arms: spin, image, all
  auto trainer = Trainer::Create(config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto table = RunStudy(**trainer, config, options);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*trainer)->step(), config.train.steps);
  EXPECT_NE(table->find("| training alone | 14 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + spin | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + all | 4 |"), std::string::npos) << *table;
  auto json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  // Training alone harvests nothing; the spin arm does.
  EXPECT_NE(json->find("\"arm\": \"training alone\", \"steps\": 14"), std::string::npos) << *json;
  const size_t alone = json->find("\"arm\": \"training alone\"");
  const size_t harvested = json->find("\"harvested_s\": ", alone);
  EXPECT_EQ(json->substr(harvested, 24), "\"harvested_s\": 0.000000,");
  const size_t spin_arm = json->find("\"arm\": \"+ spin\"");
  const size_t spin_harvest = json->find("\"harvested_s\": ", spin_arm);
  EXPECT_NE(json->substr(spin_harvest, 24), "\"harvested_s\": 0.000000,");
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
