// Fill jobs without a training: the run directory's queue (ids, records, cancellations), the
// placement policies, the fit of a job to a stage with the numbers of a refusal, and a job's
// file checked as a config's task is.
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/config/config.h"
#include "trainer/jobs/job_placement.h"
#include "trainer/jobs/job_policy.h"
#include "trainer/jobs/job_store.h"
#include "trainer/report/report.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

JobSubmission Spin(const std::string& name) {
  JobSubmission job;
  job.toml = "[[side_tasks]]\ntype = \"spin\"\n";
  job.name = name;
  job.type = "spin";
  return job;
}

TEST(JobStoreTest, SubmissionsAtOnceEachGetTheirOwnIdAndAWholeJob) {
  const std::string dir = FreshDir("jobs_concurrent");
  constexpr int kThreads = 4, kEach = 6;
  std::vector<std::vector<int64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<int64_t> id = SubmitJob(dir, Spin(absl::StrCat("t", t)), 100.0 + i);
        ASSERT_TRUE(id.ok()) << id.status();
        ids[t].push_back(*id);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& list : ids) all.insert(list.begin(), list.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kEach);
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(dir);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), all.size());
  for (const Job& job : *jobs) {
    EXPECT_EQ(job.state, JobState::kPending);
    EXPECT_EQ(job.type, "spin");
    EXPECT_TRUE(ReadJobToml(dir, job.id).ok());
  }
  // Nothing half-made is left beside the jobs.
  for (const auto& e : std::filesystem::directory_iterator(dir + "/jobs")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
}

TEST(JobStoreTest, RecordsFoldIntoTheLastStateWhateverTheyInterleaveWith) {
  const std::string dir = FreshDir("jobs_fold");
  absl::StatusOr<int64_t> id = SubmitJob(dir, Spin("a"), 10);
  ASSERT_TRUE(id.ok());
  JobRecord placed{*id, JobState::kPlaced, 11, 3, {0, 1}, "fits", JobProgress{}};
  ASSERT_TRUE(AppendJobRecord(dir, placed).ok());
  JobProgress done;
  done.steps = 40;
  done.units = 40;
  done.unit = "spins";
  done.bubble_s = 0.5;
  ASSERT_TRUE(AppendJobRecord(dir, {*id, JobState::kRunning, 12, 4, {0, 1}, "", done}).ok());
  // The submitter's own record can land after the leader's (it appends after the rename that
  // makes the job visible): it does not take the job back.
  ASSERT_TRUE(AppendJobRecord(dir, {*id, JobState::kPending, 12.5, -1, {}, "submitted", {}}).ok());
  // A line cut short by a kill is left out.
  {
    std::ofstream log(dir + "/jobs.jsonl", std::ios::app);
    log << "{\"id\": " << *id << ", \"state\": \"FAI";
  }
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(dir);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const Job& job = jobs->front();
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.stages, (std::vector<int>{0, 1}));
  EXPECT_EQ(job.step, 4);
  EXPECT_EQ(job.progress.steps, 40);
  EXPECT_EQ(job.progress.unit, "spins");
  EXPECT_FALSE(job.cancel_requested);
  ASSERT_TRUE(RequestCancel(dir, *id).ok());
  EXPECT_TRUE(LoadJobs(dir)->front().cancel_requested);
}

TEST(JobStoreTest, AStatusFileCarriesTheJobAndItsInstances) {
  const std::string dir = FreshDir("jobs_status");
  absl::StatusOr<int64_t> id = SubmitJob(dir, Spin("s"), 10);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WriteJobInstance(dir, *id, 1, {{"rank", 1}, {"state", "FAILED"}}).ok());
  Job job = LoadJobs(dir)->front();
  job.state = JobState::kFailed;
  job.reason = "stage 1 (rank 1): boom";
  ASSERT_TRUE(WriteJobStatus(dir, job).ok());
  absl::StatusOr<std::string> text = ReadFile(JobDir(dir, *id) + "/status.json");
  ASSERT_TRUE(text.ok());
  const nlohmann::json status = nlohmann::json::parse(*text);
  EXPECT_EQ(status["state"], "FAILED");
  EXPECT_EQ(status["reason"], "stage 1 (rank 1): boom");
  ASSERT_EQ(status["instances"].size(), 1u);
  EXPECT_EQ(status["instances"][0]["rank"], 1);
}

