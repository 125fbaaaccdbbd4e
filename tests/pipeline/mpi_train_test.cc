// Pipeline training across processes (run by ctest under `mpirun -n 4 --oversubscribe`): every
// 4-rank layout reproduces the single-process trainer, which each rank also runs alone; a
// post-validated run reproduces the barrier's, and the data-parallel sum in buckets the one
// sum's.
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <tuple>

#include "pipeline/comm/transport.h"
#include "tests/pipeline/train_parity.h"
#include "tests/trainer/step_exchange_check.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;

std::vector<double> MpiLosses(const Config& config, pipeline::Transport* transport) {
  auto trainer = Trainer::Create(config, transport);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  std::vector<double> losses;
  if (!trainer.ok()) return losses;
  for (int i = 0; i < 5; ++i) {
    auto s = (*trainer)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) break;
    losses.push_back(s->loss);
  }
  return losses;
}

class MpiTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4) GTEST_SKIP() << "needs 4 ranks (ctest runs it under mpirun -n 4)";
    transport_ = pipeline::MakeMpiTransport();
  }
  std::unique_ptr<pipeline::Transport> transport_;
};

// The step's exchange (trainer/step_exchange.h) over MPI: each rank's fields, by name.
TEST_F(MpiTrainTest, TheStepExchangeRoundTripsOverMpi) {
  testing::ExpectStepExchangeRoundTrip(*transport_);
}

TEST_F(MpiTrainTest, FourStagesMatchOneProcessBitForBit) {
  const std::string shard = ParityShard();
  for (int m : {4, 8}) {
    const std::vector<double> expected = SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, m));
    for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zbh1"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=4 m=%d", schedule, m));
      EXPECT_EQ(MpiLosses(ParityConfig(shard, schedule, 4, 1, m), transport_.get()), expected);
    }
  }
}

TEST_F(MpiTrainTest, DataParallelWithinOneMillionth) {
  const std::string shard = ParityShard();
  const std::vector<double> expected = SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, 4, 8));
  for (auto [pp, dp] : {std::pair{2, 2}, std::pair{1, 4}}) {
    SCOPED_TRACE(absl::StrFormat("pp=%d dp=%d", pp, dp));
    const int m = 4 / dp;
    const std::vector<double> got =
        MpiLosses(ParityConfig(shard, "zbh1", pp, dp, m, 8 / dp), transport_.get());
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6 * expected[i]);
  }
}

// The Llama family across processes: 4 stages under three schedule kinds reproduce one process
// bit for bit, tied (the tied sum between ranks 0 and 3) and untied; pp 2 × dp 2 within 1e-6.
TEST_F(MpiTrainTest, LlamaMatchesOneProcess) {
  const std::string shard = ParityShard();
  for (bool tied : {true, false}) {
    const std::vector<double> expected =
        SingleProcessLosses(testing::LlamaParityConfig(shard, "1f1b", 1, 1, 4, tied));
    for (const std::string schedule : {"1f1b", "interleaved", "zbh1"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=4 %s", schedule, tied ? "tied" : "untied"));
      EXPECT_EQ(
          MpiLosses(testing::LlamaParityConfig(shard, schedule, 4, 1, 4, tied), transport_.get()),
          expected);
    }
    SCOPED_TRACE(absl::StrFormat("pp=2 dp=2 %s", tied ? "tied" : "untied"));
    const std::vector<double> got =
        MpiLosses(testing::LlamaParityConfig(shard, "zbh1", 2, 2, 2, tied, 4), transport_.get());
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6 * expected[i]);
  }
}

