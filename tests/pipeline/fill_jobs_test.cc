// Fill jobs in a training on simulated time (stage 0 real, its peer emulated): jobs submitted
// between steps are placed at the next step boundaries, run, end as they should (one that fits
// finishes, one that fits no bubble is refused with its numbers, one that fails is FAILED, one
// cancelled is CANCELLED), the training's losses stay those of a run without jobs, what the
// training had not finished when it ended is queued again for the next run in its directory,
// and a job's memory is held to what the stage's memory plan leaves to side work.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/host_memory.h"
#include "gmock/gmock.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/jobs/job_store.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// Fails its step after `after` good ones (the training must not notice).
class FailsAfterTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    absl::StatusOr<int64_t> after = args.Int("after", 0, 0, 1000);
    if (!after.ok()) return after.status();
    after_ = *after;
    return absl::OkStatus();
  }
  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    ClockOr(ctx.clock).Busy(1e-5);
    if (++steps_ > after_) return absl::DataLossError("failed on purpose");
    return 1.0;
  }

 private:
  int64_t after_ = 0, steps_ = 0;
};
FREERIDE_REGISTER_SIDE_TASK(FailsAfterTask, "test_fails_after");

Config JobsConfig(const std::string& dir) {
  Config config = testing::EmulatedHarvestConfig(dir);
  config.side_tasks.clear();
  std::filesystem::remove_all(config.run.dir);
  std::filesystem::create_directories(config.run.dir);
  return config;
}

int64_t Submit(const Config& config, const std::string& name, const std::string& type,
               const std::string& args) {
  JobSubmission job;
  job.toml = absl::StrCat("[[side_tasks]]\ntype = \"", type, "\"\n[side_tasks.args]\n", args);
  job.name = name;
  job.type = type;
  absl::StatusOr<int64_t> id = SubmitJob(config.run.dir, job, 0);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : -1;
}

Job Find(const Config& config, int64_t id) {
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(config.run.dir);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  for (const Job& job : *jobs) {
    if (job.id == id) return job;
  }
  ADD_FAILURE() << "no job " << id;
  return Job{};
}

std::vector<double> Losses(Trainer& trainer, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<StepStats> s = trainer.Step();
    EXPECT_TRUE(s.ok()) << s.status();
    losses.push_back(s.ok() ? s->loss : NAN);
  }
  return losses;
}

TEST(FillJobsTest, JobsSubmittedMidRunEndAsTheyShouldAndTrainingIsUntouched) {
  const Config config = JobsConfig("fill_jobs");
  Config plain = JobsConfig("fill_jobs_plain");
  plain.freeride.jobs = false;
  SimulatedClock clock, plain_clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto reference = Trainer::Create(plain, nullptr, &plain_clock);
  ASSERT_TRUE(reference.ok()) << reference.status();

  std::vector<double> losses = Losses(**trainer, 2);
  const int64_t fits = Submit(config, "fits", "spin", "step_ms = 0.01\nsteps = 40\n");
  const int64_t nowhere = Submit(config, "nowhere", "spin", "step_ms = 1000\nsteps = 3\n");
  const int64_t fails = Submit(config, "fails", "test_fails_after", "after = 4\n");
  const int64_t endless = Submit(config, "endless", "spin", "step_ms = 0.01\n");
  // One job is offered at each step boundary: four steps place them all.
  for (double loss : Losses(**trainer, 4)) losses.push_back(loss);
  EXPECT_EQ(Find(config, nowhere).state, JobState::kRefused);
  EXPECT_THAT(Find(config, nowhere).reason,
              HasSubstr("needs 1000.00 ms steps; the longest bubble on stage 0 is "));
  EXPECT_NE(Find(config, endless).state, JobState::kPending);
  ASSERT_TRUE(RequestCancel(config.run.dir, endless).ok());
  for (double loss : Losses(**trainer, 10)) losses.push_back(loss);

  const Job fitted = Find(config, fits);
  EXPECT_EQ(fitted.state, JobState::kFinished) << fitted.reason;
  EXPECT_EQ(fitted.stages, (std::vector<int>{0}));
  // Its whole count: the calibration's steps (run before its first bubble) are its work too
  // (a `count = 500` job used to end "FINISHED 497 images").
  EXPECT_EQ(fitted.progress.steps, 40);
  EXPECT_EQ(fitted.progress.units, 40);
  EXPECT_EQ(fitted.progress.total_units, 40);  // the task said its total
  EXPECT_EQ(fitted.progress.unit, "spins");
  EXPECT_GT(fitted.progress.bubble_s, 0);
  EXPECT_TRUE(std::filesystem::exists(JobDir(config.run.dir, fits) + "/status.json"));
  const Job failed = Find(config, fails);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_THAT(failed.reason, HasSubstr("stage 0 (rank 0): failed on purpose"));
  EXPECT_EQ(Find(config, endless).state, JobState::kCancelled);
  EXPECT_EQ(losses, Losses(**reference, static_cast<int>(losses.size())));
}

