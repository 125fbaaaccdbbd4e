// `freeride submit`, `jobs` and `cancel` on a run directory with no training in it (the
// training's side is tests/pipeline/fill_jobs_test.cc and tests/scripts/fill_jobs.sh).
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/run_lock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"
#include "trainer/config/config.h"
#include "trainer/jobs/job_store.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// A run directory as `freeride train` leaves it: its effective config.
std::string RunDir(const std::string& name) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::StatusOr<Config> config = ParseConfig(
      "[data]\ntrain = \"x.bin\"\n[parallel]\npp = 2\n[freeride]\nenabled = true\n", "run.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(WriteFileAtomically(dir + "/config.toml", ConfigToToml(*config)).ok());
  return dir;
}

std::string JobFile(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  EXPECT_TRUE(WriteFileAtomically(path, text).ok());
  return path;
}

TEST(JobsCliTest, SubmitQueuesAJobAndPrintsItsId) {
  const std::string run = RunDir("cli_submit");
  const std::string job =
      JobFile("spin_job.toml", "[[side_tasks]]\ntype = \"spin\"\n[side_tasks.args]\nsteps = 5\n");
  CliResult first =
      RunCommand({"submit", run, job, "--name", "warm", "--priority", "3", "--work", "12.5"});
  ASSERT_EQ(first.status, kExitOk) << first.err;
  EXPECT_EQ(first.out, "1\n");
  EXPECT_EQ(RunCommand({"submit", run, job}).out, "2\n");
  CliResult table = RunCommand({"jobs", run});
  ASSERT_EQ(table.status, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("warm"));
  EXPECT_THAT(table.out, HasSubstr("PENDING"));
  CliResult json = RunCommand({"jobs", run, "--format", "json"});
  ASSERT_EQ(json.status, kExitOk) << json.err;
  const nlohmann::json jobs = nlohmann::json::parse(json.out);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0]["name"], "warm");
  EXPECT_EQ(jobs[0]["priority"], 3);
  EXPECT_EQ(jobs[0]["work_s"], 12.5);
  EXPECT_EQ(jobs[1]["name"], "spin");
  EXPECT_EQ(jobs[1]["state"], "PENDING");
  EXPECT_EQ(ReadJobToml(run, 1).value(), ReadFile(job).value());
}

TEST(JobsCliTest, TheTableShowsEachJobsClass) {
  const std::string run = RunDir("cli_class");
  const std::string spin =
      JobFile("class_spin.toml", "[[side_tasks]]\ntype = \"spin\"\npriority = 2\n");
  const std::string serve =
      JobFile("class_serve.toml",
              "[[side_tasks]]\ntype = \"serve\"\nstages = [0]\n"
              "[side_tasks.args]\n"
              "checkpoint = \"tests/data/gpt2_golden/model.bin\"\nport = 0\n");
  ASSERT_EQ(RunCommand({"submit", run, spin}).status, kExitOk);
  CliResult served = RunCommand({"submit", run, serve});
  ASSERT_EQ(served.status, kExitOk) << served.err;
  CliResult table = RunCommand({"jobs", run});
  ASSERT_EQ(table.status, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr(" CLASS "));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n1 +spin +spin +throughput +PENDING"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n2 +serve +serve +latency +PENDING"));
  const nlohmann::json jobs =
      nlohmann::json::parse(RunCommand({"jobs", run, "--format", "json"}).out);
  EXPECT_EQ(jobs[0]["class"], "throughput");
  EXPECT_EQ(jobs[1]["class"], "latency");
}

TEST(JobsCliTest, ABadJobIsRefusedAsConfigCheckRefusesATask) {
  const std::string run = RunDir("cli_bad_job");
  const std::string args = JobFile(
      "bad_args.toml", "[[side_tasks]]\ntype = \"spin\"\n[side_tasks.args]\nstep_ms = -1\n");
  CliResult bad = RunCommand({"submit", run, args});
  EXPECT_EQ(bad.status, kExitFailure);
  EXPECT_THAT(bad.err, HasSubstr(args + ":4:11: side_tasks[0] ('spin', spin): "));
  const std::string stage =
      JobFile("bad_stage.toml", "[[side_tasks]]\ntype = \"spin\"\nstages = [5]\n");
  CliResult beyond = RunCommand({"submit", run, stage});
  EXPECT_EQ(beyond.status, kExitFailure);
  EXPECT_THAT(beyond.err, HasSubstr(stage + ":3:10: side_tasks[0].stages"));
  EXPECT_EQ(RunCommand({"submit", run, args, "--priority", "high"}).status, kExitUsage);
  EXPECT_EQ(RunCommand({"submit", run, args, "--name", "../x"}).status, kExitUsage);
  EXPECT_EQ(RunCommand({"submit", run}).status, kExitUsage);
  EXPECT_EQ(RunCommand({"jobs", run, "--format", "xml"}).status, kExitUsage);
  CliResult no_run = RunCommand({"submit", run + "/nowhere", args});
  EXPECT_EQ(no_run.status, kExitFailure);
  EXPECT_THAT(no_run.err, HasSubstr("holds no config.toml"));
  EXPECT_TRUE(ListJobIds(run).empty());
}

