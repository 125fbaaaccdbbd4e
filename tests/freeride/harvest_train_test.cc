// Side tasks inside a real pipeline (2 stages as threads): losses bit-identical to the run
// without them, even with a task that fails mid-run; steps stay inside the bubbles.
#include <cblas.h>
#include <omp.h>

#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

TEST(HarvestTrainTest, SideTasksLeaveTheLossesBitIdentical) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  const std::string shard = testing::ParityShard();
  Config plain = testing::ParityConfig(shard, "1f1b", 2, 1, 4);
  const std::vector<double> expected = testing::ThreadedLosses(plain);
  Config harvested = plain;
  harvested.freeride.enabled = true;
  harvested.freeride.calibration_steps = 1;
  harvested.run.dir = (std::filesystem::path(::testing::TempDir()) / "harvest_run").string();
  SideTaskConfig spin;
  spin.type = "spin";
  spin.args["step_ms"] = 0.2;
  SideTaskConfig pagerank;
  pagerank.type = "pagerank";
  pagerank.args["scale"] = int64_t{10};
  pagerank.args["rows_per_step"] = int64_t{64};
  // Fails on its 4th step, which can only run inside a bubble (calibration runs one): so the
  // run did harvest, and training must not notice.
  SideTaskConfig throwing;
  throwing.type = "test_throwing";
  throwing.priority = 9;
  harvested.side_tasks = {spin, pagerank, throwing};
  EXPECT_EQ(testing::ThreadedLosses(harvested), expected);
}

TEST(HarvestTrainTest, ConfigErrorsStopBeforeTraining) {
  const std::string shard = testing::ParityShard();
  Config config = testing::ParityConfig(shard, "1f1b", 1, 1, 4);
  config.freeride.enabled = true;
  SideTaskConfig task;
  task.type = "spin";
  task.stages = {3};
  config.side_tasks = {task};
  auto t = Trainer::Create(config);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("side_tasks[0].stages: stage 3, but parallel.pp = 1"),
            std::string::npos)
      << t.status().message();
  task.stages = {};
  task.memory_limit_bytes = int64_t{1} << 50;
  config.side_tasks = {task};
  t = Trainer::Create(config);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is more than this stage has free"), std::string::npos);
  task.memory_limit_bytes = 0;
  task.type = "no_such_task";
  config.side_tasks = {task};
  t = Trainer::Create(config);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("unknown side task type 'no_such_task'"), std::string::npos);
}

}  // namespace
}  // namespace freeride
