#include "trainer/cli/cmd_jobs.h"

#include <cmath>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/run_lock.h"
#include "trainer/cli/cli.h"
#include "trainer/config/config.h"
#include "trainer/config/side_task_check.h"
#include "trainer/jobs/job_store.h"
#include "trainer/rank_memory.h"

namespace freeride {
namespace {

int FailJobs(const absl::Status& status) {
  for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
    std::cerr << "error: " << line << "\n";
  }
  return kExitFailure;
}

int Usage(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return kExitUsage;
}

// A run directory that is not there is bad usage (exit 2), not an empty queue.
int FailLoading(const absl::Status& status) {
  return absl::IsNotFound(status) ? Usage(std::string(status.message())) : FailJobs(status);
}

// A directory that holds no run is bad usage too: its empty queue would read as "no jobs".
// A run directory has the config.toml that `freeride train` writes before anything else, and
// `submit` takes no other.
absl::Status CheckRunDir(const std::string& run_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(run_dir, ": no such run directory"));
  }
  if (!std::filesystem::exists(std::filesystem::path(run_dir) / "config.toml", ec)) {
    return absl::NotFoundError(
        absl::StrCat(run_dir,
                     " holds no run (no config.toml): a run directory is the run.dir of "
                     "`freeride train`"));
  }
  return absl::OkStatus();
}

// --work's bound: a year of work, far beyond any fill job, and far inside a double's range.
constexpr double kMaxWorkS = 365.0 * 24 * 3600;

// The run a job goes to, by the effective config `freeride train` wrote in its directory.
absl::StatusOr<Config> ConfigOfRun(const std::string& run_dir) {
  const std::string path = run_dir + "/config.toml";
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  absl::StatusOr<Config> config = LoadConfigFile(path);
  if (!config.ok() && absl::IsNotFound(config.status())) {
    return absl::NotFoundError(absl::StrCat(
        run_dir, " holds no config.toml: a run directory is one that `freeride train` wrote"));
  }
  return config;
}

std::string Duration(double s) {
  if (s < 0) return "-";
  if (s < 60) return absl::StrFormat("%.0fs", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", int(s) / 60, int(s) % 60);
  return absl::StrFormat("%dh%02dm", int(s) / 3600, int(s) / 60 % 60);
}

std::string JobsTable(const std::vector<Job>& jobs) {
  std::string out = absl::StrFormat("%-4s %-16s %-10s %-10s %-9s %-7s %8s %-18s %9s %7s  %s\n",
                                    "ID", "NAME", "TYPE", "CLASS", "STATE", "STAGES", "STEPS",
                                    "UNITS", "BUBBLE_S", "ETA", "REASON");
  for (const Job& job : jobs) {
    const JobProgress& p = job.progress;
    absl::StrAppendFormat(
        &out, "%-4d %-16s %-10s %-10s %-9s %-7s %8d %-18s %9.3f %7s  %s%s\n", job.id, job.name,
        job.type, job.task_class.empty() ? "-" : job.task_class, JobStateName(job.state),
        job.stages.empty() ? "-" : absl::StrJoin(job.stages, ","), p.steps,
        absl::StrFormat("%.6g%s %s", p.units,
                        p.total_units > 0 ? absl::StrFormat("/%.6g", p.total_units) : "",
                        p.unit.empty() ? "units" : p.unit),
        p.bubble_s, IsTerminal(job.state) ? "-" : Duration(p.eta_s),
        job.cancel_requested && !IsTerminal(job.state) ? "(cancel requested) " : "",
        job.invalid.empty() || IsTerminal(job.state) ? job.reason : job.invalid);
  }
  return out;
}

}  // namespace

std::vector<FlagSpec> SubmitFlags() {
  return {{"name", "N", "the job's name (default: the table's name, else its type)"},
          {"priority", "P", "its priority, an integer (default: the table's, else 0)"},
          {"work", "SECONDS",
           "an estimate of its work in seconds of it running alone: what "
           "job_policy = \"shortest_first\" orders by, and the time to finish is estimated from"}};
}

