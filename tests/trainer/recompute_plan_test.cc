// Recomputation in the run's plan: which stage recomputes what (model.recompute and
// parallel.recompute_stages, checked by name), the FLOPs MFU counts, the host memory
// `freeride config memory` shows for a CPU run, and what a run writes as its FLOPs per step.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "models/device_memory_plan.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/memory_report.h"
#include "trainer/pipeline_plan.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(absl::string_view text, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<Config> config = ParseConfig(text, "test.toml", overrides);
  EXPECT_FALSE(config.ok()) << "parsed although invalid:\n" << text;
  return config.ok() ? "" : std::string(config.status().message());
}

constexpr char kPp4[] = "[data]\ntrain = \"x\"\n[parallel]\npp = 4\n";

TEST(RecomputePlanTest, StagesTakeTheirListEntryElseTheModelKey) {
  absl::StatusOr<Config> config =
      ParseConfig(kPp4, "test.toml",
                  {"model.recompute=\"selective\"",
                   "parallel.recompute_stages=[\"full\", \"selective\", \"none\", \"none\"]"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StageRecompute(*config, 0), Recompute::kFull);
  EXPECT_EQ(StageRecompute(*config, 1), Recompute::kSelective);
  EXPECT_EQ(StageRecompute(*config, 3), Recompute::kNone);
  config->parallel.recompute_stages.clear();
  for (int s = 0; s < 4; ++s) EXPECT_EQ(StageRecompute(*config, s), Recompute::kSelective);
  // Round trip through the effective config.
  config->parallel.recompute_stages = {"full", "none", "none", "full"};
  absl::StatusOr<Config> again = ParseConfig(ConfigToToml(*config), "effective.toml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->parallel.recompute_stages, config->parallel.recompute_stages);
}

TEST(RecomputePlanTest, BadValuesNameTheKeyAndWhatFits) {
  EXPECT_THAT(ErrorOf(kPp4, {"model.recompute=\"some\""}),
              HasSubstr("model.recompute: expected one of \"none\", \"selective\", \"full\", "
                        "found a string (\"some\")"));
  EXPECT_THAT(ErrorOf(kPp4, {"parallel.recompute_stages=[\"full\", \"half\"]"}),
              HasSubstr("parallel.recompute_stages: expected a list of \"none\", \"selective\", "
                        "\"full\", found an array holding a string (\"half\")"));
  EXPECT_THAT(ErrorOf(kPp4, {"parallel.recompute_stages=[\"full\", \"none\"]"}),
              HasSubstr("parallel.recompute_stages: expected one entry per pipeline stage "
                        "(parallel.pp = 4), or empty for model.recompute on every stage, found 2 "
                        "entries"));
  // Both backends recompute for both families (tests/models/recompute_test.cc,
  // tests/gpu/cuda_recompute_gpu_test.cc).
  for (const char* device : {"cpu", "cuda"}) {
    for (const char* arch : {"gpt2", "llama"}) {
      EXPECT_TRUE(ParseConfig(kPp4, "test.toml",
                              {absl::StrCat("runtime.device=\"", device, "\""),
                               absl::StrCat("model.arch=\"", arch, "\""),
                               "parallel.recompute_stages=[\"full\", \"selective\", \"none\", "
                               "\"none\"]"})
                      .ok())
          << device << " " << arch;
    }
  }
}

TEST(RecomputePlanTest, FlopsAddOneBlockForwardPerFullBlockAndTheAttentionCorePerSelective) {
  absl::StatusOr<Config> config =
      ParseConfig(kPp4, "test.toml",
                  {"model.n_layer=8", "model.n_embd=64", "model.n_head=4", "train.seq_len=32",
                   "parallel.partition=\"even\"",
                   "parallel.recompute_stages=[\"full\", \"selective\", \"none\", \"full\"]"});
  ASSERT_TRUE(config.ok()) << config.status();
  const GPT2Config model = *ResolveModelConfig(*config);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 2 blocks per stage: stages 0 and 3 add 2 block forwards each (24·C² + 4·T·C per token),
  // stage 1 two attention cores (4·T·C).
  const double C = 64, T = 32;
  const double extra = 4 * (24 * C * C + 4 * T * C) + 2 * (4 * T * C);
  EXPECT_DOUBLE_EQ(TrainingFlopsPerTokenWithRecompute(*config, model, *plan),
                   TrainingFlopsPerToken(model, 32) + extra);
  config->parallel.recompute_stages.clear();
  EXPECT_DOUBLE_EQ(TrainingFlopsPerTokenWithRecompute(*config, model, *plan),
                   TrainingFlopsPerToken(model, 32));
}

// On a Llama the block's forward is its own: 2 FLOPs per matrix parameter (q, k, v of
// C + 2·kv rows, the attention projection, SwiGLU's gate, up and down: 3·C·F) and attention's
// 4·T·C; the attention core is 4·T·C over the query heads, grouped or not.
TEST(RecomputePlanTest, LlamaFlopsAddItsOwnBlockForward) {
  absl::StatusOr<Config> config =
      ParseConfig(kPp4, "test.toml",
                  {"model.arch=\"llama\"", "model.n_layer=8", "model.n_embd=64", "model.n_head=4",
                   "model.n_kv_head=2", "model.ffn_hidden=96", "train.seq_len=32",
                   "parallel.partition=\"even\"",
                   "parallel.recompute_stages=[\"full\", \"selective\", \"none\", \"full\"]"});
  ASSERT_TRUE(config.ok()) << config.status();
  const GPT2Config model = *ResolveModelConfig(*config);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double C = 64, T = 32, kv = 32, F = 96;
  const double forward = 2 * (C * (C + 2 * kv) + C * C + 3 * C * F) + 4 * T * C;
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerTokenPerBlock(model, 32, Recompute::kFull), forward);
  // A third of what TrainingFlopsPerToken counts for the blocks (forward and backward).
  EXPECT_DOUBLE_EQ(8 * forward,
                   (TrainingFlopsPerToken(model, 32) - 6 * model.padded_vocab_size * C) / 3);
  // 2 blocks per stage: stages 0 and 3 add 2 block forwards each, stage 1 two attention cores.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerTokenWithRecompute(*config, model, *plan),
                   TrainingFlopsPerToken(model, 32) + 4 * forward + 2 * (4 * T * C));
  EXPECT_EQ(RecomputedForwardShares(*config, model),
            (std::vector<double>{1, 4 * T * C / forward, 0, 1}));
}

