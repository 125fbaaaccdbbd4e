// run.tensorboard: the event files are read back byte by byte (TFRecord framing and both
// checksums checked here, independently of the writer's reader), parsed with protobuf, and
// every scalar held equal to the metrics.jsonl row it came from.
#include "trainer/tensorboard.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "absl/strings/str_split.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/files.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"
#include "trainer/tensorboard_event.pb.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Key = std::tuple<std::string, std::string, int64_t>;  // run, tag, step

uint32_t Le32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(b[at + i]);
  return v;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

struct EventFile {
  std::vector<tensorboard::Event> events;
};

// Every record of `path`, its framing and both CRCs checked here.
EventFile ReadEvents(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  const std::string b = text.ok() ? *text : "";
  EventFile out;
  size_t at = 0;
  while (at < b.size()) {
    EXPECT_GE(b.size() - at, 16u) << path << " ends inside a record at " << at;
    if (b.size() - at < 16) break;
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(b[at + i]);
    EXPECT_EQ(Le32(b, at + 8), Masked(Crc32c(&b[at], 8))) << path << " at " << at;
    EXPECT_LE(at + 16 + length, b.size());
    if (at + 16 + length > b.size()) break;
    EXPECT_EQ(Le32(b, at + 12 + length), Masked(Crc32c(&b[at + 12], length)))
        << path << " at " << at;
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromArray(&b[at + 12], static_cast<int>(length)));
    out.events.push_back(event);
    at += 16 + length;
  }
  return out;
}

// run -> its event files' events, in file order.
std::map<std::string, std::vector<tensorboard::Event>> ReadRuns(const std::string& dir) {
  std::map<std::string, std::vector<tensorboard::Event>> runs;
  for (const auto& run : fs::directory_iterator(fs::path(dir) / "tensorboard")) {
    int files = 0;
    for (const auto& f : fs::directory_iterator(run.path())) {
      ++files;
      EXPECT_EQ(f.path().filename().string().rfind("events.out.tfevents.", 0), 0u) << f.path();
      EventFile file = ReadEvents(f.path().string());
      EXPECT_FALSE(file.events.empty());
      if (file.events.empty()) continue;
      // TensorBoard's check of the format: the first record names its version.
      EXPECT_EQ(file.events[0].file_version(), "brain.Event:2");
      auto& events = runs[run.path().filename().string()];
      events.insert(events.end(), file.events.begin() + 1, file.events.end());
    }
    EXPECT_EQ(files, 1) << run.path() << ": one event file per run, appended to on resume";
  }
  return runs;
}

std::vector<json> Rows(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/metrics.jsonl");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<json> out;
  for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n', absl::SkipEmpty())) {
    out.push_back(json::parse(line));
  }
  return out;
}

// Every scalar of the event files, each (run, tag, step) once.
std::map<Key, float> Scalars(const std::string& dir) {
  std::map<Key, float> out;
  for (const auto& [run, events] : ReadRuns(dir)) {
    for (const tensorboard::Event& e : events) {
      EXPECT_TRUE(e.has_summary());
      EXPECT_GT(e.wall_time(), 1.7e9);
      for (const tensorboard::SummaryValue& v : e.summary().value()) {
        EXPECT_TRUE(out.emplace(Key{run, v.tag(), e.step()}, v.simple_value()).second)
            << run << " " << v.tag() << " step " << e.step() << " twice";
      }
    }
  }
  return out;
}

absl::Status RunWithTensorboard(const Config& config, Clock* clock = nullptr) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, nullptr, clock);
  if (!trainer.ok()) return trainer.status();
  absl::Status s = (*trainer)->Run();
  (*trainer)->RecordEnd(s);
  return s;
}

TEST(TensorBoardTest, RecordsAreFramedWithMaskedCrc32c) {
  // CRC-32C's published check value (RFC 3720 B.4's "123456789").
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(MaskedCrc32c("123456789", 9), Masked(0xe3069283u));
  // Every TensorFlow event file starts with these 12 bytes: the 24-byte version record's
  // length and its masked CRC (0x224b7fa3), as hexdumps of TensorFlow's own files show.
  const std::string header = FrameTfRecord(std::string(24, 'x')).substr(0, 12);
  EXPECT_EQ(header, std::string("\x18\0\0\0\0\0\0\0\xa3\x7f\x4b\x22", 12));
  const std::string record = FrameTfRecord("abc");
  ASSERT_EQ(record.size(), 19u);
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(Le32(record, 15), Masked(Crc32c("abc", 3)));
}

