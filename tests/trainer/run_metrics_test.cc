// What metrics.jsonl's rows carry beyond loss and speed: wall-clock time, elapsed time (across
// resumes), tokens seen, whether side tasks ran, MFU against a stated peak, memory; and the
// overhead of alternating blocks with its interval. On simulated time: every value is exact.
#include "trainer/run_metrics.h"

#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/clock.h"
#include "core/files.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/report/report.h"
#include "trainer/report/svg_plot.h"

namespace freeride {
namespace {

using json = nlohmann::json;

std::vector<json> Records(const std::string& dir, const std::string& kind) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/metrics.jsonl");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<json> out;
  for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n', absl::SkipEmpty())) {
    json record = json::parse(line);
    if (record["kind"] == kind) out.push_back(record);
  }
  return out;
}

absl::Status RunOn(const Config& config, Clock* clock) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, nullptr, clock);
  if (!trainer.ok()) return trainer.status();
  absl::Status s = (*trainer)->Run();
  (*trainer)->RecordEnd(s);  // as `freeride train` ends a run
  return s;
}

TEST(RunMetricsTest, TimesAreIso8601InUtc) {
  using std::chrono::milliseconds;
  using std::chrono::system_clock;
  EXPECT_EQ(Iso8601Utc(system_clock::time_point(milliseconds(1234))), "1970-01-01T00:00:01.234Z");
  EXPECT_EQ(Iso8601Utc(system_clock::time_point(milliseconds(1795000000500))),
            "2026-11-18T11:06:40.500Z");
}

TEST(RunMetricsTest, PeaksComeFromTheTableAStatementOrAMeasurement) {
  EXPECT_DOUBLE_EQ(PeakFlopsFromTable("cuda:0 NVIDIA H100 80GB HBM3 bf16", "bf16").per_device,
                   989.4e12);
  EXPECT_DOUBLE_EQ(PeakFlopsFromTable("cuda:0 NVIDIA H100 PCIe fp32", "fp32").per_device, 51.2e12);
  EXPECT_DOUBLE_EQ(PeakFlopsFromTable("cuda:1 NVIDIA A100-SXM4-80GB bf16", "bf16").per_device,
                   312e12);
  const PeakFlops unknown = PeakFlopsFromTable("cuda:0 NVIDIA GeForce GTX 1080 fp32", "fp32");
  EXPECT_EQ(unknown.per_device, 0);
  EXPECT_NE(unknown.source.find("set runtime.peak_tflops"), std::string::npos);
  Config config;
  config.runtime.peak_tflops = 2.5;
  const PeakFlops stated = ResolvePeakFlops(config, "cpu fp32", false);
  EXPECT_DOUBLE_EQ(stated.per_device, 2.5e12);
  EXPECT_EQ(stated.source, "stated: runtime.peak_tflops");
  config.runtime.peak_tflops = 0;
  const PeakFlops measured = ResolvePeakFlops(config, "cpu fp32", false);
  EXPECT_GT(measured.per_device, 0);
  EXPECT_TRUE(absl::StartsWith(measured.source, "measured: the run's own products on "))
      << measured.source;
}

// The CPU peak is measured on the products the run computes (a 512³ product measured 0.034
// TFLOP/s where the tiny run's own products ran at 0.14), rows capped to keep it short.
TEST(RunMetricsTest, TheCpuPeakIsMeasuredOnTheRunsOwnProducts) {
  Config config;
  config.model.n_embd = 128;
  config.model.vocab_size = 50257;
  config.train.batch_size = 8;
  config.train.microbatches = 4;
  config.train.seq_len = 64;
  const std::vector<GemmShape> shapes = RunGemmShapes(config);
  ASSERT_EQ(shapes.size(), 5u);
  auto is = [](const GemmShape& s, int64_t m, int64_t n, int64_t k) {
    return s.m == m && s.n == n && s.k == k;
  };
  EXPECT_TRUE(is(shapes[0], 128, 384, 128));   // QKV: 2 × 64 rows of a micro-batch
  EXPECT_TRUE(is(shapes[3], 128, 128, 512));   // the MLP's second
  EXPECT_TRUE(is(shapes[4], 64, 50257, 128));  // the LM head, rows capped
}

