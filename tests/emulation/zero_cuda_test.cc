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
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/grad_norm.h"
#include "tests/emulation/over_nccl.h"
#include "tests/pipeline/train_parity.h"
#include "tests/pipeline/zero_run.h"

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
    ExpectSameBits(Train(config, kSteps), whole, 2);
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

}  // namespace
}  // namespace freeride
