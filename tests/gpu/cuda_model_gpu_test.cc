// The CUDA backend as a whole against the CPU backend: one training step of a tiny GPT-2, a
// 10-step trajectory, bitwise determinism, the per-step ledger, and the trainer on
// runtime.device = "cuda" against the PyTorch golden trajectory the CPU trainer is held to.
// Every model is small: the emulation build (tests/gpu/emulated.h) runs them all.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "freeride/side_task.h"
#include "gtest/gtest.h"
#include "models/cpu_stage_model.h"
#include "models/cuda/cuda_stage_model.h"
#include "tests/gpu/emulated.h"
#include "tests/gpu/relative_error.h"
#include "tests/gpu/train_step.h"
#include "tests/trainer/golden_trajectory.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

GPT2Config Tiny() {
  absl::StatusOr<GPT2Config> c = MakeGPT2Config(/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64,
                                                /*max_seq_len=*/32, /*vocab_size=*/200);
  EXPECT_TRUE(c.ok());
  return *c;
}

constexpr int64_t kB = 4, kT = 32;
constexpr char kTinyShape[] = "tiny: 2 layers C 64 (4 heads) V 200, B 4 T 32";
// tests/data/gpt2_golden/model.bin, as the trainer runs it (tests/trainer/golden_trajectory.h).
constexpr char kGoldenShape[] = "golden: 2 layers C 32 (2 heads) V 100, B 4 T 8";

std::unique_ptr<CudaStageModel> MustCreate(
    CudaPrecision precision, cuda::GeluFusionMode fuse_gelu = cuda::GeluFusionMode::kAuto) {
  CudaStageOptions options;
  options.precision = precision;
  options.fuse_gelu = fuse_gelu;
  auto m = CudaStageModel::Create(Tiny(), WholeModel(Tiny()), kB, kT, 1, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

using testing::RelativeError;

using testing::StepResult;
using testing::TrainStep;

class CudaModelTest : public ::testing::TestWithParam<CudaPrecision> {
 protected:
  bool bf16() const { return GetParam() == CudaPrecision::kBf16; }
  double tolerance() const { return bf16() ? 2e-2 : 1e-5; }
};

TEST_P(CudaModelTest, OneTrainingStepMatchesTheCpuBackend) {
  testing::PrintShapes({kTinyShape});
  CpuStageModel cpu(Tiny(), WholeModel(Tiny()), kB, kT, 1);
  auto gpu = MustCreate(GetParam());
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(cpu.InitRandom(7).ok());
  ASSERT_TRUE(gpu->InitRandom(7).ok());
  const StepResult want = TrainStep(cpu, 1, 3), got = TrainStep(*gpu, 1, 3);
  EXPECT_NEAR(got.loss, want.loss, tolerance() * want.loss);
  ASSERT_EQ(got.units.size(), want.units.size());
  for (size_t u = 0; u < want.units.size(); ++u) {
    EXPECT_NEAR(got.units[u], want.units[u], (bf16() ? 5e-2 : 1e-4) * want.units[u]) << "unit " << u;
  }
  EXPECT_LT(RelativeError(got.grads, want.grads), bf16() ? 5e-2 : 1e-4);
  if (bf16()) {
    EXPECT_LT(RelativeError(got.params, want.params), tolerance());
    return;
  }
  // fp32: both backends start from the same parameters and take AdamW's first step, which moves
  // each by the same decay and by lr·g/(|g| + eps) (the bias corrections cancel at step 1). So
  // the parameters may differ by what the two gradients make of that step, exactly, plus float's
  // rounding on either side (u = 2^-24: about 2 roundings of p, 8 of the lr-sized step). A
  // tolerance relative to the largest parameter would instead hang on how close some gradient
  // lies to eps on the CPU at hand (1.8e-5 on an AVX2 CPU against 1e-5 tuned elsewhere).
  ASSERT_EQ(got.params_before, want.params_before);
  const double lr = testing::kTrainStepLr, eps = AdamWStep{}.eps, u = 0x1p-24;
  auto step = [&](double g) { return lr * g / (std::fabs(g) + eps); };
  int64_t outside = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    const double bound = std::fabs(step(got.grads[i]) - step(want.grads[i])) +
                         4 * u * std::fabs(want.params_before[i]) + 16 * u * lr;
    if (std::fabs(double(got.params[i]) - want.params[i]) > bound && ++outside <= 5) {
      ADD_FAILURE() << "parameter " << i << ": " << got.params[i] << " against " << want.params[i]
                    << " (bound " << bound << ", gradients " << got.grads[i] << ", "
                    << want.grads[i] << ")";
    }
  }
  EXPECT_EQ(outside, 0);
}

TEST_P(CudaModelTest, TenStepLossTrajectoryFollowsTheCpu) {
  testing::PrintShapes({kTinyShape});
  CpuStageModel cpu(Tiny(), WholeModel(Tiny()), kB, kT, 1);
  auto gpu = MustCreate(GetParam());
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(cpu.InitRandom(11).ok());
  ASSERT_TRUE(gpu->InitRandom(11).ok());
  for (int64_t step = 1; step <= 10; ++step) {
    // The same batch every step: the loss must fall, on both devices alike.
    const double want = TrainStep(cpu, step, 5).loss, got = TrainStep(*gpu, step, 5).loss;
    EXPECT_NEAR(got, want, (bf16() ? 2e-2 : 1e-4) * want) << "step " << step;
  }
}

TEST_P(CudaModelTest, TwoIdenticalRunsAreBitwiseEqual) {
  testing::PrintShapes({kTinyShape});
  std::vector<float> params[2];
  for (int run = 0; run < 2; ++run) {
    auto gpu = MustCreate(GetParam());
    ASSERT_NE(gpu, nullptr);
    ASSERT_TRUE(gpu->InitRandom(13).ok());
    for (int64_t step = 1; step <= 3; ++step) params[run] = TrainStep(*gpu, step, 100 + step).params;
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)), 0);
}

