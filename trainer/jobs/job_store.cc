#include "trainer/jobs/job_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
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
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"

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

// nlohmann writes inf and NaN as null, which no reader takes for a number: a task that reports
// a non-finite amount is recorded as having done none.
double Finite(double v) { return std::isfinite(v) ? v : 0.0; }

void ProgressToJson(const JobProgress& p, ordered_json* out) {
  (*out)["steps"] = p.steps;
  (*out)["units"] = Finite(p.units);
  (*out)["unit"] = p.unit;
  (*out)["bubble_s"] = Finite(p.bubble_s);
  (*out)["alone_s"] = Finite(p.alone_s);
  if (p.total_units > 0) (*out)["total_units"] = Finite(p.total_units);
}

// The progress fields of `in` (a jobs.jsonl or progress.jsonl line) over `p`. eta_s is null
// where the estimate was unknown.
absl::Status ProgressFromJson(const JsonFields& in, JobProgress* p) {
  FR_ASSIGN_OR_RETURN(p->steps, in.IntOr("steps", p->steps, 0));
  FR_ASSIGN_OR_RETURN(p->units, in.NumberOr("units", p->units));
  FR_ASSIGN_OR_RETURN(p->unit, in.StringOr("unit", p->unit));
  FR_ASSIGN_OR_RETURN(p->bubble_s, in.NumberOr("bubble_s", p->bubble_s, 0));
  FR_ASSIGN_OR_RETURN(p->alone_s, in.NumberOr("alone_s", p->alone_s, 0));
  FR_ASSIGN_OR_RETURN(p->total_units, in.NumberOr("total_units", p->total_units, 0));
  if (in.IsNull("eta_s")) {
    p->eta_s = -1;
  } else {
    FR_ASSIGN_OR_RETURN(p->eta_s, in.NumberOr("eta_s", p->eta_s));
  }
  return absl::OkStatus();
}

// The JSON object in `path`.
absl::StatusOr<json> ReadJsonObject(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseJsonObject(*text, path);
}

// One line of jobs.jsonl; `where` names it.
absl::StatusOr<JobRecord> ParseJobRecord(absl::string_view line, const std::string& where) {
  FR_ASSIGN_OR_RETURN(const json r, ParseJsonObject(line, where));
  const JsonFields f(r, where);
  JobRecord record;
  FR_ASSIGN_OR_RETURN(record.id, f.Int("id", 1));
  FR_ASSIGN_OR_RETURN(const std::string state, f.String("state"));
  const std::optional<JobState> known = JobStateFromName(state);
  if (!known) {
    return absl::DataLossError(absl::StrCat(
        where, ": \"state\": expected a job state (PENDING, PLACED, RUNNING, FINISHED, FAILED, "
               "CANCELLED or REFUSED), found \"",
        state, "\""));
  }
  record.state = *known;
  FR_ASSIGN_OR_RETURN(record.time_s, f.NumberOr("time", 0));
  FR_ASSIGN_OR_RETURN(record.step, f.IntOr("step", -1, -1));
  if (f.Has("stages")) {
    FR_ASSIGN_OR_RETURN(const std::vector<int64_t> stages,
                        f.IntArray("stages", 0, std::numeric_limits<int>::max()));
    record.stages.assign(stages.begin(), stages.end());
  }
  FR_ASSIGN_OR_RETURN(record.reason, f.StringOr("reason", ""));
  if (f.Has("steps")) {  // the submitter's record has no progress
    JobProgress progress;
    FR_RETURN_IF_ERROR(ProgressFromJson(f, &progress));
    record.progress = progress;
  }
  return record;
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

double EstimateTimeLeft(const std::vector<ProgressPoint>& window, const JobProgress& p,
                        double work_s) {
  if (window.size() < 2) return -1;
  const ProgressPoint &first = window.front(), &last = window.back();
  const double span = last.time_s - first.time_s;
  if (!(span > 0)) return -1;
  // The measured rate of the task's own units, against its own total, once it has both: a
  // --work guess is only a guess.
  const double unit_rate = (last.units - first.units) / span;
  if (p.total_units > 0 && unit_rate > 0) {
    return std::max(0.0, (p.total_units - p.units) / unit_rate);
  }
  const double rate = (last.alone_s - first.alone_s) / span;
  if (work_s > 0 && rate > 0) return std::max(0.0, (work_s - p.alone_s) / rate);
  return -1;
}

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
  FR_ASSIGN_OR_RETURN(const json meta, ReadJsonObject(path));
  const JsonFields f(meta, path);
  Job job;
  job.id = id;
  FR_ASSIGN_OR_RETURN(job.name, f.StringOr("name", ""));
  FR_ASSIGN_OR_RETURN(job.type, f.StringOr("type", ""));
  FR_ASSIGN_OR_RETURN(job.task_class, f.StringOr("class", ""));
  FR_ASSIGN_OR_RETURN(job.priority, f.IntOr("priority", 0));
  FR_ASSIGN_OR_RETURN(job.work_s, f.NumberOr("work_s", 0, 0));
  FR_ASSIGN_OR_RETURN(job.submitted_s, f.NumberOr("submitted", 0, 0));
  job.updated_s = job.submitted_s;
  return job;
}