// The CPU backend builds a Llama chunk in every mode (the config's check passed), and its plan
// keeps less per slot as the mode keeps less.
TEST(RecomputePlanTest, TheCpuBackendBuildsALlamaChunkInEveryMode) {
  const GPT2Config model = *MakeLlamaConfig(2, 2, 1, 8, 8, 64, 16, 10000.0, 1e-5, true);
  int64_t last_slot = -1;
  for (Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    SCOPED_TRACE(RecomputeName(mode));
    BackendOptions options;
    options.recompute = mode;
    absl::StatusOr<std::unique_ptr<StageModel>> chunk =
        MakeStageModel(options, model, WholeModel(model), 1, 8, 2);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const int64_t slot = TotalBytes(PlanCpuStageMemory(model, WholeModel(model), 1, 8, 2, mode)) -
                         TotalBytes(PlanCpuStageMemory(model, WholeModel(model), 1, 8, 1, mode));
    if (last_slot >= 0) {
      EXPECT_LT(slot, last_slot);
    }
    last_slot = slot;
  }
}

// On CUDA stages the FLOPs are what the chunk recomputes: full's block forward as on the CPU;
// selective's MLP product where the GELU runs in its epilogue (bf16 GPT-2 by default), else
// nothing (the attention probabilities are recomputed in every mode).
TEST(RecomputePlanTest, CudaStagesCountWhatTheChunkRecomputes) {
  const std::vector<std::string> base = {"model.n_layer=4",
                                         "model.n_embd=64",
                                         "model.n_head=4",
                                         "train.seq_len=32",
                                         "parallel.partition=\"even\"",
                                         "parallel.recompute_stages=[\"full\", \"selective\"]",
                                         "runtime.device=\"cuda\""};
  const double C = 64, T = 32;
  struct Case {
    std::vector<std::string> overrides;
    double selective;  // per token per block
  };
  for (const Case& c : {Case{{"runtime.precision=\"bf16\""}, 8 * C * C},
                        Case{{"runtime.precision=\"bf16\"", "runtime.fuse_gelu=\"off\""}, 0},
                        Case{{"runtime.precision=\"fp32\""}, 0},
                        Case{{"runtime.precision=\"bf16\"", "model.arch=\"llama\""}, 0}}) {
    std::vector<std::string> overrides = base;
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    SCOPED_TRACE(absl::StrJoin(c.overrides, " "));
    absl::StatusOr<Config> config =
        ParseConfig("[data]\ntrain = \"x\"\n[parallel]\npp = 2\n", "test.toml", overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    const GPT2Config model = *ResolveModelConfig(*config);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // A block's forward: GPT-2's 24·C² + 4·T·C; the Llama's own (q, k, v of C + 2·kv rows,
    // the projection, SwiGLU's 3·C·F; its default width F is not GPT-2's 4·C).
    const double kv = static_cast<double>(model.kv_dim()),
                 F = static_cast<double>(model.ffn_hidden);
    const double forward = model.is_llama() ? 2 * (C * (C + 2 * kv) + C * C + 3 * C * F) + 4 * T * C
                                            : 24 * C * C + 4 * T * C;
    EXPECT_EQ(RecomputedForwardShares(*config, model),
              (std::vector<double>{1, c.selective / forward}));
    // 2 blocks per stage.
    EXPECT_DOUBLE_EQ(TrainingFlopsPerTokenWithRecompute(*config, model, *plan),
                     TrainingFlopsPerToken(model, 32) + 2 * forward + 2 * c.selective);
  }
}

// Simulated time and the cost model of the schedule's bubbles: a stage's B grows by the
// forward its blocks recompute.
TEST(RecomputePlanTest, CostsAddTheRecomputedForwardToEachStagesB) {
  absl::StatusOr<Config> config = ParseConfig(
      "[data]\ntrain = \"x\"\n[parallel]\npp = 2\n", "test.toml",
      {"model.n_layer=4", "model.n_embd=64", "model.n_head=4", "train.seq_len=32",
       "parallel.partition=\"even\"", "parallel.recompute_stages=[\"full\", \"selective\"]"});
  ASSERT_TRUE(config.ok()) << config.status();
  const GPT2Config model = *ResolveModelConfig(*config);
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double C = 64, T = 32, selective = 4 * T * C / (24 * C * C + 4 * T * C);
  EXPECT_EQ(RecomputedForwardShares(*config, model), (std::vector<double>{1, selective}));
  const PartCosts parts{0.3, 3, 6};
  const pipeline::CostModel plain = CostModelFromParts(plan->specs, parts, plan->placement, 2);
  const pipeline::CostModel recomputing = CostModelFromParts(
      plan->specs, parts, plan->placement, 2, RecomputedForwardShares(*config, model));
  // 2 blocks per stage, each a third of `block` forward.
  EXPECT_DOUBLE_EQ(recomputing.stages[0].b, plain.stages[0].b + 2 * 3.0 / 3);
  EXPECT_DOUBLE_EQ(recomputing.stages[1].b, plain.stages[1].b + selective * 2 * 3.0 / 3);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(recomputing.stages[s].f, plain.stages[s].f);
    EXPECT_EQ(recomputing.stages[s].w, plain.stages[s].w);
  }
}

