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
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "models/cuda/emulation/runtime.h"
#include "pipeline/comm/nccl_transport.h"
#include "tests/emulation/over_nccl.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

using testing::OverNccl;
using testing::ParityConfig;
using testing::ParityShard;
using testing::ThreadedLosses;

constexpr int kSteps = 2;  // the emulated CUDA chunks are slow: two steps show the updates

Config OnCuda(Config config) {
  config.runtime.device = "cuda";
  return config;
}

constexpr const char* kKinds[] = {"gpipe", "1f1b", "interleaved", "zbh1",
                                  "zbh2",  "zbv",  "dualpipev"};

// Every schedule kind at pp × dp, m = 2 pp micro-batches (what interleaved and DualPipeV
// need) of batch 8 per replica: over NCCL the losses equal the in-process transport's,
// nothing goes through the bootstrap during the steps, and the tied embedding's gradient is
// never copied to the host (its sum on the device, between two ranks or, in a V placement,
// between two chunks of one). `tweak` changes the config; `steps` trains that many.
void ExpectNcclEqualsInProcess(int pp, int dp, const std::function<void(Config*)>& tweak = {},
                               int steps = kSteps) {
  const std::string shard = ParityShard();
  for (const std::string kind : kKinds) {
    SCOPED_TRACE(absl::StrFormat("%s pp %d dp %d", kind, pp, dp));
    Config config = OnCuda(ParityConfig(shard, kind, pp, dp, 2 * pp));
    config.parallel.partition = "even";  // the same split in both runs
    config.runtime.comm_timeout_s = 60;  // a failure fails in a minute, not five
    if (tweak) tweak(&config);
    const std::vector<double> in_process = ThreadedLosses(config, steps);
    const GPT2Config model = *ResolveModelConfig(config);
    const size_t tied_bytes = model.padded_vocab_size * model.n_embd * sizeof(float);
    const int64_t tied_copies = emu::DeviceToHostCopies()[tied_bytes];
    std::atomic<int64_t> bootstrap_calls{0};
    const std::vector<double> nccl = ThreadedLosses(
        config, steps, nullptr, -1,
        [&](pipeline::Transport& t) { return OverNccl::Make(t, config, &bootstrap_calls); });
    ASSERT_EQ(nccl.size(), static_cast<size_t>(steps));
    EXPECT_EQ(nccl, in_process);
    EXPECT_EQ(bootstrap_calls, 0) << "calls to the bootstrap transport during the steps";
    EXPECT_EQ(emu::DeviceToHostCopies()[tied_bytes], tied_copies)
        << "copies of the tied embedding's gradient to the host over NCCL";
  }
}

// Fails when a send does not wait for the chunk's copy into its buffer (the event wait in
// NcclTransport::IsendAfter) or the executor does not wait for a receive before the chunk
// copies out of its buffer (found by removing each, 2026-11-27).
TEST(NcclPipelineTest, TwoStages) { ExpectNcclEqualsInProcess(2, 1); }

// The data-parallel sums in buckets, started as their gradients are final: in place on the
// chunks' device gradients, each after the event of the products queued before it. Fails when
// the bucket's sum does not wait for that event (NcclTransport::StartDeviceSum), reading
// gradients the chunk's stream has not written yet.
TEST(NcclPipelineTest, TwoStagesTwoReplicasInBuckets) {
  ExpectNcclEqualsInProcess(2, 2, [](Config* c) { c->parallel.dp_bucket_mb = 1.0 / 256; });
}

// Post-validated steps: the tied sum started mid-step, the global state's sum. Fails when the
// tied sum does not wait for the event after the head's fold (NcclTransport::StartDeviceSum),
// or a send for the copy into its buffer.
TEST(NcclPipelineTest, TwoStagesTwoReplicasPostValidated) {
  ExpectNcclEqualsInProcess(2, 2, [](Config* c) { c->optim.step_sync = "post_validate"; });
}

// Post-validated steps that run ahead and are rolled back, every schedule kind: 3 steps under a
// clip every step reaches, so that step 3 runs ahead on step 2's speculative update and is
// undone (the 2 steps above never run ahead). The rollback posts the receives of the messages
// sent ahead again before the step's other receives, which NCCL matches in the order they were
// posted: it hung, each stage waiting for the other's micro-batch 0, while every receive was
// posted at the step's start (StageExecutor::DiscardAhead, 2026-11-27).
TEST(NcclPipelineTest, TwoStagesPostValidatedRollBack) {
  ExpectNcclEqualsInProcess(
      2, 1,
      [](Config* c) {
        c->optim.step_sync = "post_validate";
        c->optim.grad_clip = 1e-6;
        c->train.steps = 3;
      },
      3);
}

