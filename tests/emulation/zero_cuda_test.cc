// ZeRO-1 (parallel.zero = 1) on CUDA chunks, under the CUDA emulation: at pp 2 × dp 2, ranks as
// threads over the in-process transport (host-staged sums that add the replicas in rank order,
// as MPI's do at dp 2) and over emulated NCCL, the sharded run trains the unsharded run's bits:
// losses, gradient norms (the shares' chunk sums combined by the fused norm's own kernel), every
// rank's parameters, and each rank's moments against the unsharded moments at its share's places,
// the shares of a stage's replicas covering it once. A checkpoint saved sharded resumes at
// dp 1 on CUDA and on the CPU with the moments an unsharded checkpoint gives.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/cuda/multi_tensor_table.h"
#include "models/grad_norm.h"
#include "models/stage_message.h"
#include "pipeline/grad_buckets.h"
#include "tests/emulation/over_nccl.h"
#include "tests/pipeline/train_parity.h"
#include "tests/pipeline/zero_run.h"
#include "trainer/rank_memory.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

using testing::ExpectSameBits;
using testing::OverNccl;
using testing::ParityConfig;
using testing::ParityShard;
using testing::SingleProcessLosses;
using testing::ThreadedLosses;
using testing::Train;

constexpr int kSteps = 3;  // the emulated chunks are slow: the moments zero, then set, twice

class ZeroCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
  // pp 2 × dp 2 on CUDA, 4 micro-batches of 1 sequence per replica, a clip some steps reach,
  // the same split in every run.
  static Config CudaConfig(const std::string& shard, const std::string& schedule,
                           const std::string& precision) {
    Config config = ParityConfig(shard, schedule, 2, 2, 4, 4);
    config.runtime.device = "cuda";
    config.runtime.precision = precision;
    config.parallel.partition = "even";
    config.optim.grad_clip = 0.36;
    config.train.steps = kSteps;  // the last step finishes its all-gather: the harness reads it
    return config;
  }
  // Post-validated steps, 4 under a clip that step 2 reaches and step 3 does not: step 3 runs
  // ahead on step 2's speculative update and is rolled back, step 4 on step 3's and is kept.
  static constexpr int kPostSteps = 4;
  static constexpr double kClip = 0.6;
  static Config PostValidatedConfig(const std::string& schedule, const std::string& precision) {
    Config config = CudaConfig(ParityShard(), schedule, precision);
    config.optim.step_sync = "post_validate";
    config.optim.grad_clip = kClip;
    config.train.steps = kPostSteps;
    return config;
  }
};

// `config` over emulated NCCL (ZeRO-1's reduces and broadcasts in place on the device), with
// nothing through the bootstrap transport (MPI's stand-in) during the steps.
testing::ZeroRun TrainOverNccl(Config config, int steps = kSteps) {
  config.runtime.comm_timeout_s = 60;  // a failure fails in a minute, not five
  std::atomic<int64_t> bootstrap_calls{0};
  testing::ZeroRun run = Train(config, steps, false, [&](pipeline::Transport& t) {
    return OverNccl::Make(t, config, &bootstrap_calls);
  });
  EXPECT_EQ(bootstrap_calls, 0) << "calls to the bootstrap transport during the steps";
  return run;
}

