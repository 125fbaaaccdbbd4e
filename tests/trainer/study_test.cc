// The harvest study on one emulated stage: every arm runs its blocks (the A/A arm included),
// side-task arms harvest and training alone does not, a task that runs out of work restarts
// (repeat) or its arm is refused, a target adds rounds or says why it was not reached, and the
// table and JSON carry the intervals and the machine's state. On simulated time (compute takes
// its FLOP model's time, a spin step its step_ms): which arms harvest, and whether a step fits
// a bubble, do not depend on the machine's load.
#include "trainer/study/study.h"

#include <signal.h>

#include <filesystem>
#include <sstream>
#include <streambuf>

#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/stop_request.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

SideTaskConfig Spin(const std::string& name, double step_ms, int64_t steps = 0) {
  SideTaskConfig spin;
  spin.type = "spin";
  spin.name = name;
  spin.args["step_ms"] = step_ms;
  if (steps > 0) spin.args["steps"] = steps;
  return spin;
}

// The JSON value after `"key": ` following the arm named `arm`.
std::string ArmField(const std::string& json, const std::string& arm, const std::string& key) {
  const size_t at = json.find("\"arm\": \"" + arm + "\"");
  if (at == std::string::npos) return "<no arm " + arm + ">";
  const size_t k = json.find("\"" + key + "\": ", at);
  const size_t start = k + key.size() + 4;
  return json.substr(
      start, json.find_first_of(",}", json[start] == '[' ? json.find(']', start) : start) - start);
}

