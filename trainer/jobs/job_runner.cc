#include "trainer/jobs/job_runner.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/device.h"
#include "core/host_memory.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "trainer/config/side_task_check.h"
#include "trainer/jobs/job_placement.h"

namespace freeride {
namespace {

using nlohmann::ordered_json;

// Per stage in the placement's sum: took part, allowed, free bytes, longest bubble, calibrated,
// step, fills bubbles (from the stage's rank of replica 0); hosting and failed instances (from
// every rank of the stage); the memory plan's device share, fraction, training's peak and the
// side work held (replica 0's rank).
constexpr size_t kRoomFields = 13;
// How long the rate behind a job's estimated time to finish looks back.
constexpr double kRateWindowS = 60;
// A placed job's work is appended to its progress.jsonl at most this often.
constexpr double kProgressEveryS = 1;

// Memory free for side work on this rank: its share of the host's (CPU), or the device's free
// memory once training's plan is allocated (GPU).
int64_t FreeMemory(const Config& config) {
  if (config.runtime.device == "cuda") {
    const DeviceInventory devices = DiscoverDevices();
    if (devices.cuda.empty()) return 0;
    const DeviceInfo& device = devices.cuda[NodeLocalRank() % devices.cuda.size()];
    return static_cast<int64_t>(device.free_memory_bytes);
  }
  const int sharing = config.runtime.emulate_peers ? 1 : std::max(1, NodeLocalSize());
  return AvailableHostMemory().bytes / sharing;
}

std::string StagesText(const std::vector<int>& stages) { return absl::StrJoin(stages, ", "); }

}  // namespace

StageRoom JobRunner::MemoryRoom() const {
  const Config& config = *options_.config;
  StageRoom room;
  room.free_bytes = FreeMemory(config);
  if (options_.device_bytes <= 0) return room;
  room.device_bytes = options_.device_bytes;
  room.fraction = config.runtime.memory_fraction;
  room.planned_peak_bytes = options_.planned_peak_bytes;
  // What the side work here may take already: the configured tasks of this stage and the jobs
  // this rank hosts that have not ended.
  for (const SideTaskConfig& task : config.side_tasks) {
    if (task.stages.empty() || std::find(task.stages.begin(), task.stages.end(),
                                         options_.layout.stage) != task.stages.end()) {
      room.held_bytes += task.memory_limit_bytes;
    }
  }
  for (const Active& a : active_) {
    if (a.task < 0) continue;
    const TaskState state = options_.executor->task_state(a.task);
    if (state != TaskState::kFinished && state != TaskState::kFailed &&
        state != TaskState::kStopped) {
      room.held_bytes += a.memory_bytes;
    }
  }
  room.free_bytes = std::min(room.free_bytes, PlannedSideBytes(room));
  return room;
}

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(const Options& options) {
  std::unique_ptr<JobRunner> runner(new JobRunner(options));
  absl::StatusOr<JobPolicy> policy = ParseJobPolicy(options.config->freeride.job_policy);
  if (!policy.ok()) return policy.status();
  runner->policy_ = *policy;
  if (!options.leader) return runner;
  absl::StatusOr<std::vector<Job>> jobs = LoadJobs(runner->run_dir());
  if (!jobs.ok()) return jobs.status();
  for (Job& job : *jobs) {
    runner->last_id_ = std::max(runner->last_id_, job.id);
    if (IsTerminal(job.state)) continue;
    if (!job.invalid.empty()) {
      runner->Record(job, JobState::kRefused, job.step, job.invalid);
      continue;
    }
    if (job.state != JobState::kPending) {
      runner->Record(job, JobState::kPending, job.step,
                     "queued again: the training that ran it stopped before it ended");
    }
    runner->pending_[job.id] = job;
  }
  if (!runner->pending_.empty()) {
    FR_LOG(INFO) << runner->pending_.size() << " fill job(s) pending in " << runner->run_dir()
                 << "/jobs";
  }
  return runner;
}

void JobRunner::Record(Job& job, JobState state, int64_t step, const std::string& reason) {
  job.state = state;
  job.step = step;
  job.reason = reason;
  job.updated_s = WallClockSeconds();
  JobRecord record;
  record.id = job.id;
  record.state = state;
  record.time_s = job.updated_s;
  record.step = step;
  record.stages = job.stages;
  record.reason = reason;
  record.progress = job.progress;
  // The job's bookkeeping failing (a full disk) must not stop the training it rides on.
  if (absl::Status s = AppendJobRecord(run_dir(), record); !s.ok()) {
    FR_LOG(WARN) << "job " << job.id << ": " << s.message();
  }
  if (IsTerminal(state)) {
    if (absl::Status s = WriteJobStatus(run_dir(), job); !s.ok()) {
      FR_LOG(WARN) << "job " << job.id << ": " << s.message();
    }
  }
  FR_LOG(INFO) << absl::StrFormat(
      "job %d '%s' (%s) %s at step %d%s%s", job.id, job.name, job.type, JobStateName(state), step,
      job.stages.empty() || state == JobState::kPending ? ""
                                                        : " on stage(s) " + StagesText(job.stages),
      reason.empty() ? "" : ": " + reason);
}

void JobRunner::WriteInstance(int64_t id, const TaskReport& report, const std::string& state,
                              const std::string& reason) {
  const ordered_json instance = {{"rank", options_.transport->rank()},
                                 {"stage", options_.layout.stage},
                                 {"state", state},
                                 {"reason", reason},
                                 {"steps", report.steps},
                                 {"units", report.units},
                                 {"unit", report.unit},
                                 {"harvested_s", report.harvested_s},
                                 {"standalone_step_s", report.standalone_step_s},
                                 {"overrun_s", report.overrun_s},
                                 {"pauses", report.pauses},
                                 {"memory_peak_bytes", report.memory_peak_bytes},
                                 {"summary", report.summary}};
  if (absl::Status s = WriteJobInstance(run_dir(), id, options_.transport->rank(), instance);
      !s.ok()) {
    FR_LOG(WARN) << "job " << id << ": " << s.message();
  }
}

std::string JobRunner::FailureReason(int64_t id) const {
  std::vector<std::string> reasons;
  for (const ordered_json& instance : ReadJobInstances(run_dir(), id)) {
    if (JsonStringOr(instance, "state", "") != "FAILED") continue;
    reasons.push_back(absl::StrFormat("stage %d (rank %d): %s", JsonIntOr(instance, "stage", -1),
                                      JsonIntOr(instance, "rank", -1),
                                      JsonStringOr(instance, "reason", "?")));
  }
  return reasons.empty() ? "failed on a rank whose report is missing"
                         : absl::StrJoin(reasons, "; ");
}

void JobRunner::ReadQueue(int64_t step) {
  for (int64_t id : ListJobIds(run_dir())) {
    if (id <= last_id_) continue;
    last_id_ = id;
    absl::StatusOr<Job> job = ReadSubmittedJob(run_dir(), id);
    if (!job.ok()) {
      // Refused once, on the record: a damaged job never stops the training it rides on.
      Job refused;
      refused.id = id;
      Record(refused, JobState::kRefused, step, std::string(job.status().message()));
      continue;
    }
    FR_LOG(INFO) << absl::StrFormat("job %d '%s' (%s) submitted", id, job->name, job->type);
    pending_[id] = *std::move(job);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!CancelRequested(run_dir(), it->first)) {
      ++it;
      continue;
    }
    Record(it->second, JobState::kCancelled, step, "cancelled while pending");
    it = pending_.erase(it);
  }
}

