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
  EXPECT_EQ(ParseFlags({"--nothing", "x"}, kSpecs).status().message(),
            "unknown option --nothing");
  EXPECT_EQ(ParseFlags({"--kind"}, kSpecs).status().message(),
            "option --kind needs a value (KIND)");
  EXPECT_EQ(ParseFlags({"--kind", "a", "--kind", "b"}, kSpecs).status().message(),
            "option --kind given twice");
  EXPECT_EQ(ParseFlags({"--verbose=yes"}, kSpecs).status().message(),
            "option --verbose takes no value");
}

TEST(FlagsTest, SuggestsTheNearestOption) {
  EXPECT_EQ(ParseFlags({"--knid", "x"}, kSpecs).status().message(),
            "unknown option --knid (did you mean --kind?)");
  EXPECT_EQ(ParseFlags({"--kinds=x"}, kSpecs).status().message(),
            "unknown option --kinds (did you mean --kind?)");
  EXPECT_EQ(ParseFlags({"a.toml", "--verbos"}, kSpecs).status().message(),
            "unknown option --verbos (did you mean --verbose?)");
  EXPECT_EQ(ParseFlags({"--zzzzzz"}, kSpecs).status().message(), "unknown option --zzzzzz");
}

TEST(FlagsTest, OneValueAnOccurrenceOperandsAfterDoubleDash) {
  absl::StatusOr<ParsedFlags> flags =
      ParseFlags({"--set", "a=1", "b.toml", "--kind", "-5", "-", "--", "--verbose"}, kSpecs);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_THAT(flags->GetAll("set"), ElementsAre("a=1"));
  EXPECT_EQ(flags->Get("kind"), "-5");  // a value may begin with one dash
  EXPECT_FALSE(flags->Has("verbose"));  // after "--": an operand
  EXPECT_THAT(flags->positional(), ElementsAre("b.toml", "-", "--verbose"));
  EXPECT_EQ(ParseFlags({"--verbose", "--verbose"}, kSpecs).status().message(),
            "option --verbose given twice");
  // The argument after an option is its value, whatever it looks like.
  flags = ParseFlags({"--kind", "--verbose"}, kSpecs);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->Get("kind"), "--verbose");
}

TEST(FlagsTest, NamedNumbersInOrderOrTheItemThatIsNot) {
  absl::StatusOr<ParsedFlags> flags = ParseFlags({"--kind", "block=2,head=0.5,,embedding=0"}, kSpecs);
  ASSERT_TRUE(flags.ok());
  absl::StatusOr<std::vector<std::pair<std::string, double>>> items =
      NamedNumbersFlag(*flags, "kind");
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_THAT(*items, ElementsAre(std::pair<std::string, double>{"block", 2},
                                  std::pair<std::string, double>{"head", 0.5},
                                  std::pair<std::string, double>{"embedding", 0}));
  for (const char* bad : {"block", "block=x", "=2", "block=-1", "block=inf", "block=nan"}) {
    flags = ParseFlags({"--kind", bad}, kSpecs);
    ASSERT_TRUE(flags.ok());
    EXPECT_EQ(NamedNumbersFlag(*flags, "kind").status().message(),
              std::string("--kind: '") + bad + "': expected NAME=number with a finite number >= 0");
  }
  flags = ParseFlags({}, kSpecs);
  EXPECT_TRUE(NamedNumbersFlag(*flags, "kind")->empty());  // absent: nothing given
}

}  // namespace
}  // namespace freeride
