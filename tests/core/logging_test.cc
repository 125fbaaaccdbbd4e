#include "core/logging.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

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

// Every call that reaches a stream buffer without one of its own, as a write to an unbuffered
// stderr does.
class WriteRecorder : public std::streambuf {
 public:
  std::vector<std::string> writes;

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    writes.emplace_back(s, static_cast<size_t>(n));
    return n;
  }
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) writes.emplace_back(1, char(c));
    return c;
  }
};

// A record is one write, its newline included: mpirun copies each rank's stderr pipe out as it
// reads, and a line written in two parts came out with another rank's line between them.
TEST_F(LoggingTest, EachRecordIsOneWrite) {
  WriteRecorder recorder;
  std::ostream sink(&recorder);
  SetLogSink(&sink);
  SetLogLevel(LogLevel::kInfo);
  FR_LOG(INFO) << "first " << 1;
  FR_LOG(WARN) << "second";
  SetLogSink(&captured_);
  ASSERT_EQ(recorder.writes.size(), 2u);
  EXPECT_NE(recorder.writes[0].find("] first 1\n"), std::string::npos) << recorder.writes[0];
  EXPECT_EQ(recorder.writes[0].back(), '\n');
  EXPECT_NE(recorder.writes[1].find("] second\n"), std::string::npos) << recorder.writes[1];
}

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

// FR_LOG is one expression of type void: an `if` without braces takes it and an `else` after
// it without drawing -Wdangling-else (which -Werror turns into a failed build).
static_assert(std::is_void_v<decltype(FR_LOG(INFO) << "unevaluated")>);
TEST_F(LoggingTest, OneStatementUnderAnIfWithoutBraces) {
  SetLogLevel(LogLevel::kInfo);
  int elses = 0;
  for (bool log : {true, false}) {
    if (log)
      FR_LOG(INFO) << "taken";
    else
      ++elses;
  }
  EXPECT_EQ(elses, 1);
  SetLogLevel(LogLevel::kError);
  for (bool log : {true, false}) {
    if (log)
      FR_LOG(INFO) << "filtered";
    else
      ++elses;
  }
  EXPECT_EQ(elses, 2);
  const std::string out = captured_.str();
  EXPECT_NE(out.find("] taken\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("filtered"), std::string::npos) << out;
}

TEST_F(LoggingTest, ProgressIsKeptAtEveryThresholdButError) {
  for (LogLevel threshold : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn}) {
    SetLogLevel(threshold);
    FR_LOG(PROGRESS) << "step " << static_cast<int>(threshold);
  }
  SetLogLevel(LogLevel::kError);
  FR_LOG(PROGRESS) << "step hidden";
  const std::string out = captured_.str();
  for (const char* line : {"] step 0\n", "] step 1\n", "] step 2\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_NE(out.find(" I logging_test.cc:"), std::string::npos) << out;  // read as information
}

TEST_F(LoggingTest, LinesGoToTheLogFileBesideTheSink) {
  const std::string path = ::testing::TempDir() + "/logging_test/run/log_rank000.txt";
  std::filesystem::remove_all(::testing::TempDir() + "/logging_test");
  WriteToLogFile("before any file");  // nowhere: no file yet
  ASSERT_TRUE(SetLogFile(path).ok());
  FR_LOG(INFO) << "to both";
  WriteToLogFile("error: only in the file");
  CloseLogFile();
  FR_LOG(INFO) << "after the file";
  std::ifstream in(path);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(file.find("] to both\n"), std::string::npos) << file;
  EXPECT_NE(file.find("\nerror: only in the file\n"), std::string::npos) << file;
  EXPECT_EQ(file.find("before any file"), std::string::npos) << file;
  EXPECT_EQ(file.find("after the file"), std::string::npos) << file;
  EXPECT_NE(captured_.str().find("] to both\n"), std::string::npos);
  EXPECT_EQ(captured_.str().find("only in the file"), std::string::npos);
  EXPECT_FALSE(SetLogFile("/proc/no/such/dir/log.txt").ok());
}

// support/test_main.cc clears FREERIDE_LOG_LEVEL; ctest runs this test with it set to `error`
// (log_level_isolation), under which CheckpointKeepTest and JobsCliTest missed the log lines
// of the processes they start.
TEST(TestMainTest, TheCallersLogLevelReachesNeitherTheSuiteNorItsChildren) {
  EXPECT_EQ(std::getenv("FREERIDE_LOG_LEVEL"), nullptr);
  EXPECT_EQ(GetLogLevel(), LogLevel::kInfo);
}

TEST_F(LoggingTest, ParsesLevelNames) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud").ok());
}

}  // namespace
}  // namespace freeride
