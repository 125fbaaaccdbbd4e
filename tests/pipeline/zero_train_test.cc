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

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;

struct ZeroRun {
  std::vector<uint64_t> losses, norms;  // bit patterns
  std::vector<bool> applied;
  std::vector<double> norm_values;
  std::vector<std::vector<uint32_t>> params;  // per rank, every chunk's
  // Per rank: each chunk's moments at their places in the chunk (element → m, v bits); a
  // ZeRO-1 rank's hold its share only.
  std::vector<std::map<std::pair<int, int64_t>, std::pair<uint32_t, uint32_t>>> moments;
  std::vector<int64_t> moment_bytes;  // per rank, what its chunks hold
};

ZeroRun Train(const Config& config, int steps = 5) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  ZeroRun run;
  run.params.resize(world);
  run.moments.resize(world);
  run.moment_bytes.resize(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
      }
      if ((*trainer)->executor().buckets() != nullptr) {
        (*trainer)->executor().set_verify_buckets(true);
      }
      for (int i = 0; i < steps; ++i) {
        absl::StatusOr<StepStats> s = (*trainer)->Step();
        if (!s.ok()) {
          failures[r] = std::string(s.status().message());
          return;
        }
        if (r == 0) {
          run.losses.push_back(std::bit_cast<uint64_t>(s->loss));
          run.norms.push_back(std::bit_cast<uint64_t>(s->grad_norm));
          run.norm_values.push_back(s->grad_norm);
          run.applied.push_back(s->applied);
        }
      }
      const pipeline::StageExecutor& executor = (*trainer)->executor();
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        std::vector<float> p(chunk.num_params());
        EXPECT_TRUE(chunk.GetParams(p.data()).ok());
        for (float x : p) run.params[r].push_back(std::bit_cast<uint32_t>(x));
        const int64_t held = chunk.OptimizerStateElements();
        std::vector<float> m(held), v(held);
        EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
        std::vector<ParamRange> places = {{0, chunk.num_params()}};
        if (executor.zero()) places = executor.buckets()->owned(c);
        int64_t at = 0;
        for (const ParamRange& range : places) {
          for (int64_t i = 0; i < range.n; ++i, ++at) {
            run.moments[r][{c, range.offset + i}] = {std::bit_cast<uint32_t>(m[at]),
                                                     std::bit_cast<uint32_t>(v[at])};
          }
        }
        EXPECT_EQ(at, held) << "rank " << r << " chunk " << c;
        run.moment_bytes[r] += chunk.OptimizerStateBytes();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  return run;
}

// `sharded` trained the bits of `whole`, and each of its ranks holds the unsharded moments at
// exactly its share's places, the shares of a stage's replicas covering the stage once.
void ExpectSameBits(const ZeroRun& sharded, const ZeroRun& whole, int pp) {
  EXPECT_EQ(sharded.losses, whole.losses);
  EXPECT_EQ(sharded.norms, whole.norms);
  EXPECT_EQ(sharded.applied, whole.applied);
  ASSERT_EQ(sharded.params.size(), whole.params.size());
  for (size_t r = 0; r < whole.params.size(); ++r) {
    EXPECT_TRUE(sharded.params[r] == whole.params[r]) << "rank " << r << "'s parameters differ";
    EXPECT_LT(sharded.moment_bytes[r], whole.moment_bytes[r]) << "rank " << r;
    for (const auto& [place, bits] : sharded.moments[r]) {
      auto it = whole.moments[r].find(place);
      ASSERT_NE(it, whole.moments[r].end());
      EXPECT_EQ(bits, it->second) << "rank " << r << " chunk " << place.first << " element "
                                  << place.second;
      if (bits != it->second) return;
    }
  }
  for (int stage = 0; stage < pp; ++stage) {
    std::map<std::pair<int, int64_t>, int> holders;
    for (size_t r = stage; r < whole.params.size(); r += pp) {
      for (const auto& [place, bits] : sharded.moments[r]) ++holders[place];
    }
    EXPECT_EQ(holders.size(), whole.moments[stage].size()) << "stage " << stage;
    for (const auto& [place, count] : holders) {
      ASSERT_EQ(count, 1) << "stage " << stage << " element " << place.second;
    }
  }
}

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

// The issue's grid: recompute none / selective / full × zero 0 / 1 × every schedule kind at
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

// A CUDA stage has no sharded optimizer yet: the config is refused naming the key.
TEST(ZeroConfigTest, ACudaStageIsRefusedNamingTheKey) {
  absl::StatusOr<Config> config = ParseConfig(R"(
[data]
train = "x.bin"
[parallel]
dp = 2
zero = 1
[runtime]
device = "cuda"
)",
                                              "zero.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("parallel.zero: expected 0 on runtime.device = \"cuda\""));
  EXPECT_FALSE(ParseConfig("[parallel]\nzero = 2\n[data]\ntrain = \"x.bin\"\n", "z.toml").ok());
}

}  // namespace
}  // namespace freeride