// A study of `config` on its own simulated clock (`jitter`: SimulatedClock's, so that blocks
// vary): the trainer it ran on, for the test to look at, and its table or error.
struct SimulatedStudy {
  explicit SimulatedStudy(double jitter = 0) : clock(1000, jitter) {}
  SimulatedClock clock;
  std::unique_ptr<Trainer> trainer;
  absl::StatusOr<std::string> table = absl::UnknownError("not run");
};
void RunSimulated(const Config& config, const StudyOptions& options, SimulatedStudy& study) {
  auto trainer = Trainer::Create(config, nullptr, &study.clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  study.trainer = *std::move(trainer);
  study.table = RunStudy(*study.trainer, config, options);
}

TEST(StudyTest, ComparesEveryArmWithIntervalsInOneRun) {
  Config config = testing::EmulatedHarvestConfig("study_run");
  SideTaskConfig image;
  image.type = "image";
  // Tiny images: an image step keeps no simulated time, so it is taken to last 10 µs; the
  // real work stays small (8×8).
  image.args["width"] = int64_t{8};
  image.args["height"] = int64_t{8};
  image.args["out_width"] = int64_t{4};
  image.args["out_height"] = int64_t{4};
  image.args["blur_radius"] = int64_t{1};
  // Runs out of work after 3 spins: the study's default repeat keeps it going.
  config.side_tasks = {Spin("spin", 0.1, 3), image};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 2;
  PrepareStudyConfig(config, options);
  // Arms: training alone, A/A, spin, image, all. Warm-up 2 + 3 task blocks; then a plain block
  // and per round 4 arms each followed by a plain block.
  EXPECT_EQ(config.train.steps, 2 + 3 * 2 + (1 + 2 * 4 * 2) * 2);
  ASSERT_TRUE(config.side_tasks[0].repeat.has_value());
  EXPECT_TRUE(*config.side_tasks[0].repeat);
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(study.trainer->step(), config.train.steps);
  EXPECT_NE(table->find("| training alone | 18 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| A/A: training alone | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + spin | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + all | 4 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("Noise floor (A/A: training alone measured as an arm): ±"),
            std::string::npos)
      << *table;
  EXPECT_NE(table->find("Machine: "), std::string::npos) << *table;
  EXPECT_NE(table->find("load average"), std::string::npos) << *table;
  EXPECT_EQ(table->find("refused"), std::string::npos) << *table;
  auto json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  // Training alone and A/A harvest nothing; the task arms do, with intervals.
  EXPECT_EQ(ArmField(*json, "training alone", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "A/A: training alone", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "training alone", "overhead_ci"), "null");
  for (const std::string arm : {"A/A: training alone", "+ spin", "+ image", "+ all"}) {
    EXPECT_EQ(ArmField(*json, arm, "overhead_ci").front(), '[') << arm << "\n" << *json;
    EXPECT_EQ(ArmField(*json, arm, "refused"), "null") << arm;
  }
  EXPECT_NE(ArmField(*json, "+ spin", "harvested_s"), "0.000000");
  EXPECT_EQ(ArmField(*json, "+ spin", "utilisation_ci").front(), '[');
  EXPECT_NE(json->find("\"noise_floor\": 0."), std::string::npos) << *json;
  EXPECT_NE(json->find("\"rank_cpus\": [\""), std::string::npos) << *json;
  EXPECT_NE(json->find("\"target\": null"), std::string::npos) << *json;
  // The spin task restarted rather than finishing.
  const HarvestReport report = study.trainer->side_tasks()->Report();
  EXPECT_GT(report.tasks[0].restarts, 0);
  EXPECT_EQ(report.tasks[0].state, "LOADED");
}

TEST(StudyTest, RefusesAnArmWhoseTaskRanOutOfWork) {
  Config config = testing::EmulatedHarvestConfig("study_refused");
  config.side_tasks = {Spin("short", 0.1, 2), Spin("long", 0.1)};
  config.side_tasks[0].repeat = false;  // said explicitly: the study keeps it
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 1;
  PrepareStudyConfig(config, options);
  EXPECT_FALSE(*config.side_tasks[0].repeat);
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(table->find("| + short | 2 | "), std::string::npos) << *table;
  EXPECT_NE(table->find("- + short: task 'short' did no work in the arm's block 1 ('short' now "
                        "FINISHED)"),
            std::string::npos)
      << *table;
  EXPECT_EQ(table->find("- + long:"), std::string::npos) << *table;
  // "+ all" is measured: its tasks together worked (a task may lose every bubble to another).
  EXPECT_EQ(table->find("- + all:"), std::string::npos) << *table;
}

TEST(StudyTest, ATargetAddsRoundsOrSaysWhyItWasNotReached) {
  Config config = testing::EmulatedHarvestConfig("study_target");
  config.side_tasks = {Spin("spin", 0.1)};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 1;
  options.target_ci = 1e-9;  // unreachable
  options.max_rounds = 3;
  PrepareStudyConfig(config, options);
  // Arms: alone, A/A, spin. Warm-up 2 + 1 block, then 1 + 3 rounds × 2 arms × 2 blocks.
  EXPECT_EQ(config.train.steps, 2 + 1 + 1 + 3 * 2 * 2);
  // Compute 5% either way: blocks vary, so intervals have a width to shrink.
  SimulatedStudy study(0.05);
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(study.trainer->step(), config.train.steps);  // every round it could
  EXPECT_NE(table->find("Target ±0.00% NOT reached in 3 rounds (--max_rounds 3): the widest "
                        "interval is '"),
            std::string::npos)
      << *table;
  EXPECT_NE(table->find("rounds would reach it."), std::string::npos) << *table;

  Config easy = testing::EmulatedHarvestConfig("study_target_easy");
  easy.side_tasks = {Spin("spin", 0.1)};
  options.target_ci = 10.0;  // ±1000%: met by the first evaluation
  PrepareStudyConfig(easy, options);
  SimulatedStudy second(0.05);
  RunSimulated(easy, options, second);
  table = second.table;
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_NE(table->find("Target ±1000.00%: every overhead interval is within it after 2 rounds."),
            std::string::npos)
      << *table;
  EXPECT_EQ(second.trainer->step(), 2 + 1 + 1 + 2 * 2 * 2);  // stopped early
  auto json = ReadFile(easy.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"target\": {\"ci\": 10.000000, \"max_rounds\": 3, \"reached\": true}"),
            std::string::npos)
      << *json;
}

// Log lines, kept; the first that holds `trigger` (when given) raises SIGTERM, as a person's
// Ctrl-C would arrive mid-study: at a known block, whatever the machine's speed.
class LogCapture : public std::streambuf {
 public:
  explicit LogCapture(std::string trigger = "") : trigger_(std::move(trigger)), stream_(this) {
    SetLogSink(&stream_);
    level_ = GetLogLevel();
    SetLogLevel(LogLevel::kWarn);  // progress is kept at every level but error
  }
  ~LogCapture() override {
    SetLogSink(nullptr);
    SetLogLevel(level_);
  }
  std::vector<std::string> Lines(const std::string& containing) const {
    std::vector<std::string> out;
    for (const std::string& l : lines_) {
      if (l.find(containing) != std::string::npos) out.push_back(l);
    }
    return out;
  }

 protected:
  int overflow(int c) override {
    if (c == '\n') {
      lines_.push_back(line_);
      if (!trigger_.empty() && line_.find(trigger_) != std::string::npos) {
        trigger_.clear();
        raise(SIGTERM);
      }
      line_.clear();
    } else if (c != EOF) {
      line_.push_back(static_cast<char>(c));
    }
    return c;
  }

 private:
  std::string trigger_, line_;
  std::vector<std::string> lines_;
  std::ostream stream_;
  LogLevel level_;
};

TEST(StudyTest, SaysHowFarItIsAfterEveryBlockEvenWhenOnlyWarningsAreShown) {
  Config config = testing::EmulatedHarvestConfig("study_progress");
  config.side_tasks = {Spin("spin", 0.1)};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 2;
  PrepareStudyConfig(config, options);
  LogCapture log;
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  // The warm-up block of the task arm, then per round each of the 2 arms with its plain block.
  EXPECT_EQ(log.Lines("study: warm-up block '+ spin' done").size(), 1u);
  const std::vector<std::string> rounds = log.Lines("study: round ");
  ASSERT_EQ(rounds.size(), 4u);
  EXPECT_NE(rounds[0].find("round 1 of 2, arm 1 of 2 ("), std::string::npos) << rounds[0];
  EXPECT_NE(rounds[3].find("round 2 of 2, arm 2 of 2 ("), std::string::npos) << rounds[3];
  // Every line has the elapsed time and an estimate from the steps done; the last has none left.
  for (const std::string& l : rounds) {
    EXPECT_NE(l.find(" elapsed, about "), std::string::npos) << l;
  }
  const int64_t steps = config.train.steps;
  EXPECT_NE(rounds[3].find(absl::StrFormat("step %d of %d", steps, steps)), std::string::npos)
      << rounds[3];
  EXPECT_NE(rounds[3].find("about 0s left"), std::string::npos) << rounds[3];
  EXPECT_NE(rounds[0].find(absl::StrFormat("step %d of %d", 2 + 2 + 2 + 2 + 2, steps)),
            std::string::npos)
      << rounds[0];
}

TEST(StudyTest, AStoppedStudyWritesItsCompletedRoundsAsPartialAndResumeAddsTheRest) {
  Config config = testing::EmulatedHarvestConfig("study_stopped");
  config.side_tasks = {Spin("spin", 0.1)};
  StudyOptions options;
  options.rounds = 3;
  options.block_steps = 1;
  PrepareStudyConfig(config, options);
  ASSERT_TRUE(InstallStopHandlers());
  {
    // Ctrl-C during round 2: its first arm is done, its second is not.
    LogCapture log("study: round 2 of 3, arm 1 of 2");
    SimulatedStudy study;
    RunSimulated(config, options, study);
    auto& table = study.table;
    ClearStopRequest();
    ASSERT_FALSE(table.ok());
    ASSERT_TRUE(absl::IsCancelled(table.status())) << table.status();
    EXPECT_NE(table.status().message().find("stopped by SIGTERM after step"), std::string::npos)
        << table.status();
    EXPECT_NE(table.status().message().find(
                  "wrote the report of the 1 round it completed, marked partial, to " +
                  config.run.dir + "/study.md"),
              std::string::npos)
        << table.status();
    EXPECT_NE(table.status().message().find("--resume"), std::string::npos) << table.status();
  }
  auto md = ReadFile(config.run.dir + "/study.md");
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_EQ(md->rfind("# Harvest study (partial)", 0), 0u) << *md;
  EXPECT_NE(md->find("Stopped by a signal after 1 of its 3 rounds"), std::string::npos) << *md;
  // One round: the first plain block and, per arm, one block and its plain block.
  EXPECT_NE(md->find("| training alone | 3 |"), std::string::npos) << *md;
  EXPECT_NE(md->find("| + spin | 1 |"), std::string::npos) << *md;
  auto json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"rounds\": 1, \"partial\": true"), std::string::npos) << *json;

  options.resume = true;
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  // Rounds 2 and 3 measured now (their warm-up again: 2 steps and the task arm's block).
  EXPECT_EQ(study.trainer->step(), 2 + 1 + (1 + 2 * 2 * 2) * 1);
  EXPECT_EQ(table->rfind("# Harvest study\n", 0), 0u) << *table;
  EXPECT_NE(table->find("3 rounds of 1-step blocks"), std::string::npos) << *table;
  EXPECT_NE(table->find("Continued 1 time from its saved blocks"), std::string::npos) << *table;
  // Every round's blocks: 3 of each arm; the plain blocks of both parts (each opens with one).
  EXPECT_NE(table->find("| A/A: training alone | 3 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| + spin | 3 |"), std::string::npos) << *table;
  EXPECT_NE(table->find("| training alone | 8 |"), std::string::npos) << *table;
  json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"rounds\": 3, \"partial\": false, \"resumes\": 1"), std::string::npos)
      << *json;
}

