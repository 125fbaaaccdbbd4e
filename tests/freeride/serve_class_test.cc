// Classes of side work: a latency-sensitive task (a server) with requests waiting runs before
// every throughput task, a fill job included, whatever their priorities, and
// freeride.serve_reserve of the bubble is kept for it; the serve task counts how many requests
// met its target time to first token. On simulated time, so every figure is exact (to the
// filler's µs polls: 2 µs).
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/clock.h"
#include "core/files.h"
#include "core/timer.h"
#include "freeride/executor.h"
#include "freeride/side_task.h"
#include "freeride/task_host.h"
#include "freeride/tasks/serve_metrics.h"
#include "freeride/tasks/serve_queue.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

SimulatedClock& ServeClassClock() {
  static SimulatedClock clock;
  return clock;
}

// What the test server's clients asked: `requests` of one step each, waiting from `arrives_at`
// on the test clock.
struct Clients {
  int requests = 0;
  double arrives_at = 0;
};
Clients& TheClients() {
  static Clients clients;
  return clients;
}

// A latency-sensitive task: each step serves one waiting request in `step_ms`, or, with none,
// waits as long for one and says it only waited.
class TestServer : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    absl::StatusOr<double> step = ArgReader(ctx.name, *ctx.args).Number("step_ms", 1, 0.01, 1e3);
    if (!step.ok()) return step.status();
    step_s_ = *step / 1e3;
    clock_ = ctx.clock;
    return absl::OkStatus();
  }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    const bool work = HasPendingWork();
    ctx.clock->Busy(step_s_);
    if (!work) {
      ctx.idle = true;
      return 0.0;
    }
    --TheClients().requests;
    return 1.0;
  }
  bool LatencySensitive() const override { return true; }
  bool HasPendingWork() const override {
    return TheClients().requests > 0 && clock_->Now() >= TheClients().arrives_at;
  }

 private:
  double step_s_ = 1e-3;
  Clock* clock_ = nullptr;
};
FREERIDE_REGISTER_SIDE_TASK(TestServer, "test_server");

// A throughput task that runs until its deadline or the ready input, as a worker does.
class TestFiller : public SideTask {
 public:
  absl::Status Create(SideTaskContext&) override { return absl::OkStatus(); }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    while (ctx.clock->Now() < ctx.deadline_s && !ctx.input_ready()) ctx.clock->Busy(1e-6);
    return 1.0;
  }
  bool FillsBubble() const override { return true; }
};
FREERIDE_REGISTER_SIDE_TASK(TestFiller, "test_filler");

std::unique_ptr<SideTaskExecutor> MakeServeClassExecutor(const std::vector<SideTaskSpec>& specs,
                                                         double serve_reserve = 0) {
  TheClients() = {};
  ExecutorOptions options;
  options.results_dir = ::testing::TempDir() + "/serve_class_results";
  options.margin = 0.1;
  options.serve_reserve = serve_reserve;
  options.clock = &ServeClassClock();
  auto ex = SideTaskExecutor::Create(specs, options);
  EXPECT_TRUE(ex.ok()) << ex.status();
  return ex.ok() ? *std::move(ex) : nullptr;
}

SideTaskSpec Server(double step_ms, int64_t priority = 0) {
  return {"test_server", "server", "", priority, 0, {{"step_ms", step_ms}}};
}
SideTaskSpec Filler(int64_t priority) { return {"test_filler", "filler", "", priority, 0, {}}; }
SideTaskSpec Spin(double step_ms, int64_t priority) {
  return {"spin", "spin", "", priority, 0, {{"step_ms", step_ms}}};
}

// One bubble of `length_s` at index 0 whose input lands at its end (polled), or, with
// `pollable` false, one that ends at a sum; returns when it began.
double ServeBubble(SideTaskExecutor& ex, double length_s, bool pollable = true) {
  pipeline::Instr bubble;
  bubble.op = pipeline::Op::kBubble;
  bubble.bubble = pipeline::BubbleKind::kSteady;
  SimulatedClock& clock = ServeClassClock();
  const double start = clock.Now();
  std::function<bool()> ready;
  if (pollable) ready = [&] { return clock.Now() >= start + length_s - 1e-12; };
  ex.OnBubble(bubble, 0, start, ready);
  clock.SpinUntil(start + length_s);
  ex.OnBubbleEnd(0, std::max(clock.Now(), start + length_s));
  return start;
}

