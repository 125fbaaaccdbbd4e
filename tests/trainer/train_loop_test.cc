// The training loop against PyTorch goldens, overfitting, bit-identical resume, clear errors.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/trainer/golden_trajectory.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/optimizer.h"
#include "trainer/data/token_shards.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

// Against the PyTorch golden run (tests/trainer/golden_trajectory.h).
TEST(TrainLoopTest, MatchesPyTorchGoldenTrajectory) {
  auto trainer = Trainer::Create(testing::GoldenConfig(Temp("golden_run"), "cpu"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  testing::ExpectGoldenTrajectory(**trainer);
}

TEST(TrainLoopTest, OverfitsASingleBatch) {
  // Exactly one window: every step sees the same batch.
  const std::string shard = WriteRandomShard("one_batch.bin", 4 * 16 + 1, 64, 3);
  auto trainer = Trainer::Create(
      MustParse(TinyToml(shard, Temp("overfit")),
                {"train.steps=150", "optim.schedule=constant", "optim.weight_decay=0"}));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  StepStats first = MustStep(**trainer), last;
  EXPECT_NEAR(first.loss, std::log(64.0), 0.2);  // random init: about ln(vocab)
  for (int i = 1; i < 150; ++i) last = MustStep(**trainer);
  EXPECT_LT(last.loss, 0.1);
}

TEST(TrainLoopTest, ResumeIsBitIdentical) {
  const std::string shard = WriteRandomShard("resume.bin", 4000, 64, 4);
  const std::string dir = Temp("resume_run");
  std::filesystem::remove_all(dir);
  const std::vector<std::string> sets = {"data.shuffle=true", "checkpoint.every=3"};
  auto straight = Trainer::Create(MustParse(TinyToml(shard, dir), sets));
  ASSERT_TRUE(straight.ok()) << straight.status();
  std::vector<double> expected;
  for (int i = 0; i < 6; ++i) {
    expected.push_back(MustStep(**straight).loss);
    if ((*straight)->step() == 3) {
      ASSERT_TRUE((*straight)->SaveCheckpoint().ok());
    }
  }
  std::vector<std::string> resume = sets;
  resume.push_back("checkpoint.resume=" + dir + "/checkpoints/step_00000003");
  auto resumed = Trainer::Create(MustParse(TinyToml(shard, dir), resume));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->step(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(MustStep(**resumed).loss, expected[i]) << "step " << i + 1;
  // "latest" names the newest complete checkpoint.
  resume.back() = "checkpoint.resume=latest";
  auto latest = Trainer::Create(MustParse(TinyToml(shard, dir), resume));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ((*latest)->step(), 3);
}

void ExpectCreateFails(const Config& config, const std::string& fragment) {
  auto trainer = Trainer::Create(config);
  ASSERT_FALSE(trainer.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(trainer.status().message().find(fragment), std::string::npos)
      << trainer.status().message();
}

TEST(TrainLoopTest, BadInputsGiveClearErrors) {
  const std::string shard = WriteRandomShard("errors.bin", 2000, 64, 5);
  const std::string toml = TinyToml(shard, Temp("errors"));
  ExpectCreateFails(MustParse(toml, {"model.init_from=\"tests/data/gpt2_golden/model.bin\"",
                                     "model.n_embd=64", "model.n_head=2"}),
                    "model.n_embd = 64 in the config, but the checkpoint");
  // The checkpoint's max_seq_len (16) rules when the config leaves the model keys unset.
  ExpectCreateFails(MustParse(absl::StrFormat(R"(
[model]
init_from = "tests/data/gpt2_golden/model.bin"
[data]
train = "%s"
[train]
seq_len = 32
)", shard)),
                    "train.seq_len = 32 exceeds the model's max_seq_len = 16");
  ExpectCreateFails(MustParse(toml, {"model.vocab_size=50"}),
                    "holds token 63 but model.vocab_size is 50");
  ExpectCreateFails(MustParse(toml, {"data.train=\"" + Temp("absent_*.bin") + "\""}),
                    "no token shards match");
  ExpectCreateFails(MustParse(toml, {"model.init_from=\"" + shard + "\""}),
                    "not an llm.c model checkpoint");
  ExpectCreateFails(MustParse(toml, {"checkpoint.resume=latest"}), "no checkpoint yet");
}

TEST(LearningRateTest, WarmupThenCosineToMinimum) {
  OptimConfig o;
  o.lr = 1.0;
  o.warmup_steps = 4;
  o.min_lr_ratio = 0.1;
  // 13 steps: warm-up 0..3, cosine over steps 4..12 (8 intervals).
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 13), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(o, 3, 13), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 4, 13), 1.0);
  EXPECT_NEAR(LearningRate(o, 8, 13), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(LearningRate(o, 12, 13), 0.1, 1e-12);
  o.schedule = "constant";
  EXPECT_DOUBLE_EQ(LearningRate(o, 12, 13), 1.0);
  EXPECT_DOUBLE_EQ(ClipScale(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ClipScale(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipScale(5.0, 0.0), 1.0);
}

}  // namespace
}  // namespace freeride
