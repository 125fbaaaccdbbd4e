// The CUDA backend under the pipeline runtime: stages as threads on one GPU (the in-process
// transport; messages and cross-rank sums through host memory) reproduce the one-process
// CUDA run, and the one-process CUDA run follows the CPU backend. bf16 chunks send bf16
// messages from pinned host memory. Every model is small: the emulation build
// (tests/gpu/emulated.h) runs them all.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "models/backend.h"
#include "pipeline/grad_buckets.h"
#include "tests/gpu/emulated.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;
using testing::ThreadedLosses;

Config OnCuda(Config config) {
  config.runtime.device = "cuda";
  return config;
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "step " << i;
}

// tests/pipeline/train_parity.h's model: 8 layers C 16 (2 heads) V 64, T 8.
constexpr char kParityShape[] = "parity: 8 layers C 16 (2 heads) V 64, T 8";

TEST(CudaPipelineTest, OneProcessFollowsTheCpuBackend) {
  testing::PrintShapes({std::string(kParityShape) + ", batch 8 in 4 micro-batches"});
  const std::string shard = ParityShard();
  const Config cpu = ParityConfig(shard, "1f1b", 1, 1, 4);
  ExpectClose(SingleProcessLosses(OnCuda(cpu)), SingleProcessLosses(cpu), 1e-4);
}

TEST(CudaPipelineTest, StagesAsThreadsMatchOneProcess) {
  testing::PrintShapes({std::string(kParityShape) + ", 2 stages × 1-2 replicas, batch 8"});
  const std::string shard = ParityShard();
  const std::vector<double> expected =
      SingleProcessLosses(OnCuda(ParityConfig(shard, "1f1b", 1, 1, 4)));
  for (const std::string schedule : {"gpipe", "1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    const Config config = OnCuda(ParityConfig(shard, schedule, 2, 1, 4));
    const std::vector<double> got = ThreadedLosses(config);
    ExpectClose(got, expected, 1e-6);
    // Activation recomputation, a mode per stage, through the executor's B instructions (1F1B)
    // and its I/W split with the head's wte gradient in I (ZB-H1): the same bits, two steps
    // (cuda_recompute_gpu_test holds each chunk to them in every order).
    if (schedule == "gpipe") continue;
    Config recomputing = config;
    recomputing.parallel.recompute_stages = {schedule == "zbh1" ? "selective" : "full",
                                             schedule == "zbh1" ? "full" : "selective"};
    EXPECT_EQ(ThreadedLosses(recomputing, 2), std::vector<double>(got.begin(), got.begin() + 2));
  }
  // Two replicas of batch 4 in 2 micro-batches = one process with batch 8 in 4.
  const std::vector<double> batch8 =
      SingleProcessLosses(OnCuda(ParityConfig(shard, "1f1b", 1, 1, 4, 8)));
  ExpectClose(ThreadedLosses(OnCuda(ParityConfig(shard, "1f1b", 2, 2, 2, 4))), batch8, 1e-6);
}

// In bf16 on the shapes the model's GPU tests cover (C = 64, 4 heads of 16: the flash path).
Config InBf16(Config config) {
  config.runtime.device = "cuda";
  config.runtime.precision = "bf16";
  config.model.n_embd = 64;
  config.model.n_head = 4;
  return config;
}

// The messages are the bf16 activations themselves (the old fp32 messages were rounded back
// to the same values: stage_message_test.cc), so a bf16 pipeline follows the one-process bf16
// run within the bf16 contract (cuda_model_gpu_test's 2e-2 on losses).
TEST(CudaPipelineTest, Bf16StagesAsThreadsFollowOneProcess) {
  testing::PrintShapes({"parity in bf16: 8 layers C 64 (4 heads) V 64, T 8, 2 stages, batch 8"});
  const std::string shard = ParityShard();
  const std::vector<double> expected =
      SingleProcessLosses(InBf16(ParityConfig(shard, "1f1b", 1, 1, 4)));
  for (const std::string schedule : {"1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    const std::vector<double> got = ThreadedLosses(InBf16(ParityConfig(shard, schedule, 2, 1, 4)));
    ExpectClose(got, expected, 2e-2);
    std::printf("bf16 %s, 2 stages: losses %s one process's\n", schedule.c_str(),
                got == expected ? "bit-identical to" : "within 2e-2 of");
  }
}

// In host memory (MPI's) the messages are pinned, so that the device copies are DMA; in device
// memory (NCCL's) they never leave the GPU. Either way a message carries the same bits.
TEST(CudaPipelineTest, Bf16MessagesAreHalfTheBytesInPinnedOrDeviceMemory) {
  testing::PrintShapes({"parity in bf16: layers [0, 4) of 8, C 64 V 64, micro-batch 2 × 8"});
  const std::string shard = ParityShard();
  const Config config = InBf16(ParityConfig(shard, "1f1b", 2, 1, 4));
  const GPT2Config model = *ResolveModelConfig(config);
  const int64_t B = config.train.batch_size / config.train.microbatches, T = config.train.seq_len;
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    BackendOptions backend;
    backend.device = "cuda";
    backend.precision = precision;
    auto chunk = MakeStageModel(backend, model, {0, 4, true, false}, B, T, 1);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_EQ((*chunk)->message_type(), MessageTypeOf(backend));
    const int64_t bytes = (*chunk)->MessageBytes();
    EXPECT_EQ(bytes, B * T * model.n_embd * (precision == "bf16" ? 2 : 4));
    std::vector<int32_t> tokens(B * T, 5);
    ASSERT_TRUE((*chunk)->InitRandom(1).ok());
    ASSERT_TRUE((*chunk)->SetTokens(0, tokens.data()).ok());
    ASSERT_TRUE((*chunk)->Forward(0).ok());
    std::vector<std::vector<char>> seen;
    for (MessageMemory memory : {MessageMemory::kHost, MessageMemory::kDevice}) {
      const bool device = memory == MessageMemory::kDevice;
      SCOPED_TRACE(device ? "device memory" : "pinned memory");
      absl::StatusOr<MessageBuffer> buffer = (*chunk)->AllocateMessageBuffer(memory);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      cudaPointerAttributes attributes{};
      ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer->get()), cudaSuccess);
      EXPECT_EQ(attributes.type, device ? cudaMemoryTypeDevice : cudaMemoryTypeHost);
      // Forward's output, as the next stage would get it: in pinned memory on return, in device
      // memory once the event the chunk recorded after its copy has completed (a transport's
      // stream waits for it before sending).
      ASSERT_TRUE((*chunk)->GetOutputActivations(0, buffer->get()).ok());
      void* written = (*chunk)->MessageWritten();
      EXPECT_EQ(written != nullptr, device);
      if (written != nullptr) {
        ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(written)), cudaSuccess);
      }
      std::vector<char>& got = seen.emplace_back(bytes);
      ASSERT_EQ(cudaMemcpy(got.data(), buffer->get(), bytes, cudaMemcpyDefault), cudaSuccess);
      std::vector<float> values(B * T * model.n_embd);
      FromMessage((*chunk)->message_type(), got.data(), static_cast<int64_t>(values.size()),
                  values.data());
      double sum = 0;
      for (float v : values) sum += std::fabs(v);
      EXPECT_GT(sum, 0);
      EXPECT_TRUE(std::isfinite(sum));
      ASSERT_TRUE((*chunk)->FinishMessageReads().ok());
    }
    EXPECT_EQ(seen[0], seen[1]) << "the same activations in pinned and device memory";
  }
}

