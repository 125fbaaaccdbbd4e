// Runs that survive operators and bad luck: stop signals, a second run on one directory,
// batches too large for memory, non-finite steps, unwritable directories, resuming past the
// end, emulated runs' outputs, torn and duplicated metrics rows.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/stop_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/backend.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/run_dir.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// The "kind": "train" rows of a run's metrics, without their timing fields.
std::vector<std::string> TrainRows(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/metrics.jsonl");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<std::string> rows;
  for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n')) {
    if (!absl::StrContains(line, "\"kind\": \"train\"")) continue;
    rows.emplace_back(line.substr(0, line.find(", \"step_s\"")));
  }
  return rows;
}

absl::Status RunTrainer(const Config& config) {
  auto trainer = Trainer::Create(config);
  if (!trainer.ok()) return trainer.status();
  return (*trainer)->Run();
}

TEST(StopSignalTest, StopsAfterTheStepWithACheckpointAndResumesToTheSameLosses) {
  const std::string shard = WriteRandomShard("stop.bin", 4000, 64, 11);
  const std::string straight = Temp("stop_straight"), stopped = Temp("stop_stopped");
  std::filesystem::remove_all(straight);
  std::filesystem::remove_all(stopped);
  ASSERT_TRUE(RunTrainer(MustParse(TinyToml(shard, straight), {"data.shuffle=true"})).ok());

  ASSERT_TRUE(InstallStopHandlers());
  auto trainer = Trainer::Create(MustParse(TinyToml(shard, stopped), {"data.shuffle=true"}));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  MustStep(**trainer);  // step 1
  raise(SIGTERM);       // what Slurm or `kill` sends: recorded, nothing else happens yet
  absl::Status s = (*trainer)->Run();
  ClearStopRequest();
  ASSERT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("stopped by SIGTERM after step 2 of 6"));
  EXPECT_THAT(s.message(), HasSubstr("--set checkpoint.resume=latest"));
  EXPECT_TRUE(std::filesystem::exists(stopped + "/checkpoints/step_00000002/manifest.json"));

  ASSERT_TRUE(RunTrainer(MustParse(TinyToml(shard, stopped),
                                   {"data.shuffle=true", "checkpoint.resume=latest"}))
                  .ok());
  // Step 1 was stepped outside Run (no row); the rows Run wrote continue where it stopped.
  std::vector<std::string> expected = TrainRows(straight);
  expected.erase(expected.begin());
  EXPECT_EQ(TrainRows(stopped), expected);
}

// The report of a stopped and resumed run is of the whole run: each part's side-task record
// stays, saying the steps it covers (the resume's used to replace the stopped part's).
TEST(StopSignalTest, AResumeKeepsTheSideTaskRecordsOfThePartsBeforeIt) {
  const std::string shard = WriteRandomShard("stop_side.bin", 4000, 64, 11);
  const std::string dir = Temp("stop_side_tasks");
  std::filesystem::remove_all(dir);
  const std::string toml =
      TinyToml(shard, dir) + "[freeride]\nenabled = true\n[[side_tasks]]\ntype = \"spin\"\n";
  ASSERT_TRUE(InstallStopHandlers());
  {
    auto trainer = Trainer::Create(MustParse(toml));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    MustStep(**trainer);
    raise(SIGTERM);
    absl::Status s = (*trainer)->Run();
    ClearStopRequest();
    ASSERT_TRUE(absl::IsCancelled(s)) << s;
  }
  ASSERT_TRUE(RunTrainer(MustParse(toml, {"checkpoint.resume=latest"})).ok());
  absl::StatusOr<std::string> text = ReadFile(dir + "/side_tasks_rank000.jsonl");
  ASSERT_TRUE(text.ok()) << text.status();
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << *text;
  EXPECT_THAT(lines[0], HasSubstr("\"step\": 2, \"from_step\": 0,"));
  EXPECT_THAT(lines[1], HasSubstr("\"step\": 6, \"from_step\": 2,"));
}

// A study writes no checkpoint: the first signal's notice must not promise one.
TEST(StopSignalTest, TheFirstSignalPrintsTheNoticeTheCommandSet) {
  ASSERT_TRUE(InstallStopHandlers());
  SetStopNotice("freeride: stop requested; the study stops at the next step boundary\n");
  ::testing::internal::CaptureStderr();
  raise(SIGTERM);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ClearStopRequest();
  SetStopNotice(
      "freeride: stop requested; stopping at the next step boundary with a checkpoint (send "
      "the signal again to exit at once)\n");
  EXPECT_EQ(printed, "freeride: stop requested; the study stops at the next step boundary\n");
}

