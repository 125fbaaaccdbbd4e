// Every JSON document the project reads back, with each of its values (at any depth) replaced
// in turn by null, a string, a negative, a huge and a fractional number, an array and an
// object: no reader may throw (an escaped nlohmann exception aborts the process, exit 134),
// and where a value decides what happens (a job, a manifest) the error names the file and key.
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "freeride/tasks/serve_openai.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/checkpoint_verify.h"
#include "trainer/jobs/job_store.h"
#include "trainer/report/report.h"
#include "trainer/report/report_data.h"
#include "trainer/tensorboard.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

std::string HostileFreshDir(const std::string& name) {
  const std::string dir = (fs::path(::testing::TempDir()) / name).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// What each value is replaced by.
const std::vector<json>& BadValues() {
  static const std::vector<json> values = {
      json(), json("high"), json(-1), json(1e300), json(18446744073709551615ull), json(0.5),
      json::array({1, "x"}), json::object({{"a", nullptr}})};
  return values;
}

// `doc` with the value at every path (objects and arrays, down to `depth` levels) replaced in
// turn by each bad value, and `doc` itself; `check` gets each with a description.
void ForEachVariant(const json& doc, const std::function<void(const json&, const std::string&)>& check,
                    int depth = 3) {
  check(doc, "as written");
  std::function<void(json&, const std::string&, int, json&)> walk =
      [&](json& node, const std::string& path, int level, json& root) {
        if (level == 0 || !node.is_structured()) return;
        std::vector<std::string> keys;
        if (node.is_object()) {
          for (const auto& [key, unused] : node.items()) keys.push_back(key);
        }
        const size_t n = node.is_object() ? keys.size() : node.size();
        for (size_t i = 0; i < n; ++i) {
          json& child = node.is_object() ? node[keys[i]] : node[i];
          const std::string at =
              node.is_object() ? absl::StrCat(path, ".", keys[i]) : absl::StrCat(path, "[", i, "]");
          const json saved = child;
          for (const json& bad : BadValues()) {
            child = bad;
            check(root, absl::StrCat(at, " = ", bad.dump()));
          }
          child = saved;
          walk(child, at, level - 1, root);
        }
      };
  json copy = doc;
  walk(copy, "", depth, copy);
}

void Write(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
}

TEST(HostileDocumentsTest, JobJsonNeverThrowsAndABadJobIsListedWithTheKeyNamed) {
  const std::string dir = HostileFreshDir("hostile_job_json");
  JobSubmission job;
  job.toml = "[[side_tasks]]\ntype = \"spin\"\n";
  job.name = job.type = "spin";
  ASSERT_TRUE(SubmitJob(dir, job, 100).ok());
  const json meta = {{"id", 1},         {"name", "spin"}, {"type", "spin"},
                     {"priority", 0},   {"work_s", 5.0},  {"submitted", 100.0}};
  ForEachVariant(meta, [&](const json& doc, const std::string& what) {
    SCOPED_TRACE(what);
    Write(JobDir(dir, 1) + "/job.json", doc.dump());
    absl::StatusOr<std::vector<Job>> jobs;
    EXPECT_NO_THROW(jobs = LoadJobs(dir));
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);  // a bad job is still there to cancel
    EXPECT_NO_THROW(ReadSubmittedJob(dir, 1).IgnoreError());
    EXPECT_NO_THROW(JobToJson(jobs->front()).dump());
  });
  // What `freeride submit --work inf` used to leave: a null work_s.
  Write(JobDir(dir, 1) + "/job.json", R"({"id": 1, "name": "spin", "work_s": null})");
  absl::StatusOr<Job> read = ReadSubmittedJob(dir, 1);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(),
              HasSubstr("jobs/1/job.json: \"work_s\": expected a finite number >= 0, found null"));
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(dir);
  ASSERT_TRUE(jobs.ok());
  EXPECT_THAT(jobs->front().invalid, HasSubstr("\"work_s\""));
  Write(JobDir(dir, 1) + "/job.json", R"({"id": 1, "priority": "high"})");
  EXPECT_THAT(ReadSubmittedJob(dir, 1).status().message(),
              HasSubstr("\"priority\": expected an integer, found a string (\"high\")"));
}

