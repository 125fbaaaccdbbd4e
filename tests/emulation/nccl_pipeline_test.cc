// Training on CUDA chunks over emulated NCCL (ranks as threads of this process, the way the
// executor's tests run their ranks, so the trainer and the executor run unchanged): the
// losses of every schedule kind at pp 2 and 4, dp 1 and 2, equal bit for bit those of the same
// CUDA chunks over the in-process transport, which sums host memory in rank order as the MPI
// transport's tests pin it. After the transport is made, nothing goes through the bootstrap
// transport (the stand-in for MPI): no message, no sum, no test of a request.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "models/cuda/emulation/runtime.h"
#include "pipeline/comm/nccl_transport.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::ThreadedLosses;

constexpr int kSteps = 2;  // the emulated CUDA chunks are slow: two steps show the updates

Config OnCuda(Config config) {
  config.runtime.device = "cuda";
  return config;
}

// Counts every call to the transport it wraps once `armed`.
class CountingTransport : public pipeline::Transport {
 public:
  CountingTransport(Transport& inner, std::atomic<int64_t>* calls) : inner_(inner), calls_(calls) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    Count();
    return inner_.Isend(d, b, p, t);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    Count();
    return inner_.Irecv(d, b, p, t);
  }
  absl::Status Wait(Request r, double s) override {
    Count();
    return inner_.Wait(r, s);
  }
  bool Test(Request r) override {
    Count();
    return inner_.Test(r);
  }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double s) override {
    Count();
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double s) override {
    Count();
    return inner_.AllReduceSum(d, n, g, s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    Count();
    return inner_.StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    Count();
    return inner_.StartAllReduceSum(d, n, g);
  }
  bool armed = false;

 private:
  void Count() {
    if (armed) ++*calls_;
  }
  Transport& inner_;
  std::atomic<int64_t>* calls_;
};

// The NCCL transport over each rank's in-process one, through a counter armed once it is made.
// The counting wrapper lives as long as the transport (it is the bootstrap). Made on the rank's
// thread, which it puts in a CUDA context of its own, as each rank's process has: one rank
// freeing memory (cudaFree synchronises the device) then never waits for a peer's collective.
class OverNccl : public pipeline::Transport {
 public:
  static absl::StatusOr<std::unique_ptr<pipeline::Transport>> Make(pipeline::Transport& in_process,
                                                                   const Config& config,
                                                                   std::atomic<int64_t>* calls) {
    emu::SetThreadContext(in_process.rank() + 1);
    auto self = std::unique_ptr<OverNccl>(new OverNccl);
    self->counter_ = std::make_unique<CountingTransport>(in_process, calls);
    absl::StatusOr<pipeline::NcclTransportOptions> options = NcclOptionsOf(config);
    if (!options.ok()) return options.status();
    auto made = pipeline::MakeNcclTransport(*self->counter_, *options);
    if (!made.ok()) return made.status();
    self->nccl_ = *std::move(made);
    self->counter_->armed = true;
    return std::unique_ptr<pipeline::Transport>(std::move(self));
  }
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    return nccl_->Isend(d, b, p, t);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    return nccl_->Irecv(d, b, p, t);
  }
  bool CarriesDeviceMemory() const override { return nccl_->CarriesDeviceMemory(); }
  absl::Status Wait(Request r, double s) override {
    return nccl_->Wait(r, std::max(s, min_timeout_s));
  }
  bool Test(Request r) override { return nccl_->Test(r); }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double s) override {
    return Sum(d, n, g, s);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double s) override {
    return Sum(d, n, g, s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    return nccl_->StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    return nccl_->StartAllReduceSum(d, n, g);
  }
  void OnStepStart(double now_s) override { nccl_->OnStepStart(now_s); }
  // Waits take at least this long to time out: a test's short deadline for the step only.
  double min_timeout_s = 0;
  // Set once a blocking sum has been started here (its NCCL operation is on the stream).
  std::atomic<bool>* summing = nullptr;
  // The trainer goes: what the transport says to the bootstrap from here on is teardown.
  void AbortInFlight() override {
    counter_->armed = false;
    nccl_->AbortInFlight();
  }

 private:
  OverNccl() = default;
  template <typename T>
  absl::Status Sum(T* d, int64_t n, const std::vector<int>& g, double s) {
    absl::StatusOr<Request> started = nccl_->StartAllReduceSum(d, n, g);
    if (!started.ok()) return started.status();
    if (summing != nullptr) *summing = true;
    return nccl_->Wait(*started, std::max(s, min_timeout_s));
  }
  std::unique_ptr<CountingTransport> counter_;
  std::unique_ptr<pipeline::Transport> nccl_;  // destroyed before the counter it bootstraps on
};

constexpr const char* kKinds[] = {"gpipe", "1f1b", "interleaved", "zbh1",
                                  "zbh2",  "zbv",  "dualpipev"};