TEST(RunLockTest, ASecondRunOnTheSameDirectoryIsRefusedWithTheHolder) {
  Config config = MustParse("[data]\ntrain = \"t.bin\"\n");
  config.run.dir = Temp("locked_run");
  absl::StatusOr<DirectoryLock> first = PrepareRunDir(config);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<DirectoryLock> second = PrepareRunDir(config);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("is in use by another run"));
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", getpid())));
  first = absl::UnknownError("released");  // the lock goes with its holder
  EXPECT_TRUE(PrepareRunDir(config).ok());
}

TEST(HostMemoryTest, ThePlanIsWhatTheStageAllocates) {
  const GPT2Config model = *MakeGPT2Config(4, 2, 32, 16, 100);
  for (int stages : {1, 2, 4}) {
    auto specs = SplitIntoStages(model, stages, {});
    ASSERT_TRUE(specs.ok());
    for (const StageSpec& spec : *specs) {
      GPT2Stage<float> stage(model, spec, 3, 16, 2);
      EXPECT_EQ(TotalBytes(PlanGPT2StageMemory(model, spec, 3, 16, 2, sizeof(float))),
                stage.HostBytes())
          << "stage layers " << spec.first_layer << ".." << spec.last_layer;
    }
  }
}

TEST(HostMemoryTest, APlanTooLargeIsRefusedNamingItsLargestBuffers) {
  const std::vector<HostBuffer> plan = {{"small", 10}, {"activations", 3000}, {"logits", 900}};
  absl::Status s = CheckHostMemoryPlan(plan, {4000, "MemAvailable in /proc/meminfo"}, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("plans 3.8 KiB of host memory but 2.0 KiB is available"));
  EXPECT_THAT(s.message(), HasSubstr("shared by 2 ranks on this node"));
  EXPECT_THAT(s.message(), HasSubstr("largest: activations 2.9 KiB, logits 900 B, small 10 B"));
  EXPECT_TRUE(CheckHostMemoryPlan(plan, {8000, "x"}, 2).ok());
}

TEST(HostMemoryTest, ABatchTooLargeForTheMachineFailsBeforeAllocating) {
  const std::string shard = WriteRandomShard("huge.bin", 4000, 64, 12);
  auto trainer = Trainer::Create(MustParse(TinyToml(shard, Temp("huge")),
                                           {"train.batch_size=4194304", "train.microbatches=1"}));
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(trainer.status().message(), HasSubstr("of host memory but"));
  EXPECT_THAT(trainer.status().message(), HasSubstr("largest: layer activations"));
  EXPECT_THAT(trainer.status().message(), HasSubstr("lower train.batch_size"));
}

TEST(HostMemoryTest, AFailedAllocationBecomesAnErrorWithTheSize) {
  std::ifstream policy("/proc/sys/vm/overcommit_memory");
  int mode = 1;
  policy >> mode;
  if (mode == 1) GTEST_SKIP() << "overcommit_memory = 1: a huge allocation would succeed";
  const GPT2Config model = *MakeGPT2Config(1, 2, 32, 1 << 20, 64);
  auto chunk = MakeStageModel({}, model, WholeModel(model), int64_t{1} << 16, 1 << 20, 1);
  ASSERT_FALSE(chunk.ok());
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(chunk.status().message(), HasSubstr("out of host memory allocating"));
  EXPECT_THAT(chunk.status().message(), HasSubstr("GiB"));
}

