// Activation recomputation (models/recompute.h) in GPT2Stage and LlamaStage: every mode gives
// the same bits as keeping everything, in any order of Forward, BackwardInput and
// BackwardWeight the schedules use (W deferred past other slots' work included), and a slot
// holds what its mode keeps, in closed form.
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "models/gpt2.h"
#include "models/llama.h"

namespace freeride {
namespace {

GPT2Config TinyRecompute() {
  return *MakeGPT2Config(/*layers=*/3, /*n_head=*/2, /*n_embd=*/8, 6, 11);
}
// 4 query heads sharing 2 key/value heads of 4 (kv = 8), SwiGLU width 24.
GPT2Config TinyRecomputeLlama(bool tied) {
  return *MakeLlamaConfig(/*n_layer=*/3, /*n_head=*/4, /*n_kv_head=*/2, /*n_embd=*/16,
                          /*max_seq_len=*/6, /*vocab_size=*/11, /*ffn_hidden=*/24, 1e4, 1e-5, tied);
}

// One call of a slot's life: 'F', 'I' or 'W'.
struct Call {
  char op;
  int slot;
};

// What a stage made from the same parameters and inputs: every gradient, and per slot its
// loss, output activations and input gradient.
struct Outcome {
  std::vector<float> grads;
  std::vector<double> losses;
  std::vector<std::vector<float>> outputs, input_grads;
};

// GPT2Stage<float> or LlamaStage<float>: the same contract.
template <typename Stage>
Outcome RunCalls(const GPT2Config& cfg, const StageSpec& spec, Recompute mode,
                 const std::vector<Call>& calls) {
  constexpr int kSlots = 3;
  constexpr int64_t B = 2, T = 5;
  Stage m(cfg, spec, B, T, kSlots, mode);
  m.InitRandom(11);
  m.ZeroGrads();
  const int64_t BT = B * T, BTC = BT * cfg.n_embd;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (int s = 0; s < kSlots; ++s) {
    for (int64_t i = 0; i < BT; ++i) {
      if (spec.has_embedding) m.tokens(s)[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
      if (spec.has_head) m.targets(s)[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
    }
    if (!spec.has_embedding) {
      for (int64_t i = 0; i < BTC; ++i) m.input_activations(s)[i] = normal(rng);
    }
  }
  Outcome out;
  out.losses.assign(kSlots, 0);
  out.outputs.resize(kSlots);
  out.input_grads.resize(kSlots);
  for (const Call& c : calls) {
    switch (c.op) {
      case 'F':
        out.losses[c.slot] = m.Forward(c.slot);
        if (!spec.has_head) {
          out.outputs[c.slot].assign(m.output_activations(c.slot),
                                     m.output_activations(c.slot) + BTC);
          // The next stage's gradient arrives before this slot's BackwardInput.
          for (int64_t i = 0; i < BTC; ++i) m.output_grad(c.slot)[i] = normal(rng) * 0.01f;
        }
        break;
      case 'I':
        m.BackwardInput(c.slot, 1.0f / (kSlots * BT));
        out.input_grads[c.slot].assign(m.input_grad(c.slot), m.input_grad(c.slot) + BTC);
        break;
      case 'W':
        m.BackwardWeight(c.slot);
        break;
    }
  }
  m.FoldHeadWteGrad();
  out.grads.assign(m.grads(), m.grads() + m.num_params());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every gradient, loss, output and input gradient of `Stage` under selective and full is the
// bits of none's, for each kind of stage in each order of calls the schedules use.
template <typename Stage>
void ExpectEveryModeGivesTheSameBits(const GPT2Config& cfg) {
  const std::vector<std::pair<const char*, StageSpec>> stages = {
      {"whole model", WholeModel(cfg)},
      {"first stage", {0, 2, true, false}},
      {"middle stage", {1, 2, false, false}},
      {"last stage", {1, 3, false, true}},
  };
  const std::vector<std::pair<const char*, std::vector<Call>>> orders = {
      // B = I then W at once (GPipe, 1F1B, interleaved).
      {"1f1b",
       {{'F', 0}, {'F', 1}, {'I', 0}, {'W', 0}, {'F', 2}, {'I', 1}, {'W', 1}, {'I', 2}, {'W', 2}}},
      // Zero-bubble: W deferred past other slots' forwards and input gradients.
      {"zero bubble",
       {{'F', 0}, {'F', 1}, {'I', 0}, {'F', 2}, {'I', 1}, {'W', 0}, {'I', 2}, {'W', 2}, {'W', 1}}},
      // Every W after every I, the reverse order.
      {"all W last",
       {{'F', 0}, {'F', 1}, {'F', 2}, {'I', 0}, {'I', 1}, {'I', 2}, {'W', 2}, {'W', 1}, {'W', 0}}},
  };
  for (const auto& [stage_name, spec] : stages) {
    for (const auto& [order_name, calls] : orders) {
      const Outcome none = RunCalls<Stage>(cfg, spec, Recompute::kNone, calls);
      for (Recompute mode : {Recompute::kSelective, Recompute::kFull}) {
        SCOPED_TRACE(
            absl::StrFormat("%s, %s, recompute %s", stage_name, order_name, RecomputeName(mode)));
        const Outcome got = RunCalls<Stage>(cfg, spec, mode, calls);
        EXPECT_TRUE(SameBits(got.grads, none.grads));
        EXPECT_EQ(got.losses, none.losses);
        for (int s = 0; s < 3; ++s) {
          EXPECT_TRUE(SameBits(got.outputs[s], none.outputs[s])) << "slot " << s;
          EXPECT_TRUE(SameBits(got.input_grads[s], none.input_grads[s])) << "slot " << s;
        }
      }
    }
  }
}

TEST(RecomputeTest, EveryModeGivesTheSameBitsInEveryScheduleOrder) {
  ExpectEveryModeGivesTheSameBits<GPT2Stage<float>>(TinyRecompute());
}

// RMSNorm, rotary q and k, grouped-query attention, SwiGLU; the head tied to the embedding
// (its gradient folded into wte's) and untied (kLmHead's own).
TEST(RecomputeTest, EveryLlamaModeGivesTheSameBitsInEveryScheduleOrder) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ExpectEveryModeGivesTheSameBits<LlamaStage<float>>(TinyRecomputeLlama(tied));
  }
}

// The gradients are not all zero, so the comparison above compares something.
TEST(RecomputeTest, TheComparedGradientsCarrySignal) {
  const std::vector<Call> calls = {{'F', 0}, {'I', 0}, {'W', 0}};
  for (const Outcome& o :
       {RunCalls<GPT2Stage<float>>(TinyRecompute(), {1, 2, false, false}, Recompute::kFull, calls),
        RunCalls<LlamaStage<float>>(TinyRecomputeLlama(false), {1, 2, false, false},
                                    Recompute::kFull, calls)}) {
    int nonzero = 0;
    for (float g : o.grads) nonzero += g != 0;
    EXPECT_GT(nonzero, static_cast<int>(o.grads.size()) / 2);
  }
}

TEST(RecomputeTest, SlotBytesDropAsTheModeKeepsLessInClosedForm) {
  const GPT2Config cfg = TinyRecompute();  // C = 8, NH = 2, Vp = 128
  constexpr int64_t B = 2, T = 5, C = 8, NH = 2, L = 2, Vp = 128, f = sizeof(float);
  const int64_t BT = B * T, BTC = BT * C, att = B * NH * T * T;
  // Per block: activations ln1 1, qkv 3, atty 1, residual2 1, ln2 1, fch 4, GELU output 4,
  // residual3 1 (× B·T·C), 4 LayerNorm statistics (× B·T), the probabilities; the output
  // gradients BackwardInput stashes: dresidual3 1, dfch 4, dln2 1, dresidual2 1, dqkv 3,
  // dln1 1 (× B·T·C). And per slot the input and its gradient.
  const int64_t none = 2 * BTC + L * (16 * BTC + 4 * BT + att + 11 * BTC);
  const int64_t selective = none - L * (att + 4 * BTC);
  const int64_t full = 2 * BTC + L * BTC + BTC;  // + each block's output, the output gradient
  // Full's scratch: one micro-batch's everything but the block outputs, and the stashed
  // gradients at every block's output but the stage's.
  const int64_t full_scratch = L * (15 * BTC + 4 * BT + att) + L * 10 * BTC + (L - 1) * BTC;
  const StageSpec middle{0, L, false, false};
  struct Expected {
    Recompute mode;
    int64_t slot, scratch;
  };
  for (const Expected& e :
       {Expected{Recompute::kNone, none, 0}, Expected{Recompute::kSelective, selective, att},
        Expected{Recompute::kFull, full, full_scratch}}) {
    SCOPED_TRACE(RecomputeName(e.mode));
    GPT2Stage<float> m(cfg, middle, B, T, /*slots=*/3, e.mode);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(m.SlotBytes(s), e.slot * f);
    EXPECT_EQ(m.RecomputeScratchBytes(), e.scratch * f);
    EXPECT_EQ(m.HostBytes(), TotalBytes(PlanGPT2StageMemory(cfg, middle, B, T, 3, f, e.mode)));
    // The head's slot adds its targets, logits and their gradient, final LayerNorm and losses.
    const StageSpec last{0, L, false, true};
    GPT2Stage<float> h(cfg, last, B, T, 2, e.mode);
    EXPECT_EQ(h.SlotBytes(1), (e.slot + 2 * BT * Vp + 2 * BTC + 4 * BT) * f + BT * 4);
    EXPECT_EQ(h.HostBytes(), TotalBytes(PlanGPT2StageMemory(cfg, last, B, T, 2, f, e.mode)));
  }
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
}

TEST(RecomputeTest, LlamaSlotBytesDropAsTheModeKeepsLessInClosedForm) {
  const GPT2Config cfg = TinyRecomputeLlama(/*tied=*/false);  // C = 16, kv = 8, F = 24, Vp = 128
  constexpr int64_t B = 2, T = 5, C = 16, NH = 4, kv = 8, F = 24, L = 2, Vp = 128;
  constexpr int64_t f = sizeof(float);
  const int64_t BT = B * T, BTC = BT * C, att = B * NH * T * T, qkv = BT * (C + 2 * kv);
  // Per block: activations ln1, atty, residual2, ln2, residual3 (5 × B·T·C), q k v, SwiGLU's
  // input (2F) and output (F), 2 RMSNorm statistics (× B·T), the probabilities; the output
  // gradients BackwardInput stashes: dresidual3, dln2, dresidual2, dln1 (4 × B·T·C), dqkv,
  // dh (2F). And per slot the input and its gradient.
  const int64_t block = 9 * BTC + 2 * qkv + BT * (2 * F + F + 2 * F) + 2 * BT + att;
  const int64_t none = 2 * BTC + L * block;
  const int64_t selective = none - L * (att + BT * F);
  const int64_t full = 2 * BTC + L * BTC + BTC;  // + each block's output, the output gradient
  // Full's scratch: one micro-batch's everything but the block outputs and the gradients at
  // them, and the gradients at every block's output but the stage's.
  const int64_t full_scratch = L * (block - 2 * BTC) + (L - 1) * BTC;
  const StageSpec middle{0, L, false, false};
  struct Expected {
    Recompute mode;
    int64_t slot, scratch;
  };
  for (const Expected& e :
       {Expected{Recompute::kNone, none, 0}, Expected{Recompute::kSelective, selective, att},
        Expected{Recompute::kFull, full, full_scratch}}) {
    SCOPED_TRACE(RecomputeName(e.mode));
    LlamaStage<float> m(cfg, middle, B, T, /*slots=*/3, e.mode);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(m.SlotBytes(s), e.slot * f);
    EXPECT_EQ(m.RecomputeScratchBytes(), e.scratch * f);
    EXPECT_EQ(m.HostBytes(), TotalBytes(PlanLlamaStageMemory(cfg, middle, B, T, 3, f, e.mode)));
    // The head's slot adds its targets, logits and their gradient, the final RMSNorm's output
    // and gradient, its statistics, log-sum-exp and losses.
    const StageSpec last{0, L, false, true};
    LlamaStage<float> h(cfg, last, B, T, 2, e.mode);
    EXPECT_EQ(h.SlotBytes(1), (e.slot + 2 * BT * Vp + 2 * BTC + 3 * BT) * f + BT * 4);
    EXPECT_EQ(h.HostBytes(), TotalBytes(PlanLlamaStageMemory(cfg, last, B, T, 2, f, e.mode)));
    // With 3 slots the plan saves what each slot no longer keeps, less the shared scratch.
    EXPECT_EQ(TotalBytes(PlanLlamaStageMemory(cfg, middle, B, T, 3, f, Recompute::kNone)) -
                  TotalBytes(PlanLlamaStageMemory(cfg, middle, B, T, 3, f, e.mode)),
              (3 * (none - e.slot) - e.scratch) * f);
  }
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
}

TEST(RecomputeTest, NamesParseAndOthersAreRefusedByName) {
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    EXPECT_EQ(*ParseRecompute(RecomputeName(mode)), mode);
  }
  absl::StatusOr<Recompute> bad = ParseRecompute("partial");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"partial\""), std::string::npos);
}