TEST_P(CudaModelTest, FusedAndUnfusedGeluAgree) {
  testing::PrintShapes({kTinyShape});
  auto fused = MustCreate(GetParam(), cuda::GeluFusionMode::kOn);
  auto plain = MustCreate(GetParam(), cuda::GeluFusionMode::kOff);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(plain, nullptr);
  // cuBLASLt may offer no fp32 GELU epilogue at all: that is why "auto" runs fp32 unfused, and
  // it is no failure here.
  std::vector<int32_t> tokens(kB * kT, 1);
  ASSERT_TRUE(fused->SetTokens(0, tokens.data()).ok());
  ASSERT_TRUE(fused->SetTargets(0, tokens.data()).ok());
  if (absl::StatusOr<double> probe = fused->Forward(0);
      !bf16() && !probe.ok() && probe.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << probe.status();
  }
  ASSERT_TRUE(fused->InitRandom(17).ok());
  ASSERT_TRUE(plain->InitRandom(17).ok());
  const StepResult a = TrainStep(*fused, 1, 9), b = TrainStep(*plain, 1, 9);
  EXPECT_NEAR(a.loss, b.loss, tolerance() * b.loss);
  EXPECT_LT(RelativeError(a.grads, b.grads), bf16() ? 5e-2 : 1e-4);
}

