// What training leaves to side work (trainer/rank_memory.h): runtime.memory_fraction and
// runtime.device_memory_mb are validated; each stage's plan is its terms added up (the chunk,
// the schedule's message buffers, the batch, MPI's temporary, the process's baseline) with the
// facts injected, not read from this machine; the room left is the fraction of the device's
// share less that peak; recomputation and ZeRO-1 grow the room by what they save; `config
// memory` prints it per stage and the side-task check refuses a limit above it.
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/cuda/multi_tensor_table.h"
#include "models/device_memory_plan.h"
#include "trainer/config/side_task_check.h"
#include "trainer/memory_report.h"
#include "trainer/rank_memory.h"
#include "trainer/trainer.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

absl::StatusOr<Config> Parse(const std::string& runtime) {
  return ParseConfig(absl::StrCat("[data]\ntrain = \"x.bin\"\n[runtime]\n", runtime), "run.toml");
}

TEST(MemoryHeadroomTest, TheFractionIsAboveZeroAndAtMostOne) {
  EXPECT_EQ(Config{}.runtime.memory_fraction, 0.9);
  for (const char* bad : {"0", "0.0", "-0.5", "1.01", "2"}) {
    absl::StatusOr<Config> config = Parse(absl::StrCat("memory_fraction = ", bad));
    ASSERT_FALSE(config.ok()) << bad;
    EXPECT_THAT(config.status().message(), HasSubstr("runtime.memory_fraction")) << bad;
    EXPECT_THAT(config.status().message(), HasSubstr(bad)) << config.status().message();
  }
  for (const char* good : {"1", "1.0", "0.5", "0.05"}) {
    EXPECT_TRUE(Parse(absl::StrCat("memory_fraction = ", good)).ok()) << good;
  }
  absl::StatusOr<Config> words = Parse("memory_fraction = \"most\"");
  ASSERT_FALSE(words.ok());
  EXPECT_THAT(words.status().message(), HasSubstr("runtime.memory_fraction"));
  absl::StatusOr<Config> negative = Parse("device_memory_mb = -1");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("runtime.device_memory_mb"));
  absl::StatusOr<Config> stated = Parse("device_memory_mb = 2048");
  ASSERT_TRUE(stated.ok()) << stated.status();
  MemoryFacts facts;
  FindDeviceMemory(*stated, &facts);
  EXPECT_EQ(facts.device_bytes, 2048 * kMiB);
  EXPECT_EQ(facts.device_source, "runtime.device_memory_mb");
}

// A 2-stage, 2-replica CPU pipeline of 1F1B over 4 micro-batches, as in bench/memory_bench.sh
// but small.
Config PipelineConfig() {
  absl::StatusOr<Config> config = ParseConfig(
      "[data]\ntrain = \"x.bin\"\n[model]\nn_layer = 4\nn_head = 2\nn_embd = 64\n"
      "max_seq_len = 64\nvocab_size = 512\n[train]\nbatch_size = 4\nmicrobatches = 4\n"
      "seq_len = 64\n[parallel]\npp = 2\ndp = 2\npartition = \"even\"\n",
      "pipeline.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

MemoryFacts Facts() {
  MemoryFacts facts;
  facts.baseline_bytes = 30 * kMiB;
  facts.device_bytes = 8192 * kMiB;
  facts.device_source = "injected";
  facts.sharing = 4;
  facts.mpi = true;
  return facts;
}

TEST(MemoryHeadroomTest, EachStagesPeakIsItsTermsAndTheRoomIsTheFractionLessThePeak) {
  const Config config = PipelineConfig();
  absl::StatusOr<std::vector<RankMemoryPlan>> plans = PlanStagesMemory(config, Facts());
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 2u);
  const GPT2Config model = *ResolveModelConfig(config);
  const PipelinePlan split = *PlanPipeline(config, model);
  const int64_t B = 1, T = 64, C = 64, m = 4, dp = 2;
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    const RankMemoryPlan& plan = (*plans)[s];
    const int slots = 2 - s;  // 1F1B: stage s holds pp − s micro-batches
    const int64_t chunk = TotalBytes(PlanCpuStageMemory(model, split.specs[s], B, T, slots));
    // Stage 0 sends m activations and receives m gradients; stage 1 the other way round.
    const int64_t messages = 2 * m * B * T * C * 4;
    const int64_t batch = 2 * 4 * dp * T * 4;
    const int64_t mpi = MakeParamLayout(model, split.specs[s]).total * 4;
    EXPECT_EQ(plan.peak_bytes, 30 * kMiB + chunk + messages + batch + mpi);
    EXPECT_EQ(plan.baseline_bytes, 30 * kMiB);
    EXPECT_EQ(plan.device_bytes, 2048 * kMiB);  // the host shared by 4 ranks
    EXPECT_EQ(plan.side_bytes, static_cast<int64_t>(0.9 * 2048 * kMiB) - plan.peak_bytes);
    EXPECT_EQ(DescribeSideRoom(plan),
              absl::StrCat("runtime.memory_fraction 0.90 × 2.00 GiB − training's planned peak ",
                           FormatBytes(plan.peak_bytes)));
  }
  // Without MPI (an emulated or single-process run) no temporary is counted.
  MemoryFacts local = Facts();
  local.mpi = false;
  absl::StatusOr<std::vector<RankMemoryPlan>> alone = PlanStagesMemory(config, local);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*plans)[0].peak_bytes - (*alone)[0].peak_bytes,
            MakeParamLayout(model, split.specs[0]).total * 4);
  // An unknown device leaves no figure rather than a wrong one.
  local.device_bytes = 0;
  alone = PlanStagesMemory(config, local);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)[0].side_bytes, 0);
  EXPECT_TRUE(SideRooms(*alone).empty());
}