// The shares' chunk sums put back together by the fused norm's combining kernel give the units
// GradSquaresByUnit gives over the same gradients, bit for bit. The gradients are chosen so
// that the order shows: each layer's ln1_w starts with 1e8 (a square of 1e16, whose ulp is 2)
// and every other tensor of the layer with 1, so that adding the ones one by one after 1e16
// (models/grad_norm.h's order) loses them and the fused norm's tree does not.
TEST(ZeroCudaChunkTest, TheShardedNormCombinesInTheFusedNormsOrder) {
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(2, 2, 16, 8, 64);
  ASSERT_TRUE(config.ok());
  auto chunk = CudaStageModel::Create(*config, WholeModel(*config), 1, 8, 1, CudaStageOptions{});
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  StageModel& m = **chunk;
  const ParamLayout& layout = m.layout();
  ASSERT_TRUE(m.ZeroGrads().ok());
  absl::StatusOr<float*> grads = m.HostGrads(0, layout.total);
  ASSERT_TRUE(grads.ok());
  std::fill(*grads, *grads + layout.total, 0.0f);
  std::vector<ParamRange> whole;
  for (const TensorSlot& slot : layout.slots) {
    if (!slot.present || slot.elements == 0) continue;
    whole.push_back({slot.offset, slot.elements});
    const int64_t per = IsPerLayer(slot.tensor) ? slot.elements / config->n_layer : slot.elements;
    for (int64_t at = 0; at < slot.elements; at += per) {
      (*grads)[slot.offset + at] = slot.tensor == ParamTensor::kLn1W ? 1e8f : 1.0f;
    }
  }
  ASSERT_TRUE(m.CommitHostGrads(0, layout.total).ok());
  const absl::StatusOr<std::vector<double>> fused = m.GradSquaresByUnit();
  ASSERT_TRUE(fused.ok()) << fused.status();
  const NormPlan plan = PlanGradNorm(layout);
  std::vector<double> partials(plan.chunks, 0.0);
  ASSERT_TRUE(m.ShardGradSquares(whole, partials.data()).ok());
  const absl::StatusOr<std::vector<double>> combined = m.CombineGradSquares(partials.data());
  ASSERT_TRUE(combined.ok()) << combined.status();
  EXPECT_EQ(*combined, *fused);
  // The order shows: the CPU's order gives other bits here.
  EXPECT_NE(UnitsFromChunkSquares(plan, partials.data()), *fused);
}