absl::Status JobRunner::Fill(int64_t step, double* values) {
  if (options_.leader) {
    ReadQueue(step);
    offer_.clear();
    if (step >= kFirstOfferStep && !finishing_ && !pending_.empty()) {
      std::vector<Job> pending;
      for (const auto& [id, job] : pending_) pending.push_back(job);
      const int64_t id = PlacementOrder(pending, policy_, WallClockSeconds(),
                                        options_.config->freeride.job_age_limit_s)
                             .front();
      absl::StatusOr<std::string> toml = ReadJobToml(run_dir(), id);
      if (!toml.ok()) {
        Record(pending_[id], JobState::kFailed, step, std::string(toml.status().message()));
        pending_.erase(id);
      } else {
        // A new placement's instances report, and its work counts, afresh.
        std::error_code ec;
        for (const ordered_json& old : ReadJobInstances(run_dir(), id)) {
          std::filesystem::remove(absl::StrFormat("%s/instance_r%03d.json", JobDir(run_dir(), id),
                                                  JsonIntOr(old, "rank", -1)),
                                  ec);
        }
        std::filesystem::remove(JobDir(run_dir(), id) + "/progress.jsonl", ec);
        const Job& job = pending_[id];
        offer_ = absl::StrCat(id, "\n", job.name, "\n", job.priority, "\n", *toml);
        values[0] = static_cast<double>(offer_.size());
      }
    }
  }
  for (size_t j = 0; j < active_.size(); ++j) {
    Active& a = active_[j];
    double* v = values + 1 + kJobFields * j;
    if (options_.leader && CancelRequested(run_dir(), a.id)) v[0] = 1;
    if (a.task < 0) continue;
    const TaskReport r = options_.executor->task_report(a.task);
    const TaskState state = options_.executor->task_state(a.task);
    // A job's work includes its calibration steps: they are steps of its count.
    const double steps = static_cast<double>(r.steps + r.calibration_steps);
    const double units = r.units + r.calibration_units;
    v[1] = steps;
    v[2] = units;
    v[3] = r.harvested_s;
    v[4] = r.standalone_unit_s > 0 ? units * r.standalone_unit_s : steps * r.standalone_step_s;
    v[5] = r.steps > 0 ? 1 : 0;
    v[6] = state == TaskState::kFinished ? 1 : 0;
    v[7] = state == TaskState::kFailed ? 1 : 0;
    v[8] = r.total_units;
    // Written before the sum, so that the leader finds it once the sum says the job ended.
    if ((v[6] > 0 || v[7] > 0) && !a.reported) {
      WriteInstance(a.id, r, r.state, r.reason);
      a.reported = true;
    }
  }
  return absl::OkStatus();
}

