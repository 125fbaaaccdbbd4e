// The CUDA backend under the pipeline runtime: stages as threads on one GPU (the in-process
// transport; messages and cross-rank sums through host memory) reproduce the one-process
// CUDA run, and the one-process CUDA run follows the CPU backend. bf16 chunks send bf16
// messages from pinned host memory. Every model is small: the emulation build
// (tests/gpu/emulated.h) runs them all.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "models/backend.h"
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
    ExpectClose(ThreadedLosses(OnCuda(ParityConfig(shard, schedule, 2, 1, 4))), expected, 1e-6);
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

TEST(CudaPipelineTest, Bf16MessagesAreHalfTheBytesInPinnedMemory) {
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
    EXPECT_EQ((*chunk)->MessageBytes(), B * T * model.n_embd * (precision == "bf16" ? 2 : 4));
    absl::StatusOr<MessageBuffer> buffer = (*chunk)->AllocateMessageBuffer();
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer->get()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // pinned: the copies are DMA
    // A message out and back in: Forward's output, as the next stage would get it, read again
    // after FinishMessageReads.
    std::vector<int32_t> tokens(B * T, 5);
    ASSERT_TRUE((*chunk)->InitRandom(1).ok());
    ASSERT_TRUE((*chunk)->SetTokens(0, tokens.data()).ok());
    ASSERT_TRUE((*chunk)->Forward(0).ok());
    ASSERT_TRUE((*chunk)->GetOutputActivations(0, buffer->get()).ok());
    std::vector<float> values(B * T * model.n_embd);
    FromMessage((*chunk)->message_type(), buffer->get(), static_cast<int64_t>(values.size()),
                values.data());
    double sum = 0;
    for (float v : values) sum += std::fabs(v);
    EXPECT_GT(sum, 0);
    EXPECT_TRUE(std::isfinite(sum));
    ASSERT_TRUE((*chunk)->FinishMessageReads().ok());
  }
}

}  // namespace
}  // namespace freeride