// Either family on the CPU backend: each stage's line is its chunk's plan under its mode.
TEST(RecomputePlanTest, ConfigMemoryShowsEachStagesSlotsAndSharedScratch) {
  for (const char* arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    absl::StatusOr<Config> config =
        LoadConfigFile("configs/gpt2_124m_pp4.toml",
                       {"parallel.schedule=\"1f1b\"", "train.microbatches=4",
                        absl::StrCat("model.arch=\"", arch, "\""),
                        "parallel.recompute_stages=[\"full\", \"selective\", \"none\", \"none\"]"});
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::string> report = HostMemoryReport(*config);
    ASSERT_TRUE(report.ok()) << report.status();
    const std::vector<std::string> lines = absl::StrSplit(*report, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 5u) << *report;
    const GPT2Config model = *ResolveModelConfig(*config);
    const int64_t B = config->train.batch_size / config->train.microbatches;
    const int64_t T = config->train.seq_len;
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
    ASSERT_TRUE(plan.ok());
    // 1F1B: stage s holds pp - s micro-batches.
    for (int s = 0; s < 4; ++s) {
      SCOPED_TRACE(lines[1 + s]);
      const Recompute mode = StageRecompute(*config, s);
      const StageSpec& spec = plan->specs[s];
      const int slots = 4 - s;
      const int64_t total = TotalBytes(PlanCpuStageMemory(model, spec, B, T, slots, mode));
      const int64_t slot =
          total - TotalBytes(PlanCpuStageMemory(model, spec, B, T, slots - 1, mode));
      EXPECT_THAT(lines[1 + s],
                  HasSubstr(absl::StrFormat("recompute %s; %d activation slot(s) of %s each",
                                            RecomputeName(mode), slots, FormatBytes(slot))));
      EXPECT_THAT(lines[1 + s], HasSubstr(FormatBytes(total)));
    }
    // Full keeps a block's input of its 16+ tensors: stage 0's slot is the smallest.
    auto slot_of = [&](int s) {
      const Recompute mode = StageRecompute(*config, s);
      return TotalBytes(PlanCpuStageMemory(model, plan->specs[s], B, T, 1, mode)) -
             TotalBytes(PlanCpuStageMemory(model, plan->specs[s], B, T, 0, mode));
    };
    EXPECT_LT(slot_of(0) * 5, slot_of(2));
    EXPECT_LT(slot_of(1), slot_of(2));
  }
}

