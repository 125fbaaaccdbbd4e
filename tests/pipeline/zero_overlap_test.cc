// ZeRO-1's all-gather of the parameters overlapped with the next step (parallel.zero_overlap):
// the gather a step's update starts is waited for by the next step, at each chunk's first
// forward and nowhere before, and that wait is the step's waiting (bubble time). Observed
// deterministically: ranks as threads, each on its own simulated clock, through a transport
// that logs every all-gather's start and wait (and where each step returned), and on which
// the wait for each bucket's gather takes exactly kGatherS of simulated time, the only waiting a
// step has on that clock.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using testing::ParityConfig;
using testing::ParityShard;

constexpr double kGatherS = 0.25;

enum class Event { kGatherStart, kGatherWait, kStepEnd };

// Another transport's operations, each all-gather's start and wait logged, and its wait
// advancing `clock` by kGatherS (the transfer it waits for).
class GatherLogTransport : public pipeline::Transport {
 public:
  GatherLogTransport(pipeline::Transport* inner, SimulatedClock* clock)
      : inner_(inner), clock_(clock) {}
  const std::vector<Event>& log() const { return log_; }
  void MarkStepEnd() { log_.push_back(Event::kStepEnd); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::StatusOr<Request> Isend(const void* data, int64_t bytes, int peer, int tag) override {
    return inner_->Isend(data, bytes, peer, tag);
  }
  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override {
    return inner_->Irecv(data, bytes, peer, tag);
  }
  absl::Status Wait(Request request, double timeout_s) override {
    if (gathers_.erase(request) > 0) {
      log_.push_back(Event::kGatherWait);
      clock_->Advance(kGatherS);
    }
    return inner_->Wait(request, timeout_s);
  }
  bool Test(Request request) override {
    // A gather lands only when waited for: polling never finishes it early.
    return gathers_.contains(request) ? false : inner_->Test(request);
  }
  absl::Status AllReduceSum(float* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return inner_->AllReduceSum(data, n, group, timeout_s);
  }
  absl::Status AllReduceSum(double* data, int64_t n, const std::vector<int>& group,
                            double timeout_s) override {
    return inner_->AllReduceSum(data, n, group, timeout_s);
  }
  absl::StatusOr<Request> StartAllReduceSum(float* data, int64_t n,
                                            const std::vector<int>& group) override {
    return inner_->StartAllReduceSum(data, n, group);
  }
  absl::StatusOr<Request> StartAllReduceSum(double* data, int64_t n,
                                            const std::vector<int>& group) override {
    return inner_->StartAllReduceSum(data, n, group);
  }
  absl::StatusOr<Request> StartReduceScatterSum(float* data, const std::vector<int64_t>& counts,
                                                const std::vector<int>& group) override {
    return inner_->StartReduceScatterSum(data, counts, group);
  }
  absl::StatusOr<Request> StartAllGather(float* data, const std::vector<int64_t>& counts,
                                         const std::vector<int>& group) override {
    absl::StatusOr<Request> r = inner_->StartAllGather(data, counts, group);
    if (r.ok()) {
      gathers_.insert(*r);
      log_.push_back(Event::kGatherStart);
    }
    return r;
  }

 private:
  pipeline::Transport* inner_;
  SimulatedClock* clock_;
  std::set<Request> gathers_;  // started, not yet waited for
  std::vector<Event> log_;
};

// An instruction that waited: its op, chunk, and whether it is its chunk's first forward.
struct Waited {
  pipeline::Op op;
  int chunk = 0;
  bool first_forward = false;
  double seconds = 0;  // to the microsecond
  bool operator==(const Waited&) const = default;
};

struct RankRun {
  std::vector<Event> log;
  std::vector<std::vector<Waited>> waits;  // per step
  std::vector<double> bubble_s;            // per step, this stage's (replica 0's)
  std::vector<int64_t> buckets;            // per chunk: its gathers, one a bucket
  std::vector<uint64_t> losses;
  std::vector<uint64_t> val_losses;  // `evaluate`: after every step
  std::vector<uint32_t> params;
};

std::vector<RankRun> TrainOverlap(const Config& config, int steps, bool evaluate = false) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto inner = pipeline::MakeInProcessWorld(world);
  std::vector<std::unique_ptr<SimulatedClock>> clocks;
  std::vector<std::unique_ptr<GatherLogTransport>> transports;
  for (int r = 0; r < world; ++r) {
    clocks.push_back(std::make_unique<SimulatedClock>());
    transports.push_back(std::make_unique<GatherLogTransport>(inner[r].get(), clocks[r].get()));
  }
  std::vector<RankRun> runs(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get(), clocks[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
      }
      RankRun& run = runs[r];
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        run.buckets.push_back((*trainer)->executor().buckets()->buckets(c).size());
      }
      for (int i = 0; i < steps; ++i) {
        // The step's instructions (the first step's end places its bubbles anew).
        const std::vector<pipeline::Instr> instrs = (*trainer)->executor().instructions();
        absl::StatusOr<StepStats> s = (*trainer)->Step();
        transports[r]->MarkStepEnd();
        if (!s.ok()) {
          failures[r] = std::string(s.status().message());
          return;
        }
        run.losses.push_back(std::bit_cast<uint64_t>(s->loss));
        if (evaluate) {
          absl::StatusOr<double> val = (*trainer)->Evaluate();
          if (!val.ok()) {
            failures[r] = std::string(val.status().message());
            return;
          }
          run.val_losses.push_back(std::bit_cast<uint64_t>(*val));
        }
        run.bubble_s.push_back(s->bubble_s[(*trainer)->layout().stage]);
        std::vector<Waited> waited;
        for (const pipeline::InstrTiming& t : (*trainer)->last_timeline()) {
          if (t.wait_end_s <= 0) continue;
          const pipeline::Instr& in = instrs[t.index];
          bool first = in.op == pipeline::Op::kForward;
          for (int j = 0; j < t.index && first; ++j) {
            first = !(instrs[j].op == pipeline::Op::kForward && instrs[j].chunk == in.chunk);
          }
          waited.push_back(
              {in.op, in.chunk, first, std::round((t.wait_end_s - t.start_s) * 1e6) / 1e6});
        }
        run.waits.push_back(std::move(waited));
      }
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        std::vector<float> p(chunk.num_params());
        EXPECT_TRUE(chunk.GetParams(p.data()).ok());
        for (float x : p) run.params.push_back(std::bit_cast<uint32_t>(x));
      }
      run.log = transports[r]->log();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  return runs;
}

