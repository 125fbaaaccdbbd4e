// The side tasks that generate text, with a Llama checkpoint: `gpt_infer`'s key/value-cache
// engine draws what its recompute engine (the CPU LlamaStage over the whole window) draws, and
// greedily the argmax of the full forward over each prefix; `serve` answers a completion over
// HTTP from its bubbles with the tokens of that same greedy reference (the serve test of
// serve_class_test.cc, mirrored for a Llama model, on simulated time).
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/timer.h"
#include "freeride/executor.h"
#include "freeride/side_task.h"
#include "gtest/gtest.h"
#include "models/tokenizer.h"
#include "tests/models/llama_fixture.h"

namespace freeride {
namespace {

std::string LlamaTaskTemp(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

// A Llama model file of `vocab` tokens (4 query heads on 2 key/value heads, untied head), and
// its parameters.
std::vector<float> LlamaCheckpoint(const std::string& path, int64_t vocab, GPT2Config* cfg) {
  *cfg = *MakeLlamaConfig(/*n_layer=*/2, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/16,
                          /*max_seq_len=*/16, vocab, /*ffn_hidden=*/24, /*rope_theta=*/1e4,
                          /*norm_eps=*/1e-5, /*tied=*/false);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  return testing::WriteLlamaModel(path, *cfg, 23);
}

// gpt_infer's generations.txt for `engine`: `requests` sequences of 7 tokens, 3 at a time.
std::vector<std::string> Generations(const std::string& checkpoint, const std::string& engine,
                                     double temperature, const std::string& dir) {
  auto task = CreateSideTask("gpt_infer", "");
  EXPECT_TRUE(task.ok());
  TaskArgs args{{"checkpoint", checkpoint},   {"batch", int64_t{3}},
                {"max_tokens", int64_t{7}},   {"requests", int64_t{6}},
                {"temperature", temperature}, {"top_k", int64_t{0}},
                {"seed", int64_t{5}},         {"engine", engine}};
  CappedArena arena(64 << 20);
  SideTaskContext ctx{"infer", 0, 0, &args, &arena, LlamaTaskTemp(dir), 0, [] { return false; }};
  std::filesystem::remove_all(ctx.results_dir);
  EXPECT_TRUE((*task)->Create(ctx).ok());
  EXPECT_TRUE(MakeDirectories(ctx.results_dir).ok());
  absl::Status loaded = (*task)->Load(ctx);
  EXPECT_TRUE(loaded.ok()) << loaded;
  for (int i = 0; loaded.ok() && i < 100 && !(*task)->Done(); ++i) {
    absl::StatusOr<double> step = (*task)->Step(ctx);
    EXPECT_TRUE(step.ok()) << step.status();
  }
  EXPECT_TRUE((*task)->Done());
  absl::StatusOr<std::string> text = ReadFile(ctx.results_dir + "/generations.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  return absl::StrSplit(text.ok() ? *text : "", '\n', absl::SkipEmpty());
}

TEST(LlamaTasksTest, GptInferKvCacheDrawsWhatTheRecomputeEngineDraws) {
  GPT2Config cfg;
  const std::string model = LlamaTaskTemp("llama_infer/model.bin");
  const std::vector<float> params = LlamaCheckpoint(model, 100, &cfg);
  const std::vector<std::string> cached = Generations(model, "kv_cache", 1.0, "llama_infer_kv");
  ASSERT_EQ(cached.size(), 6u);
  EXPECT_NE(cached[0], cached[1]);  // sampled, so the sequences tell positions apart
  EXPECT_EQ(Generations(model, "recompute", 1.0, "llama_infer_recompute"), cached);

  // Greedy: every sequence is the full forward's argmax after id 0 (no <|endoftext|> in a
  // vocabulary of 100).
  std::vector<std::string> expected;
  for (int32_t id : testing::GreedyFromScratch(cfg, params, {0}, 7)) {
    expected.push_back(std::to_string(id));
  }
  const std::string greedy = absl::StrJoin(expected, " ");
  for (const std::string& line : Generations(model, "kv_cache", 0.0, "llama_infer_greedy")) {
    EXPECT_EQ(line, greedy);
  }
}

TEST(LlamaTasksTest, ServeAnswersACompletionWithTheFullForwardsTokens) {
  GPT2Config cfg;
  const std::string model = LlamaTaskTemp("llama_serve/step_00000004/model.bin");
  const std::vector<float> params = LlamaCheckpoint(model, 50257, &cfg);
  SimulatedClock clock;
  ExecutorOptions options;
  options.results_dir = LlamaTaskTemp("llama_serve_results");
  options.calibration_steps = 1;
  options.clock = &clock;
  const SideTaskSpec serve = {"serve", "serve", "",
                              0,       0,       {{"checkpoint", model}, {"port", int64_t{0}}}};
  absl::StatusOr<std::unique_ptr<SideTaskExecutor>> ex = SideTaskExecutor::Create({serve}, options);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_EQ((*ex)->task_state(0), TaskState::kLoaded) << (*ex)->task_report(0).reason;
  absl::StatusOr<std::string> address = ReadFile(options.results_dir + "/serve_r0/address");
  ASSERT_TRUE(address.ok()) << address.status();
  const int port = std::stoi(address->substr(address->rfind(':') + 1));

  pipeline::Instr bubble;
  bubble.op = pipeline::Op::kBubble;
  bubble.bubble = pipeline::BubbleKind::kSteady;
  auto run_bubble = [&] {  // 20 ms of simulated time
    const double start = clock.Now();
    (*ex)->OnBubble(bubble, 0, start, [&] { return clock.Now() >= start + 0.020; });
    clock.SpinUntil(start + 0.020);
    (*ex)->OnBubbleEnd(0, clock.Now());
  };
  run_bubble();  // measured: nothing runs in a bubble before its first measurement
  std::atomic<bool> answered{false};
  int status = 0;
  std::string body;
  std::thread client([&] {
    httplib::Client http("127.0.0.1", port);
    http.set_read_timeout(120, 0);
    httplib::Result res = http.Post(
        "/v1/completions", R"({"prompt": "And God said", "max_tokens": 5, "temperature": 0})",
        "application/json");
    status = res ? res->status : -1;
    body = res ? res->body : httplib::to_string(res.error());
    answered = true;
  });
  // Real time only bounds the wait for the client (its request reaches the queue on real time);
  // each bubble is simulated.
  const double give_up = MonotonicSeconds() + 60;
  while (!answered && MonotonicSeconds() < give_up) {
    run_bubble();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  client.join();
  (*ex)->Finish();
  ASSERT_EQ(status, 200) << body;
  const nlohmann::json answer = nlohmann::json::parse(body);
  EXPECT_EQ(answer["model"], "step_00000004");
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "length");

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(kDefaultTokenizerPath);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int32_t> context = {kEndOfText};
  const std::vector<int32_t> prompt = *(*tokenizer)->Encode("And God said");
  context.insert(context.end(), prompt.begin(), prompt.end());
  const std::vector<int32_t> tokens = testing::GreedyFromScratch(cfg, params, context, 5);
  EXPECT_EQ(answer["choices"][0]["text"], *(*tokenizer)->Decode(tokens));
}

}  // namespace
}  // namespace freeride
