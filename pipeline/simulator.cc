#include "pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace freeride::pipeline {
namespace {

constexpr double kUnknown = -1;

// Steps simulated to find a post-validated pipeline's steady period: doubled from the first
// until the last two reported windows agree, up to the last.
constexpr int kFirstSteps = 4, kMaxSteps = 64;

class Simulation {
 public:
  // Runs `steps` consecutive steps (1 with a barrier: every step is the same) and reports the
  // one before the last.
  Simulation(const Schedule& schedule, const CostModel& cost, int steps)
      : s_(schedule),
        cost_(cost),
        p_(schedule.stages),
        virtual_stages_(schedule.stages * schedule.chunks),
        m_(schedule.microbatches),
        steps_(steps),
        report_(std::max(0, steps - 2)),
        per_step_messages_(2L * virtual_stages_ * m_),
        state_(schedule.stages),
        arrival_(steps * per_step_messages_, kUnknown),
        waiter_(arrival_.size(), -1),
        tied_posted_(steps, 0),
        tied_last_post_(steps, 0),
        tied_waiters_(steps),
        state_posted_(steps, 0),
        state_time_(steps, 0),
        state_waiters_(steps) {
    result_.stages.resize(p_);
    for (int st = 0; st < p_; ++st) {
      const auto& instrs = s_.per_stage[st];
      result_.stages[st].stage = st;
      result_.stages[st].start.assign(instrs.size(), 0);
      result_.stages[st].end.assign(instrs.size(), 0);
      state_[st].step_end.assign(steps, 0);
      state_[st].validation_point = ValidationPoint(instrs);
      for (size_t i = 0; i < instrs.size(); ++i) {
        if (instrs[i].op == Op::kReduceTied) ++tied_participants_;
        if (instrs[i].op == Op::kOptimizer) ++barrier_participants_;
        if (IsCompute(instrs[i].op)) state_[st].last_use[{instrs[i].chunk, instrs[i].microbatch}] = i;
      }
    }
  }

  absl::StatusOr<SimResult> Run() {
    std::deque<int> runnable;
    for (int st = 0; st < p_; ++st) runnable.push_back(st);
    while (!runnable.empty()) {
      int st = runnable.front();
      runnable.pop_front();
      absl::Status status = Advance(st, &runnable);
      if (!status.ok()) return status;
    }
    std::vector<std::string> blocked;
    for (int st = 0; st < p_; ++st) {
      const auto& instrs = s_.per_stage[st];
      if (state_[st].pc < instrs.size() * steps_) {
        const size_t i = state_[st].pc % instrs.size();
        blocked.push_back(absl::StrCat("stage ", st, " waits at position ", i, " (",
                                       FormatInstr(instrs[i], s_.chunks), ")"));
      }
    }
    if (!blocked.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("deadlock: ", absl::StrJoin(blocked, "; ")));
    }
    Finish();
    return result_;
  }

  // Whether every stage's reported step and the one before it last equally long, and as long
  // as every other stage's: the steady state of post-validated steps.
  bool Steady() const {
    if (report_ < 2) return false;
    const double period = Window(0, report_);
    for (const StageState& state : state_) {
      for (int k : {report_, report_ - 1}) {
        const double w = state.step_end[k] - state.step_end[k - 1];
        if (std::abs(w - period) > 1e-9 * std::max(1.0, period)) return false;
      }
    }
    return true;
  }

 private:
  struct StageState {
    size_t pc = 0;  // over steps × the stage's list
    double clock = 0;
    // Within the current step:
    int step_begun = -1;
    int computes = 0, backwards = 0;
    int live_buffers = 0;      // slots held, F to the last backward (W when split)
    int live_activations = 0;  // F to B or I: what the papers count as M_B
    double own_collectives_done = 0;
    double first_compute = 0, last_compute_end = 0, compute_busy = 0;
    bool in_tied = false, at_barrier = false;
    // Per chunk: when its latest weight-gradient work ran (the buckets' readiness).
    std::map<int, std::pair<double, double>> weight_grads;
    int validated = 0;  // post-validated: the steps up to this one have had their check
    std::vector<double> step_end;
    size_t validation_point = 0;
    std::map<std::pair<int, int>, size_t> last_use;
  };