int SubmitCommand(const ParsedFlags& flags) {
  if (flags.positional().size() != 2) return Usage("submit takes RUN_DIR and JOB.toml");
  const std::string run_dir = flags.positional()[0], path = flags.positional()[1];
  int64_t priority = 0;
  double work = 0;
  if (flags.Has("priority") && !absl::SimpleAtoi(flags.Get("priority"), &priority)) {
    return Usage(
        absl::StrCat("--priority: expected an integer, found '", flags.Get("priority"), "'"));
  }
  // Finite: job.json must hold a number every reader takes (nlohmann writes inf as null).
  if (flags.Has("work") && (!absl::SimpleAtod(flags.Get("work"), &work) || !std::isfinite(work) ||
                            !(work > 0) || work > kMaxWorkS)) {
    return Usage(absl::StrFormat("--work: expected seconds, a number > 0 and at most %g, found '%s'",
                                 kMaxWorkS, flags.Get("work")));
  }
  if (flags.Has("name") && !IsPlainName(flags.Get("name"))) {
    return Usage(
        absl::StrCat("--name: expected letters, digits, '_', '-' and '.', not starting "
                     "with '.' or '-', at most 64 characters (it names files), found '",
                     flags.Get("name"), "'"));
  }
  absl::StatusOr<Config> run = ConfigOfRun(run_dir);
  if (!run.ok()) return FailJobs(run.status());
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return FailJobs(s);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return FailJobs(text.status());
  // Its table reaches every rank in one broadcast (a value a byte): a task's table is small.
  constexpr size_t kMaxJobFileBytes = 64 << 10;
  if (text->size() > kMaxJobFileBytes) {
    return FailJobs(absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes; a job file holds one [[side_tasks]] table of at most %d bytes (put large "
        "inputs in files its arguments name)",
        path, text->size(), kMaxJobFileBytes)));
  }
  // Checked as `config check` checks a task: its keys, then built as the training would.
  absl::StatusOr<SideTaskConfig> task = ParseSideTaskFile(*text, path, *run);
  if (!task.ok()) return FailJobs(task.status());
  if (flags.Has("name")) task->name = flags.Get("name");
  if (flags.Has("priority")) task->priority = priority;
  Config check = *run;
  check.side_tasks = {*task};
  std::vector<std::string> warnings, classes;
  absl::Status built = ValidateSideTasks(check, &warnings, &classes, PlannedSideRooms(check));
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
  if (!built.ok()) return FailJobs(built);
  if (!run->freeride.enabled || !run->freeride.jobs) {
    std::cerr << "warning: " << run_dir << "'s run has freeride."
              << (run->freeride.enabled ? "jobs" : "enabled")
              << " = false: the job waits for a run there that takes jobs\n";
  }
  JobSubmission job;
  job.toml = *text;
  job.name = task->name;
  job.type = task->type;
  // As its host said when built above (in its worker, where isolated); shown by `freeride jobs`.
  job.task_class = classes.empty() ? "" : classes[0];
  job.priority = task->priority;
  job.work_s = work;
  absl::StatusOr<int64_t> id = SubmitJob(run_dir, job, WallClockSeconds());
  if (!id.ok()) return FailJobs(id.status());
  std::cerr << absl::StrFormat("job %d '%s' (%s) PENDING in %s\n", *id, job.name, job.type,
                               JobDir(run_dir, *id));
  std::cout << *id << "\n";
  return kExitOk;
}

std::vector<FlagSpec> JobsFlags() {
  return {{"format", "text|json", "a table (default), or a JSON array of the jobs"}};
}

int JobsCommand(const ParsedFlags& flags) {
  if (flags.positional().size() != 1) return Usage("jobs takes one RUN_DIR");
  const std::string format = flags.Get("format", "text");
  if (format != "text" && format != "json") {
    return Usage(absl::StrCat("--format: expected text or json, found '", format, "'"));
  }
  if (absl::Status s = CheckRunDir(flags.positional()[0]); !s.ok()) return FailLoading(s);
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(flags.positional()[0]);
  if (!jobs.ok()) return FailLoading(jobs.status());
  for (const Job& job : *jobs) {
    if (!job.invalid.empty() && !IsTerminal(job.state)) {
      std::cerr << "warning: job " << job.id << ": " << job.invalid
                << " (a training refuses it; `freeride cancel` ends it)\n";
    }
  }
  if (format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Job& job : *jobs) out.push_back(JobToJson(job));
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << JobsTable(*jobs);
  }
  return kExitOk;
}

int CancelCommand(const ParsedFlags& flags) {
  if (flags.positional().size() != 2) return Usage("cancel takes RUN_DIR and a job ID");
  const std::string run_dir = flags.positional()[0];
  int64_t id = 0;
  if (!absl::SimpleAtoi(flags.positional()[1], &id) || id < 1) {
    return Usage(absl::StrCat("cancel: expected a job ID (an integer >= 1), found '",
                              flags.positional()[1], "'"));
  }
  if (absl::Status s = CheckRunDir(run_dir); !s.ok()) return FailLoading(s);
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(run_dir);
  if (!jobs.ok()) return FailLoading(jobs.status());
  auto job = std::find_if(jobs->begin(), jobs->end(), [&](const Job& j) { return j.id == id; });
  if (job == jobs->end()) {
    return FailJobs(absl::NotFoundError(absl::StrFormat("no job %d in %s/jobs", id, run_dir)));
  }
  if (IsTerminal(job->state)) {
    return FailJobs(absl::FailedPreconditionError(
        absl::StrFormat("job %d is %s already", id, JobStateName(job->state))));
  }
  // No training holds the run directory: nobody else changes the job, so it ends here.
  if (absl::StatusOr<DirectoryLock> lock = DirectoryLock::Acquire(run_dir); lock.ok()) {
    JobRecord record;
    record.id = id;
    record.state = JobState::kCancelled;
    record.time_s = WallClockSeconds();
    record.step = job->step;
    record.reason = "cancelled while no training ran";
    record.progress = job->progress;
    if (absl::Status s = AppendJobRecord(run_dir, record); !s.ok()) return FailJobs(s);
    job->state = record.state;
    job->reason = record.reason;
    job->updated_s = record.time_s;
    if (absl::Status s = WriteJobStatus(run_dir, *job); !s.ok()) return FailJobs(s);
    std::cout << absl::StrFormat("job %d CANCELLED\n", id);
    return kExitOk;
  }
  if (absl::Status s = RequestCancel(run_dir, id); !s.ok()) return FailJobs(s);
  std::cout << absl::StrFormat(
      "job %d: cancellation requested; the training in %s ends it at its next step boundary\n", id,
      run_dir);
  return kExitOk;
}

}  // namespace freeride
