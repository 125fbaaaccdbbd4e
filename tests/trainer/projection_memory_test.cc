// `freeride project`'s memory per stage against closed forms: the parameters, gradients and
// AdamW moments of a stage of P parameters (4P, 4P, 8P in fp32; the fp32 master beside a bf16
// copy: 6P), ZeRO-1's share of the moments (and in bf16 of the master) about P / dp, the
// activations a micro-batch keeps under each recomputation mode counted by hand from the CUDA
// chunk's buffers and equal to its plan under that mode, and the CLI's table: a row per stage of
// each fastest layout, every cell's total and free adding up to the GPU's memory.
#include "trainer/study/projection_memory.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "models/cuda/stage_policy.h"
#include "models/device_memory_plan.h"
#include "models/grad_norm.h"
#include "tests/trainer/run_cli.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// GPT-2 of 4 blocks, width 256 (786,432 weights a block: 12 norm chunks), 4 heads.
GPT2Config Model() {
  absl::StatusOr<GPT2Config> model = MakeGPT2Config(4, 4, 256, 64, 512);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

// Blocks 1 and 2: no embedding, no head.
StageSpec Middle(const GPT2Config& model) {
  absl::StatusOr<std::vector<StageSpec>> specs = SplitIntoStages(model, 3, {1, 2, 1});
  EXPECT_TRUE(specs.ok()) << specs.status();
  StageSpec middle = (*specs)[1];
  EXPECT_FALSE(middle.has_embedding || middle.has_head);
  return middle;
}

TEST(ProjectionMemoryTest, StateFollowsTheClosedForms) {
  const GPT2Config model = Model();
  const StageSpec stage = Middle(model);
  const int64_t P = MakeParamLayout(model, stage).total;
  const MemoryOption plain{Recompute::kNone, false}, zero{Recompute::kNone, true};
  for (int64_t dp : {1, 2, 3, 8}) {
    SCOPED_TRACE(dp);
    const int64_t share = LargestZeroShare(model, {stage}, dp);
    // The largest of dp shares cut at the norm's chunks: at least P / dp, at most a chunk more.
    EXPECT_GE(share, (P + dp - 1) / dp);
    EXPECT_LE(share, P / dp + kNormChunk);
    if (dp == 1) {
      EXPECT_EQ(share, P);
    }
    const StageDeviceMemory fp32 = PlanProjectedStage(model, {stage}, 2, 1, 64, 4, dp, plain);
    EXPECT_EQ(fp32.parameters, 4 * P);
    EXPECT_EQ(fp32.gradients, 4 * P);
    EXPECT_EQ(fp32.optimizer, 8 * P);
    EXPECT_EQ(fp32.reserve, cuda::kDeviceHeadroomBytes);
    // ZeRO-1 in fp32: the moments of the share; the master is the weights, kept whole.
    const StageDeviceMemory fp32_zero = PlanProjectedStage(model, {stage}, 2, 1, 64, 4, dp, zero);
    EXPECT_EQ(fp32_zero.parameters, 4 * P);
    EXPECT_EQ(fp32_zero.gradients, 4 * P);
    EXPECT_EQ(fp32_zero.optimizer, 8 * share);
    EXPECT_EQ(fp32.total() - fp32_zero.total(), 8 * (P - share));
    // bf16: the compute copy (2P) beside the fp32 master (4P), the master sharded too.
    const StageDeviceMemory bf16 = PlanProjectedStage(model, {stage}, 2, 1, 64, 2, dp, plain);
    EXPECT_EQ(bf16.parameters, 6 * P);
    const StageDeviceMemory bf16_zero = PlanProjectedStage(model, {stage}, 2, 1, 64, 2, dp, zero);
    EXPECT_EQ(bf16_zero.parameters, 2 * P + 4 * share);
    EXPECT_EQ(bf16_zero.optimizer, 8 * share);
  }
  // Two chunks on a stage: their parameters add up, and so do a rank's shares of them.
  absl::StatusOr<std::vector<StageSpec>> specs = SplitIntoStages(model, 4, {1, 1, 1, 1});
  ASSERT_TRUE(specs.ok());
  const std::vector<StageSpec> chunks = {(*specs)[1], (*specs)[2]};
  const int64_t both =
      MakeParamLayout(model, chunks[0]).total + MakeParamLayout(model, chunks[1]).total;
  EXPECT_EQ(PlanProjectedStage(model, chunks, 1, 1, 64, 4, 2, plain).optimizer, 8 * both);
  EXPECT_LE(LargestZeroShare(model, chunks, 2), both / 2 + 2 * kNormChunk);
}

// A middle GPT-2 stage's slot, per token: its input and dinput (C each), then per block the
// forward's ln1, qkv (3C), attention output, residual2, ln2, fch (4C), its GELU (4C) and
// residual3 (16C values), LayerNorm means and rstds (4 fp32), the attention's log-sum-exp (an
// fp32 per head) and the backward's stashes for the weight gradients (11C). The projection
// takes the CUDA chunk's plan under each mode, and equals it.
TEST(ProjectionMemoryTest, ActivationsFollowTheRecomputeModes) {
  const GPT2Config model = Model();
  const StageSpec stage = Middle(model);
  const int64_t L = stage.num_layers(), C = model.n_embd, NH = model.n_head;
  const int64_t B = 2, T = 64, BT = B * T;
  for (int X : {4, 2}) {
    for (int slots : {1, 3}) {
      SCOPED_TRACE(absl::StrFormat("X %d, slots %d", X, slots));
      const auto projected = [&](Recompute mode) {
        return PlanProjectedStage(model, {stage}, slots, B, T, X, 1, {mode, false});
      };
      for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        SCOPED_TRACE(RecomputeName(mode));
        MemoryPlan plan;
        PlanStageMemory(model, stage, B, T, slots, X, &plan, true, cuda::AttentionMode::kAuto,
                        mode);
        EXPECT_EQ(projected(mode).activations, plan.PhaseBytes(MemoryPhase::kActivations));
        EXPECT_EQ(projected(mode).workspace, plan.PhaseBytes(MemoryPhase::kWorkspace));
      }
      const int64_t forward = BT * (16 * C * X + 16 + 4 * NH);  // one block's, one micro-batch
      const int64_t stashes = BT * 11 * C * X, values = BT * C * X;
      const int64_t slot = 2 * values + L * (forward + stashes);
      const int64_t none = projected(Recompute::kNone).activations;
      EXPECT_EQ(none, slots * slot);
      // Selective: no GELU output kept; remade in the workspace's MLP scratch, already there.
      const int64_t selective = projected(Recompute::kSelective).activations;
      EXPECT_EQ(selective, slots * (slot - L * BT * 4 * C * X));
      EXPECT_LT(selective, none);
      // Full: a slot keeps its input, dinput, each block's output and its output gradient; one
      // micro-batch's other forward buffers and stashes (the last block's dresidual3 is the
      // output gradient) are shared.
      const int64_t full = projected(Recompute::kFull).activations;
      EXPECT_EQ(full,
                slots * (3 * values + L * values) + L * (forward - values + stashes) - values);
      // One slot: the shared buffers are what the slot held.
      if (slots == 1) {
        EXPECT_EQ(full, none);
      }
      if (slots > 1) {
        EXPECT_LT(full, selective);
      }
    }
  }
}

