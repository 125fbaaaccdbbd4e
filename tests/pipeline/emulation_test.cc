// Emulated peers on the CPU backend: one stage runs for real, the others are timed by the
// simulator from measured costs. The real stage's measured bubbles must be the simulator's
// for the same costs (the real stage's own costs taken from its measurement), within 5%.
#include <cblas.h>
#include <omp.h>

#include "pipeline/simulator.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using pipeline::Op;

// Over 5 steps after a warm-up: the real stage's time in BUBBLE windows (from the BUBBLE to
// the end of the wait it precedes), its time waiting in total, and the simulator's bubble.
struct Bubbles {
  double windows = 0, waits = 0, simulated = 0;
};

Bubbles Measure(const std::string& schedule, int real_stage) {
  Config config = testing::ParityConfig(testing::ParityShard(), schedule, 2, 1, 4);
  // A head-heavy model: the last stage carries a 32768-token softmax (milliseconds per
  // micro-batch, so the bubbles are long against timer and scheduling noise).
  config.model.vocab_size = 32768;
  config.model.n_layer = schedule == "interleaved" ? 4 : 2;  // 2 stages × 2 chunks need 4
  config.model.n_embd = 128;
  config.train.seq_len = 8;
  config.runtime.emulate_peers = true;
  config.runtime.emulated_stage = real_stage;
  auto trainer = Trainer::Create(config);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  Trainer& t = **trainer;
  double measured = 0, simulated_total = 0, waited = 0;
  for (int step = 0; step < 6; ++step) {
    auto s = t.Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (step == 0) continue;  // warm-up
    waited += s->bubble_s[real_stage] * 1e3;
    const auto& instrs = t.schedule().per_stage[real_stage];
    const auto& timeline = t.last_timeline();
    // The real stage's costs this step, and its bubble windows.
    std::map<Op, double> sum;
    std::map<Op, int> count;
    for (size_t i = 0; i < timeline.size(); ++i) {
      const Op op = instrs[timeline[i].index].op;
      sum[op] += (timeline[i].end_s - timeline[i].start_s) * 1e3;
      ++count[op];
      if (op == Op::kBubble && i + 1 < timeline.size()) {
        const auto& next = timeline[i + 1];
        measured += ((next.wait_end_s > 0 ? next.wait_end_s : next.end_s) - timeline[i].start_s) * 1e3;
      }
    }
    auto mean = [&](Op op) { return count[op] ? sum[op] / count[op] : 0.0; };
    pipeline::CostModel cost = t.emulation_cost();
    const bool split = count[Op::kBackwardInput] > 0;
    // The cost model's unit is the stage: all its chunks.
    const double chunks = t.num_chunks();
    cost.stages[real_stage] = {chunks * mean(Op::kForward),
                               chunks * (split ? mean(Op::kBackwardInput) : mean(Op::kBackward)),
                               chunks * (split ? mean(Op::kBackwardWeight) : 0.0)};
    auto sim = pipeline::Simulate(t.schedule(), cost);
    EXPECT_TRUE(sim.ok()) << sim.status();
    if (sim.ok()) simulated_total += sim->stages[real_stage].bubble;
  }
  return {measured, waited, simulated_total};
}

TEST(EmulatedPeersTest, RealStageSeesTheSimulatedBubbles) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  for (const std::string schedule : {"1f1b", "gpipe", "zbh1", "interleaved"}) {
    SCOPED_TRACE(schedule);
    const Bubbles b = Measure(schedule, /*real_stage=*/0);
    ASSERT_GT(b.simulated, 0);
    EXPECT_NEAR(b.waits, b.simulated, 0.05 * b.simulated);
    // After the first step the BUBBLEs sit where the real stage waits: the windows hold it all.
    EXPECT_NEAR(b.windows, b.simulated, 0.05 * b.simulated);
  }
}

TEST(EmulatedPeersTest, RefusesWhatItCannotEmulate) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 2, 2, 4);
  config.runtime.emulate_peers = true;
  auto trainer = Trainer::Create(config);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("needs parallel.dp = 1 (is 2)"), std::string::npos)
      << trainer.status();
  auto world = pipeline::MakeInProcessWorld(2);
  config.parallel.dp = 1;
  trainer = Trainer::Create(config, world[0].get());
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("launch it without mpirun"), std::string::npos);
}

}  // namespace
}  // namespace freeride
