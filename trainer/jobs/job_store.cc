#include "trainer/jobs/job_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/logging.h"

namespace freeride {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// The reason of the record `freeride submit` appends. It lands after the rename that makes the
// job visible, so the leader may have placed the job before it: it never takes a job back.
constexpr char kSubmitted[] = "submitted";

constexpr const char* kStateNames[] = {"PENDING", "PLACED",    "RUNNING", "FINISHED",
                                       "FAILED",  "CANCELLED", "REFUSED"};

std::string JobsDir(const std::string& run_dir) { return (fs::path(run_dir) / "jobs").string(); }
std::string JobsLog(const std::string& run_dir) {
  return (fs::path(run_dir) / "jobs.jsonl").string();
}

void ProgressToJson(const JobProgress& p, ordered_json* out) {
  (*out)["steps"] = p.steps;
  (*out)["units"] = p.units;
  (*out)["unit"] = p.unit;
  (*out)["bubble_s"] = p.bubble_s;
  (*out)["alone_s"] = p.alone_s;
}

void ProgressFromJson(const json& in, JobProgress* p) {
  p->steps = in.value("steps", p->steps);
  p->units = in.value("units", p->units);
  p->unit = in.value("unit", p->unit);
  p->bubble_s = in.value("bubble_s", p->bubble_s);
  p->alone_s = in.value("alone_s", p->alone_s);
  p->eta_s = in.value("eta_s", p->eta_s);
}

// The JSON object in `path`, or a discarded value when it is missing or does not parse.
json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return json(json::value_t::discarded);
  return json::parse(*text, nullptr, /*allow_exceptions=*/false);
}

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// One write: with O_APPEND the kernel places the whole line at the end, whoever else appends
// at the same moment (the leader, a submitter).
absl::Status AppendLine(const std::string& path, const std::string& line) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open " + path);
  const ssize_t n = write(fd, line.data(), line.size());
  const int error = errno;
  close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    errno = n < 0 ? error : EIO;
    return ErrnoError("cannot append to " + path);
  }
  return absl::OkStatus();
}

std::string ProgressLog(const std::string& run_dir, int64_t id) {
  return JobDir(run_dir, id) + "/progress.jsonl";
}

}  // namespace

const char* JobStateName(JobState state) { return kStateNames[static_cast<int>(state)]; }

std::optional<JobState> JobStateFromName(absl::string_view name) {
  for (int s = 0; s < static_cast<int>(std::size(kStateNames)); ++s) {
    if (name == kStateNames[s]) return static_cast<JobState>(s);
  }
  return std::nullopt;
}

bool IsTerminal(JobState state) {
  return state == JobState::kFinished || state == JobState::kFailed ||
         state == JobState::kCancelled || state == JobState::kRefused;
}

double WallClockSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string JobDir(const std::string& run_dir, int64_t id) {
  return (fs::path(JobsDir(run_dir)) / absl::StrCat(id)).string();
}

absl::StatusOr<int64_t> SubmitJob(const std::string& run_dir, const JobSubmission& job,
                                  double now_s) {
  const std::string jobs = JobsDir(run_dir);
  if (absl::Status s = MakeDirectories(jobs); !s.ok()) return s;
  // Made whole under a name of its own, then renamed to the first free id: rename(2) refuses
  // a directory that exists (and is not empty, as every job's is), so two submitters that
  // pick the same id find out, and the later tries the next.
  std::string staging = (fs::path(jobs) / ".submit-XXXXXX").string();
  if (mkdtemp(staging.data()) == nullptr) return ErrnoError("cannot create " + staging);
  auto discard = [&](absl::Status s) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    return s;
  };
  const std::vector<int64_t> ids = ListJobIds(run_dir);
  int64_t id = ids.empty() ? 1 : ids.back() + 1;
  ordered_json meta = {{"id", id},
                       {"name", job.name},
                       {"type", job.type},
                       {"class", job.task_class},
                       {"priority", job.priority},
                       {"work_s", job.work_s},
                       {"submitted", now_s}};
  for (;; ++id) {
    meta["id"] = id;
    if (absl::Status s = WriteFileAtomically(staging + "/job.toml", job.toml); !s.ok()) {
      return discard(s);
    }
    if (absl::Status s = WriteFileAtomically(staging + "/job.json", meta.dump(2) + "\n"); !s.ok()) {
      return discard(s);
    }
    if (std::rename(staging.c_str(), JobDir(run_dir, id).c_str()) == 0) break;
    if (errno != EEXIST && errno != ENOTEMPTY) {
      return discard(ErrnoError("cannot rename " + staging + " to " + JobDir(run_dir, id)));
    }
  }
  JobRecord record;
  record.id = id;
  record.state = JobState::kPending;
  record.time_s = now_s;
  record.reason = kSubmitted;
  if (absl::Status s = AppendJobRecord(run_dir, record); !s.ok()) return s;
  return id;
}

absl::Status AppendJobRecord(const std::string& run_dir, const JobRecord& record) {
  ordered_json line = {{"id", record.id},         {"state", JobStateName(record.state)},
                       {"time", record.time_s},   {"step", record.step},
                       {"stages", record.stages}, {"reason", record.reason}};
  if (record.progress) ProgressToJson(*record.progress, &line);
  return AppendLine(JobsLog(run_dir), line.dump() + "\n");
}

