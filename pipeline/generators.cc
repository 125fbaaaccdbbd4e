#include "pipeline/generators.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "pipeline/passes.h"

namespace freeride::pipeline {
namespace {

Instr Compute(Op op, int stage, int chunk, int microbatch) {
  Instr instr;
  instr.op = op;
  instr.stage = stage;
  instr.chunk = chunk;
  instr.microbatch = microbatch;
  return instr;
}

void GenerateGPipe(Schedule* s) {
  for (int stage = 0; stage < s->stages; ++stage) {
    auto& out = s->per_stage[stage];
    for (int mb = 0; mb < s->microbatches; ++mb) out.push_back(Compute(Op::kForward, stage, 0, mb));
    for (int mb = 0; mb < s->microbatches; ++mb) out.push_back(Compute(Op::kBackward, stage, 0, mb));
    s->buffers_per_stage[stage] = s->microbatches;
  }
}

void Generate1F1B(Schedule* s) {
  const int p = s->stages, m = s->microbatches;
  for (int stage = 0; stage < p; ++stage) {
    auto& out = s->per_stage[stage];
    const int warmup = std::min(p - stage - 1, m);
    for (int mb = 0; mb < warmup; ++mb) out.push_back(Compute(Op::kForward, stage, 0, mb));
    for (int i = 0; i < m - warmup; ++i) {
      out.push_back(Compute(Op::kForward, stage, 0, warmup + i));
      out.push_back(Compute(Op::kBackward, stage, 0, i));
    }
    for (int mb = m - warmup; mb < m; ++mb) out.push_back(Compute(Op::kBackward, stage, 0, mb));
    s->buffers_per_stage[stage] = std::min(p - stage, m);
  }
}

// Megatron-LM's interleaved schedule: virtual step k of stage s runs chunk
// (k mod pv) / p (reversed for backwards) on micro-batch (k / pv) * p + k mod p.
void GenerateInterleaved(Schedule* s) {
  const int p = s->stages, m = s->microbatches, v = s->chunks;
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int stage = 0; stage < p; ++stage) {
    auto& out = s->per_stage[stage];
    int warmup = m == p ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) {
      out.push_back(Compute(Op::kForward, stage, chunk_of(k, true), microbatch_of(k)));
    }
    for (int k = 0; k < total - warmup; ++k) {
      out.push_back(Compute(Op::kForward, stage, chunk_of(k + warmup, true),
                            microbatch_of(k + warmup)));
      out.push_back(Compute(Op::kBackward, stage, chunk_of(k, false), microbatch_of(k)));
    }
    for (int k = total - warmup; k < total; ++k) {
      out.push_back(Compute(Op::kBackward, stage, chunk_of(k, false), microbatch_of(k)));
    }
  }
}