// A bf16 chunk made with a ZeRO-1 share (CudaStageOptions::zero_share, as the trainer makes
// it) allocates exactly its plan from the start, and the plan counts the share: the fp32 master
// and both moments of the share's elements (the optimizer phase), the bf16 compute copy whole
// (the parameters phase), in closed form. The all-gather's pinned host copies exist where it
// runs through the host (MPI) and not over NCCL, which gathers in place on the device.
TEST(ZeroCudaChunkTest, AShardedBf16ChunkAllocatesItsPlanWithTheMastersShare) {
  absl::StatusOr<GPT2Config> config = MakeGPT2Config(2, 2, 16, 8, 64);
  ASSERT_TRUE(config.ok());
  const StageSpec spec = WholeModel(*config);
  const ParamLayout layout = MakeParamLayout(*config, spec);
  const int64_t P = layout.total;
  const pipeline::ZeroSplit split =
      pipeline::SplitForZero(layout, pipeline::BucketFloats(1.0 / 256, true), 2);
  const std::vector<ParamRange>& share = split.owned[1];
  int64_t held = 0;
  for (const ParamRange& r : share) held += r.n;
  ASSERT_GT(held, 0);
  ASSERT_LT(held, P);
  const auto aligned = [](int64_t bytes) {
    return (bytes + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
  };
  MemoryPlan whole, sharded;
  PlanStageMemory(*config, spec, 1, 8, 1, 2, &whole);
  PlanStageMemory(*config, spec, 1, 8, 1, 2, &sharded, true, cuda::AttentionMode::kAuto,
                  Recompute::kNone, OptimizerShare{held, cuda::ShareTableChunks(share)});
  EXPECT_EQ(whole.PhaseBytes(MemoryPhase::kParameters), aligned(P * 4) + aligned(P * 2));
  EXPECT_EQ(sharded.PhaseBytes(MemoryPhase::kParameters), aligned(P * 2));
  EXPECT_EQ(sharded.PhaseBytes(MemoryPhase::kOptimizer),
            3 * aligned(held * 4) + aligned(cuda::ShareTableChunks(share) *
                                            static_cast<int64_t>(sizeof(cuda::TensorChunk))));
  for (bool host_gather : {false, true}) {
    SCOPED_TRACE(host_gather ? "through the host" : "on the device");
    CudaStageOptions options;
    options.precision = CudaPrecision::kBf16;
    options.zero_share = share;
    options.zero_host_gather = host_gather;
    size_t free_before = 0, free_after = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    auto chunk = CudaStageModel::Create(*config, spec, 1, 8, 1, options);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    CudaStageModel& m = **chunk;
    EXPECT_EQ(static_cast<int64_t>(free_before - free_after), sharded.TotalBytes());
    EXPECT_EQ(m.memory_plan().TotalBytes(), sharded.TotalBytes());
    EXPECT_EQ(m.MasterParamElements(), held);
    EXPECT_EQ(m.OptimizerStateElements(), held);
    // Made sharded: confirmed with its own share only.
    EXPECT_FALSE(m.ShardOptimizerState(split.owned[0]).ok());
    EXPECT_TRUE(m.ShardOptimizerState(share).ok());
    EXPECT_FALSE(m.ShardOptimizerState(share).ok());
    EXPECT_EQ(m.HostParams(0, 1).ok(), host_gather);
    // The share's master and the others' bf16 weights, and back: the same chunk.
    std::vector<float> params(P), again(P);
    ASSERT_TRUE(m.InitRandom(7).ok());
    ASSERT_TRUE(m.GetParams(params.data()).ok());
    ASSERT_TRUE(m.SetParams(params.data()).ok());
    ASSERT_TRUE(m.GetParams(again.data()).ok());
    EXPECT_EQ(std::memcmp(params.data(), again.data(), P * sizeof(float)), 0);
  }
}

// 1F1B and ZB-H1 (its W instructions make the last weight gradients), fp32 and bf16 (the
// fp32 master stepped, the bf16 copy rounded from it, both gathered), buckets that cut tensors
// and the default one: each sharded run, over the in-process transport (MPI's host sums) and
// over emulated NCCL (the reduces and broadcasts in place on the device, nothing through the
// bootstrap during the steps), against its unsharded one. Fails if a share steps other
// elements or moments than its own, if the reduce-scatter leaves a rank another part, if the
// norm adds the shares' chunk sums in another order than the fused norm's, or over NCCL if a
// part's reduce or broadcast has another root or the broadcast is skipped.
TEST_F(ZeroCudaTest, ShardsTrainTheUnshardedBits) {
  const std::string shard = ParityShard();
  for (const auto& [kind, precision, bucket_mb] :
       {std::tuple{"1f1b", "fp32", 1.0 / 256}, std::tuple{"zbh1", "bf16", 0.0},
        std::tuple{"1f1b", "bf16", 1.0 / 256}, std::tuple{"zbh1", "fp32", 0.0}}) {
    SCOPED_TRACE(absl::StrFormat("%s %s buckets %g MiB", kind, precision, bucket_mb));
    Config config = CudaConfig(shard, kind, precision);
    config.parallel.dp_bucket_mb = bucket_mb;
    const testing::ZeroRun whole = Train(config, kSteps);
    config.parallel.zero = 1;
    const testing::ZeroRun sharded = Train(config, kSteps);
    ExpectSameBits(sharded, whole, 2);
    // In bf16 each rank keeps the fp32 master of its share only.
    for (const std::vector<bool>& master : sharded.master) {
      EXPECT_EQ(std::count(master.begin(), master.end(), false) > 0,
                std::string(precision) == "bf16");
    }
    SCOPED_TRACE("over NCCL");
    ExpectSameBits(TrainOverNccl(config), whole, 2);
  }
}

// The Llama family (untied head: its own matrix in the head's share) under 1F1B in fp32.
TEST_F(ZeroCudaTest, LlamaShardsTrainTheUnshardedBits) {
  Config config = CudaConfig(ParityShard(), "1f1b", "fp32");
  config.model.arch = "llama";
  config.model.n_kv_head = 1;
  config.model.ffn_hidden = 24;
  config.model.rope_theta = 500.0;
  config.model.tie_embeddings = false;
  const testing::ZeroRun whole = Train(config, kSteps);
  config.parallel.zero = 1;
  ExpectSameBits(Train(config, kSteps), whole, 2);
}

// Post-validated steps (optim.step_sync = "post_validate"), 1F1B and ZB-H1, fp32 and bf16,
// with a run ahead rolled back and one kept (PostValidatedConfig). The
// sharded run backs up and restores its share's moments (the packed ones on the device) and
// trains the unsharded bits over the in-process transport and over emulated NCCL, nothing
// through the bootstrap during the steps; zero = 0 over NCCL trains them too. Over NCCL both
// hung before the fix (rank 0 waiting for stage 1's gradient of micro-batch 0, rank 1 for
// stage 0's activation): the rollback posted the receives of the messages sent ahead again
// behind the step's other receives, still posted on the link, and NCCL matches a link's
// receives in the order they were posted, not by tag (StageExecutor::DiscardAhead).
TEST_F(ZeroCudaTest, PostValidatedStepsTrainTheUnshardedBits) {
  for (const auto& [kind, precision] : {std::pair{"1f1b", "fp32"}, std::pair{"zbh1", "bf16"},
                                        std::pair{"1f1b", "bf16"}, std::pair{"zbh1", "fp32"}}) {
    SCOPED_TRACE(absl::StrFormat("%s %s", kind, precision));
    Config config = PostValidatedConfig(kind, precision);
    const testing::ZeroRun whole = Train(config, kPostSteps);
    ASSERT_EQ(whole.norm_values.size(), static_cast<size_t>(kPostSteps));
    EXPECT_GT(whole.norm_values[1], kClip) << "step 3's run ahead is not rolled back";
    EXPECT_LE(whole.norm_values[2], kClip) << "step 4's run ahead is not kept";
    {
      SCOPED_TRACE("zero = 0 over NCCL");
      const testing::ZeroRun nccl = TrainOverNccl(config, kPostSteps);
      EXPECT_EQ(nccl.losses, whole.losses);
      EXPECT_EQ(nccl.norms, whole.norms);
      EXPECT_TRUE(nccl.params == whole.params);
    }
    config.parallel.zero = 1;
    ExpectSameBits(Train(config, kPostSteps), whole, 2);
    SCOPED_TRACE("over NCCL");
    ExpectSameBits(TrainOverNccl(config, kPostSteps), whole, 2);
  }
}

// ZeRO-1 over emulated NCCL, post-validated 1F1B in fp32 and bf16 as above, with every NCCL
// group that holds a broadcast 50 ms late on its stream: the all-gather of a speculative step
// lands well after each rank reaches the first forward it runs ahead. The bits do not change.
// Fails when that forward does not wait for the broadcasts (GradBuckets::WaitGather): it reads,
// and in bf16 the compute copy is rounded from, parameters the broadcasts have not written yet
// (found by removing the wait, 2026-11-27). The tests above pass without it: under a barrier
// the step's loss sum over the data-parallel group queues behind the broadcasts on their
// stream and the host waits for it, and undelayed broadcasts land before the forward reads.
TEST_F(ZeroCudaTest, TheFirstForwardWaitsForALateAllGather) {
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    Config config = PostValidatedConfig("1f1b", precision);
    const testing::ZeroRun whole = Train(config, kPostSteps);
    config.parallel.zero = 1;
    emu::SetNcclRootedDelay(0.05);
    const testing::ZeroRun late = TrainOverNccl(config, kPostSteps);
    emu::SetNcclRootedDelay(0);
    ExpectSameBits(late, whole, 2);
  }
}

