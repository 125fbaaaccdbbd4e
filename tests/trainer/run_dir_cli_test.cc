// Run directories through the command line: a second run into one is refused with status 2,
// a resume appends to its metrics, --overwrite replaces it, and a study writes into its own
// directory beside the training run's.
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

std::string MustRead(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// The steps of the "train" rows of `metrics`, in file order.
std::vector<int> TrainSteps(const std::string& metrics) {
  std::vector<int> steps;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StrContains(line, "\"kind\": \"train\"")) continue;
    const size_t at = line.find("\"step\": ") + 8;
    steps.push_back(std::stoi(std::string(line.substr(at, line.find(',', at) - at))));
  }
  return steps;
}

std::vector<std::string> Checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (absl::StartsWith(entry.path().filename().string(), "step_")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(RunDirCliTest, ASecondRunIsRefusedAResumeAppendsAndOverwriteReplaces) {
  const std::string shard = WriteRandomShard("run_dir_cli.bin", 4000, 64, 21);
  const std::string run = Temp("run_dir_cli"), config = Temp("run_dir_cli.toml");
  std::filesystem::remove_all(run);
  ASSERT_TRUE(WriteFileAtomically(config, TinyToml(shard, run)).ok());
  CliResult first = RunCommand({"train", "--config", config, "--set", "train.steps=3"});
  ASSERT_EQ(first.status, kExitOk) << first.err;
  const std::string metrics = MustRead(run + "/metrics.jsonl");
  EXPECT_EQ(TrainSteps(metrics), (std::vector<int>{1, 2, 3}));

  CliResult again = RunCommand({"train", "--config", config});
  EXPECT_EQ(again.status, kExitUsage);
  EXPECT_THAT(again.err, HasSubstr("holds another run (metrics.jsonl; checkpoints "
                                   "step_00000003"));
  EXPECT_THAT(again.err, HasSubstr("--set checkpoint.resume=latest"));
  EXPECT_THAT(again.err, HasSubstr("--overwrite"));
  EXPECT_EQ(MustRead(run + "/metrics.jsonl"), metrics);

  // --check_run_dir (launch/run.sh's question before it starts the ranks): the same answer and
  // message, and nothing in run.dir changes; with --overwrite or a resume, yes.
  const std::string run_json = MustRead(run + "/run.json");
  const std::vector<std::string> checkpoints = Checkpoints(run + "/checkpoints");
  CliResult asked = RunCommand({"train", "--config", config, "--check_run_dir"});
  EXPECT_EQ(asked.status, kExitUsage);
  EXPECT_EQ(asked.err, again.err);
  EXPECT_EQ(asked.out, "");
  EXPECT_EQ(MustRead(run + "/run.json"), run_json);
  EXPECT_EQ(RunCommand({"train", "--config", config, "--check_run_dir", "--overwrite"}).status,
            kExitOk);
  EXPECT_EQ(RunCommand({"train", "--config", config, "--check_run_dir", "--set",
                        "checkpoint.resume=latest"})
                .status,
            kExitOk);
  EXPECT_EQ(MustRead(run + "/metrics.jsonl"), metrics);
  EXPECT_EQ(Checkpoints(run + "/checkpoints"), checkpoints);

  // Three steps more than the checkpoint's run had: its cosine schedule is reshaped, on request.
  CliResult resumed = RunCommand({"train", "--config", config, "--set", "checkpoint.resume=latest",
                                  "--set", "optim.reshape_schedule=true"});
  ASSERT_EQ(resumed.status, kExitOk) << resumed.err;
  const std::string appended = MustRead(run + "/metrics.jsonl");
  EXPECT_TRUE(absl::StartsWith(appended, metrics)) << appended;
  EXPECT_EQ(TrainSteps(appended), (std::vector<int>{1, 2, 3, 4, 5, 6}));

  CliResult replaced =
      RunCommand({"train", "--config", config, "--set", "train.steps=2", "--overwrite"});
  ASSERT_EQ(replaced.status, kExitOk) << replaced.err;
  EXPECT_EQ(TrainSteps(MustRead(run + "/metrics.jsonl")), (std::vector<int>{1, 2}));
  EXPECT_EQ(Checkpoints(run + "/checkpoints"), (std::vector<std::string>{"step_00000002"}));
  EXPECT_EQ(MustRead(run + "/checkpoints/latest"), "step_00000002\n");
}

TEST(RunDirCliTest, AStudyWritesItsOwnDirectoryBesideTheTrainingRun) {
  const std::string shard = WriteRandomShard("run_dir_study.bin", 4000, 64, 22);
  const std::string run = Temp("run_dir_study");
  std::filesystem::remove_all(run);
  const std::string train = Temp("run_dir_study_train.toml");
  const std::string study = Temp("run_dir_study.toml");
  ASSERT_TRUE(WriteFileAtomically(train, TinyToml(shard, run)).ok());
  const std::string study_toml = TinyToml(shard, run) + R"(
[parallel]
pp = 2
[runtime]
emulate_peers = true
threads = 1
[freeride]
enabled = true
calibration_steps = 1
[[side_tasks]]
type = "spin"
[side_tasks.args]
step_ms = 0.1
)";
  ASSERT_TRUE(WriteFileAtomically(study, study_toml).ok());
  CliResult trained = RunCommand({"train", "--config", train, "--set", "train.steps=2"});
  ASSERT_EQ(trained.status, kExitOk) << trained.err;
  const std::string config_toml = MustRead(run + "/config.toml");
  const std::string metrics = MustRead(run + "/metrics.jsonl");

  std::vector<std::string> args = {"study", "--config", study};
  args.insert(args.end(), {"--rounds", "1", "--block_steps", "1"});
  CliResult studied = RunCommand(args);
  ASSERT_EQ(studied.status, kExitOk) << studied.err;
  EXPECT_EQ(MustRead(run + "/config.toml"), config_toml);
  EXPECT_EQ(MustRead(run + "/metrics.jsonl"), metrics);
  EXPECT_FALSE(std::filesystem::exists(run + "/study.json"));
  EXPECT_TRUE(std::filesystem::exists(run + "/study/study.json"));
  EXPECT_TRUE(std::filesystem::exists(run + "/study/timeline_rank000.json"));
  EXPECT_THAT(MustRead(run + "/study/config.toml"), HasSubstr("emulate_peers = true"));

  // A second study there replaces the first only when asked to.
  CliResult again = RunCommand(args);
  EXPECT_EQ(again.status, kExitUsage);
  EXPECT_THAT(again.err, HasSubstr("/study\" holds another run (study.json; study_blocks_rank000.jsonl)"));
  std::vector<std::string> overwrite = args;
  overwrite.push_back("--overwrite");
  EXPECT_EQ(RunCommand(overwrite).status, kExitOk);
}

}  // namespace
}  // namespace freeride