// Every NCCL group of rank 1 starts 5 ms late on its stream (a slow communication stream, a
// late peer), and every copy between device buffers (the chunks' copies into and out of their
// messages) 2 ms late on its stream: the executor waits for the messages where it waits
// (polling their events), each send waits on the device for the copy into its buffer, and the
// losses do not change. The hazards it catches, each found by removing its wait (2026-11-27):
// a send issued without waiting for the event of the chunk's copy into its buffer (the
// cudaStreamWaitEvent in NcclTransport::IsendAfter: the link's stream sends what the buffer
// held before), and a received buffer consumed without waiting for its receive (the
// executor's Wait at RECV_ACT and RECV_GRAD: the chunk copies out what the buffer held before).
TEST(NcclPipelineTest, TwoStagesOverASlowCommunicationStream) {
  const std::string shard = ParityShard();
  for (const std::string kind : {"1f1b", "zbh1"}) {
    SCOPED_TRACE(kind);
    Config config = OnCuda(ParityConfig(shard, kind, 2, 1, 4));
    config.parallel.partition = "even";
    const std::vector<double> in_process = ThreadedLosses(config, kSteps);
    std::atomic<int64_t> bootstrap_calls{0};
    emu::SetNcclRankDelay(1, 0.005);
    emu::SetDeviceCopyDelay(0.002);
    EXPECT_EQ(ThreadedLosses(config, kSteps, nullptr, -1,
                             [&](pipeline::Transport& t) {
                               return OverNccl::Make(t, config, &bootstrap_calls);
                             }),
              in_process);
    emu::SetNcclRankDelay(1, 0);
    emu::SetDeviceCopyDelay(0);
  }
}

// DualPipeV at pp 2 × dp 2, buckets on and off, with every copy between device buffers 30 ms
// late on its stream: among them the copy back of a V placement's tied sum to the head chunk
// (CudaStage::SumTiedOnDevice), which reads the embedding chunk's wte gradient that the
// data-parallel sum then writes in place. The losses do not change. Fails, every run, when the
// embedding chunk's stream does not wait for that copy (the sum overtakes it and the head
// steps with the replicas' sum): the race behind the intermittent DualPipeV failures of
// TwoStagesTwoReplicasInBuckets and TwoStagesTwoReplicasPostValidated under load (issue 50).
TEST(NcclPipelineTest, TwoReplicasOfAVPlacementBehindLateCopies) {
  const std::string shard = ParityShard();
  for (const double bucket_mb : {0.0, 1.0 / 256}) {
    SCOPED_TRACE(absl::StrFormat("dp_bucket_mb %g", bucket_mb));
    Config config = OnCuda(ParityConfig(shard, "dualpipev", 2, 2, 4));
    config.parallel.partition = "even";
    config.parallel.dp_bucket_mb = bucket_mb;
    config.runtime.comm_timeout_s = 60;
    const std::vector<double> in_process = ThreadedLosses(config, kSteps);
    std::atomic<int64_t> bootstrap_calls{0};
    emu::SetDeviceCopyDelay(0.03);
    const std::vector<double> nccl = ThreadedLosses(
        config, kSteps, nullptr, -1,
        [&](pipeline::Transport& t) { return OverNccl::Make(t, config, &bootstrap_calls); });
    emu::SetDeviceCopyDelay(0);
    EXPECT_EQ(nccl, in_process);
  }
}