  double Duration(const Instr& in) const { return ComputeMs(s_, cost_, in); }
  double Window(int st, int step) const {
    return state_[st].step_end[step] - (step > 0 ? state_[st].step_end[step - 1] : 0);
  }
  bool PostValidated() const { return s_.step_sync == StepSync::kPostValidate; }

  // Index of the message an instruction of `step` sends or receives, or -1 when out of range.
  long MessageIndex(const Instr& in, int step) const {
    const int k = VirtualStage(s_, in);
    const bool act = in.op == Op::kSendAct || in.op == Op::kRecvAct;
    const int receiver = in.op == Op::kSendAct ? k + 1 : in.op == Op::kSendGrad ? k - 1 : k;
    if (receiver < 0 || receiver >= virtual_stages_ || in.microbatch < 0 ||
        in.microbatch >= m_) {
      return -1;
    }
    return step * per_step_messages_ +
           (static_cast<long>(act ? 0 : 1) * virtual_stages_ + receiver) * m_ + in.microbatch;
  }

  void AddBubble(int st, BubbleKind kind, double until, size_t index, int step) {
    StageState& state = state_[st];
    if (until <= state.clock) return;
    if (step == report_) {
      BubbleSpan span;
      span.kind = kind;
      span.start = state.clock;
      span.duration = until - state.clock;
      span.before_index = static_cast<int>(index);
      if (cost_.memory_total > 0) {
        span.free_bytes = cost_.memory_total - cost_.memory_static -
                          static_cast<int64_t>(state.live_buffers) * cost_.memory_per_buffer;
      }
      result_.stages[st].bubbles.push_back(span);
    }
    state.clock = until;
  }

  BubbleKind WaitKind(const StageState& state) const {
    if (state.computes == 0) return BubbleKind::kWarmup;
    if (state.backwards == 0) return BubbleKind::kFill;
    return BubbleKind::kSteady;
  }

  void BeginStep(StageState& state, int step) {
    if (state.step_begun == step) return;
    state.step_begun = step;
    state.computes = state.backwards = state.live_buffers = state.live_activations = 0;
    state.own_collectives_done = state.compute_busy = 0;
    state.first_compute = state.last_compute_end = 0;
    state.in_tied = state.at_barrier = false;
    state.weight_grads.clear();
  }

  // When the stage's data-parallel all-reduce is done: one sum posted now, or buckets started
  // as the backward makes them, one after another on the network.
  double DataParallelDone(const StageState& state) const {
    const int n = cost_.reduce_buckets;
    if (n == 0) return state.clock + cost_.reduce;
    std::vector<double> ready;
    for (const auto& [chunk, span] : state.weight_grads) {
      for (int j = 1; j <= n; ++j) {
        ready.push_back(span.first + (span.second - span.first) * j / n);
      }
    }
    std::sort(ready.begin(), ready.end());
    const double each = cost_.reduce / (static_cast<double>(s_.chunks) * n);
    double done = 0;
    for (double r : ready) done = std::max(done, r) + each;
    return done;
  }

  // Wakes the stages in `waiters` (all of them) once `posted` reaches `participants`.
  static void WakeWhenAll(int posted, int participants, std::vector<int>* waiters,
                          std::deque<int>* runnable) {
    if (posted < participants) return;
    for (int waiter : *waiters) runnable->push_back(waiter);
    waiters->clear();
  }