// Every schedule kind at pp × dp, m = 2 pp micro-batches (what interleaved and DualPipeV
// need) of batch 8 per replica: over NCCL the losses equal the in-process transport's, and
// nothing goes through the bootstrap during the steps. `tweak` changes the config.
void ExpectNcclEqualsInProcess(int pp, int dp, const std::function<void(Config*)>& tweak = {}) {
  const std::string shard = ParityShard();
  for (const std::string kind : kKinds) {
    SCOPED_TRACE(absl::StrFormat("%s pp %d dp %d", kind, pp, dp));
    Config config = OnCuda(ParityConfig(shard, kind, pp, dp, 2 * pp));
    config.parallel.partition = "even";  // the same split in both runs
    config.runtime.comm_timeout_s = 60;  // a failure fails in a minute, not five
    if (tweak) tweak(&config);
    const std::vector<double> in_process = ThreadedLosses(config, kSteps);
    std::atomic<int64_t> bootstrap_calls{0};
    const std::vector<double> nccl = ThreadedLosses(
        config, kSteps, nullptr, -1,
        [&](pipeline::Transport& t) { return OverNccl::Make(t, config, &bootstrap_calls); });
    ASSERT_EQ(nccl.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(nccl, in_process);
    EXPECT_EQ(bootstrap_calls, 0) << "calls to the bootstrap transport during the steps";
  }
}

TEST(NcclPipelineTest, TwoStages) { ExpectNcclEqualsInProcess(2, 1); }

// The data-parallel sums in buckets, started as their gradients are final.
TEST(NcclPipelineTest, TwoStagesTwoReplicasInBuckets) {
  ExpectNcclEqualsInProcess(2, 2, [](Config* c) { c->parallel.dp_bucket_mb = 1.0 / 256; });
}

// Post-validated steps: the tied sum started mid-step, the global state's sum.
TEST(NcclPipelineTest, TwoStagesTwoReplicasPostValidated) {
  ExpectNcclEqualsInProcess(2, 2, [](Config* c) { c->optim.step_sync = "post_validate"; });
}

// Every NCCL group of rank 1 starts 5 ms late on its stream: the executor waits for the
// messages where it waits (polling their events), and the losses do not change.
TEST(NcclPipelineTest, TwoStagesOverASlowCommunicationStream) {
  emu::SetNcclRankDelay(1, 0.005);
  const std::string shard = ParityShard();
  for (const std::string kind : {"1f1b", "zbh1"}) {
    SCOPED_TRACE(kind);
    Config config = OnCuda(ParityConfig(shard, kind, 2, 1, 4));
    config.parallel.partition = "even";
    const std::vector<double> in_process = ThreadedLosses(config, kSteps);
    std::atomic<int64_t> bootstrap_calls{0};
    EXPECT_EQ(ThreadedLosses(config, kSteps, nullptr, -1,
                             [&](pipeline::Transport& t) {
                               return OverNccl::Make(t, config, &bootstrap_calls);
                             }),
              in_process);
  }
  emu::SetNcclRankDelay(1, 0);
}

// Over NCCL the messages never leave the GPU: the chunks hand device buffers to the transport
// (Transport::CarriesDeviceMemory), and no copy of a message's size goes between host and
// device memory in the whole run; the in-process transport, on host memory, makes two a
// message (the sender's out, the receiver's in), which shows the count sees them. With the
// pinned messages NCCL had before, four a message (the chunk's out, the transport's staging in,
// its landing out, the chunk's in). The losses stay those of the in-process transport.
// Each stream-order hazard of device messages, by the wait that guards it removed in turn
// (2026-11-27; TwoStages, TwoStagesTwoReplicasPostValidated, the slow communication stream and
// this test run against each):
//   - a received buffer read before its receive's event (NcclTransport::Wait returning at once
//     for a receive): all four fail, the chunk reading the NaN the emulation fills new device
//     memory with, or another micro-batch's message;
//   - a send posted before the chunk's copy into its buffer ran (GetOutputActivations and
//     GetInputGrad not waiting for the chunk's stream when the buffer is device memory): all
//     four fail, the link's stream reading the buffer before the copy into it;
//   - a send buffer written again before the send that read it completed (the sends' Wait at
//     the step's end) and a receive posted into a buffer the chunk may still be copying out of
//     (FinishMessageReads): none fails. A pipeline's every compute instruction waits for the
//     chunk's stream (exact timeline, pp > 1), so the copy out of a received buffer is done
//     long before the next step posts into it, and an emulated send reads its buffer when its
//     group starts, long before the next step writes it; both waits stay (a GPU may not).
TEST(NcclPipelineTest, MessagesStayOnTheDevice) {
  Config config = OnCuda(ParityConfig(ParityShard(), "1f1b", 2, 1, 4));
  config.parallel.partition = "even";
  config.runtime.comm_timeout_s = 60;
  const GPT2Config model = *ResolveModelConfig(config);
  const size_t message_bytes = config.train.batch_size / config.train.microbatches *
                               config.train.seq_len * model.n_embd * sizeof(float);
  int64_t copies = emu::HostDeviceCopies(message_bytes);
  const std::vector<double> in_process = ThreadedLosses(config, kSteps);
  // 1F1B at pp 2 and m 4: four activations and four gradients a step.
  EXPECT_EQ(emu::HostDeviceCopies(message_bytes) - copies, kSteps * 8 * 2);
  copies = emu::HostDeviceCopies(message_bytes);
  std::atomic<int64_t> bootstrap_calls{0};
  EXPECT_EQ(ThreadedLosses(config, kSteps, nullptr, -1,
                           [&](pipeline::Transport& t) {
                             return OverNccl::Make(t, config, &bootstrap_calls);
                           }),
            in_process);
  EXPECT_EQ(emu::HostDeviceCopies(message_bytes) - copies, 0)
      << "copies of a message's size between host and device memory over NCCL";
}

// Sets a flag when it goes out of scope: a rank that returns early (a failed assertion) still
// releases the rank waiting for it.
struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag = true; }
};