Job Queued(int64_t id, int64_t priority, double work_s, double submitted_s) {
  Job job;
  job.id = id;
  job.priority = priority;
  job.work_s = work_s;
  job.submitted_s = submitted_s;
  return job;
}

// 487 of 500 images done and "~1.5 min left" from a --work guess: once the task says its
// total, the time left is the units left at the measured rate.
TEST(JobStoreTest, TheTimeLeftIsTheUnitsLeftAtTheMeasuredRate) {
  JobProgress p;
  p.units = 487;
  p.alone_s = 48.7;
  p.total_units = 500;
  // 10 images a second over the last 10 s, and a --work guess of 150 s alone.
  const std::vector<ProgressPoint> window = {{100, 387, 38.7}, {110, 487, 48.7}};
  EXPECT_DOUBLE_EQ(EstimateTimeLeft(window, p, 150), 1.3);
  // Without a total, the guess is all there is: its seconds left at the alone-seconds' rate.
  p.total_units = 0;
  EXPECT_DOUBLE_EQ(EstimateTimeLeft(window, p, 150), (150 - 48.7) / 1.0);
  EXPECT_LT(EstimateTimeLeft(window, p, 0), 0);             // neither: unknown
  EXPECT_LT(EstimateTimeLeft({window.back()}, p, 150), 0);  // no rate yet
  p.total_units = 500;
  p.units = 510;  // past its total (a repeat's next pass): nothing left, never negative
  EXPECT_DOUBLE_EQ(EstimateTimeLeft({{100, 500, 50}, {110, 510, 51}}, p, 0), 0);
}

TEST(JobPolicyTest, EachPolicyOrdersAsDocumented) {
  const std::vector<Job> pending = {Queued(1, 0, 30, 100), Queued(2, 5, 0, 101),
                                    Queued(3, 5, 10, 102), Queued(4, 1, 5, 103)};
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kFifo, 110, 600),
            (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kPriority, 110, 600),
            (std::vector<int64_t>{2, 3, 4, 1}));
  // Known work, least first; unknown (job 2) last.
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kShortestFirst, 110, 600),
            (std::vector<int64_t>{4, 3, 1, 2}));
}

TEST(JobPolicyTest, ShortestFirstPlacesAJobPastTheAgeLimitFirst) {
  // Job 1 is long and old: once older than the limit it goes before every shorter one, and
  // among such jobs the oldest first.
  std::vector<Job> pending = {Queued(1, 0, 1000, 0), Queued(2, 0, 1, 50), Queued(3, 0, 2, 55)};
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kShortestFirst, 59, 60).front(), 2);
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kShortestFirst, 61, 60).front(), 1);
  EXPECT_EQ(PlacementOrder(pending, JobPolicy::kShortestFirst, 200, 60),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_FALSE(ParseJobPolicy("lifo").ok());
}

StageRoom Room(int stage, int64_t free_bytes, double longest_bubble_s, double step_s) {
  StageRoom room;
  room.stage = stage;
  room.took_part = true;
  room.allowed = true;
  room.free_bytes = free_bytes;
  room.longest_bubble_s = longest_bubble_s;
  room.calibrated = true;
  room.step_s = step_s;
  return room;
}

