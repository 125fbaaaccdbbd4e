// What the report page shows and how (issue 35): tick labels in human units, one colour per
// stage in every plot, legends beside the data, harvesting steps shaded, rates from zero, MFU
// and memory plots, a header of how the run was made, the config as changes from the
// defaults, and several runs compared on one page (`freeride report A B`).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/run_cli.h"
#include "trainer/config/config.h"
#include "trainer/report/report.h"
#include "trainer/report/report_compare.h"
#include "trainer/report/report_format.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ReportFormatTest, TicksReadAsPeopleWriteThem) {
  EXPECT_THAT(TickLabels({0, 5000, 10000, 15000, 20000}, NumberKind::kCount),
              ElementsAre("0", "5K", "10K", "15K", "20K"));
  EXPECT_THAT(TickLabels({8.0e6, 8.1e6, 8.2e6}, NumberKind::kCount),
              ElementsAre("8.0M", "8.1M", "8.2M"));
  // Seconds in the unit the axis's largest tick picks: all ticks of an axis share it.
  EXPECT_THAT(TickLabels({0, 0.005, 0.01, 0.015, 0.02}, NumberKind::kSeconds),
              ElementsAre("0 ms", "5 ms", "10 ms", "15 ms", "20 ms"));
  EXPECT_THAT(TickLabels({0, 0.5, 1, 1.5}, NumberKind::kSeconds),
              ElementsAre("0 s", "0.5 s", "1.0 s", "1.5 s"));
  EXPECT_THAT(TickLabels({0, 0.2, 0.4}, NumberKind::kPercent), ElementsAre("0%", "20%", "40%"));
  EXPECT_THAT(TickLabels({0, 512.0 * 1024 * 1024, 1024.0 * 1024 * 1024}, NumberKind::kBytes),
              ElementsAre("0 GiB", "0.5 GiB", "1.0 GiB"));
  EXPECT_THAT(TickLabels({2.5, 3, 3.5}, NumberKind::kCount), ElementsAre("2.5", "3.0", "3.5"));
  EXPECT_EQ(HumanNumber(8.103e6), "8.1M");
  EXPECT_EQ(HumanNumber(12345), "12.3K");
  EXPECT_EQ(HumanNumber(950), "950");
  EXPECT_EQ(HumanNumber(1.5 * 1024 * 1024 * 1024, NumberKind::kBytes), "1.5 GiB");
  EXPECT_EQ(HumanNumber(0.0123, NumberKind::kSeconds), "12.3 ms");
  EXPECT_EQ(HumanNumber(0.253, NumberKind::kPercent), "25.3%");
  EXPECT_EQ(HumanNumber(std::nan("")), "—");
  // A loss that diverged: past the largest multiplier, an exponent, never "4e+11T".
  EXPECT_EQ(HumanNumber(4.136e23), "4.14e+23");
  EXPECT_THAT(TickLabels({0, 2e23, 4e23}, NumberKind::kCount), ElementsAre("0", "2e+23", "4e+23"));
}

TEST(ReportFormatTest, OneColourPerStageNeverARunsColour) {
  std::set<std::string> stages;
  for (int s = 0; s < 8; ++s) stages.insert(StageColor(s));
  EXPECT_EQ(stages.size(), 8u);
  EXPECT_EQ(StageColor(0), "#1f77b4");
  EXPECT_EQ(StageColor(1), "#d62728");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(stages.count(SeriesColor(i)), 0u) << SeriesColor(i);
}

