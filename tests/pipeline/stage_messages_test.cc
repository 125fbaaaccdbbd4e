// The stage executor's messages: of the element type its chunks report, in memory the chunks
// allocated (once), and never received into while a chunk may still be reading them.
#include <cmath>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "core/status.h"
#include "gtest/gtest.h"
#include "models/cpu_stage_model.h"
#include "pipeline/comm/transport.h"
#include "pipeline/generators.h"
#include "pipeline/stage_executor.h"

namespace freeride {
namespace {

// A CPU chunk whose messages are of `type`: what a CUDA chunk of that precision reports. It
// records the buffers it allocated, those handed to it, and the messages it may still be
// reading (until FinishMessageReads), as a CUDA chunk's asynchronous copies would be.
class MessageChunk final : public StageModel {
 public:
  MessageChunk(const GPT2Config& config, const StageSpec& stage, int64_t micro_batch,
               int64_t seq_len, int slots, MessageType type)
      : cpu_(config, stage, micro_batch, seq_len, slots),
        type_(type),
        values_(micro_batch * seq_len * config.n_embd) {}

  int allocations = 0;
  int foreign_buffers = 0;  // message pointers handed in that this chunk did not allocate
  std::set<const void*> allocated, unread;

  MessageType message_type() const override { return type_; }
  absl::StatusOr<MessageBuffer> AllocateMessageBuffer(MessageMemory /*memory*/) override {
    ++allocations;
    MessageBuffer buffer = AllocateHostMessage(MessageBytes());
    allocated.insert(buffer.get());
    return buffer;
  }
  absl::Status SetInputActivations(int slot, const void* x) override {
    Received(x);
    FromMessage(type_, x, MessageElements(), values_.data());
    return cpu_.SetInputActivations(slot, values_.data());
  }
  absl::Status SetOutputGrad(int slot, const void* dy) override {
    Received(dy);
    FromMessage(type_, dy, MessageElements(), values_.data());
    return cpu_.SetOutputGrad(slot, values_.data());
  }
  absl::Status FinishMessageReads() override {
    unread.clear();
    return absl::OkStatus();
  }
  absl::Status GetOutputActivations(int slot, void* y) override {
    Known(y);
    FR_RETURN_IF_ERROR(cpu_.GetOutputActivations(slot, values_.data()));
    ToMessage(type_, values_.data(), MessageElements(), y);
    return absl::OkStatus();
  }
  absl::Status GetInputGrad(int slot, void* dx) override {
    Known(dx);
    FR_RETURN_IF_ERROR(cpu_.GetInputGrad(slot, values_.data()));
    ToMessage(type_, values_.data(), MessageElements(), dx);
    return absl::OkStatus();
  }

  const ParamLayout& layout() const override { return cpu_.layout(); }
  int64_t micro_batch() const override { return cpu_.micro_batch(); }
  int64_t seq_len() const override { return cpu_.seq_len(); }
  int slots() const override { return cpu_.slots(); }
  std::string Describe() const override { return "message test chunk"; }
  absl::Status SetTokens(int slot, const int32_t* t) override { return cpu_.SetTokens(slot, t); }
  absl::Status SetTargets(int slot, const int32_t* t) override { return cpu_.SetTargets(slot, t); }
  absl::Status GetLogitsAt(int slot, int64_t position, float* logits) override {
    return cpu_.GetLogitsAt(slot, position, logits);
  }
  absl::StatusOr<double> Forward(int slot) override { return cpu_.Forward(slot); }
  absl::Status ForwardKeepingLoss(int slot, std::optional<float> scale) override {
    return cpu_.ForwardKeepingLoss(slot, scale);
  }
  absl::StatusOr<double> TakeLosses() override { return cpu_.TakeLosses(); }
  absl::Status Drain() override { return cpu_.Drain(); }
  absl::Status BackwardInput(int slot, float scale) override {
    return cpu_.BackwardInput(slot, scale);
  }
  absl::Status BackwardWeight(int slot) override { return cpu_.BackwardWeight(slot); }
  absl::Status ZeroGrads() override { return cpu_.ZeroGrads(); }
  absl::Status FoldHeadWteGrad() override { return cpu_.FoldHeadWteGrad(); }
  void SetHeadGradInBackwardInput(bool in_input) override {
    cpu_.SetHeadGradInBackwardInput(in_input);
  }
  absl::StatusOr<float*> HostGrads(int64_t offset, int64_t n) override {
    return cpu_.HostGrads(offset, n);
  }
  absl::Status CommitHostGrads(int64_t offset, int64_t n) override {
    return cpu_.CommitHostGrads(offset, n);
  }
  absl::StatusOr<std::vector<double>> GradSquaresByUnit() override {
    return cpu_.GradSquaresByUnit();
  }
  absl::Status ApplyAdamW(const AdamWStep& step) override { return cpu_.ApplyAdamW(step); }
  absl::Status GetParams(float* dst) override { return cpu_.GetParams(dst); }
  absl::Status SetParams(const float* src) override { return cpu_.SetParams(src); }
  absl::Status GetOptimizerState(float* m, float* v) override {
    return cpu_.GetOptimizerState(m, v);
  }
  absl::Status SetOptimizerState(const float* m, const float* v) override {
    return cpu_.SetOptimizerState(m, v);
  }
  absl::Status InitRandom(uint64_t seed) override { return cpu_.InitRandom(seed); }