TEST(StudyTest, ResumeRefusesBlocksOfAnotherStudy) {
  Config config = testing::EmulatedHarvestConfig("study_resume_other");
  config.side_tasks = {Spin("spin", 0.1)};
  StudyOptions options;
  options.rounds = 1;
  options.block_steps = 1;
  PrepareStudyConfig(config, options);
  {
    SimulatedStudy first;
    RunSimulated(config, options, first);
    ASSERT_TRUE(first.table.ok()) << first.table.status();
  }
  options.resume = true;
  options.block_steps = 2;
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("study_blocks_rank000.jsonl line 6: the saved study "
                                          "ran 1-step blocks, this one --block_steps 2"),
            std::string::npos)
      << table.status();
}

TEST(StudyTest, ARefusalSaysWhichStageHadHowMuchBubbleAndWhatTheTaskNeeds) {
  Config config = testing::EmulatedHarvestConfig("study_starved");
  // A step of a second: no bubble of this pipeline holds it.
  config.side_tasks = {Spin("big", 1000)};
  StudyOptions options;
  options.rounds = 2;
  options.block_steps = 2;
  PrepareStudyConfig(config, options);
  SimulatedStudy study;
  RunSimulated(config, options, study);
  auto& table = study.table;
  ASSERT_TRUE(table.ok()) << table.status();
  const std::string stage = absl::StrFormat("stage %d had ", config.runtime.emulated_stage);
  EXPECT_NE(table->find("- + big: task 'big' did no work in the arm's block 1: 'big' needs "
                        "about 1.00 s a step (alone); " +
                        stage),
            std::string::npos)
      << *table;
  EXPECT_NE(table->find("of bubble in the block's 2 steps ("), std::string::npos) << *table;
  EXPECT_NE(table->find("A task steps only inside a bubble its step fits in"), std::string::npos)
      << *table;
  EXPECT_EQ(table->find("did no work did"), std::string::npos);
  // No overhead figure for an arm that measured nothing.
  auto json = ReadFile(config.run.dir + "/study.json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(ArmField(*json, "+ big", "overhead"), "null") << *json;
  EXPECT_EQ(ArmField(*json, "+ big", "overhead_ci"), "null") << *json;
}

TEST(StudyTest, NeedsSideTasks) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 1, 1, 4);
  auto trainer = Trainer::Create(config);
  ASSERT_TRUE(trainer.ok());
  auto table = RunStudy(**trainer, config, StudyOptions{});
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("set freeride.enabled = true"), std::string::npos);
}

}  // namespace
}  // namespace freeride