TEST(MemoryHeadroomTest, RecomputationAndZeroOneLeaveSideWorkWhatTheySave) {
  Config config = PipelineConfig();
  const std::vector<RankMemoryPlan> none = *PlanStagesMemory(config, Facts());
  config.model.recompute = "full";
  const std::vector<RankMemoryPlan> full = *PlanStagesMemory(config, Facts());
  // Stage 0 holds two micro-batches: full recomputation keeps less of each.
  EXPECT_LT(full[0].peak_bytes, none[0].peak_bytes);
  EXPECT_EQ(full[0].side_bytes - none[0].side_bytes, none[0].peak_bytes - full[0].peak_bytes);

  // On the CUDA backend the stage's peak is the chunk's own plan under the stage's mode
  // (PlanStageMemory with its recompute), so full recomputation frees device memory there too.
  Config gpu = PipelineConfig();
  gpu.runtime.device = "cuda";
  const std::vector<RankMemoryPlan> gpu_none = *PlanStagesMemory(gpu, Facts());
  gpu.model.recompute = "full";
  const std::vector<RankMemoryPlan> gpu_full = *PlanStagesMemory(gpu, Facts());
  EXPECT_LT(gpu_full[0].peak_bytes, gpu_none[0].peak_bytes);
  EXPECT_EQ(gpu_full[0].side_bytes - gpu_none[0].side_bytes,
            gpu_none[0].peak_bytes - gpu_full[0].peak_bytes);

  // ZeRO-1 at dp 4 against zero 0 with the same buckets: a quarter of the moments.
  config.model.recompute = "none";
  config.parallel.dp = 4;
  config.parallel.dp_bucket_mb = 4;
  const std::vector<RankMemoryPlan> whole = *PlanStagesMemory(config, Facts());
  config.parallel.zero = 1;
  const std::vector<RankMemoryPlan> sharded = *PlanStagesMemory(config, Facts());
  for (int s = 0; s < 2; ++s) {
    EXPECT_LT(sharded[s].peak_bytes, whole[s].peak_bytes);
    EXPECT_EQ(sharded[s].side_bytes - whole[s].side_bytes,
              whole[s].peak_bytes - sharded[s].peak_bytes);
  }

  // On CUDA the chunk's optimizer phase holds the share's moments (and its AdamW table): about
  // a quarter at dp 4, and the device's room for side work grows by what it saves.
  gpu.model.recompute = "none";
  gpu.parallel.dp = 4;
  gpu.parallel.dp_bucket_mb = 4;
  const std::vector<RankMemoryPlan> gpu_whole = *PlanStagesMemory(gpu, Facts());
  gpu.parallel.zero = 1;
  const std::vector<RankMemoryPlan> gpu_sharded = *PlanStagesMemory(gpu, Facts());
  const auto optimizer = [](const RankMemoryPlan& plan) {
    for (const HostBuffer& b : plan.buffers) {
      if (b.name == "optimizer") return b.bytes;
    }
    return int64_t{-1};
  };
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    EXPECT_GT(optimizer(gpu_sharded[s]), 0);
    EXPECT_LT(3 * optimizer(gpu_sharded[s]), optimizer(gpu_whole[s]));
    EXPECT_GT(5 * optimizer(gpu_sharded[s]), optimizer(gpu_whole[s]));
    EXPECT_EQ(gpu_whole[s].peak_bytes - gpu_sharded[s].peak_bytes,
              optimizer(gpu_whole[s]) - optimizer(gpu_sharded[s]));
    EXPECT_EQ(gpu_sharded[s].side_bytes - gpu_whole[s].side_bytes,
              gpu_whole[s].peak_bytes - gpu_sharded[s].peak_bytes);
    // The host stages the all-gather through a pinned copy of the parameters.
    bool pinned = false;
    for (const HostBuffer& b : gpu_sharded[s].host_buffers) {
      pinned = pinned || absl::StrContains(b.name, "ZeRO-1's pinned copy of the parameters");
    }
    EXPECT_TRUE(pinned);
  }
}

