// A side task in its own worker process (`freeride_side_worker`: process isolation,
// docs/side_tasks.md#isolation-deadlines-and-memory-caps). The rank owns the worker: it starts it
// in its own process group (killed with the rank), asks it to create, load and step the task over
// a socket pair, pauses it with SIGSTOP when the bubble ends mid-step and resumes it with SIGCONT
// in the next. A worker that dies, stops answering or runs out of its memory fails its task;
// training never waits for it beyond the poll that notices the bubble's end.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "core/child_process.h"
#include "core/sched_class.h"
#include "core/timer.h"
#include "freeride/task_host.h"
#include "freeride/worker_protocol.h"

#ifndef FREERIDE_SIDE_WORKER_BUILD_PATH
#define FREERIDE_SIDE_WORKER_BUILD_PATH ""
#endif

namespace freeride {
namespace {

// Peak resident set of a live process, from /proc (0 when unreadable).
int64_t PeakResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrFormat("/proc/%d/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kib = 0;
    if (line.rfind("VmHWM:", 0) == 0 && sscanf(line.c_str(), "VmHWM: %ld", &kib) == 1) {
      return kib * 1024;
    }
  }
  return 0;
}

// A GPU task under a running MPS daemon gets a pinned device-memory cap and the lower client
// priority (docs/side_tasks.md#isolation-deadlines-and-memory-caps); without MPS its plan is
// checked against memory_limit in the task.
std::vector<std::string> MpsEnvironment(const SideTaskSpec& spec) {
  auto device = spec.args.find("device");
  if (device == spec.args.end() || !std::holds_alternative<std::string>(device->second) ||
      std::get<std::string>(device->second) != "cuda") {
    return {};
  }
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::filesystem::path pipes = dir != nullptr ? dir : "/tmp/nvidia-mps";
  std::error_code ec;
  if (!std::filesystem::exists(pipes / "control", ec)) return {};
  std::vector<std::string> env = {"CUDA_MPS_CLIENT_PRIORITY=1"};
  if (spec.memory_limit_bytes > 0) {
    env.push_back(absl::StrFormat("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM",
                                  (spec.memory_limit_bytes + (1 << 20) - 1) >> 20));
  }
  return env;
}

class WorkerHost : public TaskHost {
 public:
  WorkerHost(const SideTaskSpec& spec, const HostOptions& options)
      : spec_(spec), options_(options) {}
  ~WorkerHost() override { Abandon(); }

