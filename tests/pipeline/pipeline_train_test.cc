// Pipeline training with ranks as threads (in-process transport): every layout reproduces the
// single-process trainer's losses bit for bit; data parallelism within 1e-6; resume in
// pipeline mode; a silent peer is a clear timeout, not a hang.
#include <cblas.h>
#include <omp.h>

#include <thread>

#include "absl/strings/str_join.h"
#include "core/files.h"
#include "pipeline/schedule_file.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/pipeline_plan.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;
using testing::ThreadedLosses;

class PipelineTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One BLAS and OpenMP thread per rank: the ranks are already threads.
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
};

TEST_F(PipelineTrainTest, EveryLayoutMatchesOneProcessBitForBit) {
  const std::string shard = ParityShard();
  for (int m : {1, 4, 8}) {
    const std::vector<double> expected =
        SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, m));
    for (const std::string schedule :
         {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
      for (int pp : {2, 4}) {
        if (schedule == "interleaved" && m % pp != 0) continue;  // interleaving needs m % p == 0
        if (schedule == "dualpipev" && m < 2 * pp) continue;     // DualPipeV needs m >= 2p
        SCOPED_TRACE(absl::StrFormat("%s pp=%d m=%d", schedule, pp, m));
        EXPECT_EQ(ThreadedLosses(ParityConfig(shard, schedule, pp, 1, m)), expected);
      }
    }
  }
}

// Recomputation (model.recompute, parallel.recompute_stages) changes what a micro-batch in
// flight keeps, never the numbers: every schedule kind at pp 2, its I/W split included, trains
// the bits of the plain run, and so do 2 replicas (against the plain run of the same layout:
// the data-parallel sum's order is the same).
TEST_F(PipelineTrainTest, RecomputationTrainsTheSameBitsOnEverySchedule) {
  const std::string shard = ParityShard();
  const int m = 4;
  const std::vector<double> expected = SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, m));
  auto with = [](Config config, const std::string& mode, std::vector<std::string> stages = {}) {
    config.model.recompute = mode;
    config.parallel.recompute_stages = std::move(stages);
    return config;
  };
  for (const std::string mode : {"selective", "full"}) {
    SCOPED_TRACE(absl::StrFormat("one process, recompute %s", mode));
    EXPECT_EQ(SingleProcessLosses(with(ParityConfig(shard, "1f1b", 1, 1, m), mode)), expected);
  }
  for (const std::string schedule :
       {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
    const int microbatches = schedule == "dualpipev" ? 4 : m;  // DualPipeV needs m >= 2p
    const Config plain = ParityConfig(shard, schedule, 2, 1, microbatches);
    for (const auto& [mode, stages] :
         {std::pair<std::string, std::vector<std::string>>{"selective", {}},
          {"full", {}},
          {"none", {"full", "selective"}}}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=2 recompute %s [%s]", schedule, mode,
                                   absl::StrJoin(stages, ", ")));
      EXPECT_EQ(ThreadedLosses(with(plain, mode, stages)), expected);
    }
  }
  for (const std::string schedule : {"1f1b", "zbh1"}) {
    const Config plain = ParityConfig(shard, schedule, 2, 2, 2, 4);
    const std::vector<double> reference = ThreadedLosses(plain);
    for (const std::string mode : {"selective", "full"}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=2 dp=2 recompute %s", schedule, mode));
      EXPECT_EQ(ThreadedLosses(with(plain, mode)), reference);
    }
  }
  // Post-validated: the next step's forwards run ahead of the last step's validation.
  Config post = ParityConfig(shard, "zbh2", 2, 1, m);
  post.optim.step_sync = "post_validate";
  const std::vector<double> post_reference = ThreadedLosses(post);
  for (const std::string mode : {"selective", "full"}) {
    SCOPED_TRACE(absl::StrFormat("zbh2 post-validated recompute %s", mode));
    EXPECT_EQ(ThreadedLosses(with(post, mode)), post_reference);
  }
}