// The ZB-H family: each stage walks a 1F1B-shaped order of F and I (the input-gradient
// backward) with `warmup(stage)` forwards before its first I; a W is run right after its I
// once more than `defer_limit` are pending, and earlier in any wait for the next input that it
// fits in. Stages advance in order of their simulated clocks. ZB-H1 keeps 1F1B's warm-up and
// defers up to p-1 Ws; ZB-H2 warms up with 2(p-1-s) forwards, filling the wait before stage
// s's first backward, and defers Ws without limit, so they fill the tail.
template <typename Warmup>
void GenerateZBH(Schedule* s, const CostModel& cost, Warmup warmup, int defer_limit) {

  const int p = s->stages, m = s->microbatches;
  const double comm = cost.comm;
  constexpr double kUnknown = -1;
  std::vector<std::vector<double>> f_end(p, std::vector<double>(m, kUnknown));
  std::vector<std::vector<double>> i_end(p, std::vector<double>(m, kUnknown));
  std::vector<std::deque<Instr>> main(p);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<double> clock(p, 0.0);
  for (int stage = 0; stage < p; ++stage) {
    const int w = std::min(warmup(stage), m);
    auto& out = main[stage];
    for (int mb = 0; mb < w; ++mb) out.push_back(Compute(Op::kForward, stage, 0, mb));
    for (int i = 0; i < m - w; ++i) {
      out.push_back(Compute(Op::kForward, stage, 0, w + i));
      out.push_back(Compute(Op::kBackwardInput, stage, 0, i));
    }
    for (int mb = m - w; mb < m; ++mb) out.push_back(Compute(Op::kBackwardInput, stage, 0, mb));
  }
  auto input_ready = [&](int stage, const Instr& in) -> double {
    if (in.op == Op::kForward) {
      if (stage == 0) return 0;
      double t = f_end[stage - 1][in.microbatch];
      return t == kUnknown ? kUnknown : t + comm;
    }
    if (stage == p - 1) return 0;
    double t = i_end[stage + 1][in.microbatch];
    return t == kUnknown ? kUnknown : t + comm;
  };
  auto run = [&](int stage, const Instr& in, double start) {
    const StageCost& c = cost.Stage(stage);
    const double duration = in.op == Op::kForward         ? c.f
                            : in.op == Op::kBackwardInput ? c.b
                                                          : c.w;
    clock[stage] = start + duration;
    s->per_stage[stage].push_back(in);
    if (in.op == Op::kForward) f_end[stage][in.microbatch] = clock[stage];
    if (in.op == Op::kBackwardInput) i_end[stage][in.microbatch] = clock[stage];
  };
  auto run_w = [&](int stage) {
    run(stage, Compute(Op::kBackwardWeight, stage, 0, pending_w[stage].front()), clock[stage]);
    pending_w[stage].pop_front();
  };
  // Earliest time the next input of `stage` can land: known once its producer ran, else a
  // lower bound from the producer stage's clock.
  auto earliest_input = [&](int stage, const Instr& in) -> double {
    const double ready = input_ready(stage, in);
    if (ready != kUnknown) return ready;
    const int producer = in.op == Op::kForward ? stage - 1 : stage + 1;
    const StageCost& c = cost.Stage(producer);
    return clock[producer] + (in.op == Op::kForward ? c.f : c.b) + comm;
  };
  // A deferred W runs in a wait only when it fits there, so it never delays the next input.
  auto w_fits = [&](int stage) {
    return !pending_w[stage].empty() &&
           earliest_input(stage, main[stage].front()) - clock[stage] >=
               cost.Stage(stage).w - 1e-12;
  };
  while (true) {
    // The unfinished stage with the earliest clock that can act now; if none can (every
    // next input unknown and no W fits), any stage with deferred W work runs one.
    int best = -1;
    bool fallback = false;
    double best_clock = std::numeric_limits<double>::infinity();
    for (int pass = 0; pass < 2 && best < 0; ++pass) {
      for (int stage = 0; stage < p; ++stage) {
        if (main[stage].empty() && pending_w[stage].empty()) continue;
        const bool can_act = main[stage].empty() ||
                             input_ready(stage, main[stage].front()) != kUnknown ||
                             w_fits(stage) || (pass == 1 && !pending_w[stage].empty());
        if (can_act && clock[stage] < best_clock) {
          best = stage;
          best_clock = clock[stage];
        }
      }
      fallback = pass == 1;
    }
    if (best < 0) break;
    const int stage = best;
    if (main[stage].empty() || w_fits(stage) ||
        (fallback && input_ready(stage, main[stage].front()) == kUnknown)) {
      run_w(stage);
      continue;
    }
    const Instr next = main[stage].front();
    main[stage].pop_front();
    run(stage, next, std::max(clock[stage], input_ready(stage, next)));
    if (next.op == Op::kBackwardInput) {
      pending_w[stage].push_back(next.microbatch);
      if (static_cast<int>(pending_w[stage].size()) > defer_limit) run_w(stage);
    }
  }
}

// A V-placed stage's order is written as a per-rank program, as torch.distributed.pipelining
// writes ZBVZeroBubble and DualPipeV: counters give each chunk's next micro-batch per op, and
// the Ws an I leaves behind queue up to be run where the program says.
class VProgram {
 public:
  VProgram(int stage, std::vector<Instr>* out) : stage_(stage), out_(out) {}