// The steps of task `id` that began in the bubble that started at `start`, as (begin, end) in
// ms from it.
std::vector<std::pair<double, double>> StepsOf(const SideTaskExecutor& ex, int id, double start) {
  std::vector<std::pair<double, double>> out;
  for (const SideStepEvent& e : ex.events()) {
    if (e.task == id && e.start_s >= start - 1e-12) {
      out.push_back({(e.start_s - start) * 1e3, (e.end_s - start) * 1e3});
    }
  }
  return out;
}

TEST(ServeClassTest, WaitingRequestsGoAheadOfAHigherPriorityTaskAndFillJob) {
  // Before classes, the fill job (priority 9) took every bubble, and the request waited for
  // as long as it ran.
  auto ex = MakeServeClassExecutor({Spin(1.0, 2), Server(1.0, 0)});
  absl::StatusOr<int> job = ex->AddTask(Filler(9), ::testing::TempDir() + "/serve_class_job");
  ASSERT_TRUE(job.ok()) << job.status();
  ServeBubble(*ex, 0.010);  // measured
  TheClients() = {3, ServeClassClock().Now()};
  const double start = ServeBubble(*ex, 0.010);
  const std::vector<std::pair<double, double>> served = StepsOf(*ex, 1, start);
  ASSERT_EQ(served.size(), 3u);
  EXPECT_NEAR(served[0].first, 0, 1e-9);  // first, though the lowest priority
  EXPECT_NEAR(served[2].second, 3, 1e-9);
  EXPECT_EQ(TheClients().requests, 0);
  // Then, with none waiting, the job has the rest of the bubble, by its priority: to the
  // reserve's start (one server step before the deadline, 8 ms), where it finds none waiting,
  // and on.
  const std::vector<std::pair<double, double>> filled = StepsOf(*ex, *job, start);
  ASSERT_EQ(filled.size(), 2u);
  EXPECT_NEAR(filled[0].first, 3, 1e-9);
  EXPECT_NEAR(filled[0].second, 8, 2e-3);
  EXPECT_NEAR(filled[1].second, 10, 2e-3);
  EXPECT_TRUE(StepsOf(*ex, 0, start).empty());
}

TEST(ServeClassTest, WaitingRequestsAreServedInPlainBlocksAndBubblesTheGuardLeavesOut) {
  // Before, a plain block (the overhead's reference) or the guard's paused level ran nothing:
  // a request waited out the whole block, 2.5-10 s beside a busy host against a 1 s target.
  auto ex = MakeServeClassExecutor({Spin(1.0, 5), Server(1.0, 0)});
  ServeBubble(*ex, 0.010);  // measured
  ex->set_harvesting(false);
  TheClients() = {2, ServeClassClock().Now()};
  double start = ServeBubble(*ex, 0.010);
  EXPECT_EQ(StepsOf(*ex, 1, start).size(), 2u);
  EXPECT_TRUE(StepsOf(*ex, 0, start).empty());  // no throughput work in a plain block
  EXPECT_EQ(TheClients().requests, 0);
  start = ServeBubble(*ex, 0.010);  // none waiting: nothing runs
  EXPECT_TRUE(StepsOf(*ex, 0, start).empty());
  EXPECT_TRUE(StepsOf(*ex, 1, start).empty());
  // "Fewer bubbles": throughput work in every other bubble, on half of it; waiting requests
  // in each, on all of it.
  ex->set_harvesting(true);
  ex->set_offer(0.5, 2);
  TheClients() = {100, ServeClassClock().Now()};
  const double first = ServeBubble(*ex, 0.010);
  const double second = ServeBubble(*ex, 0.010);
  const size_t served_both = StepsOf(*ex, 1, first).size();
  const size_t served_second = StepsOf(*ex, 1, second).size();
  EXPECT_EQ(served_second, 9u);  // 1 ms steps to the deadline, 9 ms
  EXPECT_EQ(served_both - served_second, 9u);
  TheClients() = {};
  const double third = ServeBubble(*ex, 0.010);
  const double fourth = ServeBubble(*ex, 0.010);
  const size_t spun_both = StepsOf(*ex, 0, third).size();
  const size_t spun_fourth = StepsOf(*ex, 0, fourth).size();
  // 1 ms steps in half of the 9 ms, in one of the two bubbles.
  EXPECT_EQ(spun_both, 4u);
  EXPECT_TRUE(spun_fourth == 0u || spun_fourth == 4u) << spun_fourth;
}