void JobRunner::UpdateProgress(Active& a, int64_t step, const double* v, bool ended) {
  JobProgress& p = a.job.progress;
  p.steps = static_cast<int64_t>(v[1]);
  p.units = v[2];
  p.bubble_s = v[3];
  p.alone_s = v[4];
  p.total_units = v[8];
  const double now = WallClockSeconds();
  a.rate.push_back({now, p.units, p.alone_s});
  while (a.rate.size() > 2 && now - a.rate.front().time_s > kRateWindowS) {
    a.rate.erase(a.rate.begin());
  }
  p.eta_s = EstimateTimeLeft(a.rate, p, a.job.work_s);
  if (!ended && now - a.progress_written_s < kProgressEveryS) return;
  a.progress_written_s = now;
  if (absl::Status s = AppendJobProgress(run_dir(), a.id, step, p); !s.ok()) {
    FR_LOG(WARN) << "job " << a.id << ": " << s.message();
  }
}

absl::Status JobRunner::Apply(int64_t step, const double* summed) {
  // Every rank decides alike from the sums: which jobs ended, and how.
  struct Ended {
    size_t index;
    JobState state;
  };
  std::vector<Ended> ended;
  for (size_t j = 0; j < active_.size(); ++j) {
    Active& a = active_[j];
    const double* v = summed + 1 + kJobFields * j;
    JobState state = JobState::kRunning;
    if (v[0] > 0) {
      state = JobState::kCancelled;
    } else if (v[7] > 0) {
      state = JobState::kFailed;
    } else if (v[6] >= a.instances) {
      state = JobState::kFinished;
    } else if (options_.leader && a.job.state == JobState::kPlaced && v[5] > 0) {
      Record(a.job, JobState::kRunning, step, a.job.reason);  // where it was placed, and why
    }
    if (options_.leader) UpdateProgress(a, step, v, state != JobState::kRunning);
    if (state == JobState::kRunning) continue;
    ended.push_back({j, state});
    if (a.task >= 0 && !a.reported) {
      options_.executor->StopTask(a.task);
      const TaskReport r = options_.executor->task_report(a.task);
      WriteInstance(
          a.id, r, r.state,
          state == JobState::kCancelled ? "cancelled" : "stopped: the job failed elsewhere");
      a.reported = true;
    }
  }
  if (!ended.empty()) {
    // Every instance's report is written before the leader gathers them into status.json.
    if (absl::Status s = Barrier(); !s.ok()) return s;
    for (const Ended& e : ended) {
      Active& a = active_[e.index];
      if (!options_.leader) continue;
      const std::string reason = e.state == JobState::kFailed      ? FailureReason(a.id)
                                 : e.state == JobState::kCancelled ? "cancelled while running"
                                                                   : "";
      Record(a.job, e.state, step, reason);
    }
    for (auto it = ended.rbegin(); it != ended.rend(); ++it) {
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(it->index));
    }
  }
  if (summed[0] > 0) return Place(step, static_cast<int64_t>(std::llround(summed[0])));
  return absl::OkStatus();
}

