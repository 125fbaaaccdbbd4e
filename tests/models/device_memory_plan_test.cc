// The CUDA backend's memory plan, checked where there is no GPU: every buffer aligned and
// apart from the others, phases sized by closed-form counts, the report at start readable.
#include "models/device_memory_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "core/device.h"
#include "gtest/gtest.h"
#include "models/backend.h"

namespace freeride {
namespace {

GPT2Config Gpt2Small() {
  absl::StatusOr<GPT2Config> c = MakeGPT2Config(12, 12, 768, 1024, 50257);
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(DeviceMemoryPlanTest, BuffersAreAlignedAndDisjointWithinEachPhase) {
  const GPT2Config cfg = Gpt2Small();
  auto specs = SplitIntoStages(cfg, 4, {});
  ASSERT_TRUE(specs.ok());
  for (const auto& [spec, mode] :
       {std::pair{(*specs)[0], Recompute::kNone}, std::pair{(*specs)[1], Recompute::kSelective},
        std::pair{(*specs)[2], Recompute::kFull}, std::pair{(*specs)[3], Recompute::kFull}}) {
    MemoryPlan plan;
    PlanStageMemory(cfg, spec, 4, 256, 3, 2, &plan, true, cuda::AttentionMode::kAuto, mode);
    for (int p = 0; p < kNumMemoryPhases; ++p) {
      std::vector<PlannedBuffer> in_phase;
      for (const PlannedBuffer& b : plan.buffers()) {
        if (static_cast<int>(b.phase) == p && b.bytes > 0) in_phase.push_back(b);
      }
      std::sort(in_phase.begin(), in_phase.end(),
                [](const auto& a, const auto& b) { return a.offset < b.offset; });
      for (size_t i = 0; i < in_phase.size(); ++i) {
        EXPECT_EQ(in_phase[i].offset % MemoryPlan::kAlignment, 0) << in_phase[i].name;
        if (i > 0) {
          EXPECT_GE(in_phase[i].offset, in_phase[i - 1].offset + in_phase[i - 1].bytes)
              << in_phase[i].name << " overlaps " << in_phase[i - 1].name;
        }
      }
      if (!in_phase.empty()) {
        EXPECT_LE(in_phase.back().offset + in_phase.back().bytes,
                  plan.PhaseBytes(static_cast<MemoryPhase>(p)));
      }
    }
  }
}

TEST(DeviceMemoryPlanTest, PhasesHaveTheirClosedFormSizes) {
  const GPT2Config cfg = Gpt2Small();
  const int64_t P = NumParameters(cfg), B = 8, T = 1024, C = 768, L = 12, NH = 12;
  const int64_t Vp = cfg.padded_vocab_size;
  for (int bytes : {2, 4}) {
    MemoryPlan plan;
    const StageBufferIds ids = PlanStageMemory(cfg, WholeModel(cfg), B, T, 1, bytes, &plan);
    auto rounded = [](int64_t b) { return (b + 255) / 256 * 256; };
    EXPECT_EQ(plan.PhaseBytes(MemoryPhase::kParameters),
              rounded(P * 4) + (bytes == 4 ? 0 : rounded(P * 2)));
    EXPECT_EQ(plan.PhaseBytes(MemoryPhase::kGradients), rounded(P * 4) + rounded(Vp * C * 4));
    EXPECT_EQ(plan.PhaseBytes(MemoryPhase::kOptimizer), 2 * rounded(P * 4));
    // Attention keeps one fp32 log-sum-exp per row and layer, not the L·B·NH·T² probabilities
    // (one layer's worth lives in the workspace, recomputed in backward).
    EXPECT_EQ(plan.buffer(ids.slots[0].att_lse).bytes, L * B * NH * T * 4);
    // bf16 runs the flash kernels (no T × T at all), fp32 the reference path.
    EXPECT_EQ(plan.buffer(ids.attn_probs).bytes, bytes == 2 ? 0 : B * NH * T * T * bytes);
    EXPECT_EQ(plan.buffer(ids.slots[0].logits).bytes, B * T * Vp * bytes);
  }
}

TEST(DeviceMemoryPlanTest, LlamaBuffersHaveTheFamilysWidths) {
  // Llama 3.2 1B's shape: 16 layers, C 2048, 32 query heads over 8 key/value heads, F 8192.
  for (bool tied : {true, false}) {
    absl::StatusOr<GPT2Config> c =
        MakeLlamaConfig(16, 32, 8, 2048, 2048, 128256, 8192, 500000.0, 1e-5, tied);
    ASSERT_TRUE(c.ok());
    const int64_t P = NumParameters(*c), B = 2, T = 512, BT = B * T, C = 2048, L = 16, F = 8192;
    const int64_t qkv = C + 2 * 8 * 64, Vp = c->padded_vocab_size;
    MemoryPlan plan;
    const StageBufferIds ids = PlanStageMemory(*c, WholeModel(*c), B, T, 1, 2, &plan);
    auto rounded = [](int64_t b) { return (b + 255) / 256 * 256; };
    const StageBufferIds::Slot& s = ids.slots[0];
    EXPECT_EQ(plan.buffer(s.qkv).bytes, L * BT * qkv * 2);
    EXPECT_EQ(plan.buffer(s.dqkv).bytes, L * BT * qkv * 2);
    EXPECT_EQ(plan.buffer(s.fch).bytes, L * BT * 2 * F * 2) << "SwiGLU's gate and up";
    EXPECT_EQ(plan.buffer(s.fch_gelu).bytes, L * BT * F * 2) << "SwiGLU's output";
    EXPECT_EQ(plan.buffer(ids.scratch_4c).bytes, BT * F * 2);
    // RMSNorm keeps no means; the rotary tables are fp32 [T, hs/2] each.
    for (int id : {s.ln1_mean, s.ln2_mean, s.lnf_mean}) EXPECT_EQ(plan.buffer(id).bytes, 0);
    EXPECT_EQ(plan.buffer(ids.rope_cos).bytes, T * 32 * 4);
    // bf16 runs the flash kernels with grouped-query heads: no T × T buffers.
    EXPECT_TRUE(ids.flash_attention);
    EXPECT_EQ(plan.buffer(ids.attn_probs).bytes, 0);
    EXPECT_EQ(plan.buffer(ids.attn_dkv_heads).bytes, 2 * BT * C * 2) << "dK, dV per query head";
    // An untied head's gradient is its own tensor's: no separate wte gradient.
    EXPECT_EQ(plan.PhaseBytes(MemoryPhase::kGradients),
              rounded(P * 4) + (tied ? rounded(Vp * C * 4) : 0));
  }
}

TEST(DeviceMemoryPlanTest, ActivationsGrowWithSlotsAndNothingElseDoes) {
  const GPT2Config cfg = Gpt2Small();
  MemoryPlan one, three;
  PlanStageMemory(cfg, WholeModel(cfg), 4, 128, 1, 2, &one);
  PlanStageMemory(cfg, WholeModel(cfg), 4, 128, 3, 2, &three);
  EXPECT_EQ(three.PhaseBytes(MemoryPhase::kActivations),
            3 * one.PhaseBytes(MemoryPhase::kActivations));
  for (MemoryPhase p : {MemoryPhase::kParameters, MemoryPhase::kGradients, MemoryPhase::kOptimizer,
                        MemoryPhase::kWorkspace}) {
    EXPECT_EQ(three.PhaseBytes(p), one.PhaseBytes(p)) << MemoryPhaseName(p);
  }
}

TEST(DeviceMemoryPlanTest, InferenceHoldsNoGradientsOptimizerOrBackward) {
  const GPT2Config cfg = Gpt2Small();
  MemoryPlan train, infer;
  using cuda::AttentionMode;
  PlanStageMemory(cfg, WholeModel(cfg), 8, 128, 1, 2, &train, true, AttentionMode::kReference);
  const StageBufferIds ids =
      PlanStageMemory(cfg, WholeModel(cfg), 8, 128, 1, 2, &infer, false, AttentionMode::kReference);
  EXPECT_EQ(infer.PhaseBytes(MemoryPhase::kGradients), 0);
  EXPECT_EQ(infer.PhaseBytes(MemoryPhase::kOptimizer), 0);
  EXPECT_EQ(infer.PhaseBytes(MemoryPhase::kParameters), train.PhaseBytes(MemoryPhase::kParameters));
  EXPECT_EQ(infer.buffer(ids.slots[0].dres3).bytes, 0);
  EXPECT_EQ(infer.buffer(ids.attn_scores).bytes, 0);
  // Forward still has every activation it writes, and its workspace.
  EXPECT_GT(infer.buffer(ids.slots[0].logits).bytes, 0);
  EXPECT_GT(infer.buffer(ids.attn_probs).bytes, 0);
  // The stashed output gradients were more than a quarter of the activations.
  EXPECT_LT(infer.PhaseBytes(MemoryPhase::kActivations),
            0.75 * train.PhaseBytes(MemoryPhase::kActivations));
}

TEST(DeviceMemoryPlanTest, MiddleStagesHoldNoEmbeddingOrHead) {
  const GPT2Config cfg = Gpt2Small();
  auto specs = SplitIntoStages(cfg, 3, {});
  ASSERT_TRUE(specs.ok());
  MemoryPlan plan;
  const StageBufferIds ids = PlanStageMemory(cfg, (*specs)[1], 4, 128, 1, 2, &plan);
  EXPECT_EQ(plan.buffer(ids.slots[0].logits).bytes, 0);
  EXPECT_EQ(plan.buffer(ids.slots[0].tokens).bytes, 0);
  EXPECT_EQ(plan.buffer(ids.head_wte_grad).bytes, 0);
}

// GPT-2 124M, micro-batch 8, T 1024, bf16: the flash path plans none of the reference path's
// attention buffers (two [B, NH, T, T] and the heads split out) and one fp32 D per row; the
// reference path (forced, or fp32) plans them all. Every other buffer is the same.
TEST(DeviceMemoryPlanTest, FlashAttentionPlansNoTSquaredBuffers) {
  const GPT2Config cfg = Gpt2Small();
  const int64_t B = 8, T = 1024, C = 768, NH = 12, BTC = B * T * C;
  MemoryPlan flash, reference, fp32;
  const StageBufferIds f = PlanStageMemory(cfg, WholeModel(cfg), B, T, 1, 2, &flash);
  const StageBufferIds r = PlanStageMemory(cfg, WholeModel(cfg), B, T, 1, 2, &reference, true,
                                           cuda::AttentionMode::kReference);
  const StageBufferIds r32 = PlanStageMemory(cfg, WholeModel(cfg), B, T, 1, 4, &fp32);
  EXPECT_TRUE(f.flash_attention);
  EXPECT_FALSE(r.flash_attention);
  EXPECT_FALSE(r32.flash_attention);
  for (int id : {f.attn_qkv, f.attn_dqkv, f.attn_probs, f.attn_scores, f.attn_y}) {
    EXPECT_EQ(flash.buffer(id).bytes, 0) << flash.buffer(id).name;
  }
  EXPECT_EQ(flash.buffer(f.attn_rowsum).bytes, B * NH * T * 4);
  EXPECT_EQ(reference.buffer(r.attn_rowsum).bytes, 0);
  EXPECT_EQ(reference.buffer(r.attn_probs).bytes, B * NH * T * T * 2);  // 192 MiB
  EXPECT_EQ(reference.buffer(r.attn_scores).bytes, B * NH * T * T * 2);
  EXPECT_EQ(fp32.buffer(r32.attn_probs).bytes, B * NH * T * T * 4);
  // All sizes here are multiples of the 256-byte alignment: the difference is exact.
  const int64_t saved = 2 * B * NH * T * T * 2 + 2 * 3 * BTC * 2 + BTC * 2 - B * NH * T * 4;
  EXPECT_EQ(
      reference.PhaseBytes(MemoryPhase::kWorkspace) - flash.PhaseBytes(MemoryPhase::kWorkspace),
      saved);
  for (MemoryPhase p : {MemoryPhase::kParameters, MemoryPhase::kGradients, MemoryPhase::kOptimizer,
                        MemoryPhase::kActivations}) {
    EXPECT_EQ(flash.PhaseBytes(p), reference.PhaseBytes(p)) << MemoryPhaseName(p);
  }
  // Forward only: no D either.
  MemoryPlan infer;
  const StageBufferIds i = PlanStageMemory(cfg, WholeModel(cfg), B, T, 1, 2, &infer, false);
  EXPECT_TRUE(i.flash_attention);
  EXPECT_EQ(infer.buffer(i.attn_rowsum).bytes, 0);
  EXPECT_EQ(infer.buffer(i.attn_probs).bytes, 0);
}

TEST(DeviceMemoryPlanTest, ReportNamesEveryPhaseAndTheTotal) {
  MemoryPlan plan;
  plan.Add(MemoryPhase::kParameters, "a", 3 << 20);
  plan.Add(MemoryPhase::kWorkspace, "b", 1);
  EXPECT_EQ(plan.Report(),
            "parameters 3.0 MiB, gradients 0.0 MiB, optimizer 0.0 MiB, activations 0.0 MiB, "
            "workspace 0.0 MiB = 3.0 MiB");
  EXPECT_EQ(plan.PhaseBytes(MemoryPhase::kWorkspace), MemoryPlan::kAlignment);
}

TEST(BackendTest, CudaWithoutAUsableDeviceIsAClearError) {
  if (CudaBackendBuilt() && !DiscoverDevices().cuda.empty()) {
    GTEST_SKIP() << "a CUDA device is visible: the GPU suites cover this backend";
  }
  const GPT2Config cfg = Gpt2Small();
  BackendOptions options;
  options.device = "cuda";
  auto model = MakeStageModel(options, cfg, WholeModel(cfg), 1, 8, 1);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("cuda"), std::string::npos) << model.status();
  options.device = "cpu";
  options.precision = "bf16";
  model = MakeStageModel(options, cfg, WholeModel(cfg), 1, 8, 1);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("bf16"), std::string::npos);
}

// What a micro-batch in flight holds under each model.recompute, in closed form (elements per
// token; B·T = 256, so that every buffer is a multiple of the alignment): a slot's bytes are
// the plan's growth from 2 slots to 3, the shared buffers what is left at 1 slot.
TEST(DeviceMemoryPlanTest, RecomputeKeepsLessPerSlotInClosedForm) {
  const GPT2Config gpt2 = *MakeGPT2Config(4, 4, 128, 64, 1000);
  const GPT2Config llama = *MakeLlamaConfig(4, 4, 2, 128, 64, 1000, 352, 10000.0, 1e-5, false);
  constexpr int64_t B = 4, T = 64, BT = B * T, L = 2, NH = 4;
  const StageSpec middle{1, 3, false, false};
  for (const GPT2Config& cfg : {gpt2, llama}) {
    const int64_t C = cfg.n_embd;
    const LayerWidths w = StageLayerWidths(cfg);
    // Per block: ln1, qkv, attention output, residual2, ln2, the MLP's input and activation,
    // residual3; the output gradients I stashes for W: dresidual3, dfch, dln2, dresidual2,
    // dqkv, dln1; fp32: the norms' statistics (LayerNorm's means and rstds, RMSNorm's rstds)
    // and each head's log-sum-exp.
    const int64_t kept = 5 * C + w.qkv + w.fc + w.act, stashed = 4 * C + w.fc + w.qkv;
    const int64_t floats = (cfg.is_llama() ? 2 : 4) + NH;
    for (int64_t X : {2, 4}) {
      SCOPED_TRACE(absl::StrFormat("%s, %d bytes", cfg.is_llama() ? "llama" : "gpt2", X));
      // Every slot also keeps its input and input gradient.
      const int64_t none = BT * X * (2 * C + L * (kept + stashed)) + BT * 4 * L * floats;
      const int64_t selective = none - BT * X * L * w.act;
      // Full: the input, each block's output, the stage's output gradient.
      const int64_t full = BT * X * (2 * C + L * C + C);
      // ... and one micro-batch's everything else, the gradient at the last block's output
      // (the slot's) aside.
      const int64_t shared = BT * X * (L * (kept - C + stashed) - C) + BT * 4 * L * floats;
      struct Expected {
        Recompute mode;
        int64_t slot, shared, workspace;
      };
      MemoryPlan base;
      PlanStageMemory(cfg, middle, B, T, 1, X, &base);
      for (const Expected& e :
           {Expected{Recompute::kNone, none, 0, 0},
            Expected{Recompute::kSelective, selective, 0, 0},
            // GPT-2's discarded LayerNorm weight gradients, 2·C fp32, rounded up to 256.
            Expected{Recompute::kFull, full, shared, cfg.is_llama() ? 0 : 1024}}) {
        SCOPED_TRACE(RecomputeName(e.mode));
        auto activations = [&](int slots, bool training = true) {
          MemoryPlan plan;
          PlanStageMemory(cfg, middle, B, T, slots, static_cast<int>(X), &plan, training,
                          cuda::AttentionMode::kAuto, e.mode);
          return plan;
        };
        const int64_t slot = activations(3).PhaseBytes(MemoryPhase::kActivations) -
                             activations(2).PhaseBytes(MemoryPhase::kActivations);
        EXPECT_EQ(slot, e.slot);
        EXPECT_EQ(activations(1).PhaseBytes(MemoryPhase::kActivations) - slot, e.shared);
        EXPECT_EQ(activations(1).PhaseBytes(MemoryPhase::kWorkspace),
                  base.PhaseBytes(MemoryPhase::kWorkspace) + e.workspace);
        // Inference keeps no backward: the mode changes nothing.
        MemoryPlan inference;
        PlanStageMemory(cfg, middle, B, T, 2, static_cast<int>(X), &inference, false);
        EXPECT_EQ(activations(2, false).TotalBytes(), inference.TotalBytes());
      }
    }
  }
}

}  // namespace
}  // namespace freeride
