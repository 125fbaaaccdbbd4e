// The serve task's parts below HTTP: the queue between the network threads and the bubbles
// (capacity, cancelled requests dropped, failure on close, latency percentiles), which hosts
// count as loopback, the arguments Create refuses, and a corrupt checkpoint refused at load.
// serve_http_test.cc has the HTTP side under hostile clients; tests/scripts/serve_pipeline.sh
// serves real requests during a pipeline run.
#include <filesystem>
#include <fstream>
#include <map>

#include "core/checksum.h"
#include "core/clock.h"
#include "core/files.h"
#include "freeride/executor.h"
#include "freeride/side_task.h"
#include "freeride/tasks/serve_http.h"
#include "freeride/tasks/serve_queue.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using serve::Completion;
using serve::Queue;

TEST(ServeQueueTest, HoldsAtMostItsCapacityAndDropsCancelledRequests) {
  Queue queue(2);
  auto a = std::make_shared<Completion>(), b = std::make_shared<Completion>(),
       c = std::make_shared<Completion>();
  EXPECT_TRUE(queue.Push(a));
  EXPECT_TRUE(queue.Push(b));
  EXPECT_FALSE(queue.Push(c));  // full: the handler answers 429
  a->cancelled = true;
  std::vector<std::shared_ptr<Completion>> taken = queue.Take(4);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], b);
  EXPECT_EQ(queue.stats().cancelled, 1);
}

TEST(ServeQueueTest, FinishWakesTheWaiterAndCountsLatency) {
  Queue queue(4);
  for (int i = 1; i <= 100; ++i) {
    auto c = std::make_shared<Completion>();
    c->arrived_s = 0;
    c->first_token_s = 0.001 * i;
    c->generated = {1, 2};
    queue.Finish(c, 0.01 * i);
    EXPECT_TRUE(queue.WaitDone(c, 0));
  }
  const Queue::Stats s = queue.stats();
  EXPECT_EQ(s.responses, 100);
  EXPECT_EQ(s.choices, 100);
  EXPECT_EQ(s.tokens, 200);
  EXPECT_NEAR(s.latency_ms.p50, 510, 1e-9);  // the 51st of 10, 20, ..., 1000 ms
  EXPECT_NEAR(s.latency_ms.p99, 1000, 1e-9);
  EXPECT_NEAR(s.first_token_ms.p95, 96, 1e-9);
}

TEST(ServeQueueTest, PushAllTakesEveryChoiceOrNoneAndEmitWakesStreams) {
  Queue queue(3);
  auto a = std::make_shared<Completion>(), b = std::make_shared<Completion>();
  EXPECT_TRUE(queue.PushAll({a, b}));
  EXPECT_FALSE(queue.PushAll({std::make_shared<Completion>(), std::make_shared<Completion>()}));
  EXPECT_EQ(queue.waiting(), 2u);  // the request that did not fit left nothing behind

  // A stream waits for changes (tokens, done) of any of its choices.
  EXPECT_EQ(queue.WaitChange({a, b}, 0, 0), 0);
  queue.Emit(b, 7);
  EXPECT_EQ(queue.WaitChange({a, b}, 0, 0), 1);
  EXPECT_EQ(queue.Snapshot(b).tokens, std::vector<int32_t>{7});
  EXPECT_FALSE(queue.Snapshot(b).done);
  queue.Finish(a, 1.0);
  EXPECT_EQ(queue.WaitChange({a, b}, 1, 0), 2);
  EXPECT_TRUE(queue.Snapshot(a).done);
}

// `/metrics?format=json` counted 7 served for 6 responses: one of them had two choices.
TEST(ServeQueueTest, ARequestOfSeveralChoicesIsOneResponseOfThoseChoices) {
  Queue queue(8);
  auto a = std::make_shared<Completion>(), b = std::make_shared<Completion>();
  auto single = std::make_shared<Completion>();
  ASSERT_TRUE(queue.PushAll({a, b}));
  ASSERT_TRUE(queue.Push(single));
  queue.Finish(a, 1.0);
  EXPECT_EQ(queue.stats().responses, 0);  // its other choice is still decoding
  EXPECT_EQ(queue.stats().choices, 1);
  queue.Finish(b, 1.0);
  queue.Finish(single, 1.0);
  EXPECT_EQ(queue.stats().responses, 2);
  EXPECT_EQ(queue.stats().choices, 3);
}

TEST(ServeQueueTest, CloseFailsWhatWaitsAndRefusesMore) {
  Queue queue(4);
  auto c = std::make_shared<Completion>();
  ASSERT_TRUE(queue.Push(c));
  queue.Close("stopping", 1.0);
  EXPECT_TRUE(c->done);
  EXPECT_EQ(c->error, "stopping");
  EXPECT_TRUE(queue.closed());
  EXPECT_FALSE(queue.Push(std::make_shared<Completion>()));
  EXPECT_EQ(queue.stats().responses, 0);
  EXPECT_EQ(queue.stats().choices, 0);
}

