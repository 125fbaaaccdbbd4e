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

// ZB-H1: each stage walks 1F1B's order of F and I (the input-gradient backward); a W is run
// right after its I once more than p-1 are pending, and earlier in any wait for the next
// input that it fits in. Stages advance in order of their simulated clocks.
void GenerateZBH1(Schedule* s, const CostModel& cost) {
  const int p = s->stages, m = s->microbatches;
  const double comm = cost.comm;
  constexpr double kUnknown = -1;
  std::vector<std::vector<double>> f_end(p, std::vector<double>(m, kUnknown));
  std::vector<std::vector<double>> i_end(p, std::vector<double>(m, kUnknown));
  std::vector<std::deque<Instr>> main(p);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<double> clock(p, 0.0);
  Schedule order = *s;
  Generate1F1B(&order);
  for (int stage = 0; stage < p; ++stage) {
    for (Instr in : order.per_stage[stage]) {
      if (in.op == Op::kBackward) in.op = Op::kBackwardInput;
      main[stage].push_back(in);
    }
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
  // Up to p-1 deferred Ws per stage: enough for the last micro-batches' input gradients to
  // race down the pipeline while every stage fills its tail with W (with T_F = T_B = T_W this
  // reaches ZB-H1's bubble of (p-1)·(T_F + T_B - T_W), a third of 1F1B's).
  const int defer_limit = p - 1;
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

}  // namespace

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
  } else if (o.chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": runs one model chunk per stage; got chunks=", o.chunks,
        ". Use the interleaved schedule for more"));
  }
  FR_RETURN_IF_ERROR(CheckCostModel(o.cost, o.stages, o.chunks));
  Schedule s;
  s.kind = o.kind;
  s.stages = o.stages;
  s.microbatches = o.microbatches;
  s.chunks = o.chunks;
  s.per_stage.resize(o.stages);
  s.buffers_per_stage.assign(o.stages, 0);
  switch (o.kind) {
    case ScheduleKind::kGPipe: GenerateGPipe(&s); break;
    case ScheduleKind::k1F1B: Generate1F1B(&s); break;
    case ScheduleKind::kInterleaved: GenerateInterleaved(&s); break;
    case ScheduleKind::kZBH1: GenerateZBH1(&s, o.cost); break;
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
