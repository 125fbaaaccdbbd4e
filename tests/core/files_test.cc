#include "core/files.h"

#include <sys/resource.h>
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

}  // namespace
}  // namespace freeride
