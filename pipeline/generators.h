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
};

// GPipe: all forwards, then all backwards. 1F1B: Megatron's one-forward-one-backward with
// min(p-s-1, m) warm-up forwards on stage s. Interleaved: Megatron's interleaved 1F1B over v
// chunks (needs m to be a multiple of p). ZB-H1: 1F1B's order with the backward split into I
// and W, W deferred (up to p-1 of them per stage) into the stage's would-be bubbles, found by
// simulating the cost model. A combination a generator
// cannot schedule is refused with the reason.
absl::StatusOr<Schedule> GenerateComputeOrder(const ScheduleOptions& options);

// Generator, then communication, peers, buffers and bubbles: the schedule a rank executes.
absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options);

}  // namespace freeride::pipeline