  void F(int chunk) { Emit(Op::kForward, chunk, forward_[chunk]++); }
  void I(int chunk) {
    pending_w_.push_back({chunk, backward_[chunk]});
    Emit(Op::kBackwardInput, chunk, backward_[chunk]++);
  }
  void B(int chunk) { Emit(Op::kBackward, chunk, backward_[chunk]++); }
  // The oldest pending W, if any.
  void W() {
    if (pending_w_.empty()) return;
    const auto [chunk, mb] = pending_w_.front();
    pending_w_.pop_front();
    Emit(Op::kBackwardWeight, chunk, mb);
  }
  // A W of `chunk` in its own micro-batch order (ZB-V's program names them so).
  void WOf(int chunk) {
    for (auto it = pending_w_.begin(); it != pending_w_.end(); ++it) {
      if (it->first != chunk) continue;
      Emit(Op::kBackwardWeight, chunk, it->second);
      pending_w_.erase(it);
      return;
    }
  }
  int forwards(int chunk) const { return forward_[chunk]; }
  int backwards(int chunk) const { return backward_[chunk]; }
  bool weights_pending(int chunk) const {
    return std::any_of(pending_w_.begin(), pending_w_.end(),
                       [chunk](const auto& w) { return w.first == chunk; });
  }

 private:
  void Emit(Op op, int chunk, int mb) { out_->push_back(Compute(op, stage_, chunk, mb)); }

  int stage_;
  std::vector<Instr>* out_;
  int forward_[2] = {0, 0}, backward_[2] = {0, 0};
  std::deque<std::pair<int, int>> pending_w_;
};

// Drops the operations of micro-batches past m: the V programs below are written for at least
// the micro-batches that fill the V, and a smaller m runs the same order without the rest.
void KeepMicrobatches(Schedule* s) {
  for (auto& stage : s->per_stage) {
    std::erase_if(stage, [m = s->microbatches](const Instr& in) { return in.microbatch >= m; });
  }
}

// ZB-V (Zero Bubble, arXiv 2401.10241, section 6): chunk 0 down the stages, chunk 1 back up.
// Stage s warms up with 2(p-s)-1 forwards of chunk 0, then alternates chunks, then runs
// F·I·W of each chunk in turn; in the cool-down the Is go first and the Ws fill in after.
void GenerateZBV(Schedule* s) {
  const int p = s->stages, n = std::max(2 * p - 1, s->microbatches);
  for (int r = 0; r < p; ++r) {
    VProgram v(r, &s->per_stage[r]);
    for (int i = 0; i < 2 * (p - r) - 1; ++i) v.F(0);
    for (int i = 0; i < r; ++i) v.F(1), v.F(0);
    for (int i = 0; i < p - r; ++i) v.F(1), v.I(1), v.WOf(1);
    while (v.forwards(1) < v.forwards(0) || v.forwards(0) < n) {
      if (v.forwards(0) < n) v.F(0);
      v.I(0), v.WOf(0), v.F(1), v.I(1), v.WOf(1);
    }
    for (int i = 0; i < r; ++i) v.I(0), v.I(1);
    for (int i = 0; i < p - r; ++i) v.I(0), v.WOf(0);
    while (v.weights_pending(1)) v.WOf(1);
    while (v.weights_pending(0)) v.WOf(0);
  }
  KeepMicrobatches(s);
}

// DualPipeV (DeepSeek-V3's DualPipe folded into a V, as torch.distributed.pipelining's
// ScheduleDualPipeV runs it). Its steady phase pairs a forward of one chunk with a full
// backward of the other (DualPipe overlaps the pair; here they run back to back). Needs
// m >= 2p.
void GenerateDualPipeV(Schedule* s) {
  const int p = s->stages, m = s->microbatches;
  for (int r = 0; r < p; ++r) {
    VProgram v(r, &s->per_stage[r]);
    for (int i = 0; i < 2 * (p - r - 1); ++i) v.F(0);
    for (int i = 0; i < r + 1; ++i) v.F(0), v.F(1);
    for (int i = 0; i < p - r - 1; ++i) v.I(1), v.W(), v.F(1);
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      v.F(0), v.B(1);  // the last stage's first pair is not overlapped in DualPipeV either
      v.F(1), v.B(0);
    }
    for (int i = 0; i < p - r - 1; ++i) v.B(1), v.F(1), v.B(0);
    // The second half of the backwards splits off W, so that the Ws fill the tail.
    const int tail = r + 1;
    bool split = false;
    for (int i = 0; i < tail; ++i) {
      if (i == tail / 2 && r % 2 == 1) split = true;
      split ? v.I(1) : v.B(1);
      if (i == tail / 2 && r % 2 == 0) split = true;
      split ? v.I(0) : v.B(0);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      v.W();
      split ? v.I(0) : v.B(0);
    }
    for (int i = 0; i < r + 1; ++i) v.W();
  }
}

}  // namespace