  absl::Status Start() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
      return absl::ResourceExhaustedError("side-task worker: socketpair failed");
    }
    ChildOptions child;
    const std::string path = options_.worker_path.empty() ? SideWorkerPath()
                                                          : options_.worker_path;
    if (access(path.c_str(), X_OK) != 0) {
      close(fds[0]);
      close(fds[1]);
      return absl::FailedPreconditionError(absl::StrFormat(
          "side task '%s': isolation = \"process\" needs the worker program, but '%s' is not an "
          "executable (set FREERIDE_SIDE_WORKER to its path)",
          spec_.name, path));
    }
    // Its task and results directory in its command line: `ps` tells which run it belongs to.
    child.argv = {path, "--task", absl::StrFormat("%s_r%d", spec_.name, options_.rank),
                  "--results", options_.results_dir};
    child.pass_fd = fds[1];
    child.env = MpsEnvironment(spec_);
    // Created, loaded and measured alone at the training's class (the rank waits for those
    // whatever they take), then lowered to the idle class before its first step in a bubble.
    child.idle_class = false;
    absl::StatusOr<ChildProcess> started = ChildProcess::Start(child);
    close(fds[1]);
    if (!started.ok()) {
      close(fds[0]);
      return started.status();
    }
    child_ = *std::move(started);
    fd_ = fds[0];
    WorkerSpec ws{spec_, options_.rank, options_.stage, options_.results_dir};
    return SendMessage(fd_, {"spec", EncodeWorkerSpec(ws)});
  }

  absl::Status Create() override {
    absl::StatusOr<Message> reply = Call({"create"}, "create");
    if (!reply.ok()) return reply.status();
    if ((*reply)[0] != "ok") {
      const bool config = reply->size() > 2 && (*reply)[2] == "config";
      return config ? absl::InvalidArgumentError((*reply)[1])
                    : absl::UnavailableError((*reply)[1]);
    }
    if (reply->size() < 4) return Broken("create");
    unit_ = (*reply)[1];
    (void)absl::SimpleAtod((*reply)[2], &declared_s_);
    fills_ = (*reply)[3] == "1";
    latency_ = reply->size() > 4 && (*reply)[4] == "1";
    if (reply->size() > 5) (void)absl::SimpleAtod((*reply)[5], &total_units_);
    return absl::OkStatus();
  }

  absl::Status Load() override {
    absl::StatusOr<Message> reply = Call({"load"}, "load");
    if (!reply.ok()) return reply.status();
    if ((*reply)[0] != "ok") return absl::ResourceExhaustedError(At(*reply, 1));
    if (reply->size() > 1) cap_note_ = (*reply)[1];
    return absl::OkStatus();
  }

  // At the class it was started in (the caller's): lowered only for steps in bubbles.
  HostStep StepAlone(double deadline_s) override {
    measuring_alone_ = true;
    HostStep out = Step(deadline_s, [] { return false; });
    measuring_alone_ = false;
    return out;
  }

  HostStep Step(double deadline_s, const std::function<bool()>& input_ready) override {
    HostStep out;
    Clock& clock = ClockOr(options_.clock);
    const double start = clock.Now();
    if (!child_.running()) return Failed(out, start, "the worker is gone");
    // Throughput work: a core only when no training thread wants one. Between steps the worker
    // waits for a message, so no thread of it is being made meanwhile. A latency-sensitive
    // worker keeps the training's class: a client waits on each of its steps, and it runs only
    // inside bubbles anyway (stopped at each one's end).
    if (!lowered_ && !measuring_alone_ && !latency_) {
      if (absl::StatusOr<SchedClass> c = LowerProcess(child_.ProgramPid()); !c.ok()) {
        return Died(out, start);
      }
      lowered_ = true;
    }
    if (!in_flight_) {
      // On the system clock, which the worker shares (exact, whatever the message's latency);
      // a simulated deadline is sent as the same time left on it.
      const double wire_deadline =
          clock.simulated() ? MonotonicSeconds() + (deadline_s - start) : deadline_s;
      if (!SendMessage(fd_, {"step", absl::StrFormat("%.9f", wire_deadline)}).ok()) {
        return Died(out, start);
      }
      in_flight_ = true;
      step_ran_s_ = 0;
    } else {
      child_.Continue();
    }
    double last_poll = start;
    while (true) {
      // Wakes at the deadline itself when it comes before the next poll.
      const double nap = std::clamp(deadline_s - clock.Now(), 0.0, kAwaitPollS);
      short revents = 0;
      const int r = clock.WaitReadable(fd_, nap, &revents);
      const double now = clock.Now();
      if (r > 0) {
        if ((revents & POLLIN) == 0) return Died(out, start);
        absl::StatusOr<Message> reply = ReceiveMessage(fd_);
        if (!reply.ok()) return Died(out, start);
        in_flight_ = false;
        out.ran_s = now - start;
        if ((*reply)[0] != "ok" || reply->size() < 3) return Failed(out, start, At(*reply, 1));
        (void)absl::SimpleAtod((*reply)[1], &out.units);
        done_ = (*reply)[2] == "1";
        out.finished = done_ && !spec_.repeat;
        if (reply->size() >= 5 && (*reply)[3] == "1") {
          out.restarted = true;
          (void)absl::SimpleAtod((*reply)[4], &out.restart_s);
        }
        out.idle = reply->size() >= 6 && (*reply)[5] == "1";
        pending_ = reply->size() >= 7 && (*reply)[6] == "1";
        return out;
      }
      if (!fills_ && step_ran_s_ + (now - start) > options_.step_timeout_s) {
        return Failed(out, start, absl::StrFormat(
            "one step ran %.1f s without finishing (freeride.step_timeout_s): hung",
            step_ran_s_ + (now - start)));
      }
      const bool ready = input_ready();
      if (ready || now >= deadline_s) {
        if (!child_.Stop()) return Died(out, start);
        const double stopped = clock.Now();
        out.kind = HostStep::Kind::kPaused;
        out.ran_s = stopped - start;
        out.late_s = ready ? stopped - last_poll : 0;
        step_ran_s_ += out.ran_s;
        return out;
      }
      last_poll = now;
    }
  }

  void Release() override {
    if (child_.running()) {
      child_.Continue();
      in_flight_ = false;  // a paused step is dropped: its reply, if any, is read and ignored
      peak_ = PeakResidentBytes(child_.pid());
      if (SendMessage(fd_, {"finish"}).ok()) {
        // Until the finish reply; a step reply that was on its way comes first.
        for (int i = 0; i < 2; ++i) {
          absl::StatusOr<Message> reply = Wait(5.0);
          if (!reply.ok()) break;
          if ((*reply)[0] == "ok" && reply->size() >= 3 && (*reply)[1] == "finish") {
            summary_ = (*reply)[2];
            done_ = done_ || (reply->size() > 3 && (*reply)[3] == "1");
            break;
          }
        }
      }
    }
    Abandon();
  }

  void Abandon() override {
    if (child_.running() && peak_ == 0) peak_ = PeakResidentBytes(child_.pid());
    child_.Kill();
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  bool pausable() const override { return true; }
  bool fills_bubble() const override { return fills_; }
  double declared_step_s() const override { return declared_s_; }
  std::string unit_name() const override { return unit_; }
  double total_units() const override { return total_units_; }
  std::string summary() const override { return summary_; }
  int64_t memory_peak_bytes() const override { return peak_; }
  std::string memory_peak_note() const override {
    return "the worker process's peak resident set, its code and libraries included" +
           (cap_note_.empty() ? std::string() : "; " + cap_note_);
  }
  bool done() const override { return done_; }
  bool latency_sensitive() const override { return latency_; }
  // As of its last step: a stopped worker's server cannot look. A step paused mid-way was
  // serving.
  bool has_pending_work() const override { return latency_ && (pending_ || in_flight_); }

 private:
  static std::string At(const Message& m, size_t i) { return i < m.size() ? m[i] : "?"; }

  absl::Status Broken(const char* what) {
    Abandon();
    return absl::UnavailableError(absl::StrFormat("the worker's answer to %s is malformed", what));
  }

  // Waits up to `timeout_s` for one message; a dead or silent worker is Unavailable. On real
  // time whatever the host's clock: a request outside a bubble (create, load, finish) has no
  // deadline but this safety net, and a simulated clock would spend it in no time.
  absl::StatusOr<Message> Wait(double timeout_s) {
    const double give_up = MonotonicSeconds() + timeout_s;
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, 100);
      if (r > 0) {
        absl::StatusOr<Message> m = ReceiveMessage(fd_);
        if (m.ok() && !m->empty()) return m;
        return absl::UnavailableError(absl::StrFormat("the worker %s", EndOfWorker()));
      }
      if (MonotonicSeconds() > give_up) {
        Abandon();
        return absl::UnavailableError(absl::StrFormat(
            "the worker did not answer within %.0f s (freeride.step_timeout_s): hung", timeout_s));
      }
    }
  }

  absl::StatusOr<Message> Call(const Message& request, const char* what) {
    if (!child_.running() || !SendMessage(fd_, request).ok()) {
      return absl::UnavailableError(absl::StrFormat("%s: the worker %s", what, EndOfWorker()));
    }
    absl::StatusOr<Message> reply = Wait(options_.step_timeout_s);
    if (!reply.ok()) {
      return absl::UnavailableError(absl::StrFormat("%s: %s", what, reply.status().message()));
    }
    return reply;
  }

  // How the worker ended (it closed its socket: give it a moment to be reaped).
  std::string EndOfWorker() {
    const double give_up = MonotonicSeconds() + 1.0;
    while (!child_.Ended() && MonotonicSeconds() < give_up) usleep(1000);
    std::string how = child_.Ended() ? child_.EndDescription() : "stopped answering";
    Abandon();
    return how;
  }

  HostStep Died(HostStep& out, double start) {
    return Failed(out, start, absl::StrFormat("the worker %s", EndOfWorker()));
  }
  HostStep Failed(HostStep& out, double start, const std::string& reason) {
    Abandon();
    in_flight_ = false;
    out.kind = HostStep::Kind::kFailed;
    out.reason = reason;
    out.ran_s = ClockOr(options_.clock).Now() - start;
    return out;
  }

  SideTaskSpec spec_;
  HostOptions options_;
  ChildProcess child_;
  int fd_ = -1;
  bool in_flight_ = false, fills_ = false, done_ = false;
  bool latency_ = false, pending_ = false;  // latency-sensitive; work waited at the last step
  bool lowered_ = false;          // moved to the idle class (before its first step in a bubble)
  bool measuring_alone_ = false;  // in StepAlone
  double step_ran_s_ = 0, declared_s_ = 0;
  std::string unit_ = "steps", summary_;
  double total_units_ = 0;
  std::string cap_note_;  // how the worker applied memory_limit (its answer to load)
  int64_t peak_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TaskHost>> MakeWorkerHost(const SideTaskSpec& spec,
                                                         const HostOptions& options) {
  auto host = std::make_unique<WorkerHost>(spec, options);
  if (absl::Status s = host->Start(); !s.ok()) return s;
  return std::unique_ptr<TaskHost>(std::move(host));
}

std::string SideWorkerPath() {
  if (const char* env = getenv("FREERIDE_SIDE_WORKER"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "freeride_side_worker";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return FREERIDE_SIDE_WORKER_BUILD_PATH;
}

}  // namespace freeride
