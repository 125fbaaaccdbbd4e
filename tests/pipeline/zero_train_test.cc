// ZeRO-1 (parallel.zero = 1) trains the bits of the unsharded run, ranks as threads: every
// schedule kind at pp 2 × dp 2 under each recomputation mode, either family, with a clip that
// some steps reach (the global norm from the shards' chunk sums), buckets that cut tensors,
// post-validated steps (confirmed, clipped and redone, non-finite and skipped), more replicas,
// and the Llama family. Losses, gradient norms and every rank's parameters compare bit for
// bit, and each rank's moments share with the unsharded moments at its places.
#include <cblas.h>
#include <omp.h>

#include <bit>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "tests/pipeline/train_parity.h"
#include "tests/pipeline/zero_run.h"

namespace freeride {
namespace {

using testing::ExpectSameBits;
using testing::ParityConfig;
using testing::ParityShard;
using testing::Train;
using testing::ZeroRun;

class ZeroTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One BLAS and OpenMP thread per rank: the ranks are already threads.
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
  // pp 2 × dp 2, 4 micro-batches of 1 sequence per replica (every kind runs that, DualPipeV's
  // m ≥ 2p included), a clip that some steps reach, the same split in every run. `family`:
  // "gpt2", "llama" (the head tied) or "llama untied".
  static Config PlainConfig(const std::string& shard, const std::string& schedule,
                            const std::string& family = "gpt2") {
    Config config = family == "gpt2" ? ParityConfig(shard, schedule, 2, 2, 4, 4)
                                     : testing::LlamaParityConfig(shard, schedule, 2, 2, 4,
                                                                  family == "llama", 4);
    config.parallel.partition = "even";
    config.optim.grad_clip = 0.36;
    return config;
  }
};

// The grid: recompute none / selective / full × zero 0 / 1 × every schedule kind at
// pp 2 × dp 2, each against the plain run (1F1B, no recomputation, zero 0): the same losses
// and norms bit for bit; the zero = 1 runs' parameters and moment shares against the zero = 0
// run of the same schedule and recomputation. GPT-2 and the Llama family, its head tied and
// untied; the Llama's also with a mode per stage (parallel.recompute_stages).
TEST_F(ZeroTrainTest, EveryRecomputeZeroAndScheduleTrainsThePlainBits) {
  const std::string shard = ParityShard();
  for (const std::string family : {"gpt2", "llama", "llama untied"}) {
    const ZeroRun plain = Train(PlainConfig(shard, "1f1b", family));
    int clipped = 0;
    for (double norm : plain.norm_values) clipped += norm > 0.36;
    EXPECT_GT(clipped, 0) << family;  // the norm's bits reach the update
    std::vector<std::vector<std::string>> modes = {{"none"}, {"selective"}, {"full"}};
    if (family != "gpt2") modes.push_back({"none", "full", "selective"});
    for (const std::string schedule :
         {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
      for (const std::vector<std::string>& mode : modes) {
        Config config = PlainConfig(shard, schedule, family);
        config.model.recompute = mode[0];
        config.parallel.recompute_stages.assign(mode.begin() + 1, mode.end());
        SCOPED_TRACE(absl::StrFormat("%s %s pp=2 dp=2 recompute %s", family, schedule,
                                     absl::StrJoin(mode, " ")));
        const ZeroRun whole = Train(config);
        EXPECT_EQ(whole.losses, plain.losses);
        EXPECT_EQ(whole.norms, plain.norms);
        config.parallel.zero = 1;
        ExpectSameBits(Train(config), whole, 2);
      }
    }
  }
}

// Buckets that cut tensors (64 floats) and a few large ones: the shares cut buckets, and each
// bucket's reduce-scatter sums what the all-reduce summed.
TEST_F(ZeroTrainTest, BucketSizesDoNotChangeTheBits) {
  const std::string shard = ParityShard();
  for (const std::string schedule : {"1f1b", "zbv"}) {
    Config config = PlainConfig(shard, schedule);
    const ZeroRun whole = Train(config);
    config.parallel.zero = 1;
    for (double floats : {64.0, 1000.0, 0.0}) {
      SCOPED_TRACE(absl::StrFormat("%s buckets of %g floats", schedule, floats));
      config.parallel.dp_bucket_mb = floats * 4 / (1 << 20);
      ExpectSameBits(Train(config), whole, 2);
    }
  }
}

// Post-validated steps with sharded moments: confirmed, clipped (rolled back: the share's
// moments restored, the step redone and gathered again), and non-finite (rolled back and
// skipped), each against the unsharded barrier.
TEST_F(ZeroTrainTest, PostValidatedStepsRollBackShardedMoments) {
  const std::string shard = ParityShard();
  for (const std::string schedule : {"zbh2", "zbv", "interleaved"}) {
    for (const auto& [what, clip, lr] :
         {std::tuple{"clipped", 0.36, 1e-2}, std::tuple{"confirmed", 0.0, 1e-2},
          std::tuple{"non-finite", 0.0, 1e6}}) {
      SCOPED_TRACE(absl::StrFormat("%s post-validated, %s steps", schedule, what));
      Config config = ParityConfig(shard, schedule, 2, 2, 8);
      config.parallel.partition = "even";
      config.optim.grad_clip = clip;
      config.optim.lr = lr;
      if (lr > 1) config.optim.warmup_steps = 0;
      const ZeroRun barrier = Train(config);
      if (lr > 1) {
        EXPECT_TRUE(barrier.applied[1]);
        EXPECT_FALSE(barrier.applied[3]);
      }
      config.optim.step_sync = "post_validate";
      config.parallel.zero = 1;
      ExpectSameBits(Train(config), barrier, 2);
    }
  }
}

// Four replicas (each element summed in rank order, in one all-reduce or a reduce-scatter:
// the same bits) and the Llama family, tied and untied: the optimizer does not care which.
TEST_F(ZeroTrainTest, MoreReplicasAndLlamaTrainTheSameBits) {
  const std::string shard = ParityShard();
  {
    SCOPED_TRACE("pp=1 dp=4");
    Config config = ParityConfig(shard, "1f1b", 1, 4, 2, 2);
    config.optim.grad_clip = 0.36;
    const ZeroRun whole = Train(config);
    config.parallel.zero = 1;
    ExpectSameBits(Train(config), whole, 1);
  }
  for (bool tied : {true, false}) {
    SCOPED_TRACE(absl::StrFormat("llama pp=2 dp=2 %s", tied ? "tied" : "untied"));
    Config config = testing::LlamaParityConfig(shard, "zbh1", 2, 2, 2, tied, 4);
    config.parallel.partition = "even";
    config.optim.grad_clip = 0.36;
    const ZeroRun whole = Train(config);
    config.parallel.zero = 1;
    ExpectSameBits(Train(config), whole, 2);
  }
}

// On CUDA ZeRO-1 runs over either transport: "nccl", "mpi" and "auto" are all accepted, with
// post-validated steps too (refused over NCCL while their rollback hung there); a zero other
// than 0 or 1 is refused.
TEST(ZeroConfigTest, ZeroOnCudaTakesEveryTransport) {
  const auto toml = [](const std::string& transport) {
    return absl::StrCat("[data]\ntrain = \"x.bin\"\n[parallel]\ndp = 2\nzero = 1\ntransport = \"",
                        transport, "\"\n[runtime]\ndevice = \"cuda\"\n");
  };
  for (const char* transport : {"nccl", "mpi", "auto"}) {
    absl::StatusOr<Config> config = ParseConfig(toml(transport), "zero.toml");
    EXPECT_TRUE(config.ok()) << transport << ": " << config.status();
  }
  for (const char* transport : {"nccl", "mpi", "auto"}) {
    absl::StatusOr<Config> post_validated =
        ParseConfig(toml(transport) + "[optim]\nstep_sync = \"post_validate\"\n", "zero.toml");
    EXPECT_TRUE(post_validated.ok()) << transport << ": " << post_validated.status();
  }
  absl::StatusOr<Config> two =
      ParseConfig("[parallel]\nzero = 2\n[data]\ntrain = \"x.bin\"\n", "z.toml");
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(std::string(two.status().message()), ::testing::HasSubstr("parallel.zero"));
}

}  // namespace
}  // namespace freeride
