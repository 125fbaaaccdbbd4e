// The head's losses read once a step: a chunk keeps the losses of ForwardKeepingLoss and
// TakeLosses hands back their sum with the bits a sum of Forward's returns has; the executor
// runs its forwards that way and takes the losses once a step (a device backend then waits
// for them once, not once a micro-batch), waiting for the device after each compute
// instruction only when its timeline must be exact.
#include <bit>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu_stage_model.h"
#include "pipeline/comm/transport.h"
#include "pipeline/generators.h"
#include "pipeline/stage_executor.h"

namespace freeride {
namespace {

GPT2Config TinyLossModel() {
  absl::StatusOr<GPT2Config> c = MakeGPT2Config(/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/4,
                                                /*max_seq_len=*/8, /*vocab_size=*/16);
  EXPECT_TRUE(c.ok());
  return *c;
}

constexpr int64_t kB = 2, kT = 4;

// Micro-batch k's tokens and targets: different for each k, so the losses differ.
std::vector<int32_t> Tokens(int k, int shift) {
  std::vector<int32_t> t(kB * kT);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((3 * i + 5 * k + shift) % 16);
  return t;
}

TEST(CpuStageModelLossTest, KeptLossesSumLikeForwardsReturns) {
  const GPT2Config cfg = TinyLossModel();
  CpuStageModel keeping(cfg, WholeModel(cfg), kB, kT, 1),
      returning(cfg, WholeModel(cfg), kB, kT, 1);
  ASSERT_TRUE(keeping.InitRandom(3).ok());
  ASSERT_TRUE(returning.InitRandom(3).ok());
  double expected = 0;
  for (int k = 0; k < 3; ++k) {
    const std::vector<int32_t> tokens = Tokens(k, 0), targets = Tokens(k, 1);
    for (CpuStageModel* m : {&keeping, &returning}) {
      ASSERT_TRUE(m->SetTokens(0, tokens.data()).ok());
      ASSERT_TRUE(m->SetTargets(0, targets.data()).ok());
    }
    absl::StatusOr<double> loss = returning.Forward(0);
    ASSERT_TRUE(loss.ok());
    expected += *loss;
    ASSERT_TRUE(keeping.ForwardKeepingLoss(0, std::nullopt).ok());
  }
  absl::StatusOr<double> kept = keeping.TakeLosses();
  ASSERT_TRUE(kept.ok());
  EXPECT_GT(expected, 0);
  EXPECT_EQ(std::bit_cast<uint64_t>(*kept), std::bit_cast<uint64_t>(expected));
  // Taken means forgotten.
  absl::StatusOr<double> again = keeping.TakeLosses();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0.0);
}

// A CPU chunk that counts how the executor reaches its losses and the device.
class CountingChunk final : public StageModel {
 public:
  CountingChunk(const GPT2Config& cfg, int slots) : m_(cfg, WholeModel(cfg), kB, kT, slots) {}
  int forwards_returning = 0, forwards_keeping = 0, takes_with_losses = 0, drains = 0;
  int kept_since_take = 0;

  const ParamLayout& layout() const override { return m_.layout(); }
  int64_t micro_batch() const override { return m_.micro_batch(); }
  int64_t seq_len() const override { return m_.seq_len(); }
  int slots() const override { return m_.slots(); }
  std::string Describe() const override { return "counting " + m_.Describe(); }
  absl::Status SetTokens(int s, const int32_t* t) override { return m_.SetTokens(s, t); }
  absl::Status SetTargets(int s, const int32_t* t) override { return m_.SetTargets(s, t); }
  absl::Status SetInputActivations(int s, const void* x) override {
    return m_.SetInputActivations(s, x);
  }
  absl::Status SetOutputGrad(int s, const void* dy) override { return m_.SetOutputGrad(s, dy); }
  absl::Status GetOutputActivations(int s, void* y) override {
    return m_.GetOutputActivations(s, y);
  }
  absl::Status GetInputGrad(int s, void* dx) override { return m_.GetInputGrad(s, dx); }
  absl::Status GetLogitsAt(int s, int64_t p, float* l) override { return m_.GetLogitsAt(s, p, l); }
  absl::StatusOr<double> Forward(int s) override {
    ++forwards_returning;
    return m_.Forward(s);
  }
  absl::Status ForwardKeepingLoss(int s, std::optional<float> scale) override {
    ++forwards_keeping;
    ++kept_since_take;
    return m_.ForwardKeepingLoss(s, scale);
  }
  absl::StatusOr<double> TakeLosses() override {
    if (kept_since_take > 0) ++takes_with_losses;
    kept_since_take = 0;
    return m_.TakeLosses();
  }
  absl::Status Drain() override {
    ++drains;
    return m_.Drain();
  }
  absl::Status BackwardInput(int s, float scale) override { return m_.BackwardInput(s, scale); }
  absl::Status BackwardWeight(int s) override { return m_.BackwardWeight(s); }
  absl::Status ZeroGrads() override { return m_.ZeroGrads(); }
  absl::Status FoldHeadWteGrad() override { return m_.FoldHeadWteGrad(); }
  void SetHeadGradInBackwardInput(bool in) override { m_.SetHeadGradInBackwardInput(in); }
  absl::StatusOr<float*> HostGrads(int64_t o, int64_t n) override { return m_.HostGrads(o, n); }
  absl::Status CommitHostGrads(int64_t o, int64_t n) override { return m_.CommitHostGrads(o, n); }
  absl::StatusOr<std::vector<double>> GradSquaresByUnit() override {
    return m_.GradSquaresByUnit();
  }
  absl::Status ApplyAdamW(const AdamWStep& step) override { return m_.ApplyAdamW(step); }
  absl::Status GetParams(float* dst) override { return m_.GetParams(dst); }
  absl::Status SetParams(const float* src) override { return m_.SetParams(src); }
  absl::Status GetOptimizerState(float* m, float* v) override { return m_.GetOptimizerState(m, v); }
  absl::Status SetOptimizerState(const float* m, const float* v) override {
    return m_.SetOptimizerState(m, v);
  }
  absl::Status InitRandom(uint64_t seed) override { return m_.InitRandom(seed); }