TEST(JobPlacementTest, AMisfitSaysWhatTheJobNeedsAndWhatTheStageHas) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(Misfit(gib, Room(0, 2 * gib, 4e-3, 1e-3), 0.1), "");
  EXPECT_EQ(Misfit(2 * gib, Room(0, gib * 6 / 10, 4e-3, 1e-3), 0.1),
            "needs 2.00 GiB; stage 0 has 614.4 MiB free");
  EXPECT_EQ(Misfit(0, Room(1, gib, 1.1e-3, 3.2e-3), 0.1),
            "needs 3.20 ms steps; the longest bubble on stage 1 is 1.10 ms (0.99 ms of it offered "
            "to side work, freeride.margin = 0.1)");
  // The margin decides at the edge: 1 ms steps in a 1.05 ms bubble do not fit a 10% margin.
  EXPECT_NE(StepMisfit(Room(0, gib, 1.05e-3, 1e-3), 0.1), "");
  EXPECT_EQ(StepMisfit(Room(0, gib, 1.05e-3, 1e-3), 0.0), "");
  StageRoom command = Room(0, gib, 1e-4, 0);
  command.fills_bubble = true;
  EXPECT_THAT(StepMisfit(command, 0.1), HasSubstr("runs until a bubble's end"));
  command.longest_bubble_s = 1e-3;
  EXPECT_EQ(StepMisfit(command, 0.1), "");
  EXPECT_EQ(StepMisfit(Room(2, gib, 0, 1e-3), 0.1), "stage 2 has no bubble to run in");
}

// With a memory plan (trainer/rank_memory.h) the room is runtime.memory_fraction of the
// device's memory less training's planned peak and the side work held already: a misfit names
// each figure, and says so when the memory free now is what falls short.
TEST(JobPlacementTest, AMemoryMisfitNamesThePlansFigures) {
  const int64_t mib = int64_t{1} << 20;
  StageRoom room = Room(1, 0, 4e-3, 1e-3);
  room.device_bytes = 1024 * mib;
  room.fraction = 0.5;
  room.planned_peak_bytes = 400 * mib;
  room.held_bytes = 16 * mib;
  EXPECT_EQ(PlannedSideBytes(room), 96 * mib);
  room.free_bytes = PlannedSideBytes(room);
  EXPECT_EQ(MemoryMisfit(96 * mib, room), "");
  EXPECT_EQ(MemoryMisfit(100 * mib, room),
            "needs 100.0 MiB; stage 1 has 96.0 MiB for side work (runtime.memory_fraction 0.50 × "
            "1.00 GiB − training's planned peak 400.0 MiB − 16.0 MiB its side work holds)");
  room.free_bytes = 64 * mib;  // the host has less free now than the plan leaves
  EXPECT_EQ(MemoryMisfit(80 * mib, room),
            "needs 80.0 MiB; stage 1 has 64.0 MiB free now (its plan leaves 96.0 MiB for side "
            "work: runtime.memory_fraction 0.50 × 1.00 GiB − training's planned peak 400.0 MiB − "
            "16.0 MiB its side work holds)");
  room.planned_peak_bytes = 600 * mib;  // training alone takes more than the fraction
  EXPECT_EQ(PlannedSideBytes(room), 0);
}

TEST(JobPlacementTest, ARefusalNamesEveryStageItMayRunOn) {
  std::vector<StageRoom> rooms = {Room(0, 1 << 20, 5e-3, 8e-3), Room(1, 1 << 30, 1e-3, 8e-3),
                                  Room(2, 1 << 30, 9e-3, 8e-3)};
  rooms[2].allowed = false;  // not in the job's stages: not mentioned
  const std::string reason = RefusalReason(64 << 20, rooms, 0.1);
  EXPECT_EQ(reason,
            "needs 64.0 MiB; stage 0 has 1.0 MiB free; needs 8.00 ms steps; the longest bubble "
            "on stage 1 is 1.00 ms (0.90 ms of it offered to side work, freeride.margin = 0.1)");
  rooms[1].took_part = false;
  EXPECT_THAT(RefusalReason(64 << 20, rooms, 0.1), HasSubstr("stage 1 has no rank here"));
}

