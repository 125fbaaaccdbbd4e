// Fill jobs in a run directory: what `freeride submit`, `jobs` and `cancel` and the training's
// leader share (docs/side_tasks.md#fill-jobs). A job is the directory RUN_DIR/jobs/ID/ (job.toml:
// its [[side_tasks]] table as submitted; job.json: its name, type, class, priority, estimated work
// and submission time), made whole elsewhere and renamed into place, so that submissions at the
// same moment never share an id and nobody sees half a job. Every change of a job's state is a line
// of RUN_DIR/jobs.jsonl, appended by a single write (O_APPEND: whole lines, whoever writes). A
// cancellation asked of a running training is the file jobs/ID/cancel; the leader appends the
// job's work to jobs/ID/progress.jsonl as it runs and writes jobs/ID/status.json when it ends.
// What the job's task writes goes to jobs/ID/<name>_r<rank>/.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

enum class JobState { kPending, kPlaced, kRunning, kFinished, kFailed, kCancelled, kRefused };
const char* JobStateName(JobState state);
std::optional<JobState> JobStateFromName(absl::string_view name);
// FINISHED, FAILED, CANCELLED and REFUSED: nothing happens to the job any more.
bool IsTerminal(JobState state);

// What a job's work has come to, summed over the ranks that host it.
struct JobProgress {
  int64_t steps = 0;    // steps run inside bubbles
  double units = 0;     // units of work they did
  std::string unit;     // what a unit is ("spins", "images")
  double bubble_s = 0;  // bubble time those steps used
  double alone_s = 0;   // the same work in seconds of the job run alone (its calibration)
  double total_units = 0;  // the units it comes to when done (SideTask::TotalUnits); 0: unknown
  double eta_s = -1;    // estimated time to finish from the recent rate; < 0: unknown
};

// A job's work at one moment of wall time: what its time left is measured over.
struct ProgressPoint {
  double time_s = 0, units = 0, alone_s = 0;
};

// The time `p` needs to finish at the rate of `window` (oldest first, the newest `p`'s own
// point): with a total (SideTask::TotalUnits), the units left over the units' rate; else, with
// the submitter's `work_s` (--work), that less the work done over the alone-seconds' rate.
// < 0: unknown (no rate yet, or neither a total nor --work).
double EstimateTimeLeft(const std::vector<ProgressPoint>& window, const JobProgress& p,
                        double work_s);

struct JobSubmission {
  std::string toml;  // the job file as submitted
  std::string name, type;
  std::string task_class;  // SideTaskClassName: "latency" or "throughput"
  int64_t priority = 0;
  double work_s = 0;  // the submitter's estimate of its work, in seconds alone; 0: unknown
};

// A job as the run directory tells it.
struct Job {
  int64_t id = 0;
  std::string name, type;
  std::string task_class;  // "latency" or "throughput"; "" in a job.json from before classes
  int64_t priority = 0;
  double work_s = 0;
  double submitted_s = 0;  // wall-clock (Unix) seconds
  JobState state = JobState::kPending;
  std::vector<int> stages;  // where it runs or ran
  std::string reason;       // of the last change: a refusal, failure, requeue, placement
  int64_t step = -1;        // the training step of the last change (-1: none yet)
  double updated_s = 0;     // wall-clock seconds of the last change
  bool cancel_requested = false;
  JobProgress progress;
  // Why its job.json could not be read (a wrong type, a value out of range); empty when it
  // was. Such a job is listed, can be cancelled, and a training refuses it.
  std::string invalid;
};

// One line of jobs.jsonl.
struct JobRecord {
  int64_t id = 0;
  JobState state = JobState::kPending;
  double time_s = 0;  // wall-clock seconds
  int64_t step = -1;
  std::vector<int> stages;
  std::string reason;
  std::optional<JobProgress> progress;
};

// What the times of jobs are on: wall-clock (Unix) seconds, the same in every process.
double WallClockSeconds();

std::string JobDir(const std::string& run_dir, int64_t id);

// Queues `job` in `run_dir` with the next free id (returned) and a PENDING record.
absl::StatusOr<int64_t> SubmitJob(const std::string& run_dir, const JobSubmission& job,
                                  double now_s);
absl::Status AppendJobRecord(const std::string& run_dir, const JobRecord& record);

// The ids of every job in `run_dir`, ascending.
std::vector<int64_t> ListJobIds(const std::string& run_dir);
// Job `id` as submitted (PENDING, no records read).
absl::StatusOr<Job> ReadSubmittedJob(const std::string& run_dir, int64_t id);
// Every job with its records folded in order (a line cut short by a kill, or with a value of
// the wrong type, is skipped), its progress and whether a cancellation was asked. NotFound when
// `run_dir` is not a directory.
absl::StatusOr<std::vector<Job>> LoadJobs(const std::string& run_dir);
absl::StatusOr<std::string> ReadJobToml(const std::string& run_dir, int64_t id);

absl::Status RequestCancel(const std::string& run_dir, int64_t id);
bool CancelRequested(const std::string& run_dir, int64_t id);

// The job's work at training step `step`, appended to jobs/ID/progress.jsonl (the leader does,
// at most once a second while the job runs, and once as it ends); and that series, in order.
absl::Status AppendJobProgress(const std::string& run_dir, int64_t id, int64_t step,
                               const JobProgress& progress);
std::vector<std::pair<int64_t, JobProgress>> ReadJobProgress(const std::string& run_dir,
                                                             int64_t id);
// What the rank that hosted an instance of job `id` says of it when it ends (jobs/ID/
// instance_rNNN.json: state, reason, steps, ...), and every such report, by rank.
absl::Status WriteJobInstance(const std::string& run_dir, int64_t id, int rank,
                              const nlohmann::ordered_json& instance);
std::vector<nlohmann::ordered_json> ReadJobInstances(const std::string& run_dir, int64_t id);
// jobs/ID/status.json: the job as it ended, with its instances' reports.
absl::Status WriteJobStatus(const std::string& run_dir, const Job& job);

// A job as `freeride jobs --format json` and status.json give it.
nlohmann::ordered_json JobToJson(const Job& job);

}  // namespace freeride