TEST(NonFiniteTest, ADivergingStepIsNotAppliedAndMetricsStayJson) {
  const std::string shard = WriteRandomShard("diverge.bin", 4000, 64, 13);
  const std::string dir = Temp("diverge");
  std::filesystem::remove_all(dir);
  const std::vector<std::string> sets = {"optim.lr=1e6", "optim.grad_clip=0", "train.steps=20",
                                         "optim.warmup_steps=0"};
  auto trainer = Trainer::Create(MustParse(TinyToml(shard, dir), sets));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  // Step until a non-finite one: the model after it is the model before it.
  std::vector<float> before, after;
  StepStats s;
  for (int i = 0; i < 20; ++i) {
    before.resize((*trainer)->model().num_params());
    ASSERT_TRUE((*trainer)->model().GetParams(before.data()).ok());
    s = MustStep(**trainer);
    if (!s.applied) break;
  }
  ASSERT_FALSE(s.applied) << "lr = 1e6 never diverged";
  after.resize(before.size());
  ASSERT_TRUE((*trainer)->model().GetParams(after.data()).ok());
  EXPECT_EQ(before, after);

  // Run: "stop" ends at the first such step, the row says so in valid JSON.
  std::filesystem::remove_all(dir);
  absl::Status stop = RunTrainer(MustParse(TinyToml(shard, dir), sets));
  ASSERT_FALSE(stop.ok());
  EXPECT_THAT(stop.message(), HasSubstr("not finite, so the update was not applied"));
  absl::StatusOr<std::string> metrics = ReadFile(dir + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(*metrics, HasSubstr("\"nonfinite\": true, \"applied\": false"));
  EXPECT_THAT(*metrics, ::testing::Not(HasSubstr("nan")));
  EXPECT_THAT(*metrics, ::testing::Not(HasSubstr("inf")));

  // "skip" goes on, up to max_nonfinite_skips in a row.
  std::filesystem::remove_all(dir);
  std::vector<std::string> skip = sets;
  skip.insert(skip.end(), {"optim.on_nonfinite=skip", "optim.max_nonfinite_skips=3"});
  absl::Status skipped = RunTrainer(MustParse(TinyToml(shard, dir), skip));
  ASSERT_FALSE(skipped.ok());
  EXPECT_THAT(skipped.message(), HasSubstr("3 in a row"));
  metrics = ReadFile(dir + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok());
  size_t nonfinite = 0;
  for (size_t at = 0; (at = metrics->find("\"nonfinite\": true", at)) != std::string::npos; ++at) {
    ++nonfinite;
  }
  EXPECT_EQ(nonfinite, 3u);
}

TEST(WritablePathsTest, AnUnwritableCheckpointDirectoryIsFoundAtStart) {
  const std::string shard = WriteRandomShard("unwritable.bin", 4000, 64, 14);
  const std::string file = Temp("a_plain_file");
  ASSERT_TRUE(WriteFileAtomically(file, "not a directory").ok());
  auto trainer = Trainer::Create(
      MustParse(TinyToml(shard, Temp("unwritable")), {"checkpoint.dir=\"" + file + "/ckpt\""}));
  ASSERT_FALSE(trainer.ok());
  EXPECT_THAT(trainer.status().message(), HasSubstr("checkpoint.dir = \"" + file + "/ckpt\""));
  EXPECT_THAT(trainer.status().message(), HasSubstr("cannot be written"));
}

TEST(ResumeTest, PastTheLastStepIsAnErrorAndAtItNothingToDo) {
  const std::string shard = WriteRandomShard("past.bin", 4000, 64, 15);
  const std::string dir = Temp("past");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(RunTrainer(MustParse(TinyToml(shard, dir), {"train.steps=4"})).ok());
  absl::Status past = RunTrainer(
      MustParse(TinyToml(shard, dir), {"train.steps=2", "checkpoint.resume=latest"}));
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(past.message(), HasSubstr("at step 4, past train.steps = 2"));
  const auto written = std::filesystem::last_write_time(dir + "/checkpoints/latest");
  EXPECT_TRUE(RunTrainer(MustParse(TinyToml(shard, dir),
                                   {"train.steps=4", "checkpoint.resume=latest"}))
                  .ok());
  EXPECT_EQ(std::filesystem::last_write_time(dir + "/checkpoints/latest"), written);
}

TEST(ResumeTest, RowsAfterTheCheckpointAreNotDuplicated) {
  const std::string shard = WriteRandomShard("dups.bin", 4000, 64, 16);
  const std::string dir = Temp("dups");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(RunTrainer(MustParse(TinyToml(shard, dir), {"checkpoint.every=3"})).ok());
  const std::vector<std::string> expected = TrainRows(dir);
  ASSERT_EQ(expected.size(), 6u);
  // A run killed after step 6 with its checkpoint at 3, and a row torn by the kill.
  {
    std::ofstream torn(dir + "/metrics.jsonl", std::ios::app);
    torn << "{\"kind\": \"train\", \"st";
  }
  std::filesystem::remove_all(dir + "/checkpoints/step_00000006");
  ASSERT_TRUE(WriteFileAtomically(dir + "/checkpoints/latest", "step_00000003\n").ok());
  ASSERT_TRUE(RunTrainer(MustParse(TinyToml(shard, dir),
                                   {"checkpoint.every=3", "checkpoint.resume=latest"}))
                  .ok());
  EXPECT_EQ(TrainRows(dir), expected);
  absl::StatusOr<std::string> metrics = ReadFile(dir + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(*metrics, ::testing::Not(HasSubstr("\"st\n")));
}

}  // namespace
}  // namespace freeride