// Records, at each data-parallel bucket's start, whether block 0's gradients were still those
// the earlier micro-batches left (block 0 is the last block the backward differentiates):
// the bucket then started inside the last backward, before block 0's products. Sums over a
// world of one (the identity).
class BucketStartSpy : public pipeline::Transport {
 public:
  BucketStartSpy(StageModel* model, std::vector<float> block0_before)
      : model_(model), before_(std::move(block0_before)), self_(pipeline::MakeSelfTransport()) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<Request> Isend(const void* d, int64_t b, int p, int t) override {
    return self_->Isend(d, b, p, t);
  }
  absl::StatusOr<Request> Irecv(void* d, int64_t b, int p, int t) override {
    return self_->Irecv(d, b, p, t);
  }
  absl::Status Wait(Request r, double t) override { return self_->Wait(r, t); }
  bool Test(Request r) override { return self_->Test(r); }
  absl::Status AllReduceSum(float* d, int64_t n, const std::vector<int>& g, double t) override {
    return self_->AllReduceSum(d, n, g, t);
  }
  absl::Status AllReduceSum(double* d, int64_t n, const std::vector<int>& g, double t) override {
    return self_->AllReduceSum(d, n, g, t);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* d, int64_t n,
                                            const std::vector<int>& g) override {
    const TensorSlot& qkv = model_->layout().slot(ParamTensor::kQkvW);
    absl::StatusOr<float*> grads = model_->HostGrads(qkv.offset, before_.size());
    if (!grads.ok()) return grads.status();
    block0_untouched.push_back(
        std::memcmp(*grads, before_.data(), before_.size() * sizeof(float)) == 0);
    return self_->StartAllReduceSum(d, n, g);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* d, int64_t n,
                                            const std::vector<int>& g) override {
    return self_->StartAllReduceSum(d, n, g);
  }
  std::vector<bool> block0_untouched;

 private:
  StageModel* model_;
  std::vector<float> before_;
  std::unique_ptr<pipeline::Transport> self_;
};

