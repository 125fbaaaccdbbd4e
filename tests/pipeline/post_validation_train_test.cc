// Post-validated steps train bit-identically to the barrier: every schedule kind, pp 2 and 4,
// dp 1 and 2, ranks as threads; in steps the speculation gets right, steps that clip (rolled
// back and redone with the clip scale) and non-finite steps (rolled back and skipped). Losses,
// gradient norms, whether each step was applied, and every rank's parameters and AdamW moments
// at the end are compared bit for bit.
#include <cblas.h>
#include <omp.h>

#include <bit>
#include <functional>
#include <thread>

#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;

struct TrainedRun {
  std::vector<uint64_t> losses, norms;  // bit patterns (non-finite ones compare too)
  std::vector<bool> applied;
  std::vector<double> norm_values;
  std::vector<std::vector<uint32_t>> state;  // per rank: parameters, m, v of every chunk
};

TrainedRun Train(const Config& config, int steps) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  TrainedRun run;
  run.state.resize(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
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
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        const int64_t n = chunk.num_params();
        std::vector<float> p(n), m(n), v(n);
        EXPECT_TRUE(chunk.GetParams(p.data()).ok());
        EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
        for (const auto* part : {&p, &m, &v}) {
          for (float x : *part) run.state[r].push_back(std::bit_cast<uint32_t>(x));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  return run;
}

class PostValidationTrainTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    // One BLAS and OpenMP thread per rank: the ranks are already threads.
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }

  // Every kind, pp 2 and 4, with dp = GetParam() and `tweak` applied to the config: the
  // post-validated run equals the barrier's. Returns the barrier runs, for the caller's
  // checks on what happened in them.
  static std::vector<TrainedRun> ExpectBitIdentical(const std::function<void(OptimConfig*)>& tweak,
                                                    int steps) {
    const std::string shard = ParityShard();
    const int dp = GetParam();
    std::vector<TrainedRun> runs;
    for (const std::string kind :
         {"gpipe", "1f1b", "interleaved", "zbh1", "zbh2", "zbv", "dualpipev"}) {
      for (int pp : {2, 4}) {
        SCOPED_TRACE(absl::StrFormat("%s pp=%d dp=%d", kind, pp, dp));
        Config config = ParityConfig(shard, kind, pp, dp, 8);
        config.train.steps = steps;
        // The same split in both runs (a balanced one follows this machine's timings).
        config.parallel.partition = "even";
        tweak(&config.optim);
        const TrainedRun barrier = Train(config, steps);
        config.optim.step_sync = "post_validate";
        const TrainedRun post = Train(config, steps);
        EXPECT_EQ(post.losses, barrier.losses);
        EXPECT_EQ(post.norms, barrier.norms);
        EXPECT_EQ(post.applied, barrier.applied);
        EXPECT_EQ(post.state.size(), barrier.state.size());
        for (size_t r = 0; r < std::min(post.state.size(), barrier.state.size()); ++r) {
          EXPECT_TRUE(post.state[r] == barrier.state[r]) << "rank " << r << " differs";
        }
        runs.push_back(barrier);
      }
    }
    return runs;
  }
};

// No clipping: every speculative step is confirmed.
TEST_P(PostValidationTrainTest, ConfirmedStepsAreBitIdentical) {
  ExpectBitIdentical([](OptimConfig* o) { o->grad_clip = 0; }, 5);
}

// A clip between the steps' norms (dp = 2 averages two batches: smaller norms): some steps
// clip (rolled back, redone with the clip scale), others are confirmed, among the steps 2 to
// 4 whose next step ran ahead.
TEST_P(PostValidationTrainTest, ClippedStepsAreRedoneBitIdentically) {
  const double clip = GetParam() == 1 ? 0.55 : 0.36;
  for (const TrainedRun& run :
       ExpectBitIdentical([&](OptimConfig* o) { o->grad_clip = clip; }, 5)) {
    int clipped = 0;
    for (int step = 2; step <= 4; ++step) clipped += run.norm_values[step - 1] > clip;
    EXPECT_GT(clipped, 0);
    EXPECT_LT(clipped, 3);
  }
}

// A learning rate that diverges: finite steps, then non-finite ones, never applied.
TEST_P(PostValidationTrainTest, NonFiniteStepsAreRolledBackAndSkipped) {
  const auto diverge = [](OptimConfig* o) {
    o->lr = 1e6;
    o->grad_clip = 0;
    o->warmup_steps = 0;
  };
  for (const TrainedRun& run : ExpectBitIdentical(diverge, 5)) {
    // Where the next step ran ahead: one applied before the first that is not.
    EXPECT_TRUE(run.applied[1]);
    EXPECT_FALSE(run.applied[3]);
  }
}

// A validation set makes a second, forward-only executor on the same chunks; it must not undo
// the training executor's choice that a post-validated head makes its tied gradient in I (the
// old code reset it, and the head's tied sum then missed the last micro-batches' share in the
// schedules that split I from W).
TEST_P(PostValidationTrainTest, AnEvaluationExecutorLeavesTheHeadsTiedGradientInI) {
  const std::string shard = ParityShard();
  const int dp = GetParam();
  for (const std::string kind : {"zbh1", "zbv"}) {
    for (int pp : {2, 4}) {
      SCOPED_TRACE(absl::StrFormat("%s pp=%d dp=%d", kind, pp, dp));
      Config config = ParityConfig(shard, kind, pp, dp, 8);
      config.train.steps = 3;
      config.parallel.partition = "even";
      config.data.val = shard;
      const TrainedRun barrier = Train(config, 3);
      config.optim.step_sync = "post_validate";
      const TrainedRun post = Train(config, 3);
      EXPECT_EQ(post.losses, barrier.losses);
      EXPECT_EQ(post.norms, barrier.norms);
      for (size_t r = 0; r < std::min(post.state.size(), barrier.state.size()); ++r) {
        EXPECT_TRUE(post.state[r] == barrier.state[r]) << "rank " << r << " differs";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DataParallel, PostValidationTrainTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrFormat("dp%d", info.param);
                         });

}  // namespace
}  // namespace freeride
