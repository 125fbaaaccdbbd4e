// `freeride config memory`: the model's summary against closed forms (Llama 3.2 1B's parameter
// count and FLOPs per token), each stage's line is the CUDA backend's own plan for that stage
// (either family), and a Llama run on the CPU gets its host plan too, whose activation slot is
// what LlamaStage allocates per micro-batch.
#include "trainer/memory_report.h"

#include <sstream>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/host_memory.h"
#include "gtest/gtest.h"
#include "models/device_memory_plan.h"
#include "models/llama.h"
#include "tests/trainer/run_cli.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(MemoryReportTest, EachStageLineIsTheBackendsPlan) {
  absl::StatusOr<Config> config = LoadConfigFile("configs/gpt2_124m_cuda.toml", {});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = Lines(*report);
  ASSERT_EQ(lines.size(), 2u) << *report;
  EXPECT_NE(lines[0].find("bf16, micro-batch 16 × 1024"), std::string::npos) << lines[0];
  absl::StatusOr<GPT2Config> gpt2 = MakeGPT2Config(12, 12, 768, 1024, 50257);
  ASSERT_TRUE(gpt2.ok());
  MemoryPlan plan;
  PlanStageMemory(*gpt2, WholeModel(*gpt2), 16, 1024, 1, 2, &plan);
  EXPECT_EQ(lines[1],
            "stage 0: layers [0, 12) +embedding +head; recompute none; 1 activation slot(s): " +
                plan.Report());
}

TEST(MemoryReportTest, PipelineStagesHoldTheirScheduleBuffers) {
  absl::StatusOr<Config> config = LoadConfigFile(
      "configs/gpt2_124m_pp4.toml", {"parallel.schedule=\"gpipe\"", "train.microbatches=4"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = Lines(*report);
  ASSERT_EQ(lines.size(), 5u) << *report;
  // GPipe keeps every micro-batch's activations on every stage.
  for (int s = 0; s < 4; ++s) {
    EXPECT_NE(lines[1 + s].find("4 activation slot(s)"), std::string::npos) << lines[1 + s];
  }
  EXPECT_NE(lines[1].find("+embedding"), std::string::npos);
  EXPECT_NE(lines[4].find("+head"), std::string::npos);
}

TEST(MemoryReportTest, ALlamaStageLineIsTheBackendsLlamaPlan) {
  absl::StatusOr<Config> config = LoadConfigFile(
      "configs/llama_tiny_cpu.toml", {"runtime.device=\"cuda\"", "runtime.precision=\"bf16\""});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = Lines(*report);
  ASSERT_EQ(lines.size(), 2u) << *report;
  absl::StatusOr<GPT2Config> llama = ResolveModelConfig(*config);
  ASSERT_TRUE(llama.ok() && llama->is_llama());
  MemoryPlan plan;
  PlanStageMemory(*llama, WholeModel(*llama), 2, 64, 1, 2, &plan);
  EXPECT_EQ(lines[1],
            "stage 0: layers [0, 4) +embedding +head; recompute none; 1 activation slot(s): " +
                plan.Report());
}

TEST(ModelSummaryTest, Llama32OneBHasItsParametersAndFlopsPerToken) {
  absl::StatusOr<Config> config = LoadConfigFile("configs/llama_1b_pp4.toml", {});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<GPT2Config> model = ResolveModelConfig(*config);
  ASSERT_TRUE(model.ok()) << model.status();
  // By hand: the embedding (tied: the head adds nothing), per layer two norms, q (C·C), k and v
  // (8 heads of 64: 512·C each), o (C·C), gate, up and down (3·8192·C), and the final norm.
  const int64_t V = 128256, C = 2048, L = 16, kv = 512, F = 8192, T = 2048;
  const int64_t per_layer = 2 * C + C * C + 2 * kv * C + C * C + 3 * F * C;
  EXPECT_EQ(per_layer, 60821504);
  EXPECT_EQ(NumParameters(*model), V * C + L * per_layer + C);
  EXPECT_EQ(NumParameters(*model), 1235814400);  // Hugging Face's count for Llama 3.2 1B
  // 6 FLOPs per matrix-product parameter (the head's V·C included) and attention's 12·L·C·T.
  const double matmul = static_cast<double>(L * (per_layer - 2 * C) + V * C);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*model, T), 6 * matmul + 12.0 * L * C * T);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*model, T), 8219787264.0);
  absl::StatusOr<std::string> summary = ModelSummary(*config);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(*summary,
            "model: llama, 16 layers × n_embd 2048 (32 heads, 8 key/value heads), SwiGLU 8192, "
            "vocabulary 128256 (padded 128256), tied head: 1235814400 parameters (1.236 B); "
            "training 8.22 GFLOP per token at T = 2048 (6 × 1235746816 matrix-product parameters "
            "+ 12·L·C·T attention); a micro-batch of 1 × 2048 crosses each stage boundary as "
            "16.0 MiB of fp32 activations\n");

  // Untied, the head is a matrix of its own: V·C more parameters, and as many more FLOPs as
  // nothing (the head's product was counted already).
  absl::StatusOr<Config> untied =
      LoadConfigFile("configs/llama_1b_pp4.toml", {"model.tie_embeddings=false"});
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_EQ(NumParameters(*ResolveModelConfig(*untied)), 1235814400 + V * C);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*ResolveModelConfig(*untied), T), 8219787264.0);
}

TEST(ModelSummaryTest, ALlamaRunOnTheCpuGetsItsHostPlanWithTheSlotItAllocates) {
  const std::vector<std::string> small = {
      "--set", "model.n_layer=2", "--set", "train.seq_len=16", "--set", "model.max_seq_len=16"};
  std::vector<std::string> args = {"config", "memory", "configs/llama_tiny_cpu.toml"};
  args.insert(args.end(), small.begin(), small.end());
  const CliResult out = RunCommand(args);
  ASSERT_EQ(out.status, 0) << out.err;
  const std::vector<std::string> lines = Lines(out.out);
  // The model, the CUDA plan's header and stage, the CPU plan's, what side work is left.
  ASSERT_EQ(lines.size(), 7u) << out.out;
  EXPECT_EQ(lines[5].rfind("memory for side work per rank: runtime.memory_fraction = 0.90 of "
                           "the host's ",
                           0),
            0u)
      << lines[5];
  EXPECT_EQ(lines[0].rfind("model: llama, 2 layers × n_embd 128 (4 heads, 2 key/value heads)", 0),
            0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("device memory per rank on the CUDA backend: fp32", 0), 0u) << lines[1];
  // One micro-batch's activations: what a LlamaStage of one more slot allocates.
  absl::StatusOr<Config> config =
      LoadConfigFile("configs/llama_tiny_cpu.toml",
                     {"model.n_layer=2", "train.seq_len=16", "model.max_seq_len=16"});
  ASSERT_TRUE(config.ok()) << config.status();
  const GPT2Config model = *ResolveModelConfig(*config);
  const LlamaStage<float> one(model, WholeModel(model), 2, 16, 1),
      two(model, WholeModel(model), 2, 16, 2);
  EXPECT_NE(lines[4].find("1 activation slot(s) of " +
                          FormatBytes(two.HostBytes() - one.HostBytes()) + " each"),
            std::string::npos)
      << lines[4];
}

}  // namespace
}  // namespace freeride