// The table of the 1.2B config at 1,024 GPUs: a row per stage of the fastest 1F1B layout, the
// six options' cells each a total and what it leaves of the GPU (adding up to it), recompute
// (full only with more than one micro-batch in flight) and ZeRO-1 each lowering the total; the
// GPU's size a flag, refused when not positive.
TEST(CliProjectTest, TheMemoryTableHasEveryStageUnderEveryOption) {
  // clang-format off
  const std::vector<std::string> base = {
      "project", "--config", "configs/freeride_1b_pp4_m4.toml", "--gpus", "1024",
      "--costs", "flops", "--tflops", "400", "--global_batch", "8192", "--micro_batch", "4",
      "--kinds", "1f1b", "--set", "freeride.enabled=false"};
  // clang-format on
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--gpu_memory_gib", "40"});
  CliResult md = RunCommand(args);
  ASSERT_EQ(md.status, kExitOk) << md.err;
  EXPECT_THAT(md.out, HasSubstr("## Memory per stage"));
  EXPECT_THAT(md.out, HasSubstr("bf16 weights and activations, micro-batch 4 × 1024"));
  EXPECT_THAT(md.out, HasSubstr("on a 40 GiB GPU"));
  EXPECT_THAT(md.out, HasSubstr("| none | none + ZeRO-1 | selective | selective + ZeRO-1 | full | "
                                "full + ZeRO-1 |"));
  // The fastest 1F1B layout's pp (the first table), then its stage rows.
  const size_t memory = md.out.find("## Memory per stage");
  const size_t best = md.out.find("| 1024 | 1f1b | ");
  ASSERT_LT(best, memory);
  const std::vector<std::string> cells =
      absl::StrSplit(md.out.substr(best, md.out.find('\n', best) - best), " | ");
  int64_t pp = 0, dp = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*absl::StrSplit(cells[2], " × ").begin(), &pp));
  dp = 1024 / pp;
  int stages = 0;
  for (absl::string_view line : absl::StrSplit(md.out.substr(memory), '\n')) {
    if (!absl::StartsWith(line, absl::StrFormat("| 1024 | 1f1b | %d × %d | ", pp, dp))) continue;
    std::vector<std::string> parts = absl::StrSplit(line, " | ");
    ASSERT_EQ(parts.size(), 11u) << line;
    EXPECT_EQ(parts[3], std::to_string(stages));
    std::vector<double> totals;
    for (size_t k = 5; k < 11; ++k) {
      std::vector<std::string> pair = absl::StrSplit(parts[k], " / ");
      ASSERT_EQ(pair.size(), 2u) << parts[k];
      double total = 0, free = 0;
      ASSERT_TRUE(absl::SimpleAtod(pair[0], &total));
      ASSERT_TRUE(absl::SimpleAtod(absl::StripSuffix(pair[1], " |"), &free));
      EXPECT_NEAR(total + free, 40, 0.11) << line;
      totals.push_back(total);
    }
    // none, none + ZeRO-1, selective, ...: ZeRO-1 below the same recomputation without it
    // (the moments of 1/dp); recomputation not above none; full not above selective where the
    // stage holds more than one micro-batch (with one, full's shared buffers are what the slot
    // held), and each below the mode before it on stage 0, which holds the most micro-batches
    // (a later stage's saving can round away here).
    int slots = 0;
    ASSERT_TRUE(absl::SimpleAtoi(parts[4], &slots)) << line;
    for (size_t k = 0; k < 6; k += 2) EXPECT_LT(totals[k + 1], totals[k]) << line;
    for (size_t k = 2; k < 6; ++k) EXPECT_LE(totals[k], totals[k % 2]) << line;
    if (slots > 1) {
      for (size_t k = 4; k < 6; ++k) EXPECT_LE(totals[k], totals[k - 2]) << line;
    }
    if (stages == 0) {
      EXPECT_LT(totals[2], totals[0]) << line;
      EXPECT_LT(totals[4], totals[2]) << line;
    }
    ++stages;
  }
  EXPECT_EQ(stages, pp);
  // A fresh vector, not args.back() = "0": GCC 12 at -O3 inlines that assignment into a
  // spurious -Wstringop-overflow (a memcpy of 2^63 bytes) in the unity build.
  std::vector<std::string> zero = base;
  zero.insert(zero.end(), {"--gpu_memory_gib", "0"});
  CliResult refused = RunCommand(zero);
  EXPECT_EQ(refused.status, kExitUsage);
  EXPECT_THAT(refused.err, HasSubstr("--gpu_memory_gib"));
}

}  // namespace
}  // namespace freeride