 private:
  void Known(const void* p) { foreign_buffers += allocated.count(p) == 0 ? 1 : 0; }
  void Received(const void* p) {
    Known(p);
    unread.insert(p);
  }
  CpuStageModel cpu_;
  MessageType type_;
  std::vector<float> values_;
};

// Passes everything on; records the bytes of each send, and receives posted into a buffer a
// chunk of this rank may still be reading.
class RecordingTransport final : public pipeline::Transport {
 public:
  RecordingTransport(Transport* inner, std::vector<MessageChunk*> chunks)
      : inner_(inner), chunks_(std::move(chunks)) {}
  std::vector<int64_t> sent_bytes;
  int receives_into_unread = 0;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override {
    sent_bytes.push_back(bytes);
    return inner_->Isend(data, bytes, peer, tag);
  }
  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override {
    for (MessageChunk* c : chunks_) receives_into_unread += c->unread.count(data);
    return inner_->Irecv(data, bytes, peer, tag);
  }
  absl::Status Wait(Request r, double timeout_s) override { return inner_->Wait(r, timeout_s); }
  bool Test(Request r) override { return inner_->Test(r); }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double t) override {
    return inner_->AllReduceSum(d, n, g, t);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double t) override {
    return inner_->AllReduceSum(d, n, g, t);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    return inner_->StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    return inner_->StartAllReduceSum(d, n, g);
  }

 private:
  Transport* inner_;
  std::vector<MessageChunk*> chunks_;
};

constexpr int64_t kMsgB = 2, kMsgT = 8, kMicrobatches = 4, kSteps = 3;

GPT2Config TinyMessageModel() { return *MakeGPT2Config(4, 2, 16, kMsgT, 64); }

pipeline::Schedule TwoStage1F1B() {
  pipeline::ScheduleOptions options;
  options.stages = 2;
  options.microbatches = static_cast<int>(kMicrobatches);
  absl::StatusOr<pipeline::Schedule> s = pipeline::BuildSchedule(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

struct MessageRun {
  std::vector<double> losses;
  std::vector<int64_t> sent_bytes;  // both ranks'
  int allocations_after_first_step = 0, allocations = 0, foreign_buffers = 0;
  int receives_into_unread = 0;
};

// kSteps steps of a 2-stage 1F1B pipeline of MessageChunks of `type`, ranks as threads
// (no optimizer: each step the same weights).
MessageRun TrainTwoStages(MessageType type) {
  const GPT2Config config = TinyMessageModel();
  const pipeline::Schedule schedule = TwoStage1F1B();
  std::vector<int32_t> tokens(kMicrobatches * kMsgB * kMsgT);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 64);
  pipeline::MicrobatchData data;
  data.rows = kMsgB * kMsgT;
  data.tokens = [&](int mb) { return tokens.data() + mb * kMsgB * kMsgT; };
  data.targets = [&](int mb) { return tokens.data() + ((mb + 1) % kMicrobatches) * kMsgB * kMsgT; };
  auto world = pipeline::MakeInProcessWorld(2);
  MessageRun runs[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const StageSpec spec = {r == 0 ? 0 : 2, r == 0 ? 2 : 4, r == 0, r == 1};
      MessageChunk chunk(config, spec, kMsgB, kMsgT, schedule.buffers_per_stage[r], type);
      ASSERT_TRUE(chunk.InitRandom(9).ok());
      RecordingTransport transport(world[r].get(), {&chunk});
      pipeline::RankLayout layout;
      layout.pp = 2;
      layout.stage = r;
      pipeline::StageExecutor executor(schedule, layout, {&chunk}, &transport, 60, {});
      for (int step = 0; step < kSteps; ++step) {
        absl::StatusOr<pipeline::StepOutcome> out =
            executor.RunStep(data, 1.0f / (kMsgB * kMsgT * kMicrobatches));
        ASSERT_TRUE(out.ok()) << out.status();
        runs[r].losses.push_back(out->loss);
        if (step == 0) runs[r].allocations_after_first_step = chunk.allocations;
      }
      runs[r].sent_bytes = transport.sent_bytes;
      runs[r].allocations = chunk.allocations;
      // What the chunk's start-up memory check counts for device messages (Trainer::Create).
      EXPECT_EQ(chunk.allocations,
                pipeline::StageExecutor::MessageBuffersOf(schedule.per_stage[r], 0));
      runs[r].foreign_buffers = chunk.foreign_buffers;
      runs[r].receives_into_unread = transport.receives_into_unread;
    });
  }
  for (auto& t : threads) t.join();
  MessageRun out = runs[0];
  out.sent_bytes.insert(out.sent_bytes.end(), runs[1].sent_bytes.begin(), runs[1].sent_bytes.end());
  // Stage 1's share: the same losses, its allocations all at the first step too.
  EXPECT_EQ(runs[1].losses, runs[0].losses);
  EXPECT_EQ(runs[1].allocations, runs[1].allocations_after_first_step);
  EXPECT_EQ(runs[1].allocations, 2 * kMicrobatches);
  out.foreign_buffers += runs[1].foreign_buffers;
  out.receives_into_unread += runs[1].receives_into_unread;
  return out;
}