// The <svg> of the plot titled `title` in `html`.
std::string PlotOf(const std::string& html, const std::string& title) {
  const size_t at = html.find(absl::StrCat("aria-label=\"", title, "\""));
  if (at == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", at);
  return html.substr(begin, html.find("</svg>", at) + 6 - begin);
}

// The colour of legend entry `name` in a plot.
std::string LegendColor(const std::string& svg, const std::string& name) {
  std::smatch m;
  const std::regex entry("fill=\"(#[0-9a-f]{6})\"/><text [^>]*class=\"legend\">" + name + "<");
  return std::regex_search(svg, m, entry) ? m[1].str() : "";
}

TEST(SvgPlotTest, LegendsSitRightOfTheDataAreaAndRatesStartAtZero) {
  PlotSpec spec{"t", "step", "tokens/s"};
  spec.y_from_zero = true;
  const std::string svg =
      LinePlot(spec, {{"a", {{1, 5000}, {2, 6000}}}, {"b", {{1, 5500}, {2, 5900}}}});
  std::smatch frame;
  ASSERT_TRUE(std::regex_search(
      svg, frame,
      std::regex("<rect x=\"(\\d+)\" y=\"\\d+\" width=\"([\\d.]+)\"[^>]*class=\"frame\"")));
  const double right = std::stod(frame[1]) + std::stod(frame[2]);
  std::regex legend_rect("<g class=\"legend-entry\"><rect x=\"([\\d.]+)\"");
  int entries = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), legend_rect);
       it != std::sregex_iterator(); ++it, ++entries) {
    EXPECT_GT(std::stod((*it)[1]), right) << svg;
  }
  EXPECT_EQ(entries, 2);
  EXPECT_THAT(svg, HasSubstr(">0</text>"));  // the y axis starts at zero
  EXPECT_THAT(svg, HasSubstr(">6K</text>"));
}

TEST(SvgPlotTest, TickLabelsDoNotRunIntoEachOther) {
  PlotSpec spec{"Bubbles", "predicted", "measured"};
  spec.diagonal = true, spec.legend = true;
  spec.x_kind = spec.y_kind = NumberKind::kSeconds;
  const std::string svg = LinePlot(spec, {{"stage 0", {{0.01, 0.012}, {0.4, 0.43}}, true}});
  // Every x label about 7 px a character plus a gap, side by side within the frame.
  std::smatch frame;
  ASSERT_TRUE(std::regex_search(svg, frame, std::regex("width=\"([\\d.]+)\"[^>]*class=\"frame\"")));
  const std::regex label("text-anchor=\"middle\">([^<]+)</text>");
  double used = 0;
  int labels = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator();
       ++it, ++labels) {
    used += 7.0 * (*it)[1].length() + 8;
  }
  EXPECT_GE(labels, 2);
  EXPECT_LE(used, std::stod(frame[1])) << svg;
  EXPECT_THAT(svg, HasSubstr(">stage 0</text>"));  // one series, but its stage is named
}

class ReportPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("freeride_report_page_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "a");
    fs::create_directories(dir_ / "b");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  // A 2-stage run of 4 steps harvesting in steps 3 and 4, with `mfu` and a config that
  // differs from the defaults in train.steps.
  void WriteRun(const std::string& sub, double mfu, int64_t steps) {
    std::string metrics =
        "{\"kind\": \"start\", \"step\": 0, \"time\": \"2026-11-23T10:15:02.123Z\"}\n"
        "{\"kind\": \"val\", \"step\": 0, \"loss\": 10.9}\n";
    for (int s = 1; s <= 4; ++s) {
      absl::StrAppendFormat(
          &metrics,
          "{\"kind\": \"train\", \"step\": %d, \"loss\": %.1f, \"lr\": 1e-3, \"grad_norm\": 1.0, "
          "\"step_s\": 0.2, \"tokens_per_s\": 5000, \"bubble_s\": [%s], \"elapsed_s\": %d, "
          "\"tokens\": %d, \"harvesting\": %s, \"mfu\": %.3f, \"host_peak_bytes\": [%d, %d]}\n",
          s, 10.0 - s, s > 2 ? "0.016, 0.01" : "0.16, 0.01", 95 * s, 1000 * s,
          s > 2 ? "true" : "false", mfu, 300 << 20, 200 << 20);
    }
    // Stage 1's records first: a colour by order of appearance would paint it blue.
    metrics +=
        "{\"kind\": \"bubble\", \"step\": 3, \"stage\": 1, \"predicted_s\": 0.01, "
        "\"measured_s\": 0.012}\n"
        "{\"kind\": \"bubble\", \"step\": 3, \"stage\": 0, \"predicted_s\": 0.02, "
        "\"measured_s\": 0.018}\n"
        "{\"kind\": \"val\", \"step\": 4, \"loss\": 6.5}\n";
    Write(sub + "/metrics.jsonl", metrics);
    absl::StatusOr<Config> config = ParseConfig(
        "[data]\ntrain = \"t.bin\"\n", "test.toml",
        {absl::StrCat("train.steps=", steps), "run.dir=\"" + sub + "\"", "optim.lr=3e-3"});
    ASSERT_TRUE(config.ok()) << config.status();
    Write(sub + "/config.toml", ConfigToToml(*config));
    Write(sub + "/run.json",
          "{\"command\": [\"freeride\", \"train\", \"--set\", \"train.steps=4\"], "
          "\"config_file\": \"\", \"overrides\": [\"train.steps=4\"], \"host\": \"box7\", "
          "\"commit\": \"abc1234\", \"version\": \"0.3.0\", \"time\": \"2026-11-23T10:15:00Z\"}\n");
  }
  std::string Render(const std::string& sub) {
    absl::StatusOr<RunFiles> run = LoadRunFiles((dir_ / sub).string());
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? RenderReport(*run) : "";
  }
  fs::path dir_;
};