// A post-validated step rolled back with no step run ahead of it (step 2, before a checkpoint,
// which nothing runs ahead past), its speculative all-gather still on its way (every reduce
// and broadcast 50 ms late): the rollback waits for that gather before it puts the backup back
// and steps again (Trainer::Validate's CompleteParams), and the bits do not change.
TEST_F(ZeroCudaTest, ARollbackFinishesTheSpeculativeAllGatherFirst) {
  Config config = PostValidatedConfig("1f1b", "fp32");
  config.checkpoint.every = 2;
  config.checkpoint.background = false;
  config.run.dir = (std::filesystem::path(::testing::TempDir()) / "zero_cuda_rollback").string();
  std::filesystem::remove_all(config.run.dir);
  const testing::ZeroRun whole = Train(config, kPostSteps);
  std::filesystem::remove_all(config.run.dir);
  config.parallel.zero = 1;
  emu::SetNcclRootedDelay(0.05);
  const testing::ZeroRun late = TrainOverNccl(config, kPostSteps);
  emu::SetNcclRootedDelay(0);
  ExpectSameBits(late, whole, 2);
}

// Saved with zero = 1 at dp 2 on CUDA after step 2 (a share file per rank): resumed sharded at
// dp 2 on CUDA it continues the uninterrupted run bit for bit (the shares put back where they
// were); resumed at dp 1 on CUDA and on the CPU, the next two steps' losses (the second after
// an update that reads the moments) are those an unsharded checkpoint of the same run resumes
// to, and near the uninterrupted run's (dp 1 adds the replicas' gradients in another order).
TEST_F(ZeroCudaTest, AShardedCheckpointResumesAtDpTwoAndOneOnCudaAndOnTheCpu) {
  const std::string shard = ParityShard();
  const auto dir = [](const std::string& name) {
    const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
    std::filesystem::remove_all(path);
    return path;
  };
  std::vector<std::string> checkpoints;
  std::vector<double> uninterrupted;
  for (int zero : {0, 1}) {
    Config config = CudaConfig(shard, "1f1b", "fp32");
    config.parallel.zero = zero;
    config.train.steps = 4;  // 2 before the save, 2 after
    config.checkpoint.background = false;
    config.run.dir = dir(absl::StrFormat("zero_cuda_ckpt_%d", zero));
    uninterrupted = ThreadedLosses(config, 4, nullptr, /*resume_at=*/2);
    checkpoints.push_back(config.run.dir + "/checkpoints/step_00000002");
    ASSERT_TRUE(std::filesystem::exists(checkpoints.back())) << checkpoints.back();
  }
  ASSERT_EQ(uninterrupted.size(), 4u);
  ASSERT_TRUE(std::filesystem::exists(checkpoints[1] + "/moments_r000_d001.bin"));
  const std::vector<double> after(uninterrupted.begin() + 2, uninterrupted.end());
  {
    Config config = CudaConfig(shard, "1f1b", "fp32");
    config.parallel.zero = 1;
    config.train.steps = 4;
    config.checkpoint.resume = checkpoints[1];
    config.run.dir = dir("zero_cuda_resumed");
    EXPECT_EQ(ThreadedLosses(config, 2), after);
  }
  for (const std::string device : {"cuda", "cpu"}) {
    SCOPED_TRACE(device);
    std::vector<std::vector<double>> losses;
    for (const std::string& checkpoint : checkpoints) {
      // dp 1 with the global batch of dp 2 × 4 sequences.
      Config config = ParityConfig(shard, "1f1b", 2, 1, 4, 8);
      config.runtime.device = device;
      config.parallel.partition = "even";
      config.optim.grad_clip = 0.36;
      config.train.steps = 4;
      config.checkpoint.resume = checkpoint;
      config.run.dir = dir("zero_cuda_resumed");
      losses.push_back(ThreadedLosses(config, 2));
    }
    ASSERT_EQ(losses[0].size(), 2u);
    EXPECT_EQ(losses[1], losses[0]);
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(losses[1][i], after[i], 1e-5) << "step " << 3 + i;
  }
}