TEST(JobsCliTest, CancelEndsAJobAtOnceOrAsksTheTrainingThatHoldsTheDirectory) {
  const std::string run = RunDir("cli_cancel");
  const std::string job = JobFile("cancel_job.toml", "[[side_tasks]]\ntype = \"spin\"\n");
  ASSERT_EQ(RunCommand({"submit", run, job}).status, kExitOk);
  ASSERT_EQ(RunCommand({"submit", run, job}).status, kExitOk);
  CliResult now = RunCommand({"cancel", run, "1"});
  ASSERT_EQ(now.status, kExitOk) << now.err;
  EXPECT_EQ(now.out, "job 1 CANCELLED\n");
  EXPECT_TRUE(std::filesystem::exists(JobDir(run, 1) + "/status.json"));
  CliResult again = RunCommand({"cancel", run, "1"});
  EXPECT_EQ(again.status, kExitFailure);
  EXPECT_THAT(again.err, HasSubstr("job 1 is CANCELLED already"));
  {
    absl::StatusOr<DirectoryLock> training = DirectoryLock::Acquire(run);
    ASSERT_TRUE(training.ok());
    CliResult asked = RunCommand({"cancel", run, "2"});
    ASSERT_EQ(asked.status, kExitOk) << asked.err;
    EXPECT_THAT(asked.out, HasSubstr("cancellation requested"));
  }
  EXPECT_TRUE(CancelRequested(run, 2));
  EXPECT_THAT(RunCommand({"jobs", run}).out, HasSubstr("(cancel requested)"));
  EXPECT_EQ(RunCommand({"cancel", run, "9"}).status, kExitFailure);
  EXPECT_EQ(RunCommand({"cancel", run, "x"}).status, kExitUsage);
}

TEST(JobsCliTest, WorkMustBeAFiniteNumberOfSeconds) {
  const std::string run = RunDir("cli_work_inf");
  const std::string job = JobFile("work_job.toml", "[[side_tasks]]\ntype = \"spin\"\n");
  for (const char* work : {"inf", "1e999", "nan", "-inf", "0", "-3", "1e300"}) {
    SCOPED_TRACE(work);
    CliResult r = RunCommand({"submit", run, job, "--work", work});
    EXPECT_EQ(r.status, kExitUsage) << r.err;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--work: expected seconds, a number > 0 and at most "
                                              "3.1536e+07, found '",
                                              work, "'")));
  }
  EXPECT_TRUE(ListJobIds(run).empty());
}

TEST(JobsCliTest, AJobJsonOfWrongTypesIsListedAndCancelledNeverAborts) {
  const std::string run = RunDir("cli_bad_job_json");
  const std::string job = JobFile("typed_job.toml", "[[side_tasks]]\ntype = \"spin\"\n");
  ASSERT_EQ(RunCommand({"submit", run, job}).status, kExitOk);
  ASSERT_EQ(RunCommand({"submit", run, job}).status, kExitOk);
  // What --work inf used to write, and a priority by name.
  ASSERT_TRUE(WriteFileAtomically(JobDir(run, 1) + "/job.json",
                                  R"({"id": 1, "name": "spin", "type": "spin", "work_s": null})")
                  .ok());
  ASSERT_TRUE(
      WriteFileAtomically(JobDir(run, 2) + "/job.json", R"({"id": 2, "priority": "high"})").ok());
  CliResult table = RunCommand({"jobs", run});
  ASSERT_EQ(table.status, kExitOk) << table.err;
  EXPECT_THAT(table.err, HasSubstr("job 1: " + JobDir(run, 1) +
                                   "/job.json: \"work_s\": expected a finite number >= 0, found "
                                   "null"));
  EXPECT_THAT(table.err, HasSubstr("\"priority\": expected an integer, found a string (\"high\")"));
  EXPECT_EQ(RunCommand({"jobs", run, "--format", "json"}).status, kExitOk);
  CliResult cancelled = RunCommand({"cancel", run, "1"});
  ASSERT_EQ(cancelled.status, kExitOk) << cancelled.err;
  EXPECT_EQ(cancelled.out, "job 1 CANCELLED\n");
  // A record of the wrong type is skipped with a word, never fatal.
  ASSERT_TRUE(AppendJobRecord(run, {2, JobState::kRunning, 5, 1, {0}, "", std::nullopt}).ok());
  {
    std::ofstream log(run + "/jobs.jsonl", std::ios::app);
    log << R"({"id": 2, "state": 7, "time": null})" << "\n" << R"({"id": 2, "state": "PENDING"})"
        << "\n";
  }
  CliResult after = RunCommand({"jobs", run});
  EXPECT_EQ(after.status, kExitOk) << after.err;
  EXPECT_THAT(after.err, HasSubstr("jobs.jsonl line 5: \"state\": expected a string, found the "
                                   "number 7 (line skipped)"));
}

TEST(JobsCliTest, JobsOfARunDirectoryThatIsNotThereIsBadUsage) {
  CliResult r = RunCommand({"jobs", "/nonexistent"});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent: no such run directory"));
  EXPECT_EQ(RunCommand({"cancel", "/nonexistent", "1"}).status, kExitUsage);
}

// `freeride jobs runs/nope` printed an empty table and exit 0 where runs/nope existed empty.
TEST(JobsCliTest, ADirectoryThatHoldsNoRunIsBadUsageNamingIt) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "not_a_run").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CliResult r = RunCommand({"jobs", dir});
  EXPECT_EQ(r.status, kExitUsage) << r.out;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(dir + " holds no run (no config.toml)"));
  CliResult cancel = RunCommand({"cancel", dir, "1"});
  EXPECT_EQ(cancel.status, kExitUsage);
  EXPECT_THAT(cancel.err, HasSubstr(dir + " holds no run"));
}

}  // namespace
}  // namespace freeride