TEST_F(ReportPageTest, EveryPlotGivesAStageTheSameColour) {
  WriteRun("a", 0.3, 4);
  const std::string html = Render("a");
  for (const char* title :
       {"Waiting, % of step time", "Bubbles: predicted against measured", "Host memory peak"}) {
    const std::string svg = PlotOf(html, title);
    ASSERT_FALSE(svg.empty()) << title;
    EXPECT_EQ(LegendColor(svg, "stage 0"), StageColor(0)) << title;
    EXPECT_EQ(LegendColor(svg, "stage 1"), StageColor(1)) << title;
  }
  // The scatter's dots too, not only its legend.
  EXPECT_THAT(PlotOf(html, "Bubbles: predicted against measured"),
              HasSubstr(absl::StrCat("r=\"2.5\" fill=\"", StageColor(1), "\"/>")));
}

TEST_F(ReportPageTest, HarvestingStepsAreShadedAndRatesStartAtZero) {
  WriteRun("a", 0.3, 4);
  const std::string html = Render("a");
  for (const char* title : {"Waiting, % of step time", "Throughput", "Step time", "MFU"}) {
    const std::string svg = PlotOf(html, title);
    ASSERT_FALSE(svg.empty()) << title;
    EXPECT_THAT(svg, HasSubstr("class=\"shade\"/>")) << title;
    EXPECT_THAT(svg, HasSubstr("side tasks ran")) << title;
  }
  EXPECT_THAT(PlotOf(html, "Throughput"), HasSubstr(">0</text>"));
  EXPECT_THAT(PlotOf(html, "Step time"), HasSubstr(">0 ms</text>"));
  EXPECT_THAT(PlotOf(html, "Loss against tokens"), HasSubstr(">2K</text>"));
  EXPECT_THAT(html, Not(HasSubstr("e+0")));
}

TEST_F(ReportPageTest, MfuAndMemoryArePlotted) {
  WriteRun("a", 0.3, 4);
  const std::string html = Render("a");
  EXPECT_THAT(PlotOf(html, "MFU"), HasSubstr("data-points=\"4\""));
  EXPECT_THAT(PlotOf(html, "MFU"), HasSubstr(">30%</text>"));
  EXPECT_THAT(PlotOf(html, "Host memory peak"), HasSubstr("data-points=\"8\""));
  EXPECT_THAT(PlotOf(html, "Host memory peak"), HasSubstr(" MiB</text>"));
  EXPECT_THAT(html, HasSubstr("<td>30%</td>"));  // the mean MFU in the table
}

TEST_F(ReportPageTest, TheHeaderSaysWhenWhereAndHowTheRunWasMade) {
  WriteRun("a", 0.3, 4);
  const std::string html = Render("a");
  for (const char* text :
       {"2026-11-23T10:15:02.123Z", "abc1234 (freeride 0.3.0)", "box7",
        "<code>freeride train --set train.steps=4</code>", "<code>train.steps=4</code>",
        "the embedded default", "6.33 min of training"}) {
    EXPECT_THAT(html, HasSubstr(text));
  }
}

TEST_F(ReportPageTest, TheConfigIsShownAsChangesFromTheDefaultsWithTheWholeFileFolded) {
  WriteRun("a", 0.3, 4);
  const std::string html = Render("a");
  EXPECT_THAT(html, HasSubstr("<tr><td class=\"text\"><code>train.steps</code></td><td "
                              "class=\"text\">4</td>"));
  EXPECT_THAT(html, HasSubstr("<code>data.train</code>"));
  EXPECT_THAT(html, HasSubstr("<code>optim.lr</code></td><td class=\"text\">0.003</td>"));
  // A key left at its default is only in the folded file.
  const size_t folded = html.find("<details><summary>The whole config.toml");
  ASSERT_NE(folded, std::string::npos);
  EXPECT_EQ(html.find("<code>optim.beta1</code>"), std::string::npos);
  EXPECT_NE(html.find("beta1", folded), std::string::npos);
}