TEST(TensorBoardTest, EveryMetricsNumberIsAScalarOfItsRunAndStep) {
  Config config = testing::EmulatedHarvestConfig("tensorboard_rows");
  fs::remove_all(config.run.dir);
  config.run.tensorboard = true;
  config.train.steps = 6;
  config.freeride.alternate_every = 2;
  config.data.val = config.data.train;
  config.eval.every = 3;
  config.eval.batches = 1;
  SideTaskConfig spin;
  spin.type = "spin";
  spin.args["step_ms"] = 0.1;
  config.side_tasks = {spin};
  SimulatedClock clock(1000.0, 0.05, 7);
  ASSERT_TRUE(RunWithTensorboard(config, &clock).ok());

  const std::map<Key, float> scalars = Scalars(config.run.dir);
  const std::vector<json> rows = Rows(config.run.dir);
  // The version's first event file, in the first 12 bytes: the published header.
  for (const auto& run : fs::directory_iterator(fs::path(config.run.dir) / "tensorboard")) {
    for (const auto& f : fs::directory_iterator(run.path())) {
      absl::StatusOr<std::string> bytes = ReadFile(f.path().string());
      ASSERT_TRUE(bytes.ok());
      EXPECT_EQ(bytes->substr(0, 12), std::string("\x18\0\0\0\0\0\0\0\xa3\x7f\x4b\x22", 12));
    }
  }
  // What a TensorBoard user looks for, by name, from the rows themselves.
  int train = 0, val = 0, bubbles = 0;
  for (const json& row : rows) {
    const int64_t step = row["step"];
    if (row["kind"] == "train") {
      ++train;
      EXPECT_EQ(scalars.at({"pipeline", "train/loss", step}), row["loss"].get<float>());
      EXPECT_EQ(scalars.at({"pipeline", "train/lr", step}), row["lr"].get<float>());
      EXPECT_EQ(scalars.at({"pipeline", "train/grad_norm", step}), row["grad_norm"].get<float>());
      EXPECT_EQ(scalars.at({"pipeline", "train/tokens_per_s", step}),
                row["tokens_per_s"].get<float>());
      EXPECT_EQ(scalars.at({"pipeline", "train/mfu", step}), row["mfu"].get<float>());
      EXPECT_EQ(scalars.at({"pipeline", "train/harvesting", step}),
                row["harvesting"].get<bool>() ? 1.0f : 0.0f);
      for (int s = 0; s < 2; ++s) {
        const std::string run = "stage" + std::to_string(s);
        EXPECT_EQ(scalars.at({run, "train/bubble_s", step}), row["bubble_s"][s].get<float>());
        EXPECT_EQ(scalars.at({run, "train/host_peak_bytes", step}),
                  row["host_peak_bytes"][s].get<float>());
      }
    } else if (row["kind"] == "val") {
      ++val;
      EXPECT_EQ(scalars.at({"pipeline", "val/loss", step}), row["loss"].get<float>());
    } else if (row["kind"] == "bubble") {
      ++bubbles;
      // Named by the bubble's anchor: one series across step 1's re-placement.
      const std::string tag = "bubble/a" + std::to_string(row["anchor"].get<int>()) + "_" +
                              row["bubble_kind"].get<std::string>() + "/measured_s";
      EXPECT_EQ(scalars.at({"stage" + std::to_string(row["stage"].get<int>()), tag, step}),
                row["measured_s"].get<float>());
    }
  }
  EXPECT_EQ(train, 6);
  EXPECT_EQ(val, 3);  // steps 0, 3 and 6
  EXPECT_GT(bubbles, 0);
  EXPECT_TRUE(scalars.count({"pipeline", "harvest_summary/reclaimed", 6}));
  // The side task's record (side_tasks_rank000.jsonl), under the tags docs/training.md names.
  const std::string stage = "stage" + std::to_string(config.runtime.emulated_stage);
  absl::StatusOr<std::string> side = ReadFile(config.run.dir + "/side_tasks_rank000.jsonl");
  ASSERT_TRUE(side.ok()) << side.status();
  const json record = json::parse(side->substr(0, side->find('\n')));
  EXPECT_EQ(scalars.at({stage, "side_task/spin/rank0/units", 6}), record["units"].get<float>());
  EXPECT_EQ(scalars.at({stage, "side_task/spin/rank0/harvested_s", 6}),
            record["harvested_s"].get<float>());
  // And nothing else: the files hold exactly the rows' and the side-task records' scalars.
  std::map<Key, float> expected;
  std::vector<json> all = rows;
  all.push_back(record);
  for (const json& row : all) {
    for (const TensorBoardScalar& s : ScalarsOfMetricsRow(row)) {
      expected[{s.run, s.tag, s.step}] = static_cast<float>(s.value);
    }
  }
  EXPECT_EQ(scalars, expected);
}

TEST(TensorBoardTest, AResumeAppendsWithoutTheStepsAfterItsCheckpoint) {
  const std::string dir = (fs::path(::testing::TempDir()) / "tensorboard_resume").string();
  fs::remove_all(dir);
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 1, 1, 4, 8, dir);
  config.run.tensorboard = true;
  config.train.steps = 4;
  config.checkpoint.every = 2;
  ASSERT_TRUE(RunWithTensorboard(config).ok());
  const std::map<Key, float> first = Scalars(dir);
  ASSERT_TRUE(first.count({"pipeline", "train/loss", 4}));
  // As a run stopped after step 4 and resumed from its checkpoint at 2: steps 3 and 4 again.
  config.checkpoint.resume = (fs::path(dir) / "checkpoints" / "step_00000002").string();
  ASSERT_TRUE(RunWithTensorboard(config).ok());
  const std::map<Key, float> resumed = Scalars(dir);  // fails on a step written twice
  std::map<Key, float> expected;
  for (const json& row : Rows(dir)) {
    for (const TensorBoardScalar& s : ScalarsOfMetricsRow(row)) {
      expected[{s.run, s.tag, s.step}] = static_cast<float>(s.value);
    }
  }
  EXPECT_EQ(resumed, expected);
  for (int step = 1; step <= 4; ++step) {
    EXPECT_EQ(resumed.at({"pipeline", "train/loss", step}),
              first.at({"pipeline", "train/loss", step}));  // the same steps, deterministically
  }
}

TEST(TensorBoardTest, OffByDefault) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 1, 1, 4, 8,
                                        (fs::path(::testing::TempDir()) / "tb_off").string());
  fs::remove_all(config.run.dir);
  config.train.steps = 1;
  ASSERT_TRUE(RunWithTensorboard(config).ok());
  EXPECT_FALSE(fs::exists(fs::path(config.run.dir) / "tensorboard"));
}

}  // namespace
}  // namespace freeride
