// The CUDA chunk running a Llama-family stage against the CPU backend's LlamaStage: one training
// step's loss, gradients and updated weights, a few steps' losses, and a two-stage pipeline of
// two micro-batches with the zero-bubble I/W split (every input gradient before any weight
// gradient, the head's share of the tied wte gradient in its I). fp32 within 1e-5 (the
// gradients 1e-4: sums of thousands of products in another order), bf16 within the GPT-2
// chunk's tolerances (cuda_model_gpu_test.cc). Tied and untied heads, grouped-query attention
// (4 query heads over 2 key/value heads). Every model is small: the emulation build runs them
// all.
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu_stage_model.h"
#include "models/cuda/cuda_stage_model.h"
#include "tests/gpu/emulated.h"
#include "tests/gpu/relative_error.h"
#include "tests/gpu/train_step.h"

namespace freeride {
namespace {

using testing::RelativeError;
using testing::StepResult;
using testing::TrainStep;

GPT2Config TinyLlama(bool tied) {
  absl::StatusOr<GPT2Config> c =
      MakeLlamaConfig(/*n_layer=*/2, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/64,
                      /*max_seq_len=*/32, /*vocab_size=*/200, /*ffn_hidden=*/96,
                      /*rope_theta=*/10000.0, /*norm_eps=*/1e-5, tied);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

constexpr int64_t kB = 2, kT = 16;
constexpr char kShape[] = "llama: 2 layers C 64 (4 heads, 2 kv heads) F 96 V 200, B 2 T 16";

struct Param {
  CudaPrecision precision;
  bool tied;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << (p.precision == CudaPrecision::kBf16 ? "bf16" : "fp32") << (p.tied ? " tied" : " untied");
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(info.param.precision == CudaPrecision::kBf16 ? "bf16" : "fp32") +
         (info.param.tied ? "_tied" : "_untied");
}

class CudaLlamaTest : public ::testing::TestWithParam<Param> {
 protected:
  bool bf16() const { return GetParam().precision == CudaPrecision::kBf16; }
  GPT2Config config() const { return TinyLlama(GetParam().tied); }
  std::unique_ptr<StageModel> Cuda(const StageSpec& stage, int slots,
                                   cuda::KernelMode kernels = cuda::KernelMode::kAuto) const {
    CudaStageOptions options;
    options.precision = GetParam().precision;
    options.kernels = kernels;
    auto m = CudaStageModel::Create(config(), stage, kB, kT, slots, options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::unique_ptr<StageModel>(*std::move(m)) : nullptr;
  }
};

// Both arms of runtime.kernels: the multi-tensor norm and AdamW ("auto") and one launch per
// tensor ("reference") each walk the family's tensors (no biases, no wpe, an untied head).
TEST_P(CudaLlamaTest, OneTrainingStepMatchesTheCpuBackend) {
  testing::PrintShapes({kShape});
  for (cuda::KernelMode kernels : {cuda::KernelMode::kAuto, cuda::KernelMode::kReference}) {
    SCOPED_TRACE(kernels == cuda::KernelMode::kAuto ? "kernels auto" : "kernels reference");
    CpuLlamaStageModel cpu(config(), WholeModel(config()), kB, kT, 1);
    auto gpu = Cuda(WholeModel(config()), 1, kernels);
    ASSERT_NE(gpu, nullptr);
    EXPECT_NE(gpu->Describe().find("llama"), std::string::npos) << gpu->Describe();
    ASSERT_TRUE(cpu.InitRandom(7).ok());
    ASSERT_TRUE(gpu->InitRandom(7).ok());
    const StepResult want = TrainStep(cpu, 1, 3), got = TrainStep(*gpu, 1, 3);
    EXPECT_NEAR(got.loss, want.loss, (bf16() ? 2e-2 : 1e-5) * want.loss);
    ASSERT_EQ(got.units.size(), want.units.size());
    for (size_t u = 0; u < want.units.size(); ++u) {
      EXPECT_NEAR(got.units[u], want.units[u], (bf16() ? 5e-2 : 1e-4) * want.units[u])
          << "unit " << u;
    }
    EXPECT_LT(RelativeError(got.grads, want.grads), bf16() ? 5e-2 : 1e-4);
    EXPECT_LT(RelativeError(got.params, want.params), bf16() ? 2e-2 : 1e-5);
  }
}

TEST_P(CudaLlamaTest, FiveStepLossesFollowTheCpu) {
  testing::PrintShapes({kShape});
  CpuLlamaStageModel cpu(config(), WholeModel(config()), kB, kT, 1);
  auto gpu = Cuda(WholeModel(config()), 1);
  ASSERT_NE(gpu, nullptr);
  ASSERT_TRUE(cpu.InitRandom(11).ok());
  ASSERT_TRUE(gpu->InitRandom(11).ok());
  double first = 0, last = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    // The same batch every step: the loss must fall, on both devices alike.
    const double want = TrainStep(cpu, step, 5).loss, got = TrainStep(*gpu, step, 5).loss;
    EXPECT_NEAR(got, want, (bf16() ? 2e-2 : 1e-5) * want) << "step " << step;
    (step == 1 ? first : last) = got;
  }
  EXPECT_LT(last, first);
}

// Two stages (embedding + layer 0 | layer 1 + head), two micro-batches: F0 F1, then both Is in
// reverse, then both Ws, the head's tied share in its I (as post-validation runs it). Each
// stage's gradients against the CPU's under the same calls.
std::vector<std::vector<float>> PipelineGrads(std::vector<std::unique_ptr<StageModel>>& stages) {
  const int64_t BT = kB * kT;
  std::mt19937 rng(21);
  std::vector<int32_t> tokens[2], targets[2];
  for (int m = 0; m < 2; ++m) {
    for (auto* v : {&tokens[m], &targets[m]}) {
      v->resize(BT);
      for (int32_t& t : *v) t = static_cast<int32_t>(rng() % 200);
    }
  }
  StageModel& first = *stages[0];
  StageModel& last = *stages[1];
  absl::StatusOr<MessageBuffer> message = first.AllocateMessageBuffer(MessageMemory::kHost);
  EXPECT_TRUE(message.ok());
  for (auto& s : stages) EXPECT_TRUE(s->ZeroGrads().ok());
  last.SetHeadGradInBackwardInput(true);
  for (int m = 0; m < 2; ++m) {
    EXPECT_TRUE(first.SetTokens(m, tokens[m].data()).ok());
    EXPECT_TRUE(first.Forward(m).ok());
    EXPECT_TRUE(first.GetOutputActivations(m, message->get()).ok());
    EXPECT_TRUE(last.SetInputActivations(m, message->get()).ok());
    EXPECT_TRUE(last.FinishMessageReads().ok());
    EXPECT_TRUE(last.SetTargets(m, targets[m].data()).ok());
    EXPECT_TRUE(last.Forward(m).ok());
  }
  for (int m = 1; m >= 0; --m) {
    EXPECT_TRUE(last.BackwardInput(m, 1.0f / (2 * BT)).ok());
    EXPECT_TRUE(last.GetInputGrad(m, message->get()).ok());
    EXPECT_TRUE(first.SetOutputGrad(m, message->get()).ok());
    EXPECT_TRUE(first.FinishMessageReads().ok());
    EXPECT_TRUE(first.BackwardInput(m, 1.0f / (2 * BT)).ok());
  }
  for (int m = 0; m < 2; ++m) {
    for (auto& s : stages) EXPECT_TRUE(s->BackwardWeight(m).ok());
  }
  std::vector<std::vector<float>> grads;
  for (auto& s : stages) {
    EXPECT_TRUE(s->FoldHeadWteGrad().ok());
    absl::StatusOr<float*> g = s->HostGrads(0, s->num_params());
    EXPECT_TRUE(g.ok());
    grads.emplace_back(g.ok() ? std::vector<float>(*g, *g + s->num_params())
                              : std::vector<float>());
  }
  return grads;
}

TEST_P(CudaLlamaTest, TwoStagePipelineWithSplitBackwardMatchesTheCpu) {
  testing::PrintShapes({kShape});
  const StageSpec specs[2] = {{0, 1, true, false}, {1, 2, false, true}};
  std::vector<std::unique_ptr<StageModel>> cpu, gpu;
  for (const StageSpec& spec : specs) {
    cpu.push_back(std::make_unique<CpuLlamaStageModel>(config(), spec, kB, kT, 2));
    gpu.push_back(Cuda(spec, 2));
    ASSERT_NE(gpu.back(), nullptr);
    ASSERT_TRUE(cpu.back()->InitRandom(17).ok());
    ASSERT_TRUE(gpu.back()->InitRandom(17).ok());
  }
  const auto want = PipelineGrads(cpu), got = PipelineGrads(gpu);
  for (int s = 0; s < 2; ++s) {
    EXPECT_LT(RelativeError(got[s], want[s]), bf16() ? 5e-2 : 1e-4) << "stage " << s;
  }
}

// An inference-only chunk (gpt_infer's recompute engine on CUDA: no gradients, optimizer or
// backward buffers) gives the CPU's logits at every position.
TEST_P(CudaLlamaTest, AnInferenceChunkGivesTheCpusLogits) {
  testing::PrintShapes({kShape});
  CpuLlamaStageModel cpu(config(), WholeModel(config()), kB, kT, 1);
  CudaStageOptions options;
  options.precision = GetParam().precision;
  options.inference_only = true;
  auto gpu = CudaStageModel::Create(config(), WholeModel(config()), kB, kT, 1, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.InitRandom(23).ok());
  ASSERT_TRUE((*gpu)->InitRandom(23).ok());
  std::mt19937 rng(29);
  std::vector<int32_t> tokens(kB * kT);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 200);
  const int64_t Vp = config().padded_vocab_size;
  for (StageModel* m : {static_cast<StageModel*>(&cpu), static_cast<StageModel*>(gpu->get())}) {
    ASSERT_TRUE(m->SetTokens(0, tokens.data()).ok());
    ASSERT_TRUE(m->SetTargets(0, tokens.data()).ok());
    ASSERT_TRUE(m->Forward(0).ok());
  }
  for (int64_t t : {int64_t{0}, kT / 2, kT - 1}) {
    std::vector<float> want(kB * Vp), got(kB * Vp);
    ASSERT_TRUE(cpu.GetLogitsAt(0, t, want.data()).ok());
    ASSERT_TRUE((*gpu)->GetLogitsAt(0, t, got.data()).ok());
    EXPECT_LT(RelativeError(got, want), bf16() ? 2e-2 : 1e-5) << "position " << t;
  }
  EXPECT_FALSE((*gpu)->BackwardInput(0, 1.0f).ok()) << "inference only";
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaLlamaTest,
                         ::testing::Values(Param{CudaPrecision::kFp32, true},
                                           Param{CudaPrecision::kFp32, false},
                                           Param{CudaPrecision::kBf16, true},
                                           Param{CudaPrecision::kBf16, false}),
                         Name);

}  // namespace
}  // namespace freeride
