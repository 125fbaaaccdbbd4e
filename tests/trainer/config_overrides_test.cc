#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/config/config.h"

namespace freeride {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

constexpr char kBase[] = R"([data]
train = "x"
[train]
steps = 10
[[side_tasks]]
type = "spin"
)";

absl::StatusOr<Config> WithOverrides(const std::vector<std::string>& overrides) {
  return ParseConfig(kBase, "base.toml", overrides);
}

TEST(ConfigOverridesTest, OverrideWinsOverFileAndDefault) {
  absl::StatusOr<Config> config =
      WithOverrides({"train.steps=3", "optim.lr=0.5", "data.shuffle=true",
                     "parallel.layers_per_stage=[2, 2]", "parallel.pp=2",
                     "optim.schedule=constant", "run.dir=\"runs/x y\"", "data.val=v.bin"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->train.steps, 3);
  EXPECT_EQ(config->optim.lr, 0.5);
  EXPECT_TRUE(config->data.shuffle);
  EXPECT_THAT(config->parallel.layers_per_stage, ElementsAre(2, 2));
  EXPECT_EQ(config->optim.schedule, "constant");  // bare word taken as a string
  EXPECT_EQ(config->run.dir, "runs/x y");
  EXPECT_EQ(config->data.val, "v.bin");
}

TEST(ConfigOverridesTest, LaterOverrideWins) {
  absl::StatusOr<Config> config = WithOverrides({"train.steps=3", "train.steps=4"});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->train.steps, 4);
}

TEST(ConfigOverridesTest, NumericLookingStringStaysAString) {
  absl::StatusOr<Config> config = WithOverrides({"run.dir=2024"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->run.dir, "2024");
}

TEST(ConfigOverridesTest, OverridesAreValidatedLikeTheFile) {
  EXPECT_EQ(WithOverrides({"train.steps=abc"}).status().message(),
            "--set train.steps=abc: train.steps: expected an integer >= 0, found a string "
            "(\"abc\")");
  EXPECT_THAT(WithOverrides({"train.stepz=3"}).status().message(),
              HasSubstr("--set train.stepz=3: train.stepz: unknown key (did you mean "
                        "'train.steps'?)"));
  EXPECT_THAT(WithOverrides({"steps"}).status().message(),
              HasSubstr("--set steps: expected section.key=value"));
  EXPECT_THAT(WithOverrides({"runtime.device=tpu"}).status().message(),
              HasSubstr("expected one of \"cpu\", \"cuda\", found a string (\"tpu\")"));
}

TEST(ConfigOverridesTest, CrossKeyErrorsPointAtTheOverride) {
  // batch_size is left at its default, so the rule points at the file as a whole.
  EXPECT_EQ(WithOverrides({"train.microbatches=3"}).status().message(),
            "base.toml: train.batch_size: expected a multiple of train.microbatches (3), found 8");
  EXPECT_EQ(WithOverrides({"train.microbatches=2", "train.batch_size=7"}).status().message(),
            "--set train.batch_size=7: train.batch_size: expected a multiple of "
            "train.microbatches (2), found 7");
}

TEST(ConfigOverridesTest, SideTaskKeysAndArgs) {
  absl::StatusOr<Config> config = WithOverrides(
      {"side_tasks.0.priority=5", "side_tasks.0.args.seconds=0.002", "side_tasks.0.name=busy"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->side_tasks[0].priority, 5);
  EXPECT_EQ(config->side_tasks[0].name, "busy");
  EXPECT_EQ(std::get<double>(config->side_tasks[0].args.at("seconds")), 0.002);
  EXPECT_THAT(WithOverrides({"side_tasks.3.priority=1"}).status().message(),
              HasSubstr("with N below 1"));
  EXPECT_THAT(WithOverrides({"side_tasks.0.priority=high"}).status().message(),
              HasSubstr("side_tasks[0].priority: expected an integer, found a string"));
}

}  // namespace
}  // namespace freeride
