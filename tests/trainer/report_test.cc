// The report's parts that need no browser: reading a run directory (a line cut short while the
// run writes it is noted and left out; a side task's records of a resumed run's parts are
// summed, and every start of the run is shown), the merged
// trace's process and track names, the plots' data counts and escaping, and the run's state
// from its end record. tests/scripts/report_browser.sh renders whole pages in Chromium.
#include "trainer/report/report.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "trainer/jobs/job_store.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("freeride_report_test_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST_F(ReportTest, ARunInProgressLeavesOutItsLastLineAndSaysSo) {
  Write("metrics.jsonl",
        "{\"kind\": \"val\", \"step\": 0, \"loss\": 10.8}\n"
        "{\"kind\": \"train\", \"step\": 1, \"loss\": 10.5, \"lr\": 1e-4, \"grad_norm\": 2.0, "
        "\"step_s\": 0.3, \"tokens_per_s\": 1500, \"bubble_s\": [0.1, 0.01]}\n"
        "{\"kind\": \"train\", \"step\": 2, \"loss\": 10.2, \"lr\": 2e-4, \"grad_norm\": 1.5, "
        "\"step_s\": 0.3, \"tokens_per_s\": 1500, \"bubble_s\": [0.1, 0.02]}\n"
        "{\"kind\": \"train\", \"step\": 3, \"lo");
  Write("side_tasks_rank001.jsonl",
        "{\"rank\": 1, \"name\": \"pr\", \"state\": \"RUNNING\", \"steps\": 3}\n"
        "{\"rank\": 1, \"name\": \"pr\", \"state\": \"FAILED\", \"steps\": 5, \"reason\": "
        "\"x<y\"}\n");
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir_.string());
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->Records("train").size(), 2u);
  ASSERT_EQ(run->notes.size(), 1u);
  EXPECT_NE(run->notes[0].find("metrics.jsonl line 4"), std::string::npos) << run->notes[0];
  ASSERT_EQ(run->side_tasks.size(), 1u);
  EXPECT_EQ(run->side_tasks[0]["state"], "FAILED");
  const std::string html = RenderReport(*run);
  EXPECT_NE(html.find("in progress"), std::string::npos);
  EXPECT_NE(html.find("x&lt;y"), std::string::npos);  // the failure reason, escaped
  EXPECT_NE(html.find("Waiting, % of step time"), std::string::npos);  // two stages
  EXPECT_NE(html.find("metrics.jsonl line 4"), std::string::npos);
}

// After a stop and a resume the serve row read "0 requests served" (41 were served before the
// stop), the header showed only the resume's command line, and a fill job was STOPPED under
// "Side tasks" and PENDING under "Fill jobs".
TEST_F(ReportTest, AResumedRunIsReportedWholeSummedOverItsParts) {
  Write("metrics.jsonl", "{\"kind\": \"train\", \"step\": 80, \"loss\": 9.5, \"step_s\": 0.3}\n");
  Write("side_tasks_rank000.jsonl",
        "{\"kind\": \"side_task\", \"step\": 40, \"from_step\": 0, \"rank\": 0, \"name\": "
        "\"serve\", \"state\": \"STOPPED\", \"steps\": 41, \"units\": 500, \"harvested_s\": 2.5, "
        "\"restarts\": 0, \"summary\": \"41 requests served\"}\n"
        "{\"kind\": \"side_task\", \"step\": 40, \"from_step\": 0, \"rank\": 0, \"name\": "
        "\"resize\", \"state\": \"STOPPED\", \"steps\": 9, \"units\": 9}\n"
        "{\"kind\": \"side_task\", \"step\": 80, \"from_step\": 40, \"rank\": 0, \"name\": "
        "\"serve\", \"state\": \"LOADED\", \"steps\": 10, \"units\": 100, \"harvested_s\": 0.5, "
        "\"restarts\": 1, \"summary\": \"0 requests served\"}\n");
  Write("run.json",
        "{\"command\": [\"freeride\", \"train\", \"--set\", \"checkpoint.resume=latest\"], "
        "\"time\": \"2026-11-26T02:00:00Z\", \"earlier\": [{\"command\": [\"freeride\", \"train\", "
        "\"--config\", \"first.toml\"], \"time\": \"2026-11-26T01:00:00Z\"}]}\n");
  // The fill job the queue holds PENDING again after the stop.
  JobSubmission job;
  job.toml = "type = \"image\"\n";
  job.name = "resize";
  job.type = "image";
  ASSERT_TRUE(SubmitJob(dir_.string(), job, 1.0).ok());
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir_.string());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->side_tasks.size(), 2u);
  const nlohmann::json& serve = run->side_tasks[1];
  ASSERT_EQ(serve["name"], "serve");
  EXPECT_EQ(serve["steps"], 51);
  EXPECT_EQ(serve["units"], 600.0);
  EXPECT_EQ(serve["harvested_s"], 3.0);
  EXPECT_EQ(serve["restarts"], 1);
  EXPECT_EQ(serve["state"], "LOADED");  // where the run ended
  EXPECT_EQ(serve["parts"], 2);
  EXPECT_EQ(serve["summary"], "steps 0–40: 41 requests served; steps 40–80: 0 requests served");
  const std::string html = RenderReport(*run);
  EXPECT_NE(html.find("<th class=\"text\">command lines</th>"), std::string::npos) << html;
  EXPECT_NE(html.find("<code>freeride train --config first.toml</code> (2026-11-26T01:00:00Z)"
                      "<br><code>freeride train --set checkpoint.resume=latest</code>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("steps 0–40: 41 requests served"), std::string::npos);
  // The job once, as the queue has it: no STOPPED row of it under Side tasks.
  EXPECT_EQ(html.find("STOPPED"), std::string::npos) << html;
  EXPECT_NE(html.find("PENDING"), std::string::npos);
  EXPECT_NE(html.find("Fill jobs are in the Fill jobs table"), std::string::npos);
}

TEST_F(ReportTest, TheEndRecordGivesTheStateAndItsReason) {
  Write("metrics.jsonl",
        "{\"kind\": \"train\", \"step\": 1, \"loss\": 10.5, \"step_s\": 0.3}\n"
        "{\"kind\": \"end\", \"step\": 1, \"status\": \"failed\", \"reason\": \"step 2: loss "
        "nan\"}\n");
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir_.string());
  ASSERT_TRUE(run.ok());
  const std::string html = RenderReport(*run);
  EXPECT_NE(html.find("failed at step 1"), std::string::npos);
  EXPECT_NE(html.find("step 2: loss nan"), std::string::npos);
}

