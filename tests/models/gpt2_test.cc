// The whole GPT-2 stage: gradients against float64 finite differences, split backward equal to
// combined backward, pipeline stages equal to the whole model bit for bit.
#include "models/gpt2.h"

#include <cmath>
#include <cstring>

#include "models/cpu_stage_model.h"
#include "models/kv_decoder.h"
#include "models/llmc_checkpoint.h"
#include "tests/models/grad_check.h"
#include "tests/models/stage_checks.h"

namespace freeride {
namespace {

GPT2Config Tiny(int64_t layers = 2, int64_t vocab = 11) {
  return *MakeGPT2Config(layers, /*n_head=*/2, /*n_embd=*/8, /*max_seq_len=*/6, vocab);
}

using testing::FillBatch;

TEST(GPT2Test, WholeModelGradientsMatchFiniteDifferences) {
  const GPT2Config cfg = Tiny();
  GPT2Stage<double> m(cfg, WholeModel(cfg), /*micro_batch=*/2, /*seq_len=*/4, /*slots=*/1);
  // Larger weights than GPT-2's init so every path carries a gradient worth checking.
  const auto random = testing::RandomVector(m.num_params(), 21, 0.3);
  std::copy(random.begin(), random.end(), m.params());
  FillBatch(m, 0, 22);
  auto loss = [&] { return m.Forward(0); };
  loss();
  m.ZeroGrads();
  m.BackwardInput(0, 1.0 / (2 * 4));
  m.BackwardWeight(0);
  m.FoldHeadWteGrad();
  for (int i = 0; i < kNumParamTensors; ++i) {
    const TensorSlot& s = m.layout().slots[i];
    testing::ExpectGradientsMatch(ParamTensorName(s.tensor), m.params() + s.offset,
                                  static_cast<size_t>(s.elements), m.grads() + s.offset, loss,
                                  1e-6);
  }
}

TEST(GPT2Test, RandomInitLossIsLogVocab) {
  const GPT2Config cfg = *MakeGPT2Config(2, 2, 32, 16, 50257);
  GPT2Stage<float> m(cfg, WholeModel(cfg), 2, 16, 1);
  m.InitRandom(1337);
  FillBatch(m, 0, 3);
  EXPECT_NEAR(m.Forward(0), std::log(50257.0), 0.1);
}

TEST(GPT2Test, SplitBackwardEqualsInterleavedBitForBit) {
  testing::ExpectSplitBackwardEqualsInterleaved<GPT2Stage<float>>(Tiny(3));
}

TEST(GPT2Test, StagesReproduceTheWholeModelBitForBit) {
  const GPT2Config cfg = Tiny(3);
  GPT2Stage<float> whole(cfg, WholeModel(cfg), 2, 5, 1);
  whole.InitRandom(9);
  const std::vector<StageSpec> specs = *SplitIntoStages(cfg, 2, {2, 1});
  GPT2Stage<float> s0(cfg, specs[0], 2, 5, 1), s1(cfg, specs[1], 2, 5, 1);
  s0.InitRandom(9);
  s1.InitRandom(9);
  // Seeded per (tensor, layer): a stage initialises exactly its slice of the whole model.
  std::vector<float> sliced(s1.num_params());
  CopyStageFromWhole(cfg, specs[1], whole.params(), sliced.data());
  EXPECT_EQ(0, std::memcmp(sliced.data(), s1.params(), sliced.size() * sizeof(float)));

  FillBatch(whole, 0, 4);
  std::memcpy(s0.tokens(0), whole.tokens(0), 10 * sizeof(int32_t));
  std::memcpy(s1.targets(0), whole.targets(0), 10 * sizeof(int32_t));
  const double loss = whole.Forward(0);
  s0.Forward(0);
  std::memcpy(s1.input_activations(0), s0.output_activations(0), 10 * 8 * sizeof(float));
  EXPECT_EQ(loss, s1.Forward(0));

  for (GPT2Stage<float>* m : {&whole, &s0, &s1}) m->ZeroGrads();
  whole.BackwardInput(0, 0.1f);
  whole.BackwardWeight(0);
  whole.FoldHeadWteGrad();
  s1.BackwardInput(0, 0.1f);
  s1.BackwardWeight(0);
  s1.FoldHeadWteGrad();
  std::memcpy(s0.output_grad(0), s1.input_grad(0), 10 * 8 * sizeof(float));
  s0.BackwardInput(0, 0.1f);
  s0.BackwardWeight(0);
  // The tied all-reduce: first stage's embedding share + last stage's head share.
  const int64_t wte = cfg.padded_vocab_size * cfg.n_embd;
  for (int64_t i = 0; i < wte; ++i) s0.grad(ParamTensor::kWte)[i] += s1.grad(ParamTensor::kWte)[i];
  std::vector<float> joined(whole.num_params(), 0.0f);
  CopyStageToWhole(cfg, specs[1], s1.grads(), joined.data());
  CopyStageToWhole(cfg, specs[0], s0.grads(), joined.data());
  EXPECT_EQ(0, std::memcmp(joined.data(), whole.grads(), joined.size() * sizeof(float)));
}

TEST(GPT2Test, BalancedStagesWeighTheHeadAndEmbedding) {
  GPT2Config cfg = *MakeGPT2Config(8, 2, 16, 8, 64);
  // A head worth 3 blocks: the last stage gives up blocks until no stage costs more than 6.
  auto two = *BalancedStages(cfg, 2, PartCosts{0, 1, 3});
  EXPECT_EQ(two[0].num_layers(), 6);
  EXPECT_EQ(two[1].num_layers(), 2);
  EXPECT_TRUE(two[0].has_embedding && two[1].has_head);
  // Four pieces: the costliest is the head's (1 block + 3), and no other exceeds it.
  auto four = *BalancedStages(cfg, 4, PartCosts{0.5, 1, 3});
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(four[3].num_layers(), 1);
  EXPECT_LE(four[0].num_layers() + 0.5, 4.0);
  int64_t total = 0;
  for (const StageSpec& s : four) total += s.num_layers();
  EXPECT_EQ(total, 8);
  // Free parts: an even split.
  auto even = *BalancedStages(cfg, 4, PartCosts{0, 1, 0});
  for (const StageSpec& s : even) EXPECT_EQ(s.num_layers(), 2);
  EXPECT_FALSE(BalancedStages(cfg, 9, PartCosts{0, 1, 1}).ok());
  // The FLOP model: GPT-2 124M's head (2·C·V) is about 5.6 blocks at T = 1024.
  GPT2Config gpt2 = *MakeGPT2Config(12, 12, 768, 1024, 50257);
  const PartCosts flops = FlopPartCosts(gpt2, 1024);
  EXPECT_NEAR(flops.head / flops.block, 2.0 * 768 * 50304 / (24.0 * 768 * 768 + 4 * 1024 * 768),
              1e-9);
}

TEST(GPT2Test, SplitIntoStagesEvenAndExplicit) {
  const GPT2Config cfg = Tiny(5);
  auto even = *SplitIntoStages(cfg, 2, {});
  EXPECT_EQ(even[0], (StageSpec{0, 3, true, false}));
  EXPECT_EQ(even[1], (StageSpec{3, 5, false, true}));
  EXPECT_FALSE(SplitIntoStages(cfg, 6, {}).ok());
  auto bad = SplitIntoStages(cfg, 2, {1, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("summing to n_layer = 5"), std::string::npos);
}

TEST(GPT2Test, Gpt2SmallHas124MParameters) {
  const GPT2Config cfg = *MakeGPT2Config(12, 12, 768, 1024, 50257);
  EXPECT_EQ(cfg.padded_vocab_size, 50304);
  EXPECT_EQ(NumParameters(cfg), 124475904);  // llm.c prints this for GPT-2 small
}

}  // namespace
}  // namespace freeride

namespace freeride {
namespace {

// The KV-cache decoder gives, position by position, the logits of the full forward pass.
TEST(GPT2DecoderTest, MatchesTheFullForwardPass) {
  const GPT2Config cfg = *MakeGPT2Config(2, 2, 16, 8, 50);
  GPT2Stage<float> full(cfg, WholeModel(cfg), /*micro_batch=*/2, /*seq_len=*/6, 1);
  full.InitRandom(11);
  // Livelier weights than GPT-2's init so the attention is far from uniform.
  for (int64_t i = 0; i < full.num_params(); ++i) full.params()[i] *= 8.0f;
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) full.tokens(0)[i] = rng() % 50, full.targets(0)[i] = 0;
  full.Forward(0);
  auto decoder = MakeKvDecoder<float>(cfg, full.params(), /*batch=*/2, /*max_len=*/6);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const int64_t Vp = cfg.padded_vocab_size;
  for (int64_t t = 0; t < 6; ++t) {
    const int32_t step_tokens[2] = {full.tokens(0)[t], full.tokens(0)[6 + t]};
    const float* logits = *(*decoder)->Step(step_tokens);
    for (int64_t b = 0; b < 2; ++b) {
      const float* expected = full.logits(0) + (b * 6 + t) * Vp;
      for (int64_t v = 0; v < cfg.vocab_size; ++v) {
        EXPECT_NEAR(logits[b * Vp + v], expected[v], 1e-4 * (1 + std::fabs(expected[v])))
            << "batch " << b << " position " << t << " token " << v;
      }
    }
  }
}

// Ids outside the vocabulary are refused at the model's door with the first bad position,
// whichever way they come in; ids at both ends of the range are taken.
TEST(CpuStageModelTest, TokenIdsOutsideTheVocabularyAreRefused) {
  const GPT2Config cfg = Tiny();  // vocabulary 11
  CpuStageModel m(cfg, WholeModel(cfg), /*micro_batch=*/1, /*seq_len=*/4, /*slots=*/1);
  const int32_t good[4] = {0, 10, 3, 4};
  EXPECT_TRUE(m.SetTokens(0, good).ok());
  EXPECT_TRUE(m.SetTargets(0, good).ok());
  const int32_t too_big[4] = {1, 2, 11, 3}, negative[4] = {1, -1, 2, 3};
  absl::Status s = m.SetTokens(0, too_big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tokens[2] = 11: outside the model's vocabulary [0, 11)");
  s = m.SetTargets(0, negative);
  EXPECT_EQ(s.message(), "targets[1] = -1: outside the model's vocabulary [0, 11)");
}

}  // namespace
}  // namespace freeride
