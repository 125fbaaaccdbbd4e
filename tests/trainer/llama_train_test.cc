// The trainer with model.arch = "llama": a resume is bit-identical (the family and its keys
// come back from model.bin's header), model.init_from takes a Llama model.bin, a checkpoint of
// one family does not resume into the other.
#include <filesystem>

#include "gtest/gtest.h"
#include "models/llmc_checkpoint.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

const std::vector<std::string> kLlama = {"model.arch=llama", "model.n_kv_head=2",
                                         "model.ffn_hidden=40", "model.rope_theta=500",
                                         "model.tie_embeddings=false"};

std::vector<std::string> With(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

TEST(LlamaTrainTest, ResumeIsBitIdenticalAndInitFromTakesItsModel) {
  const std::string shard = WriteRandomShard("llama_resume.bin", 4000, 64, 4);
  const std::string dir = Temp("llama_resume_run");
  std::filesystem::remove_all(dir);
  const std::vector<std::string> sets =
      With(kLlama, {"data.shuffle=true", "checkpoint.background=false"});
  auto straight = Trainer::Create(MustParse(TinyToml(shard, dir), sets));
  ASSERT_TRUE(straight.ok()) << straight.status();
  std::vector<double> expected;
  for (int i = 0; i < 6; ++i) {
    expected.push_back(MustStep(**straight).loss);
    // Braces: gtest's ASSERT_* is an if/else, which draws -Wdangling-else under a bare if.
    if ((*straight)->step() == 3) {
      ASSERT_TRUE((*straight)->SaveCheckpoint().ok());
    }
  }
  const std::string checkpoint = dir + "/checkpoints/step_00000003";
  absl::StatusOr<GPT2Config> saved = ReadLlmcModelConfig(checkpoint + "/model.bin");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(saved->is_llama());
  EXPECT_EQ(saved->n_kv_head, 2);
  EXPECT_EQ(saved->ffn_hidden, 40);
  EXPECT_EQ(saved->rope_theta, 500.0);
  EXPECT_FALSE(saved->tie_embeddings);

  auto resumed = Trainer::Create(
      MustParse(TinyToml(shard, dir), With(sets, {"checkpoint.resume=" + checkpoint})));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->step(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(MustStep(**resumed).loss, expected[i]) << "step " << i + 1;

  // A GPT-2 run does not resume a Llama checkpoint: the difference is named.
  auto gpt2 = Trainer::Create(
      MustParse(TinyToml(shard, dir), {"data.shuffle=true", "checkpoint.resume=" + checkpoint}));
  ASSERT_FALSE(gpt2.ok());
  EXPECT_NE(gpt2.status().message().find("model.arch is \"llama\" there, \"gpt2\" here"),
            std::string::npos)
      << gpt2.status().message();

  // init_from: the header decides the family; an explicit arch that disagrees is refused.
  auto from = Trainer::Create(
      MustParse(TinyToml(shard, Temp("llama_init_from")),
                {"data.shuffle=true", "model.init_from=" + checkpoint + "/model.bin"}));
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_TRUE((*from)->model().config().is_llama());
  auto disagree = Trainer::Create(
      MustParse(TinyToml(shard, Temp("llama_init_from2")),
                {"model.arch=gpt2", "model.init_from=" + checkpoint + "/model.bin"}));
  ASSERT_FALSE(disagree.ok());
  EXPECT_NE(disagree.status().message().find("model.arch = \"gpt2\" in the config"),
            std::string::npos)
      << disagree.status().message();
}

}  // namespace
}  // namespace freeride
