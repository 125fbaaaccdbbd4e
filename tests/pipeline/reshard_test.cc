// Checkpoints resumed under another layout (pp, dp, chunks, schedule) continue with the losses
// an uninterrupted run has; emulated-peer runs write their metrics and reports; losses do not
// depend on the thread count.
#include <omp.h>

#include <cblas.h>

#include <filesystem>

#include "core/clock.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/cpu/kernels.h"
#include "tests/pipeline/train_parity.h"

namespace freeride::testing {
namespace {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove_all(dir);
  return dir;
}

// Saved under `from` after 2 steps, resumed under `to`: steps 3..5 equal `from` run straight
// (bit for bit: every layout here gives the one-process bits).
void ExpectReshardedResumeMatches(const std::string& name, Config from, Config to) {
  const std::string dir = Dir(name);
  from.run.dir = to.run.dir = dir;
  const std::vector<double> straight = ThreadedLosses(from, 5, nullptr, /*resume_at=*/2);
  to.checkpoint.resume = "latest";
  const std::vector<double> resumed = ThreadedLosses(to, 3);
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], straight[2 + i]) << name << " step " << 3 + i;
}

TEST(ReshardTest, OneStageToTwoAndBack) {
  const std::string shard = ParityShard();
  ExpectReshardedResumeMatches("reshard_1_to_2", ParityConfig(shard, "1f1b", 1, 1, 4),
                               ParityConfig(shard, "1f1b", 2, 1, 4));
  ExpectReshardedResumeMatches("reshard_2_to_1", ParityConfig(shard, "gpipe", 2, 1, 4),
                               ParityConfig(shard, "zbh1", 1, 1, 4));
}

TEST(ReshardTest, InterleavedChunksToFourStagesAndUnevenSplits) {
  const std::string shard = ParityShard();
  ExpectReshardedResumeMatches("reshard_chunks", ParityConfig(shard, "interleaved", 2, 1, 4),
                               ParityConfig(shard, "1f1b", 4, 1, 4));
  Config uneven = ParityConfig(shard, "1f1b", 2, 1, 4);
  uneven.parallel.layers_per_stage = {7, 1};
  ExpectReshardedResumeMatches("reshard_uneven", uneven, ParityConfig(shard, "1f1b", 4, 1, 4));
}

TEST(ReshardTest, DataParallelWithTheSameGlobalBatch) {
  // dp = 2 × 4 sequences after dp = 1 × 8: the same data; the replicas' gradient sum is
  // added in another order than one process's, so equal to rounding.
  const std::string shard = ParityShard();
  const std::string dir = Dir("reshard_dp");
  Config from = ParityConfig(shard, "1f1b", 2, 1, 4, 8, dir);
  const std::vector<double> straight = ThreadedLosses(from, 5, nullptr, 2);
  Config to = ParityConfig(shard, "1f1b", 2, 2, 2, 4, dir);
  to.checkpoint.resume = "latest";
  const std::vector<double> resumed = ThreadedLosses(to, 3);
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(resumed[i], straight[2 + i], 1e-5) << "step " << 3 + i;
}

TEST(ReshardTest, WhatCannotCarryOverIsNamed) {
  const std::string shard = ParityShard();
  const std::string dir = Dir("reshard_refused");
  ThreadedLosses(ParityConfig(shard, "1f1b", 2, 1, 4, 8, dir), 2, nullptr, 2);
  Config wider = ParityConfig(shard, "1f1b", 1, 1, 4, 8, dir);
  wider.model.n_embd = 32;
  wider.checkpoint.resume = "latest";
  auto trainer = Trainer::Create(wider);
  ASSERT_FALSE(trainer.ok());
  EXPECT_THAT(trainer.status().message(), HasSubstr("model.n_embd is 16 there, 32 here"));
  Config bigger = ParityConfig(shard, "1f1b", 1, 2, 4, 8, dir);
  bigger.checkpoint.resume = "latest";
  std::vector<std::string> errors;
  ThreadedLosses(bigger, 1, &errors);
  EXPECT_THAT(errors[0], HasSubstr("the global batch stays the same"));
}

TEST(EmulatedRunTest, AnyRealStageWritesMetricsAndTheHarvestReportWithoutCheckpoints) {
  for (int stage : {0, 1}) {
    Config config =
        testing::EmulatedHarvestConfig("emulated_stage_" + std::to_string(stage) + "_run");
    config.runtime.emulated_stage = stage;
    config.train.steps = 3;
    SideTaskConfig spin;
    spin.type = spin.name = "spin";
    spin.args["step_ms"] = 0.05;
    config.side_tasks = {spin};
    // On simulated time: whether a spin fits this tiny pipeline's bubbles does not depend on
    // how fast the machine computes it (with real time, fast kernels left no bubble of 1 ms).
    SimulatedClock clock;
    auto trainer = Trainer::Create(config, nullptr, &clock);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    absl::Status s = (*trainer)->Run();
    ASSERT_TRUE(s.ok()) << "stage " << stage << ": " << s;
    const std::string& dir = config.run.dir;
    absl::StatusOr<std::string> metrics = ReadFile(dir + "/metrics.jsonl");
    ASSERT_TRUE(metrics.ok()) << "stage " << stage;
    EXPECT_THAT(*metrics, HasSubstr("\"step\": 3"));
    EXPECT_THAT(*metrics, HasSubstr("\"kind\": \"harvest\"")) << "stage " << stage;
    EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/latest"));
  }
}

TEST(ThreadCountTest, GemmGivesTheSameBitsForAnyThreadCount) {
  // OpenBLAS's own threaded split changes which edge kernel computes an element (thousands of
  // elements differed between 1 and 2 threads for these shapes before the fixed blocks).
  const int64_t shapes[][3] = {{128, 128, 128}, {128, 512, 128}, {384, 128, 128},
                               {128, 128, 2000}, {2000, 96, 64}};
  for (const auto& [M, N, K] : shapes) {
    std::mt19937 rng(static_cast<uint32_t>(M * N + K));
    std::normal_distribution<float> normal;
    std::vector<float> a(M * K), b(K * N), c1(M * N), c2;
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    for (float& x : c1) x = normal(rng);
    c2 = c1;
    for (auto [threads, out] : {std::pair{1, &c1}, std::pair{2, &c2}}) {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
      cpu::Gemm<float>(true, false, M, N, K, 1.0f, a.data(), M, b.data(), N, 1.0f, out->data(), N);
    }
    EXPECT_EQ(c1, c2) << M << "x" << N << "x" << K;
  }
  omp_set_num_threads(2);
  openblas_set_num_threads(2);
}

TEST(ThreadCountTest, TrainingGivesTheSameLossesAndNormsForAnyThreadCount) {
  Config config = ParityConfig(ParityShard(), "1f1b", 1, 1, 2);
  config.model.n_embd = 128;
  config.model.n_head = 4;
  config.model.n_layer = 2;
  config.model.max_seq_len = 64;
  config.train.seq_len = 64;
  std::vector<std::pair<double, double>> per_threads[2];
  for (int threads : {1, 2}) {
    config.runtime.threads = threads;
    auto trainer = Trainer::Create(config);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int i = 0; i < 4; ++i) {
      auto s = (*trainer)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      per_threads[threads - 1].emplace_back(s->loss, s->grad_norm);
    }
  }
  EXPECT_EQ(per_threads[0], per_threads[1]);
}

}  // namespace
}  // namespace freeride::testing