// ZeRO-1 in bf16 on CUDA: the chunk keeps the fp32 master of its share only, in the optimizer
// phase beside the share's moments, so the plan (the start-up check's, `config memory`'s and
// the side-work room's) counts 12 bytes per element of the share where zero = 0 counts 12 per
// parameter, in closed form; the all-gather's pinned host copies (fp32, and the bf16 weights
// they are widened from) are counted where it runs through host memory (MPI) and not over
// NCCL, which gathers in place on the device.
TEST(MemoryHeadroomTest, ZeroOneInBf16PlansTheMastersShareAndNoHostCopyOverNccl) {
  Config gpu = PipelineConfig();
  gpu.runtime.device = "cuda";
  gpu.runtime.precision = "bf16";
  gpu.parallel.dp = 4;
  gpu.parallel.dp_bucket_mb = 4;
  const std::vector<RankMemoryPlan> whole = *PlanStagesMemory(gpu, Facts());
  gpu.parallel.zero = 1;
  const std::vector<RankMemoryPlan> sharded = *PlanStagesMemory(gpu, Facts());
  MemoryFacts nccl = Facts();
  nccl.device_transport = true;
  const std::vector<RankMemoryPlan> over_nccl = *PlanStagesMemory(gpu, nccl);
  const GPT2Config model = *ResolveModelConfig(gpu);
  const PipelinePlan split = *PlanPipeline(gpu, model);
  const auto phase = [](const RankMemoryPlan& plan, const char* name) {
    for (const HostBuffer& b : plan.buffers) {
      if (b.name == name) return b.bytes;
    }
    return int64_t{-1};
  };
  const auto aligned = [](int64_t bytes) {
    return (bytes + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
  };
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    const int64_t P = MakeParamLayout(model, split.specs[s]).total;
    int largest = 0;
    for (int r = 1; r < 4; ++r) {
      if (ZeroShareElements(model, split.specs[s], 4, r) >
          ZeroShareElements(model, split.specs[s], 4, largest)) {
        largest = r;
      }
    }
    const OptimizerShare share = CudaOptimizerShare(gpu, model, split.specs[s], largest);
    ASSERT_GT(share.elements, 0);
    ASSERT_LT(3 * share.elements, P);
    EXPECT_EQ(phase(whole[s], "parameters"), aligned(P * 4) + aligned(P * 2));
    EXPECT_EQ(phase(whole[s], "optimizer"), 2 * aligned(P * 4));
    EXPECT_EQ(phase(sharded[s], "parameters"), aligned(P * 2));
    EXPECT_EQ(phase(sharded[s], "optimizer"),
              3 * aligned(share.elements * 4) +
                  aligned(share.table_chunks * static_cast<int64_t>(sizeof(cuda::TensorChunk))));
    EXPECT_EQ(whole[s].peak_bytes - sharded[s].peak_bytes,
              phase(whole[s], "parameters") + phase(whole[s], "optimizer") -
                  phase(sharded[s], "parameters") - phase(sharded[s], "optimizer"));
    EXPECT_EQ(over_nccl[s].peak_bytes, sharded[s].peak_bytes);
    int64_t pinned = 0, pinned_over_nccl = 0;
    for (const HostBuffer& b : sharded[s].host_buffers) {
      if (absl::StartsWith(b.name, "ZeRO-1's pinned copy")) pinned += b.bytes;
    }
    for (const HostBuffer& b : over_nccl[s].host_buffers) {
      if (absl::StartsWith(b.name, "ZeRO-1's pinned copy")) pinned_over_nccl += b.bytes;
    }
    EXPECT_EQ(pinned, P * 4 + P * 2);
    EXPECT_EQ(pinned_over_nccl, 0);
  }
  // `config memory` plans for the transport the run would take: NCCL for 8 CUDA ranks.
  EXPECT_TRUE(PlanningFacts(gpu).device_transport);
  gpu.parallel.transport = "mpi";
  EXPECT_FALSE(PlanningFacts(gpu).device_transport);
}

