// The Llama-family stage: gradients against float64 finite differences (tied and untied head,
// grouped-query attention), float against double, split backward equal to combined backward,
// pipeline stages equal to the whole model bit for bit, and the config's rules.
#include "models/llama.h"

#include <cmath>
#include <cstring>

#include "models/cpu/llama_kernels.h"
#include "models/cpu_stage_model.h"
#include "models/llmc_checkpoint.h"
#include "tests/models/grad_check.h"
#include "tests/models/stage_checks.h"

namespace freeride {
namespace {

// 4 query heads sharing 2 key/value heads of size 4; SwiGLU width 24.
GPT2Config TinyLlamaModel(bool tied, int64_t layers = 2) {
  return *MakeLlamaConfig(layers, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/16,
                          /*max_seq_len=*/8, /*vocab_size=*/11, /*ffn_hidden=*/24,
                          /*rope_theta=*/100.0, /*norm_eps=*/1e-5, tied);
}

using testing::FillBatch;

void CheckWholeModelGradients(bool tied) {
  const GPT2Config cfg = TinyLlamaModel(tied);
  LlamaStage<double> m(cfg, WholeModel(cfg), /*micro_batch=*/2, /*seq_len=*/5, /*slots=*/1);
  // Larger weights than the init so every path (rotations, gates, attention) carries a
  // gradient worth checking.
  const auto random = testing::RandomVector(m.num_params(), 31, 0.3);
  std::copy(random.begin(), random.end(), m.params());
  FillBatch(m, 0, 32);
  auto loss = [&] { return m.Forward(0); };
  loss();
  m.ZeroGrads();
  m.BackwardInput(0, 1.0 / (2 * 5));
  m.BackwardWeight(0);
  m.FoldHeadWteGrad();
  int checked = 0;
  for (const TensorSlot& s : m.layout().slots) {
    if (!s.present) continue;
    ++checked;
    // The vocabulary matrices' padded rows: no gradient (checked exactly, not by differences).
    const bool vocab = s.tensor == ParamTensor::kWte || s.tensor == ParamTensor::kLmHead;
    const int64_t n = vocab ? cfg.vocab_size * cfg.n_embd : s.elements;
    for (int64_t i = n; i < s.elements; ++i) ASSERT_EQ(m.grads()[s.offset + i], 0.0) << i;
    testing::ExpectGradientsMatch(ParamTensorName(s.tensor), m.params() + s.offset,
                                  static_cast<size_t>(n), m.grads() + s.offset, loss, 1e-6);
  }
  // wte, ln1w, qkvw, attprojw, ln2w, fcw, fcprojw, lnfw (+ lmhead untied).
  EXPECT_EQ(checked, tied ? 8 : 9);
}

TEST(LlamaTest, TiedGradientsMatchFiniteDifferences) { CheckWholeModelGradients(true); }
TEST(LlamaTest, UntiedGradientsMatchFiniteDifferences) { CheckWholeModelGradients(false); }

TEST(LlamaTest, InputGradientOfAMiddleStageMatchesFiniteDifferences) {
  const GPT2Config cfg = TinyLlamaModel(false, 3);
  const StageSpec middle{1, 2, false, false};
  LlamaStage<double> m(cfg, middle, 1, 4, 1);
  const auto random = testing::RandomVector(m.num_params(), 41, 0.3);
  std::copy(random.begin(), random.end(), m.params());
  const int64_t n = 4 * cfg.n_embd;
  const auto x = testing::RandomVector(n, 42);
  const auto dy = testing::RandomVector(n, 43);  // loss = <dy, y>
  std::copy(x.begin(), x.end(), m.input_activations(0));
  auto loss = [&] {
    m.Forward(0);
    return testing::Dot(dy, m.output_activations(0));
  };
  loss();
  std::copy(dy.begin(), dy.end(), m.output_grad(0));
  m.BackwardInput(0, 1.0);
  std::vector<double> dx(m.input_grad(0), m.input_grad(0) + n);
  testing::ExpectGradientsMatch("input", m.input_activations(0), static_cast<size_t>(n), dx.data(),
                                loss, 1e-6);
}

// Float against double, within bounds derived from float's unit roundoff u = 2^-24 rather than
// tuned on one CPU (vector width, FMA contraction and OpenBLAS's kernels differ between CPUs).
// The yardstick is what rounding every parameter to float moves, to first order, computed in
// double: the loss by u·Σ_j |θ_j·∂L/∂θ_j|, gradient i by u·Σ_j |θ_j·∂g_i/∂θ_j| (the Hessian's
// columns by central differences). The float model's own arithmetic adds roundings of the same
// size, random in sign, so its error is held to 4 yardsticks plus each result's own rounding
// (measured on an AVX2 build, 2026-12-07: the loss 0.05 yardsticks, the worst gradient 0.42); a
// kernel that lost float's precision or computed something else would be off by orders more.
// The parameters are float's own values on both sides, so that only the arithmetic differs.
TEST(LlamaTest, FloatFollowsDouble) {
  const GPT2Config cfg = TinyLlamaModel(false);
  LlamaStage<double> d(cfg, WholeModel(cfg), 2, 6, 1);
  LlamaStage<float> f(cfg, WholeModel(cfg), 2, 6, 1);
  d.InitRandom(5);
  f.InitRandom(5);
  for (int64_t i = 0; i < d.num_params(); ++i) {
    d.params()[i] = static_cast<float>(d.params()[i] * 10);  // livelier than the init
    f.params()[i] = static_cast<float>(d.params()[i]);
  }
  FillBatch(d, 0, 6);
  FillBatch(f, 0, 6);
  const int64_t n = d.num_params();
  auto gradients = [&](std::vector<double>* g) {
    d.ZeroGrads();
    d.BackwardInput(0, 1.0 / 12);
    d.BackwardWeight(0);
    g->assign(d.grads(), d.grads() + n);
  };
  const double loss = d.Forward(0);
  std::vector<double> grads, plus, minus;
  gradients(&grads);
  double loss_yardstick = 0;
  std::vector<double> grad_yardstick(n, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const double theta = d.params()[j];
    loss_yardstick += std::fabs(theta * grads[j]);
    if (theta == 0) continue;
    const double h = 1e-6 * std::fabs(theta);
    d.params()[j] = theta + h;
    d.Forward(0);
    gradients(&plus);
    d.params()[j] = theta - h;
    d.Forward(0);
    gradients(&minus);
    d.params()[j] = theta;
    for (int64_t i = 0; i < n; ++i) {
      grad_yardstick[i] += std::fabs(theta * (plus[i] - minus[i]) / (2 * h));
    }
  }
  constexpr double u = 0x1p-24;
  EXPECT_NEAR(f.Forward(0), loss, 4 * u * loss_yardstick + u * loss);
  f.ZeroGrads();
  f.BackwardInput(0, 1.0f / 12);
  f.BackwardWeight(0);
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double bound = 4 * u * grad_yardstick[i] + u * std::fabs(grads[i]);
    worst = std::max(worst, std::fabs(f.grads()[i] - grads[i]) / bound);
    scale = std::max(scale, std::fabs(grads[i]));
  }
  EXPECT_GT(scale, 0);
  EXPECT_LE(worst, 1.0) << "the worst gradient's error in units of its bound";
}

TEST(LlamaTest, RandomInitLossIsLogVocab) {
  const GPT2Config cfg =
      *MakeLlamaConfig(2, 4, 1, 32, 16, 50257, LlamaFfnHidden(32, 1.0, 32), 10000, 1e-5, false);
  LlamaStage<float> m(cfg, WholeModel(cfg), 2, 16, 1);
  m.InitRandom(1337);
  FillBatch(m, 0, 3);
  EXPECT_NEAR(m.Forward(0), std::log(50257.0), 0.1);
}

TEST(LlamaTest, SplitBackwardEqualsInterleavedBitForBit) {
  testing::ExpectSplitBackwardEqualsInterleaved<LlamaStage<float>>(TinyLlamaModel(true, 3));
}

void CheckStagesReproduceTheWholeModel(bool tied) {
  const GPT2Config cfg = TinyLlamaModel(tied, 3);
  const int64_t BT = 10, C = cfg.n_embd;
  LlamaStage<float> whole(cfg, WholeModel(cfg), 2, 5, 1);
  whole.InitRandom(9);
  const std::vector<StageSpec> specs = *SplitIntoStages(cfg, 2, {2, 1});
  LlamaStage<float> s0(cfg, specs[0], 2, 5, 1), s1(cfg, specs[1], 2, 5, 1);
  s0.InitRandom(9);
  s1.InitRandom(9);
  // Seeded per (tensor, layer): a stage initialises exactly its slice of the whole model.
  std::vector<float> sliced(s1.num_params());
  CopyStageFromWhole(cfg, specs[1], whole.params(), sliced.data());
  EXPECT_EQ(0, std::memcmp(sliced.data(), s1.params(), sliced.size() * sizeof(float)));
  EXPECT_EQ(s1.layout().slot(ParamTensor::kWte).present, tied);
  EXPECT_EQ(s1.layout().slot(ParamTensor::kLmHead).present, !tied);

  FillBatch(whole, 0, 4);
  std::memcpy(s0.tokens(0), whole.tokens(0), BT * sizeof(int32_t));
  std::memcpy(s1.targets(0), whole.targets(0), BT * sizeof(int32_t));
  const double loss = whole.Forward(0);
  s0.Forward(0);
  std::memcpy(s1.input_activations(0), s0.output_activations(0), BT * C * sizeof(float));
  EXPECT_EQ(loss, s1.Forward(0));

  for (LlamaStage<float>* m : {&whole, &s0, &s1}) m->ZeroGrads();
  whole.BackwardInput(0, 0.1f);
  whole.BackwardWeight(0);
  whole.FoldHeadWteGrad();
  s1.BackwardInput(0, 0.1f);
  s1.BackwardWeight(0);
  s1.FoldHeadWteGrad();
  std::memcpy(s0.output_grad(0), s1.input_grad(0), BT * C * sizeof(float));
  s0.BackwardInput(0, 0.1f);
  s0.BackwardWeight(0);
  // The tied all-reduce (tied only): the embedding's share + the head's share.
  for (int64_t i = 0; i < TiedElements(cfg); ++i) {
    s0.grad(ParamTensor::kWte)[i] += s1.grad(ParamTensor::kWte)[i];
  }
  std::vector<float> joined(whole.num_params(), 0.0f);
  if (tied) {
    std::fill(s1.grad(ParamTensor::kWte), s1.grad(ParamTensor::kWte) + TiedElements(cfg), 0.0f);
  }
  CopyStageToWhole(cfg, specs[1], s1.grads(), joined.data());
  CopyStageToWhole(cfg, specs[0], s0.grads(), joined.data());
  EXPECT_EQ(0, std::memcmp(joined.data(), whole.grads(), joined.size() * sizeof(float)));
}

TEST(LlamaTest, TiedStagesReproduceTheWholeModelBitForBit) {
  CheckStagesReproduceTheWholeModel(true);
}
TEST(LlamaTest, UntiedStagesReproduceTheWholeModelBitForBit) {
  CheckStagesReproduceTheWholeModel(false);
}

TEST(LlamaTest, RotationIsUndoneByItsInverse) {
  std::vector<double> cos, sin;
  cpu::RopeTables(&cos, &sin, 3, 4, 10000.0);
  EXPECT_EQ(cos[0], 1.0);                                     // position 0 is not rotated
  EXPECT_NEAR(sin[1 * 2 + 0], std::sin(1.0), 1e-15);          // position 1, frequency 1
  EXPECT_NEAR(sin[2 * 2 + 1], std::sin(2.0 / 100.0), 1e-15);  // position 2, 10000^(-2/4)
  const auto x = testing::RandomVector(3 * 10, 3);
  std::vector<double> y = x;
  cpu::RopeInPlace(y.data(), cos.data(), sin.data(), 1, 3, 2, 4, 10, false);
  EXPECT_NE(y[10], x[10]);
  EXPECT_EQ(y[8], x[8]);  // past the rotated heads
  cpu::RopeInPlace(y.data(), cos.data(), sin.data(), 1, 3, 2, 4, 10, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14) << i;
}

TEST(LlamaConfigTest, FfnWidthRoundsAsLlama3Does) {
  EXPECT_EQ(LlamaFfnHidden(4096, 1.3, 1024), 14336);  // Llama 3 8B
  EXPECT_EQ(LlamaFfnHidden(4096, 1.0, 256), 11008);   // Llama 2 7B
  EXPECT_EQ(LlamaFfnHidden(32, 1.0, 32), 96);         // 85 rounded up
}

TEST(LlamaConfigTest, Llama3_8BHasItsParameterCount) {
  const GPT2Config cfg = *MakeLlamaConfig(32, 32, 8, 4096, 8192, 128256, 14336, 500000, 1e-5,
                                          /*tie_embeddings=*/false);
  EXPECT_EQ(NumParameters(cfg), 8030261248);
}

TEST(LlamaConfigTest, BadShapesNameTheKey) {
  auto bad = MakeLlamaConfig(2, 4, 3, 16, 8, 11, 24, 1e4, 1e-5, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.n_kv_head (3)"), std::string::npos);
  bad = MakeLlamaConfig(2, 4, 2, 12, 8, 11, 24, 1e4, 1e-5, true);  // head size 3
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("even head size"), std::string::npos);
  bad = MakeLlamaConfig(2, 4, 2, 16, 8, 11, 0, 1e4, 1e-5, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.ffn_hidden"), std::string::npos);
  bad = MakeLlamaConfig(2, 4, 2, 16, 8, 11, 24, 0, 1e-5, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.rope_theta"), std::string::npos);
}

TEST(LlamaConfigTest, CpuChunkIsLlamaAndTheMemoryPlanIsWhatItAllocates) {
  const GPT2Config cfg = TinyLlamaModel(false, 3);
  const StageSpec spec{0, 2, true, true};
  LlamaStage<float> m(cfg, spec, 2, 5, 3);
  EXPECT_EQ(TotalBytes(PlanLlamaStageMemory(cfg, spec, 2, 5, 3, sizeof(float))), m.HostBytes());
  CpuLlamaStageModel chunk(cfg, WholeModel(cfg), 1, 4, 1);
  EXPECT_EQ(chunk.num_params(), NumParameters(cfg));
  // Units: the embedding, 3 layers, the final norm with the untied head.
  EXPECT_EQ(chunk.GradSquaresByUnit()->size(), 5u);
}

}  // namespace
}  // namespace freeride