 private:
  CpuStageModel m_;
};

struct StepRun {
  std::vector<double> losses;
  int compute_instructions = 0;
};

// Two steps of one stage, m = 4 micro-batches, ZB-H1 (F, I and W apart): the executor's
// losses, and its compute instructions.
StepRun RunSteps(CountingChunk* chunk, bool exact_timeline, int m) {
  pipeline::ScheduleOptions o;
  o.kind = pipeline::ScheduleKind::kZBH1;
  o.stages = 1;
  o.microbatches = m;
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(o);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  StepRun run;
  for (const pipeline::Instr& in : schedule->per_stage[0]) {
    run.compute_instructions +=
        in.op == pipeline::Op::kForward || in.op == pipeline::Op::kBackward ||
        in.op == pipeline::Op::kBackwardInput || in.op == pipeline::Op::kBackwardWeight;
  }
  std::unique_ptr<pipeline::Transport> self = pipeline::MakeSelfTransport();
  pipeline::StageExecutor executor(*schedule, pipeline::RankLayout{}, {chunk}, self.get(), 10,
                                   pipeline::OptimizerHooks{});
  executor.set_exact_timeline(exact_timeline);
  std::vector<std::vector<int32_t>> tokens, targets;
  for (int k = 0; k < m; ++k) {
    tokens.push_back(Tokens(k, 0));
    targets.push_back(Tokens(k, 1));
  }
  pipeline::MicrobatchData data;
  data.tokens = [&](int k) { return tokens[k].data(); };
  data.targets = [&](int k) { return targets[k].data(); };
  data.rows = kB * kT;
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<pipeline::StepOutcome> out = executor.RunStep(data, 1.0f / (m * kB * kT));
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok()) run.losses.push_back(out->loss);
  }
  return run;
}

TEST(StageExecutorLossTest, ReadsTheHeadsLossesOnceAStep) {
  const GPT2Config cfg = TinyLossModel();
  constexpr int m = 4;
  CountingChunk chunk(cfg, /*slots=*/m);
  ASSERT_TRUE(chunk.InitRandom(5).ok());
  const StepRun run = RunSteps(&chunk, /*exact_timeline=*/false, m);
  EXPECT_EQ(chunk.forwards_returning, 0);
  EXPECT_EQ(chunk.forwards_keeping, 2 * m);
  EXPECT_EQ(chunk.takes_with_losses, 2);  // once a step
  EXPECT_EQ(chunk.drains, 0);             // one stage has no BUBBLE to drain for
  // The step's loss: the mean of its micro-batches' Forward losses, the same bits (no update
  // runs without optimizer hooks, so both steps see the same weights).
  CpuStageModel reference(cfg, WholeModel(cfg), kB, kT, 1);
  ASSERT_TRUE(reference.InitRandom(5).ok());
  double sum = 0;
  for (int k = 0; k < m; ++k) {
    const std::vector<int32_t> tokens = Tokens(k, 0), targets = Tokens(k, 1);
    ASSERT_TRUE(reference.SetTokens(0, tokens.data()).ok());
    ASSERT_TRUE(reference.SetTargets(0, targets.data()).ok());
    absl::StatusOr<double> loss = reference.Forward(0);
    ASSERT_TRUE(loss.ok());
    sum += *loss;
  }
  ASSERT_EQ(run.losses.size(), 2u);
  for (double loss : run.losses) {
    EXPECT_EQ(std::bit_cast<uint64_t>(loss), std::bit_cast<uint64_t>(sum / m));
  }
}

TEST(StageExecutorLossTest, ExactTimelineDrainsAfterEachComputeInstruction) {
  const GPT2Config cfg = TinyLossModel();
  constexpr int m = 3;
  CountingChunk exact(cfg, m), queued(cfg, m);
  ASSERT_TRUE(exact.InitRandom(5).ok());
  ASSERT_TRUE(queued.InitRandom(5).ok());
  const StepRun with = RunSteps(&exact, /*exact_timeline=*/true, m);
  const StepRun without = RunSteps(&queued, /*exact_timeline=*/false, m);
  EXPECT_EQ(with.compute_instructions, 3 * m);  // F, I and W of each micro-batch
  EXPECT_EQ(exact.drains, 2 * with.compute_instructions);
  EXPECT_EQ(queued.drains, 0);
  // Waiting changes nothing computed.
  ASSERT_EQ(with.losses.size(), 2u);
  ASSERT_EQ(without.losses.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(with.losses[i]), std::bit_cast<uint64_t>(without.losses[i]));
  }
}

}  // namespace
}  // namespace freeride
