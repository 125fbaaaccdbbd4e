// `freeride config memory`: each stage's line is the CUDA backend's own plan for that stage, for
// either model family.
#include "trainer/memory_report.h"

#include <sstream>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "models/device_memory_plan.h"
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
  EXPECT_EQ(lines[1], "stage 0: layers [0, 12) +embedding +head; 1 activation slot(s): " +
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
  EXPECT_EQ(lines[1], "stage 0: layers [0, 4) +embedding +head; 1 activation slot(s): " +
                          plan.Report());
}

}  // namespace
}  // namespace freeride