TEST_F(ReportTest, NotARunDirectoryIsAClearError) {
  absl::StatusOr<RunFiles> run = LoadRunFiles((dir_ / "nothing").string());
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("not a run directory"), std::string::npos);
}

TEST_F(ReportTest, TheMergedTraceNamesEveryRankAndTrack) {
  Write("config.toml", "");
  for (int r = 0; r < 2; ++r) {
    Write("timeline_rank00" + std::to_string(r) + ".json",
          "{\"traceEvents\": [{\"name\": \"F0\", \"ph\": \"X\", \"pid\": " + std::to_string(r) +
              ", \"tid\": " + std::to_string(r) +
              ", \"ts\": 1, \"dur\": 2}, {\"name\": \"pr\", "
              "\"ph\": \"X\", \"pid\": " +
              std::to_string(r) + ", \"tid\": " + std::to_string(1000 + r) +
              ", \"ts\": 3, \"dur\": 1}], \"otherData\": {\"rank\": " + std::to_string(r) +
              ", \"stage\": " + std::to_string(r) + "}}");
  }
  absl::StatusOr<RunFiles> run = LoadRunFiles(dir_.string());
  ASSERT_TRUE(run.ok());
  const nlohmann::json trace = nlohmann::json::parse(MergedTrace(*run));
  std::vector<std::string> names;
  int spans = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") ++spans;
    if (e["ph"] == "M" && e["name"] != "process_sort_index") names.push_back(e["args"]["name"]);
  }
  EXPECT_EQ(spans, 4);
  EXPECT_EQ(names, (std::vector<std::string>{"rank 0 (stage 0)", "stage 0", "stage 0 side tasks",
                                             "rank 1 (stage 1)", "stage 1", "stage 1 side tasks"}));
}

TEST(SvgPlotTest, CountsWhatItDrawsAndEscapes) {
  const std::string plot = LinePlot(
      {"a <b>", "x", "y"}, {{"s", {{0, 1}, {1, std::nan("")}, {2, 3}}}, {"one", {{1, 2}}}});
  EXPECT_NE(plot.find("data-points=\"3\""), std::string::npos) << plot;
  EXPECT_NE(plot.find("a &lt;b&gt;"), std::string::npos);
  EXPECT_NE(plot.find("<polyline"), std::string::npos);
  EXPECT_NE(plot.find("<circle"), std::string::npos);  // one point: a dot, not a line
  EXPECT_NE(LinePlot({"t", "x", "y"}, {}).find("data-points=\"0\""), std::string::npos);
  const std::string bars = BarPlot("b", "s", "bubble", "harvested", {{"stage 0 fill", 2, 1}});
  EXPECT_NE(bars.find("data-points=\"1\""), std::string::npos);
  EXPECT_EQ(HtmlEscape("<&\"'>"), "&lt;&amp;&quot;&#39;&gt;");
}

}  // namespace
}  // namespace freeride