// One step's gather events: the waits before its first start, its starts, the waits after.
struct StepGathers {
  int64_t waits_before = 0, starts = 0, waits_after = 0;
};

// The log cut where each step returned.
std::vector<StepGathers> PerStep(const std::vector<Event>& log) {
  std::vector<StepGathers> steps(1);
  for (Event e : log) {
    StepGathers& g = steps.back();
    if (e == Event::kStepEnd) {
      steps.emplace_back();
    } else if (e == Event::kGatherStart) {
      ++g.starts;
    } else {
      ++(g.starts > 0 ? g.waits_after : g.waits_before);
    }
  }
  steps.pop_back();  // after the last step's end: nothing
  return steps;
}

class ZeroOverlapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
  }
  static Config OverlapConfig(const std::string& schedule, bool overlap, int steps) {
    Config config = ParityConfig(ParityShard(), schedule, 2, 2, 4, 4);
    config.train.steps = steps;
    config.parallel.partition = "even";
    config.parallel.zero = 1;
    config.parallel.zero_overlap = overlap;
    config.parallel.dp_bucket_mb = 256 * 4.0 / (1 << 20);  // several buckets per chunk
    return config;
  }
};

// Step n's update starts its gathers; step n + 1 waits for each chunk's at the chunk's first
// forward (for interleaved 1F1B and ZB-V each of a stage's two chunks at its own), exactly the
// gather's time, and nowhere else; the run's end (its last step) waits for the last update's.
// The same bits as gathering at the step's end (parallel.zero_overlap = false).
TEST_F(ZeroOverlapTest, EachChunkWaitsForItsGatherAtItsFirstForward) {
  constexpr int kSteps = 4;
  for (const std::string schedule : {"1f1b", "interleaved", "zbv"}) {
    SCOPED_TRACE(schedule);
    const std::vector<RankRun> runs = TrainOverlap(OverlapConfig(schedule, true, kSteps), kSteps);
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(absl::StrFormat("rank %d", r));
      const RankRun& run = runs[r];
      std::vector<Waited> expected;
      double gathers_s = 0;
      for (int c = 0; c < static_cast<int>(run.buckets.size()); ++c) {
        expected.push_back({pipeline::Op::kForward, c, true, kGatherS * run.buckets[c]});
        gathers_s += kGatherS * run.buckets[c];
      }
      ASSERT_EQ(run.waits.size(), static_cast<size_t>(kSteps));
      EXPECT_THAT(run.waits[0], ::testing::IsEmpty());  // nothing gathered before step 1
      for (int step = 1; step < kSteps; ++step) {
        std::vector<Waited> got = run.waits[step];
        std::sort(got.begin(), got.end(),
                  [](const Waited& a, const Waited& b) { return a.chunk < b.chunk; });
        EXPECT_TRUE(got == expected) << "step " << step + 1 << ": " << got.size() << " waits";
        if (r < 2) {  // replica 0: the stage's bubble time is exactly the gathers' waits
          EXPECT_NEAR(run.bubble_s[step], gathers_s, 1e-9);
        }
      }
      // Each step's gathers start at its update and are waited for in the next step, before
      // that step's own start; the last step's at the run's end, after its update.
      const std::vector<StepGathers> steps = PerStep(run.log);
      ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
      for (int step = 0; step < kSteps; ++step) {
        SCOPED_TRACE(absl::StrFormat("step %d", step + 1));
        EXPECT_GT(steps[step].starts, 0);
        EXPECT_EQ(steps[step].waits_before, step == 0 ? 0 : steps[step - 1].starts);
        EXPECT_EQ(steps[step].waits_after, step + 1 == kSteps ? steps[step].starts : 0);
      }
    }
    // Gathering at the step's end instead: the same bits, no waits in the step's instructions,
    // every step's gathers waited for in that step after they start.
    const std::vector<RankRun> blocking =
        TrainOverlap(OverlapConfig(schedule, false, kSteps), kSteps);
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(absl::StrFormat("rank %d at the step's end", r));
      EXPECT_EQ(blocking[r].losses, runs[r].losses);
      EXPECT_TRUE(blocking[r].params == runs[r].params);
      for (const auto& waits : blocking[r].waits) EXPECT_THAT(waits, ::testing::IsEmpty());
      for (const StepGathers& g : PerStep(blocking[r].log)) {
        EXPECT_EQ(g.waits_before, 0);
        EXPECT_EQ(g.waits_after, g.starts);
      }
    }
  }
}