// Five steps' losses, then this rank's parameters and AdamW moments, as bit patterns. A
// transport of its own: it builds its groups' communicators afresh, as a run does.
std::vector<uint64_t> MpiRunBits(const Config& config) {
  std::vector<uint64_t> bits;
  std::unique_ptr<pipeline::Transport> transport = pipeline::MakeMpiTransport();
  auto trainer = Trainer::Create(config, transport.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return bits;
  // Buckets where asked for, each checked against the gradients it started with.
  EXPECT_EQ((*trainer)->executor().buckets() != nullptr, config.parallel.dp_bucket_mb > 0);
  (*trainer)->executor().set_verify_buckets(true);
  for (int i = 0; i < 5; ++i) {
    auto s = (*trainer)->Step();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return bits;
    bits.push_back(std::bit_cast<uint64_t>(s->loss));
  }
  for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
    StageModel& chunk = (*trainer)->model(c);
    std::vector<float> p(chunk.num_params()), m(p.size()), v(p.size());
    EXPECT_TRUE(chunk.GetParams(p.data()).ok());
    EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
    for (const auto* part : {&p, &m, &v}) {
      for (float x : *part) bits.push_back(std::bit_cast<uint32_t>(x));
    }
  }
  return bits;
}

// Steps 2 to 4 run the next step ahead; a clip among their norms rolls some of them back.
TEST_F(MpiTrainTest, PostValidatedStepsMatchTheBarrierBitForBit) {
  const std::string shard = ParityShard();
  // Interleaved: the head stage's other chunk still sends gradients after the tied sum starts.
  for (auto [schedule, pp, dp] :
       {std::tuple{"zbh2", 4, 1}, std::tuple{"zbv", 4, 1}, std::tuple{"interleaved", 4, 1},
        std::tuple{"zbh1", 2, 2}, std::tuple{"dualpipev", 2, 2}, std::tuple{"interleaved", 2, 2}}) {
    SCOPED_TRACE(absl::StrFormat("%s pp=%d dp=%d", schedule, pp, dp));
    Config config = ParityConfig(shard, schedule, pp, dp, 8);
    config.parallel.partition = "even";  // the same split in both runs
    config.optim.grad_clip = dp == 1 ? 0.55 : 0.36;
    const std::vector<uint64_t> barrier = MpiRunBits(config);
    config.optim.step_sync = "post_validate";
    EXPECT_TRUE(MpiRunBits(config) == barrier);
  }
}

// The data-parallel sum in buckets (MPI_Iallreduce, started inside the last backward) against
// one sum per chunk: pp 2 × dp 2, both step ends, many small buckets (tensors split) and a few.
TEST_F(MpiTrainTest, DataParallelBucketsMatchOneSumBitForBit) {
  const std::string shard = ParityShard();
  for (auto [schedule, sync] :
       {std::tuple{"1f1b", "barrier"}, std::tuple{"zbh1", "post_validate"},
        std::tuple{"interleaved", "barrier"}, std::tuple{"zbv", "post_validate"}}) {
    Config config = ParityConfig(shard, schedule, 2, 2, 8);
    config.parallel.partition = "even";
    config.optim.grad_clip = 0.36;
    config.optim.step_sync = sync;
    const std::vector<uint64_t> whole = MpiRunBits(config);
    for (double floats : {64.0, 1000.0}) {
      SCOPED_TRACE(
          absl::StrFormat("%s %s pp=2 dp=2, buckets of %g floats", schedule, sync, floats));
      config.parallel.dp_bucket_mb = floats * 4 / (1 << 20);
      EXPECT_TRUE(MpiRunBits(config) == whole);
    }
  }
}

