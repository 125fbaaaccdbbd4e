// Emulated pipeline peers: the real stage's messages and sums are timed by the simulator.
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "pipeline/comm/transport.h"
#include "pipeline/simulator.h"
#include "pipeline/stage_executor.h"

namespace freeride::pipeline {
namespace {


class EmulatedPeersTransport : public Transport {
 public:
  EmulatedPeersTransport(const Schedule& schedule, SimResult sim, int real, MessageType type,
                         double comm_ms, Clock& clock)
      : schedule_(schedule), sim_(std::move(sim)), real_(real), type_(type), clock_(clock) {
    const int p = schedule.stages, m = schedule.microbatches;
    // Simulated departure and arrival (ms after the real stage's step start; post-validated
    // steps overlap, so a peer's may come before it) of every message, by tag, and the
    // simulated times of the real stage's own sends.
    const double origin = sim_.stages[real_].step_start;
    for (int st = 0; st < p; ++st) {
      const auto& instrs = schedule.per_stage[st];
      for (size_t i = 0; i < instrs.size(); ++i) {
        const Instr& in = instrs[i];
        if (in.op != Op::kSendAct && in.op != Op::kSendGrad) continue;
        const int tag = StageExecutor::MessageTag(in.op == Op::kSendGrad, VirtualStage(schedule, in),
                                                  in.microbatch, p * schedule.chunks, m);
        const double depart = sim_.stages[st].end[i] - origin;
        messages_[tag] = {depart, depart + comm_ms};
        if (st == real_) own_sends_.push_back({depart, tag});
      }
      for (size_t i = 0; i < instrs.size(); ++i) {
        const double at = sim_.stages[st].start[i] - origin;
        if (instrs[i].op == Op::kReduceTied) tied_arrival_[st] = at;
        if (instrs[i].op == Op::kOptimizer) barrier_arrival_[st] = at;
      }
    }
    std::sort(own_sends_.begin(), own_sends_.end());
    const int head = StageOfVirtual(schedule_, p * schedule_.chunks - 1);
    tied_stage_ = head != 0 && (real_ == 0 || real_ == head);
  }

  int rank() const override { return real_; }
  int size() const override { return schedule_.stages; }

  void OnStepStart(double now_s) override {
    t0_ = now_s;
    actual_send_.clear();
    in_step_ = true;
    // On the first or last stage a step's sums come as: the tied embedding's arrival (one
    // value), its transfer, then the optimizer's; elsewhere only the optimizer's.
    tied_phase_ = tied_stage_ ? 0 : 2;
    started_sums_ = 0;
  }

  absl::StatusOr<Request> Isend(const void*, int64_t, int, int tag) override {
    actual_send_[tag] = (clock_.Now() - t0_) * 1e3;
    pending_[next_] = {nullptr, 0, tag, false};
    return next_++;
  }

  absl::StatusOr<Request> Irecv(void* data, int64_t bytes, int peer, int tag) override {
    if (!messages_.count(tag)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("emulated peers: no message with tag %d from stage %d", tag, peer));
    }
    pending_[next_] = {data, bytes, tag, true};
    return next_++;
  }

  bool Test(Request request) override {
    auto it = pending_.find(request);
    if (it != pending_.end() && it->second.sum) return clock_.Now() >= it->second.done_s;
    return it == pending_.end() || !it->second.recv || clock_.Now() >= Arrival(it->second.tag);
  }