// The ledger (cuda_stage_model.h) over the trainer's steps on one stage, m micro-batches,
// steps 2 on untraced (each compute instruction queued, not waited for): nothing is
// allocated after the first step, and a step waits for the device at most 3 + 2m times: the
// step's losses once (TakeLosses at OPTIMIZER), the gradient norm's units (GradSquaresByUnit),
// ApplyAdamW's end, and at most one wait per LOAD for each of the slot's two pinned staging
// buffers (tokens, targets) when the host is a whole slot ahead of the device. It was 5m + 4.
// FREERIDE_CUDA_CHECK_LAUNCHES=1 (bench/gpu/test.sh) adds one wait per launch.
TEST_P(CudaModelTest, LedgerHasNoAllocationsAfterTheFirstStepAndFewSyncs) {
  testing::PrintShapes({"golden: 2 layers C 32 (2 heads) V 100, B 4 T 8 in 4 micro-batches"});
  constexpr int m = 4, kSteps = 6;
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cuda_ledger").string();
  const std::string toml = absl::StrFormat(R"(
[run]
dir = "%s"
[model]
init_from = "tests/data/gpt2_golden/model.bin"
[data]
train = "tests/data/gpt2_golden/tokens.bin"
[train]
batch_size = 4
seq_len = 8
microbatches = %d
steps = %d
[trace]
steps = [1, 1]
[runtime]
device = "cuda"
precision = "%s"
)",
                                           dir, m, kSteps, bf16() ? "bf16" : "fp32");
  auto config = ParseConfig(toml, "ledger.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  auto trainer = Trainer::Create(*config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto* chunk = dynamic_cast<CudaStageModel*>(&(*trainer)->model());
  ASSERT_NE(chunk, nullptr);
  absl::StatusOr<bool> checked = cuda::CheckLaunchesFromEnvironment();
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_TRUE((*trainer)->Step().ok());
  CudaLedger before = chunk->ledger();
  size_t free_after_first = 0, free_now = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after_first, &total), cudaSuccess);
  int64_t launches = -1;
  for (int step = 2; step <= kSteps; ++step) {
    absl::StatusOr<StepStats> stats = (*trainer)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(std::isfinite(stats->loss));
    const CudaLedger after = chunk->ledger();
    EXPECT_EQ(after.allocations - before.allocations, 0) << "step " << step;
    EXPECT_GE(after.syncs - before.syncs, 3) << "step " << step;
    const int64_t per_launch = *checked ? after.launches - before.launches : 0;
    EXPECT_LE(after.syncs - before.syncs, 3 + 2 * m + per_launch) << "step " << step;
    // The same work every step.
    EXPECT_GT(after.launches - before.launches, 0);
    if (launches >= 0) {
      EXPECT_EQ(after.launches - before.launches, launches) << "step " << step;
    }
    launches = after.launches - before.launches;
    before = after;
  }
  // Nor did the libraries allocate device memory behind the ledger's back.
  ASSERT_EQ(cudaMemGetInfo(&free_now, &total), cudaSuccess);
  EXPECT_EQ(free_now, free_after_first);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaModelTest,
                         ::testing::Values(CudaPrecision::kFp32, CudaPrecision::kBf16),
                         [](const auto& info) {
                           return info.param == CudaPrecision::kBf16 ? "bf16" : "fp32";
                         });

TEST(CudaModelTest, MemoryPlanIsReportedAndHeld) {
  testing::PrintShapes({kTinyShape});
  auto gpu = MustCreate(CudaPrecision::kBf16);
  ASSERT_NE(gpu, nullptr);
  EXPECT_GT(gpu->memory_plan().TotalBytes(), 0);
  EXPECT_NE(gpu->Describe().find("bf16"), std::string::npos);
}

// The start-up memory check counts the message buffers a transport that carries device memory
// (NCCL) has the chunk allocate (CudaStageOptions::device_messages): a chunk whose plan fits
// but whose messages do not is refused when it is made, naming them, not at the first step.
TEST(CudaModelTest, MemoryCheckCountsTheDeviceMessages) {
  testing::PrintShapes({kTinyShape});
  auto fits = MustCreate(CudaPrecision::kFp32);
  ASSERT_NE(fits, nullptr);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  CudaStageOptions options;
  options.device_messages = static_cast<int64_t>(free_bytes) / fits->MessageBytes() + 1;
  auto refused = CudaStageModel::Create(Tiny(), WholeModel(Tiny()), kB, kT, 1, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find(
                absl::StrFormat("; %d device messages", options.device_messages)),
            std::string::npos)
      << refused.status();
}

// Training's chunk takes the device's highest stream priority and a side task's model the
// lowest, so that side kernels are what yields when both have work waiting.
TEST(CudaModelTest, TrainingStreamsOutrankSideWork) {
  testing::PrintShapes({kTinyShape});
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  auto training = MustCreate(CudaPrecision::kFp32);
  CudaStageOptions side_options;
  side_options.low_priority = true;
  auto side = CudaStageModel::Create(Tiny(), WholeModel(Tiny()), kB, kT, 1, side_options);
  ASSERT_TRUE(side.ok()) << side.status();
  ASSERT_NE(training, nullptr);
  int training_priority = 1, side_priority = 1;
  ASSERT_EQ(cudaStreamGetPriority(training->stream(), &training_priority), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority((*side)->stream(), &side_priority), cudaSuccess);
  EXPECT_EQ(training_priority, greatest);
  EXPECT_EQ(side_priority, least);
  EXPECT_LT(greatest, least);  // CUDA: lower numbers are higher priorities
}

