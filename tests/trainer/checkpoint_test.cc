// Checkpoints that cannot be trusted are refused: files changed on disk after they were written
// (checked against the manifest's checksums on resume, eval, sample and `checkpoint verify`), a
// `latest` that points out of the checkpoint directory, and checkpoints that failed half way
// (their staging directory is removed). checkpoint.keep_last keeps the newest; each write is
// logged with its size, time and rate.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/train_state.h"

namespace freeride {
namespace {

using ::testing::HasSubstr;

// A finished tiny run with checkpoints at steps 3 and 6, in a fresh `name` directory.
std::string TrainWithCheckpoints(const std::string& name, const std::string& shard) {
  const std::string dir = Temp(name);
  std::filesystem::remove_all(dir);
  auto trainer = Trainer::Create(MustParse(TinyToml(shard, dir), {"checkpoint.every=3"}));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (trainer.ok()) {
    EXPECT_TRUE((*trainer)->Run().ok());
  }
  return dir;
}

// Overwrites `bytes` bytes of `path` at `offset`, as a bad sector or a stray write would.
void Scribble(const std::string& path, int64_t offset, int64_t bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekp(offset);
  const std::string junk(bytes, '\x5a');
  file.write(junk.data(), bytes);
  ASSERT_TRUE(file.good());
}

TEST(CheckpointIntegrityTest, TheManifestRecordsEveryFilesChecksumAndVerifyAgrees) {
  const std::string shard = WriteRandomShard("integrity.bin", 4000, 64, 21);
  const std::string dir = TrainWithCheckpoints("integrity", shard);
  const std::string step6 = dir + "/checkpoints/step_00000006";
  absl::StatusOr<std::string> text = ReadFile(step6 + "/manifest.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json manifest = nlohmann::json::parse(*text);
  for (const char* file : {"state_r000.bin", "model.bin"}) {
    ASSERT_TRUE(manifest["checksums"].contains(file)) << *text;
    EXPECT_EQ(manifest["checksums"][file]["bytes"].get<int64_t>(),
              static_cast<int64_t>(std::filesystem::file_size(step6 + "/" + file)));
    EXPECT_EQ(manifest["checksums"][file]["crc32c"].get<std::string>().size(), 8u);
  }
  CliResult verify = RunCommand({"checkpoint", "verify", dir + "/checkpoints"});
  EXPECT_EQ(verify.status, kExitOk) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("step_00000003/model.bin: ok ("));
  EXPECT_THAT(verify.out, HasSubstr("step_00000006/state_r000.bin: ok ("));
  EXPECT_THAT(verify.out, HasSubstr("latest: step_00000006"));
}

TEST(CheckpointIntegrityTest, ACorruptModelFileIsRefusedByEvalSampleAndVerify) {
  const std::string shard = WriteRandomShard("corrupt_model.bin", 4000, 64, 22);
  const std::string dir = TrainWithCheckpoints("corrupt_model", shard);
  const std::string checkpoints = dir + "/checkpoints";
  Scribble(checkpoints + "/step_00000006/model.bin", 2048, 4096);
  const std::string previous = "use the previous checkpoint, " + checkpoints + "/step_00000003";
  CliResult eval = RunCommand({"eval", "--checkpoint", checkpoints, "--data", shard, "--batch_size",
                               "2", "--seq_len", "16"});
  EXPECT_EQ(eval.status, kExitFailure);
  EXPECT_THAT(eval.err, HasSubstr(checkpoints + "/step_00000006/model.bin: checksum mismatch"));
  EXPECT_THAT(eval.err, HasSubstr(previous));
  CliResult sample =
      RunCommand({"sample", "--checkpoint", checkpoints + "/step_00000006", "--tokens", "2"});
  EXPECT_EQ(sample.status, kExitFailure);
  EXPECT_THAT(sample.err, HasSubstr("model.bin: checksum mismatch"));
  CliResult verify = RunCommand({"checkpoint", "verify", checkpoints});
  EXPECT_EQ(verify.status, kExitFailure);
  EXPECT_THAT(verify.out, HasSubstr("step_00000003/model.bin: ok"));
  EXPECT_THAT(verify.err, HasSubstr("step_00000006/model.bin: checksum mismatch"));
  // The previous checkpoint is whole and serves.
  EXPECT_EQ(RunCommand({"eval", "--checkpoint", checkpoints + "/step_00000003", "--data", shard,
                        "--batch_size", "2", "--seq_len", "16"})
                .status,
            kExitOk);
}

TEST(CheckpointIntegrityTest, ACorruptStateFileIsRefusedOnResume) {
  const std::string shard = WriteRandomShard("corrupt_state.bin", 4000, 64, 23);
  const std::string dir = TrainWithCheckpoints("corrupt_state", shard);
  Scribble(dir + "/checkpoints/step_00000006/state_r000.bin", 4096, 1024);
  auto resumed = Trainer::Create(
      MustParse(TinyToml(shard, dir), {"checkpoint.every=3", "checkpoint.resume=latest"}));
  ASSERT_FALSE(resumed.ok());
  EXPECT_THAT(resumed.status().message(),
              HasSubstr("step_00000006/state_r000.bin: checksum mismatch"));
  EXPECT_THAT(resumed.status().message(),
              HasSubstr("use the previous checkpoint, " + dir + "/checkpoints/step_00000003"));
  auto previous = Trainer::Create(MustParse(
      TinyToml(shard, dir),
      {"checkpoint.every=3", "checkpoint.resume=\"" + dir + "/checkpoints/step_00000003\""}));
  ASSERT_TRUE(previous.ok()) << previous.status();
  EXPECT_EQ((*previous)->step(), 3);
}

TEST(CheckpointIntegrityTest, LatestCannotPointOutOfTheCheckpointDirectory) {
  const std::string shard = WriteRandomShard("escape.bin", 4000, 64, 24);
  const std::string dir = TrainWithCheckpoints("escape", shard);
  // A complete checkpoint outside: following `latest` there would resume from it.
  std::filesystem::create_directories(dir + "/outside");
  std::filesystem::copy(dir + "/checkpoints/step_00000006", dir + "/outside/step");
  ASSERT_TRUE(WriteFileAtomically(dir + "/checkpoints/latest", "../outside/step\n").ok());
  auto resumed = Trainer::Create(
      MustParse(TinyToml(shard, dir), {"checkpoint.every=3", "checkpoint.resume=latest"}));
  ASSERT_FALSE(resumed.ok());
  EXPECT_THAT(resumed.status().message(), HasSubstr("latest holds '../outside/step'"));
  EXPECT_THAT(resumed.status().message(), HasSubstr("cannot point outside"));
  CliResult eval = RunCommand({"eval", "--checkpoint", dir + "/checkpoints", "--data", shard});
  EXPECT_EQ(eval.status, kExitFailure);
  EXPECT_THAT(eval.err, HasSubstr("latest holds '../outside/step'"));
  EXPECT_EQ(RunCommand({"checkpoint", "verify", dir + "/checkpoints"}).status, kExitFailure);
}

TEST(CheckpointIntegrityTest, AFailedCheckpointLeavesNoPartialDirectory) {
  const std::string shard = WriteRandomShard("enospc.bin", 4000, 64, 25);
  const std::string dir = Temp("enospc");
  std::filesystem::remove_all(dir);
  auto trainer = Trainer::Create(MustParse(TinyToml(shard, dir)));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  MustStep(**trainer);
  ASSERT_TRUE((*trainer)->SaveCheckpoint().ok());
  MustStep(**trainer);
  // A file-size limit fails the state file's write part way, as a full disk would (even for
  // root, on any file system).
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 16 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<std::string> failed = (*trainer)->SaveCheckpoint();
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, SIG_DFL);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("cannot write"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/step_00000002.partial"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/step_00000002"));
  EXPECT_EQ(*ReadFile(dir + "/checkpoints/latest"), "step_00000001\n");
}

}  // namespace
}  // namespace freeride