  absl::Status Advance(int st, std::deque<int>* runnable) {
    StageState& state = state_[st];
    const auto& instrs = s_.per_stage[st];
    const size_t n = instrs.size();
    StageResult& out = result_.stages[st];
    while (state.pc < n * steps_) {
      const int step = static_cast<int>(state.pc / n);
      const size_t i = state.pc % n;
      const Instr& in = instrs[i];
      BeginStep(state, step);
      // The previous step's global state, checked before the first use of this step's
      // gradients: until it is known the stage may only run forwards.
      if (PostValidated() && step > 0 && i == state.validation_point && state.validated < step) {
        if (state_posted_[step - 1] < barrier_participants_) {
          state_waiters_[step - 1].push_back(st);
          return absl::OkStatus();
        }
        AddBubble(st, BubbleKind::kCooldown, state_time_[step - 1], i, step);
        state.validated = step;
      }
      switch (in.op) {
        case Op::kRecvAct:
        case Op::kRecvGrad:
        case Op::kSendAct:
        case Op::kSendGrad: {
          const long index = MessageIndex(in, step);
          if (index < 0) {
            return absl::InvalidArgumentError(absl::StrCat("stage ", st, " position ", i, ": ",
                                                           FormatInstr(in, s_.chunks),
                                                           " has no peer stage in this pipeline"));
          }
          if (in.op == Op::kSendAct || in.op == Op::kSendGrad) {
            arrival_[index] = state.clock + cost_.comm;
            if (waiter_[index] >= 0) {
              runnable->push_back(waiter_[index]);
              waiter_[index] = -1;
            }
          } else {
            if (arrival_[index] == kUnknown) {
              waiter_[index] = st;
              return absl::OkStatus();
            }
            AddBubble(st, WaitKind(state), arrival_[index], i, step);
          }
          break;
        }
        case Op::kReduceTied:
          if (!state.in_tied) {
            state.in_tied = true;
            ++tied_posted_[step];
            tied_last_post_[step] = std::max(tied_last_post_[step], state.clock);
            WakeWhenAll(tied_posted_[step], tied_participants_, &tied_waiters_[step], runnable);
          }
          break;
        case Op::kReduceGrads:
          state.own_collectives_done =
              std::max(state.own_collectives_done, DataParallelDone(state));
          break;
        case Op::kOptimizer: {
          if (PostValidated()) {
            // No barrier: the stage waits only for its own sums (the tied one needs the other
            // end of the pipeline to have posted), then steps and posts its share of the
            // global state.
            if (state.in_tied && tied_posted_[step] < tied_participants_) {
              tied_waiters_[step].push_back(st);
              return absl::OkStatus();
            }
            if (state.in_tied) {
              AddBubble(st, BubbleKind::kCooldown, tied_last_post_[step], i, step);
              state.own_collectives_done =
                  std::max(state.own_collectives_done, tied_last_post_[step] + cost_.Tied());
            }
            AddBubble(st, BubbleKind::kSync, state.own_collectives_done, i, step);
            ++state_posted_[step];
            state_time_[step] = std::max(state_time_[step], state.clock);
            WakeWhenAll(state_posted_[step], barrier_participants_, &state_waiters_[step],
                        runnable);
            break;
          }
          if (!state.at_barrier) {
            state.at_barrier = true;
            barrier_time_ = std::max(barrier_time_, state.clock);
            barrier_waiters_.push_back(st);
            if (static_cast<int>(barrier_waiters_.size()) == barrier_participants_) {
              for (int waiter : barrier_waiters_) runnable->push_back(waiter);
            }
            return absl::OkStatus();
          }
          if (static_cast<int>(barrier_waiters_.size()) < barrier_participants_) {
            return absl::OkStatus();
          }
          if (state.in_tied) {
            if (tied_posted_[step] < tied_participants_) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "deadlock: stage ", st, " reached OPTIMIZER before every REDUCE_TIED was "
                  "posted"));
            }
            state.own_collectives_done =
                std::max(state.own_collectives_done, tied_last_post_[step] + cost_.Tied());
          }
          AddBubble(st, BubbleKind::kCooldown, barrier_time_, i, step);
          AddBubble(st, BubbleKind::kSync, state.own_collectives_done, i, step);
          break;
        }
        default:
          break;
      }
      const double duration = Duration(in);
      const double start = state.clock;
      state.clock += duration;
      if (step == report_) {
        out.start[i] = start;
        out.end[i] = state.clock;
        out.busy += duration;
      }
      if (IsCompute(in.op)) {
        ++state.computes;
        if (IsBackward(in.op)) ++state.backwards;
        if (in.op == Op::kForward) ++state.live_buffers, ++state.live_activations;
        if (IsBackward(in.op)) --state.live_activations;
        if (in.op == Op::kBackward || in.op == Op::kBackwardWeight) {
          Instr weight = in;
          weight.op = Op::kBackwardWeight;
          state.weight_grads[in.chunk] = {state.clock - Duration(weight), state.clock};
        }
        if (step == report_) {
          out.peak_activations = std::max(out.peak_activations, state.live_activations);
        }
        if (state.computes == 1) state.first_compute = start;
        state.last_compute_end = state.clock;
        state.compute_busy += duration;
        auto last = state.last_use.find({in.chunk, in.microbatch});
        if (last != state.last_use.end() && last->second == i) --state.live_buffers;
      }
      ++state.pc;
      if (i + 1 == n) {
        state.step_end[step] = state.clock;
        if (step == report_) {
          out.span_bubble = state.last_compute_end - state.first_compute - state.compute_busy;
        }
      }
    }
    return absl::OkStatus();
  }

  void Finish() {
    if (!PostValidated()) {
      for (const StageState& state : state_) {
        result_.step_time = std::max(result_.step_time, state.clock);
      }
      for (int st = 0; st < p_; ++st) {
        // A schedule with no OPTIMIZER: the stages that finish first wait for the last.
        AddBubble(st, BubbleKind::kCooldown, result_.step_time, s_.per_stage[st].size(), 0);
      }
    } else {
      // The steady period, and the reported step's times from its earliest start.
      double origin = state_[0].step_end[report_ - 1];
      for (int st = 0; st < p_; ++st) {
        result_.step_time = std::max(result_.step_time, Window(st, report_));
        origin = std::min(origin, state_[st].step_end[report_ - 1]);
      }
      for (StageResult& out : result_.stages) {
        out.step_start = state_[out.stage].step_end[report_ - 1] - origin;
        for (double& t : out.start) t -= origin;
        for (double& t : out.end) t -= origin;
        for (BubbleSpan& span : out.bubbles) span.start -= origin;
      }
    }
    double total_bubble = 0;
    for (StageResult& out : result_.stages) {
      for (const BubbleSpan& span : out.bubbles) {
        out.bubble += span.duration;
        out.bubble_by_kind[static_cast<int>(span.kind)] += span.duration;
      }
      total_bubble += out.bubble;
      result_.schedule_bubble = std::max(result_.schedule_bubble, out.span_bubble);
    }
    result_.bubble_fraction =
        result_.step_time > 0 ? total_bubble / (p_ * result_.step_time) : 0.0;
  }

  const Schedule& s_;
  const CostModel& cost_;
  const int p_, virtual_stages_, m_, steps_, report_;
  const long per_step_messages_;
  std::vector<StageState> state_;
  std::vector<double> arrival_;
  std::vector<int> waiter_;
  int tied_participants_ = 0, barrier_participants_ = 0;
  // Per step: REDUCE_TIED posts and the last one's time; post-validated, the stages' shares of
  // the global state posted at OPTIMIZER and when the last came.
  std::vector<int> tied_posted_;
  std::vector<double> tied_last_post_;
  std::vector<std::vector<int>> tied_waiters_;
  std::vector<int> state_posted_;
  std::vector<double> state_time_;
  std::vector<std::vector<int>> state_waiters_;
  double barrier_time_ = 0;
  std::vector<int> barrier_waiters_;
  SimResult result_;
};

}  // namespace