// The `train` side task on the GPU (its own lowest-priority stream): its loss falls as on the
// CPU (tests/freeride/tasks_test.cc).
TEST(CudaSideTaskTest, TrainTaskLearnsOnTheGpu) {
  testing::PrintShapes({"train task: 1 layer C 32 (2 heads) V 32, B 4 T 16, 80 steps"});
  for (const std::string precision : {"fp32", "bf16"}) {
    auto task = CreateSideTask("train", "");
    ASSERT_TRUE(task.ok());
    TaskArgs args{{"steps", int64_t{80}},  {"n_embd", int64_t{32}}, {"vocab", int64_t{32}},
                  {"seq_len", int64_t{16}}, {"lr", 1e-2},           {"device", std::string("cuda")},
                  {"precision", precision}};
    CappedArena arena(256 << 20);
    const std::string dir = (std::filesystem::path(::testing::TempDir()) / "train_gpu").string();
    SideTaskContext ctx{"train", 0, 0, &args, &arena, dir, 0, [] { return false; }};
    ASSERT_TRUE((*task)->Create(ctx).ok());
    ASSERT_TRUE((*task)->Load(ctx).ok());
    while (!(*task)->Done()) ASSERT_TRUE((*task)->Step(ctx).ok());
    double first = 0, last = 0;
    ASSERT_EQ(std::sscanf((*task)->Summary().c_str(), "80 steps, loss %lf -> %lf", &first, &last), 2)
        << (*task)->Summary();
    EXPECT_NEAR(first, std::log(32.0), 0.3) << precision;
    EXPECT_LT(last, first - 1.0) << precision;
  }
}

// `gpt_infer` on the GPU (recompute engine, fp32) samples what the CPU's key/value-cache
// decoder samples from the same checkpoint and seed.
TEST(CudaSideTaskTest, GptInferOnTheGpuGeneratesWhatTheCpuDoes) {
  testing::PrintShapes({"gpt_infer: golden 2 layers C 32 V 100, batch 3, 6 requests of 7 tokens"});
  std::string text[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    auto task = CreateSideTask("gpt_infer", "");
    ASSERT_TRUE(task.ok());
    TaskArgs args{{"checkpoint", std::string("tests/data/gpt2_golden/model.bin")},
                  {"batch", int64_t{3}}, {"max_tokens", int64_t{7}}, {"requests", int64_t{6}},
                  {"temperature", 1.0}, {"top_k", int64_t{0}}, {"seed", int64_t{5}},
                  {"device", std::string(gpu ? "cuda" : "cpu")}};
    CappedArena arena(256 << 20);
    const std::string dir =
        (std::filesystem::path(::testing::TempDir()) / (gpu ? "infer_gpu" : "infer_cpu")).string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    SideTaskContext ctx{"infer", 0, 0, &args, &arena, dir, 0, [] { return false; }};
    ASSERT_TRUE((*task)->Create(ctx).ok());
    ASSERT_TRUE((*task)->Load(ctx).ok());
    while (!(*task)->Done()) ASSERT_TRUE((*task)->Step(ctx).ok());
    std::ifstream in(dir + "/generations.txt");
    text[gpu].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_FALSE(text[0].empty());
  EXPECT_EQ(text[1], text[0]);
}

// The trainer with runtime.device = "cuda" against the PyTorch golden run the CPU trainer is
// held to (tests/trainer/golden_trajectory.h).
TEST(CudaTrainerTest, MatchesPyTorchGoldenTrajectory) {
  testing::PrintShapes({kGoldenShape});
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "cuda_golden").string();
  auto trainer = Trainer::Create(testing::GoldenConfig(dir, "cuda"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  testing::ExpectGoldenTrajectory(**trainer);
}

}  // namespace
}  // namespace freeride