TEST(ServeClassTest, ThroughputWorkStopsAtTheReserveWhereRequestsWait) {
  // 10 ms predicted, margin 0.1: side work until 9 ms; serve_reserve = 0.3 keeps 3 ms, from 6.
  auto ex = MakeServeClassExecutor({Filler(5), Server(1.0, 0)}, 0.3);
  ServeBubble(*ex, 0.010);
  // Two requests arrive at 2 ms, while the filler runs: they are served from the reserve's
  // start, in the same bubble; then the filler has the rest again.
  TheClients() = {2, ServeClassClock().Now() + 0.002};
  double start = ServeBubble(*ex, 0.010);
  std::vector<std::pair<double, double>> filled = StepsOf(*ex, 0, start);
  std::vector<std::pair<double, double>> served = StepsOf(*ex, 1, start);
  ASSERT_EQ(filled.size(), 2u);
  EXPECT_NEAR(filled[0].second, 6, 2e-3);
  ASSERT_EQ(served.size(), 2u);
  EXPECT_NEAR(served[0].first, filled[0].second, 1e-9);
  EXPECT_NEAR(served[1].second, 8, 2e-3);
  EXPECT_NEAR(filled[1].first, 8, 2e-3);
  EXPECT_EQ(TheClients().requests, 0);

  // With no request the reserve is not kept: the filler looks at the reserve's start, finds
  // none waiting, and goes on to the bubble's end. (The bubble is now predicted a µs short:
  // the filler saw the input a poll late.)
  start = ServeBubble(*ex, 0.010);
  filled = StepsOf(*ex, 0, start);
  ASSERT_EQ(filled.size(), 2u);
  EXPECT_NEAR(filled[0].second, 6, 2e-2);
  EXPECT_NEAR(filled[1].second, 10, 2e-3);
  EXPECT_TRUE(StepsOf(*ex, 1, start).empty());
}

TEST(ServeClassTest, ByDefaultOneServeStepIsKeptFromThroughputSteps) {
  // serve_reserve = 0: the reserve is one predicted step of the server, 2 ms. A request comes
  // at 7.5 ms, too late for a 2 ms step before the deadline (9 ms): the spin task, whose 1 ms
  // steps would fit, starts none into the reserve while it waits.
  auto ex = MakeServeClassExecutor({Spin(1.0, 5), Server(2.0, 0)});
  ServeBubble(*ex, 0.010, /*pollable=*/false);
  TheClients() = {1, ServeClassClock().Now() + 0.0075};
  const double start = ServeBubble(*ex, 0.010, /*pollable=*/false);
  const std::vector<std::pair<double, double>> spun = StepsOf(*ex, 0, start);
  ASSERT_EQ(spun.size(), 8u);  // 0 to 8 ms; before classes, 9
  EXPECT_NEAR(spun.back().second, 8, 2e-3);
  EXPECT_TRUE(StepsOf(*ex, 1, start).empty());
  EXPECT_EQ(TheClients().requests, 1);  // for the next bubble, first
}

