// Schedule generators: the compute order (F, B or I + W) of every stage for p stages, m
// micro-batches and v model chunks per stage. Communication and bubbles are added by passes
// (passes.h); BuildSchedule runs the whole chain.
#pragma once

#include "absl/status/statusor.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;
  int microbatches = 1;
  int chunks = 1;
  CostModel cost = CostModel::Uniform();
  bool data_parallel = false;  // emit REDUCE_GRADS (a data-parallel all-reduce) on every stage
  StepSync step_sync = StepSync::kBarrier;  // how a step's end meets the next (its bubbles)
};

// GPipe: all forwards, then all backwards. 1F1B: Megatron's one-forward-one-backward with
// min(p-s-1, m) warm-up forwards on stage s. Interleaved: Megatron's interleaved 1F1B over v
// chunks (needs m to be a multiple of p). ZB-H1: 1F1B's order with the backward split into I
// and W, W deferred (up to p-1 of them per stage) into the stage's would-be bubbles, found by
// simulating the cost model. A combination a generator
// cannot schedule is refused with the reason.
// ZB-H2: ZB-H1 with 2(p-1-s) warm-up forwards on stage s and the Ws deferred to the tail
// (peak activations 2p-1 on stage 0). ZB-V and DualPipeV place two chunks per stage in a V
// (Placement::kV); DualPipeV needs m >= 2p.
absl::StatusOr<Schedule> GenerateComputeOrder(const ScheduleOptions& options);

// The model chunks per stage a kind runs: `requested` for interleaved (and custom), 2 for the
// V kinds, else 1.
int ChunksFor(ScheduleKind kind, int requested);

// Generator, then communication, peers, buffers and bubbles: the schedule a rank executes.
absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options);

}  // namespace freeride::pipeline