TEST(HostileDocumentsTest, JobRecordsAndProgressNeverThrow) {
  const std::string dir = HostileFreshDir("hostile_jobs_jsonl");
  JobSubmission job;
  job.toml = "[[side_tasks]]\ntype = \"spin\"\n";
  job.name = job.type = "spin";
  ASSERT_TRUE(SubmitJob(dir, job, 100).ok());
  const json record = {{"id", 1},      {"state", "RUNNING"}, {"time", 101.0}, {"step", 4},
                       {"stages", {0}}, {"reason", "placed"}, {"steps", 3},    {"units", 2.0},
                       {"unit", "spins"}, {"bubble_s", 0.1},  {"alone_s", 0.2}, {"eta_s", 5.0}};
  const std::string log = dir + "/jobs.jsonl";
  ForEachVariant(record, [&](const json& doc, const std::string& what) {
    SCOPED_TRACE(what);
    Write(log, doc.dump() + "\n" + record.dump() + "\n");
    Write(JobDir(dir, 1) + "/progress.jsonl", doc.dump() + "\n");
    Write(JobDir(dir, 1) + "/instance_r000.json", doc.dump());
    absl::StatusOr<std::vector<Job>> jobs;
    EXPECT_NO_THROW(jobs = LoadJobs(dir));
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    EXPECT_NO_THROW(ReadJobProgress(dir, 1));
    EXPECT_NO_THROW(WriteJobStatus(dir, jobs->front()).IgnoreError());
  });
}

TEST(HostileDocumentsTest, ManifestNeverThrowsAndNamesTheKey) {
  const std::string dir = HostileFreshDir("hostile_manifest");
  Write(dir + "/model.bin", "weights");
  const json manifest = {
      {"format", "freeride-checkpoint"},
      {"version", 3},
      {"step", 10},
      {"pp", 1},
      {"dp", 1},
      {"chunks", 1},
      {"model", {{"n_layer", 2}, {"n_head", 2}}},
      {"files", {"state_r000.bin"}},
      {"checksums", {{"model.bin", {{"bytes", 7}, {"crc32c", "00000000"}}}}}};
  ForEachVariant(manifest, [&](const json& doc, const std::string& what) {
    SCOPED_TRACE(what);
    Write(dir + "/manifest.json", doc.dump());
    EXPECT_NO_THROW(VerifyCheckpoint(dir).status().IgnoreError());
    EXPECT_NO_THROW(VerifyCheckpointFile(dir, "model.bin").IgnoreError());
  });
  Write(dir + "/manifest.json", R"({"format": 5})");
  EXPECT_THAT(VerifyCheckpoint(dir).status().message(),
              HasSubstr("manifest.json: not a freeride checkpoint manifest (" + dir +
                        "/manifest.json: \"format\": expected a string, found the number 5)"));
}

TEST(HostileDocumentsTest, ManifestNamesAreConfinedToTheCheckpointDirectory) {
  const std::string dir = HostileFreshDir("hostile_manifest_names/ckpt");
  Write(fs::path(dir).parent_path().string() + "/outside", "secret");
  for (const std::string name : {"../outside", "../../../../etc/hostname", "/etc/hostname", "..",
                                 ".", "a/../../outside", ""}) {
    SCOPED_TRACE(name);
    const json manifest = {{"format", "freeride-checkpoint"},
                           {"checksums", {{name, {{"bytes", 6}, {"crc32c", "00000000"}}}}}};
    Write(dir + "/manifest.json", manifest.dump());
    absl::StatusOr<std::vector<FileVerdict>> verdicts = VerifyCheckpoint(dir);
    ASSERT_FALSE(verdicts.ok()) << "read " << name << " outside the checkpoint";
    EXPECT_THAT(verdicts.status().message(),
                HasSubstr("is not the name of a file in the checkpoint directory"));
  }
}

