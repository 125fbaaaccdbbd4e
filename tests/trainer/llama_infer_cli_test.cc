// `freeride sample` and `freeride eval` with a Llama checkpoint, through the command line
// in-process: greedy sampling gives the argmax of the CPU LlamaStage recomputed over each
// prefix, eval's mean loss is the stage's in double, and a prompt outside the vocabulary is
// refused naming the token.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/tokenizer.h"
#include "tests/models/llama_fixture.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/cli/cli.h"
#include "trainer/data/token_shards.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// GPT-2's vocabulary, so that prompts encoded by its tokenizer fit; 4 query heads on 2
// key/value heads, a context of 32.
GPT2Config SmallLlama(bool tied) {
  return *MakeLlamaConfig(/*n_layer=*/2, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/16,
                          /*max_seq_len=*/32, /*vocab_size=*/50257, /*ffn_hidden=*/24,
                          /*rope_theta=*/10000.0, /*norm_eps=*/1e-5, tied);
}

TEST(LlamaInferCliTest, GreedySampleIsTheArgmaxOfTheFullForward) {
  for (bool tied : {true, false}) {
    const GPT2Config cfg = SmallLlama(tied);
    const std::string dir = Temp(tied ? "llama_sample_tied" : "llama_sample_untied");
    std::filesystem::create_directories(dir);
    const std::vector<float> params = testing::WriteLlamaModel(dir + "/model.bin", cfg, 17);
    const CliResult record =
        RunCommand({"sample", "--checkpoint", dir + "/model.bin", "--prompt", "And God said",
                    "--tokens", "6", "--temperature", "0", "--format", "jsonl"});
    ASSERT_EQ(record.status, kExitOk) << record.err;
    const nlohmann::json json = nlohmann::json::parse(record.out);
    std::vector<int32_t> context = {kEndOfText};
    for (int32_t id : json["prompt_tokens"].get<std::vector<int32_t>>()) context.push_back(id);
    ASSERT_EQ(context.size(), 4u);  // <|endoftext|>, "And", " God", " said"
    EXPECT_EQ(json["tokens"].get<std::vector<int32_t>>(),
              testing::GreedyFromScratch(cfg, params, context, 6))
        << (tied ? "tied" : "untied");
    // The streamed text is the prompt and the same tokens decoded.
    const CliResult text = RunCommand({"sample", "--checkpoint", dir + "/model.bin", "--prompt",
                                       "And God said", "--tokens", "6", "--temperature", "0"});
    ASSERT_EQ(text.status, kExitOk) << text.err;
    EXPECT_EQ(text.out, "And God said" + json["text"].get<std::string>() + "\n");
  }
}

TEST(LlamaInferCliTest, EvalIsTheMeanLossOfTheStageInDouble) {
  const GPT2Config cfg = SmallLlama(false);
  const std::string dir = Temp("llama_eval");
  std::filesystem::create_directories(dir);
  const std::vector<float> params = testing::WriteLlamaModel(dir + "/model.bin", cfg, 4);
  const std::string shard = WriteRandomShard("llama_eval_val.bin", 400, 50257, 9);
  const CliResult eval = RunCommand({"eval", "--checkpoint", dir + "/model.bin", "--data", shard,
                                     "--batch_size", "2", "--seq_len", "16", "--batches", "3"});
  ASSERT_EQ(eval.status, kExitOk) << eval.err;

  // The reference: the same batches through LlamaStage<double> with the same weights.
  absl::StatusOr<TokenLoader> loader = TokenLoader::Open(shard, 2, 16, false, 0);
  ASSERT_TRUE(loader.ok()) << loader.status();
  LlamaStage<double> m(cfg, WholeModel(cfg), 2, 16, 1);
  std::copy(params.begin(), params.end(), m.params());
  double sum = 0;
  for (int b = 0; b < 3; ++b) {
    loader->Next(m.tokens(0), m.targets(0));
    sum += m.Forward(0);
  }
  ASSERT_THAT(eval.out, HasSubstr("eval: 3 batches of 2 x 16 tokens: mean loss "));
  const double printed = std::stod(eval.out.substr(eval.out.rfind(' ') + 1));
  EXPECT_GT(sum / 3, 1.0);  // far from a loss a wrong family could print by chance
  EXPECT_NEAR(printed, sum / 3, 1e-5 * sum / 3);  // float's rounding of a loss of about 20
}

TEST(LlamaInferCliTest, APromptOutsideTheVocabularyOrContextIsRefused) {
  // A vocabulary of 100: the GPT-2 tokenizer's ids for " God" are past it.
  const GPT2Config cfg = *MakeLlamaConfig(1, 2, 1, 8, 8, 100, 16, 1e4, 1e-5, true);
  const std::string model = Temp("llama_small_vocab.bin");
  testing::WriteLlamaModel(model, cfg, 1);
  const CliResult far = RunCommand({"sample", "--checkpoint", model, "--prompt", "And God"});
  EXPECT_EQ(far.status, kExitFailure);
  EXPECT_THAT(far.err, HasSubstr("outside the model's 100-token vocabulary"));
  // No prompt: it starts from id 0 (the vocabulary has no <|endoftext|>) and fills the context.
  const CliResult none = RunCommand({"sample", "--checkpoint", model, "--tokens", "20",
                                     "--temperature", "0", "--format", "jsonl"});
  ASSERT_EQ(none.status, kExitOk) << none.err;
  EXPECT_THAT(none.err, HasSubstr("generating 7 tokens"));
  EXPECT_EQ(nlohmann::json::parse(none.out)["tokens"].size(), 7u);
}

}  // namespace
}  // namespace freeride