// The start-up check on CUDA: a rank whose planned peak is above the device's memory
// (runtime.device_memory_mb here) is refused before any chunk is made, naming both figures and
// the plan's phases; ZeRO-1's smaller plan fits the same device.
TEST(MemoryHeadroomTest, TheDevicePlanIsCheckedAgainstTheDevicesMemory) {
  Config gpu = PipelineConfig();
  gpu.runtime.device = "cuda";
  gpu.runtime.precision = "bf16";
  const RankMemoryPlan whole = (*PlanStagesMemory(gpu, Facts()))[0];
  gpu.parallel.zero = 1;
  const RankMemoryPlan sharded = (*PlanStagesMemory(gpu, Facts()))[0];
  ASSERT_LT(sharded.peak_bytes, whole.peak_bytes);
  RankMemoryPlan refused = whole;
  refused.device_bytes = (sharded.peak_bytes + whole.peak_bytes) / 2;
  RankMemoryPlan fits = sharded;
  fits.device_bytes = refused.device_bytes;
  EXPECT_TRUE(CheckDevicePlan(fits, "runtime.device_memory_mb").ok());
  const absl::Status s = CheckDevicePlan(refused, "runtime.device_memory_mb");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("needs ", FormatBytes(whole.peak_bytes))));
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("the device's ", FormatBytes(refused.device_bytes),
                                     " (runtime.device_memory_mb)")));
  EXPECT_THAT(s.message(), HasSubstr("optimizer "));
  EXPECT_THAT(s.message(), HasSubstr("parallel.zero = 1"));
  // An unknown device, or a CPU run, is not refused here.
  refused.device_bytes = 0;
  EXPECT_TRUE(CheckDevicePlan(refused, "unknown").ok());
}

TEST(MemoryHeadroomTest, ConfigMemoryPrintsEachStagesRoomForSideWork) {
  Config config = PipelineConfig();
  config.runtime.device_memory_mb = 8192;
  config.runtime.memory_fraction = 0.5;
  absl::StatusOr<std::string> report = SideWorkReport(config);
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<std::string> lines = absl::StrSplit(*report, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << *report;
  EXPECT_THAT(lines[0], HasSubstr("runtime.memory_fraction = 0.50 of the host's 8.00 GiB "
                                  "(runtime.device_memory_mb), shared by the run's 4 ranks"));
  // The same plan as PlanStagesMemory's with this process's facts.
  const std::vector<RankMemoryPlan> plans = *PlanStagesMemory(config, PlanningFacts(config));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(plans[s].side_bytes, static_cast<int64_t>(0.5 * 2048 * kMiB) - plans[s].peak_bytes);
    EXPECT_THAT(
        lines[1 + s],
        HasSubstr(absl::StrCat("stage ", s, ": training's peak ", FormatBytes(plans[s].peak_bytes),
                               "; side work ", FormatBytes(plans[s].side_bytes))));
  }
}

TEST(MemoryHeadroomTest, ASideTaskAboveItsStagesRoomIsRefusedNamingTheRoom) {
  Config config = PipelineConfig();
  config.freeride.enabled = true;
  SideTaskConfig task;
  task.type = "spin";
  task.stages = {1};
  task.memory_limit_bytes = 100 * kMiB;
  config.side_tasks = {task};
  const std::vector<SideRoom> rooms = {{200 * kMiB, "stage 0's plan"}, {50 * kMiB, "stage 1's"}};
  absl::Status s = CheckSideTaskPlacement(config, rooms);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("side_tasks[0].memory_limit = 100MiB is more than stage 1 "
                                     "leaves to side work: 50.0 MiB (stage 1's)"));
  config.side_tasks[0].stages = {0};
  EXPECT_TRUE(CheckSideTaskPlacement(config, rooms).ok());
}

}  // namespace
}  // namespace freeride