// A schedule printed by `freeride schedule` (text) or handed over as torch's CSV trains as the
// generated one it came from, bit for bit; the partition does not change the numbers.
TEST_F(PipelineTrainTest, ScheduleFilesTrainAsTheGeneratedSchedule) {
  const std::string shard = ParityShard();
  const std::vector<double> expected = SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, 4));
  for (const std::string kind : {"zbv", "zbh2", "interleaved"}) {
    Config generated = ParityConfig(shard, kind, 2, 1, 4);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(generated, *ResolveModelConfig(generated));
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<pipeline::Schedule> schedule =
        TrainingSchedule(generated, *plan, pipeline::CostModel::Uniform());
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    for (const auto& [name, text] :
         {std::pair{"s.txt", pipeline::ScheduleToText(*schedule)},
          std::pair{"s_torch.csv", pipeline::ScheduleToTorchCsv(*schedule)}}) {
      SCOPED_TRACE(absl::StrFormat("%s as %s", kind, name));
      Config config = ParityConfig(shard, "1f1b", 2, 1, 4);
      config.parallel.schedule = "file";
      config.parallel.schedule_file = (std::filesystem::path(::testing::TempDir()) /
                                       absl::StrCat(kind, "_", name)).string();
      ASSERT_TRUE(WriteFileAtomically(config.parallel.schedule_file, text).ok());
      EXPECT_EQ(ThreadedLosses(config), expected);
    }
  }
  Config even = ParityConfig(shard, "zbv", 2, 1, 4);
  even.parallel.partition = "even";
  EXPECT_EQ(ThreadedLosses(even), expected);
}

TEST_F(PipelineTrainTest, DataParallelWithinOneMillionth) {
  const std::string shard = ParityShard();
  // dp = 2 replicas of batch 4 in 2 micro-batches = one process with batch 8 in 4.
  const std::vector<double> expected = SingleProcessLosses(ParityConfig(shard, "1f1b", 1, 1, 4, 8));
  for (int pp : {1, 2}) {
    SCOPED_TRACE(absl::StrFormat("pp=%d dp=2", pp));
    const std::vector<double> got = ThreadedLosses(ParityConfig(shard, "1f1b", pp, 2, 2, 4));
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6 * expected[i]);
  }
}

TEST_F(PipelineTrainTest, ResumeInPipelineModeIsBitIdentical) {
  const std::string shard = ParityShard();
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "pp_resume").string();
  std::filesystem::remove_all(dir);
  Config config = ParityConfig(shard, "zbh1", 2, 1, 4, 8, dir);
  const std::vector<double> straight = ThreadedLosses(config, 5, nullptr, /*resume_at=*/2);
  config.checkpoint.resume = "latest";
  const std::vector<double> resumed = ThreadedLosses(config, 3);
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], straight[2 + i]) << "step " << 3 + i;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step_00000002/state_r001.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step_00000002/model.bin"));
}

TEST_F(PipelineTrainTest, WrongWorldSizeSaysWhatFits) {
  Config config = ParityConfig(ParityShard(), "1f1b", 4, 1, 4);
  auto world = pipeline::MakeInProcessWorld(2);
  auto trainer = Trainer::Create(config, world[0].get());
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("2 ranks, but parallel.pp × parallel.dp = 4 × 1 = 4; "
                                            "with 2 ranks these fit: pp=1 dp=2, pp=2 dp=1"),
            std::string::npos)
      << trainer.status().message();
}

TEST_F(PipelineTrainTest, SilentPeerIsATimeoutNamingTheInstruction) {
  // Stage 1 of 2 never starts: stage 0 waits for its gradient and gives up.
  Config config = ParityConfig(ParityShard(), "1f1b", 2, 1, 2);
  config.runtime.comm_timeout_s = 0.5;
  config.parallel.partition = "even";  // a balanced split first agrees on measured costs
  auto world = pipeline::MakeInProcessWorld(2);
  auto trainer = Trainer::Create(config, world[0].get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto step = (*trainer)->Step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(step.status().message().find(
                "rank 0 (stage 0, replica 0) blocked on RECV_GRAD micro-batch 0 (peer: stage 1, "
                "rank 1)"),
            std::string::npos)
      << step.status().message();
}

}  // namespace
}  // namespace freeride