// On CUDA the data-parallel buckets start inside the chunk's last weight-gradient
// instruction as its parts are queued (StageModel::SetWeightGradProgress), in the fixed
// layout's order: the final LayerNorm's and the last block's buckets before block 0 is
// differentiated; wte's at REDUCE_GRADS. The gradients are those of the same chunk without
// buckets, bit for bit, and none changed after its bucket started (the buckets' check). In a
// step of one micro-batch the only weight gradients are the first after ZeroGrads (beta = 0):
// nothing starts inside them, and the bits are the same too.
TEST(CudaPipelineTest, DataParallelBucketsStartInsideTheLastBackward) {
  testing::PrintShapes({"2 layers C 16 (2 heads) V 64, micro-batch 1 × 8, 1-2 micro-batches"});
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(2, 2, 16, 8, 64);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t T = 8;
  BackendOptions backend;
  backend.device = "cuda";
  const ParamLayout layout = MakeParamLayout(*config, WholeModel(*config));
  const TensorSlot& qkv_slot = layout.slot(ParamTensor::kQkvW);
  const int64_t block0 = qkv_slot.elements / config->n_layer;
  for (int microbatches : {2, 1}) {
    SCOPED_TRACE(absl::StrFormat("%d micro-batches", microbatches));
    std::vector<std::vector<float>> grads;
    for (bool bucketed : {false, true}) {
      auto chunk = MakeStageModel(backend, *config, WholeModel(*config), 1, T, 1);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      StageModel& m = **chunk;
      ASSERT_TRUE(m.InitRandom(7).ok());
      ASSERT_TRUE(m.ZeroGrads().ok());
      std::unique_ptr<BucketStartSpy> spy;
      std::unique_ptr<pipeline::GradBuckets> buckets;
      size_t inside = 0;  // buckets started inside the last BackwardWeight
      for (int mb = 0; mb < microbatches; ++mb) {
        std::vector<int32_t> tokens(T), targets(T);
        for (int64_t i = 0; i < T; ++i) {
          tokens[i] = static_cast<int32_t>((5 * i + 3 * mb + 1) % 64);
          targets[i] = static_cast<int32_t>((7 * i + mb + 2) % 64);
        }
        ASSERT_TRUE(m.SetTokens(0, tokens.data()).ok());
        ASSERT_TRUE(m.SetTargets(0, targets.data()).ok());
        ASSERT_TRUE(m.Forward(0).ok());
        ASSERT_TRUE(m.BackwardInput(0, 1.0f / (T * microbatches)).ok());
        const bool last = mb + 1 == microbatches;
        if (bucketed && last) {
          // Block 0's gradients so far; none in a step of one micro-batch (reading them there
          // would end the first weight gradients' beta = 0).
          std::vector<float> before(block0);
          if (mb > 0) {
            absl::StatusOr<float*> so_far = m.HostGrads(qkv_slot.offset, block0);
            ASSERT_TRUE(so_far.ok()) << so_far.status();
            std::memcpy(before.data(), *so_far, block0 * sizeof(float));
          }
          spy = std::make_unique<BucketStartSpy>(&m, std::move(before));
          // Buckets of 1,000 floats (a block's gradients are 12·C² + 13·C = 3,280 at C = 16).
          buckets = std::make_unique<pipeline::GradBuckets>(std::vector<StageModel*>{&m}, 1000,
                                                            spy.get(), std::vector<int>{0, 1});
          buckets->set_verify(true);
          buckets->Reset();
          buckets->BeginLastBackward(0);
        }
        ASSERT_TRUE(m.BackwardWeight(0).ok());
        if (bucketed && last) {
          inside = spy->block0_untouched.size();
          ASSERT_TRUE(buckets->EndLastBackward(0).ok());
        }
      }
      if (bucketed) {
        const size_t before_tied = spy->block0_untouched.size();
        ASSERT_TRUE(m.FoldHeadWteGrad().ok());
        ASSERT_TRUE(buckets->StartRemaining().ok());
        EXPECT_GT(spy->block0_untouched.size(), before_tied) << "wte's buckets at REDUCE_GRADS";
        ASSERT_TRUE(buckets->Finish(60).ok());
        if (microbatches > 1) {
          // Those of lnf and block 1 (parts 0 and 1) started before block 0's products, the
          // others inside the call after them; only wte's (the tied part) were left.
          size_t before_block0 = 0, before_wte = 0;
          for (const pipeline::GradBucket& b : buckets->buckets(0)) {
            before_block0 += b.ready_part <= 1;
            before_wte += b.ready_part < pipeline::TiedPart(m.stage());
          }
          ASSERT_GE(before_block0, 3u);
          EXPECT_EQ(inside, before_wte);
          for (size_t k = 0; k < inside; ++k) {
            EXPECT_EQ(spy->block0_untouched[k], k < before_block0) << "bucket " << k;
          }
        } else {
          EXPECT_EQ(inside, 0u) << "buckets started inside the first weight gradients";
        }
      } else {
        ASSERT_TRUE(m.FoldHeadWteGrad().ok());
      }
      absl::StatusOr<float*> all = m.HostGrads(0, m.num_params());
      ASSERT_TRUE(all.ok()) << all.status();
      grads.emplace_back(*all, *all + m.num_params());
    }
    EXPECT_TRUE(grads[0] == grads[1]) << "the gradients with and without buckets differ";
  }
}

}  // namespace
}  // namespace freeride