  absl::Status Wait(Request request, double timeout_s) override {
    auto it = pending_.find(request);
    if (it == pending_.end()) return absl::InvalidArgumentError("unknown request");
    const Pending p = it->second;
    pending_.erase(it);
    if (p.sum) {
      clock_.SpinUntil(p.done_s);
      return absl::OkStatus();
    }
    if (!p.recv) return absl::OkStatus();
    const double when = Arrival(p.tag);
    if (when - clock_.Now() > timeout_s) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "emulated message (tag %d) would arrive after the %.1f s timeout", p.tag, timeout_s));
    }
    // Busily (SpinUntil), as Open MPI's progress engine and a CUDA stream synchronisation wait
    // by default. Sleeping instead would be wrong twice: a sleep overshoots by ~0.1 ms or more
    // on a VM, and only the blocks where the rank idles pay it (a side task keeps the rank busy
    // until the input is ready), so training alone would look slower than training with side
    // tasks (a -3% "overhead" in the emulated study).
    clock_.SpinUntil(when);
    // Synthetic contents: activations and gradients of a plausible scale, fixed per tag, in
    // the messages' element type.
    std::mt19937 rng(static_cast<uint32_t>(p.tag) * 2654435761u);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    std::vector<float> values(p.bytes / MessageTypeBytes(type_));
    for (float& v : values) v = u(rng);
    ToMessage(type_, values.data(), static_cast<int64_t>(values.size()), p.data);
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(float*, int64_t, const std::vector<int>& group, double) override {
    return Collective(group);
  }
  absl::Status AllReduceSum(double*, int64_t, const std::vector<int>& group, double) override {
    return Collective(group);
  }
  // A post-validated step starts its sums in this order: the tied embedding's (on its two
  // stages), the global state's at OPTIMIZER, then the trainer's (done at once). Each is done
  // when its last emulated member would have started it.
  absl::StatusOr<Request> StartAllReduceSum(float*, int64_t,
                                            const std::vector<int>& group) override {
    return StartSum(group);
  }
  absl::StatusOr<Request> StartAllReduceSum(double*, int64_t,
                                            const std::vector<int>& group) override {
    return StartSum(group);
  }

 private:
  struct Times {
    double depart = 0, arrive = 0;
  };
  struct Pending {
    void* data = nullptr;
    int64_t bytes = 0;
    int tag = 0;
    bool recv = false;
    bool sum = false;
    double done_s = 0;  // a sum: when it completes
  };

  // The real stage's lateness against the simulation, from its sends so far (ms).
  double Lag() const {
    double lag = 0;
    for (const auto& [sim_time, own_tag] : own_sends_) {
      auto it = actual_send_.find(own_tag);
      if (it != actual_send_.end()) lag = std::max(0.0, it->second - sim_time);
    }
    return lag;
  }

  absl::StatusOr<Request> StartSum(const std::vector<int>& group) {
    const int kind = started_sums_++ + (tied_stage_ ? 0 : 1);  // 0 tied, 1 state, 2 others
    double latest = 0;
    if (group.size() > 1 && kind < 2) {
      for (int member : group) {
        if (member == real_) continue;
        const auto& arrivals = kind == 0 ? tied_arrival_ : barrier_arrival_;
        auto it = arrivals.find(member);
        if (it != arrivals.end()) latest = std::max(latest, it->second);
      }
    }
    Pending p;
    p.sum = true;
    p.done_s = kind < 2 ? t0_ + (latest + Lag()) * 1e-3 : clock_.Now();
    pending_[next_] = p;
    return next_++;
  }

  // When a message reaches the real stage: its simulated arrival, later by as much as the real
  // stage's latest own send before the message left the peer was late against the simulation.
  double Arrival(int tag) const {
    const Times& t = messages_.at(tag);
    double lag = 0;
    for (const auto& [sim_time, own_tag] : own_sends_) {
      if (sim_time > t.depart) break;
      auto it = actual_send_.find(own_tag);
      if (it != actual_send_.end()) lag = std::max(0.0, it->second - sim_time);
    }
    return t0_ + (t.arrive + lag) * 1e-3;
  }

  // The step's sums wait for the emulated members' simulated arrival (tied embedding: the
  // other end of the pipeline at REDUCE_TIED; the optimizer's norm: every stage at OPTIMIZER),
  // shifted by the real stage's lateness; the tied transfer after its arrival completes at
  // once. Sums after the optimizer's complete at once.
  absl::Status Collective(const std::vector<int>& group) {
    if (group.size() <= 1 || !in_step_) return absl::OkStatus();
    if (tied_phase_ == 1) {  // the tied transfer: the emulated peer is already there
      tied_phase_ = 2;
      return absl::OkStatus();
    }
    const bool tied = tied_phase_ == 0;
    if (tied) tied_phase_ = 1;
    double latest = 0;
    for (int member : group) {
      if (member == real_) continue;
      const auto& arrivals = tied ? tied_arrival_ : barrier_arrival_;
      auto it = arrivals.find(member);
      if (it != arrivals.end()) latest = std::max(latest, it->second);
    }
    clock_.SpinUntil(t0_ + (latest + Lag()) * 1e-3);  // busily, as Wait
    if (!tied) in_step_ = false;  // the optimizer's sum ends the step's timed part
    return absl::OkStatus();
  }

  const Schedule schedule_;
  const SimResult sim_;
  const int real_;
  const MessageType type_;
  Clock& clock_;
  std::map<int, Times> messages_;
  std::vector<std::pair<double, int>> own_sends_;  // (simulated time, tag), by time
  std::map<int, double> tied_arrival_, barrier_arrival_;
  std::map<int, double> actual_send_;  // tag → ms after the step start
  std::map<Request, Pending> pending_;
  Request next_ = 0;
  double t0_ = 0;
  bool in_step_ = false;
  bool tied_stage_ = false;  // the real stage holds one end of the tied embedding
  int tied_phase_ = 2;  // 0: expecting the tied arrival, 1: its transfer, 2: done
  int started_sums_ = 0;  // this step's non-blocking sums so far
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeEmulatedPeersTransport(const Schedule& schedule,
                                                                      const CostModel& cost,
                                                                      int real_stage,
                                                                      MessageType message_type,
                                                                      Clock* clock) {
  if (real_stage < 0 || real_stage >= schedule.stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "runtime.emulated_stage = %d, but the pipeline has stages 0..%d", real_stage,
        schedule.stages - 1));
  }
  absl::StatusOr<SimResult> sim = Simulate(schedule, cost);
  if (!sim.ok()) return sim.status();
  return std::unique_ptr<Transport>(new EmulatedPeersTransport(
      schedule, *std::move(sim), real_stage, message_type, cost.comm, ClockOr(clock)));
}

}  // namespace freeride::pipeline
