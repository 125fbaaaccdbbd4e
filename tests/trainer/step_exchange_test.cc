// The per-step exchange (trainer/step_exchange.h): a round trip over ranks as threads of this
// process (MPI's: tests/pipeline/mpi_train_test.cc), and a shape the ranks disagree on refused
// with both lengths named.
#include "trainer/step_exchange.h"

#include <thread>

#include "gmock/gmock.h"
#include "tests/trainer/step_exchange_check.h"

namespace freeride {
namespace {

TEST(StepExchangeTest, EveryRankReadsEveryRanksFieldsAfterTheSumInProcess) {
  for (int n : {1, 3}) {
    SCOPED_TRACE(n);
    std::vector<std::unique_ptr<pipeline::Transport>> world = pipeline::MakeInProcessWorld(n);
    std::vector<std::thread> ranks;
    for (auto& t : world) {
      ranks.emplace_back([&t] { testing::ExpectStepExchangeRoundTrip(*t); });
    }
    for (std::thread& r : ranks) r.join();
  }
}

TEST(StepExchangeTest, AnExchangeOfAnotherShapeIsRefused) {
  const StepExchange two_stages = StepExchange::Shaped(2, 4, 0, false);
  StepExchange three_stages = StepExchange::Shaped(3, 4, 0, false);
  const absl::Status s = three_stages.Unpack(two_stages.Pack());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("has 23 values where this rank's shape"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("has 26"));
  // Without the guard's step time, none is packed.
  EXPECT_EQ(two_stages.Pack().size(), 23u);
  EXPECT_EQ(StepExchange::Shaped(2, 4, 0, true).Pack().size(), 24u);
}

}  // namespace
}  // namespace freeride