TEST(FillJobsTest, WhatTheTrainingDidNotFinishIsQueuedAgainForTheNextRun) {
  Config config = JobsConfig("fill_jobs_requeue");
  config.train.steps = 5;
  const int64_t endless = Submit(config, "endless", "spin", "step_ms = 0.01\n");
  const int64_t waiting = Submit(config, "waiting", "spin", "step_ms = 0.01\nsteps = 5\n");
  SimulatedClock clock;
  {
    auto trainer = Trainer::Create(config, nullptr, &clock);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
  }
  // The endless job ran and is queued again; the other, offered after it, finished.
  const Job requeued = Find(config, endless);
  EXPECT_EQ(requeued.state, JobState::kPending);
  EXPECT_THAT(requeued.reason, HasSubstr("the training ended at step 5 first"));
  EXPECT_GT(requeued.progress.steps, 0);
  EXPECT_EQ(Find(config, waiting).state, JobState::kFinished);

  // A run killed with its job RUNNING leaves no end record: the next one queues it again too.
  auto next = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(next.ok()) << next.status();
  Losses(**next, 3);
  EXPECT_EQ(Find(config, endless).state, JobState::kRunning);
  next->reset();  // killed: no Finish
  auto after_kill = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(after_kill.ok()) << after_kill.status();
  EXPECT_EQ(Find(config, endless).state, JobState::kPending);
  EXPECT_THAT(Find(config, endless).reason, HasSubstr("stopped before it ended"));
}

// Memory for side work is the plan's room (runtime.memory_fraction of the device's memory,
// stated here rather than read from the machine, less training's planned peak): a job that
// does not fit the room a run keeping every activation leaves is refused, naming the figures,
// and placed in the same run with full recomputation, whose plan leaves more.
TEST(FillJobsTest, AJobRefusedForMemoryWithoutRecomputationIsPlacedWithIt) {
  Config none = JobsConfig("fill_jobs_memory_none");
  none.runtime.device_memory_mb = 1024;
  Config full = JobsConfig("fill_jobs_memory_full");
  full.runtime.device_memory_mb = 1024;
  full.model.recompute = "full";
  SimulatedClock none_clock, full_clock;
  auto kept = Trainer::Create(none, nullptr, &none_clock);
  ASSERT_TRUE(kept.ok()) << kept.status();
  auto recomputed = Trainer::Create(full, nullptr, &full_clock);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  const RankMemoryPlan& plan_none = (*kept)->memory_plans()[0];
  const RankMemoryPlan& plan_full = (*recomputed)->memory_plans()[0];
  EXPECT_EQ(plan_none.device_bytes, int64_t{1} << 30);
  ASSERT_GT(plan_full.side_bytes, plan_none.side_bytes);
  const int64_t need = (plan_none.side_bytes + plan_full.side_bytes) / 2;

  JobSubmission job;
  job.toml = absl::StrCat("[[side_tasks]]\ntype = \"spin\"\nstages = [0]\nmemory_limit = ", need,
                          "\n[side_tasks.args]\nstep_ms = 0.01\nsteps = 5\n");
  job.name = "sized";
  job.type = "spin";
  absl::StatusOr<int64_t> refused = SubmitJob(none.run.dir, job, 0);
  ASSERT_TRUE(refused.ok()) << refused.status();
  absl::StatusOr<int64_t> placed = SubmitJob(full.run.dir, job, 0);
  ASSERT_TRUE(placed.ok()) << placed.status();
  // Offered after step 2, placed (or refused) then, run and ended in the steps after.
  Losses(**kept, 6);
  Losses(**recomputed, 6);
  const Job without = Find(none, *refused);
  EXPECT_EQ(without.state, JobState::kRefused);
  EXPECT_EQ(without.reason,
            absl::StrFormat("needs %s; stage 0 has %s for side work (runtime.memory_fraction 0.90 "
                            "× 1.00 GiB − training's planned peak %s)",
                            FormatBytes(need), FormatBytes(plan_none.side_bytes),
                            FormatBytes(plan_none.peak_bytes)));
  const Job with = Find(full, *placed);
  EXPECT_EQ(with.state, JobState::kFinished) << with.reason;
  EXPECT_EQ(with.stages, (std::vector<int>{0}));
}

}  // namespace
}  // namespace freeride
