#include "core/logging.h"

#include <sstream>

#include "gtest/gtest.h"

namespace freeride {
namespace {

class LoggingTest : public testing::Test {
 protected:
  void SetUp() override {
    SetLogSink(&captured_);
    saved_level_ = GetLogLevel();
    saved_rank_ = GetLogRank();
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(saved_level_);
    SetLogRank(saved_rank_);
  }
  std::ostringstream captured_;
  LogLevel saved_level_;
  int saved_rank_;
};

TEST_F(LoggingTest, LineCarriesTimestampRankLevelAndPlace) {
  // 2026-11-22 10:04:05.123 UTC
  EXPECT_EQ(FormatLogLine(LogLevel::kWarn, "/src/trainer/train.cc", 42, "slow step", 3,
                          1795341845.123),
            "2026-11-22 10:04:05.123 r3 W train.cc:42] slow step");
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, "x.cc", 1, "hi", -1, 0.0),
            "1970-01-01 00:00:00.000 I x.cc:1] hi");
}

TEST_F(LoggingTest, LevelThresholdFiltersAndSkipsEvaluation) {
  SetLogLevel(LogLevel::kWarn);
  SetLogRank(1);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  FR_LOG(INFO) << "hidden " << count();
  FR_LOG(ERROR) << "shown " << count();
  EXPECT_EQ(evaluated, 1);
  const std::string out = captured_.str();
  EXPECT_EQ(out.find("hidden"), std::string::npos);
  EXPECT_NE(out.find(" r1 E logging_test.cc:"), std::string::npos) << out;
  EXPECT_NE(out.find("] shown 1\n"), std::string::npos) << out;
}

TEST_F(LoggingTest, ParsesLevelNames) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud").ok());
}

}  // namespace
}  // namespace freeride