Config TwoStageRun() {
  Config run;
  run.parallel.pp = 2;
  return run;
}

TEST(JobFileTest, OneSideTaskTableIsAJob) {
  absl::StatusOr<SideTaskConfig> task = ParseSideTaskFile(
      "[[side_tasks]]\ntype = \"spin\"\nstages = [1]\npriority = 2\nmemory_limit = \"1MiB\"\n"
      "[side_tasks.args]\nstep_ms = 0.5\n",
      "job.toml", TwoStageRun());
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->name, "spin");
  EXPECT_EQ(task->stages, (std::vector<int64_t>{1}));
  EXPECT_EQ(task->priority, 2);
  EXPECT_EQ(task->memory_limit_bytes, 1 << 20);
  EXPECT_EQ(task->isolation, "inprocess");
  EXPECT_EQ(task->origins.at("args.step_ms"), "job.toml:7:11");
}

TEST(JobFileTest, AnythingElseIsRefusedWithWhereItIs) {
  auto error = [](const std::string& text) {
    absl::StatusOr<SideTaskConfig> task = ParseSideTaskFile(text, "job.toml", TwoStageRun());
    return task.ok() ? std::string("accepted") : std::string(task.status().message());
  };
  EXPECT_THAT(error("[[side_tasks]]\ntype = \"spin\"\n[[side_tasks]]\ntype = \"spin\"\n"),
              HasSubstr("expected one [[side_tasks]] table and nothing else, found 2"));
  EXPECT_THAT(error("[train]\nsteps = 3\n[[side_tasks]]\ntype = \"spin\"\n"),
              HasSubstr("found 1 [[side_tasks]] table(s) and [train] (a job file holds the task "
                        "alone"));
  EXPECT_THAT(error("steps = 3\n[[side_tasks]]\ntype = \"spin\"\n[[x]]\n"),
              HasSubstr("and the key steps, [[x]]"));
  EXPECT_THAT(error("type = \"spin\"\n"), HasSubstr("found 0 [[side_tasks]] table(s)"));
  EXPECT_THAT(
      error("[[side_tasks]]\ntype = \"spin\"\nstagse = [0]\n"),
      HasSubstr("job.toml:3:10: side_tasks[0].stagse: unknown key (did you mean 'stages'?)"));
  EXPECT_THAT(error("[[side_tasks]]\ntype = \"spin\"\nstages = [2]\n"),
              HasSubstr("side_tasks[0].stages: expected stage numbers below parallel.pp (2)"));
  EXPECT_THAT(error("[[side_tasks]\n"), HasSubstr("job.toml:1:"));
}

TEST(JobsReportTest, TheReportTablesTheJobsAndPlotsTheirBubbleTime) {
  const std::string dir = FreshDir("jobs_report");
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.toml", "[data]\ntrain = \"x.bin\"\n").ok());
  absl::StatusOr<int64_t> id = SubmitJob(dir, Spin("resize<1>"), 10);
  ASSERT_TRUE(id.ok());
  JobProgress p;
  for (int step = 3; step <= 5; ++step) {
    p.steps = 10 * step;
    p.bubble_s = 0.01 * step;
    ASSERT_TRUE(AppendJobProgress(dir, *id, step, p).ok());
  }
  ASSERT_TRUE(AppendJobRecord(dir, {*id, JobState::kFinished, 20, 5, {1}, "", p}).ok());
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->jobs.size(), 1u);
  EXPECT_EQ(run->job_progress.at(*id).size(), 3u);
  const std::string html = RenderReport(*run);
  EXPECT_THAT(html, HasSubstr("<h2>Fill jobs</h2>"));
  EXPECT_THAT(html, HasSubstr("resize&lt;1&gt;"));
  EXPECT_THAT(html, HasSubstr("FINISHED"));
  EXPECT_THAT(html, HasSubstr("data-points=\"3\""));
}

}  // namespace
}  // namespace freeride
