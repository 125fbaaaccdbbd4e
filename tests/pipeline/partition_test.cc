// The balanced partition on a head-heavy pipeline: stage 0 (emulated peers, its stage run for
// real) waits at least half as long per step as with the even split of blocks. On simulated
// time (the FLOP model's costs), so the comparison holds under any load.
#include <cblas.h>
#include <omp.h>

#include "core/clock.h"
#include "tests/pipeline/train_parity.h"

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
