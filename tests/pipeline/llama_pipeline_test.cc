// The Llama family trained as a pipeline (ranks as threads, in-process transport): every
// schedule kind at pp 2 (and pp 4 for some) reproduces the single-process trainer's losses bit
// for bit, with the head tied to the embedding (the tied sum between the first and last stage)
// and untied (no tied sum); post-validated steps too; pp 2 × dp 2 within one millionth of one
// process, and under every schedule kind bit for bit the one-stage replicas (pp 1 × dp 2: the
// same data-parallel sum, so only the pipeline differs).
#include <cblas.h>
#include <omp.h>

#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;
using testing::ThreadedLosses;

class LlamaPipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One BLAS and OpenMP thread per rank: the ranks are already threads.
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
};

Config LlamaParity(const std::string& shard, const std::string& schedule, int pp, int dp,
                   int microbatches, bool tied, int batch = 8) {
  return testing::LlamaParityConfig(shard, schedule, pp, dp, microbatches, tied, batch);
}

TEST_F(LlamaPipelineTest, EveryScheduleMatchesOneProcessBitForBit) {
  const std::string shard = ParityShard();
  for (bool tied : {true, false}) {
    const std::vector<double> expected =
        SingleProcessLosses(LlamaParity(shard, "1f1b", 1, 1, 4, tied));
    ASSERT_EQ(expected.size(), 5u);
    for (const std::string schedule :
         {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=2 m=4 %s", schedule, tied ? "tied" : "untied"));
      EXPECT_EQ(ThreadedLosses(LlamaParity(shard, schedule, 2, 1, 4, tied)), expected);
    }
    for (const std::string schedule : {"1f1b", "zbh1", "interleaved"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=4 m=4 %s", schedule, tied ? "tied" : "untied"));
      EXPECT_EQ(ThreadedLosses(LlamaParity(shard, schedule, 4, 1, 4, tied)), expected);
    }
  }
}

TEST_F(LlamaPipelineTest, PostValidatedStepsMatchOneProcessBitForBit) {
  const std::string shard = ParityShard();
  for (bool tied : {true, false}) {
    const std::vector<double> expected =
        SingleProcessLosses(LlamaParity(shard, "1f1b", 1, 1, 4, tied));
    for (const std::string schedule : {"1f1b", "zbh1"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=2 post_validate %s", schedule, tied ? "tied" : "untied"));
      Config config = LlamaParity(shard, schedule, 2, 1, 4, tied);
      config.optim.step_sync = "post_validate";
      EXPECT_EQ(ThreadedLosses(config), expected);
    }
  }
}

TEST_F(LlamaPipelineTest, DataParallelWithinOneMillionth) {
  const std::string shard = ParityShard();
  for (bool tied : {true, false}) {
    const std::vector<double> expected =
        SingleProcessLosses(LlamaParity(shard, "1f1b", 1, 1, 4, tied));
    SCOPED_TRACE(tied ? "tied" : "untied");
    const std::vector<double> got = ThreadedLosses(LlamaParity(shard, "zbh1", 2, 2, 2, tied, 4));
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << "step " << i;
  }
}

// dp 2 replicas of 4 sequences in 4 micro-batches of one (DualPipeV needs 2p): the gradients of
// a replica's micro-batches add up in one order on any pipeline, and the replicas' sum is one
// addition, so every kind at pp 2 gives the bits of the one-stage replicas.
TEST_F(LlamaPipelineTest, EveryScheduleAtPp2Dp2MatchesTheOneStageReplicasBitForBit) {
  const std::string shard = ParityShard();
  for (bool tied : {true, false}) {
    const std::vector<double> expected =
        ThreadedLosses(LlamaParity(shard, "1f1b", 1, 2, 4, tied, 4));
    ASSERT_EQ(expected.size(), 5u);
    const std::vector<double> one_process =
        SingleProcessLosses(LlamaParity(shard, "1f1b", 1, 1, 8, tied));
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(expected[i], one_process[i], 1e-6) << "step " << i;
    }
    for (const std::string schedule :
         {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=2 dp=2 m=4 %s", schedule, tied ? "tied" : "untied"));
      EXPECT_EQ(ThreadedLosses(LlamaParity(shard, schedule, 2, 2, 4, tied, 4)), expected);
    }
  }
}

}  // namespace
}  // namespace freeride
