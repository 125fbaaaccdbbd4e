// prepare → train → eval → sample through the command line, in-process.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

std::string CliTrainTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

TEST(CliTrainTest, PrepareTrainEvalSample) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep.\n";
  }
  ASSERT_TRUE(WriteFileAtomically(CliTrainTemp("corpus.txt"), text).ok());
  const std::string data = CliTrainTemp("cli_data"), run = CliTrainTemp("cli_run");
  std::filesystem::remove_all(run);
  CliResult prep = RunCommand(
      {"prepare", "--input", CliTrainTemp("corpus.txt"), "--out", data, "--val_tokens", "200"});
  ASSERT_EQ(prep.status, kExitOk) << prep.err;
  EXPECT_THAT(prep.out, HasSubstr("val_000000.bin (200 tokens)"));

  // Progress is kept at the warn threshold, in the log file as on stderr.
  const LogLevel level = GetLogLevel();
  SetLogLevel(LogLevel::kWarn);
  CliResult train = RunCommand({"train",
                                "--set",
                                "run.dir=\"" + run + "\"",
                                "--set",
                                "data.train=\"" + data + "/train_*.bin\"",
                                "--set",
                                "data.val=\"" + data + "/val_*.bin\"",
                                "--set",
                                "model.n_layer=1",
                                "--set",
                                "model.n_embd=16",
                                "--set",
                                "model.n_head=2",
                                "--set",
                                "train.steps=4",
                                "--set",
                                "train.seq_len=16",
                                "--set",
                                "eval.every=2",
                                "--set",
                                "eval.batches=1"});
  SetLogLevel(level);
  ASSERT_EQ(train.status, kExitOk) << train.err;
  absl::StatusOr<std::string> log = ReadFile(run + "/log_rank000.txt");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(*log, HasSubstr("] step 4/4 | loss "));
  EXPECT_THAT(*log, HasSubstr("] step 2 | val loss "));
  EXPECT_THAT(*log, HasSubstr("] final checkpoint "));
  EXPECT_THAT(*log, ::testing::Not(HasSubstr("] model: ")));  // an INFO line, below warn
  auto metrics = ReadFile(run + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(*metrics, HasSubstr("{\"kind\": \"train\", \"step\": 4, \"loss\": "));
  EXPECT_THAT(*metrics, HasSubstr("\"tokens_per_s\""));
  EXPECT_THAT(*metrics, HasSubstr("{\"kind\": \"val\", \"step\": 2, \"loss\": "));
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step_00000004/model.bin"));
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step_00000004/manifest.json"));

  CliResult eval = RunCommand({"eval", "--checkpoint", run + "/checkpoints", "--data",
                               data + "/val_*.bin", "--batch_size", "2", "--seq_len", "16"});
  ASSERT_EQ(eval.status, kExitOk) << eval.err;
  EXPECT_THAT(eval.out, HasSubstr("eval: 6 batches of 2 x 16 tokens: mean loss"));

  CliResult sample = RunCommand({"sample", "--checkpoint", run + "/checkpoints", "--prompt",
                                 "In the beginning", "--tokens", "5", "--seed", "1"});
  ASSERT_EQ(sample.status, kExitOk) << sample.err;
  EXPECT_THAT(sample.out, HasSubstr("In the beginning"));
  EXPECT_EQ(sample.out, RunCommand({"sample", "--checkpoint", run + "/checkpoints", "--prompt",
                                    "In the beginning", "--tokens", "5", "--seed", "1"})
                            .out);  // seeded: reproducible
  // The same sample as one JSON record: its ids beside the text, which is the streamed text
  // less the prompt.
  CliResult record =
      RunCommand({"sample", "--checkpoint", run + "/checkpoints", "--prompt", "In the beginning",
                  "--tokens", "5", "--seed", "1", "--format", "jsonl"});
  ASSERT_EQ(record.status, kExitOk) << record.err;
  const nlohmann::json json = nlohmann::json::parse(record.out);
  EXPECT_EQ(json["prompt"], "In the beginning");
  EXPECT_EQ(json["tokens"].size(), 5u);
  EXPECT_EQ(json["prompt_tokens"].size(), 3u);  // "In", " the", " beginning"
  EXPECT_EQ("In the beginning" + json["text"].get<std::string>() + "\n", sample.out);
}

TEST(CliTrainTest, BadInputsFailWithMessages) {
  ASSERT_TRUE(WriteFileAtomically(CliTrainTemp("empty.txt"), "").ok());
  CliResult empty = RunCommand(
      {"prepare", "--input", CliTrainTemp("empty.txt"), "--out", CliTrainTemp("empty_out")});
  EXPECT_EQ(empty.status, kExitFailure);
  EXPECT_THAT(empty.err, HasSubstr("the corpus has 0 tokens"));
  CliResult no_tok =
      RunCommand({"prepare", "--input", CliTrainTemp("empty.txt"), "--out", CliTrainTemp("x"),
                  "--tokenizer", CliTrainTemp("missing.tiktoken")});
  EXPECT_EQ(no_tok.status, kExitFailure);
  EXPECT_THAT(no_tok.err, HasSubstr("fetch it with launch/prepare_data.sh"));
  CliResult no_data =
      RunCommand({"train", "--set", "data.train=\"" + CliTrainTemp("nothing_*.bin") + "\"", "--set",
                  "run.dir=\"" + CliTrainTemp("nd_run") + "\""});
  EXPECT_EQ(no_data.status, kExitFailure);
  EXPECT_THAT(no_data.err, HasSubstr("no token shards match"));
  CliResult bad_ckpt = RunCommand({"sample", "--checkpoint", CliTrainTemp("empty.txt")});
  EXPECT_EQ(bad_ckpt.status, kExitFailure);
  EXPECT_THAT(bad_ckpt.err, HasSubstr("shorter than the 1024-byte llm.c header"));
  EXPECT_EQ(RunCommand({"eval", "--checkpoint", "x"}).status, kExitUsage);
}

}  // namespace
}  // namespace freeride