TEST(ServeTaskTest, LoopbackUnlessAskedAndArgumentsChecked) {
  EXPECT_TRUE(serve::IsLoopback("127.0.0.1"));
  EXPECT_TRUE(serve::IsLoopback("localhost"));
  EXPECT_TRUE(serve::IsLoopback("::1"));
  EXPECT_FALSE(serve::IsLoopback("0.0.0.0"));
  EXPECT_FALSE(serve::IsLoopback("10.1.2.3"));
  auto create = [](TaskArgs args) {
    absl::StatusOr<std::unique_ptr<SideTask>> task = CreateSideTask("serve", "");
    EXPECT_TRUE(task.ok());
    CappedArena arena(1 << 20);
    SideTaskContext ctx{"srv", 0, 0, &args, &arena, ::testing::TempDir(), 0, [] { return false; }};
    return (*task)->Create(ctx);
  };
  const std::string model = "tests/data/gpt2_golden/model.bin";
  EXPECT_TRUE(create({{"checkpoint", model}}).ok());  // Create binds nothing: Load does
  absl::Status remote = create({{"checkpoint", model}, {"host", std::string("0.0.0.0")}});
  EXPECT_NE(remote.message().find("allow_remote = true"), std::string::npos) << remote;
  EXPECT_TRUE(
      create({{"checkpoint", model}, {"host", std::string("0.0.0.0")}, {"allow_remote", true}})
          .ok());
  EXPECT_NE(create({}).message().find("args.checkpoint is required"), std::string::npos);
  EXPECT_NE(create({{"checkpoint", model}, {"prot", int64_t{1}}}).message().find("prot"),
            std::string::npos);
  EXPECT_NE(create({{"checkpoint", model}, {"port", int64_t{70000}}}).message().find("port"),
            std::string::npos);
  EXPECT_TRUE(create({{"checkpoint", model}, {"target_ttft_ms", 500.0}}).ok());
  EXPECT_NE(
      create({{"checkpoint", model}, {"target_ttft_ms", -1.0}}).message().find("target_ttft_ms"),
      std::string::npos);
}

// Bubbles of 20 ms on `clock`; the tasks' states by name afterwards.
std::map<std::string, std::string> StatesAfterBubbles(SideTaskExecutor& ex, Clock& clock) {
  pipeline::Instr bubble;
  bubble.op = pipeline::Op::kBubble;
  bubble.bubble = pipeline::BubbleKind::kSteady;
  for (int i = 0; i < 5; ++i) {
    const double start = clock.Now();
    ex.OnBubble(bubble, 0, start, [&] { return clock.Now() >= start + 0.020; });
    clock.SpinUntil(start + 0.020);
    ex.OnBubbleEnd(0, clock.Now());
  }
  std::map<std::string, std::string> states;
  for (const TaskReport& t : ex.Report().tasks) states[t.name] = t.state + " " + t.reason;
  return states;
}

TEST(ServeTaskTest, ACheckpointThatDoesNotMatchItsManifestFailsTheTaskByName) {
  // A checkpoint directory: the golden model as its model.bin, and a manifest with its checksum.
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "serve_checkpoints" / "step_00000010";
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "model.bin").string();
  std::filesystem::copy_file("tests/data/gpt2_golden/model.bin", model,
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<FileChecksum> sum = ChecksumFile(model);
  ASSERT_TRUE(sum.ok()) << sum.status();
  ASSERT_TRUE(WriteFileAtomically((dir / "manifest.json").string(),
                                  "{\"format\": \"freeride-checkpoint\", \"checksums\": "
                                  "{\"model.bin\": {\"bytes\": " +
                                      std::to_string(sum->bytes) + ", \"crc32c\": \"" +
                                      Crc32cHex(sum->crc32c) + "\"}}}\n")
                  .ok());
  const std::vector<SideTaskSpec> specs = {
      {"serve", "serve", "", 0, 0, {{"checkpoint", model}, {"port", int64_t{0}}}},
      {"spin", "spin", "", 0, 0, {{"step_ms", 1.0}}}};
  ExecutorOptions options;
  options.results_dir = (std::filesystem::path(::testing::TempDir()) / "serve_results").string();
  options.calibration_steps = 1;
  auto run = [&] {
    SimulatedClock clock;
    options.clock = &clock;
    absl::StatusOr<std::unique_ptr<SideTaskExecutor>> ex = SideTaskExecutor::Create(specs, options);
    EXPECT_TRUE(ex.ok()) << ex.status();  // a task's failed load never stops the run
    return ex.ok() ? StatesAfterBubbles(**ex, clock) : std::map<std::string, std::string>{};
  };
  // As written: served.
  std::map<std::string, std::string> states = run();
  EXPECT_EQ(states["serve"].rfind("LOADED", 0), 0u) << states["serve"];

  // 4 KiB overwritten inside the weights: the task FAILS naming the file; the other runs on.
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 << 10);
    const std::string junk(4096, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  states = run();
  EXPECT_EQ(states["serve"].rfind("FAILED load: " + model + ": checksum mismatch", 0), 0u)
      << states["serve"];
  EXPECT_EQ(states["spin"].rfind("LOADED", 0), 0u) << states["spin"];
}

}  // namespace
}  // namespace freeride