// On the CUDA backend `config memory` plans each stage's chunk with its stage's mode (the plan
// the chunk allocates: tests/gpu/cuda_recompute_gpu_test.cc), either family.
TEST(RecomputePlanTest, ConfigMemoryPlansEachCudaStageWithItsMode) {
  for (const char* arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    absl::StatusOr<Config> config = LoadConfigFile(
        "configs/gpt2_124m_pp4.toml",
        {"parallel.schedule=\"1f1b\"", "train.microbatches=4", "runtime.device=\"cuda\"",
         "runtime.precision=\"bf16\"", absl::StrCat("model.arch=\"", arch, "\""),
         "parallel.recompute_stages=[\"full\", \"selective\", \"none\", \"full\"]"});
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::string> report = DeviceMemoryReport(*config);
    ASSERT_TRUE(report.ok()) << report.status();
    const std::vector<std::string> lines = absl::StrSplit(*report, '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 5u) << *report;
    const GPT2Config model = *ResolveModelConfig(*config);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(*config, model);
    ASSERT_TRUE(plan.ok());
    const int64_t B = config->train.batch_size / config->train.microbatches;
    for (int s = 0; s < 4; ++s) {
      const Recompute mode = StageRecompute(*config, s);
      MemoryPlan want, none;
      PlanStageMemory(model, plan->specs[s], B, config->train.seq_len, 4 - s, 2, &want, true,
                      cuda::AttentionMode::kAuto, mode);
      PlanStageMemory(model, plan->specs[s], B, config->train.seq_len, 4 - s, 2, &none);
      EXPECT_THAT(lines[1 + s],
                  HasSubstr(absl::StrFormat("recompute %s; %d activation slot(s): %s",
                                            RecomputeName(mode), 4 - s, want.Report())));
      // The last stage holds one micro-batch: full's shared buffers are then what the slot
      // held, and it saves nothing.
      if (mode != Recompute::kNone && s < 3) {
        EXPECT_LT(want.TotalBytes(), none.TotalBytes()) << "stage " << s;
      }
    }
  }
}

// The run's start record counts the recomputed forward in its FLOPs per step (MFU's numerator),
// either family's.
TEST(RecomputePlanTest, TheRunsFlopsPerStepCountTheRecomputation) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    const std::string shard = testing::ParityShard();
    Config config = llama ? testing::LlamaParityConfig(shard, "1f1b", 1, 1, 2, /*tied=*/true)
                          : testing::ParityConfig(shard, "1f1b", 1, 1, 2);
    config.model.recompute = "full";
    config.train.steps = 1;
    config.run.dir = (std::filesystem::path(::testing::TempDir()) / "recompute_flops").string();
    std::filesystem::remove_all(config.run.dir);
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
    absl::StatusOr<std::string> text = ReadFile(config.run.dir + "/metrics.jsonl");
    ASSERT_TRUE(text.ok()) << text.status();
    const nlohmann::json start =
        nlohmann::json::parse(std::string(*absl::StrSplit(*text, '\n', absl::SkipEmpty()).begin()));
    ASSERT_EQ(start["kind"], "start") << start.dump();
    const GPT2Config model = *ResolveModelConfig(config);
    // C = 16, T = 8; the Llama's 2 query heads share one key/value head of 8 (kv = 8), F = 24.
    const double C = 16, T = 8, tokens = 8 * 8;  // batch 8 × seq_len 8
    const double forward =
        llama ? 2 * (C * (C + 2 * 8) + C * C + 3 * C * 24) + 4 * T * C : 24 * C * C + 4 * T * C;
    EXPECT_DOUBLE_EQ(start["flops_per_step"].get<double>(),
                     (TrainingFlopsPerToken(model, 8) + 8 * forward) * tokens);
  }
}

}  // namespace
}  // namespace freeride