// A peak below what the run reaches makes MFU over 100%, which is not a utilisation (the
// quickstart logged 126-166% against a peak measured low): the rows say null instead.
TEST(RunMetricsTest, MfuAboveThePeakIsNotReported) {
  Config config = testing::EmulatedHarvestConfig("metrics_above_peak");
  std::filesystem::remove_all(config.run.dir);
  config.train.steps = 3;
  config.freeride.enabled = false;
  config.runtime.peak_tflops = 1e-6;  // 1 MFLOP/s: every step runs faster
  SimulatedClock clock;
  const absl::Status run = RunOn(config, &clock);
  ASSERT_TRUE(run.ok()) << run;
  const std::vector<json> rows = Records(config.run.dir, "train");
  ASSERT_EQ(rows.size(), 3u);
  for (const json& row : rows) EXPECT_TRUE(row["mfu"].is_null()) << row.dump();
}

TEST(RunMetricsTest, TrainRowsCarryTimeTokensHarvestingMfuAndMemory) {
  Config config = testing::EmulatedHarvestConfig("metrics_rows");
  std::filesystem::remove_all(config.run.dir);
  config.train.steps = 13;
  config.freeride.alternate_every = 2;
  SideTaskConfig spin;
  spin.type = "spin";
  spin.args["step_ms"] = 0.1;
  config.side_tasks = {spin};
  SimulatedClock clock(1000.0, 0.05, 7);  // jitter: the blocks' step times differ
  ASSERT_TRUE(RunOn(config, &clock).ok());

  const std::vector<json> start = Records(config.run.dir, "start");
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0]["devices"], 2);  // the emulated pipeline's
  EXPECT_EQ(start[0]["peak_flops_per_device"].get<double>(), 1e10);
  const double flops = start[0]["flops_per_step"];
  const std::regex iso(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  const std::vector<json> rows = Records(config.run.dir, "train");
  ASSERT_EQ(rows.size(), 13u);
  double elapsed = 0;
  for (const json& row : rows) {
    const int step = row["step"];
    SCOPED_TRACE(row.dump());
    EXPECT_TRUE(std::regex_match(row["time"].get<std::string>(), iso));
    EXPECT_GT(row["elapsed_s"].get<double>(), elapsed);
    elapsed = row["elapsed_s"];
    EXPECT_EQ(row["tokens"], step * config.train.batch_size * config.train.seq_len);
    // Blocks of two steps, harvesting first.
    EXPECT_EQ(row["harvesting"], (step - 1) / 2 % 2 == 0);
    const double mfu = row["mfu"];
    EXPECT_GT(mfu, 0);
    EXPECT_LE(mfu, 1);
    // step_s is written to the microsecond: equal to its rounding.
    const double expected = flops / (row["step_s"].get<double>() * 1e10 * 2);
    EXPECT_NEAR(mfu, expected, 1e-3 * expected);
    ASSERT_EQ(row["host_peak_bytes"].size(), 2u);
    EXPECT_GT(row["host_peak_bytes"][0].get<double>(), 1e6);  // the real stage's process
    EXPECT_FALSE(row.contains("device_bytes"));               // a CPU run
  }
  const std::vector<json> summary = Records(config.run.dir, "harvest_summary");
  ASSERT_EQ(summary.size(), 1u);
  const json& ci = summary[0]["overhead_ci"];
  ASSERT_TRUE(ci.is_array()) << summary[0].dump();
  EXPECT_LE(ci[0].get<double>(), summary[0]["overhead"].get<double>());
  EXPECT_GE(ci[1].get<double>(), summary[0]["overhead"].get<double>());
  // One figure: the sentence the log and the report print holds the same digits, and states
  // where the interval stands against the budget (a verdict the row names too).
  const std::string text = summary[0]["overhead_text"];
  EXPECT_TRUE(absl::StartsWith(
      text, absl::StrFormat("%+.2f%% [%+.2f%%, %+.2f%%]: ",
                            100 * summary[0]["overhead"].get<double>(), 100 * ci[0].get<double>(),
                            100 * ci[1].get<double>())))
      << text;
  const std::string verdict = summary[0]["overhead_verdict"];
  EXPECT_TRUE(verdict == "above" || verdict == "within" || verdict == "undecided" ||
              verdict == "cannot_resolve")
      << verdict;
  EXPECT_EQ(absl::StrContains(text, "cannot resolve a 1% budget on this host"),
            verdict == "cannot_resolve");
  absl::StatusOr<RunFiles> run = LoadRunFiles(config.run.dir);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string page = RenderReport(*run);
  // Both the overhead table and the budget's (the guard is on) show it, HTML-escaped alike.
  size_t shown = 0;
  for (size_t at = page.find(HtmlEscape(text)); at != std::string::npos;
       at = page.find(HtmlEscape(text), at + 1)) {
    ++shown;
  }
  EXPECT_EQ(shown, summary[0]["budget"].is_number() ? 2u : 1u) << text;
  const std::vector<json> end = Records(config.run.dir, "end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_TRUE(std::regex_match(end[0]["time"].get<std::string>(), iso));
}

TEST(RunMetricsTest, ElapsedTimeContinuesAcrossAResume) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) / "metrics_resume").string();
  std::filesystem::remove_all(dir);
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 1, 1, 4, 8, dir);
  config.train.steps = 3;
  SimulatedClock first;
  ASSERT_TRUE(RunOn(config, &first).ok());
  const double before = Records(dir, "train").back()["elapsed_s"];
  config.train.steps = 5;
  config.checkpoint.resume = "latest";
  config.optim.reshape_schedule = true;  // two steps more than the run the checkpoint is of
  SimulatedClock second;  // starts where the first did: elapsed time must come from the rows
  ASSERT_TRUE(RunOn(config, &second).ok());
  const std::vector<json> rows = Records(dir, "train");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[3]["step"], 4);
  EXPECT_GT(rows[3]["elapsed_s"].get<double>(), before);
  EXPECT_EQ(rows[4]["tokens"], 5 * 8 * 8);
}