// ZeRO-1 across processes (MPI_Ireduce_scatter in the buckets, MPI_Iallgatherv of the
// parameters) against the unsharded run: losses and parameters bit for bit, and each rank's
// moments share equal to the unsharded moments at its places. pp 2 × dp 2 (two members: each
// element's sum is one addition, whatever the algorithm), both step ends; and pp 1 × dp 4,
// where Open MPI picks the reduce-scatter's order as it picks the all-reduce's: within 1e-6.
TEST_F(MpiTrainTest, ZeroShardsMatchTheUnshardedRun) {
  const std::string shard = ParityShard();
  // Losses and parameters, then each moment as (place, m, v) at the places this rank holds.
  struct Run {
    std::vector<double> losses;
    std::vector<uint32_t> params;
    std::vector<std::tuple<int, int64_t, uint32_t, uint32_t>> moments;
  };
  auto train = [](const Config& config, const std::vector<std::vector<ParamRange>>* places) {
    Run run;
    std::unique_ptr<pipeline::Transport> transport = pipeline::MakeMpiTransport();
    auto trainer = Trainer::Create(config, transport.get());
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return std::pair{run, std::vector<std::vector<ParamRange>>{}};
    for (int i = 0; i < 5; ++i) {
      auto s = (*trainer)->Step();
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      run.losses.push_back(s->loss);
    }
    std::vector<std::vector<ParamRange>> held;
    for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
      StageModel& chunk = (*trainer)->model(c);
      std::vector<float> p(chunk.num_params());
      EXPECT_TRUE(chunk.GetParams(p.data()).ok());
      for (float x : p) run.params.push_back(std::bit_cast<uint32_t>(x));
      const pipeline::StageExecutor& executor = (*trainer)->executor();
      held.push_back(executor.zero() ? executor.buckets()->owned(c)
                                     : std::vector<ParamRange>{{0, chunk.num_params()}});
      std::vector<float> m(chunk.OptimizerStateElements()), v(m.size());
      EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
      int64_t at = 0;
      for (const ParamRange& r : held.back()) {
        for (int64_t i = 0; i < r.n; ++i, ++at) {
          const int64_t place = r.offset + i;
          // The unsharded run's moments are in layout order: its value at each held place.
          const int64_t from = places != nullptr ? place : at;
          run.moments.emplace_back(c, place, std::bit_cast<uint32_t>(m[from]),
                                   std::bit_cast<uint32_t>(v[from]));
        }
      }
    }
    return std::pair{run, held};
  };
  for (auto [schedule, sync] : {std::tuple{"1f1b", "barrier"}, std::tuple{"zbh1", "post_validate"},
                                std::tuple{"zbv", "barrier"}}) {
    SCOPED_TRACE(absl::StrFormat("%s %s pp=2 dp=2", schedule, sync));
    Config config = ParityConfig(shard, schedule, 2, 2, 8);
    config.parallel.partition = "even";
    config.optim.grad_clip = 0.36;
    config.optim.step_sync = sync;
    config.parallel.zero = 1;
    const auto [sharded, held] = train(config, nullptr);
    config.parallel.zero = 0;
    const auto [whole, all] = train(config, &held);
    EXPECT_EQ(sharded.losses, whole.losses);
    EXPECT_TRUE(sharded.params == whole.params);
    // The unsharded run's moments picked at the sharded run's places.
    std::vector<std::tuple<int, int64_t, uint32_t, uint32_t>> picked;
    for (const auto& [c, place, m, v] : whole.moments) {
      for (const ParamRange& r : held[c]) {
        if (place >= r.offset && place < r.offset + r.n) picked.emplace_back(c, place, m, v);
      }
    }
    std::sort(picked.begin(), picked.end());
    std::vector<std::tuple<int, int64_t, uint32_t, uint32_t>> mine = sharded.moments;
    std::sort(mine.begin(), mine.end());
    EXPECT_TRUE(mine == picked);
  }
  SCOPED_TRACE("pp=1 dp=4");
  Config config = ParityConfig(shard, "1f1b", 1, 4, 2, 2);
  config.optim.grad_clip = 0.36;
  config.parallel.zero = 1;
  const std::vector<double> sharded = train(config, nullptr).first.losses;
  config.parallel.zero = 0;
  const std::vector<double> whole = train(config, nullptr).first.losses;
  ASSERT_EQ(sharded.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(sharded[i], whole[i], 1e-6 * whole[i]);
}

}  // namespace
}  // namespace freeride