int ChunksFor(ScheduleKind kind, int requested) {
  if (kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kCustom) return requested;
  return PlacementOf(kind) == Placement::kV ? 2 : 1;
}

absl::StatusOr<Schedule> GenerateComputeOrder(const ScheduleOptions& o) {
  const std::string name(ScheduleKindName(o.kind));
  if (o.stages < 1 || o.microbatches < 1 || o.chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": stages, microbatches and chunks must be at least 1; got p=", o.stages,
        ", m=", o.microbatches, ", v=", o.chunks));
  }
  if (o.kind == ScheduleKind::kCustom) {
    return absl::InvalidArgumentError("custom schedules are loaded from a file, not generated");
  }
  const int chunks = ChunksFor(o.kind, o.chunks);
  if (o.kind == ScheduleKind::kInterleaved) {
    if (o.chunks < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "interleaved: needs at least 2 model chunks per stage (--chunks); got ", o.chunks,
          ". With one chunk it is plain 1f1b"));
    }
    if (o.microbatches % o.stages != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "interleaved: micro-batches must be a multiple of stages (Megatron's interleaved "
          "order); got m=", o.microbatches, ", p=", o.stages, ". Try m=",
          std::max(o.stages, o.microbatches / o.stages * o.stages), " or m=",
          (o.microbatches / o.stages + 1) * o.stages));
    }
  } else if (PlacementOf(o.kind) == Placement::kV) {
    if (o.chunks != 1 && o.chunks != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": places exactly 2 model chunks per stage, in a V; got chunks=", o.chunks));
    }
    if (o.kind == ScheduleKind::kDualPipeV && o.microbatches < 2 * o.stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dualpipev: needs at least 2p micro-batches (one per virtual stage); got m=",
          o.microbatches, ", p=", o.stages, ". Try m=", 2 * o.stages));
    }
  } else if (o.chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": runs one model chunk per stage; got chunks=", o.chunks,
        ". Use the interleaved schedule for more"));
  }
  FR_RETURN_IF_ERROR(CheckCostModel(o.cost, o.stages, chunks));
  Schedule s;
  s.kind = o.kind;
  s.stages = o.stages;
  s.microbatches = o.microbatches;
  s.chunks = chunks;
  s.placement = PlacementOf(o.kind);
  s.step_sync = o.step_sync;
  s.per_stage.resize(o.stages);
  s.buffers_per_stage.assign(o.stages, 0);
  switch (o.kind) {
    case ScheduleKind::kGPipe: GenerateGPipe(&s); break;
    case ScheduleKind::k1F1B: Generate1F1B(&s); break;
    case ScheduleKind::kInterleaved: GenerateInterleaved(&s); break;
    // Up to p-1 deferred Ws per stage: enough for the last micro-batches' input gradients to
    // race down the pipeline while every stage fills its tail with W (with T_F = T_B = T_W
    // this reaches ZB-H1's bubble of (p-1)·(T_F + T_B - T_W), a third of 1F1B's).
    case ScheduleKind::kZBH1:
      GenerateZBH(&s, o.cost, [p = o.stages](int st) { return p - st - 1; }, o.stages - 1);
      break;
    case ScheduleKind::kZBH2:
      GenerateZBH(&s, o.cost, [p = o.stages](int st) { return 2 * (p - st - 1); },
                  2 * o.stages - 1);
      break;
    case ScheduleKind::kZBV: GenerateZBV(&s); break;
    case ScheduleKind::kDualPipeV: GenerateDualPipeV(&s); break;
    case ScheduleKind::kCustom: break;
  }
  return s;
}

absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options) {
  FR_ASSIGN_OR_RETURN(Schedule schedule, GenerateComputeOrder(options));
  InsertCommunication(&schedule, options.data_parallel);
  ResolvePeers(&schedule);
  AssignBuffers(&schedule);
  FR_RETURN_IF_ERROR(InsertBubbles(&schedule, options.cost));
  return schedule;
}

}  // namespace freeride::pipeline
