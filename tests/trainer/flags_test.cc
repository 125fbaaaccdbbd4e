#include "trainer/config/flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

using testing::ElementsAre;

const std::vector<FlagSpec> kSpecs = {
    {"kind", "KIND", "schedule kind"},
    {"set", "K=V", "override", true},
    {"verbose", "", "more output"},
};

TEST(FlagsTest, ParsesValuesSwitchesRepeatsAndPositionals) {
  absl::StatusOr<ParsedFlags> flags =
      ParseFlags({"file.toml", "--kind", "1f1b", "--set=a.b=1", "--set", "c.d=2", "--verbose"},
                 kSpecs);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->Get("kind"), "1f1b");
  EXPECT_THAT(flags->GetAll("set"), ElementsAre("a.b=1", "c.d=2"));
  EXPECT_TRUE(flags->Has("verbose"));
  EXPECT_FALSE(flags->Has("nothing"));
  EXPECT_EQ(flags->Get("nothing", "fallback"), "fallback");
  EXPECT_THAT(flags->positional(), ElementsAre("file.toml"));
}

TEST(FlagsTest, RejectsUnknownMissingAndDuplicated) {
  EXPECT_EQ(ParseFlags({"--knid", "x"}, kSpecs).status().message(), "unknown option --knid");
  EXPECT_EQ(ParseFlags({"--kind"}, kSpecs).status().message(),
            "option --kind needs a value (KIND)");
  EXPECT_EQ(ParseFlags({"--kind", "a", "--kind", "b"}, kSpecs).status().message(),
            "option --kind given twice");
  EXPECT_EQ(ParseFlags({"--verbose=yes"}, kSpecs).status().message(),
            "option --verbose takes no value");
}

}  // namespace
}  // namespace freeride