// Over NCCL the messages and the gradients never leave the GPU: the chunks hand device buffers
// to the transport (Transport::CarriesDeviceMemory), and no copy of a message's size goes
// between host and device memory in the whole run; the in-process transport, on host memory,
// makes at least two a message (the sender's out, the receiver's in; and the gradients' pieces
// of that size), which shows the count sees them. With the pinned messages NCCL had before,
// four a message (the chunk's out, the transport's staging in, its landing out, the chunk's in).
// The gradient sums (the data-parallel buckets, the tied embedding) run in place on the chunks'
// gradient buffers (pipeline/device_grad_sum.h): every copy from device to host memory over
// NCCL is listed below, and none is a gradient's. The losses stay those of the in-process
// transport. Fails too when a send or a device sum does not wait for its event, or the
// executor for a receive; every hazard and the test that catches it: docs/training.md#over-nccl.
TEST(NcclPipelineTest, MessagesAndGradientsStayOnTheDevice) {
  constexpr int kPp = 2, kDp = 2, kMicrobatches = 4;
  Config config = OnCuda(ParityConfig(ParityShard(), "1f1b", kPp, kDp, kMicrobatches));
  config.parallel.partition = "even";
  config.parallel.dp_bucket_mb = 1.0 / 256;
  config.runtime.comm_timeout_s = 60;
  const GPT2Config model = *ResolveModelConfig(config);
  const size_t message_bytes = config.train.batch_size / config.train.microbatches *
                               config.train.seq_len * model.n_embd * sizeof(float);
  const size_t tied_bytes = model.padded_vocab_size * model.n_embd * sizeof(float);
  int64_t copies = emu::HostDeviceCopies(message_bytes);
  std::map<size_t, int64_t> before = emu::DeviceToHostCopies();
  const std::vector<double> in_process = ThreadedLosses(config, kSteps);
  // 1F1B at pp 2 and m 4: four activations and four gradients a step in each replica.
  EXPECT_GE(emu::HostDeviceCopies(message_bytes) - copies, kSteps * kDp * 8 * 2);
  EXPECT_GT(emu::DeviceToHostCopies()[tied_bytes], before[tied_bytes])
      << "the in-process transport's tied sum copies wte's gradient out";
  copies = emu::HostDeviceCopies(message_bytes);
  before = emu::DeviceToHostCopies();
  std::atomic<int64_t> bootstrap_calls{0};
  EXPECT_EQ(ThreadedLosses(config, kSteps, nullptr, -1,
                           [&](pipeline::Transport& t) {
                             return OverNccl::Make(t, config, &bootstrap_calls);
                           }),
            in_process);
  EXPECT_EQ(emu::HostDeviceCopies(message_bytes) - copies, 0)
      << "copies of a message's size between host and device memory over NCCL";
  std::map<size_t, int64_t> copied;
  for (const auto& [bytes, n] : emu::DeviceToHostCopies()) {
    if (const int64_t d = n - before[bytes]; d != 0) copied[bytes] = d;
  }
  // Every copy from device to host memory over NCCL, of the 4 ranks (2 of them heads):
  // host values the host needs, and the landing of sums of host values, which NCCL carries
  // in device memory. None is avoidable without moving the optimizer's decisions (clipping,
  // skipping a non-finite step, stopping) and the logs onto the device.
  constexpr int kRanks = kPp * kDp, kHeads = kDp;
  constexpr int kChunkUnits = 8 / kPp + 1;  // each stage's layers and its embedding or head
  constexpr int kModelUnits = 8 + 2;        // the gradient norm's units of the whole model
  const std::map<size_t, int64_t> expected = {
      // Each received message's tag, which travels ahead of it (NCCL matches in order only):
      // four receives a rank a step.
      {sizeof(int32_t), kSteps * kRanks * kMicrobatches},
      // One value each: the head's loss of each micro-batch (ForwardKeepingLoss: the step's
      // loss, logged), and the one-value sums of each rank's step (the arrivals before the
      // tied and the data-parallel sums, where a bubble ends; the replicas' finite-loss
      // flag; the step's loss over the pipeline and over the replicas).
      {sizeof(double), kSteps * (kHeads * kMicrobatches + kRanks * 5)},
      // The gradient norm's squares per unit of each chunk (GradSquaresByUnit: the host
      // clips by the norm and logs it), then their sum over the pipeline with the
      // non-finite-loss count.
      {kChunkUnits * sizeof(double), kSteps * kRanks},
      {(kModelUnits + 1) * sizeof(double), kSteps * kRanks},
      // The step's figures every rank logs (Trainer::StepSums: waits, memory, the stop flag).
      {(3 * kPp + 1) * sizeof(double), kSteps * kRanks},
      // Once, at the start: the bubble placement's measured costs, three per virtual stage.
      {3 * kPp * sizeof(double), kRanks},
  };
  EXPECT_EQ(copied, expected) << "device-to-host copies over NCCL, by their bytes";
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