TEST(HostileDocumentsTest, RunFilesForTheReportNeverThrow) {
  const std::string dir = HostileFreshDir("hostile_report");
  Write(dir + "/config.toml", "[data]\ntrain = \"x.bin\"\n");
  const std::vector<json> metrics = {
      {{"kind", "start"}, {"step", 0}, {"time", "2026-11-26T10:00:00Z"}, {"devices", 2},
       {"peak_flops_per_device", 1e12}, {"flops_per_step", 1e9}},
      {{"kind", "train"}, {"step", 2}, {"loss", 10.5}, {"lr", 1e-4}, {"grad_norm", 2.0},
       {"step_s", 0.3}, {"tokens_per_s", 100.0}, {"tokens", 512}, {"mfu", 0.1},
       {"bubble_s", {0.1, 0.2}}, {"host_peak_bytes", {1e6, 2e6}}, {"device_bytes", {1, 2}},
       {"elapsed_s", 3.0}, {"harvesting", true}, {"stage", 0}},
      {{"kind", "val"}, {"step", 2}, {"loss", 10.8}},
      {{"kind", "bubble"}, {"step", 2}, {"stage", 1}, {"index", 3}, {"bubble_kind", "steady"},
       {"predicted_s", nullptr}, {"measured_s", 0.01}, {"harvested_s", 0.005}},
      {{"kind", "harvest"}, {"step", 2}, {"stage", 0}, {"bubble_s", 1.0}, {"harvested_s", 0.5},
       {"utilisation", 0.5}, {"overrun_s", 0.0},
       {"by_kind", {{"steady", {{"bubble_s", 1.0}, {"prediction_error_s", {0.1, 0.2}}}}}}},
      {{"kind", "harvest_summary"}, {"step", 2}, {"overhead", 0.01},
       {"overhead_ci", {0.0, 0.02}}, {"reclaimed", 0.5}},
      {{"kind", "end"}, {"step", 2}, {"status", "failed"}, {"reason", "x"}}};
  const json run_info = {{"command", {"freeride", "train"}}, {"overrides", {"a.b=1"}},
                         {"host", "h"}, {"commit", "abc"}, {"version", "1"},
                         {"time", "2026-11-26T10:00:00Z"}, {"config_file", "c.toml"}};
  const json side_task = {{"rank", 0}, {"stage", 0}, {"name", "pr"}, {"type", "pagerank"},
                          {"isolation", "process"}, {"state", "FAILED"}, {"steps", 3},
                          {"units", 2.0}, {"unit", "iters"}, {"harvested_s", 0.1},
                          {"overruns", 1}, {"overrun_s", 0.01}, {"restarts", 0},
                          {"reason", "r"}, {"summary", "s"}};
  const json study = {{"rounds", 2}, {"block_steps", 4}, {"noise_floor", 0.01},
                      {"arms", {{{"arm", "freeride"}, {"steps", 8}, {"step_s", 0.3},
                                 {"overhead", 0.01}, {"overhead_ci", {0.0, 0.02}},
                                 {"refused", "no"}, {"bubble_s", 1.0}}}}};
  const json trace = {{"traceEvents", {{{"name", "F"}, {"ph", "X"}, {"tid", 0}, {"pid", 0}}}},
                      {"otherData", {{"rank", 0}, {"stage", 0}}}};
  auto render = [&] {
    absl::StatusOr<RunFiles> run;
    EXPECT_NO_THROW(run = LoadRunFiles(dir));
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_NO_THROW(RenderReport(*run));
    EXPECT_NO_THROW(MergedTrace(*run));
    for (const json& row : run->metrics) EXPECT_NO_THROW(ScalarsOfMetricsRow(row));
  };
  auto all_metrics = [&](size_t replaced, const json& with) {
    std::string text;
    for (size_t i = 0; i < metrics.size(); ++i) {
      absl::StrAppend(&text, (i == replaced ? with : metrics[i]).dump(), "\n");
    }
    return text;
  };
  Write(dir + "/run.json", run_info.dump());
  Write(dir + "/study.json", study.dump());
  Write(dir + "/timeline_rank000.json", trace.dump());
  Write(dir + "/side_tasks_rank000.jsonl", side_task.dump() + "\n");
  for (size_t m = 0; m < metrics.size(); ++m) {
    ForEachVariant(metrics[m], [&](const json& doc, const std::string& what) {
      SCOPED_TRACE(absl::StrCat(metrics[m]["kind"].get<std::string>(), what));
      Write(dir + "/metrics.jsonl", all_metrics(m, doc));
      render();
    });
  }
  Write(dir + "/metrics.jsonl", all_metrics(metrics.size(), json()));
  const std::vector<std::pair<std::string, json>> others = {
      {"run.json", run_info}, {"study.json", study}, {"timeline_rank000.json", trace},
      {"side_tasks_rank000.jsonl", side_task}};
  for (const auto& [file, doc] : others) {
    ForEachVariant(doc, [&](const json& variant, const std::string& what) {
      SCOPED_TRACE(file + what);
      Write(dir + "/" + file, variant.dump() + "\n");
      render();
    });
    Write(dir + "/" + file, doc.dump() + "\n");
  }
}

TEST(HostileDocumentsTest, ServeRequestBodiesNeverThrow) {
  using serve::Endpoint;
  const json completion = {{"model", "m"}, {"prompt", {"a", "b"}}, {"max_tokens", 4},
                           {"temperature", 0.5}, {"top_k", 4}, {"seed", 1}, {"n", 1},
                           {"stream", true}, {"stream_options", {{"include_usage", true}}},
                           {"stop", {"x"}}, {"top_p", 1}, {"user", "u"}};
  json chat = completion;
  chat.erase("prompt");
  chat["messages"] = {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}},
                      {{"role", "system"}, {"content", "be brief"}}};
  serve::ParseLimits limits;
  limits.model_name = "m";
  for (const auto& [endpoint, body] :
       {std::pair{Endpoint::kCompletions, completion}, std::pair{Endpoint::kChat, chat}}) {
    ForEachVariant(
        body,
        [&](const json& doc, const std::string& what) {
          SCOPED_TRACE(what);
          serve::ParsedRequest parsed;
          EXPECT_NO_THROW(serve::ParseRequest(endpoint, doc.dump(), limits, &parsed));
        },
        /*depth=*/4);
  }
}

}  // namespace
}  // namespace freeride