std::vector<int64_t> ListJobIds(const std::string& run_dir) {
  std::vector<int64_t> ids;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(JobsDir(run_dir), ec)) {
    int64_t id = 0;
    if (e.is_directory(ec) && absl::SimpleAtoi(e.path().filename().string(), &id) && id > 0) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<Job> ReadSubmittedJob(const std::string& run_dir, int64_t id) {
  const std::string path = JobDir(run_dir, id) + "/job.json";
  const json meta = ReadJson(path);
  if (!meta.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": missing or not a JSON object"));
  }
  Job job;
  job.id = id;
  job.name = meta.value("name", "");
  job.type = meta.value("type", "");
  job.task_class = meta.value("class", "");
  job.priority = meta.value("priority", int64_t{0});
  job.work_s = meta.value("work_s", 0.0);
  job.submitted_s = meta.value("submitted", 0.0);
  job.updated_s = job.submitted_s;
  return job;
}

absl::StatusOr<std::vector<Job>> LoadJobs(const std::string& run_dir) {
  std::map<int64_t, Job> jobs;
  for (int64_t id : ListJobIds(run_dir)) {
    absl::StatusOr<Job> job = ReadSubmittedJob(run_dir, id);
    if (!job.ok()) {
      FR_LOG(WARN) << "job " << id << " left out: " << job.status().message();
      continue;
    }
    jobs[id] = *std::move(job);
  }
  if (absl::StatusOr<std::string> log = ReadFile(JobsLog(run_dir)); log.ok()) {
    std::set<int64_t> recorded;
    for (absl::string_view line : absl::StrSplit(*log, '\n', absl::SkipEmpty())) {
      const json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!r.is_object()) continue;  // cut short by a kill
      auto it = jobs.find(r.value("id", int64_t{0}));
      const std::optional<JobState> state = JobStateFromName(r.value("state", ""));
      if (it == jobs.end() || !state) continue;
      if (!recorded.insert(it->first).second && r.value("reason", "") == kSubmitted) continue;
      Job& job = it->second;
      job.state = *state;
      job.updated_s = r.value("time", job.updated_s);
      job.step = r.value("step", job.step);
      job.reason = r.value("reason", "");
      job.stages = r.value("stages", std::vector<int>{});
      ProgressFromJson(r, &job.progress);
    }
  }
  std::vector<Job> out;
  for (auto& [id, job] : jobs) {
    if (!IsTerminal(job.state)) {
      const auto series = ReadJobProgress(run_dir, id);
      if (!series.empty() && series.back().first >= job.step) job.progress = series.back().second;
      job.cancel_requested = CancelRequested(run_dir, id);
    }
    out.push_back(std::move(job));
  }
  return out;
}

absl::StatusOr<std::string> ReadJobToml(const std::string& run_dir, int64_t id) {
  return ReadFile(JobDir(run_dir, id) + "/job.toml");
}

absl::Status RequestCancel(const std::string& run_dir, int64_t id) {
  return WriteFileAtomically(JobDir(run_dir, id) + "/cancel", "");
}

bool CancelRequested(const std::string& run_dir, int64_t id) {
  std::error_code ec;
  return fs::exists(JobDir(run_dir, id) + "/cancel", ec);
}

absl::Status AppendJobProgress(const std::string& run_dir, int64_t id, int64_t step,
                               const JobProgress& progress) {
  ordered_json line = {{"step", step}, {"time", WallClockSeconds()}};
  ProgressToJson(progress, &line);
  line["eta_s"] = progress.eta_s;
  return AppendLine(ProgressLog(run_dir, id), line.dump() + "\n");
}

std::vector<std::pair<int64_t, JobProgress>> ReadJobProgress(const std::string& run_dir,
                                                             int64_t id) {
  std::vector<std::pair<int64_t, JobProgress>> series;
  absl::StatusOr<std::string> text = ReadFile(ProgressLog(run_dir, id));
  if (!text.ok()) return series;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    const json point = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!point.is_object()) continue;  // cut short by a kill
    JobProgress progress;
    ProgressFromJson(point, &progress);
    series.emplace_back(point.value("step", int64_t{-1}), progress);
  }
  return series;
}

absl::Status WriteJobInstance(const std::string& run_dir, int64_t id, int rank,
                              const ordered_json& instance) {
  return WriteFileAtomically(absl::StrFormat("%s/instance_r%03d.json", JobDir(run_dir, id), rank),
                             instance.dump(2) + "\n");
}

std::vector<ordered_json> ReadJobInstances(const std::string& run_dir, int64_t id) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(JobDir(run_dir, id), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("instance_r", 0) == 0 && e.path().extension() == ".json") {
      paths.push_back(e.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<ordered_json> instances;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) continue;
    ordered_json instance = ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (instance.is_object()) instances.push_back(std::move(instance));
  }
  return instances;
}

absl::Status WriteJobStatus(const std::string& run_dir, const Job& job) {
  ordered_json status = JobToJson(job);
  status["instances"] = ReadJobInstances(run_dir, job.id);
  return WriteFileAtomically(JobDir(run_dir, job.id) + "/status.json", status.dump(2) + "\n");
}

ordered_json JobToJson(const Job& job) {
  ordered_json out = {{"id", job.id},
                      {"name", job.name},
                      {"type", job.type},
                      {"class", job.task_class},
                      {"state", JobStateName(job.state)},
                      {"priority", job.priority},
                      {"stages", job.stages},
                      {"work_s", job.work_s},
                      {"submitted", job.submitted_s},
                      {"updated", job.updated_s},
                      {"step", job.step}};
  ProgressToJson(job.progress, &out);
  out["eta_s"] = job.progress.eta_s >= 0 ? ordered_json(job.progress.eta_s) : ordered_json();
  out["cancel_requested"] = job.cancel_requested;
  out["reason"] = job.reason;
  return out;
}

}  // namespace freeride