double ComputeMs(const Schedule& schedule, const CostModel& cost, const Instr& in) {
  const bool own = !cost.chunks.empty();  // the chunk's own cost, else 1/v of the stage's
  const StageCost& c = own ? cost.chunks[VirtualStage(schedule, in)] : cost.Stage(in.stage);
  const double v = own ? 1.0 : schedule.chunks;
  switch (in.op) {
    case Op::kForward: return c.f / v;
    case Op::kBackward: return (c.b + c.w) / v;
    case Op::kBackwardInput: return c.b / v;
    case Op::kBackwardWeight: return c.w / v;
    case Op::kOptimizer: return cost.optimizer;
    default: return 0;
  }
}

absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const CostModel& cost) {
  if (static_cast<int>(schedule.per_stage.size()) != schedule.stages) {
    return absl::InvalidArgumentError(absl::StrCat("schedule declares ", schedule.stages,
                                                   " stages but lists ",
                                                   schedule.per_stage.size()));
  }
  FR_RETURN_IF_ERROR(CheckCostModel(cost, schedule.stages, schedule.chunks));
  for (const auto& instrs : schedule.per_stage) {
    if (instrs.empty() && schedule.step_sync == StepSync::kPostValidate) {
      return absl::InvalidArgumentError("a post-validated schedule has a stage with no steps");
    }
  }
  if (schedule.step_sync == StepSync::kBarrier) return Simulation(schedule, cost, 1).Run();
  for (int steps = kFirstSteps;; steps *= 2) {
    Simulation simulation(schedule, cost, steps);
    FR_ASSIGN_OR_RETURN(SimResult result, simulation.Run());
    if (simulation.Steady() || steps >= kMaxSteps) return result;
  }
}

}  // namespace freeride::pipeline
