#include "core/files.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <csignal>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace freeride {
namespace {

std::string TempDir() {
  std::string dir = testing::TempDir() + "files_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(FilesTest, WritesAndReplacesWholeFiles) {
  const std::string dir = TempDir();
  ASSERT_TRUE(MakeDirectories(dir + "/a/b").ok());
  const std::string path = dir + "/a/b/state.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second, longer").ok());
  EXPECT_EQ(*ReadFile(path), "second, longer");
  // No temporary file is left behind.
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/a/b")) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(FilesTest, FailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string dir = TempDir();
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/keep", "old").ok());
  // A file-size limit makes the write fail part way, as a full disk would (even for root).
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status status = WriteFileAtomically(dir + "/keep", std::string(1 << 20, 'n'));
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cannot write"), std::string::npos) << status.message();
  EXPECT_EQ(*ReadFile(dir + "/keep"), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(FilesTest, MissingFileAndFileAsDirectoryAreErrors) {
  const std::string dir = TempDir();
  EXPECT_EQ(ReadFile(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  EXPECT_FALSE(MakeDirectories(dir + "/f").ok());
}

TEST(FilesTest, OnlyRegularFilesPassTheDataFileCheck) {
  const std::string dir = TempDir();
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  EXPECT_TRUE(CheckRegularFile(dir + "/f").ok());
  EXPECT_TRUE(CheckRegularFile(dir + "/absent").ok());  // its open says it is missing
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  for (const auto& [path, what] : {std::pair<std::string, std::string>{dir, "is a directory"},
                                   {dir + "/fifo", "is a FIFO (named pipe)"},
                                   {"/dev/null", "is a character device"}}) {
    absl::Status s = CheckRegularFile(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_NE(s.message().find(path + ": " + what + ", not a regular file"), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace freeride