TEST_F(ReportPageTest, TwoRunsAreComparedOnSharedAxes) {
  WriteRun("a", 0.3, 4);
  WriteRun("b", 0.1, 8);
  std::vector<RunFiles> runs;
  for (const char* sub : {"a", "b"}) runs.push_back(*LoadRunFiles((dir_ / sub).string()));
  const std::string html = RenderComparison(runs);
  for (const char* title :
       {"Loss", "Loss against tokens", "Throughput", "MFU", "Host memory peak (largest stage)"}) {
    const std::string svg = PlotOf(html, title);
    ASSERT_FALSE(svg.empty()) << title;
    EXPECT_THAT(svg, HasSubstr("data-points=\"8\"")) << title;  // both runs' 4 steps
    EXPECT_EQ(LegendColor(svg, "run 1"), SeriesColor(0)) << title;
    EXPECT_EQ(LegendColor(svg, "run 2"), SeriesColor(1)) << title;
  }
  EXPECT_THAT(PlotOf(html, "Validation loss"), HasSubstr("data-points=\"4\""));
  EXPECT_THAT(html, HasSubstr((dir_ / "a").string()));
  EXPECT_THAT(html, HasSubstr("<td>30%</td>"));
  EXPECT_THAT(html, HasSubstr("<td>10%</td>"));
  // The config differences: train.steps, not run.dir (always different).
  EXPECT_THAT(html, HasSubstr("<code>train.steps</code></td><td class=\"text\">4</td><td "
                              "class=\"text\">8</td>"));
  EXPECT_THAT(html, Not(HasSubstr("<code>run.dir</code>")));
}

TEST_F(ReportPageTest, TheCommandComparesRunsIntoOneFileAndNamesADirectoryWithoutARun) {
  WriteRun("a", 0.3, 4);
  WriteRun("b", 0.1, 8);
  const std::string out = (dir_ / "cmp.html").string();
  CliResult ok = RunCommand({"report", (dir_ / "a").string(), (dir_ / "b").string(), "--out", out});
  ASSERT_EQ(ok.status, kExitOk) << ok.err;
  EXPECT_EQ(ok.out, out + "\n");
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir_ / "a" / "report.html"));
  CliResult bad = RunCommand({"report", (dir_ / "a").string(), (dir_ / "nothing").string(), "--out",
                              (dir_ / "bad.html").string()});
  EXPECT_EQ(bad.status, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr((dir_ / "nothing").string() + " is not a run directory"));
  EXPECT_FALSE(fs::exists(dir_ / "bad.html"));
}

// The quickstart's showcase run (launch/quickstart.sh: the 2-stage pipeline with side tasks,
// then `freeride report` of it) evaluates often enough that its report draws a validation
// curve, not one or two dots.
TEST(QuickstartShowcaseTest, EvaluatesOftenEnoughForAValidationCurve) {
  absl::StatusOr<std::string> script = ReadFile("launch/quickstart.sh");
  ASSERT_TRUE(script.ok()) << script.status();
  std::vector<std::string> overrides;
  std::string config;
  for (absl::string_view line : absl::StrSplit(*script, '\n')) {
    if (!absl::StrContains(line, "run.sh") || !absl::StrContains(line, ".toml")) continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    for (size_t i = 0; i < words.size(); ++i) {
      if (absl::EndsWith(words[i], ".toml")) config = words[i];
      if (words[i] == "--set" && i + 1 < words.size()) overrides.push_back(words[i + 1]);
    }
  }
  ASSERT_EQ(config, "configs/tiny_cpu_pp2_freeride.toml");
  absl::StatusOr<Config> c = LoadConfigFile(config, overrides);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_GT(c->eval.every, 0);
  // At step 0, every eval.every steps, and at the last.
  const int64_t evaluations =
      1 + c->train.steps / c->eval.every + (c->train.steps % c->eval.every != 0);
  EXPECT_GE(evaluations, 4) << "train.steps " << c->train.steps << ", eval.every "
                            << c->eval.every;
}

}  // namespace
}  // namespace freeride