// In bf16 a rank keeps the fp32 master of its share only: a checkpoint gathers the rest from
// their owners, so the state files and model.bin of a run saved with zero = 1 at dp 2 hold the
// unsharded run's fp32 master bit for bit (not the bf16 weights), and resumed sharded at dp 2 it
// continues the uninterrupted run's losses.
TEST_F(ZeroCudaTest, ABf16ShardedCheckpointHoldsTheWholeMasterAndResumes) {
  const std::string shard = ParityShard();
  const auto dir = [](const std::string& name) {
    const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
    std::filesystem::remove_all(path);
    return path;
  };
  std::vector<std::string> checkpoints;
  std::vector<std::vector<double>> uninterrupted;
  for (int zero : {0, 1}) {
    Config config = CudaConfig(shard, "1f1b", "bf16");
    config.parallel.zero = zero;
    config.train.steps = 4;  // 2 before the save, 2 after
    config.checkpoint.background = false;
    config.run.dir = dir(absl::StrFormat("zero_cuda_bf16_ckpt_%d", zero));
    uninterrupted.push_back(ThreadedLosses(config, 4, nullptr, /*resume_at=*/2));
    checkpoints.push_back(config.run.dir + "/checkpoints/step_00000002");
    ASSERT_TRUE(std::filesystem::exists(checkpoints.back())) << checkpoints.back();
  }
  ASSERT_EQ(uninterrupted[0].size(), 4u);
  EXPECT_EQ(uninterrupted[1], uninterrupted[0]);
  for (int stage = 0; stage < 2; ++stage) {
    absl::StatusOr<RankState> whole =
        ReadRankState(checkpoints[0] + "/" + RankStateFileName(stage));
    absl::StatusOr<RankState> sharded =
        ReadRankState(checkpoints[1] + "/" + RankStateFileName(stage));
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    ASSERT_EQ(sharded->params.size(), whole->params.size());
    EXPECT_EQ(std::memcmp(sharded->params.data(), whole->params.data(),
                          whole->params.size() * sizeof(float)),
              0)
        << "stage " << stage;
    // Not the bf16 weights: some master values are not bf16 values.
    int64_t finer = 0;
    for (float x : whole->params) finer += FloatOfBf16(Bf16Bits(x)) != x;
    EXPECT_GT(finer, 0);
  }
  const auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(checkpoints[1] + "/model.bin"), read(checkpoints[0] + "/model.bin"));
  Config config = CudaConfig(shard, "1f1b", "bf16");
  config.parallel.zero = 1;
  config.train.steps = 4;
  config.checkpoint.resume = checkpoints[1];
  config.run.dir = dir("zero_cuda_bf16_resumed");
  EXPECT_EQ(ThreadedLosses(config, 2),
            std::vector<double>(uninterrupted[1].begin() + 2, uninterrupted[1].end()));
}