absl::Status JobRunner::Barrier() {
  double token = 0;
  return options_.transport->AllReduceSum(&token, 1, options_.transport->AllRanks(),
                                          options_.config->runtime.comm_timeout_s);
}

absl::Status JobRunner::Place(int64_t step, int64_t bytes) {
  const Config& config = *options_.config;
  const pipeline::Transport& transport = *options_.transport;
  const double timeout = config.runtime.comm_timeout_s;
  // The spec, one byte a value: a sum with zeros from every rank but the leader is a broadcast.
  std::vector<double> wire(static_cast<size_t>(bytes), 0.0);
  if (options_.leader) {
    for (size_t i = 0; i < offer_.size(); ++i) wire[i] = static_cast<unsigned char>(offer_[i]);
  }
  if (absl::Status s =
          options_.transport->AllReduceSum(wire.data(), bytes, transport.AllRanks(), timeout);
      !s.ok()) {
    return s;
  }
  std::string text(wire.size(), '\0');
  for (size_t i = 0; i < wire.size(); ++i) text[i] = static_cast<char>(wire[i]);
  std::vector<std::string> head = absl::StrSplit(text, absl::MaxSplits('\n', 3));
  int64_t id = 0, priority = 0;
  if (head.size() != 4 || !absl::SimpleAtoi(head[0], &id) ||
      !absl::SimpleAtoi(head[2], &priority)) {
    return absl::InternalError("a fill job's spec arrived garbled");
  }
  const std::string source = JobDir(run_dir(), id) + "/job.toml";
  absl::StatusOr<SideTaskConfig> task = ParseSideTaskFile(head[3], source, config);
  Job* job = options_.leader ? &pending_[id] : nullptr;
  if (!task.ok()) {  // the run changed since it was submitted (a resume under another pp)
    if (job != nullptr) {
      Record(*job, JobState::kRefused, step,
             absl::StrCat("its table does not fit this run: ", task.status().message()));
      pending_.erase(id);
    }
    return absl::OkStatus();
  }
  task->name = head[1];
  task->priority = priority;
  const SideTaskSpec spec = SpecOf(*task);

  // This rank's try: memory first, then created, loaded and calibrated, kept where its step fits.
  const int pp = options_.layout.pp, stage = options_.layout.stage;
  std::vector<double> rooms(kRoomFields * pp, 0.0);
  double* mine = &rooms[kRoomFields * stage];
  const bool replica0 = options_.layout.replica == 0;
  StageRoom room;
  room.stage = stage;
  room.took_part = true;
  room.allowed = task->stages.empty() ||
                 std::find(task->stages.begin(), task->stages.end(), stage) != task->stages.end();
  int hosted = -1;
  bool failed = false;
  if (room.allowed) {
    const StageRoom memory = MemoryRoom();
    room.free_bytes = memory.free_bytes;
    room.device_bytes = memory.device_bytes;
    room.fraction = memory.fraction;
    room.planned_peak_bytes = memory.planned_peak_bytes;
    room.held_bytes = memory.held_bytes;
    room.longest_bubble_s = options_.executor->LongestPredictedBubble();
    if (MemoryMisfit(spec.memory_limit_bytes, room).empty()) {
      absl::StatusOr<int> added = options_.executor->AddTask(spec, JobDir(run_dir(), id));
      if (!added.ok()) {
        failed = true;
        WriteInstance(id, TaskReport{}, "FAILED", std::string(added.status().message()));
      } else if (options_.executor->task_state(*added) == TaskState::kFailed) {
        failed = true;
        const TaskReport r = options_.executor->task_report(*added);
        WriteInstance(id, r, r.state, r.reason);
      } else {
        const TaskReport r = options_.executor->task_report(*added);
        room.calibrated = true;
        room.step_s = r.standalone_step_s;
        room.fills_bubble = options_.executor->fills_bubble(*added);
        // One done within its calibration has nothing left to fit.
        if (options_.executor->task_state(*added) == TaskState::kFinished ||
            StepMisfit(room, options_.executor->margin()).empty()) {
          hosted = *added;
          WriteInstance(id, r, r.state, "");
        } else {
          options_.executor->StopTask(*added);
        }
      }
    }
  }
  if (replica0) {
    mine[0] = 1;
    mine[1] = room.allowed;
    mine[2] = static_cast<double>(room.free_bytes);
    mine[3] = room.longest_bubble_s;
    mine[4] = room.calibrated;
    mine[5] = room.step_s;
    mine[6] = room.fills_bubble;
    mine[9] = static_cast<double>(room.device_bytes);
    mine[10] = room.fraction;
    mine[11] = static_cast<double>(room.planned_peak_bytes);
    mine[12] = static_cast<double>(room.held_bytes);
  }
  mine[7] = hosted >= 0 ? 1 : 0;
  mine[8] = failed ? 1 : 0;
  // Another rank may still be creating and calibrating the job: wait as long as its worker
  // may take (create, load, each calibration step) beyond the usual timeout.
  const double calibration_bound =
      config.freeride.step_timeout_s * (2 + 2 * config.freeride.calibration_steps);
  if (absl::Status s =
          options_.transport->AllReduceSum(rooms.data(), static_cast<int64_t>(rooms.size()),
                                           transport.AllRanks(), timeout + calibration_bound);
      !s.ok()) {
    return s;
  }
  std::vector<StageRoom> stages(pp);
  int instances = 0, failures = 0;
  std::vector<int> placed, failed_on;
  for (int st = 0; st < pp; ++st) {
    const double* r = &rooms[kRoomFields * st];
    StageRoom& room_of = stages[st];
    room_of.stage = st;
    room_of.took_part = r[0] > 0;
    room_of.allowed = r[1] > 0;
    room_of.free_bytes = static_cast<int64_t>(r[2]);
    room_of.longest_bubble_s = r[3];
    room_of.calibrated = r[4] > 0;
    room_of.step_s = r[5];
    room_of.fills_bubble = r[6] > 0;
    room_of.device_bytes = static_cast<int64_t>(r[9]);
    room_of.fraction = r[10];
    room_of.planned_peak_bytes = static_cast<int64_t>(r[11]);
    room_of.held_bytes = static_cast<int64_t>(r[12]);
    instances += static_cast<int>(r[7]);
    failures += static_cast<int>(r[8]);
    if (r[7] > 0) placed.push_back(st);
    if (r[8] > 0) failed_on.push_back(st);
  }
  if (failures > 0 || instances == 0) {
    if (hosted >= 0) options_.executor->StopTask(hosted);
    if (job != nullptr) {
      job->stages = failed_on;
      if (failures > 0) {
        Record(*job, JobState::kFailed, step, FailureReason(id));
      } else {
        Record(*job, JobState::kRefused, step,
               RefusalReason(spec.memory_limit_bytes, stages, options_.executor->margin()));
      }
      pending_.erase(id);
    }
    return absl::OkStatus();
  }
  Active a;
  a.id = id;
  a.task = hosted;
  a.instances = instances;
  a.memory_bytes = spec.memory_limit_bytes;
  if (job != nullptr) {
    std::vector<std::string> fits;
    for (int st : placed) {
      fits.push_back(absl::StrFormat("stage %d (longest bubble %.2f ms)", st,
                                     stages[st].longest_bubble_s * 1e3));
    }
    const StageRoom& first = stages[placed[0]];
    job->stages = placed;
    job->progress = JobProgress{};
    // What a unit of its work is, as its instances said when they were calibrated.
    for (const ordered_json& instance : ReadJobInstances(run_dir(), id)) {
      if (job->progress.unit.empty()) job->progress.unit = JsonStringOr(instance, "unit", "");
    }
    a.job = *job;
    pending_.erase(id);
    Record(a.job, JobState::kPlaced, step,
           absl::StrFormat("%s; fits %s",
                           first.fills_bubble
                               ? std::string("runs until each bubble's end")
                               : absl::StrFormat("%.3f ms a step alone", first.step_s * 1e3),
                           absl::StrJoin(fits, ", ")));
  }
  active_.push_back(std::move(a));
  return absl::OkStatus();
}

absl::Status JobRunner::Finish(int64_t step, const std::string& why) {
  finishing_ = true;
  std::vector<double> values(exchange_size(), 0.0);
  if (absl::Status s = Fill(step, values.data()); !s.ok()) return s;
  if (absl::Status s = options_.transport->AllReduceSum(
          values.data(), static_cast<int64_t>(values.size()), options_.transport->AllRanks(),
          options_.config->runtime.comm_timeout_s);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Apply(step, values.data()); !s.ok()) return s;
  for (Active& a : active_) {
    if (a.task >= 0) options_.executor->StopTask(a.task);
    if (options_.leader) {
      a.job.stages.clear();
      Record(a.job, JobState::kPending, step, why);
    }
  }
  active_.clear();
  return absl::OkStatus();
}

}  // namespace freeride
