// Per-bubble records: with side tasks, every step reports each BUBBLE of the real stage with
// the prediction it began with (none the first time), its measured duration (agreeing with the
// step's timeline) and the side work in it; metrics.jsonl carries them and the harvest record
// the prediction error.

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/clock.h"
#include "core/files.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

Config RecordsConfig(const std::string& dir) {
  Config config = testing::EmulatedHarvestConfig(dir);
  SideTaskConfig spin;
  spin.type = "spin";
  spin.args["step_ms"] = 0.05;
  config.side_tasks = {spin};
  return config;
}

// On simulated time: which bubbles a step has, and what each one measured, do not depend on
// the machine's load.
TEST(BubbleRecordsTest, EachStepReportsItsBubblesAsTheTimelineShowsThem) {
  SimulatedClock clock;
  auto trainer = Trainer::Create(RecordsConfig("bubble_records"), nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int step = 1; step <= 4; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    // The schedule the step runs (step 1 re-places the bubbles after it).
    const pipeline::Schedule schedule = (*trainer)->schedule();
    auto stats = (*trainer)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status();
    const auto& instrs = schedule.per_stage[0];
    int bubbles = 0;
    for (const pipeline::Instr& in : instrs) bubbles += in.op == pipeline::Op::kBubble;
    ASSERT_EQ(static_cast<int>(stats->bubbles.size()), bubbles);
    const auto& timeline = (*trainer)->last_timeline();
    for (const BubbleRecord& r : stats->bubbles) {
      ASSERT_EQ(r.stage, 0);
      ASSERT_EQ(instrs[r.index].op, pipeline::Op::kBubble);
      EXPECT_EQ(r.kind, instrs[r.index].bubble);
      if (step == 1) {
        EXPECT_LT(r.predicted_s, 0);  // nothing measured yet
      }
      if (step > 2) {
        EXPECT_GT(r.predicted_s, 0);
      }
      EXPECT_GE(r.harvested_s, 0);
      EXPECT_LE(r.harvested_s, r.measured_s + 1e-3);
      // The timeline: from the BUBBLE's start to the end of the next instruction's wait.
      size_t next = r.index + 1;
      while (instrs[next].op == pipeline::Op::kBubble) ++next;
      const pipeline::InstrTiming& b = timeline[r.index];
      const pipeline::InstrTiming& n = timeline[next];
      const double end = n.wait_end_s > 0 ? n.wait_end_s : n.end_s;
      EXPECT_NEAR(r.measured_s, end - b.start_s, 1e-3);
    }
  }
}

TEST(BubbleRecordsTest, MetricsCarryTheRecordsAndThePredictionError) {
  Config config = RecordsConfig("bubble_metrics");
  config.train.steps = 4;
  SimulatedClock clock;
  auto trainer = Trainer::Create(config, nullptr, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  auto metrics = ReadFile(config.run.dir + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok());
  // Per step: records, and those with a prediction. Step 1 re-places the bubbles, so a step
  // may hold another count than the next; from step 3 on every bubble has been seen before.
  std::map<int, std::pair<int, int>> per_step;
  for (absl::string_view line : absl::StrSplit(*metrics, '\n')) {
    if (!absl::StrContains(line, "\"kind\": \"bubble\"")) continue;
    EXPECT_TRUE(absl::StrContains(line, "\"stage\": 0, \"index\": ")) << line;
    int step = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.find("\"step\": ") + 8,
                                             line.find(',', line.find("\"step\": ")) -
                                                 line.find("\"step\": ") - 8),
                                 &step))
        << line;
    ++per_step[step].first;
    per_step[step].second += !absl::StrContains(line, "\"predicted_s\": null");
  }
  ASSERT_EQ(per_step.size(), 4u);
  for (const auto& [step, counts] : per_step) {
    EXPECT_GT(counts.first, 0) << "step " << step;
    if (step == 1) {
      EXPECT_EQ(counts.second, 0);
    }
    if (step >= 3) {
      EXPECT_EQ(counts.second, counts.first) << "step " << step;
    }
  }
  EXPECT_TRUE(absl::StrContains(*metrics, "\"prediction_error_s\": {\"median\": "));
}

}  // namespace
}  // namespace freeride
