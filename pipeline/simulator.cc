#include "pipeline/simulator.h"

#include <algorithm>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace freeride::pipeline {
namespace {

constexpr double kUnknown = -1;

class Simulation {
 public:
  Simulation(const Schedule& schedule, const CostModel& cost)
      : s_(schedule), cost_(cost), p_(schedule.stages),
        virtual_stages_(schedule.stages * schedule.chunks), m_(schedule.microbatches),
        state_(schedule.stages), arrival_(2 * virtual_stages_ * m_, kUnknown),
        waiter_(arrival_.size(), -1) {
    result_.stages.resize(p_);
    for (int st = 0; st < p_; ++st) {
      const auto& instrs = s_.per_stage[st];
      result_.stages[st].stage = st;
      result_.stages[st].start.assign(instrs.size(), 0);
      result_.stages[st].end.assign(instrs.size(), 0);
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
      if (state_[st].pc < instrs.size()) {
        blocked.push_back(absl::StrCat("stage ", st, " waits at position ", state_[st].pc, " (",
                                       FormatInstr(instrs[state_[st].pc], s_.chunks), ")"));
      }
    }
    if (!blocked.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("deadlock: ", absl::StrJoin(blocked, "; ")));
    }
    Finish();
    return result_;
  }

 private:
  struct StageState {
    size_t pc = 0;
    double clock = 0;
    int computes = 0, backwards = 0;
    int live_buffers = 0;      // slots held, F to the last backward (W when split)
    int live_activations = 0;  // F to B or I: what the papers count as M_B
    double own_collectives_done = 0;
    double first_compute = 0, last_compute_end = 0, compute_busy = 0;
    bool in_tied = false, at_barrier = false;
    std::map<std::pair<int, int>, size_t> last_use;
  };

  double Duration(const Instr& in) const { return ComputeMs(s_, cost_, in); }

  // Index of the message an instruction sends or receives, or -1 when out of range.
  long MessageIndex(const Instr& in) const {
    const int k = VirtualStage(s_, in);
    const bool act = in.op == Op::kSendAct || in.op == Op::kRecvAct;
    const int receiver = in.op == Op::kSendAct ? k + 1 : in.op == Op::kSendGrad ? k - 1 : k;
    if (receiver < 0 || receiver >= virtual_stages_ || in.microbatch < 0 ||
        in.microbatch >= m_) {
      return -1;
    }
    return (static_cast<long>(act ? 0 : 1) * virtual_stages_ + receiver) * m_ + in.microbatch;
  }

  void AddBubble(int st, BubbleKind kind, double until) {
    StageState& state = state_[st];
    if (until <= state.clock) return;
    BubbleSpan span;
    span.kind = kind;
    span.start = state.clock;
    span.duration = until - state.clock;
    span.before_index = static_cast<int>(state.pc);
    if (cost_.memory_total > 0) {
      span.free_bytes = cost_.memory_total - cost_.memory_static -
                        static_cast<int64_t>(state.live_buffers) * cost_.memory_per_buffer;
    }
    result_.stages[st].bubbles.push_back(span);
    state.clock = until;
  }

  BubbleKind WaitKind(const StageState& state) const {
    if (state.computes == 0) return BubbleKind::kWarmup;
    if (state.backwards == 0) return BubbleKind::kFill;
    return BubbleKind::kSteady;
  }

  absl::Status Advance(int st, std::deque<int>* runnable) {
    StageState& state = state_[st];
    const auto& instrs = s_.per_stage[st];
    StageResult& out = result_.stages[st];
    while (state.pc < instrs.size()) {
      const Instr& in = instrs[state.pc];
      switch (in.op) {
        case Op::kRecvAct:
        case Op::kRecvGrad:
        case Op::kSendAct:
        case Op::kSendGrad: {
          const long index = MessageIndex(in);
          if (index < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "stage ", st, " position ", state.pc, ": ", FormatInstr(in, s_.chunks),
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
            AddBubble(st, WaitKind(state), arrival_[index]);
          }
          break;
        }
        case Op::kReduceTied:
          state.in_tied = true;
          ++tied_posted_;
          tied_last_post_ = std::max(tied_last_post_, state.clock);
          break;
        case Op::kReduceGrads:
          state.own_collectives_done =
              std::max(state.own_collectives_done, state.clock + cost_.reduce);
          break;
        case Op::kOptimizer: {
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
            if (tied_posted_ < tied_participants_) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "deadlock: stage ", st, " reached OPTIMIZER before every REDUCE_TIED was "
                  "posted"));
            }
            state.own_collectives_done =
                std::max(state.own_collectives_done, tied_last_post_ + cost_.Tied());
          }
          AddBubble(st, BubbleKind::kCooldown, barrier_time_);
          AddBubble(st, BubbleKind::kSync, state.own_collectives_done);
          break;
        }
        default:
          break;
      }
      const double duration = Duration(in);
      out.start[state.pc] = state.clock;
      state.clock += duration;
      out.end[state.pc] = state.clock;
      out.busy += duration;
      if (IsCompute(in.op)) {
        ++state.computes;
        if (IsBackward(in.op)) ++state.backwards;
        if (in.op == Op::kForward) ++state.live_buffers, ++state.live_activations;
        if (IsBackward(in.op)) --state.live_activations;
        result_.stages[st].peak_activations =
            std::max(result_.stages[st].peak_activations, state.live_activations);
        if (state.computes == 1) state.first_compute = out.start[state.pc];
        state.last_compute_end = state.clock;
        state.compute_busy += duration;
        auto last = state.last_use.find({in.chunk, in.microbatch});
        if (last != state.last_use.end() && last->second == state.pc) --state.live_buffers;
      }
      ++state.pc;
    }
    return absl::OkStatus();
  }

  void Finish() {
    for (const StageState& state : state_) {
      result_.step_time = std::max(result_.step_time, state.clock);
    }
    double total_bubble = 0;
    for (int st = 0; st < p_; ++st) {
      AddBubble(st, BubbleKind::kCooldown, result_.step_time);  // a schedule with no OPTIMIZER
      StageResult& out = result_.stages[st];
      for (const BubbleSpan& span : out.bubbles) {
        out.bubble += span.duration;
        out.bubble_by_kind[static_cast<int>(span.kind)] += span.duration;
      }
      total_bubble += out.bubble;
      const StageState& state = state_[st];
      out.span_bubble = state.last_compute_end - state.first_compute - state.compute_busy;
      result_.schedule_bubble = std::max(result_.schedule_bubble, out.span_bubble);
    }
    result_.bubble_fraction =
        result_.step_time > 0 ? total_bubble / (p_ * result_.step_time) : 0.0;
  }

  const Schedule& s_;
  const CostModel& cost_;
  const int p_, virtual_stages_, m_;
  std::vector<StageState> state_;
  std::vector<double> arrival_;
  std::vector<int> waiter_;
  int tied_participants_ = 0, tied_posted_ = 0, barrier_participants_ = 0;
  double tied_last_post_ = 0, barrier_time_ = 0;
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
  return Simulation(schedule, cost).Run();
}

}  // namespace freeride::pipeline