namespace freeride {
namespace {

TEST(CheckpointKeepTest, KeepsTheNewestAndLogsEachWriteWithItsSizeAndRate) {
  const std::string shard = WriteRandomShard("keep.bin", 4000, 64, 31);
  const std::string run = Temp("keep_last"), config = Temp("keep_last.toml");
  std::filesystem::remove_all(run);
  ASSERT_TRUE(WriteFileAtomically(config, TinyToml(shard, run)).ok());
  CliResult train = RunCommand({"train", "--config", config, "--set", "checkpoint.every=1", "--set",
                                "checkpoint.keep_last=2"});
  ASSERT_EQ(train.status, kExitOk) << train.err;
  std::vector<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(run + "/checkpoints")) {
    kept.push_back(entry.path().filename().string());
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"latest", "step_00000005", "step_00000006"}));
  EXPECT_THAT(train.err, HasSubstr("writing checkpoint step_00000006 to " + run + "/checkpoints"));
  EXPECT_THAT(train.err, ::testing::ContainsRegex("checkpoint " + run +
                                                  "/checkpoints/step_00000006: [0-9.]+ KiB in "
                                                  "[0-9.]+ s \\([0-9.]+ MB/s\\)"));
  EXPECT_THAT(train.err,
              HasSubstr("checkpoint.keep_last = 2: removed " + run + "/checkpoints/step_00000004"));
}

TEST(CheckpointKeepTest, PruningNeverRemovesTheCheckpointLatestNames) {
  const std::string dir = Temp("keep_latest");
  std::filesystem::remove_all(dir);
  for (const char* step : {"step_00000001", "step_00000002", "step_00000003"}) {
    ASSERT_TRUE(MakeDirectories(dir + "/" + step).ok());
  }
  ASSERT_TRUE(WriteFileAtomically(dir + "/latest", "step_00000001\n").ok());
  absl::StatusOr<std::vector<std::string>> removed = PruneCheckpoints(dir, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, std::vector<std::string>{dir + "/step_00000002"});
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_00000001"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_00000003"));
  EXPECT_TRUE(PruneCheckpoints(dir, 0)->empty());  // 0 keeps every one
}

}  // namespace
}  // namespace freeride
