// `freeride export --format hf` and `freeride import --format hf` through the command line: an
// llm.c model out and back bit for bit, and bad usage refused with status 2.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/llmc_checkpoint.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "tests/data/gpt2_golden/model.bin";

TEST(HfCliTest, ExportThenImportGivesTheSameModel) {
  const std::string dir = Temp("hf_cli"), back = Temp("hf_cli_back.bin");
  std::filesystem::remove_all(dir);
  const CliResult out = RunCommand({"export", "--format", "hf", kModel, dir});
  ASSERT_EQ(out.status, 0) << out.err;
  EXPECT_THAT(out.out, HasSubstr(dir + "/model.safetensors"));
  EXPECT_THAT(out.out, HasSubstr(dir + "/config.json"));
  const CliResult in = RunCommand({"import", "--format", "hf", dir, "--out", back});
  ASSERT_EQ(in.status, 0) << in.err;
  EXPECT_THAT(in.out, HasSubstr("2 layers, 2 heads, n_embd 32, 16 positions, vocabulary 100"));
  absl::StatusOr<LlmcModel> a = ReadLlmcModel(kModel), b = ReadLlmcModel(back);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->config, b->config);
  EXPECT_EQ(a->params, b->params);
  const std::string bf16 = Temp("hf_cli_bf16");
  std::filesystem::remove_all(bf16);
  ASSERT_EQ(RunCommand({"export", "--format", "hf", kModel, bf16, "--dtype", "bf16"}).status, 0);
  absl::StatusOr<std::string> config = ReadFile(bf16 + "/config.json");
  ASSERT_TRUE(config.ok());
  const nlohmann::json json = nlohmann::json::parse(*config);
  EXPECT_EQ(json["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(json["torch_dtype"], "bfloat16");
  EXPECT_EQ(RunCommand({"import", "--format", "hf", bf16, "--out", Temp("bf16.bin")}).status, 0);
}

// A Llama trained here goes out as LlamaForCausalLM and comes back as the same file, header
// (the family and its keys) and weights.
TEST(HfCliTest, ALlamaCheckpointExportsAndImportsBitForBit) {
  const std::string shard = WriteRandomShard("hf_llama_cli.bin", 2000, 64, 8);
  const std::string run = Temp("hf_llama_cli_run");
  std::filesystem::remove_all(run);
  auto trainer = Trainer::Create(MustParse(
      TinyToml(shard, run), {"model.arch=llama", "model.n_kv_head=1", "model.ffn_hidden=40",
                             "model.tie_embeddings=false", "checkpoint.background=false"}));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  MustStep(**trainer);
  absl::StatusOr<std::string> checkpoint = (*trainer)->SaveCheckpoint();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::string dir = Temp("hf_llama_cli"), back = Temp("hf_llama_cli_back.bin");
  std::filesystem::remove_all(dir);
  const CliResult out = RunCommand({"export", "--format", "hf", *checkpoint, dir});
  ASSERT_EQ(out.status, 0) << out.err;
  nlohmann::json config = nlohmann::json::parse(*ReadFile(dir + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  const CliResult in = RunCommand({"import", "--format", "hf", dir, "--out", back});
  ASSERT_EQ(in.status, 0) << in.err;
  EXPECT_THAT(in.out, HasSubstr("(Llama: 2 layers"));
  EXPECT_EQ(*ReadFile(*checkpoint + "/model.bin"), *ReadFile(back));
}

TEST(HfCliTest, BadUsageAndForeignModelsAreRefused) {
  const std::string dir = Temp("hf_cli_bad");
  EXPECT_EQ(RunCommand({"export", "--format", "onnx", kModel, dir}).status, 2);
  EXPECT_EQ(RunCommand({"export", "--format", "hf", kModel}).status, 2);
  EXPECT_EQ(RunCommand({"export", "--format", "hf", kModel, dir, "--dtype", "fp8"}).status, 2);
  EXPECT_EQ(RunCommand({"import", "--format", "hf", dir}).status, 2);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(RunCommand({"export", "--format", "hf", kModel, dir}).status, 0);
  nlohmann::json config = nlohmann::json::parse(*ReadFile(dir + "/config.json"));
  config["model_type"] = "mistral";
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", config.dump()).ok());
  const CliResult foreign = RunCommand({"import", "--format", "hf", dir, "--out", Temp("x.bin")});
  EXPECT_EQ(foreign.status, 1);
  EXPECT_THAT(foreign.err, HasSubstr("model_type \"mistral\": this build imports \"gpt2\""));
  // A GPT-2's config.json that says llama: the Llama keys it lacks are named.
  config["model_type"] = "llama";
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", config.dump()).ok());
  const CliResult llama = RunCommand({"import", "--format", "hf", dir, "--out", Temp("x.bin")});
  EXPECT_EQ(llama.status, 1);
  EXPECT_THAT(llama.err, HasSubstr("num_hidden_layers"));
  const CliResult missing =
      RunCommand({"export", "--format", "hf", Temp("no_such_checkpoint"), dir});
  EXPECT_EQ(missing.status, 1);
}

}  // namespace
}  // namespace freeride
