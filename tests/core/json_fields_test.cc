#include "core/json_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace freeride {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(JsonFieldsTest, ReadsValuesOfTheRightTypeAndRange) {
  const json doc = json::parse(R"({"n": 3, "x": 2.5, "s": "a", "b": true, "v": [1, 2]})");
  const JsonFields f(doc, "doc.json");
  EXPECT_EQ(*f.Int("n", 0, 10), 3);
  EXPECT_EQ(*f.Number("x", 0), 2.5);
  EXPECT_EQ(*f.Number("n"), 3.0);  // an integer is a number
  EXPECT_EQ(*f.String("s"), "a");
  EXPECT_TRUE(*f.Bool("b"));
  EXPECT_EQ(*f.IntArray("v", 0), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(*f.IntOr("missing", 7), 7);
  EXPECT_EQ(*f.StringOr("missing", "d"), "d");
}

TEST(JsonFieldsTest, WrongValuesAreErrorsNamingDocumentKeyAndExpectation) {
  const json doc = json::parse(
      R"({"null": null, "str": "high", "neg": -1, "huge": 1e300, "big": 18446744073709551615,
          "frac": 1.5, "arr": [1, "x"]})");
  const JsonFields f(doc, "RUN/jobs/3/job.json");
  absl::StatusOr<double> null = f.Number("null", 0);
  ASSERT_FALSE(null.ok());
  EXPECT_THAT(null.status().message(),
              HasSubstr("RUN/jobs/3/job.json: \"null\": expected a finite number >= 0, found null"));
  EXPECT_THAT(f.Int("str").status().message(), HasSubstr("found a string (\"high\")"));
  EXPECT_THAT(f.Int("neg", 0).status().message(), HasSubstr("expected an integer >= 0"));
  EXPECT_FALSE(f.Number("huge", 0, 1e9).ok());
  EXPECT_FALSE(f.Int("big").ok());   // beyond int64
  EXPECT_FALSE(f.Int("frac").ok());  // not an integer
  EXPECT_FALSE(f.IntArray("arr").ok());
  EXPECT_FALSE(f.IntOr("null", 0).ok());  // present but null: not the fallback
  EXPECT_THAT(f.String("absent").status().message(), HasSubstr("\"absent\" is missing"));
}

TEST(JsonFieldsTest, ParseJsonObjectRefusesAnythingButAnObject) {
  EXPECT_TRUE(ParseJsonObject(R"({"a": 1})", "x").ok());
  EXPECT_THAT(ParseJsonObject("[1]", "x.json").status().message(),
              HasSubstr("x.json: expected a JSON object, found an array"));
  EXPECT_THAT(ParseJsonObject("{\"a\":", "x.json").status().message(), HasSubstr("not valid JSON"));
  EXPECT_FALSE(ParseJsonObject("", "x.json").ok());
}

TEST(JsonFieldsTest, LenientReadsFallBackOnEveryWrongValue) {
  for (const char* text : {"null", "\"s\"", "1.5", "[1]", "{}"}) {
    SCOPED_TRACE(text);
    const json doc = json::parse(std::string("{\"k\": ") + text + "}");
    EXPECT_EQ(JsonIntOr(doc, "k", 5), 5);
    EXPECT_FALSE(JsonBoolOr(doc, "k", false));
  }
  for (const char* text : {"null", "1", "[1]", "{}"}) {
    EXPECT_EQ(JsonStringOr(json::parse(std::string("{\"k\": ") + text + "}"), "k", "f"), "f");
  }
  EXPECT_TRUE(JsonObjectOr(json::parse(R"({"k": [1]})"), "k").is_object());
  EXPECT_TRUE(JsonArrayOr(json::parse(R"({"k": {}})"), "k").is_array());
  EXPECT_EQ(JsonNumberOr(json::parse("[1, 2]"), "k", 4.0), 4.0);  // not an object
  EXPECT_EQ(JsonNumberOr(json::parse(R"({"k": "2"})"), "k", 4.0), 4.0);
  EXPECT_EQ(JsonNumberOr(json::parse(R"({"k": 2})"), "k", 4.0), 2.0);
  EXPECT_EQ(JsonIntOr(json::parse(R"({"k": 18446744073709551615})"), "k", 1), 1);
}

}  // namespace
}  // namespace freeride