// Evaluation between steps, with the last update's gathers still in flight, sees the whole
// parameters (Evaluate finishes them), as with the gather waited for at the update's end; and
// the steps after it, whose forwards find nothing left to wait for, train the same bits.
TEST_F(ZeroOverlapTest, EvaluationBetweenStepsSeesTheWholeParameters) {
  constexpr int kSteps = 3;
  for (const std::string schedule : {"1f1b", "interleaved"}) {
    SCOPED_TRACE(schedule);
    Config overlapped = OverlapConfig(schedule, true, kSteps);
    overlapped.data.val = overlapped.data.train;
    overlapped.eval.batches = 1;
    Config blocking = overlapped;
    blocking.parallel.zero_overlap = false;
    const std::vector<RankRun> a = TrainOverlap(overlapped, kSteps, true);
    const std::vector<RankRun> b = TrainOverlap(blocking, kSteps, true);
    for (size_t r = 0; r < a.size(); ++r) {
      EXPECT_EQ(a[r].val_losses.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(a[r].val_losses, b[r].val_losses) << "rank " << r;
      EXPECT_EQ(a[r].losses, b[r].losses) << "rank " << r;
      EXPECT_TRUE(a[r].params == b[r].params) << "rank " << r;
    }
  }
}

// A post-validated step rolled back (clipped) where the next step did not run ahead (an
// evaluation comes first): its speculative gathers, still in flight, land before the rollback
// restores the backup, not after; then the redone step's gathers start. The bits of the
// barrier with the gather waited for at the update's end.
TEST_F(ZeroOverlapTest, ARollbackWithoutRunningAheadFinishesTheSpeculativeGather) {
  constexpr int kSteps = 4;
  Config blocking = OverlapConfig("zbh2", false, kSteps);
  blocking.data.val = blocking.data.train;
  blocking.eval.batches = 1;
  blocking.eval.every = 1;  // no step runs ahead: each is followed by an evaluation
  blocking.optim.grad_clip = 0.36;
  Config overlapped = blocking;
  overlapped.parallel.zero_overlap = true;
  overlapped.optim.step_sync = "post_validate";
  const std::vector<RankRun> a = TrainOverlap(overlapped, kSteps, true);
  const std::vector<RankRun> b = TrainOverlap(blocking, kSteps, true);
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].losses, b[r].losses) << "rank " << r;
    EXPECT_EQ(a[r].val_losses, b[r].val_losses) << "rank " << r;
    EXPECT_TRUE(a[r].params == b[r].params) << "rank " << r;
  }
}

}  // namespace
}  // namespace freeride
