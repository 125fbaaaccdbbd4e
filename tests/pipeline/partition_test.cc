// The balanced partition on a head-heavy pipeline: stage 0 (emulated peers, its stage run for
// real) waits at least half as long per step as with the even split of blocks. On simulated
// time (the FLOP model's costs), so the comparison holds under any load.
#include <cblas.h>
#include <omp.h>

#include "core/clock.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/pipeline_plan.h"

namespace freeride {
namespace {

// Mean time stage 0 waited per step, the first steps (warm-up, bubble placement) left out.
double StageZeroIdlePerStep(const std::string& partition) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 2, 1, 4);
  // A head of about five blocks (2·C·V against 24·C² per block), as in GPT-2 124M's.
  config.model.n_embd = 128;
  config.model.n_head = 4;
  config.model.vocab_size = 8192;
  config.runtime.emulate_peers = true;
  config.parallel.partition = partition;
  config.run.dir = (std::filesystem::path(::testing::TempDir()) / ("part_" + partition)).string();
  SimulatedClock clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return 0;
  double idle = 0;
  constexpr int kSteps = 6, kSkip = 2;
  for (int i = 0; i < kSteps; ++i) {
    auto stats = (*trainer)->Step();
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok()) return 0;
    if (i >= kSkip) idle += stats->bubble_s[0];
  }
  return idle / (kSteps - kSkip);
}

TEST(PartitionTest, BalancedHalvesStageZerosIdleTimeOnAHeadHeavyPipeline) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  const double even = StageZeroIdlePerStep("even");
  const double balanced = StageZeroIdlePerStep("balanced");
  RecordProperty("even_idle_s", std::to_string(even));
  RecordProperty("balanced_idle_s", std::to_string(balanced));
  EXPECT_GT(even, 0);
  EXPECT_LE(balanced, 0.5 * even) << "even " << even << " s, balanced " << balanced << " s";
}

}  // namespace
}  // namespace freeride

namespace freeride {
namespace {

Config DemoConfig(int64_t layers, int64_t vocab, const std::string& partition) {
  // The README's 2-stage demo (configs/tiny_cpu_pp2.toml): 4 blocks of width 128, T = 64.
  Config config = testing::ParityConfig("unused.bin", "1f1b", 2, 1, 4);
  config.model.n_layer = layers;
  config.model.n_embd = 128;
  config.model.n_head = 4;
  config.model.max_seq_len = 64;
  config.model.vocab_size = vocab;
  config.train.seq_len = 64;
  config.parallel.partition = partition;
  return config;
}

absl::StatusOr<PipelinePlan> Plan(const Config& config) {
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(config);
  if (!model.ok()) return model.status();
  return PlanPipeline(config, *model);
}

TEST(ImbalanceTest, AHeadOfThirtyBlocksOnTwoStagesIsReportedWithTheNumbers) {
  absl::StatusOr<PipelinePlan> plan = Plan(DemoConfig(4, 50257, "balanced"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Closed form: a block 3·(24·C² + 4·T·C), the head 3·2·C·V (V padded to 50304), the
  // embedding 3·2·C: head = 12877824 / 425984 = 30.23 blocks, embedding 0.0006.
  const double head = 2.0 * 128 * 50304 / (24.0 * 128 * 128 + 4.0 * 64 * 128);
  const double stage1 = 1 + head, stage0 = 3 + 256.0 / 425984;
  const std::string& w = plan->imbalance;
  EXPECT_NE(w.find(absl::StrFormat("stage 0: 3 blocks + embedding 0.00 = %.2f", stage0)),
            std::string::npos)
      << w;
  EXPECT_NE(w.find(absl::StrFormat("stage 1: 1 block + head %.2f = %.2f", head, stage1)),
            std::string::npos)
      << w;
  EXPECT_NE(w.find(absl::StrFormat("stage 0 idles about %.0f%%", 100 * (1 - stage0 / stage1))),
            std::string::npos)
      << w;
  EXPECT_NE(w.find(absl::StrFormat("%.0f%% of the pipeline's compute time is idle",
                                   100 * (1 - (stage0 + stage1) / (2 * stage1)))),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("no split of whole blocks does better"), std::string::npos) << w;
  EXPECT_NE(w.find("parallel.pp"), std::string::npos) << w;
}

TEST(ImbalanceTest, ASplitByHandThatBalancingWouldFixNamesTheBestSplit) {
  // 8 blocks and a small head: 1 + 7 by hand costs 1 against 7 (43% idle); 4 + 4 is the best.
  Config config = DemoConfig(8, 64, "balanced");
  config.parallel.layers_per_stage = {1, 7};
  absl::StatusOr<PipelinePlan> plan = Plan(config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string& w = plan->imbalance;
  EXPECT_NE(w.find("stage 0: 1 block + embedding"), std::string::npos) << w;
  EXPECT_NE(w.find("the best split possible is stage 0: 4 blocks + embedding"), std::string::npos)
      << w;
  EXPECT_NE(w.find("stage 1: 4 blocks + head"), std::string::npos) << w;
}

TEST(ImbalanceTest, BalancedStagesSayNothing) {
  absl::StatusOr<PipelinePlan> plan = Plan(DemoConfig(8, 64, "balanced"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->imbalance, "");
}

}  // namespace
}  // namespace freeride