TEST(RecomputeTest, ExtraFlopsAreOneForwardOfTheBlockOrItsAttentionCore) {
  const GPT2Config cfg = *MakeGPT2Config(12, 12, 768, 1024, 50257);
  const double C = 768, T = 1024;
  EXPECT_EQ(RecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kNone), 0);
  EXPECT_EQ(RecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kSelective), 4 * T * C);
  // 2 FLOPs per multiply-add over the block's 12·C² matrix weights, and attention's 4·T·C:
  // a third of what TrainingFlopsPerToken counts for a block (forward and backward).
  EXPECT_EQ(RecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kFull), 24 * C * C + 4 * T * C);
  const double blocks = TrainingFlopsPerToken(cfg, 1024) - 6.0 * cfg.padded_vocab_size * C;
  EXPECT_DOUBLE_EQ(12 * RecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kFull), blocks / 3);
}

// The CUDA chunk recomputes the attention probabilities in every mode: its selective remakes
// the MLP activation's output, elementwise, or with the GELU in the MLP product's epilogue the
// product (2 · C · 4C per token); its full is the CPU's.
TEST(RecomputeTest, OnCudaSelectiveCountsOnlyTheMlpProductItRunsAgain) {
  const GPT2Config cfg = *MakeGPT2Config(12, 12, 768, 1024, 50257);
  const double C = 768;
  for (bool fused : {false, true}) {
    EXPECT_EQ(CudaRecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kNone, fused), 0);
    EXPECT_EQ(CudaRecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kFull, fused),
              RecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kFull));
  }
  EXPECT_EQ(CudaRecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kSelective, false), 0);
  EXPECT_EQ(CudaRecomputeFlopsPerTokenPerBlock(cfg, 1024, Recompute::kSelective, true), 8 * C * C);
}

}  // namespace
}  // namespace freeride