// The start-up check counts the share: on a device (runtime.device_memory_mb) between the
// sharded plan's peak and the whole one's, a bf16 run at dp 2 starts with zero = 1 and is
// refused with zero = 0, naming the figures, before any chunk is made.
TEST_F(ZeroCudaTest, AShardedRunStartsWhereTheWholeOneIsRefused) {
  Config config = CudaConfig(ParityShard(), "1f1b", "bf16");
  int64_t smallest_whole = std::numeric_limits<int64_t>::max(), largest = 0;
  const std::vector<RankMemoryPlan> whole = *PlanStagesMemory(config, PlanningFacts(config));
  for (const RankMemoryPlan& plan : whole)
    smallest_whole = std::min(smallest_whole, plan.peak_bytes);
  config.parallel.zero = 1;
  const std::vector<RankMemoryPlan> sharded = *PlanStagesMemory(config, PlanningFacts(config));
  for (const RankMemoryPlan& plan : sharded) largest = std::max(largest, plan.peak_bytes);
  ASSERT_LT(largest, smallest_whole) << "no device fits every sharded stage and no whole one";
  config.parallel.zero = 0;
  config.runtime.device_memory_mb = static_cast<double>(largest + smallest_whole) / 2 / (1 << 20);
  std::vector<std::string> errors;
  ThreadedLosses(config, 0, &errors);
  ASSERT_EQ(errors.size(), 4u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("more than the device's"), std::string::npos) << e;
    EXPECT_NE(e.find("(runtime.device_memory_mb)"), std::string::npos) << e;
  }
  config.parallel.zero = 1;
  errors.clear();
  ThreadedLosses(config, 0, &errors);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace freeride