TEST(ServeClassTest, ARequestUnderAPriorityFillJobMeetsItsTarget) {
  // The issue's case: a fill job submitted with --priority 2 beside a serve task of priority
  // 0, whose 1 ms steps fit every 20 ms bubble.
  SimulatedClock clock;
  ExecutorOptions options;
  options.results_dir = ::testing::TempDir() + "/serve_class_target";
  options.calibration_steps = 1;
  options.clock = &clock;
  const SideTaskSpec serve = {"serve",
                              "serve",
                              "",
                              0,
                              0,
                              {{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")},
                               {"port", int64_t{0}},
                               {"target_ttft_ms", 60000.0}}};
  absl::StatusOr<std::unique_ptr<SideTaskExecutor>> ex = SideTaskExecutor::Create({serve}, options);
  ASSERT_TRUE(ex.ok()) << ex.status();
  ASSERT_TRUE((*ex)->AddTask(Spin(1.0, 2), options.results_dir).ok());
  ASSERT_EQ((*ex)->task_state(0), TaskState::kLoaded) << (*ex)->task_report(0).reason;
  absl::StatusOr<std::string> address = ReadFile(options.results_dir + "/serve_r0/address");
  ASSERT_TRUE(address.ok()) << address.status();
  const int port = std::stoi(address->substr(address->rfind(':') + 1));

  httplib::Client http("127.0.0.1", port);
  auto metric = [&](const char* name) {
    httplib::Result res = http.Get("/metrics?format=json");
    return res ? nlohmann::json::parse(res->body)[name] : nlohmann::json();
  };
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
  run_bubble();
  std::atomic<bool> answered{false};
  int status = 0;
  std::string body;
  std::thread client([&] {
    httplib::Client http("127.0.0.1", port);
    http.set_read_timeout(120, 0);
    httplib::Result res =
        http.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 3})", "application/json");
    status = res ? res->status : -1;
    body = res ? res->body : httplib::to_string(res.error());
    answered = true;
  });
  // Once the request waits in the queue, the next bubble serves it, whole: on simulated time
  // its decoding takes none of the bubble. Before classes it waited, through bubble after
  // bubble, for a gap the job's steps left.
  const double give_up = MonotonicSeconds() + 60;
  while (metric("queue") != 1 && MonotonicSeconds() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(metric("queue"), 1);
  run_bubble();
  EXPECT_EQ(metric("requests_served"), 1);
  EXPECT_EQ((*ex)->task_report(0).steps, 1);
  // Past a failure above, on until the client has its answer.
  while (!answered && MonotonicSeconds() < give_up) run_bubble();
  client.join();
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(metric("target_ttft_ms"), 60000.0);
  EXPECT_EQ(metric("ttft_target_met"), 1);
  EXPECT_EQ(metric("ttft_target_missed"), 0);
  (*ex)->Finish();
}

TEST(ServeClassTest, AWorkerRelaysItsClass) {
  HostOptions options;
  options.results_dir = ::testing::TempDir() + "/serve_class_worker";
  ASSERT_TRUE(MakeDirectories(options.results_dir).ok());
  const SideTaskSpec serve = {
      "serve",
      "serve",
      "",
      0,
      0,
      {{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")}, {"port", int64_t{0}}},
      "process"};
  absl::StatusOr<std::unique_ptr<TaskHost>> host = MakeTaskHost(serve, options);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE((*host)->Create().ok());
  EXPECT_TRUE((*host)->latency_sensitive());
  ASSERT_TRUE((*host)->Load().ok());
  const HostStep step = (*host)->Step(MonotonicSeconds() + 10, [] { return false; });
  EXPECT_EQ(step.kind, HostStep::Kind::kDone) << step.reason;
  EXPECT_TRUE(step.idle);
  EXPECT_FALSE((*host)->has_pending_work());  // no request came
  (*host)->Release();

  SideTaskSpec spin = Spin(1.0, 0);
  spin.isolation = "process";
  absl::StatusOr<std::unique_ptr<TaskHost>> other = MakeTaskHost(spin, options);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Create().ok());
  EXPECT_FALSE((*other)->latency_sensitive());
  (*other)->Release();
}

TEST(ServeClassTest, TheQueueCountsRequestsThatMetTheTargetTimeToFirstToken) {
  serve::Queue queue(8, /*target_ttft_ms=*/100);
  for (const double first_token_s : {0.050, 0.100, 0.250}) {
    auto c = std::make_shared<serve::Completion>();
    c->arrived_s = 10;
    c->first_token_s = 10 + first_token_s;
    c->generated = {1};
    queue.Finish(c, 11);
  }
  queue.Finish(std::make_shared<serve::Completion>(), 11, "the task stopped");  // not served
  const serve::Queue::Stats s = queue.stats();
  EXPECT_EQ(s.target_ttft_ms, 100);
  EXPECT_EQ(s.ttft_met, 2);
  EXPECT_EQ(s.ttft_missed, 1);

  serve::Metrics metrics;
  serve::Gauges g;
  g.target_ttft_ms = s.target_ttft_ms, g.ttft_met = s.ttft_met, g.ttft_missed = s.ttft_missed;
  const std::string text = metrics.Prometheus(g);
  EXPECT_NE(text.find("freeride_serve_ttft_target_seconds 0.1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("freeride_serve_ttft_target_total{result=\"met\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("freeride_serve_ttft_target_total{result=\"missed\"} 1\n"),
            std::string::npos);
  // No target: no target lines, and nothing counted against one.
  serve::Queue untargeted(8);
  EXPECT_EQ(metrics.Prometheus(serve::Gauges{}).find("ttft_target"), std::string::npos);
  EXPECT_EQ(untargeted.stats().ttft_met + untargeted.stats().ttft_missed, 0);
}

}  // namespace
}  // namespace freeride