TEST(AlternatingOverheadTest, PairsEachBlockWithTheBlocksBesideItAsTheStudyDoes) {
  // Blocks: on 1.5 (the run's first: warm-up, left out), off 1.0, on 1.2, off 1.0, on 1.3,
  // off 1.0, on 2.0 (the last, with no block after it: left out) → ratios 0.2 and 0.3.
  const std::vector<std::pair<bool, double>> steps = {
      {true, 1.5},  {true, 1.5},  {false, 1.0}, {false, 1.0}, {true, 1.2},
      {true, 1.2},  {false, 0.9}, {false, 1.1}, {true, 1.3},  {true, 1.3},
      {false, 1.0}, {false, 1.0}, {true, 2.0}};
  std::optional<Estimate> e = AlternatingOverhead(steps);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->n, 2);
  EXPECT_NEAR(e->mean, 0.25, 1e-12);
  EXPECT_TRUE(e->known());
  EXPECT_LT(e->lo, 0.25);
  EXPECT_GT(e->hi, 0.25);
  // One pair: a value without an interval; no block with plain blocks on both sides: nothing.
  e = AlternatingOverhead({{false, 1.0}, {true, 1.1}, {false, 1.0}});
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->known());
  EXPECT_NEAR(e->mean, 0.1, 1e-12);
  EXPECT_FALSE(AlternatingOverhead({{true, 1.1}, {false, 1.0}}).has_value());
  EXPECT_FALSE(AlternatingOverhead({{true, 1.1}, {true, 1.0}}).has_value());
}

}  // namespace
}  // namespace freeride
