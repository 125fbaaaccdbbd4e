// Pipeline training across processes (run by ctest under `mpirun -n 4 --oversubscribe`): every
// 4-rank layout reproduces the single-process trainer, which each rank also runs alone; a
// post-validated run reproduces the barrier's, and the data-parallel sum in buckets the one
// sum's.
#include <mpi.h>

#include <bit>
#include <tuple>

#include "pipeline/comm/transport.h"
#include "tests/pipeline/train_parity.h"

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

}  // namespace
}  // namespace freeride