TEST(StageMessagesTest, MessagesHaveTheChunksElementTypeInTheChunksMemory) {
  const int64_t elements = kMsgB * kMsgT * TinyMessageModel().n_embd;
  const MessageRun fp32 = TrainTwoStages(MessageType::kFp32);
  const MessageRun bf16 = TrainTwoStages(MessageType::kBf16);
  for (const MessageRun* run : {&fp32, &bf16}) {
    const int64_t bytes = elements * (run == &bf16 ? 2 : 4);
    SCOPED_TRACE(run == &bf16 ? "bf16" : "fp32");
    // Each step: m activations one way, m gradients the other.
    ASSERT_EQ(run->sent_bytes.size(), static_cast<size_t>(2 * kMicrobatches * kSteps));
    for (int64_t b : run->sent_bytes) EXPECT_EQ(b, bytes);
    // Allocated once, by the chunks, at the first step: stage 0 sends activations and
    // receives gradients, one buffer per micro-batch each.
    EXPECT_EQ(run->allocations_after_first_step, 2 * kMicrobatches);
    EXPECT_EQ(run->allocations, run->allocations_after_first_step);
    EXPECT_EQ(run->foreign_buffers, 0);
    EXPECT_EQ(run->receives_into_unread, 0);
    for (double loss : run->losses) EXPECT_TRUE(std::isfinite(loss));
  }
  // bf16 rounds the messages only: close to fp32's losses, not the same.
  ASSERT_EQ(bf16.losses.size(), fp32.losses.size());
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 1e-2 * fp32.losses[i]);
  }
  EXPECT_NE(bf16.losses, fp32.losses);
}

TEST(StageMessagesTest, ChunksWhoseMessagesDifferAreRefused) {
  // One rank holding two chunks (interleaved), one bf16, one fp32: refused at the first step,
  // before any message.
  const GPT2Config config = TinyMessageModel();
  pipeline::ScheduleOptions options;
  options.kind = pipeline::ScheduleKind::kInterleaved;
  options.stages = 2;
  options.chunks = 2;
  options.microbatches = 2;
  absl::StatusOr<pipeline::Schedule> schedule = pipeline::BuildSchedule(options);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const int slots = schedule->buffers_per_stage[0];
  MessageChunk first(config, {0, 1, true, false}, kMsgB, kMsgT, slots, MessageType::kBf16);
  MessageChunk second(config, {2, 3, false, false}, kMsgB, kMsgT, slots, MessageType::kFp32);
  auto world = pipeline::MakeInProcessWorld(2);
  pipeline::RankLayout layout;
  layout.pp = 2;
  layout.chunks = 2;
  pipeline::StageExecutor executor(*schedule, layout, {&first, &second}, world[0].get(), 5, {});
  std::vector<int32_t> tokens(kMsgB * kMsgT, 1);
  pipeline::MicrobatchData data;
  data.rows = kMsgB * kMsgT;
  data.tokens = data.targets = [&](int) { return tokens.data(); };
  absl::StatusOr<pipeline::StepOutcome> out = executor.RunStep(data, 1.0f);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("same precision"), std::string::npos) << out.status();
  EXPECT_NE(out.status().message().find("bf16"), std::string::npos) << out.status();
  EXPECT_EQ(first.allocations + second.allocations, 0);
}

}  // namespace
}  // namespace freeride