absl::StatusOr<std::vector<Job>> LoadJobs(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(run_dir, ": no such run directory"));
  }
  std::map<int64_t, Job> jobs;
  for (int64_t id : ListJobIds(run_dir)) {
    absl::StatusOr<Job> job = ReadSubmittedJob(run_dir, id);
    if (!job.ok()) {
      // Kept, so that it can be listed and cancelled, and refused by the training.
      jobs[id].id = id;
      jobs[id].invalid = std::string(job.status().message());
      continue;
    }
    jobs[id] = *std::move(job);
  }
  const std::string log_path = JobsLog(run_dir);
  if (absl::StatusOr<std::string> log = ReadFile(log_path); log.ok()) {
    std::set<int64_t> recorded;
    const std::vector<absl::string_view> lines = absl::StrSplit(*log, '\n');
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      absl::StatusOr<JobRecord> r =
          ParseJobRecord(lines[i], absl::StrCat(log_path, " line ", i + 1));
      if (!r.ok()) {
        // The last line cut short by a kill is expected; anything else is worth a word.
        if (i + 1 < lines.size()) {
          FR_LOG(WARN) << r.status().message() << " (line skipped)";
        }
        continue;
      }
      auto it = jobs.find(r->id);
      if (it == jobs.end()) continue;
      if (!recorded.insert(it->first).second && r->reason == kSubmitted) continue;
      Job& job = it->second;
      job.state = r->state;
      job.updated_s = r->time_s;
      job.step = r->step;
      job.reason = r->reason;
      job.stages = r->stages;
      if (r->progress) job.progress = *r->progress;
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
  line["eta_s"] = std::isfinite(progress.eta_s) ? progress.eta_s : -1.0;
  return AppendLine(ProgressLog(run_dir, id), line.dump() + "\n");
}

std::vector<std::pair<int64_t, JobProgress>> ReadJobProgress(const std::string& run_dir,
                                                             int64_t id) {
  std::vector<std::pair<int64_t, JobProgress>> series;
  const std::string path = ProgressLog(run_dir, id);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return series;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    absl::StatusOr<json> point = ParseJsonObject(line, path);
    if (!point.ok()) continue;  // cut short by a kill
    const JsonFields f(*point, path);
    JobProgress progress;
    absl::StatusOr<int64_t> step = f.IntOr("step", -1, -1);
    if (!step.ok() || !ProgressFromJson(f, &progress).ok()) continue;
    series.emplace_back(*step, progress);
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
  if (!job.invalid.empty()) out["invalid"] = job.invalid;
  return out;
}

}  // namespace freeride
