#include "trainer/run_dir.h"

#include <unistd.h>

#include "core/files.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

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

}  // namespace
}  // namespace freeride
