// Fill jobs in a running training (docs/side_tasks.md#fill-jobs). At every step boundary the
// leader reads the run directory's queue (job_store.h); the ranks learn of a job offered, of a
// cancellation and of each other's progress through values added to the sum Trainer::Step
// already makes, plus, when a job is offered, one broadcast of its spec and one sum of what
// each stage found. A job offered is created, loaded and calibrated by the SideTaskExecutor of
// every rank of the stages it may run on (the isolation, deadlines, memory caps and failure
// rules of configured tasks) and kept where its memory and its step fit (job_placement.h);
// nothing else changes for training, whose losses stay bit for bit those of a run without
// jobs. The leader records each change of state in jobs.jsonl.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "freeride/executor.h"
#include "pipeline/comm/transport.h"
#include "pipeline/stage_executor.h"
#include "trainer/config/config.h"
#include "trainer/jobs/job_placement.h"
#include "trainer/jobs/job_policy.h"
#include "trainer/jobs/job_store.h"

namespace freeride {

class JobRunner {
 public:
  struct Options {
    const Config* config = nullptr;            // the run's (not owned)
    pipeline::Transport* transport = nullptr;  // (not owned)
    pipeline::RankLayout layout;
    bool leader = false;                   // reads the queue and writes the records
    SideTaskExecutor* executor = nullptr;  // this rank's (not owned)
    // This rank's memory plan (trainer/rank_memory.h): its share of the device's memory and
    // training's planned peak there; a job's memory must fit runtime.memory_fraction of the
    // one less the other (and the limits of the side work hosted already), and the memory free
    // now. device_bytes 0: the memory free now only.
    int64_t device_bytes = 0;
    int64_t planned_peak_bytes = 0;
  };
  // Pending jobs are first offered after this step: by then every stage has measured the
  // bubbles it predicts (step 1 places them from measured costs, step 2 measures them).
  static constexpr int64_t kFirstOfferStep = 2;

  // On the leader: loads the queue and queues again the jobs that a stopped or killed run
  // left PLACED or RUNNING.
  static absl::StatusOr<std::unique_ptr<JobRunner>> Create(const Options& options);

  // How many values this rank adds to the step's sum (the same on every rank).
  size_t exchange_size() const { return 1 + kJobFields * active_.size(); }
  // Before the sum, after step `step`: the leader's offer of the next pending job (its spec's
  // length) and cancellations; every rank's progress of the jobs it hosts.
  absl::Status Fill(int64_t step, double* values);
  // After the sum, on every rank alike: jobs that ended are recorded, and the job offered, if
  // any, is placed (collective: a broadcast of its spec and a sum of what each stage found).
  absl::Status Apply(int64_t step, const double* summed);
  // The training ends or stops after `step`: a last exchange, then every job still placed or
  // running is queued again (PENDING, reason `why`), to start afresh in the next run here.
  absl::Status Finish(int64_t step, const std::string& why);

 private:
  // Per job in the step's sum: cancel, steps, units, bubble_s, alone_s, started, finished,
  // failed instances, total units.
  static constexpr size_t kJobFields = 9;
  struct Active {
    int64_t id = 0;
    int task = -1;  // its executor id on this rank; -1: not hosted here
    int instances = 0;
    int64_t memory_bytes = 0;  // its memory_limit
    bool reported = false;     // this rank wrote its instance's end
    // On the leader:
    Job job;
    std::vector<ProgressPoint> rate;  // its work at recent steps, oldest first
    double progress_written_s = 0;
  };

  explicit JobRunner(const Options& options) : options_(options) {}
  const std::string& run_dir() const { return options_.config->run.dir; }
  // The leader's view of the queue: new submissions, cancellations of pending jobs.
  void ReadQueue(int64_t step);
  void Record(Job& job, JobState state, int64_t step, const std::string& reason);
  void WriteInstance(int64_t id, const TaskReport& report, const std::string& state,
                     const std::string& reason);
  absl::Status Place(int64_t step, int64_t bytes);
  // What this rank is to offer a job: the plan's room for side work, bounded by free memory.
  StageRoom MemoryRoom() const;
  absl::Status Barrier();
  // The leader's view of a placed job's work after `step`, appended to its progress series at
  // most once a second, and once as it ends.
  void UpdateProgress(Active& job, int64_t step, const double* fields, bool ended);
  // Why the job's failed instances failed, from their reports.
  std::string FailureReason(int64_t id) const;

  Options options_;
  JobPolicy policy_ = JobPolicy::kFifo;
  std::vector<Active> active_;  // in placement order, the same on every rank
  bool finishing_ = false;
  // On the leader:
  std::map<int64_t, Job> pending_;
  int64_t last_id_ = 0;
  std::string offer_;  // the spec offered in this step's sum
};

}  // namespace freeride
