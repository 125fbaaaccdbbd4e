#include "trainer/run_dir.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

Config RunIn(const std::string& name) {
  absl::StatusOr<Config> config = ParseConfig("[data]\ntrain = \"t.bin\"\n", "test.toml", {});
  EXPECT_TRUE(config.ok()) << config.status();
  config->run.dir = testing::TempDir() + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(config->run.dir);
  return *config;
}

// Writes `text` to `path`, creating its directories.
absl::Status Write(const std::string& path, const std::string& text) {
  absl::Status made = MakeDirectories(std::filesystem::path(path).parent_path().string());
  return made.ok() ? WriteFileAtomically(path, text) : made;
}

// What a finished run leaves: metrics, a timeline, side-task records and two checkpoints.
void LeaveARun(const Config& config) {
  const std::string dir = config.run.dir;
  ASSERT_TRUE(Write(dir + "/metrics.jsonl", "{\"kind\": \"train\"}\n").ok());
  ASSERT_TRUE(Write(dir + "/timeline_rank000.json", "{}").ok());
  ASSERT_TRUE(Write(dir + "/side_tasks/spin/out.txt", "x").ok());
  ASSERT_TRUE(Write(dir + "/checkpoints/step_00000150/model.bin", "x").ok());
  ASSERT_TRUE(Write(dir + "/checkpoints/step_00000030/model.bin", "x").ok());
  ASSERT_TRUE(Write(dir + "/checkpoints/latest", "step_00000030\n").ok());
}

TEST(RunDirTest, WritesTheEffectiveConfigThatParsesBack) {
  absl::StatusOr<Config> config = ParseConfig("[data]\ntrain = \"t.bin\"\n", "test.toml",
                                              {"train.steps=5"});
  ASSERT_TRUE(config.ok());
  config->run.dir = testing::TempDir() + "run_dir_test_" + std::to_string(getpid()) + "/nested";
  ASSERT_TRUE(PrepareRunDir(*config).ok());
  absl::StatusOr<Config> saved = LoadConfigFile(config->run.dir + "/config.toml");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->train.steps, 5);
  EXPECT_EQ(ConfigToToml(*saved), ConfigToToml(*config));
}

