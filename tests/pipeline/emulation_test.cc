// Emulated peers on the CPU backend: one stage runs for real, the others are timed by the
// simulator. On simulated time (each compute instruction takes its FLOP model's time), the real
// stage's measured bubbles must be the simulator's for the same costs (the real stage's own
// taken from its measurement): exactly, whatever the machine's load. How close they come on
// real time is measured by build/bench/emulation_bench (bench/RESULTS.md). The peers' synthetic
// messages come in the real stage's message type.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/clock.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "pipeline/stage_executor.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using pipeline::Op;

// Per step, over 7 steps after a warm-up: the real stage's time in BUBBLE windows (from the
// BUBBLE to the end of the first wait it precedes), its time waiting in total, and the simulator's
// bubble for that step's measured costs.
struct Bubbles {
  std::vector<double> windows, waits, simulated;
};

Bubbles Measure(const std::string& schedule, int real_stage) {
  Config config = testing::ParityConfig(testing::ParityShard(), schedule, 2, 1, 4);
  // A head-heavy model: the last stage carries a 32768-token softmax, so the real stage has
  // long bubbles to wait in.
  config.model.vocab_size = 32768;
  config.model.n_layer = schedule == "interleaved" ? 4 : 2;  // 2 stages × 2 chunks need 4
  config.model.n_embd = 128;
  config.train.seq_len = 8;
  config.runtime.emulate_peers = true;
  config.runtime.emulated_stage = real_stage;
  SimulatedClock clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  Trainer& t = **trainer;
  Bubbles b;
  for (int step = 0; step < 8; ++step) {
    auto s = t.Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (step == 0) continue;  // warm-up
    b.waits.push_back(s->bubble_s[real_stage] * 1e3);
    double measured = 0;
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
    cost.stages[real_stage] = {mean(Op::kForward),
                               split ? mean(Op::kBackwardInput) : mean(Op::kBackward),
                               split ? mean(Op::kBackwardWeight) : 0.0};
    // With chunks, each of the real stage's chunks by its own measured means.
    for (int c = 0; c < t.num_chunks() && !cost.chunks.empty(); ++c) {
      std::map<Op, double> chunk_sum;
      std::map<Op, int> chunk_count;
      for (const auto& timing : timeline) {
        const auto& in = instrs[timing.index];
        if (in.chunk != c) continue;
        chunk_sum[in.op] += (timing.end_s - timing.start_s) * 1e3;
        ++chunk_count[in.op];
      }
      auto chunk_mean = [&](Op op) { return chunk_count[op] ? chunk_sum[op] / chunk_count[op] : 0.0; };
      cost.chunks[c * t.schedule().stages + real_stage] = {
          chunk_mean(Op::kForward),
          split ? chunk_mean(Op::kBackwardInput) : chunk_mean(Op::kBackward),
          split ? chunk_mean(Op::kBackwardWeight) : 0.0};
    }
    auto sim = pipeline::Simulate(t.schedule(), cost);
    EXPECT_TRUE(sim.ok()) << sim.status();
    b.windows.push_back(measured);
    b.simulated.push_back(sim.ok() ? sim->stages[real_stage].bubble : 0.0);
  }
  return b;
}

TEST(EmulatedPeersTest, RealStageSeesTheSimulatedBubbles) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  for (const std::string schedule : {"1f1b", "gpipe", "zbh1", "interleaved"}) {
    SCOPED_TRACE(schedule);
    const Bubbles b = Measure(schedule, /*real_stage=*/0);
    ASSERT_EQ(b.simulated.size(), 7u);
    for (size_t i = 0; i < b.simulated.size(); ++i) {
      ASSERT_GT(b.simulated[i], 0);
      EXPECT_NEAR(b.waits[i], b.simulated[i], 1e-6 * b.simulated[i]) << "step " << i + 1;
      // After the first step the BUBBLEs sit where the real stage waits: the windows hold it
      // all.
      EXPECT_NEAR(b.windows[i], b.simulated[i], 1e-6 * b.simulated[i]) << "step " << i + 1;
    }
  }
}

// ZB-H2 over 4 stages, one real, the others emulated, on simulated time: the real stage's
// steps take the simulator's step for the same costs, and post-validated that is the steady
// period of overlapping steps, shorter than the barrier's.
TEST(EmulatedPeersTest, PostValidatedStepsComeAtTheSimulatedPeriod) {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
  for (int real : {0, 3}) {
    std::map<std::string, double> measured, simulated;
    for (const std::string sync : {"barrier", "post_validate"}) {
      SCOPED_TRACE(absl::StrFormat("stage %d real, %s", real, sync));
      Config config = testing::ParityConfig(testing::ParityShard(), "zbh2", 4, 1, 8);
      config.runtime.emulate_peers = true;
      config.runtime.emulated_stage = real;
      config.optim.step_sync = sync;
      config.train.steps = 6;
      SimulatedClock clock;
      auto trainer = Trainer::Create(config, nullptr, &clock);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      for (int step = 1; step <= 6; ++step) {
        auto s = (*trainer)->Step();
        ASSERT_TRUE(s.ok()) << s.status();
        if (step >= 3 && step <= 5) measured[sync] += s->step_s * 1e3 / 3;  // ran ahead
      }
      auto sim = pipeline::Simulate((*trainer)->schedule(), (*trainer)->emulation_cost());
      ASSERT_TRUE(sim.ok()) << sim.status();
      simulated[sync] = sim->step_time;
      EXPECT_NEAR(measured[sync], simulated[sync], 1e-6 * simulated[sync]);
    }
    EXPECT_LT(simulated["post_validate"], 0.95 * simulated["barrier"]) << "stage " << real;
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

// The emulated peers' synthetic messages come in the real stage's message type: bf16 values
// of the same scale (uniform in ±0.5) filling the whole buffer, not fp32 bit patterns.
TEST(EmulatedPeersTest, SyntheticMessagesHaveTheRealStagesType) {
  pipeline::ScheduleOptions options;
  options.stages = 2;
  options.microbatches = 2;
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(options);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const int64_t n = 1000;
  for (MessageType type : {MessageType::kFp32, MessageType::kBf16}) {
    SCOPED_TRACE(MessageTypeName(type));
    SimulatedClock clock;
    auto transport = pipeline::MakeEmulatedPeersTransport(*schedule, pipeline::CostModel::Uniform(),
                                                          0, type, &clock);
    ASSERT_TRUE(transport.ok()) << transport.status();
    (*transport)->OnStepStart(clock.Now());
    MessageBuffer message = AllocateHostMessage(n * MessageTypeBytes(type));
    const int tag = pipeline::StageExecutor::MessageTag(true, 1, 0, 2, 2);  // stage 1's gradient
    auto r = (*transport)->Irecv(message.get(), n * MessageTypeBytes(type), 1, tag);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*transport)->Wait(*r, 1e6).ok());
    std::vector<float> values(n);
    FromMessage(type, message.get(), n, values.data());
    double sum_abs = 0;
    for (float v : values) {
      ASSERT_LE(std::fabs(v), 0.5f);
      sum_abs += std::fabs(v);
    }
    EXPECT_GT(sum_abs / n, 0.2);  // uniform in ±0.5: mean |v| = 0.25, to the last element
  }
}

}  // namespace
}  // namespace freeride