// A peer that never comes to the step: the step fails at runtime.comm_timeout_s, naming the
// rank, stage and instruction that waited and the message it waited for, with the NCCL
// communicators aborted. Rank 0 starts Trainer::Create only once rank 1 waits in its setup sum
// (the mean of the part-cost probes): rank 0's probe models free their memory while that sum
// waits for rank 0. That order hung the setup sum for its 300 s in CI while the ranks shared
// one emulated CUDA context, in which cudaFree waited for the peer's sum (OverNccl::Make).
TEST(NcclPipelineTest, ALatePeerFailsTheStepNamingWhatItWaitedFor) {
  Config config = OnCuda(ParityConfig(ParityShard(), "1f1b", 2, 1, 4));
  config.runtime.comm_timeout_s = 1;  // the step's: rank 1 never sends, however slow this is
  // The transport's creation and teardown wait for both ranks, however far apart a loaded
  // machine runs them: only the step keeps to the 1 s.
  Config transport_config = config;
  transport_config.runtime.comm_timeout_s = 120;
  auto world = pipeline::MakeInProcessWorld(2);
  std::atomic<bool> peer_summing{false}, done{false};
  std::string error;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      SetOnExit release{r == 0 ? done : peer_summing};
      std::atomic<int64_t> calls{0};
      auto transport = OverNccl::Make(*world[r], transport_config, &calls);
      ASSERT_TRUE(transport.ok()) << transport.status();
      // Trainer::Create's sums wait for both ranks too, and rank 0 comes late on purpose.
      auto* over = static_cast<OverNccl*>(transport->get());
      over->min_timeout_s = 120;
      if (r == 1) {
        over->summing = &peer_summing;
      } else {
        while (!peer_summing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      auto trainer = Trainer::Create(config, over);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      over->min_timeout_s = 0;
      over->summing = nullptr;
      if (r == 0) {
        auto step = (*trainer)->Step();
        error = step.ok() ? "" : std::string(step.status().message());
        done = true;  // both trainers go now: their teardown waits for the other rank
      } else {
        while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_NE(error.find("rank 0 (stage 0, replica 0) blocked on RECV_GRAD micro-batch 0"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("from rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("did not complete within 1.0 s (NCCL communicators aborted)"),
            std::string::npos)
      << error;
}

// A peer that never comes to Trainer::Create: the setup sum (the mean of the part-cost probes)
// fails at runtime.comm_timeout_s naming the rank and stage that waited and the ranks of the
// sum, with the NCCL communicators aborted, instead of waiting for it.
TEST(NcclPipelineTest, APeerAbsentFromTheSetupFailsItsSumByTheDeadline) {
  Config config = OnCuda(ParityConfig(ParityShard(), "1f1b", 2, 1, 4));
  config.runtime.comm_timeout_s = 1;
  Config transport_config = config;
  transport_config.runtime.comm_timeout_s = 120;  // both ranks make the transport
  auto world = pipeline::MakeInProcessWorld(2);
  std::atomic<bool> done{false};
  std::string error;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      SetOnExit release{done};
      std::atomic<int64_t> calls{0};
      auto transport = OverNccl::Make(*world[r], transport_config, &calls);
      ASSERT_TRUE(transport.ok()) << transport.status();
      if (r == 1) {
        while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      auto trainer = Trainer::Create(config, transport->get());
      error = trainer.ok() ? "" : std::string(trainer.status().message());
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_NE(error.find("rank 0 (stage 0, replica 0) setting up, summing its part-cost probes "
                       "with every rank's: the sum of 3 values over ranks {0,1} did not complete "
                       "within 1.0 s (NCCL communicators aborted)"),
            std::string::npos)
      << error;
}

TEST(NcclPipelineTest, FourStages) { ExpectNcclEqualsInProcess(4, 1); }

TEST(NcclPipelineTest, FourStagesTwoReplicas) { ExpectNcclEqualsInProcess(4, 2); }

}  // namespace
}  // namespace freeride