TEST(RunDirTest, RecordsHowTheRunWasMadeForItsReport) {
  const Config config = RunIn("run_dir_origin");
  ASSERT_TRUE(
      PrepareRunDir(config, {}, {"configs/x.toml", {"train.steps=5", "optim.lr=1e-3"}}).ok());
  absl::StatusOr<std::string> text = ReadFile(config.run.dir + "/run.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json info = nlohmann::json::parse(*text);
  EXPECT_EQ(info["config_file"], "configs/x.toml");
  EXPECT_EQ(info["overrides"], nlohmann::json({"train.steps=5", "optim.lr=1e-3"}));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(info["host"], std::string(host));
  // This process's own command line: the test binary's path comes first.
  ASSERT_TRUE(info["command"].is_array());
  ASSERT_FALSE(info["command"].empty());
  EXPECT_THAT(info["command"][0].get<std::string>(), HasSubstr("trainer_test"));
  EXPECT_TRUE(info.contains("commit"));
  EXPECT_THAT(info["time"].get<std::string>(), testing::EndsWith("Z"));
}

TEST(RunDirTest, ANewRunIntoAnotherRunsDirectoryIsRefusedWithTheWaysOut) {
  Config config = RunIn("reused");
  LeaveARun(config);
  absl::StatusOr<DirectoryLock> lock = PrepareRunDir(config);
  ASSERT_FALSE(lock.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(lock.status())) << lock.status();
  const std::string message(lock.status().message());
  EXPECT_THAT(message, HasSubstr("run.dir = \"" + config.run.dir + "\" holds another run"));
  EXPECT_THAT(message, HasSubstr("metrics.jsonl"));
  EXPECT_THAT(message, HasSubstr("checkpoints step_00000030, step_00000150"));
  EXPECT_THAT(message, HasSubstr("--set checkpoint.resume=latest"));
  EXPECT_THAT(message, HasSubstr("--set run.dir=DIR"));
  EXPECT_THAT(message, HasSubstr("--overwrite"));
  // Nothing of the previous run was touched, its config included.
  EXPECT_TRUE(std::filesystem::exists(config.run.dir + "/checkpoints/step_00000150"));
  EXPECT_FALSE(std::filesystem::exists(config.run.dir + "/config.toml"));
}

TEST(RunDirTest, ResumingContinuesTheRunThatIsThere) {
  Config config = RunIn("resumed");
  LeaveARun(config);
  config.checkpoint.resume = "latest";
  EXPECT_TRUE(PrepareRunDir(config).ok());
  EXPECT_TRUE(std::filesystem::exists(config.run.dir + "/metrics.jsonl"));
}

TEST(RunDirTest, OverwriteRemovesThePreviousRunsOutputsOnly) {
  Config config = RunIn("overwritten");
  LeaveARun(config);
  ASSERT_TRUE(Write(config.run.dir + "/notes.txt", "mine").ok());
  absl::StatusOr<DirectoryLock> lock = PrepareRunDir(config, {.overwrite = true});
  ASSERT_TRUE(lock.ok()) << lock.status();
  for (const char* gone : {"metrics.jsonl", "timeline_rank000.json", "side_tasks",
                           "checkpoints/step_00000150", "checkpoints/latest"}) {
    EXPECT_FALSE(std::filesystem::exists(config.run.dir + "/" + gone)) << gone;
  }
  EXPECT_TRUE(std::filesystem::exists(config.run.dir + "/notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(config.run.dir + "/config.toml"));
}

TEST(RunDirTest, ACommandWithoutCheckpointsIsNotStoppedByTheRunsCheckpoints) {
  Config config = RunIn("study_base");
  ASSERT_TRUE(Write(config.run.dir + "/checkpoints/latest", "step_00000030\n").ok());
  ASSERT_TRUE(Write(config.run.dir + "/checkpoints/step_00000030/model.bin", "x").ok());
  EXPECT_FALSE(PrepareRunDir(config).ok());
  EXPECT_TRUE(PrepareRunDir(config, {.checkpoints = false}).ok());
  // A study left there is a previous run too.
  ASSERT_TRUE(Write(config.run.dir + "/study.json", "{}").ok());
  EXPECT_FALSE(PrepareRunDir(config, {.checkpoints = false}).ok());
}

// The report's header showed only the resume's command line: run.json keeps each start.
TEST(RunDirTest, AResumeKeepsTheEarlierStartsInRunJson) {
  Config config = RunIn("starts");
  {
    absl::StatusOr<DirectoryLock> lock =
        PrepareRunDir(config, {}, {.config_file = "first.toml", .overrides = {}});
    ASSERT_TRUE(lock.ok()) << lock.status();
  }
  config.checkpoint.resume = "latest";
  for (const char* file : {"second.toml", "third.toml"}) {
    absl::StatusOr<DirectoryLock> lock =
        PrepareRunDir(config, {}, {.config_file = file, .overrides = {}});
    ASSERT_TRUE(lock.ok()) << lock.status();
  }
  absl::StatusOr<std::string> text = ReadFile(config.run.dir + "/run.json");
  ASSERT_TRUE(text.ok());
  const nlohmann::json info = nlohmann::json::parse(*text);
  EXPECT_EQ(info["config_file"], "third.toml");
  ASSERT_TRUE(info["earlier"].is_array()) << *text;
  ASSERT_EQ(info["earlier"].size(), 2u) << *text;
  EXPECT_EQ(info["earlier"][0]["config_file"], "first.toml");
  EXPECT_EQ(info["earlier"][1]["config_file"], "second.toml");
  EXPECT_FALSE(info["earlier"][1].contains("earlier"));
  EXPECT_TRUE(info["earlier"][0]["command"].is_array());
}

}  // namespace
}  // namespace freeride
