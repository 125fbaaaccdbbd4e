// Passes that turn a compute order into the instruction lists ranks execute. Each is a pure
// function of the schedule (and the cost model), run in this order by BuildSchedule.
#pragma once

#include "absl/status/status.h"
#include "pipeline/cost_model.h"
#include "pipeline/schedule.h"

namespace freeride::pipeline {

// Adds LOAD (inputs on the first model chunk, labels on the last), RECV before each compute
// that consumes a peer's output, SEND right after each compute whose output a peer consumes,
// and the step end: REDUCE_TIED on the stages holding the tied embedding and head (when they
// are two stages; post-validated, the head's right after its last I or B), REDUCE_GRADS when
// data-parallel, OPTIMIZER on every stage. Existing comm ops are replaced.
void InsertCommunication(Schedule* schedule, bool data_parallel);

// Sets `peer` of every SEND/RECV from the placement (StageOfVirtual).
void ResolvePeers(Schedule* schedule);

// Gives every micro-batch's activations the lowest free slot at its F, freed after its last
// backward (B, or W when split). A stage whose buffers_per_stage is 0 gets the count it used.
void AssignBuffers(Schedule* schedule);

// Simulates the schedule against `cost` and puts a BUBBLE, with its kind and predicted
// duration, exactly where a stage would wait. Existing BUBBLEs are replaced. Fails on a
// schedule that deadlocks.
absl::Status InsertBubbles(Schedule* schedule, const CostModel& cost);

}  // namespace freeride::pipeline
