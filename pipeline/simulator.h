// Event-driven simulation of a schedule against a cost model: when every instruction of every
// stage starts and ends, where each stage waits (the bubbles, with their kinds), busy time,
// step time and bubble fraction. Compute ops take their cost; SEND and LOAD take no stage time
// and a message lands `comm` after its SEND; RECV waits for its message; REDUCE_TIED posts the
// tied sum, which completes `tied` after its last participant posts it; REDUCE_GRADS posts the
// data-parallel all-reduce (`reduce`; in `reduce_buckets` buckets per chunk, each started when
// the chunk's last weight-gradient work has made it). Bubble kinds: before the stage's first
// compute `warmup`, before its first backward `fill`, after that `steady`, waiting for other
// stages at the step end `cooldown`, and for its own all-reduces `sync`.
//
// The step end follows the schedule's step_sync. Barrier: OPTIMIZER waits for every stage (the
// global gradient-norm all-reduce) and for the stage's own sums, then takes `opt`; one step is
// simulated, all stages starting at 0. Post-validate: OPTIMIZER waits only for the stage's own
// sums (the tied one for the other end's post), takes `opt` and the stage goes on with the next
// step; at the next step's ValidationPoint it waits (`cooldown`) until every stage has posted
// its share of the global state. Consecutive steps are simulated until the period is steady;
// the result is one steady step: `step_time` the period, each stage's instructions from the
// start of its step (times from the earliest stage's start, so a later stage's step may reach
// past step_time: the steps overlap).
#pragma once

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

struct BubbleSpan {
  BubbleKind kind = BubbleKind::kNone;
  double start = 0;
  double duration = 0;
  int before_index = 0;  // the instruction (index in the stage's list) the stage waits at
  int64_t free_bytes = -1;
};

struct StageResult {
  int stage = 0;
  double step_start = 0;  // when the stage's step begins (0 with a barrier)
  double busy = 0;    // compute time
  double bubble = 0;  // step time minus busy time
  // Idle time between the stage's first and last F/B/I/W: its bubble when steps follow each
  // other with no step-end barrier (the zero-bubble papers' post-validation).
  double span_bubble = 0;
  // Most micro-batch activations (per chunk) held at once, from F to its B or I: the papers'
  // count (after I only W's smaller share remains). Slots, held until W, are buffers_per_stage.
  int peak_activations = 0;
  std::array<double, kNumBubbleKinds> bubble_by_kind{};
  std::vector<BubbleSpan> bubbles;
  std::vector<double> start, end;  // per instruction
};

struct SimResult {
  double step_time = 0;        // with post-validation the steady period of consecutive steps
  double bubble_fraction = 0;  // sum of bubble time over p × step time
  // The largest span_bubble over the stages: the per-stage bubble the pipeline papers state
  // (1F1B's (p-1)(F+B+W), ZB-H1's (p-1)(F+B-W), ...), which leave out the step-end barrier.
  double schedule_bubble = 0;
  std::vector<StageResult> stages;
};

// Fails, naming each stage's blocked instruction, when the schedule deadlocks.
absl::StatusOr<SimResult> Simulate(const Schedule& schedule, const CostModel& cost);

// How long `in` computes by `cost` (ms; 0 for what only waits or moves data), as Simulate times
// it.
double ComputeMs(const Schedule& schedule, const CostModel& cost, const Instr& in);

}  // namespace freeride::pipeline
